"""What a run keeps of its plays, for ``spade analyze`` and ``spade explore``.

One file per step, ``RUN/trajectories/step_NNNNNN.jsonl``, rewritten whole when the step runs
(so a resumed run that replays a step leaves exactly one copy), one JSON object per line:

* ``{"kind": "env_returns", "step", "env_id", "skill", "generated_step", "nohint_returns": [...],
  "hint_returns": [...]}``: the return of every play of one environment in this step (hinted
  plays only at its regeneration step). Cheap, so always complete.
* ``{"kind": "episode", "step", "env_id", "skill", "arm": "nohint" | "hint", "index", "seed",
  "opening", "turns": [{"action", "observation", "reward", "terminated", "truncated"}], "return",
  "end_reason"}``: a bounded sample, the first ``keep_per_arm`` plays (by index) of each arm of
  each environment. ``opening`` is the first observation as the agent saw it (the hinted arm's
  carries the hint); ``turns`` hold the parsed action given to ``step()``, not the raw response.

At 24 environments, 4 kept plays per arm and 25 turns of a few hundred characters, a step's file
is a few MB at most; ``keep_per_arm: 0`` keeps only the returns.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable

from ..sources.designer_source import EnvSpec
from .play_record import Play

DIRECTORY = "trajectories"


def step_file(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / DIRECTORY / f"step_{step:06d}.jsonl"


class TrajectoryLog:
    def __init__(self, run_dir: Path, keep_per_arm: int):
        self.run_dir = Path(run_dir)
        self.keep_per_arm = keep_per_arm

    def write_step(self, step: int, envs: Iterable[EnvSpec], plays: list[Play]) -> Path:
        lines: list[dict[str, Any]] = []
        for env in envs:
            mine = sorted((p for p in plays if p.env_id == env.env_id), key=lambda p: (p.hinted, p.index))
            lines.append({"kind": "env_returns", "step": step, "env_id": env.env_id, "skill": env.skill,
                          "generated_step": env.generated_step,
                          "nohint_returns": [p.episode_return for p in mine if not p.hinted],
                          "hint_returns": [p.episode_return for p in mine if p.hinted]})
            for hinted in (False, True):
                arm = [p for p in mine if p.hinted == hinted][: self.keep_per_arm]
                lines.extend(_episode(step, env, play) for play in arm)
        path = step_file(self.run_dir, step)
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(".jsonl.tmp")
        temporary.write_text("".join(json.dumps(line) + "\n" for line in lines))
        os.replace(temporary, path)
        return path

    def drop_after(self, step: int | None) -> None:
        """Remove the files of steps after ``step`` (None: all), written by a run that went on past
        the checkpoint being resumed."""
        directory = self.run_dir / DIRECTORY
        if not directory.is_dir():
            return
        for path in directory.glob("step_*.jsonl"):
            number = int(path.stem.removeprefix("step_"))
            if step is None or number > step:
                path.unlink()


def _episode(step: int, env: EnvSpec, play: Play) -> dict[str, Any]:
    return {"kind": "episode", "step": step, "env_id": env.env_id, "skill": env.skill,
            "arm": "hint" if play.hinted else "nohint", "index": play.index, "seed": play.seed,
            "opening": play.opening, "return": play.episode_return, "end_reason": play.end_reason,
            "turns": [{"action": t.action, "observation": t.observation, "reward": t.reward,
                       "terminated": t.terminated, "truncated": t.truncated} for t in play.turn_log]}
