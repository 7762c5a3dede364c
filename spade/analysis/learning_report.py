"""The learning check's report (benchmarks/learning.py, docs/learning.md): ``learning.md`` and
``learning.png`` in the experiment's directory.

The Markdown holds the headline (the learned arm's held-out change and its 95% interval, the
control's), a table of every arm (held-out mean before and after, the difference, its interval,
whether the interval is above zero / contains zero), the self-play arm's per-regeneration figures
when it ran, and the machine, date and command. The PNG has two panels: each arm's training curve
(mean no-hint return per step, and its moving average over ``window`` steps), and each arm's held-out
mean before and after with the interval of the difference drawn around the after mean.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .bootstrap import DifferenceInterval

MOVING_AVERAGE_WINDOW = 5
ARM_COLOURS = {"learned": "#1f77b4", "control": "#7f7f7f", "shuffled": "#ff7f0e", "selfplay": "#d62728"}


@dataclass(frozen=True)
class ArmResult:
    """One arm: its held-out change and its training curve (mean no-hint return of each step)."""

    name: str
    interval: DifferenceInterval
    curve: tuple[float, ...]


@dataclass(frozen=True)
class RegenerationFigures:
    """The self-play arm at one regeneration step (``metrics.jsonl``)."""

    step: int
    attempts: float
    admitted: float
    designer_reward: float | None
    regret: float | None

    @property
    def admission_rate(self) -> float:
        return self.admitted / self.attempts if self.attempts else 0.0


@dataclass(frozen=True)
class LearningReport:
    date: str
    cpu: str
    cores: int
    command: str
    steps: int
    heldout_episodes: int
    seconds: float
    arms: tuple[ArmResult, ...]
    selfplay: tuple[RegenerationFigures, ...] | None = None
    # learned after minus control after, paired on the same held-out episodes (both arms ran)
    learned_vs_control: DifferenceInterval | None = None

    def arm(self, name: str) -> ArmResult | None:
        return next((a for a in self.arms if a.name == name), None)

    def headline(self) -> str:
        parts = []
        for a in self.arms:
            i = a.interval
            parts.append(f"{a.name} {i.mean_before:.3f} -> {i.mean_after:.3f} "
                         f"({i.difference:+.3f}, 95% CI [{i.low:+.3f}, {i.high:+.3f}])")
        if self.learned_vs_control is not None:
            c = self.learned_vs_control
            parts.append(f"learned - control after {c.difference:+.3f} (95% CI [{c.low:+.3f}, {c.high:+.3f}])")
        return (f"held-out mean return over {self.heldout_episodes} episodes, {self.steps} steps: "
                + "; ".join(parts))


def moving_average(values: Sequence[float], window: int = MOVING_AVERAGE_WINDOW) -> list[float]:
    """The mean of each value and the ``window - 1`` before it (fewer at the start)."""
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def selfplay_summary(rows: Sequence[dict[str, Any]]) -> tuple[RegenerationFigures, ...]:
    """The regeneration steps of a self-play run's metrics rows (those with ``designer/attempts``)."""
    out = []
    for row in rows:
        if "designer/attempts" not in row:
            continue
        out.append(RegenerationFigures(int(row["step"]), float(row["designer/attempts"]),
                                       float(row.get("env/admitted", 0.0)), row.get("designer/reward_mean"),
                                       row.get("designer/regret_mean")))
    return tuple(out)


def _verdict(interval: DifferenceInterval) -> str:
    if interval.above_zero():
        return "above 0"
    if interval.contains_zero():
        return "contains 0"
    return "below 0"


def markdown(report: LearningReport, png_name: str) -> str:
    lines = ["# Learning check", "", f"**{report.headline()}**", "",
             f"![training curves and held-out returns]({png_name})", "",
             "| arm | held-out before | after | after - before | 95% bootstrap interval | interval | steps |",
             "|---|---|---|---|---|---|---|"]
    for a in report.arms:
        i = a.interval
        lines.append(f"| {a.name} | {i.mean_before:.3f} | {i.mean_after:.3f} | {i.difference:+.3f} | "
                     f"[{i.low:+.3f}, {i.high:+.3f}] | {_verdict(i)} | {len(a.curve)} |")
    if report.learned_vs_control is not None:
        c = report.learned_vs_control
        lines += ["", f"After training, learned minus control on the same held-out episodes: {c.mean_after:.3f} - "
                  f"{c.mean_before:.3f} = {c.difference:+.3f}, 95% interval [{c.low:+.3f}, {c.high:+.3f}] ({_verdict(c)})."]
    first = report.arms[0].interval if report.arms else None
    if first is not None:
        kind = "paired" if first.paired else "unpaired"
        lines += ["", f"Held out: {report.heldout_episodes} episodes per measurement (the training games on seeds "
                  f"training never draws); {kind} percentile bootstrap, {first.resamples} resamples."]
    if report.selfplay is not None:
        lines += ["", "## Self-play arm (designer on)", "",
                  "| step | designer attempts | admitted | admission rate | designer reward | regret |",
                  "|---|---|---|---|---|---|"]
        for r in report.selfplay:
            reward = "-" if r.designer_reward is None else f"{r.designer_reward:.3f}"
            regret = "-" if r.regret is None else f"{r.regret:.3f}"
            lines.append(f"| {r.step} | {r.attempts:.0f} | {r.admitted:.0f} | {r.admission_rate:.2f} | "
                         f"{reward} | {regret} |")
    lines += ["", f"{report.date}, {report.cpu}, {report.cores} cores, {report.seconds / 60:.1f} minutes: "
              f"`{report.command}`", ""]
    return "\n".join(lines)


def plot(report: LearningReport, path: Path, window: int = MOVING_AVERAGE_WINDOW) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for a in report.arms:
        colour = ARM_COLOURS.get(a.name, "#2ca02c")
        steps = np.arange(1, len(a.curve) + 1)
        left.plot(steps, a.curve, color=colour, alpha=0.3, linewidth=1)
        left.plot(steps, moving_average(a.curve, window), color=colour, linewidth=2,
                  label=f"{a.name} (moving average, {window} steps)")
    left.set_xlabel("step")
    left.xaxis.get_major_locator().set_params(integer=True)
    left.set_ylabel("mean return of the step's plays")
    left.set_title("training")
    left.legend(fontsize=8)
    for x, a in enumerate(report.arms):
        i = a.interval
        colour = ARM_COLOURS.get(a.name, "#2ca02c")
        right.plot([x - 0.15, x + 0.15], [i.mean_before, i.mean_after], color=colour, marker="o")
        # the interval of the difference, placed on the after mean
        right.errorbar([x + 0.15], [i.mean_after], yerr=[[i.difference - i.low], [i.high - i.difference]],
                       color=colour, capsize=6)
    right.set_xticks(range(len(report.arms)), [a.name for a in report.arms])
    right.set_ylabel("held-out mean return")
    right.set_title(f"held out ({report.heldout_episodes} episodes): before -> after,\n"
                    "bar: 95% interval of the change", fontsize=10)
    fig.suptitle(f"{report.date}, {report.cpu}, {report.cores} cores, {report.steps} steps", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_report(report: LearningReport, directory: Path) -> tuple[Path, Path]:
    """``learning.md`` and ``learning.png`` in ``directory``; their paths."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    png = directory / "learning.png"
    plot(report, png)
    md = directory / "learning.md"
    md.write_text(markdown(report, png.name))
    return md, png
