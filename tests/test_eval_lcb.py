"""LiveCodeBench: fixture problems judged in the real sandbox, a program killed for time and one for memory."""

from __future__ import annotations

import asyncio
import base64
import json
import pickle
import zlib
from pathlib import Path

import pytest

from spade.envs.sandbox.client import SandboxService
from spade.eval.code_judge import ProgramTest, judge, judge_config, outputs_match
from spade.eval.livecodebench import LiveCodeBench, decode_tests

FIXTURES = Path(__file__).parent / "fixtures" / "eval"


def test_output_comparison():
    assert outputs_match("3\n", "3")
    assert outputs_match("1 2\n3\n", "1 2   \n3\n\n")
    assert outputs_match("0.5", "0.5000000001")
    assert not outputs_match("3", "4")
    assert not outputs_match("1 2", "1 2 3")


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


def _judge(judge_service, program, tests, func=None):
    loop, service = judge_service
    return loop.run_until_complete(asyncio.wait_for(judge(service, program, tests, func), 60))


def test_stdin_program_passes_and_wrong_one_fails(judge_service):
    tests = [ProgramTest("1 2\n", "3\n"), ProgramTest("10 -4\n", "6\n")]
    ok = _judge(judge_service, "a, b = map(int, input().split())\nprint(a + b)\n", tests)
    assert (ok.passed, ok.status, ok.tests_run) == (True, "accepted", 2)
    wrong = _judge(judge_service, "import sys\na, b = map(int, sys.stdin.read().split())\nprint(a - b)\n", tests)
    assert (wrong.passed, wrong.status) == (False, "wrong_answer")


def test_program_killed_for_time(judge_service):
    verdict = _judge(judge_service, "while True:\n    pass\n", [ProgramTest("", "")])
    assert (verdict.passed, verdict.status) == (False, "time_limit")


def test_program_killed_for_memory(judge_service):
    verdict = _judge(judge_service, "block = bytearray(3 * 1024 ** 3)\nprint(len(block))\n", [ProgramTest("", "1")])
    assert (verdict.passed, verdict.status) == (False, "memory_limit")


def test_program_cannot_reach_the_os(judge_service):
    verdict = _judge(judge_service, "import os\nprint(os.listdir('/'))\n", [ProgramTest("", "")])
    assert not verdict.passed and verdict.status == "import_blocked"


def test_fixture_problems_end_to_end(judge_service):
    loop, service = judge_service
    bench = LiveCodeBench(data_dir=FIXTURES, start_date="2025-01-01")
    bench._service = service
    items = bench.load(seed=0)
    assert [i.item_id for i in items] == ["sum2", "double"]  # 'old' is outside the date window
    assert "standard input" in items[0].messages[0]["content"]
    assert "class Solution" in items[1].messages[0]["content"]
    stdin_answer = "Here:\n```python\nprint(sum(map(int, input().split())))\n```"
    functional = "```python\nclass Solution:\n    def double(self, nums):\n        return [2 * x for x in nums]\n```"
    off_by_one = "```python\nclass Solution:\n    def double(self, nums):\n        return [2 * x + 1 for x in nums]\n```"
    score = lambda item, text: loop.run_until_complete(bench.score(item, text))  # noqa: E731
    assert score(items[0], stdin_answer).correct
    assert score(items[1], functional).correct
    failed = score(items[1], off_by_one)
    assert not failed.correct and failed.detail["status"] == "wrong_answer"
    assert score(items[0], "no code at all").detail["status"] == "no_code"
    bench._service = None  # the module fixture owns the service


@pytest.mark.parametrize("program", [
    "import sys\nprint(sum(int(x) for x in sys.stdin.readline().split()) + int(sys.stdin.read()))\n",
    "import sys\nfirst, rest = sys.stdin.buffer.readline(), sys.stdin.buffer.read()\n"
    "print(sum(map(int, first.split())) + int(rest))\n",
    "import sys\nlines = [line for line in sys.stdin]\nprint(sum(int(x) for line in lines for x in line.split()))\n",
])
def test_programs_read_stdin_as_text_lines_bytes_or_by_iteration(judge_service, program):
    verdict = _judge(judge_service, program, [ProgramTest("1 2\n3\n", "6")])
    assert verdict.passed, verdict.status
