"""Convert a Hugging Face safetensors checkpoint into a spade Megatron checkpoint (torch_dist).

    python tools/convert_hf_to_mcore.py --hf-dir HF --out CKPT
    torchrun --nproc_per_node 4 tools/convert_hf_to_mcore.py --hf-dir HF --out CKPT --tp 2 --ep 2

Each rank builds its shard of the Megatron model with spade.models (Qwen3, Qwen3-MoE, Llama),
fills it from the HF tensors through the weight map (reading only the tensors it needs), and all
ranks write one distributed checkpoint with spade.training.checkpoint.save_checkpoint: model only,
step 0, config.json and tokenizer files copied into CKPT/hf/. The layout flags only choose how
the work is split: a torch_dist checkpoint is layout-independent on load (any TP/EP/PP), so one
process with the defaults is enough unless the model does not fit in one process's memory.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DTYPES, ToolError, run, safetensors_dtype  # noqa: E402

DESCRIPTION = """\
HF safetensors checkpoint -> spade Megatron distributed checkpoint (torch_dist, model only, step 0).

The result is layout-independent on load: a checkpoint written with any --tp/--ep/--pp loads at
any other tensor/expert/pipeline-parallel layout (training, `spade score --tp N`, export). The
flags only split the conversion work over ranks: run under `torchrun --nproc_per_node N` with
N = tp x pp x (data-parallel size, which must be a multiple of ep), or as one process (defaults).
"""


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="convert_hf_to_mcore.py", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hf-dir", required=True, metavar="DIR",
                        help="HF model directory: config.json, *.safetensors, tokenizer files")
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="checkpoint directory to write (replaced if it is a spade checkpoint)")
    parser.add_argument("--tp", type=int, default=1, metavar="N", help="tensor-parallel ranks")
    parser.add_argument("--ep", type=int, default=1, metavar="N", help="expert-parallel ranks")
    parser.add_argument("--pp", type=int, default=1, metavar="N", help="pipeline-parallel stages")
    parser.add_argument("--dtype", choices=["auto", *DTYPES], default="auto",
                        help="parameter dtype stored (auto: the HF tensors' dtype; float32 if mixed)")
    return parser.parse_args(argv)


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    hf_dir = Path(args.hf_dir)
    config_path = hf_dir / "config.json"
    if not config_path.is_file():
        raise ToolError(f"--hf-dir {hf_dir}: no config.json")
    if not any(hf_dir.glob("*.safetensors")):
        raise ToolError(f"--hf-dir {hf_dir}: no *.safetensors files")
    if min(args.tp, args.ep, args.pp) < 1:
        raise ToolError("--tp, --ep and --pp must be positive")
    hf_config = json.loads(config_path.read_text())

    from spade.models import ParallelLayout, RankCoords, read_model_spec
    from spade.models.builder import BuildOptions, build_gpt_model, naming_for
    from spade.models.loading import load_hf_state
    from spade.models.weight_map import bindings
    from spade.training.checkpoint import save_checkpoint
    from spade.training.hf_directory import read_hf_tensors
    from spade.training.parallel import parallel_session

    import megatron_patches

    try:
        spec = read_model_spec(hf_config)
    except (ValueError, KeyError) as exc:
        raise ToolError(f"--hf-dir {hf_dir}: {exc}") from None
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world % (args.tp * args.pp):
        raise ToolError(f"{world} ranks do not split into tp={args.tp} x pp={args.pp}")
    layout = ParallelLayout(tp=args.tp, pp=args.pp, ep=args.ep, etp=args.tp)
    dtype = safetensors_dtype(hf_dir) if args.dtype == "auto" else DTYPES[args.dtype]

    with parallel_session(layout):
        options = BuildOptions(params_dtype=dtype)  # the random init is overwritten below
        coords, naming = RankCoords.current(), naming_for(options)
        with megatron_patches.cpu_device_mode():
            model = build_gpt_model(spec, layout, options)
        needed = {name for b in bindings(spec, layout, coords, naming) for name in b.hf}
        load_hf_state(model, read_hf_tensors(hf_dir, spec, needed), spec, layout, coords, naming)
        save_checkpoint(args.out, [model], hf_config=hf_config, layout=layout, step=0,
                        save_rng=False, tokenizer_dir=hf_dir)
        if int(os.environ.get("RANK", "0")) == 0:
            print(f"wrote {args.out} ({spec.architecture}, {dtype}, converted at tp={layout.tp} "
                  f"pp={layout.pp} ep={layout.ep})", file=sys.stderr)
    return 0


if __name__ == "__main__":  # the checkpoint writer spawns helper processes: keep this guard
    sys.exit(run(main))
