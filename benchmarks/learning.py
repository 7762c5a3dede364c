"""The learning check (issue 41, docs/learning.md): does `spade train` make the embedded model better?

Three runs of the same budget from SmolLM2-135M-Instruct, each through the real `spade train` path
(fixed-environment source, GRPO on Megatron-core, the in-process hf engine), as subprocesses:

* learned: ``examples/learn/fixed.yaml``;
* control: the same with ``loss.control_shuffle_advantages=true`` (the advantages permuted within
  each step's batch: the same updates in size, no signal in their direction);
* self-play (``--selfplay``): ``examples/learn/selfplay.yaml``, the designer on, same step count.

The base model and each trained model play the same held-out episodes (the training games on seeds
training never draws, :mod:`spade.eval.heldout`); the report (:mod:`spade.analysis.learning_report`)
gives each arm's after-minus-before difference with a paired 95% bootstrap interval, and the
training curve of each arm.

    python benchmarks/learning.py --quick --json          # about 10 minutes of steps on 2 cores
    python benchmarks/learning.py --out runs/learn        # the full experiment (`make learn`)
    python benchmarks/learning.py --measure 32            # the base model's return per game (no training)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from spade.analysis.bootstrap import bootstrap_difference  # noqa: E402
from spade.analysis.learning_report import ArmResult, LearningReport, write_report  # noqa: E402
from spade.analysis.run_reader import read_metrics  # noqa: E402
from spade.envs.sandbox.client import SandboxService  # noqa: E402
from spade.eval.heldout import HeldOutResult, HeldOutSplit, evaluate_heldout, pool_envs  # noqa: E402
from spade.train_config import TrainConfig, load_train_config  # noqa: E402

LEARNED_CONFIG = ROOT / "examples/learn/fixed.yaml"
SELFPLAY_CONFIG = ROOT / "examples/learn/selfplay.yaml"
CONTROL_SWITCH = "loss.control_shuffle_advantages=true"
SAMPLE_SEED = 20261207  # the held-out plays' sampling seeds: the same before and after


@dataclass(frozen=True)
class Budget:
    steps: int
    heldout_per_env: int
    resamples: int = 10000


FULL = Budget(steps=40, heldout_per_env=100)
QUICK = Budget(steps=8, heldout_per_env=40)


def spade_bin() -> str:
    here = Path(sys.executable).parent / "spade"
    return str(here) if here.exists() else "spade"


def train(config: Path, run_dir: Path, steps: int, extra: list[str], log: Path) -> float:
    """One `spade train` run as a subprocess; its wall seconds."""
    command = [spade_bin(), "train", "--config", str(config), "--run-dir", str(run_dir), f"run.steps={steps}",
               f"run.checkpoint_every={steps}", *extra]
    print(f"learning: {' '.join(command)}", file=sys.stderr, flush=True)
    started = time.perf_counter()
    with open(log, "w") as out:
        done = subprocess.run(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise SystemExit(f"learning: spade train failed ({done.returncode}); see {log}")
    return time.perf_counter() - started


async def heldout(model: str, config: TrainConfig, split: HeldOutSplit) -> HeldOutResult:
    """``model`` (``embedded`` or a run directory: its last checkpoint) on the held-out episodes."""
    from spade.rollout.conversation import ChatFormat, thinking_template_kwargs
    from spade.run.engines import EngineSettings, load_tokenizer, open_engine, resolve_model
    from spade.selfplay.fixed_pool import pool_load_sandbox

    ref = resolve_model(model)
    tokenizer = load_tokenizer(ref)
    chat_format = ChatFormat(tokenizer, thinking_template_kwargs(tokenizer.chat_template, config.model.thinking))
    opened = await open_engine(ref, EngineSettings(config.engine, config.model.dtype), tokenizer=tokenizer)
    try:
        async with await SandboxService.start(config.sandbox) as sandbox:
            envs = pool_envs(Path(config.selfplay.fixed_env_dir))
            return await evaluate_heldout(opened.engine, tokenizer, config.selfplay, envs, split,
                                          sandbox=pool_load_sandbox(config.selfplay, sandbox),
                                          sample_seed=SAMPLE_SEED, chat_format=chat_format)
    finally:
        opened.close()


def measured(label: str, model: str, config: TrainConfig, split: HeldOutSplit, out: Path) -> HeldOutResult:
    started = time.perf_counter()
    result = asyncio.run(heldout(model, config, split))
    (out / f"heldout_{label}.json").write_text(json.dumps(result.to_dict()))
    print(f"learning: held-out {label}: mean return {result.mean:.3f} over {len(result.episodes)} episodes "
          f"({', '.join(f'{k} {v:.3f}' for k, v in result.by_env().items())}; "
          f"{time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)
    return result


def curve(run_dir: Path) -> list[float]:
    return [float(row.get("agent/return_mean", 0.0)) for row in read_metrics(run_dir)]


def arm(name: str, run_dir: Path, before: HeldOutResult, after: HeldOutResult, budget: Budget,
        seed: int) -> ArmResult:
    interval = bootstrap_difference(before.returns(), after.returns(), paired=True, resamples=budget.resamples,
                                    seed=seed)
    return ArmResult(name, interval, tuple(curve(run_dir)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help=f"{QUICK.steps} steps, {QUICK.heldout_per_env} "
                        "held-out episodes per game (the same code path)")
    parser.add_argument("--json", action="store_true", help="print the headline numbers as one JSON object")
    parser.add_argument("--out", type=Path, default=None, help="the experiment's directory (default runs/learn-TIME)")
    parser.add_argument("--steps", type=int, default=None, help="training steps of each arm")
    parser.add_argument("--heldout", type=int, default=None, help="held-out episodes per game")
    parser.add_argument("--selfplay", action="store_true", help="also the self-play arm (designer on, same steps)")
    parser.add_argument("--measure", type=int, default=None, metavar="N",
                        help="only play the base model N held-out episodes per game and print the returns")
    args = parser.parse_args(argv)
    budget = QUICK if args.quick else FULL
    budget = Budget(args.steps or budget.steps, args.heldout or budget.heldout_per_env, budget.resamples)
    out = args.out or ROOT / "runs" / time.strftime("learn-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    config = load_train_config(LEARNED_CONFIG)
    if args.measure:
        measured("base", "embedded", config, HeldOutSplit(args.measure), out)
        return 0

    started = time.perf_counter()
    split = HeldOutSplit(budget.heldout_per_env)
    before = measured("before", "embedded", config, split, out)
    arms = [("learned", out / "learned", [])]
    arms.append(("control", out / "control", [CONTROL_SWITCH]))
    results: list[ArmResult] = []
    for index, (name, run_dir, extra) in enumerate(arms):
        train(LEARNED_CONFIG, run_dir, budget.steps, extra, out / f"train_{name}.log")
        after = measured(name, str(run_dir), config, split, out)
        results.append(arm(name, run_dir, before, after, budget, seed=index))
    selfplay = None
    if args.selfplay:
        from spade.analysis.learning_report import selfplay_summary

        run_dir = out / "selfplay"
        train(SELFPLAY_CONFIG, run_dir, budget.steps, [], out / "train_selfplay.log")
        after = measured("selfplay", str(run_dir), config, split, out)
        results.append(arm("selfplay", run_dir, before, after, budget, seed=len(results)))
        selfplay = selfplay_summary(read_metrics(run_dir))
    seconds = time.perf_counter() - started
    report = LearningReport(date=time.strftime("%Y-%m-%d"), cpu=cpu_name(), cores=os.cpu_count() or 0,
                            command=" ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
                            steps=budget.steps, heldout_episodes=len(before.episodes), seconds=seconds,
                            arms=tuple(results), selfplay=selfplay)
    markdown, png = write_report(report, out)
    print(f"learning: {report.headline()}", flush=True)
    print(f"learning: report {markdown}, plot {png}", file=sys.stderr, flush=True)
    if args.json:
        learned, control = results[0].interval, results[1].interval
        print(json.dumps({"before": learned.mean_before, "after": learned.mean_after, "ci_low": learned.low,
                          "ci_high": learned.high, "control_before": control.mean_before,
                          "control_after": control.mean_after, "control_ci_low": control.low,
                          "control_ci_high": control.high, "steps": budget.steps, "seconds": round(seconds, 1)}))
    return 0


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


if __name__ == "__main__":
    sys.exit(main())
