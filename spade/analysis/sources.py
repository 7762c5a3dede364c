"""Which analyses mean something for a run's environment source (``selfplay.env_source``).

The curriculum numbers were made for designed environments (SPADE): Python sources, a hint each,
written anew at every regeneration. The baselines differ:

* ``fixed_pool``: the sources are Python files of a pool written before the run and drawn again
  and again, so every code analysis applies, but a streak of near-duplicates in generation order
  measures the pool's draw, not a designer collapsing; and a pool file drawn at several
  regenerations is one environment, so run- and window-level diversity counts it once.
* ``rlve``: a "source" is a JSON problem spec (rlve-gym environment identifier, seed, generator
  parameter, difficulty level), single-turn and without hint. Nothing that reads code, the
  opening's formula, the hint or replays a multi-turn win applies; what does is accuracy per
  environment identifier and per difficulty level (:mod:`.rlve_levels`).

:data:`NOT_APPLICABLE` names each analysis family that does not apply to a source and why; the
report, the plots and the explorer say so instead of showing a 0 or an empty curve.
"""

from __future__ import annotations

from typing import Any, Mapping

DESIGNER, FIXED_POOL, RLVE = "designer", "fixed_pool", "rlve"

# family -> why it does not apply, per env_source (families: keys of report rows and aggregates)
NOT_APPLICABLE: dict[str, dict[str, str]] = {
    RLVE: {
        "vendi": "a problem is a JSON spec (environment, seed, parameter, level), not code to embed; "
                 "see rlve.distinct_environments",
        "map": "no code embeddings: the map lays problems out by rlve-gym environment (x) and level (y)",
        "program_size": "no program: a problem is a JSON spec played in rlve-gym",
        "formula_reveal": "rlve-gym prompts are not physics games written by a designer",
        "state_gating": "single-turn problems: the first action is the only one",
        "hint_leakage": "rlve problems have no hint",
        "regret": "rlve problems have no hint, so there are no hinted plays",
        "collapse": "problems are drawn by rlve-gym's generators, not written by a designer",
    },
    FIXED_POOL: {
        "collapse": "the sets are draws from a pool written before the run: a repeat is a redraw, "
                    "not a designer collapsing",
    },
}


def env_source_of(config: Mapping[str, Any]) -> str:
    """``selfplay.env_source`` of a run's resolved config (``RUN/config.yaml``); configs written
    before the key existed mean the fixed pool by ``designer_enabled: false``."""
    selfplay = config.get("selfplay") or {}
    source = selfplay.get("env_source")
    if isinstance(source, str) and source:
        return source
    return FIXED_POOL if selfplay.get("designer_enabled") is False else DESIGNER


def not_applicable(env_source: str) -> dict[str, str]:
    """family -> "not applicable to env_source X: why", for every family that does not apply."""
    return {family: f"not applicable to env_source {env_source}: {why}"
            for family, why in NOT_APPLICABLE.get(env_source, {}).items()}


def applies(family: str, env_source: str) -> bool:
    return family not in NOT_APPLICABLE.get(env_source, {})
