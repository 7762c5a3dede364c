"""LiveCodeBench v6: pass@1 of generated Python programs, judged in our sandbox by LiveCodeBench's rules.

Data: the published ``code_generation_lite`` JSON-lines files, not shipped (a missing file skips the
benchmark). Either the release's files under ``livecodebench/`` in the data directory
(``test.jsonl`` .. ``test6.jsonl``; ``scripts/setup_lcb.sh`` of the released code downloads
``test6.jsonl``) or one file ``livecodebench_v6.jsonl`` (or ``lcb_v6.jsonl``). Fields read per
problem: ``question_id``, ``question_content``, ``starter_code`` (empty: stdin form),
``contest_date``, ``difficulty``, ``public_test_cases`` / ``private_test_cases`` (a JSON list of
``{"input", "output", "testtype"}``; the private ones also as the release's base64 + zlib + pickle
encoding, decoded by an unpickler that refuses every object type) and ``metadata`` (JSON; its
``func_name`` makes the problem call-based, as in LiveCodeBench's ``get_evaluation_sample``).

Problem set (``problem_set``): ``v6`` (default) is the paper's 175 problems, the problems release_v6
added to release_v5, which the released in-loop evaluator reads from ``test6.jsonl``
(``spade/core/eval/livecodebench_env.py``, ``eval_configs/gem_eval_inloop.yaml``: 175 episodes, one
per problem). With the release's files, that is ``test6.jsonl``; with one file, the problems dated in
:data:`V6_WINDOW`. ``release_v6`` is the whole release (1,055 problems, the released offline config).
``start_date`` / ``end_date`` (inclusive days) narrow either.

Prompt: LiveCodeBench's own (``lcb_runner/prompts/code_generation.py``: ``SYSTEM_MESSAGE_GENERIC``
and ``get_generic_question_template_answer``), reproduced verbatim as benchmark data. Layout
``in_loop`` (default) puts the system text and the question in one user message, as the released
in-loop environment does; ``system_message`` sends them as system and user messages, as
LiveCodeBench's runner does for chat models. Sampling: the released in-loop evaluator's
(``spade/core/eval/gem_evaluator.py``): T 0.7, top_p 0.8, top_k 20, 16,384 tokens, one sample.

The program is what LiveCodeBench's ``extract_code`` takes: the lines between the last two lines
that contain a fence. It passes when every public and private test passes (``code_judge``).
A problem the sandbox could not judge (infrastructure) is counted apart, never as a failure.

Protocols (``eval.protocol``): ``spade`` (default) and ``in_loop`` are the above. ``offline`` is the
released offline suite (``eval_offline/configs/games.yaml``, ``eval_offline/suites/livecodebench.py``):
the whole ``release_v6`` problem set, one sample at T 0.2, top-p 0.95, no top-k, 16,384 tokens; the
prompt is the question, the starter code (when there is one) in a python fence, and a request for one
python block (layout ``offline``); the program is the last python-fenced block, or the whole reply
when there is none; it is judged by the same LiveCodeBench rules.
"""

from __future__ import annotations

import base64
import io
import json
import pickle
import re
import zlib
from pathlib import Path
from typing import Any, Optional, Sequence

from ..envs.sandbox.config import SandboxConfig
from .benchmark import Benchmark
from .code_judge import DEFAULT_MEMORY_LIMIT_MB, LCB_TIME_LIMIT_S, ProgramTest, judge, judge_config
from .data_files import default_data_dir, field, find_file, read_rows
from .extract import strip_thinking
from .protocol import OFFLINE, SPADE, check_protocol
from .types import (BenchmarkScore, BenchmarkUnavailable, EvalItem, ItemRecord, SampleRecord,
                    SamplingSettings)

LCB_SAMPLING = SamplingSettings(n=1, temperature=0.7, top_p=0.8, top_k=20, max_new_tokens=16384)
PROBLEM_SETS = ("v6", "release_v6")
PROMPT_LAYOUTS = ("in_loop", "system_message", "offline")
V6_FILE = "test6.jsonl"
V6_PROBLEMS = 175
# contest days of the v6 problems: the public copies of test6.jsonl span 2025-01-04 .. 2025-04-05,
# the last problems of release_v5 are from December 2024
V6_WINDOW = ("2025-01-01", "2025-04-30")

# LiveCodeBench's prompt (lcb_runner/prompts/code_generation.py, PromptConstants and
# get_generic_question_template_answer), reproduced verbatim: benchmark data
SYSTEM_MESSAGE = ("You are an expert Python programmer. You will be given a question (problem specification) "
                  "and will generate a correct Python program that matches the specification and passes all tests.")
FORMAT_WITH_STARTER = ("You will use the following starter code to write the solution to the problem and enclose "
                       "your code within delimiters.")
FORMAT_STDIN = ("Read the inputs from stdin solve the problem and write the answer to stdout (do not directly test "
                "on the sample inputs). Enclose your code within delimiters as follows. Ensure that when the python "
                "program runs, it reads the inputs, runs the algorithm and writes output to STDOUT.")


def question_prompt(question: str, starter_code: str) -> str:
    """LiveCodeBench's question template for chat models."""
    if starter_code:
        body = f"### Format: {FORMAT_WITH_STARTER}\n```python\n{starter_code}\n```\n\n"
    else:
        body = f"### Format: {FORMAT_STDIN}\n```python\n# YOUR CODE HERE\n```\n\n"
    return f"### Question:\n{question}\n\n{body}### Answer: (use the provided format with backticks)\n\n"


# the released offline suite's prompt pieces (eval_offline/suites/livecodebench.py), as protocol data
OFFLINE_STARTER = "\nStarter code:\n```python\n{starter}\n```"
OFFLINE_REQUEST = "\nWrite the complete solution in a single ```python ... ``` block."
_OFFLINE_FENCE = re.compile(r"```python\s*\n(.*?)\n```", re.DOTALL)


def offline_prompt(question: str, starter_code: str) -> str:
    parts = [question] + ([OFFLINE_STARTER.format(starter=starter_code)] if starter_code else []) + [OFFLINE_REQUEST]
    return "\n".join(parts)


def offline_program(text: str) -> str:
    """The offline suite's program: the last python-fenced block; the whole text without one."""
    text = strip_thinking(text)
    found = _OFFLINE_FENCE.findall(text)
    return found[-1] if found else text


def prompt_messages(question: str, starter_code: str, layout: str = "in_loop") -> tuple[dict[str, str], ...]:
    if layout == "offline":
        return ({"role": "user", "content": offline_prompt(question, starter_code)},)
    text = question_prompt(question, starter_code)
    if layout == "system_message":
        return ({"role": "system", "content": SYSTEM_MESSAGE}, {"role": "user", "content": text})
    return ({"role": "user", "content": SYSTEM_MESSAGE + "\n\n" + text},)


def extract_program(text: str) -> str:
    """LiveCodeBench's ``extract_code`` for chat models: the lines between the last two lines that
    contain a fence; "" when fewer than two lines do."""
    lines = text.split("\n")
    fences = [index for index, line in enumerate(lines) if "```" in line]
    if len(fences) < 2:
        return ""
    return "\n".join(lines[fences[-2] + 1:fences[-1]])


class _NoObjects(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a test-case field")


def decode_tests(value: Any) -> list[dict[str, Any]]:
    """A test-case field: a list, a JSON string, or base64(zlib(pickle(JSON string)))."""
    if value is None or value == "":
        return []
    if isinstance(value, list):
        return value
    text = str(value)
    try:
        return list(json.loads(text))
    except ValueError:
        pass
    raw = _NoObjects(io.BytesIO(zlib.decompress(base64.b64decode(text)))).load()
    return list(json.loads(raw) if isinstance(raw, (str, bytes)) else raw)


class LiveCodeBench(Benchmark):
    name = "lcb_v6"
    metric = "pass@1"
    needs_sandbox = True

    def __init__(self, *, data_dir: Optional[Path] = None, sampling: SamplingSettings = LCB_SAMPLING,
                 problem_set: Optional[str] = None, start_date: Optional[str] = None, end_date: Optional[str] = None,
                 prompt_layout: Optional[str] = None, time_limit_s: float = LCB_TIME_LIMIT_S,
                 memory_limit_mb: int = DEFAULT_MEMORY_LIMIT_MB, sandbox: Optional[SandboxConfig] = None,
                 protocol: str = SPADE):
        self.protocol = check_protocol(protocol)
        offline = self.protocol == OFFLINE
        problem_set = problem_set or ("release_v6" if offline else "v6")
        prompt_layout = prompt_layout or ("offline" if offline else "in_loop")
        if problem_set not in PROBLEM_SETS:
            raise ValueError(f"lcb problem_set must be one of {', '.join(PROBLEM_SETS)}, got {problem_set!r}")
        if prompt_layout not in PROMPT_LAYOUTS:
            raise ValueError(f"lcb prompt_layout must be one of {', '.join(PROMPT_LAYOUTS)}, got {prompt_layout!r}")
        self.data_dir = data_dir
        self.sampling = sampling
        self.problem_set = problem_set
        self.start_date, self.end_date = start_date, end_date
        self.prompt_layout = prompt_layout
        self.config = judge_config(sandbox, time_limit_s=time_limit_s, memory_limit_mb=memory_limit_mb)
        self._service: Any = None
        self._limited = False

    def _sources(self) -> tuple[list[Path], tuple[Optional[str], Optional[str]]]:
        """The files to read and the date window (inclusive days) to keep."""
        root = Path(self.data_dir) if self.data_dir is not None else default_data_dir()
        folder = root / "livecodebench"
        release = sorted(folder.glob("test*.jsonl")) if folder.is_dir() else []
        window = (self.start_date, self.end_date)
        if release:
            if self.problem_set == "release_v6":
                return release, window
            if not (folder / V6_FILE).is_file():
                raise BenchmarkUnavailable(f"no {V6_FILE} in {folder}: the v6 problem set is that file of the "
                                           "code_generation_lite release (see docs/evaluation.md)")
            return [folder / V6_FILE], window
        path = find_file(self.data_dir, ["livecodebench_v6", "lcb_v6"], "LiveCodeBench")
        if self.problem_set == "v6" and self.start_date is None and self.end_date is None:
            window = V6_WINDOW
        return [path], window

    def load(self, seed: int, limit: Optional[int] = None) -> list[EvalItem]:
        files, (start, end) = self._sources()
        items = []
        for path in files:
            for index, row in enumerate(read_rows(path)):
                date = str(field(row, ["contest_date"], ""))[:10]
                if date and ((start and date < start) or (end and date > end)):
                    continue
                items.append(self._item(path, index, row))
        self._limited = limit is not None
        return items[:limit] if limit is not None else items

    def _item(self, path: Path, index: int, row: dict[str, Any]) -> EvalItem:
        question = field(row, ["question_content"])
        if question is None:
            raise BenchmarkUnavailable(f"{path}: row {index + 1} has no question_content")
        try:
            tests = decode_tests(field(row, ["public_test_cases"])) + decode_tests(field(row, ["private_test_cases"]))
        except Exception as exc:  # noqa: BLE001
            raise BenchmarkUnavailable(f"{path}: row {index + 1}: unreadable test cases: {exc}") from None
        metadata = field(row, ["metadata"], {}) or {}
        if isinstance(metadata, str):
            metadata = json.loads(metadata or "{}")
        starter = str(field(row, ["starter_code"], "") or "")
        reference = {"tests": [{"input": t["input"], "output": t["output"], "kind": t.get("testtype", "stdin")}
                               for t in tests],
                     "func_name": metadata.get("func_name")}
        item_id = str(field(row, ["question_id"], f"{path.stem}:{index}"))
        return EvalItem(item_id, prompt_messages(str(question), starter, self.prompt_layout), reference=reference,
                        group=str(field(row, ["difficulty"], "")))

    async def start(self) -> None:
        """Start the judge's sandbox service (before the model is loaded, where possible)."""
        if self._service is None:
            from ..envs.sandbox.client import SandboxService

            self._service = await SandboxService.start(self.config)

    async def score(self, item: EvalItem, text: str) -> SampleRecord:
        program = offline_program(text) if self.protocol == OFFLINE else extract_program(text)
        if not program.strip():
            return SampleRecord(text, None, 0.0, False, detail={"status": "no_code"})
        await self.start()
        tests = [ProgramTest(t["input"], t["output"], t["kind"]) for t in item.reference["tests"]]
        verdict = await judge(self._service, program, tests, item.reference.get("func_name"))
        detail = {"status": verdict.status, "tests_run": verdict.tests_run, "message": verdict.message,
                  "attempts": verdict.attempts, **verdict.detail}
        if verdict.infrastructure:
            detail["infrastructure"] = True
        return SampleRecord(text, program, 1.0 if verdict.passed else 0.0, verdict.passed, detail=detail)

    def summarize(self, records: Sequence[ItemRecord]) -> BenchmarkScore:
        """pass@1 over the samples the sandbox judged; samples it could not judge (infrastructure)
        are left out of the score and counted under ``notes["infrastructure_failures"]``."""
        unjudged = [(r.item_id, s) for r in records for s in r.samples if s.detail.get("infrastructure")]
        judged = [ItemRecord(r.item_id, r.group, tuple(s for s in r.samples if not s.detail.get("infrastructure")),
                             r.seed, r.weight_version) for r in records]
        score = super().summarize([r for r in judged if r.samples])
        notes = dict(score.notes)
        if unjudged:
            problems = sorted({item_id for item_id, _ in unjudged})
            notes["infrastructure_failures"] = (f"{len(unjudged)} sample(s) of {len(problems)} problem(s) not judged "
                                                f"(the sandbox failed): {', '.join(problems[:20])}")
        if self.problem_set == "v6" and not self._limited and records and len(records) != V6_PROBLEMS \
                and self.start_date is None and self.end_date is None:
            notes["problem_set"] = f"{len(records)} problems, the paper's v6 set has {V6_PROBLEMS}"
        return BenchmarkScore(score.name, score.score, score.items, score.samples, score.groups, score.skipped,
                              score.metric, notes)

    async def close(self) -> None:
        if self._service is not None:
            service, self._service = self._service, None
            await service.close()
