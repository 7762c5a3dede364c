"""Start-up of a process that loads a model, with and without the deferred imports (issue 25).

    python benchmarks/startup_imports.py [--repeats 5]

Each ``spade train`` rank, rollout server and ``spade score`` / ``eval`` process imports spade,
transformers' causal-LM classes and megatron-core (``megatron_patches``) before anything else.
Two of those imports are deferred: scikit-learn, which transformers' candidate generator imports
for one assisted-decoding option (``spade.deferred_imports``), and Weights & Biases, which
megatron-core imports for its own logging (``megatron_patches.deferred_compile``). This script
runs that start-up in fresh interpreters, alternating:

* ``deferred``: the imports as spade makes them;
* ``eager``: the same, after importing ``sklearn.metrics`` and ``wandb`` first, which is what
  every process paid before (both deferrals step aside when the module is already imported);

and prints each one's median CPU seconds (user + system of the child) and wall seconds, and the
ratio. The machine should be otherwise idle.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMMON = "import spade\nfrom transformers import AutoModelForCausalLM, AutoTokenizer\nimport megatron_patches\n"
VARIANTS = {
    "deferred": COMMON,
    "eager": "import sklearn.metrics, wandb\n" + COMMON,
}


def measure(code: str) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one fresh interpreter running ``code``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-W", "ignore", "-c", code], cwd=ROOT, check=True,
                   env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="interpreters per variant, alternating")
    args = parser.parse_args(argv)
    measure(COMMON)  # warm the page cache
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in VARIANTS}
    for _ in range(args.repeats):
        for name, code in VARIANTS.items():
            samples[name].append(measure(code))
    result = {name: {"cpu_s": statistics.median(s[0] for s in runs), "wall_s": statistics.median(s[1] for s in runs)}
              for name, runs in samples.items()}
    result["saved_cpu_s"] = result["eager"]["cpu_s"] - result["deferred"]["cpu_s"]
    result["cpu_ratio"] = result["eager"]["cpu_s"] / result["deferred"]["cpu_s"]
    for name in VARIANTS:
        print(f"{name:9s} CPU {result[name]['cpu_s']:.2f} s   wall {result[name]['wall_s']:.2f} s"
              f"   (median of {args.repeats})")
    print(f"deferred saves {result['saved_cpu_s']:.2f} CPU-s per process (eager / deferred = {result['cpu_ratio']:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
