"""The orchestrator's figures of a step (``StepOutput.metrics``), made in one place.

:func:`regeneration_figures`: what a regeneration admitted and rejected (``designer/attempts``,
``env/admitted``, ``env/rejected`` and ``env/rejected_<kind>``, the tool-use screens' counts), only
at regeneration steps. :func:`step_figures`: every step's source, plays and counts (``agent/*``,
``env/set_size``, ``env/learnable_share``, ``designer/samples``, ``designer/pending``, the player's
and the partial rollouts' figures), among them the spread of returns inside each no-hint group,
what GRPO learns from: ``agent/group_return_std`` (the mean over the groups of their returns'
standard deviation) and ``agent/flat_groups`` (groups whose returns are all equal: no advantage).
The trainer's own figures join them in ``spade/run/step_metrics.py``.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from ..designer.memory import win_rate
from ..envs.protocol import ErrorKind
from .sources.designer_source import EnvSpec, RegenerationResult
from .settings import SelfPlaySettings
from .plays.step_plays import StepPlays, all_equal

LEARNABLE_BAND = (0.2, 0.8)


def mean(values: list[float]) -> float:
    return math.fsum(values) / len(values)


def std(values: list[float]) -> float:
    centre = mean(values)
    return math.sqrt(mean([(v - centre) ** 2 for v in values]))


def regeneration_figures(settings: SelfPlaySettings, regen: RegenerationResult) -> dict[str, float]:
    metrics = {"designer/attempts": float(regen.attempts), "env/admitted": float(len(regen.envs)),
               "env/rejected": float(len(regen.rejections))}
    counts = Counter(r.kind.value for r in regen.rejections)
    # a gate that is on reports 0 too (rlve problems are not admitted through the sandbox)
    if settings.admission_probe_settings() is not None and settings.env_source != "rlve":
        counts.setdefault(ErrorKind.DEGENERATE_WIN.value, 0)
    if settings.admission_reference_settings() is not None:
        for kind in (ErrorKind.REFERENCE_LOST, ErrorKind.REFERENCE_MISSING):
            counts.setdefault(kind.value, 0)
    for kind, count in sorted(counts.items()):
        metrics[f"env/rejected_{kind}"] = float(count)
    reports = [env.tool_report for env in regen.envs if env.tool_report is not None]
    if settings.domain == "tool_use":
        # admitted environments with a criterion true at reset / unchangeable by the probes /
        # met by any first call (reported, rejected only when switched on), and model screens
        # that gave no verdict
        for key in ("true_at_reset", "unchangeable", "trivial"):
            metrics[f"env/tool_{key}"] = float(sum(1 for r in reports if r.get(key)))
        metrics["env/tool_screen_no_verdict"] = float(sum(1 for r in reports if r.get("screen") is None))
        # admitted environments where a degenerate probe policy completed some instruction (not all:
        # that rejects); absent when the probes are off
        probed = [r["probe_report"] for r in reports if r.get("probe_report")]
        if probed:
            metrics["env/tool_probe_partial"] = float(sum(
                1 for probes in probed if any(any(policy.get("completed") or []) for policy in probes["policies"])))
    return metrics


def step_figures(settings: SelfPlaySettings, out: Any, plays: StepPlays, regenerate: bool, *, source: Any,
                 player: Any, step_player: Any, envs: list[EnvSpec], pending: int) -> dict[str, float]:
    """The source's and the plays' figures, and the counts every step carries: ``agent/samples`` and
    ``designer/samples`` (what ``out`` trains on), ``designer/pending`` (what waits)."""
    metrics: dict[str, float] = {}
    source_metrics = getattr(source, "metrics", None)  # optional: what the source itself tracks
    if source_metrics is not None:
        metrics.update(source_metrics())
    nohint = [p for env_plays in plays.nohint.values() for p in env_plays]
    returns = [p.episode_return for p in nohint]
    metrics["agent/episodes"] = float(len(nohint))
    metrics["agent/samples"] = float(len(out.agent_samples))
    metrics["agent/infra_dropped"] = float(player.infrastructure_failures)
    if settings.plays.drops_faults:  # env_faults retry_then_drop (cumulative, like infra_dropped)
        metrics["agent/fault_dropped"] = float(player.fault_drops)
        metrics["env/hung"] = float(sum(env.env_id in player.hung_envs for env in envs))
    metrics.update(player.step_metrics())  # rollout shards: where the plays ran
    # the spread inside each group, what GRPO learns from (0 in every group: no learning signal)
    groups = [[p.episode_return for p in g] for _, _, g in plays.groups if g]
    if groups:
        metrics["agent/group_return_std"] = mean([std(g) for g in groups])
        metrics["agent/flat_groups"] = float(sum(all_equal(g) for g in groups))
    if nohint:
        metrics["agent/return_mean"] = mean(returns)
        metrics["agent/return_std"] = std(returns)
        metrics["agent/win_rate"] = win_rate(returns)
        metrics["agent/turns_mean"] = mean([float(p.turns) for p in nohint])
    if regenerate:
        hint_returns = [p.episode_return for env_plays in plays.hinted.values() for p in env_plays]
        metrics["agent/hint_episodes"] = float(len(hint_returns))
        if hint_returns:
            metrics["agent/hint_return_mean"] = mean(hint_returns)
    metrics["env/set_size"] = float(len(envs))
    rates = [win_rate([p.episode_return for p in env_plays]) for env_plays in plays.nohint.values() if env_plays]
    if rates:
        lo, hi = LEARNABLE_BAND
        metrics["env/learnable_share"] = sum(lo <= r <= hi for r in rates) / len(rates)
    metrics["designer/samples"] = float(len(out.designer_samples))
    metrics["designer/pending"] = float(pending)
    metrics.update(step_player.step_metrics())  # partial rollouts: what was carried
    return metrics
