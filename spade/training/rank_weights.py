"""Read one rank's part of an HF safetensors checkpoint (its stage, its experts, its TP block).

``read_rank_state(hf_dir, spec, layout, coords, naming)`` returns the Megatron state dict of the
rank at ``coords`` while reading from disk only the tensors, and of those only the rows or
columns, that rank holds (``spade.models.rank_reads``). Host memory per rank is then about its
share of the model instead of the whole checkpoint on every rank.

Checkpoints whose experts are stored fused (transformers-5 ``mlp.experts.gate_up_proj``) have
no per-expert names on disk; for those the whole checkpoint is read through ``read_hf_tensors``
and cut as before (logged).
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Iterator, Optional, Union

from torch import Tensor

from ..models import ModelSpec, ParallelLayout, RankCoords
from ..models.rank_reads import needed_names
from ..models.rank_reads import read_rank_state as read_with
from ..models.weight_map import MegatronNaming, hf_to_megatron
from .hf_directory import read_hf_tensors, safetensors_files

log = logging.getLogger("spade.train")


class SafetensorsSlices:
    """A ``SliceReader`` over the safetensors files of one HF directory (files opened on first use)."""

    def __init__(self, files: dict[str, Path], stack: contextlib.ExitStack):
        self.files = files
        self._stack = stack
        self._handles: dict[Path, object] = {}

    def _handle(self, name: str):
        from safetensors import safe_open

        if name not in self.files:
            raise KeyError(f"the checkpoint has no tensor {name}")
        file = self.files[name]
        if file not in self._handles:
            self._handles[file] = self._stack.enter_context(safe_open(str(file), framework="pt"))
        return self._handles[file]

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._handle(name).get_slice(name).get_shape())

    def read(self, name: str, dim: Optional[int] = None, start: int = 0, stop: Optional[int] = None) -> Tensor:
        handle = self._handle(name)
        if dim is None:
            return handle.get_tensor(name)
        part = handle.get_slice(name)
        if dim == 0:
            return part[start:stop]
        if dim == 1:
            return part[:, start:stop]
        raise ValueError(f"{name}: slices along dim {dim} are not supported (0 or 1)")


@contextlib.contextmanager
def open_slices(hf_dir: Union[str, Path]) -> Iterator[SafetensorsSlices]:
    with contextlib.ExitStack() as stack:
        yield SafetensorsSlices(safetensors_files(Path(hf_dir)), stack)


def read_rank_state(hf_dir: Union[str, Path], spec: ModelSpec, layout: ParallelLayout, coords: RankCoords,
                    naming: MegatronNaming = MegatronNaming()) -> dict[str, Tensor]:
    """The Megatron state dict of the rank at ``coords``, reading only what that rank holds."""
    with open_slices(hf_dir) as reader:
        missing = needed_names(spec, layout, coords, naming) - reader.files.keys()
        if not missing:
            return read_with(reader, spec, layout, coords, naming)
    log.info("%s stores %d of this rank's tensors under other names (fused experts?): reading them whole",
             hf_dir, len(missing))
    names = needed_names(spec, layout, coords, naming)
    return hf_to_megatron(read_hf_tensors(hf_dir, spec, names), spec, layout, coords, naming)
