"""The info file of a training checkpoint: what ``DIR/spade_checkpoint.json`` records, and reading it.

``spade_checkpoint.json`` is ``{"format_version": 1, "step", "architecture", "hf_config",
"layout": {"tp", "pp", "ep", "etp", "sequence_parallel"}, "contents": ["model", "optimizer"?,
"rng"?], "megatron_core"}``, plus ``"optimizer_state": false`` when the optimizer had not stepped
yet at save time. ``read_checkpoint_info`` reads and validates it and names what is wrong (a
missing directory, the leftovers of interrupted saves next to it, a corrupt or incomplete file).
The errors every checkpoint module raises, :class:`CheckpointError` and
:class:`CheckpointNotFound`, are defined here.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Union

from ..models import ModelSpec, ParallelLayout, read_model_spec

FORMAT_VERSION = 1
INFO_FILE = "spade_checkpoint.json"
HF_SUBDIR = "hf"
_REQUIRED_KEYS = ("format_version", "step", "architecture", "hf_config", "layout", "contents",
                  "megatron_core")
_LAYOUT_KEYS = ("tp", "pp", "ep", "etp", "sequence_parallel")
_KNOWN_CONTENTS = ("model", "optimizer", "rng")

PathLike = Union[str, "os.PathLike[str]"]


class CheckpointError(Exception):
    """A checkpoint directory is missing, incomplete, corrupt or does not fit the model."""


class CheckpointNotFound(CheckpointError, FileNotFoundError):
    """No checkpoint at the given path."""


@dataclass(frozen=True)
class CheckpointInfo:
    """What ``spade_checkpoint.json`` says about one checkpoint directory."""

    directory: Path
    step: int
    architecture: str
    hf_config: Mapping[str, Any]
    layout: ParallelLayout
    contents: tuple[str, ...]
    megatron_core: str
    format_version: int = FORMAT_VERSION
    # False: saved before the optimizer's first step (no state to load); None: not recorded
    optimizer_state: Optional[bool] = None

    @property
    def hf_dir(self) -> Path:
        """``DIR/hf``: config.json and tokenizer files."""
        return self.directory / HF_SUBDIR

    def model_spec(self) -> ModelSpec:
        return read_model_spec(dict(self.hf_config))

    def to_json(self) -> dict[str, Any]:
        data = {
            "format_version": self.format_version,
            "step": self.step,
            "architecture": self.architecture,
            "hf_config": dict(self.hf_config),
            "layout": layout_to_json(self.layout),
            "contents": list(self.contents),
            "megatron_core": self.megatron_core,
        }
        if self.optimizer_state is not None:
            data["optimizer_state"] = self.optimizer_state
        return data


def layout_to_json(layout: ParallelLayout) -> dict[str, Any]:
    return {"tp": layout.tp, "pp": layout.pp, "ep": layout.ep, "etp": layout.expert_tp,
            "sequence_parallel": layout.sequence_parallel}


def _layout_from_json(data: Any) -> ParallelLayout:
    if not isinstance(data, Mapping) or set(_LAYOUT_KEYS) - data.keys():
        raise ValueError(f"layout must be an object with keys {list(_LAYOUT_KEYS)}, got {data!r}")
    sizes = {k: data[k] for k in ("tp", "pp", "ep", "etp")}
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in sizes.values()):
        raise ValueError(f"layout sizes must be positive integers, got {sizes}")
    if not isinstance(data["sequence_parallel"], bool):
        raise ValueError(f"layout.sequence_parallel must be a boolean, got {data['sequence_parallel']!r}")
    if sizes["etp"] == sizes["tp"]:
        sizes["etp"] = None  # ParallelLayout's default (expert TP = TP), so layouts compare equal
    return ParallelLayout(**sizes, sequence_parallel=data["sequence_parallel"])


def read_checkpoint_info(directory: PathLike) -> CheckpointInfo:
    """Read and validate ``DIR/spade_checkpoint.json``; CheckpointError (naming DIR) if unusable."""
    path = Path(directory).absolute()
    if not path.exists():
        raise CheckpointNotFound(f"no checkpoint at {path}: the directory does not exist"
                                 f"{_leftovers_hint(path)}")
    if not path.is_dir():
        raise CheckpointError(f"no checkpoint at {path}: not a directory")
    info_path = path / INFO_FILE
    if not info_path.is_file():
        raise CheckpointError(
            f"{path} is not a spade checkpoint: {INFO_FILE} is missing{_leftovers_hint(path)}")
    try:
        data = json.loads(info_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"corrupt checkpoint {path}: cannot read {INFO_FILE}: {exc}") from None
    try:
        info = _info_from_json(path, data)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"corrupt checkpoint {path}: {INFO_FILE}: {exc}") from None
    if not (path / "metadata.json").is_file():
        raise CheckpointError(
            f"corrupt checkpoint {path}: the distributed checkpoint files are missing (no metadata.json)")
    return info


def _leftovers_hint(path: Path) -> str:
    """Name what interrupted saves next to ``path`` left: DIR.tmp-* (unfinished), DIR.old-*
    (the previous checkpoint, when a replacing save stopped between its two renames)."""
    found = sorted(p.name for pattern in (".tmp-*", ".old-*") for p in path.parent.glob(path.name + pattern))
    return f" (left by interrupted saves: {', '.join(found)})" if found else ""


def _info_from_json(path: Path, data: Any) -> CheckpointInfo:
    if not isinstance(data, Mapping):
        raise ValueError("expected a JSON object")
    missing = [key for key in _REQUIRED_KEYS if key not in data]
    if missing:
        raise ValueError(f"missing keys {missing}")
    if data["format_version"] != FORMAT_VERSION:
        raise ValueError(f"format_version {data['format_version']!r} is not supported "
                         f"(this spade reads version {FORMAT_VERSION})")
    step = data["step"]
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"step must be a non-negative integer, got {step!r}")
    contents = data["contents"]
    if (not isinstance(contents, list) or "model" not in contents
            or any(c not in _KNOWN_CONTENTS for c in contents)):
        raise ValueError(f"contents must list 'model' and optionally 'optimizer', 'rng'; got {contents!r}")
    if not isinstance(data["hf_config"], Mapping):
        raise ValueError("hf_config must be an object")
    optimizer_state = data.get("optimizer_state")
    if optimizer_state is not None and not isinstance(optimizer_state, bool):
        raise ValueError(f"optimizer_state must be a boolean, got {optimizer_state!r}")
    return CheckpointInfo(
        directory=path,
        step=step,
        architecture=str(data["architecture"]),
        hf_config=dict(data["hf_config"]),
        layout=_layout_from_json(data["layout"]),
        contents=tuple(contents),
        megatron_core=str(data["megatron_core"]),
        format_version=data["format_version"],
        optimizer_state=optimizer_state,
    )

