"""Torch-Adam ``step`` fixes for ``megatron.core.optimizer.distrib_optimizer.DistributedOptimizer``.

Without Apex or Transformer Engine, megatron-core 0.16.1's distributed optimizer wraps plain
``torch.optim.Adam``/``AdamW``, which keeps a ``step`` tensor in every parameter's state. Two
upstream methods get that wrong, on CPU and GPU alike, so these replacements apply whenever
``distrib_optimizer.HAVE_APEX_OR_TE`` is False (with TE/Apex fused Adam the step lives in the
param groups, the upstream code is right, and ``apply()`` changes nothing):

* ``DistributedOptimizer.state_dict`` reads ``state["step"]`` of every parameter and asserts there
  is exactly one value (``assert len(steps) == 1``). A never-stepped optimizer has no state, so it
  cannot build a state dict, and ``sharded_state_dict(is_loading=True)`` (which calls it) cannot
  build the state dict a checkpoint loads into. The replacement first gives a fresh torch
  Adam/AdamW zero state with step 0 (exactly what its first step would create), then calls
  upstream.
* ``DistributedOptimizer.load_state_dict`` puts ONE step tensor into every parameter's state, so
  torch Adam then advances it once per parameter per step; with ``dp_reshardable`` sharding,
  ``load_parameter_state_from_dp_reshardable`` also copies the pre-load step back over it. The
  loaded param groups carry the right step; after upstream has run, the replacement gives each
  parameter its own step tensor with that value.

Both replacements call the upstream method (kept as ``__spade_original__``).
"""

from __future__ import annotations

from typing import Any

import torch
from megatron.core.optimizer import distrib_optimizer
from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

from ._util import original_of, replace

NAME = "distrib_optimizer_steps"


def needed() -> bool:
    """True when the distributed optimizer wraps torch Adam (no Apex/TE fused Adam installed)."""
    return not distrib_optimizer.HAVE_APEX_OR_TE


def allocate_empty_state(optimizer: DistributedOptimizer) -> None:
    """Give a never-stepped inner torch Adam/AdamW zero state with step 0 (no-op otherwise)."""
    torch_optimizer = optimizer.optimizer
    if len(torch_optimizer.state) > 0:
        return
    if not isinstance(torch_optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        return
    for group in torch_optimizer.param_groups:
        for param in group["params"]:
            torch_optimizer.state[param] = {
                "step": torch.tensor(0.0),
                "exp_avg": torch.zeros_like(param, memory_format=torch.preserve_format),
                "exp_avg_sq": torch.zeros_like(param, memory_format=torch.preserve_format),
            }


def restore_per_param_steps(optimizer: DistributedOptimizer) -> None:
    """Set each parameter's torch-Adam ``step`` from its param group, one tensor each."""
    for group in optimizer.optimizer.param_groups:
        if "step" not in group:
            continue
        for param in group["params"]:
            param_state = optimizer.optimizer.state.get(param)
            if param_state is not None and "step" in param_state:
                param_state["step"] = torch.tensor(float(group["step"]), dtype=torch.float32)


def state_dict_with_fresh_state(self: DistributedOptimizer):
    """Upstream ``state_dict``, after giving a never-stepped torch Adam its zero state."""
    allocate_empty_state(self)
    return original_of(DistributedOptimizer, "state_dict")(self)


def load_state_dict_with_per_param_steps(self: DistributedOptimizer, state_dict: Any) -> None:
    """Upstream ``load_state_dict``, then one correct step tensor per parameter."""
    original_of(DistributedOptimizer, "load_state_dict")(self, state_dict)
    restore_per_param_steps(self)


def apply() -> bool:
    if not needed():
        return False
    saving = replace(DistributedOptimizer, "state_dict", state_dict_with_fresh_state)
    loading = replace(DistributedOptimizer, "load_state_dict", load_state_dict_with_per_param_steps)
    return saving or loading
