"""BFCL v4 multi-turn: the package's ground-truth trajectories replayed through our harness (tool calls
in Qwen3's syntax, decoded by the package's Qwen FC handler's rules, executed by the package, judged
by its state checker) pass, all 800 of them; a wrong one fails; the package's step limit, its
counting of unknown and undecodable calls and its description note hold."""

from __future__ import annotations

import ast
import asyncio
import importlib
import inspect
import json
from typing import Any, Sequence

import pytest

from spade.eval.bfcl import CATEGORIES, BFCLMultiTurn  # noqa: E402
from spade.eval.chat_interface import Completion  # noqa: E402


def ground_truth_calls(call: str, root_classes: Sequence[str]) -> tuple[str, dict[str, Any]]:
    """A ground-truth call string as (name, keyword arguments): positional arguments are named from
    the package's method signatures (used to replay ground truth through the harness)."""
    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING

    node = ast.parse(call, mode="eval").body
    assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    name = node.func.id
    kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
    if node.args:
        for cls_name in root_classes:
            cls = getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[cls_name]), cls_name)
            if hasattr(cls, name):
                params = [p for p in inspect.signature(getattr(cls, name)).parameters if p != "self"]
                for param, value in zip(params, node.args):
                    kwargs[param] = ast.literal_eval(value)
                break
    return name, kwargs


class Replay:
    """Answers each turn with its ground-truth calls as Qwen3 <tool_call> blocks, then a plain reply."""

    def __init__(self, entry, ground_truth, drop_last=False):
        self.script, self.tools_seen, self.last_messages = [], [], []
        for turn in ground_truth:
            if turn:
                calls = [ground_truth_calls(c, entry["involved_classes"]) for c in turn]
                if drop_last:
                    calls = calls[:-1]
                self.script.append("\n".join(f"<tool_call>\n{json.dumps({'name': n, 'arguments': a})}\n</tool_call>"
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
    assert {k: [d["name"] for d in v] for k, v in entry["missed_function"].items()} == {"3": ["wc", "tail", "cat"]} and "tail(file_name='file3.txt')" in truth[1]
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


def test_missing_function_is_announced_at_its_turn_as_the_packages_prompting_loop_does(items):
    """QwenFCHandler runs bfcl-eval's prompting loop: the withheld functions never join the tool
    list; the holdout turn (empty in the data) gets DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING
    with the withheld docs."""
    from bfcl_eval.constants.default_prompts import DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING

    bench, loaded = items
    item = next(i for i in loaded if i.group == "miss_func")
    entry = item.reference["entry"]
    (turn, docs), = list(entry["missed_function"].items())[:1]
    names = {d["name"] for d in docs}
    replay = Replay(entry, item.reference["ground_truth"])
    asyncio.run(bench.play(item, replay, 0))
    assert not any(names & seen for seen in replay.tools_seen)
    assert entry["question"][int(turn)] == []
    # (Replay answers a turn with one completion of calls and one "Done.", or only "Done." for none.)
    first_step_of_turn = sum(2 if t else 1 for t in item.reference["ground_truth"][:int(turn)])
    assert replay.last_messages[first_step_of_turn] == {
        "role": "user", "content": DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING.format(functions=docs)}


def test_model_text_never_reaches_eval(items, monkeypatch):
    """A call named by an expression, or by a builtin the package's eval would run, is replaced by
    a call to an undefined name: it counts as one failing call, and eval sees only our text."""
    import ast

    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_checker, multi_turn_utils

    from spade.eval import bfcl

    bench, item = _base_item(items)
    seen = []
    real = multi_turn_utils.execute_multi_turn_func_call

    def recording(func_call_list, *args, **kwargs):
        seen.extend(func_call_list)
        return real(func_call_list, *args, **kwargs)

    monkeypatch.setattr(multi_turn_utils, "execute_multi_turn_func_call", recording)
    monkeypatch.setattr(multi_turn_checker, "execute_multi_turn_func_call", recording)
    hostile = Scripted(['<tool_call>\n{"name": "__import__(\'os\').system", "arguments": {"command": "true"}}\n</tool_call>\n'
                        '<tool_call>\n{"name": "open", "arguments": {"file": "/tmp/spade_bfcl_probe", "mode": "w"}}\n</tool_call>\n'
                        '<tool_call>\n{"name": "ls", "arguments": {"a=__import__(\'os\')": 1}}\n</tool_call>'])
    result = asyncio.run(bench.play(item, hostile, 0))
    truth = {c for turn in item.reference["ground_truth"] for c in turn}  # the checker replays these too
    assert seen and set(seen) - truth == {bfcl.REFUSED_CALL}
    assert json.loads(result.answer)[0] == [[bfcl.REFUSED_CALL] * 3]
    assert hostile.seen[1][-1]["content"].startswith("Error during execution: name '_spade_refused_call'")
    assert not result.correct
    for call in seen:
        assert isinstance(ast.parse(call, mode="eval").body, ast.Call)


def _record(item, sample):
    from spade.eval.types import ItemRecord

    return ItemRecord(item.item_id, item.group, (sample,), 0)


# ---------------------------------------------------------------- the package's own limits and counting


class Always:
    """Calls ``ls`` at every step, forever (a model that never stops calling functions)."""

    def __init__(self, block='<tool_call>\n{"name": "ls", "arguments": {}}\n</tool_call>'):
        self.block, self.steps = block, 0

    async def complete(self, messages, sampling, seed, tools=None):
        self.steps += 1
        return Completion(self.block, "stop", 1, 1, 0)


def _base_item(items):
    bench, loaded = items
    return bench, next(i for i in loaded if i.group == "base" and "GorillaFileSystem" in
                       i.reference["entry"]["involved_classes"])


def test_a_model_that_keeps_calling_is_forced_to_quit_after_the_packages_step_limit(items):
    """bfcl-eval's runner counts executed steps per turn and quits the whole entry once the count
    passes MAXIMUM_STEP_LIMIT (so the limit + 1 steps run); the checker fails a forced quit."""
    from bfcl_eval.constants import default_prompts

    bench, item = _base_item(items)
    model = Always()
    result = asyncio.run(bench.play(item, model, 0))
    assert model.steps == default_prompts.MAXIMUM_STEP_LIMIT + 1  # one turn only: the entry stopped there
    assert not result.correct and result.detail["error_type"] == "multi_turn:force_terminated"


def test_the_step_limit_is_read_from_the_package(items, monkeypatch):
    from bfcl_eval.constants import default_prompts

    monkeypatch.setattr(default_prompts, "MAXIMUM_STEP_LIMIT", 3)
    bench, item = _base_item(items)
    model = Always()
    asyncio.run(bench.play(item, model, 0))
    assert model.steps == 4


class Scripted:
    def __init__(self, replies):
        self.replies, self.seen, self.tools = list(replies), [], []

    async def complete(self, messages, sampling, seed, tools=None):
        self.seen.append([dict(m) for m in messages])
        self.tools.append(list(tools or []))
        return Completion(self.replies.pop(0) if self.replies else "Done.", "stop", 1, 1, 0)


def test_an_unknown_function_is_executed_and_counted_as_the_package_does(items):
    """The package's runner executes whatever the decoder returns: an unknown name gives an
    execution error fed back to the model, and the turn goes on (it ends only on a step with no
    call)."""
    bench, item = _base_item(items)
    model = Scripted(['<tool_call>\n{"name": "no_such_function", "arguments": {"x": 1}}\n</tool_call>'])
    result = asyncio.run(bench.play(item, model, 0))
    second_step = model.seen[1]
    assert second_step[-1]["role"] == "tool"
    assert second_step[-1]["content"] == "Error during execution: name 'no_such_function' is not defined"
    assert json.loads(result.answer)[0] == [["no_such_function(x=1)"]]


def test_an_unparseable_call_is_dropped_as_the_packages_qwen_decoder_drops_it(items):
    """QwenFCHandler (the handle the released config evaluates every size with) drops a
    <tool_call> block that is not JSON and keeps the other calls of the step; a step whose only
    block is unparseable has no call, so the turn ends there."""
    bench, item = _base_item(items)
    model = Scripted(['<tool_call>\n{"name": "ls", "arguments": {\n</tool_call>\n'
                      '<tool_call>\n{"name": "pwd", "arguments": {}}\n</tool_call>',
                      '<tool_call>\n{not json}\n</tool_call>'])
    result = asyncio.run(bench.play(item, model, 0))
    first_turn = json.loads(result.answer)[0]
    assert first_turn == [["pwd()"]]
    assert len(model.seen) >= 3 and model.seen[2][-1]["role"] == "user"  # turn 0 ended after step 2


def test_a_call_without_arguments_fails_the_whole_step_as_the_package_decoder_does(items):
    """QwenFCHandler.decode_execute reads item["arguments"]: a block without it raises, the
    step is not decoded (its other calls are lost too) and the turn ends."""
    bench, item = _base_item(items)
    model = Scripted(['<tool_call>\n{"name": "pwd", "arguments": {}}\n</tool_call>\n'
                      '<tool_call>\n{"name": "ls"}\n</tool_call>'])
    result = asyncio.run(bench.play(item, model, 0))
    assert json.loads(result.answer)[0] == []
    assert model.seen[1][-1]["role"] == "user"


def test_function_descriptions_carry_the_packages_python_syntax_note(items):
    from bfcl_eval.utils import _get_language_specific_hint

    bench, loaded = items
    note = _get_language_specific_hint("multi_turn_base")
    assert "Python 3 syntax" in note
    model = Scripted([])
    asyncio.run(bench.play(loaded[0], model, 0))
    tools = model.tools[0]
    assert tools and all(t["function"]["description"].endswith(note) for t in tools)
