"""Where a step's environment set comes from: the designer, a static pool, or RLVE's generators.

The orchestrator asks an :class:`EnvSource` for a new set at every regeneration step and tells it
how the agent did on the set at every step; everything else of the step (plays, advantages, the
delay buffer, memory) is the same whichever source it is. ``selfplay.env_source`` picks one:

* ``designer`` (SPADE): :class:`~spade.selfplay.sources.designer_source.DesignerRound` writes the set;
  the only source whose regenerations carry designer trajectories.
* ``fixed_pool`` (Fixed-env GRPO): :class:`~spade.selfplay.sources.fixed_pool.FixedPool` draws from a directory of
  admitted environments.
* ``rlve`` (Fixed-env RLVE): :class:`~spade.selfplay.sources.rlve_source.RLVESource` asks rlve-gym's
  procedural generators for problems at the difficulty its controller has reached.

A source may also have ``metrics() -> dict[str, float]`` (merged into the step's metrics after
``observe``; RLVE's levels) and ``async close()`` (called when the run ends; RLVE's workers).
A source that plays and scores its own way (``spiral``: both seats of a two-player game, its
role-conditioned baselines) has ``step_player(player)`` (the step's plays, in place of the
orchestrator's) and ``advantages(env, plays) -> list[float | None]`` (in place of the z-scores; None
leaves that play out of training).

A source's ``state_dict()`` is JSON and goes into the orchestrator's checkpointed state, so a resumed
run draws and schedules exactly what the interrupted run would have.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from ...envs.protocol import Sandbox
from .designer_source import EnvSpec, RegenerationResult
from ..settings import ENV_SOURCES, EnvSourceName

__all__ = ["ENV_SOURCES", "EnvSource", "EnvSourceName"]


@runtime_checkable
class EnvSource(Protocol):
    """A supplier of environment sets."""

    async def next_set(self, step: int) -> RegenerationResult:
        """The set for regeneration step ``step`` (saved under the run directory by the source)."""
        ...

    def observe(self, step: int, envs: list[EnvSpec], nohint_returns: dict[str, list[float]]) -> None:
        """The no-hint returns of every environment of the set at ``step`` (every step, after the plays)."""
        ...

    def play_sandbox(self) -> Sandbox | None:
        """Where this source's environments are played; None: the run's sandbox."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...
