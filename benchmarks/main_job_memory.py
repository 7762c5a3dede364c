"""Peak RSS per phase of the main job's training half, at the CPU smoke run's shapes (issue 25).

Each setting runs in its own process (a peak is per process) and reports, through
``spade.peak_memory.PhaseMemory``, the peak RSS of: building the learner (SmolLM2-135M embedded,
Megatron model and optimizer), a first update (forward+backward, optimizer step: Adam's moments
appear here), a second update (the steady state of every later step), the weight sync into a
Hugging Face copy of the model (what the hf engine holds and receives), and a checkpoint.

The samples are the smoke run's largest: one designer sample of ``--designer-tokens`` (a ~2,300-token
prompt plus 560 generated) and ``--agents`` agent samples of ``--agent-tokens``; the peak of an update
is set by its largest micro-batch, not by how many there are, so a few samples stand for the 40 of a
real step. The settings compared are the switches that change the update's memory:
``model.core_attention`` (sdpa | unfused), ``model.recompute``, ``run.micro_batch_tokens`` and, optionally,
``model.dtype`` (float32 | bfloat16; the engine's copy of the weights takes the same dtype).

    .venv/bin/python benchmarks/main_job_memory.py                      # the default comparison
    .venv/bin/python benchmarks/main_job_memory.py --settings sdpa:none:4096 unfused:selective:2048
    .venv/bin/python benchmarks/main_job_memory.py --settings sdpa:full:4096:float32 sdpa:full:4096:bfloat16
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SETTINGS = ("unfused:selective:2048", "sdpa:selective:2048", "sdpa:none:2048", "sdpa:none:4096")
PHASES = ("build", "forward_backward", "optimizer", "forward_backward_2", "optimizer_2", "sync", "checkpoint")


def samples(args):
    import torch

    from spade.rl.samples import TrainSample

    generator = torch.Generator().manual_seed(0)
    out = []
    for length, response, count in ((args.designer_tokens, 560, 1), (args.agent_tokens, 192, args.agents)):
        for i in range(count):
            ids = torch.randint(0, 49152, (length,), generator=generator)
            mask = torch.zeros(length - 1)
            mask[-response:] = 1.0
            out.append(TrainSample(token_ids=ids, loss_mask=mask, advantages=1.0 if i % 2 else -1.0,
                                   temperature=1.0))
    return out


def one_setting(args) -> dict:
    """Run in a child process: every phase once for ``args.setting``."""
    import torch

    from spade.models.embedded import embedded_model_dir
    from spade.peak_memory import PhaseMemory
    from spade.train_config import TrainConfig
    from spade.training.checkpoint import save_checkpoint
    from spade.training.learner import Learner, LearnerOptions
    from spade.training.parallel import init_parallel

    attention, recompute, tokens, *rest = args.setting.split(":")
    dtype = getattr(torch, rest[0] if rest else "float32")
    config = TrainConfig()
    layout = config.parallel.layout()
    meter = PhaseMemory()
    meter.start()
    ctx = init_parallel(layout, seed=1234)
    hf_dir = embedded_model_dir()
    hf_config = json.loads((hf_dir / "config.json").read_text())
    options = LearnerOptions(optimizer=config.optimizer, loss=config.loss, micro_batch_tokens=int(tokens),
                             dtype=dtype, recompute=recompute, core_attention=attention)
    learner = Learner.build(hf_dir, hf_config, layout, ctx, options)
    batch = samples(args)
    meter.mark("build")
    began = time.perf_counter()
    first = learner.update(batch, on_phase=meter.mark)
    update_s = time.perf_counter() - began
    second = first
    if args.updates > 1:  # Adam's moments exist from here on: every later step's state
        second = learner.update(batch, on_phase=lambda phase: meter.mark(phase + "_2"))

    from transformers import AutoModelForCausalLM

    engine_model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=dtype)
    targets = dict(engine_model.named_parameters())
    with torch.no_grad():
        for name, tensor in learner.weight_stream():
            if name in targets:
                targets[name].copy_(tensor)
    meter.mark("sync")
    with tempfile.TemporaryDirectory() as directory:
        save_checkpoint(Path(directory) / "step_000001", learner.chunks, hf_config=hf_config, layout=layout,
                        step=1, optimizer=learner.optimizer, save_rng=True, tokenizer_dir=hf_dir)
        meter.mark("checkpoint")
    return {"setting": args.setting, "peaks_gb": meter.metrics(), "update_s": update_s,
            "loss": [first["train/loss"], second["train/loss"]],
            "grad_norm": [first["train/grad_norm"], second["train/grad_norm"]]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settings", nargs="+", default=list(DEFAULT_SETTINGS),
                        help="core_attention:recompute:micro_batch_tokens[:dtype], e.g. sdpa:none:4096 or sdpa:full:4096:bfloat16")
    parser.add_argument("--designer-tokens", type=int, default=2850)
    parser.add_argument("--agent-tokens", type=int, default=700)
    parser.add_argument("--agents", type=int, default=4)
    parser.add_argument("--updates", type=int, choices=(1, 2), default=2,
                        help="1: skip the second update (then add Adam's two moments, 8 bytes a parameter)")
    parser.add_argument("--setting", help=argparse.SUPPRESS)  # the child's one setting
    args = parser.parse_args()
    if args.setting:
        print(json.dumps(one_setting(args)))
        return
    results = []
    for setting in args.settings:
        command = [sys.executable, __file__, "--setting", setting, "--designer-tokens", str(args.designer_tokens),
                   "--agent-tokens", str(args.agent_tokens), "--agents", str(args.agents), "--updates", str(args.updates)]
        env = {**os.environ, "PYTHONWARNINGS": "ignore"}
        done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env)
        if done.returncode != 0:
            print(f"{setting}: failed\n{done.stderr[-3000:]}", file=sys.stderr)
            continue
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    header = f"| phase | " + " | ".join(r["setting"] for r in results) + " |"
    print(header)
    print("|" + "---|" * (len(results) + 1))
    for phase in PHASES:
        key = f"memory/peak_rss_gb/{phase}"
        print(f"| {phase} | " + " | ".join(f"{r['peaks_gb'].get(key, float('nan')):.2f}" for r in results) + " |")
    print("| first update s | " + " | ".join(f"{r['update_s']:.0f}" for r in results) + " |")
    print("| loss (1st, 2nd) | " + " | ".join(", ".join(f"{x:.4f}" for x in r["loss"]) for r in results) + " |")
    print("| grad norm (1st, 2nd) | " + " | ".join(", ".join(f"{x:.4f}" for x in r["grad_norm"])
                                              for r in results) + " |")


if __name__ == "__main__":
    main()
