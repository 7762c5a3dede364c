"""The released code's admission smoke test (``selfplay.admission.smoke_test: released``).

The released trainer (spade-rl/spade 9b2b813) admits a generated game with ``validate_game``
(``core/utils/game_files.py:11-23``), run in a thread with a 60 s bound (``VALIDATE_GAME_TIMEOUT``,
``core/orchestrator.py:86-111``). It has two parts:

1. Loading the game (``make_synthetic_env``) runs the loader's own check
   (``SyntheticGameEnv._validate_game_execution``, ``core/envs/synthetic_game_env.py:262-334``):
   ``reset(seed=42)`` must give a non-empty string observation; the actions ``\\boxed{1}``,
   ``\\boxed{test}``, ``\\boxed{42}`` are stepped until one ends the episode, each returning a
   well-formed 5-tuple with a reward in [-10, 10]; then ``reset(seed=123)`` must not raise.
2. ``validate_game`` itself then calls ``reset()`` without a seed and steps ``"1"``, ``"2"``,
   ``"test"`` through the loader's wrapper, which turns an exception or a malformed return into an
   ending observation (``core/envs/synthetic_game_env.py:336-434``): their values are never
   checked, only that they return at all within the bound.

Here both parts run in the sandbox (which checks the shapes and types of every return itself).
Part 2 plays a second instance of the game (the sandbox discards an instance after any fault, and
admission's later stages go on with the first): what the wrapper swallows (the game raising in
``reset`` or ``step``, a malformed or unserialisable return) is ignored and ends part 2, as the
wrapper's ending observation ends the probe loop; a timeout, a crash or a resource limit rejects
the game. Standard library only.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any, Awaitable, Callable

from .protocol import EnvError, EnvFault, ErrorKind, InfrastructureFault, Stage

LOADER_SEEDS = (42, 123)  # core/envs/synthetic_game_env.py:273, :330
LOADER_ACTIONS = ("\\boxed{1}", "\\boxed{test}", "\\boxed{42}")  # core/envs/synthetic_game_env.py:290-294
LOADER_REWARD_BOUND = 10.0  # core/envs/synthetic_game_env.py:319
PROBE_ACTIONS = ("1", "2", "test")  # core/utils/game_files.py:15
BOUND_S = 60.0  # VALIDATE_GAME_TIMEOUT, core/orchestrator.py:86
# what the released wrapper turns into an observation instead of failing the game
SWALLOWED = frozenset({ErrorKind.RESET_ERROR, ErrorKind.STEP_ERROR, ErrorKind.BAD_RETURN,
                       ErrorKind.NOT_SERIALIZABLE})


async def released_smoke_test(env: Any, reopen: Callable[[], Awaitable[Any]], bound_s: float = BOUND_S) -> str:
    """Both parts within ``bound_s`` seconds, part 2 on a second instance from ``reopen()``; the
    first observation of ``reset(seed=42)``. Raises :class:`EnvFault` for a rejected game (a
    ``timeout`` at stage ``smoke`` when the bound runs out)."""
    try:
        return await asyncio.wait_for(_both_parts(env, reopen), bound_s)
    except asyncio.TimeoutError:
        raise EnvFault(EnvError(ErrorKind.TIMEOUT, Stage.SMOKE,
                                f"the released smoke test did not finish within {bound_s:g} s")) from None


async def _both_parts(env: Any, reopen: Callable[[], Awaitable[Any]]) -> str:
    first = await env.reset(seed=LOADER_SEEDS[0])
    if not first.observation.strip():
        raise EnvFault(EnvError(ErrorKind.BAD_RETURN, Stage.RESET,
                                f"reset(seed={LOADER_SEEDS[0]}) returned an empty observation"))
    for action in LOADER_ACTIONS:
        result = await env.step(action)
        if not (math.isfinite(result.reward) and abs(result.reward) <= LOADER_REWARD_BOUND):
            raise EnvFault(EnvError(ErrorKind.BAD_RETURN, Stage.STEP,
                                    f"step({action!r}) returned reward {result.reward}, outside "
                                    f"[-{LOADER_REWARD_BOUND:g}, {LOADER_REWARD_BOUND:g}]"))
        if result.terminated or result.truncated:
            break
    await env.reset(seed=LOADER_SEEDS[1])
    second = await reopen()
    try:
        if await _unchecked(second.reset()) is not None:
            for action in PROBE_ACTIONS:
                result = await _unchecked(second.step(action))
                if result is None or result.terminated or result.truncated:
                    break
    finally:
        await second.close()
    return first.observation


async def _unchecked(call: Any) -> Any:
    """The call's result, or None where the released wrapper would have swallowed its fault."""
    try:
        return await call
    except InfrastructureFault:
        raise
    except EnvFault as fault:
        if fault.error.kind in SWALLOWED:
            return None
        raise
