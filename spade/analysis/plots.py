"""PNG plots of an analysis, every run of it overlaid in one colour each (matplotlib, Agg).

A run for which a plot's family does not apply (its ``not_applicable``, :mod:`.sources`) is named
on the plot with the reason, in its colour; a curve with a single step is not drawn (a lone dot
reads as a result) but named with its value and "too short for a curve". ``rlve_levels.png``
(accuracy per difficulty level over steps, and what RLVE's controller did) is drawn when a run has
``env_source: rlve``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")
SKILL_PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7")


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# what a set's environments and the refused candidates are, per env_source
ADMISSION_LABELS = {"designer": ("admitted", "rejected attempts"),
                    "fixed_pool": ("drawn from the pool", "pool files failing admission"),
                    "rlve": ("rlve problems", "problems failing to generate")}


def _admission_labels(run: dict[str, Any]) -> tuple[str, str]:
    return ADMISSION_LABELS.get(run.get("env_source", "designer"), ADMISSION_LABELS["designer"])


def _curve(ax: Any, data: dict[str, Any], key: str, label: str, *, band: tuple[str, str] | None = None,
           style: str = "-", with_label: bool = True, label_for: Any = None) -> None:
    for i, run in enumerate(data["runs"]):
        if label_for is not None:
            label = label_for(run)
        steps = [s for s in run["steps"] if _get(s, key) is not None]
        if not steps:
            continue
        xs = [s["step"] for s in steps]
        colour = PALETTE[i % len(PALETTE)]
        if not _line(ax, xs, [_get(s, key) for s in steps], style, colour,
                     f"{run['name']}" + (f" {label}" if with_label and label else "")):
            continue
        if band:
            low = [_get(s, band[0]) for s in steps]
            high = [_get(s, band[1]) for s in steps]
            ax.fill_between(xs, low, high, color=colour, alpha=0.15, linewidth=0)


TOO_SHORT = "too-short"  # the gid of a "one step, no curve" note


def _line(ax: Any, xs: list[Any], ys: list[Any], style: str, colour: str, label: str) -> bool:
    """Draw a curve through the points, or, with a single point, say on the plot that a run of one
    step draws no curve (with that step's value) instead of showing a lone dot; whether it drew."""
    if len(xs) >= 2:
        ax.plot(xs, ys, style, marker="o", markersize=3, color=colour, label=label)
        return True
    if len(xs) == 1:
        value = f"{ys[0]:.3g}" if isinstance(ys[0], (int, float)) else str(ys[0])
        row = sum(1 for text in ax.texts if text.get_gid() == TOO_SHORT)
        ax.text(0.99, 0.97 - 0.07 * row, f"{label}: one step (step {xs[0]}, {value}), too short for a curve",
                transform=ax.transAxes, fontsize=6, color=colour, ha="right", va="top", gid=TOO_SHORT)
    return False


def _notes(ax: Any, data: dict[str, Any], *families: str, empty_key: str | None = None, width: int = 110) -> None:
    """Say on the plot which runs it does not apply to (and why), and which have no values."""
    lines = []
    for i, run in enumerate(data["runs"]):
        reasons = [run["not_applicable"][f] for f in families if f in run.get("not_applicable", {})]
        if reasons:  # "not applicable to env_source X: why" once, then each family's why
            head = reasons[0].split(": ", 1)[0]
            lines.append((i, f"{run['name']}: {head}: " + "; ".join(r.split(": ", 1)[-1] for r in reasons)))
        elif empty_key and not any(_get(s, empty_key) is not None for s in run["steps"]):
            lines.append((i, f"{run['name']}: no values"))
    y = 0.02
    for i, text in lines:
        wrapped = _wrap(text, width)
        ax.text(0.01, y, wrapped, transform=ax.transAxes, fontsize=6, color=PALETTE[i % len(PALETTE)], va="bottom")
        y += 0.05 * (wrapped.count("\n") + 1) + 0.02


def _wrap(text: str, width: int = 110) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, width))


def _get(summary: dict[str, Any], key: str) -> Any:
    value: Any = summary
    for part in key.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def _step_axis(ax: Any, xlabel: str = "regeneration step") -> None:
    """A step x axis: labelled, whole numbers only, with a light grid."""
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel(xlabel)
    ax.grid(alpha=0.3)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _save(fig: Any, path: Path) -> Path:
    """Lay the figure out, write it at the plots' resolution and close it."""
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    _pyplot().close(fig)
    return path


def _finish(fig: Any, ax: Any, path: Path, title: str, ylabel: str, ylim: tuple[float, float] | None = None) -> Path:
    ax.set_title(title, fontsize=10)
    ax.set_ylabel(ylabel)
    if ylim:
        ax.set_ylim(*ylim)
    _step_axis(ax)
    handles, _ = ax.get_legend_handles_labels()
    if handles:
        ax.legend(fontsize=7, loc="best")
    return _save(fig, path)


def plot_all(data: dict[str, Any], embeddings: np.ndarray | None, out: Path) -> list[Path]:
    plt = _pyplot()
    out.mkdir(parents=True, exist_ok=True)
    written = []

    def single(name: str, key: str, title: str, ylabel: str, ylim=None, band=None, family: str | None = None) -> None:
        fig, ax = plt.subplots(figsize=(6, 3.6))
        _curve(ax, data, key, "", band=band)
        _notes(ax, data, *((family,) if family else ()), empty_key=key)
        written.append(_finish(fig, ax, out / name, title, ylabel, ylim))

    fig, ax = plt.subplots(figsize=(6, 3.6))
    _curve(ax, data, "n_envs", "", label_for=lambda run: _admission_labels(run)[0])
    _curve(ax, data, "rejected", "", style="--", label_for=lambda run: _admission_labels(run)[1])
    written.append(_finish(fig, ax, out / "admission.png", "Environments per regeneration and the candidates refused",
                           "count"))

    single("vendi.png", "vendi_per_n", "Vendi/n of each regenerated set (1/n: all alike, 1: all different)",
           "Vendi / n", (0, 1.05), family="vendi")
    single("learnable.png", "learnable_share", "Learnable share (no-hint win rate in [0.2, 0.8])", "share", (0, 1.05))
    single("win_rate.png", "win_rate.median", "No-hint win rate: median, band p10-p90", "win rate", (-0.02, 1.02),
           band=("win_rate.p10", "win_rate.p90"))
    single("regret.png", "regret.median", "Regret (hint - no hint): median, band p10-p90", "regret", (-1.02, 1.02),
           band=("regret.p10", "regret.p90"), family="regret")

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    for ax, key, title in zip(axes, ("win_rate", "regret"), ("no-hint win rate", "regret (hint - no hint)")):
        for i, run in enumerate(data["runs"]):
            dist = run["whole_run"][key]
            edges = np.array(dist["edges"])
            total = max(1, sum(dist["histogram"]))
            ax.stairs(np.array(dist["histogram"]) / total, edges, color=PALETTE[i % len(PALETTE)], linewidth=2,
                      label=f"{run['name']} (n={dist['n']})")
        _notes(ax, data, *(("regret",) if key == "regret" else ()), width=90)
        ax.set_title(f"{title}, whole run", fontsize=10)
        ax.set_ylabel("share of environments")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    written.append(_save(fig, out / "distributions.png"))

    fig, ax = plt.subplots(figsize=(6, 3.6))
    _curve(ax, data, "reward_levels_mean", "all levels")
    _curve(ax, data, "partial_levels_mean", "strictly partial", style="--")
    written.append(_finish(fig, ax, out / "reward_levels.png", "Distinct reward values per environment (mean)", "values"))

    fig, ax = plt.subplots(figsize=(6, 3.6))
    _curve(ax, data, "formula_reveal_share", "formula reveal (physics envs)")
    _curve(ax, data, "state_gated_share", "state-gated", style="--")
    _notes(ax, data, "state_gating", "formula_reveal", empty_key="state_gated_share")
    written.append(_finish(fig, ax, out / "reveal_gating.png", "Formula reveal and state gating", "share", (-0.02, 1.05)))

    fig, axes = plt.subplots(1, 3, figsize=(10, 3.2))
    for ax, key, title in zip(axes, ("lines_mean", "state_variables_mean", "turns_mean"),
                              ("lines", "state variables", "turns per no-hint episode")):
        _curve(ax, data, key, "")
        if key != "turns_mean":
            _notes(ax, data, "program_size", width=45)
        ax.set_title(title, fontsize=10)
        _step_axis(ax)
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
            break
    fig.suptitle("Program size (means per set)", fontsize=10)
    written.append(_save(fig, out / "program_size.png"))

    fig, ax = plt.subplots(figsize=(6, 3.6))
    _curve(ax, data, "duplicate_share", "near-duplicate share in set")
    for i, run in enumerate(data["runs"]):
        c = run["collapse"]
        text = c["not_applicable"] if "not_applicable" in c else (
            f"longest streak {c['longest_streak']}, {c['streaks_at_least_min']} streaks >= {c['min_streak']}")
        ax.text(0.01, 0.95 - 0.07 * i, _wrap(f"{run['name']}: {text}"), transform=ax.transAxes, fontsize=6,
                color=PALETTE[i % len(PALETTE)], va="top")
    _notes(ax, data, "vendi")
    written.append(_finish(fig, ax, out / "collapse.png", "Collapse: near-duplicates within a set", "share", (-0.02, 1.05)))

    fig, ax = plt.subplots(figsize=(6, 3.6))
    _curve(ax, data, "hint_contains_answer_share", "hint contains a winning action")
    _curve(ax, data, "hint_one_turn_win_rate", "one-turn wins, hinted", style="--")
    _curve(ax, data, "nohint_one_turn_win_rate", "one-turn wins, no hint", style=":")
    _notes(ax, data, "hint_leakage")
    written.append(_finish(fig, ax, out / "hint_leakage.png", "Hint leakage", "share", (-0.02, 1.05)))

    written.append(plot_map(data, out / "tsne.png"))
    if any("rlve" in run for run in data["runs"]):
        written.append(plot_rlve_levels(data, out / "rlve_levels.png"))
    return written


LEVEL_STYLES = ("-", "--", ":", "-.")


def plot_rlve_levels(data: dict[str, Any], path: Path) -> Path:
    """Left: accuracy (RLVE's: return >= the problem's threshold) of each difficulty level's plays
    per step, one line per (run, level); right: the controller's highest level and the
    environments raised so far (``rlve/*`` metrics)."""
    plt = _pyplot()

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    ax = axes[0]
    for i, run in enumerate(data["runs"]):
        cells = run.get("rlve", {}).get("by_level", [])
        for j, level in enumerate(sorted({c["level"] for c in cells})):
            mine = [c for c in cells if c["level"] == level and c["accuracy"] is not None]
            _line(ax, [c["step"] for c in mine], [c["accuracy"] for c in mine], LEVEL_STYLES[j % len(LEVEL_STYLES)],
                  PALETTE[i % len(PALETTE)], f"{run['name']} level {level} ({sum(c['plays'] for c in mine)} plays)")
    ax.set_title("Accuracy by difficulty level", fontsize=10)
    ax.set_ylabel("accurate plays / plays")
    ax.set_ylim(-0.02, 1.05)
    ax = axes[1]
    for i, run in enumerate(data["runs"]):
        rows = run.get("rlve", {}).get("controller", [])
        colour = PALETTE[i % len(PALETTE)]
        for key, style, what in (("difficulty_max", "-", "highest level"),
                                 ("envs_raised_total", "--", "environments above the initial level")):
            mine = [r for r in rows if r.get(key) is not None]
            _line(ax, [r["step"] for r in mine], [r[key] for r in mine], style, colour, f"{run['name']} {what}")
    ax.set_title("RLVE's difficulty controller", fontsize=10)
    ax.set_ylabel("level / environments")
    for i, run in enumerate(data["runs"]):
        if "rlve" not in run:
            axes[0].text(0.01, 0.02 + 0.07 * i, f"{run['name']}: env_source {run.get('env_source')}, no rlve levels",
                         transform=axes[0].transAxes, fontsize=6, color=PALETTE[i % len(PALETTE)])
    for ax in axes:
        _step_axis(ax, "step")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6, loc="best")
    return _save(fig, path)


def plot_map(data: dict[str, Any], path: Path) -> Path:
    plt = _pyplot()
    rows = [r for r in data["envs"] if r.get("map") == "tsne"]
    fig, axes = plt.subplots(1, 3, figsize=(12, 4))
    runs = [run["name"] for run in data["runs"]]
    skills = sorted({r["skill"] for r in rows})
    xs = np.array([r["x"] for r in rows]) if rows else np.zeros(0)
    ys = np.array([r["y"] for r in rows]) if rows else np.zeros(0)
    ax = axes[0]
    for i, name in enumerate(runs):
        mask = np.array([r["run"] == name for r in rows], dtype=bool)
        if mask.any():
            ax.scatter(xs[mask], ys[mask], s=14, color=PALETTE[i % len(PALETTE)], label=name)
    ax.set_title("by run", fontsize=10)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    ax = axes[1]
    if rows:
        points = ax.scatter(xs, ys, s=14, c=[r["generated_step"] for r in rows], cmap="viridis")
        fig.colorbar(points, ax=ax, label="step")
    ax.set_title("by regeneration step", fontsize=10)
    ax = axes[2]
    for i, skill in enumerate(skills):
        mask = np.array([r["skill"] == skill for r in rows], dtype=bool)
        ax.scatter(xs[mask], ys[mask], s=14, color=SKILL_PALETTE[i % len(SKILL_PALETTE)], label=skill or "?")
    ax.set_title("by skill", fontsize=10)
    if skills:
        ax.legend(fontsize=7)
    for ax in axes:
        ax.set_xticks([])
        ax.set_yticks([])
    _notes(axes[0], data, "map", width=60)
    fig.suptitle(f"t-SNE map of {len(rows)} environments ({data.get('embedding')})", fontsize=10)
    return _save(fig, path)
