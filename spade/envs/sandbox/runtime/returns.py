"""The episode return rule (SPEC 1.3), standard library only so that the sandbox runs it too.

:mod:`spade.envs.protocol` exports it for the trainer; the probes' loop inside the sandboxed
child (:mod:`.probe_play`) scores its episodes with the same function.
"""

from __future__ import annotations

import math


def episode_return(rewards: list[float], terminated: bool) -> float:
    """SPEC 1.3: the last step's reward clipped to [-1, 1] if the episode terminated, else 0.

    Intermediate rewards are progress signals and are not summed.
    """
    if not terminated or not rewards:
        return 0.0
    last = float(rewards[-1])
    if not math.isfinite(last):
        return 0.0
    return max(-1.0, min(1.0, last))
