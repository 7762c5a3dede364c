"""LiveCodeBench: programs judged in the real sandbox the way LiveCodeBench's own harness judges them.

The expected verdicts are those of ``lcb_runner/evaluation/testing_util.py`` (LiveCodeBench commit
28fef95, the commit the released SPADE code pins): each case below was run through that file's
``run_test`` in a worker process, as its ``check_correctness`` runs it, and its verdict is written
next to the case.
"""

from __future__ import annotations

import asyncio
import base64
import json
import pickle
import zlib
from pathlib import Path

import pytest

from spade.envs.protocol import EnvError, ErrorKind, InfrastructureFault, Stage
from spade.envs.sandbox.client import SandboxService
from spade.eval.code_judge import ProgramTest, judge, judge_config
from spade.eval.livecodebench import LiveCodeBench, decode_tests
from spade.eval.types import EvalItem, ItemRecord, SampleRecord

FIXTURES = Path(__file__).parents[1] / "fixtures" / "eval"


def test_release_encoding_of_private_tests_decodes_without_objects():
    tests = [{"input": "1\n", "output": "1\n", "testtype": "stdin"}]
    encoded = base64.b64encode(zlib.compress(pickle.dumps(json.dumps(tests)))).decode()
    assert decode_tests(encoded) == tests
    hostile = base64.b64encode(zlib.compress(pickle.dumps(Path("/")))).decode()
    with pytest.raises(pickle.UnpicklingError):
        decode_tests(hostile)


@pytest.fixture(scope="module")
def judge_service():
    loop = asyncio.new_event_loop()
    service = loop.run_until_complete(SandboxService.start(judge_config(time_limit_s=1.5, memory_limit_mb=512)))
    yield loop, service
    loop.run_until_complete(service.close())
    loop.close()


def _judge(judge_service, program, tests, func=None, service=None):
    loop, real = judge_service
    return loop.run_until_complete(asyncio.wait_for(judge(service or real, program, tests, func), 120))


def _stdin(program, inputs, outputs):
    return program, [ProgramTest(i, o) for i, o in zip(inputs, outputs)]


def _call(program, inputs, outputs):
    return program, [ProgramTest(i, o, "functional") for i, o in zip(inputs, outputs)]


# (program, tests, func_name, LiveCodeBench's verdict)
LCB_CASES = {
    # the header: typing and the other star imports need no import
    "typing_in_signature": (*_call("class Solution:\n    def f(self, nums: List[int]) -> int:\n"
                                   "        return sum(nums)\n", ["[1, 2, 3]"], ["6"]), "f", True),
    "header_names_stdin": (*_stdin("def g(x: List[int]) -> int:\n    return sum(x)\n"
                                   "print(g(list(map(int, input().split()))), gcd(4, 6))\n", ["1 2 3\n"], ["6 2\n"]),
                           None, True),
    "big_integer_text": (*_stdin("print(len(str(10 ** 5000)))\n", ["\n"], ["5001\n"]), None, True),
    # stdin: read() gives the whole input every time; buffer.read() all bytes
    "stdin_read_twice": (*_stdin("import sys\na = sys.stdin.read()\nb = sys.stdin.read()\n"
                                 "print(len(a.split()) + len(b.split()))\n", ["1\n2\n"], ["4\n"]), None, True),
    "stdin_buffer_read": (*_stdin("import sys\nprint(sum(map(int, sys.stdin.buffer.read().split())))\n",
                                  ["1 2\n3\n"], ["6\n"]), None, True),
    # ... buffer.readline() the first line every time; no iteration over sys.stdin
    "stdin_buffer_readline_twice": (*_stdin("import sys\na = int(sys.stdin.buffer.readline())\n"
                                            "b = int(sys.stdin.buffer.readline())\nprint(a + b)\n",
                                            ["1\n2\n"], ["3\n"]), None, False),
    "stdin_iteration": (*_stdin("import sys\nprint(sum(int(l) for l in sys.stdin))\n", ["1\n2\n"], ["3\n"]),
                        None, False),
    "from_sys_import_stdin": (*_stdin("from sys import stdin\na = int(stdin.readline())\n"
                                      "b = int(stdin.readline())\nprint(a + b)\n", ["1\n2\n"], ["3\n"]), None, True),
    "input_alias_readline": (*_stdin("import sys\ninput = sys.stdin.readline\nprint(int(input()) + int(input()))\n",
                                     ["1\n2\n"], ["3\n"]), None, True),
    "main_in_a_thread": (*_stdin("import threading\ndef main():\n    print(int(input()) + 1)\n"
                                 "threading.stack_size(1 << 26)\nt = threading.Thread(target=main)\nt.start()\n"
                                 "t.join()\n", ["1\n"], ["2\n"]), None, True),
    "main_guard": (*_stdin("def main():\n    print(int(input()) * 2)\nif __name__ == \"__main__\":\n    main()\n",
                           ["2\n"], ["4\n"]), None, True),
    # stdout is a StringIO: write works, buffer does not
    "stdout_write": (*_stdin("import sys\nsys.stdout.write('6\\n')\n", ["1\n"], ["6\n"]), None, True),
    "stdout_buffer_write": (*_stdin("import sys\nsys.stdout.buffer.write(b'6\\n')\n", ["1\n"], ["6\n"]),
                            None, False),
    # exit() and sys.exit() end a stdin program with its output so far; quit is None
    "exit_mid_program": (*_stdin("print(1)\nexit()\nprint(2)\n", ["\n"], ["1\n"]), None, True),
    "exit_with_status": (*_stdin("print(1)\nexit(1)\n", ["\n"], ["1\n"]), None, True),
    "exit_in_function": (*_stdin("def main():\n    print(int(input()))\n    exit()\nmain()\nprint(9)\n",
                                 ["5\n"], ["5\n"]), None, True),
    "sys_exit_mid_program": (*_stdin("import sys\nprint(1)\nsys.exit(0)\nprint(2)\n", ["\n"], ["1\n"]), None, True),
    "quit_mid_program": (*_stdin("print(1)\nquit()\n", ["\n"], ["1\n"]), None, False),
    "exit_in_call_based": (*_call("class Solution:\n    def f(self, x):\n        exit()\n", ["1"], ["1"]), "f", False),
    # statements become a function's body: a top-level 'global' name is not a module global
    "top_level_global": (*_stdin("cnt = 0\ndef inc():\n    global cnt\n    cnt += 1\ninc()\nprint(cnt)\n",
                                 ["\n"], ["1\n"]), None, False),
    # output comparison: stripped lines, then Decimal per token
    "close_float_is_wrong": (*_stdin("print('0.1000001')\n", ["\n"], ["0.1\n"]), None, False),
    "one_point_zero_equals_one": (*_stdin("print('1.0')\n", ["\n"], ["1\n"]), None, True),
    "exponent_form": (*_stdin("print('1e-1')\n", ["\n"], ["0.1\n"]), None, True),
    "surrounding_blank_lines_and_spaces": (*_stdin("print()\nprint('  1 2   ')\nprint()\n", ["\n"], ["1 2\n"]),
                                           None, True),
    "blank_line_inside": (*_stdin("print(1)\nprint()\nprint(2)\n", ["\n"], ["1\n2\n"]), None, False),
    "case_matters": (*_stdin("print('yes')\n", ["\n"], ["Yes\n"]), None, False),
    # call-based: == after JSON decoding; a top-level tuple counts as a list, a nested one does not
    "call_one_point_zero": (*_call("class Solution:\n    def f(self, x):\n        return 1.0\n", ["1"], ["1"]),
                            "f", True),
    "call_close_float": (*_call("class Solution:\n    def f(self, x):\n        return 0.1000001\n", ["1"], ["0.1"]),
                         "f", False),
    "call_tuple": (*_call("class Solution:\n    def f(self, x):\n        return (x, 2)\n", ["1"], ["[1, 2]"]),
                   "f", True),
    "call_nested_tuple": (*_call("class Solution:\n    def f(self, x):\n        return [(x, 2)]\n", ["1"],
                                 ["[[1, 2]]"]), "f", False),
    "call_two_arguments": (*_call("class Solution:\n    def f(self, a, b):\n        return a + b\n", ["1\n2", "[1]\n[2]"],
                                  ["3", "[1, 2]"]), "f", True),
    "second_test_fails": (*_stdin("print(int(input()) * 2)\n", ["1\n", "2\n"], ["2\n", "5\n"]), None, False),
}


@pytest.mark.parametrize("case", sorted(LCB_CASES))
def test_verdicts_match_livecodebench(judge_service, case):
    program, tests, func, expected = LCB_CASES[case]
    verdict = _judge(judge_service, program, tests, func)
    assert verdict.passed is expected, (verdict.status, verdict.message)
    assert not verdict.infrastructure


def test_stdio_comparison_edges():
    from spade.eval.code_judge import stdio_outputs_match

    assert stdio_outputs_match("1 2\n", "\n 1 2 \n\n")
    assert not stdio_outputs_match("sNaN", "1") and not stdio_outputs_match("1", "sNaN")
    assert not stdio_outputs_match("nan", "NaN")  # Decimal NaNs are never equal; the texts differ


def test_failure_kinds(judge_service):
    wrong = _judge(judge_service, *_stdin("print(int(input()) * 2)\n", ["1\n", "2\n"], ["2\n", "5\n"]))
    assert (wrong.status, wrong.tests_run, wrong.detail["failed_test"]) == ("wrong_answer", 2, 1)
    crash = _judge(judge_service, *_stdin("print(1 / 0)\n", ["\n"], ["1\n"]))
    assert crash.status == "runtime_error" and "ZeroDivisionError" in crash.message
    syntax = _judge(judge_service, *_stdin("print(1\n", ["\n"], ["1\n"]))
    assert syntax.status == "runtime_error" and not syntax.passed


def test_program_killed_for_time(judge_service):
    verdict = _judge(judge_service, "while True:\n    pass\n", [ProgramTest("", "")])
    assert (verdict.passed, verdict.status, verdict.infrastructure) == (False, "time_limit", False)


def test_program_killed_for_memory(judge_service):
    verdict = _judge(judge_service, "block = bytearray(3 * 1024 ** 3)\nprint(len(block))\n", [ProgramTest("", "1")])
    assert (verdict.passed, verdict.status) == (False, "memory_limit")


def test_program_cannot_reach_the_network(judge_service):
    verdict = _judge(judge_service, "import socket\nprint(socket.gethostname())\n", [ProgramTest("", "x")])
    assert not verdict.passed and verdict.status == "import_blocked"


class DyingService:
    """A real judge service whose supervisor is killed during the first ``kills`` test runs."""

    def __init__(self, service: SandboxService, kills: int):
        self.service, self.kills = service, kills

    async def open(self, source, **kwargs):
        env = await self.service.open(source, **kwargs)
        step = env.step

        async def dying_step(action):
            if self.kills > 0:
                self.kills -= 1
                self.service._process.kill()
            return await step(action)

        env.step = dying_step
        return env


def test_a_dying_sandbox_is_retried_then_counted_apart(judge_service):
    loop, service = judge_service
    program, tests = _stdin("print(int(input()) + 1)\n", ["1\n", "2\n"], ["2\n", "3\n"])
    recovered = _judge(judge_service, program, tests, service=DyingService(service, kills=1))
    assert (recovered.passed, recovered.status, recovered.attempts) == (True, "accepted", 2)
    lost = _judge(judge_service, program, tests, service=DyingService(service, kills=10))
    assert (lost.passed, lost.status, lost.infrastructure) == (False, "infrastructure", True)
    assert lost.attempts == 3  # the first try and two retries
    after = _judge(judge_service, program, tests)  # the service came back for the next problem
    assert after.passed


class BrokenJudgeService:
    async def open(self, source, **kwargs):
        raise InfrastructureFault(EnvError(ErrorKind.CRASHED, Stage.SERVICE, "the sandbox died", True))


def _item(item_id="p"):
    return EvalItem(item_id, ({"role": "user", "content": "x"},),
                    reference={"tests": [{"input": "1\n", "output": "1\n", "kind": "stdin"}], "func_name": None})


def test_infrastructure_failures_are_not_scored(tmp_path):
    bench = LiveCodeBench(data_dir=tmp_path)
    bench._service = BrokenJudgeService()
    record = asyncio.run(bench.score(_item(), "```python\nprint(1)\n```"))
    assert record.detail["status"] == "infrastructure" and record.detail["infrastructure"]
    judged = SampleRecord("t", "c", 1.0, True, detail={"status": "accepted"})
    records = [ItemRecord("a", "easy", (judged,), 0), ItemRecord("b", "easy", (record,), 0)]
    summary = bench.summarize(records)
    assert summary.score == 100.0  # the unjudged problem is neither a pass nor a failure
    assert summary.notes["infrastructure_failures"].startswith("1 sample")
    assert summary.samples == 1


def test_missing_data_is_skipped_not_scored(tmp_path):
    from spade.eval.runner import run_benchmark

    score = asyncio.run(run_benchmark(LiveCodeBench(data_dir=tmp_path), model=None))
    assert score.score is None and "LiveCodeBench" in score.skipped


def _row(question_id, date, **extra):
    row = {"question_id": question_id, "question_title": question_id, "question_content": f"Solve {question_id}.",
           "platform": "atcoder", "contest_date": f"{date}T00:00:00", "starter_code": "", "difficulty": "easy",
           "public_test_cases": json.dumps([{"input": "1\n", "output": "1\n", "testtype": "stdin"}]),
           "private_test_cases": "[]", "metadata": "{}"}
    row.update(extra)
    return json.dumps(row) + "\n"


def test_default_problem_set_is_the_v6_increment_of_the_release(tmp_path):
    folder = tmp_path / "livecodebench"
    folder.mkdir()
    (folder / "test5.jsonl").write_text(_row("v5_dec", "2024-12-28"))
    (folder / "test6.jsonl").write_text(_row("v6_jan", "2025-01-04") + _row("v6_apr", "2025-04-05"))
    assert [i.item_id for i in LiveCodeBench(data_dir=tmp_path).load(seed=0)] == ["v6_jan", "v6_apr"]
    whole = LiveCodeBench(data_dir=tmp_path, problem_set="release_v6").load(seed=0)
    assert [i.item_id for i in whole] == ["v5_dec", "v6_jan", "v6_apr"]
    with pytest.raises(ValueError, match="problem_set"):
        LiveCodeBench(data_dir=tmp_path, problem_set="v7")


def test_default_problem_set_of_one_dated_file_is_the_v6_window(tmp_path):
    rows = [_row("v5_dec", "2024-12-28"), _row("v6_jan", "2025-01-04"), _row("v6_apr", "2025-04-05"),
            _row("later", "2025-06-01")]
    (tmp_path / "livecodebench_v6.jsonl").write_text("".join(rows))
    assert [i.item_id for i in LiveCodeBench(data_dir=tmp_path).load(seed=0)] == ["v6_jan", "v6_apr"]
    chosen = LiveCodeBench(data_dir=tmp_path, start_date="2025-04-01", end_date="2025-12-31").load(seed=0)
    assert [i.item_id for i in chosen] == ["v6_apr", "later"]


def test_prompt_is_livecodebench_s_and_sampling_the_released_in_loop(tmp_path):
    (tmp_path / "livecodebench_v6.jsonl").write_text(
        _row("s", "2025-02-01") + _row("c", "2025-02-01", starter_code="class Solution:\n    def f(self, x: int) -> int:\n        ",
                                       metadata=json.dumps({"func_name": "f"})))
    bench = LiveCodeBench(data_dir=tmp_path)
    stdin_item, call_item = bench.load(seed=0)
    system = ("You are an expert Python programmer. You will be given a question (problem specification) and will "
              "generate a correct Python program that matches the specification and passes all tests.")
    assert stdin_item.messages == ({"role": "user", "content": (
        system + "\n\n### Question:\nSolve s.\n\n### Format: Read the inputs from stdin solve the problem and write "
        "the answer to stdout (do not directly test on the sample inputs). Enclose your code within delimiters as "
        "follows. Ensure that when the python program runs, it reads the inputs, runs the algorithm and writes "
        "output to STDOUT.\n```python\n# YOUR CODE HERE\n```\n\n### Answer: (use the provided format with "
        "backticks)\n\n")},)
    assert call_item.messages[0]["content"].endswith(
        "### Format: You will use the following starter code to write the solution to the problem and enclose your "
        "code within delimiters.\n```python\nclass Solution:\n    def f(self, x: int) -> int:\n        \n```\n\n"
        "### Answer: (use the provided format with backticks)\n\n")
    separate = LiveCodeBench(data_dir=tmp_path, prompt_layout="system_message").load(seed=0)[0]
    assert separate.messages[0] == {"role": "system", "content": system}
    assert separate.messages[1]["content"].startswith("### Question:\nSolve s.")
    sampling = bench.sampling
    assert (sampling.n, sampling.temperature, sampling.top_p, sampling.top_k, sampling.max_new_tokens) == \
        (1, 0.7, 0.8, 20, 16384)


def test_code_is_taken_between_the_last_two_fence_lines():
    from spade.eval.livecodebench import extract_program

    text = "draft:\n```python\nprint(1)\n```\nfinal:\n```python\nprint(2)\n```\ndone"
    assert extract_program(text) == "print(2)"
    assert extract_program("```python\nprint(3)\n```") == "print(3)"
    assert extract_program("only one ``` fence") == ""
    assert extract_program("``` inline ```\nprint(4)\n```") == "print(4)"


def test_fixture_problems_end_to_end(judge_service):
    loop, service = judge_service
    bench = LiveCodeBench(data_dir=FIXTURES, start_date="2025-01-01")
    bench._service = service
    items = bench.load(seed=0)
    assert [i.item_id for i in items] == ["sum2", "double"]  # 'old' is outside the date window
    stdin_answer = "Here:\n```python\nprint(sum(map(int, input().split())))\n```"
    functional = "```python\nclass Solution:\n    def double(self, nums: List[int]) -> List[int]:\n" \
                 "        return [2 * x for x in nums]\n```"
    off_by_one = "```python\nclass Solution:\n    def double(self, nums):\n        return [2 * x + 1 for x in nums]\n```"
    score = lambda item, text: loop.run_until_complete(bench.score(item, text))  # noqa: E731
    assert score(items[0], stdin_answer).correct
    assert score(items[1], functional).correct
    failed = score(items[1], off_by_one)
    assert not failed.correct and failed.detail["status"] == "wrong_answer"
    assert score(items[0], "no code at all").detail["status"] == "no_code"
    bench._service = None  # the module fixture owns the service
