"""The hand-written tool environments of examples/envs/tool_use: SPEC 5's structure, and every
scripted solution path solves every instruction through the real sandbox for several seeds."""

from __future__ import annotations

import pytest

from conftest import make_harness
from spade.envs.tool_use.local import example_paths, is_tool_source, load_trusted, scripted_calls

PATHS = example_paths()


@pytest.fixture(scope="module")
def harness():
    h = make_harness()
    yield h
    h.close()


def test_five_examples_in_different_domains():
    assert len(PATHS) >= 5
    assert len({path.stem for path in PATHS}) == len(PATHS)


@pytest.mark.parametrize("path", PATHS, ids=[p.stem for p in PATHS])
def test_structure(path):
    source = path.read_text()
    assert is_tool_source(source)
    env = load_trusted(source, str(path))()
    for seed in range(3):
        env.reset(seed=seed)
        tools = env.get_tools()
        assert 3 <= len(tools) <= 8
        params = [t["function"]["parameters"] for t in tools]
        assert any("enum" in spec for p in params for spec in p["properties"].values())
        assert any(p.get("required") for p in params)
        assert 3 <= len(env._user_messages) == len(env._message_criteria) <= 5
        assert not any(criterion(env._state) for criterion in env._message_criteria), "true at reset"
        used = {name for name, _ in env.solution_calls()}
        assert set(env._tools) - used, "no distractor tool"
        # solution(): the calls in order, then the final answer
        text = env.solution()
        assert text.endswith("<answer>done</answer>")
        position = 0
        for name, _ in env.solution_calls():
            position = text.index(f"{name}(", position) + 1  # raises when out of order


@pytest.mark.parametrize("path", PATHS, ids=[p.stem for p in PATHS])
def test_scripted_solution_in_the_sandbox(harness, path):
    source = path.read_text()
    for seed in (0, 1, 7):
        env = harness.run(harness.service.open(source, max_turns=20))
        try:
            assert env.tool_use
            first = harness.run(env.reset(seed=seed))
            assert first.observation
            local = load_trusted(source)()
            local.reset(seed=seed)
            instructions = local._user_messages
            done = 0
            for name, arguments in scripted_calls(source, seed):
                result = harness.run(env.call_tool(name, arguments))
                assert result.returncode == 0, (name, result.output)
                done += result.advanced
                # a completed request: the next one (or the end) closes the result, once
                if result.advanced and done < len(instructions):
                    notice = f"\n\n[STEP {done} COMPLETE — NEW INSTRUCTION] {instructions[done]}"
                elif result.advanced:
                    notice = "\n\n[ALL STEPS COMPLETE] Submit <answer>done</answer>."
                else:
                    notice = None
                if notice:
                    assert result.output.endswith(notice) and result.output.count("\n\n[") == 1
                else:
                    assert "[STEP" not in result.output and "[ALL STEPS" not in result.output
            assert result.progress.all_done and done == result.progress.total == len(instructions)
            final = harness.run(env.step("<answer>done</answer>"))
            assert (final.reward, final.terminated) == (1.0, True)
        finally:
            harness.run(env.close())


@pytest.mark.parametrize("path", PATHS, ids=[p.stem for p in PATHS])
def test_answer_before_the_work_is_not_accepted(harness, path):
    env = harness.run(harness.service.open(path.read_text()))
    try:
        harness.run(env.reset(seed=2))
        result = harness.run(env.step("<answer>done</answer>"))
        assert (result.reward, result.terminated) == (0.0, False)
    finally:
        harness.run(env.close())
