"""Reward levels: how many distinct reward values an environment emitted (SPEC 6: 3.7 early ->
5.8 late; strictly partial ones, strictly between 0 and 1: 2.2 -> 4.0).

Counted over every turn of every kept trajectory of the environment (both arms, every step of its
window), rewards rounded to 6 decimals. Only a bounded sample of plays is kept
(``selfplay.plays.keep_trajectories`` per arm per step), so this is a lower bound on what the
environment can emit; environments without kept trajectories have no value.
"""

from __future__ import annotations

from typing import Any, Iterable

DECIMALS = 6


def reward_values(turn_rewards: Iterable[float]) -> set[float]:
    return {round(float(r), DECIMALS) for r in turn_rewards}


def reward_levels(turn_rewards: Iterable[float]) -> dict[str, Any]:
    values = reward_values(turn_rewards)
    partial = sorted(v for v in values if 0.0 < v < 1.0)
    return {"levels": len(values), "partial_levels": len(partial), "values": sorted(values)}


def env_rewards(episodes: Iterable[Any]) -> list[float]:
    """Every turn's reward of the given episodes (``run_reader.Episode``)."""
    return [float(t.get("reward", 0.0)) for e in episodes for t in e.turns if t.get("reward") is not None]
