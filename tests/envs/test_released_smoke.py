"""``selfplay.admission.smoke_test: released`` (issue 39): the released ``validate_game``
(``core/utils/game_files.py:11-23`` with the loader's check it runs) against the paper's smoke test,
on games built to tell them apart, in the real sandbox."""

from __future__ import annotations

import pytest

from spade.config import ConfigError, from_mapping
from spade.envs.admission import admit
from spade.envs.protocol import ErrorKind, Stage
from spade.envs.released_smoke import released_smoke_test
from spade.selfplay.settings import SelfPlaySettings

GAME = '''
import time


class GameEnv:
    def __init__(self, max_turns=5):
        self.max_turns = max_turns

    def reset(self, seed=None):
        RESET
        return "Answer in a box.", {}

    def step(self, action):
        STEP
        return "go on", 0.0, False, False, {}
'''


def game(reset: str = "pass", step: str = "pass") -> str:
    return GAME.replace("RESET", reset).replace("STEP", step)


# raises on an unboxed action and on an unseeded reset: only the released, unchecked probes see that
RAISES_UNBOXED = game(reset='if seed is None:\n            raise ValueError("no seed")',
                      step='if not action.startswith("\\\\boxed{"):\n            raise ValueError("unboxed")')
PAYS_50_FOR_42 = game(step='if action == "\\\\boxed{42}":\n            return "wow", 50.0, True, False, {}')
RAISES_ON_1 = game(step='if action == "1":\n            raise ValueError("unboxed")')
HANGS_ON_TEST = game(step='while action == "test":\n            pass')
SLOW = game(step="time.sleep(0.2)")


def _admit(sandbox, source: str, smoke_test: str):
    return sandbox.run(admit(sandbox.service, source, smoke_test=smoke_test, determinism=False, probes=None),
                       timeout=60)


def test_key_default_and_values():
    assert SelfPlaySettings().admission.smoke_test == "paper"
    assert from_mapping(SelfPlaySettings, {"admission": {"smoke_test": "released"}},
                        where="selfplay").admission.smoke_test == "released"
    with pytest.raises(ConfigError, match=r"selfplay\.admission\.smoke_test.*paper, released"):
        from_mapping(SelfPlaySettings, {"admission": {"smoke_test": "strict"}}, where="selfplay")


def test_unchecked_probe_faults_are_ignored_as_released(sandbox):
    paper = _admit(sandbox, RAISES_UNBOXED, "paper")  # its "hello" raises
    assert not paper.admitted and paper.error.kind is ErrorKind.STEP_ERROR and paper.error.stage is Stage.SMOKE
    for source in (RAISES_UNBOXED, RAISES_ON_1):  # the unseeded reset raises; the step "1" raises
        released = _admit(sandbox, source, "released")
        assert released.admitted and released.first_observation == "Answer in a box."
    # admission's later stages go on with the first instance
    released = sandbox.run(admit(sandbox.service, RAISES_ON_1, smoke_test="released", probes=None), timeout=60)
    assert released.admitted and "determinism" in released.timings_ms


def test_loader_actions_are_checked(sandbox):
    assert _admit(sandbox, PAYS_50_FOR_42, "paper").admitted  # never steps \boxed{42}
    released = _admit(sandbox, PAYS_50_FOR_42, "released")
    assert not released.admitted and released.error.kind is ErrorKind.BAD_RETURN
    assert "returned reward 50.0, outside [-10, 10]" in released.error.message


def test_a_probe_that_hangs_rejects(sandbox):
    assert _admit(sandbox, HANGS_ON_TEST, "paper").admitted  # never steps "test"
    released = _admit(sandbox, HANGS_ON_TEST, "released")  # the sandbox's step timeout (3 s here)
    assert not released.admitted and released.error.kind is ErrorKind.TIMEOUT and released.error.stage is Stage.SMOKE


def test_whole_test_bound(sandbox):
    """Six steps of 0.2 s: within a 5 s bound, not within a 0.5 s one (released: 60 s)."""

    async def run(bound: float):
        env = await sandbox.service.open(SLOW)
        try:
            return await released_smoke_test(env, lambda: sandbox.service.open(SLOW), bound_s=bound)
        finally:
            await env.close()

    assert sandbox.run(run(5.0), timeout=60) == "Answer in a box."
    from spade.envs.protocol import EnvFault

    with pytest.raises(EnvFault) as caught:
        sandbox.run(run(0.5), timeout=60)
    assert caught.value.error.kind is ErrorKind.TIMEOUT and "within 0.5 s" in caught.value.error.message
