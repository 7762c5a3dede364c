"""Parallel layout (sizes) and rank coordinates (where one rank sits in it).

Both the model builder and the weight map read these, so that the layer split across pipeline
stages, the expert split across expert-parallel ranks and the vocabulary padding are computed in one
place and agree with what Megatron builds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


def _ceil_to(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


@dataclass(frozen=True)
class ParallelLayout:
    """Parallel sizes for one model; ``etp`` (expert tensor parallel) defaults to ``tp``."""

    tp: int = 1
    pp: int = 1
    ep: int = 1
    etp: Optional[int] = None
    sequence_parallel: bool = False
    make_vocab_size_divisible_by: int = 128  # Megatron's default; padded to a multiple of this * tp

    @property
    def expert_tp(self) -> int:
        return self.tp if self.etp is None else self.etp

    def padded_vocab_size(self, vocab_size: int) -> int:
        """Vocabulary rows Megatron allocates: a multiple of make_vocab_size_divisible_by * tp."""
        return _ceil_to(vocab_size, self.make_vocab_size_divisible_by * self.tp)

    def layers_per_stage(self, num_layers: int) -> int:
        if num_layers % self.pp:
            raise ValueError(f"{num_layers} layers do not split evenly over pp={self.pp} stages")
        return num_layers // self.pp

    def layer_offset(self, num_layers: int, pp_rank: int) -> int:
        """Global index of the first layer on pipeline stage ``pp_rank``."""
        return pp_rank * self.layers_per_stage(num_layers)

    def local_experts(self, num_experts: int) -> int:
        if num_experts % self.ep:
            raise ValueError(f"{num_experts} experts do not split evenly over ep={self.ep} ranks")
        return num_experts // self.ep

    def expert_offset(self, num_experts: int, ep_rank: int) -> int:
        """Global index of local expert 0 on expert-parallel rank ``ep_rank``."""
        return ep_rank * self.local_experts(num_experts)


@dataclass(frozen=True, order=True)
class RankCoords:
    """One rank's position: tensor, pipeline, expert and expert-tensor parallel ranks."""

    tp: int = 0
    pp: int = 0
    ep: int = 0
    etp: int = 0

    @classmethod
    def current(cls) -> "RankCoords":
        """This process's coordinates from Megatron's initialised parallel state."""
        from megatron.core import parallel_state as ps

        return cls(
            tp=ps.get_tensor_model_parallel_rank(),
            pp=ps.get_pipeline_model_parallel_rank(),
            ep=ps.get_expert_model_parallel_rank(),
            etp=ps.get_expert_tensor_parallel_rank(),
        )

    def is_first_stage(self) -> bool:
        return self.pp == 0

    def is_last_stage(self, layout: ParallelLayout) -> bool:
        return self.pp == layout.pp - 1
