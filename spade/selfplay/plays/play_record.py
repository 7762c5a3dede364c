"""One scored play of the self-play step, and its JSON form (carried groups keep their finished plays)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ...envs.runner import Turn
from ...rl.samples import Trajectory


@dataclass
class Play:
    """One scored play. ``trajectory`` is the conversation's sequence (None when nothing was generated);
    with ``selfplay.plays.sample_form: per_turn`` it is the last turn's, and ``turn_samples`` holds
    every turn's prompt + completion (:mod:`.turn_samples`)."""

    env_id: str
    hinted: bool
    index: int
    episode_return: float
    turns: int
    end_reason: str
    trajectory: Trajectory | None
    seed: int | None = None  # the reset seed
    opening: str = ""  # the first user message, as the agent saw it
    turn_log: tuple[Turn, ...] = ()
    turn_samples: tuple[Trajectory, ...] = ()

    @property
    def training_trajectories(self) -> tuple[Trajectory, ...]:
        """What the play trains on: its turn samples (per-turn form), else its one sequence."""
        if self.turn_samples:
            return self.turn_samples
        return () if self.trajectory is None else (self.trajectory,)


def turn_to_json(turn: Turn) -> dict[str, Any]:
    data = asdict(turn)
    data["tool_calls"] = list(turn.tool_calls)
    return data


def turn_from_json(data: dict[str, Any]) -> Turn:
    return Turn(data["response"], data["action"], data["observation"], float(data["reward"]),
                bool(data["terminated"]), bool(data["truncated"]), tuple(data.get("tool_calls", ())))


def play_to_json(play: Play) -> dict[str, Any]:
    """A finished :class:`Play` as JSON (its trajectory with ``Trajectory.to_json``)."""
    return {"env_id": play.env_id, "hinted": play.hinted, "index": play.index,
            "episode_return": play.episode_return, "turns": play.turns, "end_reason": play.end_reason,
            "trajectory": None if play.trajectory is None else play.trajectory.to_json(),
            "seed": play.seed, "opening": play.opening, "turn_log": [turn_to_json(t) for t in play.turn_log]}


def play_from_json(data: dict[str, Any], logprob_temperature: float) -> Play:
    trajectory = data["trajectory"]
    return Play(data["env_id"], bool(data["hinted"]), int(data["index"]), float(data["episode_return"]),
                int(data["turns"]), data["end_reason"],
                None if trajectory is None else Trajectory.from_json(
                    trajectory, default_logprob_temperature=logprob_temperature),
                seed=data["seed"], opening=data["opening"],
                turn_log=tuple(turn_from_json(t) for t in data["turn_log"]))
