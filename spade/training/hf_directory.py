"""Hugging Face model directories: read their safetensors weights, copy their non-weight files.

``read_hf_tensors`` reads checkpoint-named tensors from an HF safetensors directory (the import of
HF weights into Megatron: the converters, ``spade score``, rank-sliced loading);
``copy_hf_side_files`` copies the tokenizer, generation config and other non-weight files (a
checkpoint's ``hf/`` directory, export to HF).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Iterable, Optional

from torch import Tensor

from ..models import ModelSpec
from .checkpoint_info import CheckpointError, PathLike

_WEIGHT_FILE = re.compile(
    r"\.(safetensors|bin|pt|pth|ckpt|gguf|h5|msgpack|onnx|npz)$|\.index\.json$")


def copy_hf_side_files(source: PathLike, destination: PathLike, *, skip: Iterable[str] = ()) -> list[str]:
    """Copy the top-level non-weight files (tokenizer, generation config, ...) of an HF directory."""
    source, destination = Path(source), Path(destination)
    destination.mkdir(parents=True, exist_ok=True)
    skipped = set(skip)
    copied = []
    for item in sorted(source.iterdir()):
        if (not item.is_file() or item.name.startswith(".") or item.name in skipped
                or _WEIGHT_FILE.search(item.name)):
            continue
        shutil.copyfile(item, destination / item.name)
        copied.append(item.name)
    return copied


def safetensors_files(hf_dir: Path) -> dict[str, Path]:
    """Tensor name -> file, from the index when there is one."""
    index = hf_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {name: hf_dir / file for name, file in weight_map.items()}
    files = sorted(hf_dir.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{hf_dir} holds no *.safetensors weights")
    from safetensors import safe_open

    found: dict[str, Path] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            found.update((name, file) for name in handle.keys())
    return found


def read_hf_tensors(hf_dir: PathLike, spec: ModelSpec, names: Optional[Iterable[str]] = None
                    ) -> dict[str, Tensor]:
    """Checkpoint-named tensors from an HF safetensors directory (all, or only ``names``).

    Fused transformers-5 expert tensors, if a directory has them, are split into per-expert names.
    """
    from safetensors import safe_open

    from ..models.transformers_state import from_transformers_state

    hf_dir = Path(hf_dir)
    files = safetensors_files(hf_dir)
    wanted = set(files) if names is None else set(names)
    if not wanted <= files.keys():
        wanted = set(files)  # e.g. fused expert tensors on disk: read all, translate below
    by_file: dict[Path, list[str]] = {}
    for name in sorted(wanted):
        by_file.setdefault(files[name], []).append(name)
    tensors: dict[str, Tensor] = {}
    for file, file_names in by_file.items():
        with safe_open(str(file), framework="pt") as handle:
            for name in file_names:
                tensors[name] = handle.get_tensor(name)
    return from_transformers_state(tensors, spec)
