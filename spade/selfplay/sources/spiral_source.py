"""SPIRAL's source (``selfplay.env_source: spiral``): fixed two-player zero-sum games, self-play.

The set is the configured games (``selfplay.spiral.games``, :mod:`.spiral_settings`), one
:class:`EnvSpec` per game (skill = the game's name, class = its TextArena id, no hint), drawn anew
at every regeneration with a step-stamped id and written under ``RUN/envs/`` like any set. The
plays are the source's own (:class:`~spade.selfplay.plays.two_seat_player.TwoSeatGames`: both
seats of ``games_per_step`` games per game), offered to the orchestrator by :meth:`step_player`,
and so are the advantages (:meth:`advantages`): SPIRAL's role-conditioned baselines
(:class:`~spade.selfplay.rewards.role_baselines.RoleBaselines`), or the z-scores every other
source gets (``advantage: grpo``), or the raw returns (``none``, SPIRAL's own ablation). The step's
samples are then ordinary agent samples.

With ``selfplay.spiral.designed.enabled`` (spade's extension, not SPIRAL's) each regeneration also
asks the designer for two-player games of its own (:mod:`.spiral_designed`): the admitted ones join
the set after TextArena's, skill ``designed_<slot>``, their code as the source; their role
baselines are kept per designed environment (a new game starts from 0, as each of SPIRAL's games
did) and dropped once the game leaves the set.

Figures (``spiral/<game>/...``, after the plays): per seat the mean return, the win and draw
shares, and with RAE the baseline after the step; the player adds the games' endings.

State: the role baselines (JSON), in the orchestrator's checkpoint as the source's state.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from ...config import ConfigError
from ..plays.play_record import Play
from ..rewards.advantages import agent_advantages
from ..rewards.role_baselines import RoleBaselines
from ..settings import SelfPlaySettings
from .designer_source import EnvSpec, RegenerationResult, save_set
from .spiral_designed import DesignedGames, is_designed
from .spiral_settings import GAMES

STATE_VERSION = 1


def seat_of(play: Play) -> int:
    """The seat a SPIRAL play was (its index is ``2 * game + seat``)."""
    return play.index % 2


def game_source(name: str) -> str:
    """What ``RUN/envs/`` keeps of a game: which TextArena environment it is (valid Python)."""
    textarena_id, wrapper = GAMES[name]
    return (f"# SPIRAL game {name!r}: TextArena's own environment, played by spade's two-seat player\n"
            f"TEXTARENA_ID = {textarena_id!r}\nOBSERVATION = {wrapper!r}\n")


class SpiralSource:
    """An :class:`~spade.selfplay.sources.env_source.EnvSource` of SPIRAL's games (module docstring)."""

    def __init__(self, settings: SelfPlaySettings, *, run_dir: Path, seed: int, sandbox: Any = None,
                 generator: Any = None):
        if settings.rollout_shards != 1:
            raise ConfigError(f"selfplay.rollout_shards: {settings.rollout_shards} with env_source: spiral; allowed: 1 "
                              "(the games are played on rank 0)")
        if settings.partial_rollouts.enabled:
            raise ConfigError("selfplay.partial_rollouts.enabled: true with env_source: spiral; allowed: false "
                              "(a game's two seats end together)")
        self.settings = settings
        self.config = settings.spiral
        self.run_dir = Path(run_dir)
        self.seed = seed
        self.baselines = RoleBaselines(self.config.rae_decay)
        self.last_metrics: dict[str, float] = {}
        self.designed: DesignedGames | None = None
        if self.config.designed.enabled:
            if sandbox is None or generator is None:
                raise ConfigError("selfplay.spiral.designed.enabled: true needs the run's sandbox and designer "
                                  "generator; allowed here: false")
            self.designed = DesignedGames(settings, sandbox=sandbox, generator=generator, run_dir=self.run_dir,
                                          seed=seed)

    async def next_set(self, step: int) -> RegenerationResult:
        envs = [EnvSpec(env_id=f"spiral-{step:06d}-{name}", slot=slot, skill=name, source=game_source(name), hint="",
                        class_name=GAMES[name][0], max_turns=self.config.max_turns, generated_step=step)
                for slot, name in enumerate(self.config.games)]
        result = RegenerationResult(envs=envs)
        if self.designed is not None:
            designed, result.rejections, result.attempts = await self.designed.design(step, len(envs))
            envs += designed
            self.baselines.keep_only(lambda game: game in GAMES or game in {env.env_id for env in designed})
        save_set(self.run_dir, step, envs)
        return result

    def step_player(self, player: Any) -> Any:
        """The step's plays: both seats of every game (the orchestrator's ``player`` lends its engine)."""
        from ..plays.two_seat_player import TwoSeatGames

        return TwoSeatGames(self.settings, player)

    def advantages(self, env: EnvSpec, plays: Sequence[Play]) -> list[float | None]:
        """One advantage per play of ``env`` this step (plays in game order, seat 0 first): return
        less its (game, seat) baseline with RAE, the z-score among the step's plays (grpo) or the return;
        with ``drop_zero_advantage`` a play whose advantage is exactly 0 gets None (left out)."""
        returns = [p.episode_return for p in plays]
        figures = self.last_metrics
        for seat in (0, 1):
            mine = [p.episode_return for p in plays if seat_of(p) == seat]
            if mine:
                stem = f"spiral/{env.skill}/seat{seat}"
                figures[f"{stem}/return_mean"] = sum(mine) / len(mine)
                figures[f"{stem}/win_share"] = sum(r > 0 for r in mine) / len(mine)
                figures[f"{stem}/draw_share"] = sum(r == 0 for r in mine) / len(mine)
        if self.config.advantage == "grpo":
            return self._kept(agent_advantages(returns))
        if self.config.advantage == "none":
            return self._kept(list(returns))
        ordered = sorted(range(len(plays)), key=lambda i: plays[i].index)
        game = env.env_id if is_designed(env) else env.skill  # a designed game's baselines are its own
        by_order = self.baselines.advantages(game, [(seat_of(plays[i]), returns[i]) for i in ordered])
        advantages = [0.0] * len(plays)
        for i, advantage in zip(ordered, by_order):
            advantages[i] = advantage
        for seat in (0, 1):
            figures[f"spiral/{env.skill}/seat{seat}/baseline"] = self.baselines.baseline(game, seat)
        return self._kept(advantages)

    def _kept(self, advantages: list[float]) -> list[float | None]:
        if not self.config.drop_zero_advantage:
            return list(advantages)
        return [None if advantage == 0.0 else advantage for advantage in advantages]

    def observe(self, step: int, envs: list[EnvSpec], nohint_returns: dict[str, list[float]]) -> None:
        """A new step's figures start (the plays' figures come with :meth:`advantages`)."""
        self.last_metrics = {}

    def metrics(self) -> dict[str, float]:
        return dict(self.last_metrics)

    def play_sandbox(self) -> None:
        return None  # TextArena's games are installed code, played in-process by the two-seat player

    def state_dict(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, "role_baselines": self.baselines.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state:
            return
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"spiral source state version {state.get('version')!r}, expected {STATE_VERSION}")
        self.baselines.load_state_dict(state["role_baselines"])
