"""Designed environments as a Prime Intellect ``verifiers`` (0.4, ``verifiers.v1``) environment.

A *taskset* of one task per environment file and seed, and an *env* whose rollout plays the game
in spade's sandbox (docs/export.md)::

    from spade.envs.verifiers_env import load_environment
    env = load_environment("RUN/envs/step_000004", seeds=2)

(taskset id ``spade_pool``, registered when this module is imported). ``source`` is a pool directory, a
run's ``envs/step_N/`` or one environment file. Each rollout opens a fresh sandboxed instance of
its game (the sandbox service starts once per env, in ``start()``), resets it with the task's seed,
sends the first observation as the opening user turn, parses each model reply with spade's action
parser, steps until the environment ends the episode or the turn budget runs out, and closes the
instance. The reward ``spade_return`` is SPEC 1.3's return (last reward, clipped, if terminated;
else 0). Hints are not shown (the no-hint arm); tool-use environments are not offered.

verifiers is imported only here; it lives in ``.venv-verifiers`` (``make verifiers``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator, Optional

import verifiers.v1 as vf
from verifiers.v1.harnesses.null import NullHarnessConfig

from .pool_files import HINT_SUFFIX
from .protocol import ErrorKind, EnvFault
from .runner import DEFAULT_MAX_TURNS, StopEpisode, play_episode
from .sandbox.client import SandboxService
from .sandbox.config import SandboxConfig

__all__ = ["SpadePoolConfig", "SpadePoolTaskset", "SpadePoolEnvConfig", "SpadePoolEnv", "load_environment"]

# verifiers imports a taskset by a top-level module name (a dotted id is looked up under
# verifiers.v1.tasksets first, and that lookup fails on a missing parent package), so this module
# is also registered under a plain name once imported
TASKSET_ID = "spade_pool"
sys.modules.setdefault(TASKSET_ID, sys.modules[__name__])


def environment_files(source: str | Path) -> list[Path]:
    """The environment files ``source`` names (hint files and manifests left out)."""
    path = Path(source)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise FileNotFoundError(f"taskset.source={path}: no such pool directory or environment file")
    files = sorted(p for p in path.glob("*.py") if not p.name.endswith(HINT_SUFFIX))
    if not files:
        raise FileNotFoundError(f"taskset.source={path}: no environment files (*.py) there")
    return files


class SpadePoolConfig(vf.TasksetConfig):
    source: str = ""
    """A pool directory, a run's envs/step_N/, or one environment file."""
    seeds: int = 1
    """Tasks per environment: seeds 0 .. seeds-1."""
    max_turns: int = DEFAULT_MAX_TURNS
    """The turn budget (selfplay.max_turns), or the environment's own smaller max_turns."""


class SpadePoolData(vf.TaskData):
    info: dict


class SpadePoolTask(vf.Task[SpadePoolData, vf.State, vf.TaskConfig]):
    pass


class SpadePoolTaskset(vf.Taskset[SpadePoolTask, SpadePoolConfig]):
    def load(self) -> Iterator[SpadePoolTask]:
        if self.config.seeds < 1:
            raise ValueError(f"taskset.seeds: must be >= 1, got {self.config.seeds}")
        for path in environment_files(self.config.source):
            for seed in range(self.config.seeds):
                # prompt None: the env opens the exchange with the game's seeded first observation
                yield SpadePoolTask(
                    SpadePoolData(name=f"{path.stem}#{seed}", prompt=None,
                                  info={"path": str(path.resolve()), "seed": seed,
                                        "max_turns": self.config.max_turns}),
                    self.config.task)


class SpadePoolEnvConfig(vf.EnvConfig):
    # verifiers' plain chat program: the model only talks, the game runs here (its default for a
    # taskset without a harness would be the bash agent). The program runs no code, so it runs as a
    # local process (verifiers' default runtime is a Prime Intellect sandbox, which needs an account)
    player: vf.AgentConfig = vf.AgentConfig(harness=NullHarnessConfig(id="null"), runtime=vf.SubprocessConfig())


class _InteractionPolicy:
    """spade's ``Policy`` (messages -> reply) over a verifiers interaction: each call sends the
    newest user message as one turn and returns the model's reply."""

    def __init__(self, interaction) -> None:
        self.interaction = interaction
        self.turns = 0

    async def __call__(self, messages) -> str:
        segment = await self.interaction.turn(messages[-1].content)
        if segment.terminated:
            raise StopEpisode("the verifiers rollout ended (a limit or a stop condition)")
        self.turns += 1
        return segment.last_reply


class SpadePoolEnv(vf.Env[SpadePoolEnvConfig]):
    service: Optional[SandboxService] = None

    async def start(self) -> None:
        self.service = await SandboxService.start(SandboxConfig())

    async def stop(self) -> None:
        if self.service is not None:
            service, self.service = self.service, None
            await service.close()

    async def _open(self, code: str, max_turns: int):
        assert self.service is not None, "SpadePoolEnv.start() was not called"
        try:
            return await self.service.open(code, max_turns=None)
        except EnvFault as fault:
            # as training opens a game: its own default, or the budget when it needs the argument
            error = fault.error
            if error is None or error.kind is not ErrorKind.INIT_ERROR or "max_turns" not in error.message:
                raise
        return await self.service.open(code, max_turns=max_turns)

    async def run(self, task, agents) -> None:
        info = task.data.info
        code = Path(info["path"]).read_text(encoding="utf-8")
        instance = await self._open(code, info["max_turns"])
        try:
            if instance.tool_use:
                raise ValueError(f"{info['path']}: a tool-use environment (SPEC 5) is not offered as a "
                                 "verifiers game environment")
            async with agents.player.interaction(task) as interaction:
                policy = _InteractionPolicy(interaction)
                episode = await play_episode(instance, policy, seed=info["seed"], max_turns=info["max_turns"])
        finally:
            await instance.close()
        trace = interaction.trace
        trace.record_reward("spade_return", float(episode.episode_return), 1.0)
        trace.info["spade_turns"] = len(episode.turns)
        trace.info["spade_actions"] = [turn.action for turn in episode.turns]
        trace.info["spade_end_reason"] = episode.end_reason.value if episode.end_reason else None


def load_environment(source: str, *, seeds: int = 1, max_turns: int = DEFAULT_MAX_TURNS, **env_fields) -> vf.Env:
    """The verifiers env for ``source`` (a pool directory, a run's envs/step_N/, one file)."""
    from verifiers.v1.utils.loaders import load_environment as vf_load_environment

    config = SpadePoolEnvConfig(taskset=SpadePoolConfig(id=TASKSET_ID, source=str(source), seeds=seeds,
                                                        max_turns=max_turns), **env_fields)
    return vf_load_environment(config)
