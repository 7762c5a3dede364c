"""LiveCodeBench (v6): pass@1 of generated Python programs, judged inside our sandbox.

Data: the published ``code_generation_lite`` JSON-lines files. Put either one file
``livecodebench_v6.jsonl`` (or ``lcb_v6.jsonl``) or the release's ``test*.jsonl`` files under
``livecodebench/`` in the data directory. Fields read per problem: ``question_id``,
``question_title``, ``question_content``, ``starter_code`` (empty: stdin/stdout form),
``contest_date`` (for the optional date window), ``public_test_cases`` (a JSON list of
``{"input", "output", "testtype": "stdin"|"functional"}``), ``private_test_cases`` (the same list,
as JSON or as the release's base64 + zlib + pickle encoding, which is decoded by an unpickler that
refuses every object type, so nothing but the encoded string can come out of it), and
``metadata`` (JSON with ``func_name`` for the functional form).

The program is the last fenced Python block of the completion; it passes when every public and
private test passes within the time and memory limits (``code_judge``).
"""

from __future__ import annotations

import base64
import io
import json
import pickle
import zlib
from pathlib import Path
from typing import Any, Optional

from ..envs.sandbox.config import SandboxConfig
from .code_judge import ProgramTest, judge, judge_config
from .data_files import default_data_dir, field, find_file, read_rows
from .extract import code_block
from .types import Benchmark, BenchmarkUnavailable, EvalItem, SampleRecord, SamplingSettings

LCB_SAMPLING = SamplingSettings(n=1, temperature=0.7, top_p=0.95, top_k=None, max_new_tokens=16384)
STDIN_INSTRUCTION = ("Write a Python 3 program that solves the problem below. It reads the input from "
                     "standard input and prints the answer to standard output. Give the whole program "
                     "in one ```python code block.")
FUNCTIONAL_INSTRUCTION = ("Solve the problem below in Python 3 by completing the given code. Give the whole "
                          "solution, starting from the given code, in one ```python code block.")


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
                 start_date: Optional[str] = None, end_date: Optional[str] = None, time_limit_s: float = 6.0,
                 memory_limit_mb: int = 1024, sandbox: Optional[SandboxConfig] = None):
        self.data_dir = data_dir
        self.sampling = sampling
        self.start_date, self.end_date = start_date, end_date
        self.config = judge_config(sandbox, time_limit_s=time_limit_s, memory_limit_mb=memory_limit_mb)
        self._service = None

    def _files(self) -> list[Path]:
        root = Path(self.data_dir) if self.data_dir is not None else default_data_dir()
        folder = root / "livecodebench"
        if folder.is_dir():
            files = sorted(folder.glob("test*.jsonl"))
            if files:
                return files
        return [find_file(self.data_dir, ["livecodebench_v6", "lcb_v6"], "LiveCodeBench")]

    def load(self, seed: int, limit: Optional[int] = None) -> list[EvalItem]:
        items = []
        for path in self._files():
            for index, row in enumerate(read_rows(path)):
                date = str(field(row, ["contest_date"], ""))[:10]
                if self.start_date and date and date < self.start_date:
                    continue
                if self.end_date and date and date > self.end_date:
                    continue
                question = field(row, ["question_content"])
                if question is None:
                    raise BenchmarkUnavailable(f"{path}: row {index + 1} has no question_content")
                try:
                    tests = decode_tests(field(row, ["public_test_cases"])) + \
                        decode_tests(field(row, ["private_test_cases"]))
                except Exception as exc:  # noqa: BLE001
                    raise BenchmarkUnavailable(f"{path}: row {index + 1}: unreadable test cases: {exc}") from None
                metadata = field(row, ["metadata"], {}) or {}
                if isinstance(metadata, str):
                    metadata = json.loads(metadata or "{}")
                starter = str(field(row, ["starter_code"], "") or "")
                title = field(row, ["question_title"], "")
                if starter.strip():
                    prompt = f"{FUNCTIONAL_INSTRUCTION}\n\n{title}\n{question}\n\n```python\n{starter}\n```"
                else:
                    prompt = f"{STDIN_INSTRUCTION}\n\n{title}\n{question}"
                reference = {"tests": [{"input": t["input"], "output": t["output"],
                                        "kind": t.get("testtype", "stdin")} for t in tests],
                             "func_name": metadata.get("func_name")}
                item_id = str(field(row, ["question_id"], f"{path.stem}:{index}"))
                items.append(EvalItem(item_id, ({"role": "user", "content": prompt},), reference=reference,
                                      group=str(field(row, ["difficulty"], ""))))
        return items[:limit] if limit is not None else items

    async def start(self) -> None:
        """Start the judge's sandbox service (before the model is loaded, where possible)."""
        if self._service is None:
            from ..envs.sandbox.client import SandboxService

            self._service = await SandboxService.start(self.config)

    async def score(self, item: EvalItem, text: str) -> SampleRecord:
        program = code_block(text)
        if program is None:
            return SampleRecord(text, None, 0.0, False, detail={"status": "no_code"})
        await self.start()
        tests = [ProgramTest(t["input"], t["output"], t["kind"]) for t in item.reference["tests"]]
        verdict = await judge(self._service, program, tests, item.reference.get("func_name"))
        return SampleRecord(text, program, 1.0 if verdict.passed else 0.0, verdict.passed,
                            detail={"status": verdict.status, "tests_run": verdict.tests_run,
                                    "message": verdict.message})

    async def close(self) -> None:
        if self._service is not None:
            service, self._service = self._service, None
            await service.close()
