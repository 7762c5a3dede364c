"""``selfplay.plays.released_loader_names`` (issue 39): a designed game that uses ``deque`` and
``math`` without importing them, as the released loader allowed (it pre-binds them), is rejected at
load by default and admitted and played with the switch on (real sandbox, real orchestrator; the
designer role is the scripted test double of test_orchestrator)."""

from __future__ import annotations

import pytest

from spade.selfplay.plays.play_rules import PlayRules
from spade.selfplay.step import Step
from test_orchestrator import ScriptedDesigner, engine, make, tokenizer  # noqa: F401  (fixtures)

UNIMPORTED = '''
class QueueEnv:
    def __init__(self, max_turns=3):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.queue = deque([int(math.sqrt(16)), 2, 3])
        self.turn = 0
        return f"The queue holds {len(self.queue)} numbers; name the first.", {}

    def step(self, action):
        self.turn += 1
        right = str(self.queue[0]) in action
        return ("right" if right else "wrong"), (1.0 if right else 0.0), right or self.turn >= self.max_turns, False, {}
'''


@pytest.mark.parametrize("switch", [False, True])
def test_designed_game_without_imports(sandbox, engine, tokenizer, tmp_path, switch):  # noqa: F811
    designer = ScriptedDesigner(engine, tokenizer, [UNIMPORTED])
    orch = make(sandbox, designer, tokenizer, tmp_path, None, plays=PlayRules(released_loader_names=switch))
    out = sandbox.run(orch.run_step(Step(0)), timeout=180)
    metrics = out.metrics
    if switch:
        assert metrics["env/admitted"] == 2 and metrics["agent/episodes"] == 2 * 2
    else:
        assert metrics["env/admitted"] == 0 and metrics["env/rejected"] == 4
        rejected = sorted((tmp_path / "rejected").rglob("*.json"))
        assert rejected and "deque" in rejected[0].read_text()
