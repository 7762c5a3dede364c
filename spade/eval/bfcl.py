"""BFCL v4 multi-turn (base, missing function, missing parameter, long context) with the data, the
executor and the state-based checker of the ``bfcl-eval`` package, played as the package's own
runner plays the handle the released evaluation uses for every size (``Qwen/Qwen3-*-FC``:
``QwenFCHandler``, which bfcl-eval drives through its prompting loop,
``BaseHandler.inference_multi_turn_prompting``).

Entries come from the package's loader ``bfcl_eval.utils.load_dataset_entry``: the function docs of
the involved classes with the package's language note appended to every description (" Note that
the provided function is in Python 3 syntax.", its ``add_language_specific_hint_to_function_doc``),
the withheld functions of a missing-function entry moved to ``missed_function``. ``excluded_function``
is not read by the package, so those functions are offered as there.

One turn, as the package's loop: the turn's user messages are appended (a missing-function turn,
empty in the data, gets ``DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING`` listing the
withheld docs; the tool list itself does not grow, as in the prompting loop); then step after step
the model answers, the answer (after the last ``</think>``) is decoded by the Qwen FC handler's
rules (:func:`decode_step`), and

* a step whose decoding fails, or that holds no call, ends the turn;
* otherwise every decoded call is executed by the package's ``execute_multi_turn_func_call`` on
  this sample's instances, an unknown function included (its result is the package's
  "Error during execution: ..." text), the results go back as ``tool`` messages, and the step
  counts; once the count passes the package's ``MAXIMUM_STEP_LIMIT`` (read from the package at
  run time: 20 in 2026.3.23, so 21 steps run) the whole entry is abandoned, as the package's
  forced quit.

Scoring mirrors the package's ``_evaluate_single_multi_turn_entry`` (its module does not import
without the package's API-client dependencies): fewer turns than the ground truth (a forced quit)
fails as ``multi_turn:force_terminated``; each step is decoded again, undecodable and empty steps
dropped; the rest goes to the package's ``multi_turn_checker`` unchanged.

What is executed: as in the package's runner, a call to any function of the entry's involved
classes is executed, offered at that turn or not (the package never gates execution on the offered
list). ``multi_turn_miss_func_49`` depends on this: its ground truth calls ``tail`` at turn 1
although the entry withholds ``tail`` until turn 3.

Safety: the package executes call strings with ``eval``. Ours are built from decoded JSON (argument
values rendered with ``repr``); a call whose name or argument names are not plain identifiers, or
whose name is a Python builtin or a name of the package's executor module rather than a method of
the involved classes, is replaced by a call to an undefined name (:data:`REFUSED_CALL`): it still
counts as one call that fails to execute, as an unknown function does in the package, but no model
text chooses what ``eval`` runs. (The package itself would run such a call: a model naming
``open`` there opens a file.)
"""

from __future__ import annotations

import builtins
import copy
import inspect
import itertools
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from .benchmark import Benchmark
from .chat_interface import ChatModelLike
from .types import BenchmarkUnavailable, EvalItem, SampleRecord, SamplingSettings

CATEGORIES = ("base", "miss_func", "miss_param", "long_context")
BFCL_SAMPLING = SamplingSettings(n=1, temperature=0.0, top_p=1.0, top_k=None, max_new_tokens=4096)
REFUSED_CALL = "_spade_refused_call()"
# QwenFCHandler._extract_tool_calls: a block is exactly "<tool_call>\n...\n</tool_call>"
_QWEN_BLOCK = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.DOTALL)
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_serial = itertools.count()


def _package_root() -> Path:
    try:
        import bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker  # noqa: F401
    except Exception as exc:  # noqa: BLE001  (not installed, or its imports fail)
        raise BenchmarkUnavailable(f"bfcl-eval is not usable ({type(exc).__name__}: {exc}); "
                                   "pip install --no-deps bfcl-eval==2026.3.23") from None
    import bfcl_eval

    root = Path(bfcl_eval.__file__).parent
    # bfcl_eval.utils creates result/score folders under BFCL_PROJECT_ROOT at import (default: the
    # folder holding the package, maybe read-only); ours stay in a cache folder.
    if "BFCL_PROJECT_ROOT" not in os.environ:
        os.environ["BFCL_PROJECT_ROOT"] = str(Path.home() / ".cache" / "spade" / "bfcl")
    return root


def step_limit() -> int:
    """The package's forced-quit limit, read at call time (``MAXIMUM_STEP_LIMIT``)."""
    from bfcl_eval.constants import default_prompts

    return int(default_prompts.MAXIMUM_STEP_LIMIT)


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


def as_tool(doc: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": doc["name"], "description": doc.get("description", ""),
                                             "parameters": _schema(doc.get("parameters", {}))}}


def split_reasoning(text: str) -> tuple[str, str]:
    """(answer, reasoning) as the Qwen FC handler splits a completion: the answer is what follows
    the last ``</think>``, the reasoning what precedes it after the last ``<think>``."""
    if "</think>" not in text:
        return text, ""
    parts = text.split("</think>")
    return parts[-1].lstrip("\n"), parts[0].rstrip("\n").split("<think>")[-1].lstrip("\n")


def extract_blocks(answer: str) -> list[Any]:
    """The JSON values of the answer's ``<tool_call>`` blocks; a block that is not JSON is dropped."""
    values = []
    for body in _QWEN_BLOCK.findall(answer):
        try:
            values.append(json.loads(body))
        except ValueError:
            continue
    return values


class DecodeError(ValueError):
    """The step cannot be decoded (the package's runner ends the turn; its scorer drops the step)."""


@dataclass(frozen=True)
class DecodedCall:
    name: str
    arguments: dict[str, Any]


def decode_step(answer: str) -> list[DecodedCall]:
    """The calls of one step by QwenFCHandler.decode_execute's rules: every extracted block must be
    an object with ``name`` and ``arguments`` (an object, or a string holding a JSON object), or the
    whole step fails with DecodeError."""
    calls = []
    for value in extract_blocks(answer):
        if not isinstance(value, dict) or "name" not in value or "arguments" not in value:
            raise DecodeError(f"not a function call: {value!r:.200}")
        arguments = value["arguments"]
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                raise DecodeError(f"arguments of {value['name']!r} are not JSON") from None
        if not isinstance(arguments, dict):
            raise DecodeError(f"arguments of {value['name']!r} are not an object")
        calls.append(DecodedCall(str(value["name"]), arguments))
    return calls


def method_names(classes: Sequence[str]) -> set[str]:
    """Public methods of the involved API classes: what the package's executor binds to instances."""
    import importlib

    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING

    names: set[str] = set()
    for cls_name in classes:
        cls = getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[cls_name]), cls_name)
        names.update(n for n, _ in inspect.getmembers(cls, inspect.isfunction) if not n.startswith("_"))
    return names


def call_string(call: DecodedCall, methods: set[str]) -> str:
    """The package's call syntax ``name(key=repr(value), ...)`` for a decoded call, or REFUSED_CALL
    when the text would let the model choose what the package's ``eval`` runs."""
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils

    plain = bool(_NAME.match(call.name)) and all(isinstance(k, str) and _NAME.match(k) for k in call.arguments)
    foreign = call.name not in methods and (hasattr(builtins, call.name) or call.name in vars(multi_turn_utils))
    if not plain or foreign:
        return REFUSED_CALL
    return f"{call.name}(" + ",".join(f"{k}={v!r}" for k, v in call.arguments.items()) + ")"


def decoded_calls(answer: str, methods: set[str]) -> list[str]:
    """One step's call strings (DecodeError when the step does not decode)."""
    return [call_string(c, methods) for c in decode_step(answer)]


def _assistant_message(answer: str, reasoning: str) -> dict[str, Any]:
    """The chat-history message the Qwen FC handler keeps for a step: the extracted calls (no
    text) when there are any, else the answer's text."""
    blocks = extract_blocks(answer)
    if blocks and all(isinstance(b, dict) and "name" in b for b in blocks):
        return {"role": "assistant", "content": "", "reasoning_content": reasoning,
                "tool_calls": [{"name": b["name"], "arguments": b.get("arguments", {})} for b in blocks]}
    # (non-object blocks would break the package's own prompt builder; we keep the text instead)
    return {"role": "assistant", "content": answer, "reasoning_content": reasoning}


def _forget(run_name: str) -> None:
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils

    for key in [k for k in vars(multi_turn_utils) if k.startswith(run_name)]:
        delattr(multi_turn_utils, key)


class BFCLMultiTurn(Benchmark):
    name = "bfcl_multi_turn"

    def __init__(self, *, categories: Sequence[str] = CATEGORIES, sampling: SamplingSettings = BFCL_SAMPLING):
        unknown = [c for c in categories if c not in CATEGORIES]
        if unknown:
            raise ValueError(f"bfcl categories: unknown {', '.join(unknown)}; allowed: {', '.join(CATEGORIES)}")
        self.categories = tuple(categories)
        self.sampling = sampling

    def load(self, seed: int, limit: Optional[int] = None) -> list[EvalItem]:
        _package_root()
        from bfcl_eval.utils import load_dataset_entry, load_ground_truth_entry

        items = []
        for category in self.categories:
            name = f"multi_turn_{category}"
            answers = {a["id"]: a["ground_truth"] for a in load_ground_truth_entry(name)}
            entries = load_dataset_entry(name)
            for entry in entries[:limit] if limit is not None else entries:
                items.append(EvalItem(entry["id"], (), reference={"entry": entry, "ground_truth": answers[entry["id"]]},
                                      group=category))
        return items

    async def play(self, item: EvalItem, model: ChatModelLike, seed: int) -> SampleRecord:
        from bfcl_eval.constants.default_prompts import DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING
        from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import execute_multi_turn_func_call

        entry = copy.deepcopy(item.reference["entry"])
        holdout = entry.get("missed_function") or {}
        tools = [as_tool(d) for d in entry["function"]]
        methods = method_names(entry["involved_classes"])
        limit = step_limit()
        run_name = f"spade_{next(_serial)}_{seed}"
        long_context = "long_context" in item.group
        messages: list[dict[str, Any]] = []
        responses: list[list[str]] = []  # the answer of every step, per turn (the package's model result)
        transcript: list[str] = []
        tokens, finish, forced_quit = 0, "stop", False
        try:
            for turn_index, turn in enumerate(entry["question"]):
                if str(turn_index) in holdout:  # the package's loop speaks for the (empty) holdout turn
                    turn = [{"role": "user", "content": DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING.format(
                        functions=holdout[str(turn_index)])}]
                messages.extend(dict(m) for m in turn)
                turn_responses: list[str] = []
                count = 0
                while True:
                    completion = await model.complete(messages, self.sampling, seed, tools=tools)
                    tokens += completion.tokens
                    finish = completion.finish_reason
                    transcript.append(completion.text)
                    answer, reasoning = split_reasoning(completion.text)
                    turn_responses.append(answer)
                    messages.append(_assistant_message(answer, reasoning))
                    try:
                        calls = decoded_calls(answer, methods)
                    except DecodeError:
                        break
                    if not calls:
                        break
                    results, _ = execute_multi_turn_func_call(calls, entry["initial_config"], entry["involved_classes"],
                                                              run_name, entry["id"], long_context=long_context)
                    messages.extend({"role": "tool", "name": call, "content": result}
                                    for call, result in zip(calls, results))
                    count += 1
                    if count > limit:
                        forced_quit = True
                        break
                responses.append(turn_responses)
                if forced_quit:
                    break
            correct, detail, decoded = self.check(entry, item.reference["ground_truth"], responses, run_name, methods)
        finally:
            _forget(run_name)
        if forced_quit:
            detail = {**detail, "forced_quit_after_steps": limit}
        return SampleRecord("\n<turn>\n".join(transcript), json.dumps(decoded), float(correct), correct, finish,
                            tokens, detail)

    @staticmethod
    def check(entry: dict, ground_truth: list, responses: list[list[str]], run_name: str,
              methods: Optional[set[str]] = None) -> tuple[bool, dict, list]:
        """The package's scoring of one entry: a forced quit (fewer turns) fails; every step is
        decoded again, failed and empty steps dropped; the package's checker judges the rest."""
        from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

        methods = method_names(entry["involved_classes"]) if methods is None else methods
        decoded: list[list[list[str]]] = []
        for turn in responses:
            steps = []
            for answer in turn:
                try:
                    calls = decoded_calls(answer, methods)
                except DecodeError:
                    continue
                if calls:
                    steps.append(calls)
            decoded.append(steps)
        if len(decoded) != len(ground_truth):
            return False, {"error_type": "multi_turn:force_terminated",
                           "error": f"{len(decoded)} of {len(ground_truth)} turns played"}, decoded
        try:
            result = multi_turn_checker(copy.deepcopy(decoded), ground_truth, entry,
                                        entry["id"].rsplit("_", 1)[0], run_name)
        finally:
            _forget(run_name)
        valid = bool(result.get("valid"))
        detail = {} if valid else {"error_type": str(result.get("error_type") or ""),
                                   "error": str(result.get("error_message") or "")[:300]}
        return valid, detail, decoded
