"""megatron_patches imports megatron-core with its torch.compile'd fusions compiled on first call,
and without Weights & Biases (megatron's own wandb logging is never used; spade's tracker still
imports the real package).

The import check runs in a fresh interpreter: an xdist worker may have imported megatron.core
already, and then nothing is deferred."""

from __future__ import annotations

import json
import subprocess
import sys

import torch

from megatron_patches.deferred_compile import deferred

PROBE = r"""
import json, sys, torch
real = torch.compile
import megatron_patches
from megatron.core.fusions import fused_bias_gelu
x, b = torch.linspace(-3, 3, 7), torch.full((7,), 0.25)
plain = fused_bias_gelu.bias_gelu.__wrapped__
print(json.dumps({
    "inductor_imported": "torch._inductor.compile_fx" in sys.modules,
    "torch_compile_restored": torch.compile is real,
    "jit_fuser_wraps_plain_function": plain.__name__ == "bias_gelu" and not hasattr(plain, "_torchdynamo_orig_callable"),
    "plain": plain(b, x).tolist(),
    "wandb_imported_by_megatron": "wandb" in sys.modules,
    "megatron_wandb": [repr(m.wandb) for m in (sys.modules["megatron.core.timers"],
                                              sys.modules["megatron.core.inference.contexts.dynamic_context"])],
    "wandb_after": __import__("wandb").__name__,
}))
"""


def test_importing_the_patches_imports_neither_inductor_nor_wandb_and_restores_torch_compile():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["inductor_imported"] is False
    assert seen["torch_compile_restored"] is True
    assert seen["jit_fuser_wraps_plain_function"] is True
    assert seen["wandb_imported_by_megatron"] is False
    assert seen["megatron_wandb"] == ["None", "None"]  # megatron's own fallback without the package
    assert seen["wandb_after"] == "wandb"  # the mark is gone: the tracker's import gets the package
    # megatron's bias_gelu: the tanh approximation of GELU on x + b, as its docstring states
    x, b = torch.linspace(-3, 3, 7), torch.full((7,), 0.25)
    expected = torch.nn.functional.gelu(x + b, approximate="tanh")
    assert torch.allclose(torch.tensor(seen["plain"]), expected, atol=1e-6)


def test_deferred_compiles_once_on_first_call_in_both_decorator_forms():
    calls = []

    def fake_compile(fn, **options):
        calls.append((fn.__name__, options))
        return lambda *a, **k: ("compiled", fn(*a, **k))

    compile_later = deferred(fake_compile)

    @compile_later
    def double(x):
        return 2 * x

    @compile_later(dynamic=True)
    def triple(x):
        return 3 * x

    assert calls == [] and double.__name__ == "double" and double.__wrapped__(4) == 8
    assert double(2) == ("compiled", 4) and double(5) == ("compiled", 10)
    assert triple(1) == ("compiled", 3)
    assert calls == [("double", {}), ("triple", {"dynamic": True})]
