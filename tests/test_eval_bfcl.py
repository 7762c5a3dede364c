"""BFCL v4 multi-turn: the package's ground-truth trajectories replayed through our harness (tool calls
in the model's syntax, executed by the package, judged by its state checker) pass; a wrong one fails."""

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
        self.script, self.tools_seen = [], []
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
