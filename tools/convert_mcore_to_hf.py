"""Convert a spade Megatron checkpoint back into a Hugging Face directory.

    python tools/convert_mcore_to_hf.py --ckpt CKPT --out HF [--max-shard-size 5GB] [--dtype D]

One process: the checkpoint (saved at any layout) is loaded into a single-rank Megatron model,
whose parameters go through the weight map's export path to HF tensor names. Written: safetensors
(one ``model.safetensors``, or size-bounded shards plus ``model.safetensors.index.json``),
``config.json`` (naming the dtype the tensors were written in) and the tokenizer files from
``CKPT/hf/``; every file is readable as the umask allows. Tensors keep the checkpoint's dtype unless
``--dtype`` says otherwise, so HF -> Megatron -> HF gives back the same tensors bit for bit.
``--ckpt`` may also be a run directory: its newest intact checkpoint.
The output appears at OUT only when complete (written to OUT.tmp-* and renamed).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import uuid
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DTYPES, ToolError, parse_size, run, set_config_dtype, write_safetensors_shards  # noqa: E402

EMBEDDING_KEY = "embedding.word_embeddings.weight"


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="convert_mcore_to_hf.py",
        description="spade Megatron checkpoint (any layout) -> HF directory that transformers loads. "
                    "Runs as one process.")
    parser.add_argument("--ckpt", required=True, metavar="DIR",
                        help="spade checkpoint directory (RUN/checkpoints/step_N), or a run directory (its newest "
                             "intact checkpoint)")
    parser.add_argument("--out", required=True, metavar="DIR", help="HF directory to create (must not "
                        "exist or be empty)")
    parser.add_argument("--max-shard-size", default="5GB", metavar="SIZE",
                        help="largest safetensors file, e.g. 5GB, 500MB (default 5GB)")
    parser.add_argument("--dtype", choices=["auto", *DTYPES], default="auto",
                        help="dtype of the written tensors (auto: as stored in the checkpoint)")
    return parser.parse_args(argv)


def stored_dtype(ckpt: Path):
    """The dtype the checkpoint stores the embedding in (all parameters share it)."""
    from megatron.core import dist_checkpointing

    metadata = dist_checkpointing.load_tensors_metadata(str(ckpt))
    return metadata[EMBEDDING_KEY].dtype


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    max_shard_bytes = parse_size(args.max_shard_size)
    out = Path(args.out).absolute()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ToolError(f"--out {out} exists and is not an empty directory")
    if int(os.environ.get("WORLD_SIZE", "1")) != 1:
        raise ToolError("run as one process (the checkpoint loads at any layout, TP=1 included)")

    from spade.models import ParallelLayout
    from spade.models.builder import BuildOptions, build_gpt_model
    from spade.models.loading import hf_weights
    from spade.training.checkpoint import load_checkpoint
    from spade.training.checkpoint_info import CheckpointError, read_checkpoint_info
    from spade.training.hf_directory import copy_hf_side_files
    from spade.training.parallel import parallel_session

    import megatron_patches

    from spade.run.engines import ModelRefError, is_run_dir, resolve_model

    ckpt = args.ckpt
    if is_run_dir(Path(ckpt)):  # a run directory: its newest intact checkpoint, as every spade command takes it
        try:
            ref = resolve_model(ckpt, key="--ckpt")
        except ModelRefError as exc:
            raise ToolError(str(exc)) from None
        for note in ref.notes:
            print(f"convert_mcore_to_hf.py: {note}", file=sys.stderr)
        ckpt = str(ref.checkpoint)
    try:
        info = read_checkpoint_info(ckpt)
    except CheckpointError as exc:
        raise ToolError(str(exc)) from None
    spec = info.model_spec()
    dtype = stored_dtype(info.directory) if args.dtype == "auto" else DTYPES[args.dtype]

    staging = out.with_name(f"{out.name}.tmp-{uuid.uuid4().hex[:12]}")
    try:
        with parallel_session(ParallelLayout()):
            with megatron_patches.cpu_device_mode():
                model = build_gpt_model(spec, ParallelLayout(),
                                        BuildOptions(params_dtype=stored_dtype(info.directory)))
            load_checkpoint(info.directory, [model], load_rng=False)
            tensors = {name: tensor.to(dtype) for name, tensor in hf_weights(model, spec)}
        staging.mkdir(parents=True)
        files = write_safetensors_shards(tensors, staging, max_shard_bytes)
        copy_hf_side_files(info.hf_dir, staging)  # config.json and tokenizer files
        set_config_dtype(staging / "config.json", dtype)
        if out.exists():
            out.rmdir()  # empty, checked above
        os.rename(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    print(f"wrote {out}: {len(tensors)} tensors in {len(files)} file(s), {dtype}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
