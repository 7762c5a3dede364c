"""The Fixed-env GRPO baseline's source (``selfplay.env_source: fixed_pool``): a directory of
environments written once, played instead of designed ones.

``FixedPool.next_set`` admits every ``*.py`` of ``fixed_env_dir`` (sorted) through the same
admission as designed environments, takes hints from ``NAME.hint.txt`` when present, and gives skills
from the curriculum by slot, as for designed sets. No designer calls, no designer samples.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Awaitable, Callable

from ..designer.skills import slot_skills
from ..envs.protocol import ErrorKind, Sandbox, Stage
from .designer_round import EnvSpec, RegenerationResult, admit_candidate, save_set, tool_report_of, write_rejection
from .settings import SelfPlaySettings

Screen = Callable[[str, list[dict[str, Any]]], Awaitable[bool | None]]


class FixedPool:
    """An :class:`~spade.selfplay.env_source.EnvSource` over a directory of environment files."""

    def __init__(self, settings: SelfPlaySettings, *, sandbox: Sandbox, run_dir: Path, seed: int,
                 screen: Screen | None = None):
        assert settings.fixed_env_dir is not None
        self.settings = settings
        self.sandbox = sandbox
        self.run_dir = Path(run_dir)
        self.seed = seed
        self.directory = Path(settings.fixed_env_dir)
        self.screen = screen

    async def next_set(self, step: int) -> RegenerationResult:
        s = self.settings
        files = sorted(self.directory.glob("*.py"))
        skills = slot_skills(s.skills.active(s.domain, step // s.k), max(1, len(files)))
        result = RegenerationResult()
        for slot, path in enumerate(files):
            result.attempts += 1
            text = path.read_text()
            verdict = await admit_candidate(self.sandbox, s, text,
                                            screen=self.screen if s.domain == "tool_use" else None)
            record = {"step": step, "slot": slot, "attempt": 0, "skill": skills[slot].name, "document": str(path)}
            if verdict is None or not verdict.admitted:
                error = None if verdict is None else verdict.error
                result.rejections.append(write_rejection(
                    self.run_dir, record, ErrorKind.CRASHED if error is None else error.kind,
                    Stage.SERVICE if error is None else error.stage,
                    "sandbox failure" if error is None else error.message, text))
                continue
            hint_path = path.with_name(path.stem + ".hint.txt")
            hint = hint_path.read_text().strip() if hint_path.is_file() else ""
            result.envs.append(EnvSpec(env_id=f"fixed-{path.stem}", slot=slot, skill=skills[slot].name,
                                       source=verdict.code, hint=hint, class_name=verdict.class_name or "",
                                       max_turns=verdict.max_turns, generated_step=step, document=str(path),
                                       tool_report=tool_report_of(verdict)))
        save_set(self.run_dir, step, result.envs)
        return result

    def observe(self, step: int, envs: list[EnvSpec], nohint_returns: dict[str, list[float]]) -> None:
        pass

    def play_sandbox(self) -> Sandbox | None:
        return None

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass
