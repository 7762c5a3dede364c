"""BFCL v4 multi-turn (base, missing function, missing parameter, long context) with the data and the
state-based checker of the ``bfcl-eval`` package.

Harness: each turn's user messages are appended; the model answers with tool calls in its own
syntax (``spade.agent.tool_calls``); every call is turned into BFCL's call string
``name(arg=<Python literal>)`` and executed by the package's ``execute_multi_turn_func_call`` on
this sample's own instances of the involved API classes; the results go back as ``tool``
messages; the turn ends when the model answers without a call (or after ``max_steps`` steps). The
decoded calls (one list per step, per turn) are then judged by the package's
``multi_turn_checker`` against the ground truth. Missing-function entries get the withheld
functions added to the tool list at the turn the entry names, with the package's own user message
for that (empty) turn, ``DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC``, as its runner sends it.

What is executed: as in the package's runner, a call to any function of the entry's involved
classes is executed, offered in the tool list at that turn or not (the package never gates
execution on the offered list). This matters for ``multi_turn_miss_func_49``, whose ground truth
calls ``tail`` at turn 1 although the entry withholds ``tail`` until turn 3: the package's runner
and checker accept that trajectory, so ours does too.

Safety: the package executes call strings with ``eval``. We only ever pass strings we build
ourselves from a parsed call whose name is a function of the entry's involved classes and whose
arguments are JSON values (rendered with ``repr``), so no model text reaches ``eval``.
"""

from __future__ import annotations

import copy
import inspect
import itertools
import json
import re
from pathlib import Path
from typing import Any, Optional, Sequence

from .types import Benchmark, BenchmarkUnavailable, EvalItem, SampleRecord, SamplingSettings

CATEGORIES = ("base", "miss_func", "miss_param", "long_context")
BFCL_SAMPLING = SamplingSettings(n=1, temperature=0.0, top_p=1.0, top_k=None, max_new_tokens=4096)
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_serial = itertools.count()


def _package_root() -> Path:
    try:
        import bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker  # noqa: F401
    except Exception as exc:  # noqa: BLE001  (not installed, or its imports fail)
        raise BenchmarkUnavailable(f"bfcl-eval is not usable ({type(exc).__name__}: {exc}); "
                                   "pip install --no-deps bfcl-eval==2026.3.23") from None
    import bfcl_eval

    return Path(bfcl_eval.__file__).parent


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _schema(value: Any) -> Any:
    """BFCL's parameter schema (``"type": "dict"``, Python type names) as JSON schema."""
    if isinstance(value, dict):
        out = {k: _schema(v) for k, v in value.items()}
        kind = out.get("type")
        out["type"] = {"dict": "object", "float": "number", "tuple": "array", "list": "array",
                       "any": "string"}.get(kind, kind) if isinstance(kind, str) else kind
        if out.get("type") is None:
            out.pop("type", None)
        return out
    if isinstance(value, list):
        return [_schema(v) for v in value]
    return value


def load_function_docs(root: Path, classes: Sequence[str]) -> list[dict[str, Any]]:
    from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING

    docs = []
    for name in classes:
        docs.extend(_jsonl(root / "data" / "multi_turn_func_doc" / MULTI_TURN_FUNC_DOC_FILE_MAPPING[name]))
    return docs


def as_tool(doc: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": doc["name"], "description": doc.get("description", ""),
                                             "parameters": _schema(doc.get("parameters", {}))}}


def call_string(name: str, arguments: dict[str, Any]) -> str:
    """BFCL's call syntax for a parsed call; ValueError for names or values we will not pass on."""
    if not _NAME.match(name) or not all(isinstance(k, str) and _NAME.match(k) for k in arguments):
        raise ValueError(f"not a plain function call: {name}")
    return f"{name}(" + ",".join(f"{k}={v!r}" for k, v in arguments.items()) + ")"


def ground_truth_calls(call: str, root_classes: Sequence[str]) -> tuple[str, dict[str, Any]]:
    """A ground-truth call string as (name, keyword arguments): positional arguments are named from
    the package's method signatures (used to replay ground truth through the harness)."""
    import ast
    import importlib

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


class BFCLMultiTurn(Benchmark):
    name = "bfcl_multi_turn"

    def __init__(self, *, categories: Sequence[str] = CATEGORIES, sampling: SamplingSettings = BFCL_SAMPLING,
                 max_steps: int = 20):
        self.categories = tuple(categories)
        self.sampling = sampling
        self.max_steps = max_steps

    def load(self, seed: int, limit: Optional[int] = None) -> list[EvalItem]:
        root = _package_root()
        items = []
        for category in self.categories:
            data = root / "data" / f"BFCL_v4_multi_turn_{category}.json"
            answers = {a["id"]: a["ground_truth"] for a in _jsonl(root / "data" / "possible_answer" / data.name)}
            entries = _jsonl(data)
            for entry in entries[:limit] if limit is not None else entries:
                items.append(EvalItem(entry["id"], (), reference={"entry": entry, "ground_truth": answers[entry["id"]]},
                                      group=category))
        return items

    async def play(self, item: EvalItem, model: Any, seed: int) -> SampleRecord:
        from bfcl_eval.constants.default_prompts import DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC
        from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
        from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import execute_multi_turn_func_call

        from ..agent.tool_calls import parse

        root = _package_root()
        entry = item.reference["entry"]
        category = item.group
        docs = load_function_docs(root, entry["involved_classes"])
        excluded = set(entry.get("excluded_function") or [])
        missed = {int(k): set(v) for k, v in (entry.get("missed_function") or {}).items()}
        withheld = set().union(*missed.values()) if missed else set()
        available = [d for d in docs if d["name"] not in excluded and d["name"] not in withheld]
        callable_names = {d["name"] for d in docs}  # what the package's runner would execute
        run_name = f"spade_{next(_serial)}_{seed}"
        messages: list[dict[str, Any]] = []
        decoded: list[list[list[str]]] = []
        transcript: list[str] = []
        tokens, finish = 0, "stop"
        try:
            for turn_index, turn in enumerate(entry["question"]):
                if turn_index in missed:
                    available += [d for d in docs if d["name"] in missed[turn_index]]
                    if not turn:  # the package's runner speaks for the holdout turn
                        turn = [{"role": "user", "content": DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC}]
                messages.extend(dict(m) for m in turn)
                tools = [as_tool(d) for d in available]
                turn_calls: list[list[str]] = []
                for _ in range(self.max_steps):
                    completion = await model.complete(messages, self.sampling, seed, tools=tools)
                    tokens += completion.tokens
                    finish = completion.finish_reason
                    transcript.append(completion.text)
                    parsed = parse(completion.text, tools)
                    calls = []
                    for call in parsed.calls:
                        try:
                            if call.name not in callable_names:
                                raise ValueError(f"unknown function {call.name}")
                            calls.append(call_string(call.name, call.arguments))
                        except ValueError:
                            continue
                    messages.append({"role": "assistant", "content": completion.text})
                    if not calls:
                        break
                    turn_calls.append(calls)
                    results, _ = execute_multi_turn_func_call(
                        calls, entry["initial_config"], entry["involved_classes"], run_name, entry["id"],
                        long_context="long_context" in category)
                    for result in results:
                        messages.append({"role": "tool", "content": str(result)})
                decoded.append(turn_calls)
            correct, detail = self.check(entry, item.reference["ground_truth"], decoded, run_name)
        finally:
            for key in [k for k in vars(multi_turn_utils) if k.startswith(run_name)]:
                delattr(multi_turn_utils, key)
        return SampleRecord("\n<turn>\n".join(transcript), json.dumps(decoded), float(correct), correct, finish,
                            tokens, detail)

    @staticmethod
    def check(entry: dict, ground_truth: list, decoded: list, run_name: str) -> tuple[bool, dict]:
        """The package's state-based checker on the decoded calls."""
        from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
        from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

        if len(decoded) != len(ground_truth):
            return False, {"error": "turn count mismatch"}
        try:
            result = multi_turn_checker(copy.deepcopy(decoded), ground_truth, entry,
                                        entry["id"].rsplit("_", 1)[0], run_name)
        finally:
            for key in [k for k in vars(multi_turn_utils) if k.startswith(run_name)]:
                delattr(multi_turn_utils, key)
        valid = bool(result.get("valid"))
        detail = {} if valid else {"error": str(result.get("error_type") or result.get("error_message") or "")[:300]}
        return valid, detail
