"""Every metric for the given runs: one row per environment, aggregates per regeneration step, per
window of steps and per run. ``analyze`` returns a JSON-ready dict (docs/analysis.md describes its
keys); ``writers`` and ``plots`` turn it into files.

Each run's ``selfplay.env_source`` decides what applies (:mod:`.sources`): a family that does not
apply is None in the rows and aggregates and named with its reason in the run's
``not_applicable``; an ``rlve`` run gets its accuracy per level and environment (``rlve``).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from . import collapse, diversity, learnability
from .degenerate_share import DegenerateVerdict, recorded_verdicts
from .degenerate_share import summary as degenerate_summary
from .embeddings import Embedder
from .formula import is_physics, states_formula
from .hint_leakage import hint_leakage
from .program_size import program_size
from .reward_levels import env_rewards, reward_levels
from .rlve_levels import accuracy as rlve_accuracy
from .rlve_levels import problem_of, rlve_summary
from .run_reader import EnvRecord, Run
from .sources import FIXED_POOL, RLVE, applies, not_applicable
from .state_gating import GatingVerdict
from .tsne_map import tsne_coordinates

DEFAULT_WINDOW = 40  # steps per window (10 regenerations at k = 4)
FORMAT_VERSION = 1


@dataclass
class Analysis:
    data: dict[str, Any]
    runs: list[Run]
    envs: list[EnvRecord]
    embeddings: np.ndarray
    rows: list[dict[str, Any]] = field(default_factory=list)


def _mean(values: Sequence[float | None]) -> float | None:
    known = [float(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return sum(known) / len(known) if known else None


def _share(values: Sequence[bool | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(1 for v in known if v) / len(known) if known else None


def env_row(env: EnvRecord, gating: GatingVerdict | None,
            degenerate: DegenerateVerdict | None = None) -> dict[str, Any]:
    source = env.env_source
    nohint = env.episodes_of("nohint")
    opening = nohint[0].opening if nohint else None
    physics = is_physics(env.source, env.class_name) if applies("formula_reveal", source) else None
    rewards = env_rewards(env.episodes)
    levels = reward_levels(rewards) if rewards else None  # no turn played: nothing emitted, unknown
    size = program_size(env.source, env.class_name, [len(e.turns) for e in nohint])
    if not applies("program_size", source):
        size = {**size, "lines": None, "code_lines": None, "state_variables": None}
    leak = hint_leakage(env.hint, env.episodes) if applies("hint_leakage", source) else {}
    if not applies("state_gating", source):
        gating = GatingVerdict(None, 0, not_applicable(source)["state_gating"])
    problem = problem_of(env.source) if source == RLVE else None
    win_rate = env.win_rate
    return {
        "run": env.run, "uid": env.uid, "env_id": env.env_id, "generated_step": env.generated_step,
        "slot": env.slot, "skill": env.skill, "class_name": env.class_name, "attempts": env.attempts,
        "env_source": source,
        "win_rate": win_rate, "window_win": env.window_win,
        "regret": env.regret if applies("regret", source) else None,
        "learnable": learnability.is_learnable(win_rate),
        "n_nohint_plays": len(env.gen_nohint), "n_hint_plays": len(env.gen_hint), "kept_episodes": len(env.episodes),
        "reward_levels": None if levels is None else levels["levels"],
        "partial_levels": None if levels is None else levels["partial_levels"],
        "reward_values": None if levels is None else levels["values"],
        "physics": physics,
        "formula_revealed": (states_formula(opening) if opening is not None else None) if physics else None,
        "state_gated": None if gating is None else gating.gated,
        "gating_reason": None if gating is None else gating.reason,
        "lines": size["lines"], "code_lines": size["code_lines"], "state_variables": size["state_variables"],
        "turns": size["turns"],
        "hint_contains_answer": leak.get("hint_contains_answer"),
        "hint_one_turn_win_rate": leak.get("hint_one_turn_win_rate"),
        "nohint_one_turn_win_rate": leak.get("nohint_one_turn_win_rate"),
        # rlve: the problem's level and the share of its no-hint plays at its step that RLVE counts accurate
        "level": None if problem is None else problem.difficulty,
        "accuracy": None if problem is None else rlve_accuracy(env.gen_nohint, problem.threshold),
        # won by a degenerate policy (spade.analysis.degenerate_share): None when unknown
        **(degenerate or DegenerateVerdict(None, None)).to_json(),
    }


def _first_of_each(rows: list[dict[str, Any]]) -> list[int]:
    """Positions of the first row of each env_id (a pool file drawn at several regenerations is one
    environment for diversity)."""
    seen: set[str] = set()
    keep = []
    for i, row in enumerate(rows):
        if row["env_id"] not in seen:
            seen.add(row["env_id"])
            keep.append(i)
    return keep


def aggregate(rows: list[dict[str, Any]], vectors: np.ndarray, classes: list[str], sampled: bool, seed: int,
              env_source: str = "designer") -> dict[str, Any]:
    """The set-level numbers of a group of environments (a step's set, a window, a whole run)."""
    diverse = applies("vendi", env_source)
    if env_source == FIXED_POOL and rows:
        distinct = _first_of_each(rows)
        vectors, classes = vectors[distinct], [classes[i] for i in distinct]
    if not diverse:
        vendi = {"vendi_per_n": None, "vendi_per_n_std": None, "sample_size": 0, "draws": 0}
    elif sampled:
        vendi = diversity.sampled_vendi_per_n(vectors, seed=seed)
    else:
        vendi = {"vendi_per_n": diversity.vendi_per_n(vectors) if len(vectors) else None,
                 "vendi_per_n_std": 0.0, "sample_size": len(vectors), "draws": 1}
    physics = [r for r in rows if r["physics"]]
    gated = [r["state_gated"] for r in rows]
    formula = applies("formula_reveal", env_source)
    out = {
        "n_envs": len(rows), "distinct_envs": len({r["env_id"] for r in rows}),
        "vendi_per_n": vendi["vendi_per_n"], "vendi_per_n_std": vendi["vendi_per_n_std"],
        "vendi_sample_size": vendi["sample_size"], "vendi_draws": vendi["draws"],
        "learnable_share": learnability.learnable_share(r["win_rate"] for r in rows),
        "win_rate": learnability.distribution([r["win_rate"] for r in rows], 0.0, 1.0),
        "regret": learnability.distribution([r["regret"] for r in rows], -1.0, 1.0),
        "reward_levels_mean": _mean([r["reward_levels"] for r in rows]),
        "partial_levels_mean": _mean([r["partial_levels"] for r in rows]),
        "physics_envs": len(physics) if formula else None,
        "formula_reveal_share": _share([r["formula_revealed"] for r in physics]),
        "state_gated_share": _share(gated),
        "state_gating_known": sum(1 for g in gated if g is not None) if applies("state_gating", env_source) else None,
        "lines_mean": _mean([r["lines"] for r in rows]),
        "code_lines_mean": _mean([r["code_lines"] for r in rows]),
        "state_variables_mean": _mean([r["state_variables"] for r in rows]),
        "turns_mean": _mean([r["turns"] for r in rows]),
        "duplicate_share": collapse.set_duplicate_share(vectors, classes) if rows and diverse else None,
        "hint_contains_answer_share": _share([r["hint_contains_answer"] for r in rows]),
        "hint_one_turn_win_rate": _mean([r["hint_one_turn_win_rate"] for r in rows]),
        "nohint_one_turn_win_rate": _mean([r["nohint_one_turn_win_rate"] for r in rows]),
        "skills": dict(Counter(r["skill"] for r in rows)),
    }
    if env_source == RLVE:
        levels = [r["level"] for r in rows if r["level"] is not None]
        plays = sum(r["n_nohint_plays"] for r in rows)
        out.update({
            "rlve_distinct_environments": len({r["class_name"] for r in rows}),
            "rlve_level_min": min(levels, default=None), "rlve_level_max": max(levels, default=None),
            "rlve_level_mean": _mean(levels),
            # accurate plays over all plays of the group's problems at their own steps
            "rlve_accuracy": (sum(r["accuracy"] * r["n_nohint_plays"] for r in rows if r["accuracy"] is not None)
                              / plays) if plays else None,
        })
    return out


def _flat(summary: dict[str, Any]) -> dict[str, Any]:
    """Distributions shown as their mean and quartile-ish points (for CSV and curves)."""
    out = {}
    for key, value in summary.items():
        if isinstance(value, dict) and "histogram" in value:
            for stat in ("mean", "p10", "median", "p90"):
                out[f"{key}_{stat}"] = value[stat]
        elif not isinstance(value, (dict, list)):
            out[key] = value
    return out


def _rlve_grid(rows: list[dict[str, Any]], ids: list[int]) -> dict[int, tuple[float, float]]:
    """Map positions of rlve problems: x by environment identifier (sorted), y by level; problems on
    the same spot are spread by the explorer."""
    names = sorted({rows[i]["class_name"] for i in ids})
    levels = [rows[i]["level"] or 0 for i in ids]
    top = max(levels, default=0)
    out = {}
    for i in ids:
        x = (names.index(rows[i]["class_name"]) + 0.5) / len(names)
        out[i] = (x, ((rows[i]["level"] or 0) + 0.5) / (top + 1))
    return out


def analyze(runs: list[Run], embedder: Embedder, gating: dict[str, GatingVerdict] | None = None,
            window: int = DEFAULT_WINDOW, seed: int = 0, with_map: bool = True,
            progress: Callable[[str], None] | None = None,
            probed: dict[str, DegenerateVerdict] | None = None) -> Analysis:
    """``probed``: verdicts of the degenerate-policy probes played after the fact (``--probe``),
    by ``EnvRecord.uid``; they take the place of the run's recorded ones."""
    say = progress or (lambda _msg: None)
    degenerate = {**recorded_verdicts(runs), **(probed or {})}
    envs = [env for run in runs for env in run.envs]
    code = [i for i, env in enumerate(envs) if applies("vendi", env.env_source)]
    vectors = np.zeros((len(envs), 1), dtype=np.float32)
    if code:
        say(f"embedding {len(code)} environments ({embedder.name})")
        embedded = embedder.embed([envs[i].source for i in code])
        vectors = np.zeros((len(envs), embedded.shape[1]), dtype=np.float32)
        vectors[code] = embedded
    rows = [env_row(env, (gating or {}).get(env.uid), degenerate.get(env.uid)) for env in envs]
    if with_map and envs:
        if code:
            say("t-SNE map")
            for i, (x, y) in zip(code, tsne_coordinates(vectors[code], seed=seed)):
                rows[i]["x"], rows[i]["y"], rows[i]["map"] = float(x), float(y), "tsne"
        grid = _rlve_grid(rows, [i for i, env in enumerate(envs) if env.env_source == RLVE])
        for i, (x, y) in grid.items():
            rows[i]["x"], rows[i]["y"], rows[i]["map"] = x, y, "rlve_grid"
    index = {env.uid: i for i, env in enumerate(envs)}

    out_runs = []
    for run in runs:
        source = run.env_source
        mine = [index[env.uid] for env in run.envs]
        rejected_by_step: dict[int, Counter[str]] = {}
        for rejection in run.rejections:
            rejected_by_step.setdefault(rejection.step, Counter())[rejection.kind] += 1

        def group(ids: list[int], sampled: bool) -> dict[str, Any]:
            return aggregate([rows[i] for i in ids], vectors[ids] if ids else np.zeros((0, vectors.shape[1])),
                             [envs[i].class_name for i in ids], sampled, seed, source)

        steps = []
        for step in run.regeneration_steps:
            ids = [i for i in mine if envs[i].generated_step == step]
            counts = rejected_by_step.get(step, Counter())
            steps.append({"step": step, **group(ids, False), "rejected": sum(counts.values()),
                          "rejected_by_kind": dict(counts),
                          **degenerate_summary([degenerate[envs[i].uid] for i in ids], counts["degenerate_win"])})
        windows = []
        if run.regeneration_steps:
            last = max(run.regeneration_steps)
            for start in range(0, last + 1, window):
                ids = [i for i in mine if start <= envs[i].generated_step < start + window]
                if ids:
                    windows.append({"start": start, "end": start + window - 1, **group(ids, True)})
        whole = group(mine, True)
        whole.update(degenerate_summary([degenerate[envs[i].uid] for i in mine],
                                        sum(1 for r in run.rejections if r.kind == "degenerate_win")))
        skipped = not_applicable(source)
        if "collapse" in skipped:
            collapse_info: dict[str, Any] = {"not_applicable": skipped["collapse"]}
        else:
            collapse_info = collapse.collapse_summary(vectors[mine] if mine else np.zeros((0, 1)),
                                                      [envs[i].class_name for i in mine], [envs[i].uid for i in mine])
        entry = {"name": run.name, "path": str(run.path), "k": run.k, "env_source": source,
                 "not_applicable": skipped,
                 "regeneration_steps": run.regeneration_steps, "steps": steps, "windows": windows,
                 "whole_run": whole, "collapse": collapse_info, "rejections": len(run.rejections),
                 "metrics_steps": len(run.metrics)}
        if source == RLVE:
            entry["rlve"] = rlve_summary(run.envs, run.metrics)
        out_runs.append(entry)
    data = {"format": FORMAT_VERSION, "embedding": embedder.name, "window": window,
            "state_gating": gating is not None, "runs": out_runs, "envs": rows}
    return Analysis(data=data, runs=runs, envs=envs, embeddings=vectors, rows=rows)


def _fmt(value: Any) -> str:
    return "-" if value is None else f"{value:.3f}"


def run_line(run: dict[str, Any]) -> str:
    """One line per run for the console: the whole run's headline numbers, or why they do not apply."""
    whole, skipped = run["whole_run"], run["not_applicable"]
    parts = [f"{run['name']}: {whole['n_envs']} envs"]
    if run["env_source"] == FIXED_POOL:
        parts[0] += f" ({whole['distinct_envs']} distinct pool files)"
    if run["env_source"] == RLVE:
        parts.append(f"{whole['rlve_distinct_environments']} rlve-gym environments, levels "
                     f"{whole['rlve_level_min']}-{whole['rlve_level_max']}, accuracy {_fmt(whole['rlve_accuracy'])}")
    if "vendi" not in skipped:
        parts.append(f"Vendi/n {_fmt(whole['vendi_per_n'])}")
    parts.append(f"learnable {_fmt(whole['learnable_share'])}")
    parts.append(f"reward levels {_fmt(whole['reward_levels_mean'])}")
    if "state_gating" not in skipped:
        parts.append(f"state-gated {_fmt(whole['state_gated_share'])} (of {whole['state_gating_known']})")
    if "collapse" not in skipped:
        parts.append(f"longest duplicate streak {run['collapse']['longest_streak']}")
    if whole.get("degenerate_known"):
        by_family = whole.get("degenerate_share_by_family") or {}
        families = "".join(f"; {family} {_fmt(share)}" for family, share in by_family.items())
        parts.append(f"won by a degenerate policy {_fmt(whole['degenerate_share'])} (of {whole['degenerate_known']}, "
                     f"{whole['degenerate_from']}; {whole['rejected_degenerate_win']} rejected for it{families})")
    elif run["env_source"] != RLVE:
        parts.append("won by a degenerate policy: unknown (spade analyze --probe)")
    line = ", ".join(parts)
    if skipped:
        line += f"\n  not applicable to env_source {run['env_source']}: " + ", ".join(
            name.replace("_", " ") for name in skipped)
    return line


def step_table(data: dict[str, Any]) -> list[dict[str, Any]]:
    """One flat row per (run, regeneration step)."""
    return [{"run": run["name"], **_flat(step)} for run in data["runs"] for step in run["steps"]]


def window_table(data: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for run in data["runs"]:
        for w in run["windows"]:
            rows.append({"run": run["name"], **_flat(w)})
        rows.append({"run": run["name"], "start": "all", "end": "all", **_flat(run["whole_run"])})
    return rows
