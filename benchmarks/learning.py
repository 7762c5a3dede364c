"""The learning check (issue 41, docs/learning.md): does `spade train` make the embedded model better?

Runs of the same budget from SmolLM2-135M-Instruct, each through the real `spade train` path (GRPO on
Megatron-core, the in-process hf engine) as a subprocess; the first two on the fixed-environment
source (``--arms`` picks which run):

* learned: ``examples/learn/fixed.yaml``;
* control: the same with ``optimizer.lr=0`` (every play, loss, gradient and weight sync of the
  learned run, and no change to the weights: what the held-out measure moves by without learning);
* shuffled (``--arms``): the same with ``loss.control_shuffle_advantages=true`` (the advantages
  permuted within each step's batch: updates of the same size with no signal in their direction;
  on the 135M model they make it worse, see docs/learning.md);
* self-play (``--selfplay``): ``examples/learn/selfplay.yaml``, the designer on, same step count.

The base model and each trained model play the same held-out episodes (the training games on seeds
training never draws, :mod:`spade.eval.heldout`); the report (:mod:`spade.analysis.learning_report`)
gives each arm's after-minus-before difference with a paired 95% bootstrap interval, and the
training curve of each arm.

    python benchmarks/learning.py --quick --json          # 3 steps per arm, 48 held-out episodes
    python benchmarks/learning.py --out runs/learn        # the full experiment (`make learn`)
    python benchmarks/learning.py --measure 32            # the base model's return per game (no training)
    python benchmarks/learning.py --report --out DIR      # rewrite DIR's report from its records
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
from spade.analysis.learning_report import ArmResult, LearningReport, selfplay_summary, write_report  # noqa: E402
from spade.analysis.run_reader import read_metrics  # noqa: E402
from spade.envs.sandbox.client import SandboxService  # noqa: E402
from spade.eval.heldout import HeldOutResult, HeldOutSplit, evaluate_heldout, pool_envs  # noqa: E402
from spade.train_config import TrainConfig, load_train_config  # noqa: E402

LEARNED_CONFIG = ROOT / "examples/learn/fixed.yaml"
SELFPLAY_CONFIG = ROOT / "examples/learn/selfplay.yaml"
CONTROL_SWITCH = "optimizer.lr=0"
SHUFFLED_SWITCH = "loss.control_shuffle_advantages=true"
SAMPLE_SEED = 20261207  # the held-out plays' sampling seeds: the same before and after


@dataclass(frozen=True)
class Budget:
    steps: int
    heldout_per_env: int
    resamples: int = 10000


# measured on 2 quiet cores (docs/learning.md, 2026-12-07): a step of 48 plays takes 114-203 s (25-83 s
# playing, 88-128 s updating), a held-out measurement of 210 episodes 68-139 s; the full run 48 minutes
FULL = Budget(steps=8, heldout_per_env=70)
QUICK = Budget(steps=3, heldout_per_env=16)
ARMS = ("learned", "control", "shuffled", "selfplay")


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
    from spade.selfplay.sources.fixed_pool import pool_load_sandbox

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
    parser.add_argument("--arms", default=None, help=f"the arms to run, comma-separated, of {', '.join(ARMS)} "
                        "(default learned,control; with --selfplay all three)")
    parser.add_argument("--report", action="store_true",
                        help="only rewrite the report of the experiment in --out from its held-out records and runs")
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

    if args.report:
        if args.out is None:
            parser.error("--report needs --out DIR (an experiment's directory)")
        return rewrite_report(out, budget)
    wanted = args.arms.split(",") if args.arms else ["learned", "control"] + (["selfplay"] if args.selfplay else [])
    unknown = [name for name in wanted if name not in ARMS]
    if unknown or not wanted:
        parser.error(f"--arms: {unknown[0] if unknown else '(none)'!r} is not an arm; choose from {', '.join(ARMS)}")
    started = time.perf_counter()
    split = HeldOutSplit(budget.heldout_per_env)
    before = measured("before", "embedded", config, split, out)
    setups = {"learned": (LEARNED_CONFIG, []), "control": (LEARNED_CONFIG, [CONTROL_SWITCH]),
              "shuffled": (LEARNED_CONFIG, [SHUFFLED_SWITCH]), "selfplay": (SELFPLAY_CONFIG, [])}
    results: list[ArmResult] = []
    selfplay = None
    for index, name in enumerate(wanted):
        run_dir = out / name
        train_config, extra = setups[name]
        train(train_config, run_dir, budget.steps, extra, out / f"train_{name}.log")
        after = measured(name, str(run_dir), config, split, out)
        results.append(arm(name, run_dir, before, after, budget, seed=index))
        if name == "selfplay":
            selfplay = selfplay_summary(read_metrics(run_dir))
    seconds = time.perf_counter() - started
    command = " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])])
    (out / "experiment.json").write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "command": command,
                                                     "seconds": seconds, "steps": budget.steps, "arms": wanted}))
    afters = {name: HeldOutResult.from_dict(json.loads((out / f"heldout_{name}.json").read_text())) for name in wanted}
    report = LearningReport(date=time.strftime("%Y-%m-%d"), cpu=cpu_name(), cores=os.cpu_count() or 0,
                            command=command, steps=budget.steps, heldout_episodes=len(before.episodes), seconds=seconds,
                            arms=tuple(results), selfplay=selfplay, learned_vs_control=versus(afters, budget))
    markdown, png = write_report(report, out)
    print(f"learning: {report.headline()}", flush=True)
    print(f"learning: report {markdown}, plot {png}", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(headline_json(report)))
    return 0


def versus(afters: dict[str, HeldOutResult], budget: Budget):
    """Learned after minus control after, paired on the same episodes (None unless both ran)."""
    if "learned" not in afters or "control" not in afters:
        return None
    return bootstrap_difference(afters["control"].returns(), afters["learned"].returns(), paired=True,
                                resamples=budget.resamples, seed=99)


def rewrite_report(out: Path, budget: Budget) -> int:
    """The report of an experiment directory again, from ``experiment.json``, ``heldout_*.json`` and the
    arms' runs (the intervals are seeded, so the numbers are the experiment's own)."""
    meta = json.loads((out / "experiment.json").read_text())
    load = lambda name: HeldOutResult.from_dict(json.loads((out / f"heldout_{name}.json").read_text()))  # noqa: E731
    before = load("before")
    afters = {name: load(name) for name in meta["arms"]}
    results = [arm(name, out / name, before, afters[name], budget, seed=index) for index, name in enumerate(meta["arms"])]
    selfplay = selfplay_summary(read_metrics(out / "selfplay")) if "selfplay" in afters else None
    report = LearningReport(date=meta["date"], cpu=cpu_name(), cores=os.cpu_count() or 0, command=meta["command"],
                            steps=int(meta["steps"]), heldout_episodes=len(before.episodes), seconds=float(meta["seconds"]),
                            arms=tuple(results), selfplay=selfplay, learned_vs_control=versus(afters, budget))
    markdown, _ = write_report(report, out)
    print(f"learning: {report.headline()}", flush=True)
    return 0


def headline_json(report: LearningReport) -> dict:
    """The learned and control arms' figures (null for an arm that did not run), the steps and seconds;
    the self-play arm's under ``selfplay_*`` when it ran."""
    out: dict = {}
    for name, prefix in (("learned", ""), ("control", "control_"), ("selfplay", "selfplay_")):
        result = report.arm(name)
        if result is None and name == "selfplay":
            continue
        values = (None,) * 4 if result is None else (
            result.interval.mean_before, result.interval.mean_after, result.interval.low, result.interval.high)
        out.update(zip((f"{prefix}before", f"{prefix}after", f"{prefix}ci_low", f"{prefix}ci_high"), values))
    out.update({"steps": report.steps, "seconds": round(report.seconds, 1)})
    return out


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
