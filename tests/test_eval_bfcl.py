"""BFCL v4 multi-turn: the package's ground-truth trajectories replayed through our harness (tool calls
in the model's syntax, executed by the package, judged by its state checker) pass, all 800 of them;
a wrong one fails."""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("bfcl_eval")

from spade.eval.bfcl import CATEGORIES, BFCLMultiTurn, ground_truth_calls  # noqa: E402
from spade.eval.runner import Completion  # noqa: E402


class Replay:
    """Answers each turn with its ground-truth calls as <tool_call> blocks, then a plain reply."""

    def __init__(self, entry, ground_truth, drop_last=False):
        self.script, self.tools_seen, self.last_messages = [], [], []
        for turn in ground_truth:
            if turn:
                calls = [ground_truth_calls(c, entry["involved_classes"]) for c in turn]
                if drop_last:
                    calls = calls[:-1]
                self.script.append("".join(f"<tool_call>{json.dumps({'name': n, 'arguments': a})}</tool_call>"
                                           for n, a in calls))
            self.script.append("Done.")

    async def complete(self, messages, sampling, seed, tools=None):
        self.tools_seen.append({t["function"]["name"] for t in tools or []})
        self.last_messages.append(dict(messages[-1]))
        return Completion(self.script.pop(0), "stop", 1, 1, 0)


@pytest.fixture(scope="module")
def items():
    bench = BFCLMultiTurn()
    return bench, bench.load(seed=0, limit=15)


def test_every_category_loads(items):
    bench, loaded = items
    assert {i.group for i in loaded} == set(CATEGORIES) and len(loaded) == 60


def test_ground_truth_replay_scores_100_percent(items):
    bench, loaded = items
    results = [asyncio.run(bench.play(i, Replay(i.reference["entry"], i.reference["ground_truth"]), 0)) for i in loaded]
    assert all(r.correct for r in results), [r.detail for r in results if not r.correct]
    summary = bench.summarize([_record(i, r) for i, r in zip(loaded, results)])
    assert summary.score == 100.0 and summary.groups == {c: 100.0 for c in CATEGORIES}


def test_every_ground_truth_trajectory_of_the_package_passes():
    """All 800 entries of the four categories (about 4 s)."""
    bench = BFCLMultiTurn()
    loaded = bench.load(seed=0)
    assert len(loaded) == 800
    failed = [(i.item_id, r.detail) for i in loaded
              for r in [asyncio.run(bench.play(i, Replay(i.reference["entry"], i.reference["ground_truth"]), 0))]
              if not r.correct]
    assert failed == []


def test_a_withheld_function_called_early_is_executed_as_the_package_runner_does():
    """multi_turn_miss_func_49 withholds tail, wc and cat until turn 3, yet its ground truth calls
    tail at turn 1. The package's runner executes any function of the involved classes whether
    offered or not, so the trajectory passes its checker; so it must pass ours."""
    bench = BFCLMultiTurn(categories=("miss_func",))
    item = next(i for i in bench.load(seed=0) if i.item_id == "multi_turn_miss_func_49")
    entry, truth = item.reference["entry"], item.reference["ground_truth"]
    assert entry["missed_function"] == {"3": ["wc", "tail", "cat"]} and "tail(file_name='file3.txt')" in truth[1]
    replay = Replay(entry, truth)
    result = asyncio.run(bench.play(item, replay, 0))
    assert "tail" not in replay.tools_seen[1]  # turn 1's first step: tail is not offered ...
    assert result.correct and "tail(file_name='file3.txt')" in json.loads(result.answer)[1][0]  # ... but runs


def test_wrong_trajectory_fails(items):
    bench, loaded = items
    item = next(i for i in loaded if i.group == "base")
    wrong = asyncio.run(bench.play(item, Replay(item.reference["entry"], item.reference["ground_truth"],
                                                drop_last=True), 0))
    assert not wrong.correct and wrong.detail["error"]


def test_missing_function_is_withheld_until_its_turn(items):
    bench, loaded = items
    item = next(i for i in loaded if i.group == "miss_func")
    entry = item.reference["entry"]
    (turn, names), = [(int(k), set(v)) for k, v in entry["missed_function"].items()][:1]
    replay = Replay(entry, item.reference["ground_truth"])
    asyncio.run(bench.play(item, replay, 0))
    assert not names & replay.tools_seen[0]
    assert names <= replay.tools_seen[-1]
    # The holdout turn has no user message of its own: the package's runner sends this one. (Replay
    # answers a turn with one completion of calls and one "Done.", or only "Done." for no calls.)
    from bfcl_eval.constants.default_prompts import DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC

    assert entry["question"][turn] == []
    first_step_of_turn = sum(2 if t else 1 for t in item.reference["ground_truth"][:turn])
    assert replay.last_messages[first_step_of_turn] == {"role": "user",
                                                        "content": DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC}
    assert names <= replay.tools_seen[first_step_of_turn] and not names & replay.tools_seen[first_step_of_turn - 1]


def test_model_text_never_reaches_eval(items):
    bench, loaded = items
    item = loaded[0]

    class Hostile:
        async def complete(self, messages, sampling, seed, tools=None):
            return Completion('<tool_call>{"name": "__import__(\'os\').system", "arguments": {}}</tool_call>',
                              "stop", 1, 1, 0)

    result = asyncio.run(bench.play(item, Hostile(), 0))
    assert not result.correct and json.loads(result.answer) == [[] for _ in item.reference["ground_truth"]]


def _record(item, sample):
    from spade.eval.types import ItemRecord

    return ItemRecord(item.item_id, item.group, (sample,), 0)
