"""A designed environment as a Gymnasium ``Env`` (docs/export.md).

    import gymnasium
    import spade.envs.gym  # registers spade/Designed-v0

    env = gymnasium.make("spade/Designed-v0", source="RUN/envs/step_000004/env_3.py")
    observation, info = env.reset(seed=7)
    observation, reward, terminated, truncated, info = env.step("\\\\boxed{move north}")
    env.close()

``source`` is an environment file: a file of a pool directory (``NAME.py``), a run's
``envs/step_N/ENV_ID.py``, or any file holding one environment class; or a pool directory with
``name=NAME``. ``code=`` takes the source text itself instead. The generated class runs in spade's
sandbox service (a supervisor process with its own sandboxes, started by this object, the client
training uses), never in the caller's process; each ``reset`` opens a fresh instance there, as each
play in training does, and ``close()`` stops the service.

Spaces: observations and actions are :class:`gymnasium.spaces.Text` over :data:`CHARSET` (every
character of Unicode's Basic Multilingual Plane except the surrogates), ``min_length`` 0 and
``max_length`` the sandbox's ``max_observation_chars`` / ``max_action_chars``. An observation with a
character outside the plane (an emoji) is returned as the environment wrote it, and falls outside
the declared space.

Rewards are the environment's own per-step rewards. The episode's return under SPEC 1.3 (the last
reward clipped to [-1, 1] if the episode terminated, else 0; intermediate rewards are not summed)
is ``info["episode_return"]`` on every step. ``info`` also holds ``turn`` (steps taken),
``turn_budget`` and ``env`` (the environment's own info dict), and, on the step that ends the
episode, ``end_reason`` (``terminated``, ``truncated`` or ``turn_budget``). The turn budget is
``max_turns`` (default 25, ``selfplay.max_turns``), or the environment's own smaller ``max_turns``;
reaching it without termination truncates the episode. The class is built as training builds a game
for a play: with its own default ``max_turns``, or with the budget when it cannot be built without
the argument. ``reset`` passes ``seed`` to the
environment; without one it draws the environment's seed from ``self.np_random``, so a seeded
reset followed by unseeded ones replays exactly (``info["seed"]`` says which seed was used).

Tool-use environments (SPEC 5) are refused with :class:`DesignedEnvError`: their actions are tool
calls with structured arguments, which a text action space does not express.
"""

from __future__ import annotations

import asyncio
import json
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Coroutine, TypeVar

import gymnasium
from gymnasium import spaces

from .pool_files import HINT_SUFFIX, read_manifest
from .protocol import EnvFault, ErrorKind, episode_return
from .runner import DEFAULT_MAX_TURNS, EndReason, turn_budget
from .sandbox.client import SandboxService, SandboxedEnv
from .sandbox.config import SandboxConfig

ENV_ID = "spade/Designed-v0"
CHARSET = "".join(chr(c) for c in range(0x10000) if not 0xD800 <= c <= 0xDFFF)
SEED_BOUND = 2**31 - 1
CALL_TIMEOUT_MARGIN_S = 30.0

T = TypeVar("T")


class DesignedEnvError(gymnasium.error.Error):
    """The environment failed in the sandbox (``error``: the classified failure, when there is
    one), or cannot be offered as a Gymnasium environment."""

    def __init__(self, message: str, error: Any = None):
        super().__init__(message)
        self.error = error


@dataclass(frozen=True)
class DesignedSource:
    """An environment's source with what its directory says about it."""

    code: str
    name: str
    hint: str | None = None
    skill: str | None = None
    path: Path | None = None


def _manifest_record(directory: Path, name: str) -> dict[str, Any]:
    return next((record for record in read_manifest(directory) if record["name"] == name), {})


def load_source(source: str | Path | None = None, *, name: str | None = None,
                code: str | None = None) -> DesignedSource:
    """The environment ``source`` (a file, or a pool directory with ``name``) or ``code`` names."""
    if (source is None) == (code is None):
        raise ValueError("spade/Designed-v0: give exactly one of source=PATH or code=TEXT")
    if code is not None:
        return DesignedSource(code=code, name=name or "env")
    path = Path(source)
    if path.is_dir():
        if name is None:
            stems = sorted(p.stem for p in path.glob("*.py"))[:5]
            raise ValueError(f"source={path} is a directory: name the environment with name=NAME "
                             f"(e.g. {', '.join(stems) or 'no NAME.py here'})")
        path = path / f"{name}.py"
    elif name is not None and name != path.stem:
        raise ValueError(f"name={name!r}: source={path} is one file already (its name is {path.stem!r})")
    if not path.is_file():
        raise FileNotFoundError(f"source={path}: no such environment file")
    hint_path = path.with_name(path.stem + HINT_SUFFIX)
    hint = hint_path.read_text(encoding="utf-8").strip() if hint_path.is_file() else None
    meta_path = path.with_suffix(".json")  # a run's envs/step_N/ENV_ID.json
    meta: dict[str, Any] = {}
    if meta_path.is_file():
        loaded = json.loads(meta_path.read_text(encoding="utf-8"))
        meta = loaded if isinstance(loaded, dict) else {}
    else:
        meta = _manifest_record(path.parent, path.stem)
    skill = meta.get("skill")
    return DesignedSource(code=path.read_text(encoding="utf-8"), name=path.stem, hint=hint or None,
                          skill=skill if isinstance(skill, str) else None, path=path)


class _LoopThread:
    """An event loop on a thread of its own, where the sandbox client lives: the synchronous
    Gymnasium calls submit coroutines to it, whatever loop (if any) the caller runs."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="spade-gym-sandbox", daemon=True)
        self.thread.start()
        self.service: SandboxService | None = None
        self.instance: SandboxedEnv | None = None

    def call(self, coroutine: Coroutine[Any, Any, T], timeout: float) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def shutdown(self) -> None:
        """Close the instance and the service, stop the loop (safe to call twice)."""
        if self.loop.is_closed():
            return
        if self.loop.is_running():
            try:
                self.call(self._close_all(), 30.0)
            finally:
                self.loop.call_soon_threadsafe(self.loop.stop)
                self.thread.join(30.0)
        self.loop.close()

    async def _close_all(self) -> None:
        instance, service = self.instance, self.service
        self.instance = self.service = None
        try:
            if instance is not None:
                await instance.close()
        finally:
            if service is not None:
                await service.close()


class DesignedEnv(gymnasium.Env[str, str]):
    """One designed environment, run in spade's sandbox (module docstring)."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, source: str | Path | None = None, *, name: str | None = None, code: str | None = None,
                 max_turns: int = DEFAULT_MAX_TURNS, sandbox_config: SandboxConfig | dict[str, Any] | None = None,
                 released_loader_names: bool = False, render_mode: str | None = None):
        if render_mode is not None:
            raise ValueError(f"render_mode={render_mode!r}: spade/Designed-v0 renders nothing (the observation "
                             "is the text); allowed: None")
        if not isinstance(max_turns, int) or max_turns < 1:
            raise ValueError(f"max_turns: must be an integer >= 1, got {max_turns!r}")
        self.source = load_source(source, name=name, code=code)
        self.hint = self.source.hint  # the privileged hint, never shown in an observation
        self.skill = self.source.skill
        config = sandbox_config if isinstance(sandbox_config, SandboxConfig) \
            else SandboxConfig.from_mapping(sandbox_config, where="sandbox_config")
        self.sandbox_config = config
        self.released_loader_names = released_loader_names
        self.observation_space = spaces.Text(config.max_observation_chars, min_length=0, charset=CHARSET)
        self.action_space = spaces.Text(config.max_action_chars, min_length=0, charset=CHARSET)
        self.render_mode = None
        self._timeout = max(config.load_timeout_s, config.reset_timeout_s, config.step_timeout_s) \
            + CALL_TIMEOUT_MARGIN_S
        self._max_turns = max_turns
        self._runner = _LoopThread()
        self._finalizer = weakref.finalize(self, self._runner.shutdown)
        try:
            self._runner.service = self._runner.call(SandboxService.start(config), config.start_timeout_s * 2 + 30)
            first = self._open()  # loads the class now, so a broken or tool-use source fails at make()
        except BaseException:
            self._finalizer()
            raise
        if first.tool_use:
            self._finalizer()
            raise DesignedEnvError(
                f"{self.source.name}: {first.class_name} is a tool-use environment (SPEC 5): its actions are "
                "tool calls with JSON arguments, which spade/Designed-v0's text action space does not express; "
                "only game environments are offered as Gymnasium environments")
        self._runner.instance = first
        self.class_name = first.class_name
        self.env_max_turns = first.max_turns
        self.turn_budget = turn_budget(max_turns, first.max_turns)
        self._fresh = True   # the open instance has not been reset yet
        self._turn = 0
        self._done = True

    # ------------------------------------------------------------------ sandbox calls

    def _call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        try:
            return self._runner.call(coroutine, self._timeout)
        except EnvFault as fault:
            raise DesignedEnvError(f"{self.source.name}: {fault}", fault.error) from None

    def _open(self) -> SandboxedEnv:
        service = self._runner.service
        if service is None:
            raise DesignedEnvError(f"{self.source.name}: the environment is closed")
        options = {"released_loader_names": True} if self.released_loader_names else {}
        try:
            return self._call(service.open(self.source.code, max_turns=None, **options))
        except DesignedEnvError as exc:
            # as training opens a game for a play: built with its own default, or, when the class
            # cannot be built without the argument, with the turn budget
            error = exc.error
            if error is None or error.kind is not ErrorKind.INIT_ERROR or "max_turns" not in error.message:
                raise
        return self._call(service.open(self.source.code, max_turns=self._max_turns, **options))

    # ------------------------------------------------------------------ the Gymnasium API

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        if options:
            raise ValueError(f"options: spade/Designed-v0 takes no reset options, got {sorted(options)}")
        inner_seed = int(seed) if seed is not None else int(self.np_random.integers(0, SEED_BOUND))
        if not self._fresh:  # a fresh instance per episode, as each play in training gets
            old, self._runner.instance = self._runner.instance, None
            if old is not None:
                self._call(old.close())
            self._runner.instance = self._open()
        instance = self._runner.instance
        if instance is None:
            raise DesignedEnvError(f"{self.source.name}: the environment is closed")
        self._fresh = False
        result = self._call(instance.reset(seed=inner_seed))
        self._turn, self._done = 0, False
        return result.observation, {"env": result.info, "seed": inner_seed, "turn": 0,
                                    "turn_budget": self.turn_budget, "episode_return": 0.0}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if not isinstance(action, str):
            raise TypeError(f"action: spade/Designed-v0 takes a str, got {type(action).__name__}")
        if self._done or self._runner.instance is None:
            raise DesignedEnvError(f"{self.source.name}: the episode is over (or never began); call reset()")
        result = self._call(self._runner.instance.step(action))
        self._turn += 1
        terminated = bool(result.terminated)
        truncated = bool(result.truncated) and not terminated
        end: EndReason | None = EndReason.TERMINATED if terminated else EndReason.TRUNCATED if truncated else None
        if end is None and self._turn >= self.turn_budget:
            truncated, end = True, EndReason.TURN_BUDGET
        info: dict[str, Any] = {"env": result.info, "turn": self._turn, "turn_budget": self.turn_budget,
                                "episode_return": episode_return([result.reward], terminated)}
        if end is not None:
            info["end_reason"] = end.value
            self._done = True
        return result.observation, float(result.reward), terminated, truncated, info

    def close(self) -> None:
        self._finalizer()
        self._done = True
        super().close()


gymnasium.register(id=ENV_ID, entry_point=DesignedEnv, disable_env_checker=False)
