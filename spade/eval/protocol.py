"""Evaluation protocols: which configuration a benchmark is played and scored with.

``eval.protocol`` (``spade eval --protocol``) picks one of three values:

- ``spade`` (default): spade's own settings, the behaviour every earlier result was produced with;
- ``in_loop``: the released code's in-loop evaluation configuration (``eval_configs/gem_eval_inloop.yaml``,
  ``eval_configs/eval_aime_avg32.yaml`` and the evaluators they drive);
- ``offline``: the released code's offline evaluation configuration (``eval_offline/configs/games.yaml``,
  ``_games_gem.yaml`` and ``eval_offline/suites/*``).

The two released configurations differ for AIME, GPQA-Diamond, LiveCodeBench and Reasoning-Gym;
each benchmark module reads the protocol for its prompt, answer extraction and item set, and
:func:`protocol_sampling` gives its sampling settings. BFCL, tau2 and ACEBench have one setting
whatever the protocol. docs/evaluation.md ("Evaluation protocols") lists every difference.
"""

from __future__ import annotations

from typing import Mapping

from .types import SamplingSettings

SPADE = "spade"
IN_LOOP = "in_loop"
OFFLINE = "offline"
PROTOCOLS = (SPADE, IN_LOOP, OFFLINE)
DEFAULT_PROTOCOL = SPADE
RELEASED = (IN_LOOP, OFFLINE)

DESCRIPTIONS: Mapping[str, str] = {
    SPADE: "spade's own settings (the default)",
    IN_LOOP: "the released in-loop evaluation configuration",
    OFFLINE: "the released offline evaluation configuration",
}


def check_protocol(value: object, key: str = "eval.protocol") -> str:
    """``value`` when it names a protocol; a ValueError naming ``key`` and the allowed values otherwise."""
    if value not in PROTOCOLS:
        raise ValueError(f"{key} must be one of {', '.join(PROTOCOLS)}, got {value!r}")
    return str(value)


def describe(protocol: str) -> str:
    return f"{protocol} ({DESCRIPTIONS.get(protocol, 'unknown protocol')})"


# Sampling per benchmark family and protocol. ``spade`` keeps the settings spade used before
# protocols existed (the released in-loop ones); top_k None: the server's default (not sent).
_SAMPLING: Mapping[str, Mapping[str, SamplingSettings]] = {
    "aime": {
        SPADE: SamplingSettings(n=32, temperature=0.7, top_p=0.8, top_k=20, max_new_tokens=32768),
        IN_LOOP: SamplingSettings(n=32, temperature=0.7, top_p=0.8, top_k=20, max_new_tokens=32768),
        OFFLINE: SamplingSettings(n=64, temperature=1.0, top_p=0.95, top_k=20, max_new_tokens=32768),
    },
    "gpqa": {
        SPADE: SamplingSettings(n=2, temperature=0.7, top_p=0.8, top_k=20, max_new_tokens=16384),
        IN_LOOP: SamplingSettings(n=2, temperature=0.7, top_p=0.8, top_k=20, max_new_tokens=16384),
        OFFLINE: SamplingSettings(n=8, temperature=0.7, top_p=0.95, top_k=None, max_new_tokens=32768),
    },
    "lcb": {
        SPADE: SamplingSettings(n=1, temperature=0.7, top_p=0.8, top_k=20, max_new_tokens=16384),
        IN_LOOP: SamplingSettings(n=1, temperature=0.7, top_p=0.8, top_k=20, max_new_tokens=16384),
        OFFLINE: SamplingSettings(n=1, temperature=0.2, top_p=0.95, top_k=None, max_new_tokens=16384),
    },
    "rg": {
        SPADE: SamplingSettings(n=1, temperature=0.6, top_p=0.8, top_k=20, max_new_tokens=8192),
        IN_LOOP: SamplingSettings(n=1, temperature=0.6, top_p=0.8, top_k=20, max_new_tokens=8192),
        OFFLINE: SamplingSettings(n=1, temperature=0.6, top_p=0.8, top_k=20, max_new_tokens=8192),
    },
}

# Reasoning-Gym episodes per task (the released configurations' ``episodes``)
RG_EPISODES: Mapping[str, int] = {SPADE: 4, IN_LOOP: 4, OFFLINE: 8}


def protocol_sampling(family: str, protocol: str) -> SamplingSettings:
    """The sampling settings of ``family`` (aime, gpqa, lcb, rg) under ``protocol``."""
    if family not in _SAMPLING:
        raise ValueError(f"no protocol sampling for benchmark family {family!r}; known: {', '.join(_SAMPLING)}")
    return _SAMPLING[family][check_protocol(protocol)]
