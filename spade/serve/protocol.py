"""The OpenAI wire format: request validation into typed records, and response builders.

Everything here is pure (no model, no engine): ``parse_chat_request`` / ``parse_completion_request``
turn a decoded JSON body into a ``ChatRequest`` / ``CompletionRequest`` or raise ``APIError``
naming the offending field (``param``), and ``chat_choice`` / ``completion_choice`` turn generated
text into the response's choice objects, parsing the model's native tool calls with
``spade.agent.tool_calls`` (from the answer only, once ``reasoning`` has separated a thinking
model's reasoning). Unknown fields are ignored, as OpenAI-compatible servers do, except
the ones whose meaning we cannot honour (listed in ``_UNSUPPORTED``), which are refused; every
field that changes the result is either honoured or refused (docs/serving.md lists them).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence, Union

from spade.agent import tool_calls as tool_parser

from ..agent.reasoning import ReasoningSplit

ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_N = 64
MAX_TOP_LOGPROBS = 20  # OpenAI's bound for top_logprobs, vLLM's default max_logprobs
FORMATS = ("text", "json_object", "json_schema")  # response_format types


class APIError(Exception):
    """An error answered as OpenAI-style JSON: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, message: str, param: Optional[str] = None, status: int = 400,
                 kind: str = "invalid_request_error", code: Optional[str] = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
        self.kind = kind
        self.code = code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param,
                          "code": self.code}}


@dataclass(frozen=True)
class Sampling:
    """The sampling fields shared by both endpoints (``None``: the server's default)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: Optional[int] = None
    max_tokens: Optional[int] = None
    seed: Optional[int] = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    n: int = 1
    ignore_eos: bool = False
    logprobs: bool = False
    top_logprobs: int = 0  # alternatives per token (chat: top_logprobs; completions: logprobs N)
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop_regex: tuple[str, ...] = ()  # the reply ends at the end of the first match (service.py)


@dataclass(frozen=True)
class ChatRequest:
    model: Optional[str]
    messages: list[dict[str, Any]]  # ready for the chat template
    tools: Optional[list[dict[str, Any]]]
    parse_tools: bool
    sampling: Sampling
    stream: bool = False
    include_usage: bool = False
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    separate_reasoning: bool = True  # SGLang's request field: false leaves reasoning in content
    response_format: Optional[dict[str, Any]] = None  # json_object / json_schema (constraints.py)
    tool_choice: Any = None  # "required" or {"type": "function", ...}: constrained (constraints.py)
    parallel_tool_calls: bool = True
    grammar: Optional[tuple[str, str]] = None  # ("regex" | "ebnf", spec): SGLang's fields (constraints.py)


@dataclass(frozen=True)
class CompletionRequest:
    model: Optional[str]
    prompts: list[Union[str, list[int]]]
    sampling: Sampling
    echo: bool = False
    stream: bool = False
    include_usage: bool = False
    response_format: Optional[dict[str, Any]] = None  # json_object / json_schema (constraints.py)
    grammar: Optional[tuple[str, str]] = None  # ("regex" | "ebnf", spec): SGLang's fields (constraints.py)


MAX_STOP_REGEX = 32  # SGLang's MAX_STOP_REGEX_COUNT
MAX_STOP_REGEX_BYTES = 256  # SGLang's MAX_STOP_REGEX_LEN
GRAMMAR_FIELDS = ("regex", "ebnf")

_UNSUPPORTED: dict[str, tuple[str, Any]] = {  # field: (why, the value that asks for nothing)
    "suffix": ("suffix (fill-in-the-middle) is not supported", ""),
    "best_of": ("best_of is not supported; use n", 1),
    "logit_bias": ("logit_bias is not supported", {}),
    "min_tokens": ("min_tokens is not supported", 0),
}


# ---------------------------------------------------------------------------- field readers

def _require_object(body: Any) -> Mapping[str, Any]:
    if not isinstance(body, Mapping):
        raise APIError("the request body must be a JSON object")
    return body


def _number(body: Mapping[str, Any], key: str, default: Optional[float], low: float, high: float,
            *, low_open: bool = False) -> Optional[float]:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise APIError(f"{key} must be a number, got {json.dumps(value)}", key)
    if value < low or value > high or (low_open and value == low):
        bracket = "(" if low_open else "["
        raise APIError(f"{key} must be in {bracket}{low}, {high}], got {value}", key)
    return float(value)


def _integer(body: Mapping[str, Any], key: str, low: Optional[int] = None) -> Optional[int]:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise APIError(f"{key} must be an integer, got {json.dumps(value)}", key)
    if low is not None and value < low:
        raise APIError(f"{key} must be >= {low}, got {value}", key)
    return value


def _flag(body: Mapping[str, Any], key: str) -> bool:
    value = body.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise APIError(f"{key} must be true or false, got {json.dumps(value)}", key)
    return value


def _sampling(body: Mapping[str, Any], *, chat: bool) -> Sampling:
    for key, (why, harmless) in _UNSUPPORTED.items():
        if body.get(key) not in (None, harmless):
            raise APIError(why, key)
    max_key = "max_tokens"
    if chat and body.get("max_completion_tokens") is not None:
        max_key = "max_completion_tokens"
    top_k = _integer(body, "top_k")
    if top_k is not None and top_k < 1:
        if top_k not in (0, -1):
            raise APIError(f"top_k must be >= 1, or 0 / -1 for off, got {top_k}", "top_k")
        top_k = None
    stop = body.get("stop")
    if stop is None:
        stops: tuple[str, ...] = ()
    elif isinstance(stop, str):
        stops = (stop,)
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stops = tuple(stop)
    else:
        raise APIError("stop must be a string or a list of strings", "stop")
    if any(s == "" for s in stops):
        raise APIError("stop strings must not be empty", "stop")
    stop_ids = body.get("stop_token_ids") or []
    if not isinstance(stop_ids, list) or not all(isinstance(t, int) and not isinstance(t, bool)
                                                 for t in stop_ids):
        raise APIError("stop_token_ids must be a list of integers", "stop_token_ids")
    n = _integer(body, "n", low=1) or 1
    if n > MAX_N:
        raise APIError(f"n must be <= {MAX_N}, got {n}", "n")
    if chat:
        logprobs = _flag(body, "logprobs")
        top = _integer(body, "top_logprobs", low=0) or 0
        if top > MAX_TOP_LOGPROBS:
            raise APIError(f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {top}", "top_logprobs")
        if top and not logprobs:
            raise APIError("top_logprobs needs logprobs: true", "top_logprobs")
    else:  # the legacy API: logprobs N = the sampled token and the N most likely ones
        count = _integer(body, "logprobs", low=0)
        if count is not None and count > MAX_TOP_LOGPROBS:
            raise APIError(f"logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {count}", "logprobs")
        logprobs = count is not None
        top = count or 0
    return Sampling(
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0, low_open=True),
        top_k=top_k,
        max_tokens=_integer(body, max_key, low=1),
        seed=_integer(body, "seed"),
        stop=stops,
        stop_token_ids=tuple(stop_ids),
        n=n,
        ignore_eos=_flag(body, "ignore_eos"),
        logprobs=logprobs,
        top_logprobs=top,
        min_p=_number(body, "min_p", 0.0, 0.0, 1.0),
        frequency_penalty=_number(body, "frequency_penalty", 0.0, -2.0, 2.0),
        presence_penalty=_number(body, "presence_penalty", 0.0, -2.0, 2.0),
        repetition_penalty=_number(body, "repetition_penalty", 1.0, 0.0, 2.0, low_open=True),
        stop_regex=_stop_regex(body.get("stop_regex")),
    )


def _stop_regex(value: Any) -> tuple[str, ...]:
    """``stop_regex``: a pattern or a list of them (SGLang's field and limits), each compiled here."""
    if value is None:
        return ()
    patterns = [value] if isinstance(value, str) else value
    if not isinstance(patterns, list) or not all(isinstance(p, str) and p for p in patterns):
        raise APIError("stop_regex must be a non-empty string or a list of them", "stop_regex")
    if len(patterns) > MAX_STOP_REGEX:
        raise APIError(f"at most {MAX_STOP_REGEX} stop_regex patterns are allowed, got {len(patterns)}",
                       "stop_regex")
    for pattern in patterns:
        if len(pattern.encode("utf-8", "surrogatepass")) > MAX_STOP_REGEX_BYTES:
            raise APIError(f"a stop_regex pattern may be at most {MAX_STOP_REGEX_BYTES} bytes", "stop_regex")
        try:
            re.compile(pattern)
        except (re.error, RecursionError, OverflowError) as exc:
            raise APIError(f"stop_regex {json.dumps(pattern)} is not a regular expression: {exc}",
                           "stop_regex") from None
    return tuple(patterns)


def _grammar(body: Mapping[str, Any], *others: str) -> Optional[tuple[str, str]]:
    """``regex`` or ``ebnf`` (SGLang's fields; the grammar is checked in constraints.py). At most one
    grammar per request, counting ``others`` (the request's other constraining fields that are set),
    as SGLang checks."""
    given = [key for key in GRAMMAR_FIELDS if body.get(key) not in (None, "")]
    for key in given:
        if not isinstance(body[key], str):
            raise APIError(f"{key} must be a string", key)
    if len(given) + len(others) > 1:
        names = given + list(others)
        raise APIError(f"only one of {', '.join(names)} can constrain the reply", names[-1])
    return (given[0], body[given[0]]) if given else None


def _stream(body: Mapping[str, Any]) -> tuple[bool, bool]:
    stream = _flag(body, "stream")
    options = body.get("stream_options")
    if options is None:
        return stream, False
    if not isinstance(options, Mapping):
        raise APIError("stream_options must be an object", "stream_options")
    if not stream:
        raise APIError("stream_options is only allowed with stream: true", "stream_options")
    include = options.get("include_usage", False)
    if not isinstance(include, bool):
        raise APIError("stream_options.include_usage must be true or false",
                       "stream_options.include_usage")
    return stream, include


def _model(body: Mapping[str, Any]) -> Optional[str]:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise APIError("model must be a string", "model")
    return model


def _text_content(value: Any, where: str, *, allow_null: bool) -> Optional[str]:
    if value is None:
        if allow_null:
            return None
        raise APIError(f"{where} is required", where)
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        pieces = []
        for j, part in enumerate(value):
            if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(
                    part.get("text"), str):
                raise APIError(f"{where}[{j}] must be a text part ({{\"type\": \"text\", \"text\": "
                               f"...}}); other content types are not supported", f"{where}[{j}]")
            pieces.append(part["text"])
        return "".join(pieces)
    raise APIError(f"{where} must be a string or a list of text parts", where)


def _assistant_tool_calls(value: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise APIError(f"{where} must be a list", where)
    calls = []
    for j, call in enumerate(value):
        here = f"{where}[{j}]"
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise APIError(f"{here}.function.name is required", f"{here}.function.name")
        arguments = function.get("arguments", "{}")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError:
                raise APIError(f"{here}.function.arguments is not valid JSON",
                               f"{here}.function.arguments") from None
        if not isinstance(arguments, Mapping):
            raise APIError(f"{here}.function.arguments must be a JSON object",
                           f"{here}.function.arguments")
        entry = {"type": "function", "function": {"name": function["name"], "arguments": dict(arguments)}}
        if isinstance(call.get("id"), str):
            entry["id"] = call["id"]
        calls.append(entry)
    return calls


def _messages(value: Any) -> list[dict[str, Any]]:
    if value is None:
        raise APIError("messages is required", "messages")
    if not isinstance(value, list) or not value:
        raise APIError("messages must be a non-empty list", "messages")
    out = []
    for i, message in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(message, Mapping):
            raise APIError(f"{where} must be an object", where)
        role = message.get("role")
        if role not in ROLES:
            raise APIError(f"{where}.role must be one of {', '.join(ROLES)}, got {json.dumps(role)}",
                           f"{where}.role")
        has_calls = role == "assistant" and message.get("tool_calls")
        content = _text_content(message.get("content"), f"{where}.content", allow_null=role == "assistant")
        entry: dict[str, Any] = {"role": "system" if role == "developer" else role,
                                 "content": content or ""}
        if has_calls:
            entry["tool_calls"] = _assistant_tool_calls(message["tool_calls"], f"{where}.tool_calls")
        elif role == "assistant" and content is None:
            raise APIError(f"{where}.content is required without tool_calls", f"{where}.content")
        if role == "tool":
            call_id = message.get("tool_call_id")
            if call_id is not None and not isinstance(call_id, str):
                raise APIError(f"{where}.tool_call_id must be a string", f"{where}.tool_call_id")
            if call_id is not None:
                entry["tool_call_id"] = call_id
        if isinstance(message.get("name"), str):
            entry["name"] = message["name"]
        if role == "assistant" and isinstance(message.get("reasoning_content"), str):
            entry["reasoning_content"] = message["reasoning_content"]  # Qwen3's templates read it
        out.append(entry)
    return out


def listed_tools(value: Any) -> list[tuple[str, Any]]:
    """A request's ``tools`` as (the entry's path in the request, the entry); absent: []."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise APIError("tools must be a list", "tools")
    return [(f"tools[{i}]", tool) for i, tool in enumerate(value)]


def _tools(value: Any) -> Optional[list[dict[str, Any]]]:
    out = []
    for where, tool in listed_tools(value):
        if not isinstance(tool, Mapping) or tool.get("type", "function") != "function":
            raise APIError(f"{where} must be an object with type \"function\"", where)
        function = tool.get("function")
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str) \
                or not function["name"]:
            raise APIError(f"{where}.function.name is required", f"{where}.function.name")
        parameters = function.get("parameters")
        if parameters is not None and not isinstance(parameters, Mapping):
            raise APIError(f"{where}.function.parameters must be a JSON schema object",
                           f"{where}.function.parameters")
        out.append({"type": "function", "function": dict(function)})
    return out or None


def _response_format(body: Mapping[str, Any]) -> Optional[dict[str, Any]]:
    format_ = body.get("response_format")
    if format_ is not None and not (isinstance(format_, Mapping) and format_.get("type") in FORMATS):
        raise APIError(f"response_format.type must be one of {', '.join(FORMATS)}", "response_format")
    return None if format_ is None else dict(format_)


def parse_chat_request(body: Any) -> ChatRequest:
    body = _require_object(body)
    messages = _messages(body.get("messages"))
    tools = _tools(body.get("tools"))
    choice = body.get("tool_choice")
    if choice is not None and not (choice in ("none", "auto", "required") or (
            isinstance(choice, Mapping) and choice.get("type") == "function")):
        raise APIError("tool_choice must be \"none\", \"auto\", \"required\" or a function",
                       "tool_choice")
    if choice == "none":
        tools = None
    format_ = _response_format(body)
    if format_ is not None and format_.get("type") != "text" and choice not in (None, "none", "auto"):
        raise APIError("response_format and tool_choice cannot both constrain the reply", "tool_choice")
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise APIError("parallel_tool_calls must be true or false", "parallel_tool_calls")
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, Mapping):
        raise APIError("chat_template_kwargs must be an object", "chat_template_kwargs")
    reserved = {"messages", "tools", "tokenize", "add_generation_prompt"} & set(kwargs)
    if reserved:
        raise APIError(f"chat_template_kwargs must not set {', '.join(sorted(reserved))}",
                       "chat_template_kwargs")
    grammar = _grammar(body, *(["response_format"] if format_ is not None and format_.get("type") != "text" else []),
                       *(["tool_choice"] if choice not in (None, "none", "auto") else []))
    stream, include_usage = _stream(body)
    separate = body.get("separate_reasoning", True)
    if not isinstance(separate, bool):
        raise APIError(f"separate_reasoning must be true or false, got {json.dumps(separate)}",
                       "separate_reasoning")
    return ChatRequest(_model(body), messages, tools, tools is not None, _sampling(body, chat=True),
                       stream, include_usage, dict(kwargs), separate,
                       format_, choice, parallel, grammar)


def parse_completion_request(body: Any) -> CompletionRequest:
    body = _require_object(body)
    prompt = body.get("prompt")
    if prompt is None:
        raise APIError("prompt is required", "prompt")
    if isinstance(prompt, str):
        prompts: list[Union[str, list[int]]] = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, int) and not isinstance(p, bool)
                                                     for p in prompt):
        prompts = [list(prompt)]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        prompts = list(prompt)
    elif isinstance(prompt, list) and prompt and all(
            isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p)
            for p in prompt):
        prompts = [list(p) for p in prompt]
    else:
        raise APIError("prompt must be a string, a list of strings, a list of token ids or a list "
                       "of lists of token ids (non-empty)", "prompt")
    stream, include_usage = _stream(body)
    format_ = _response_format(body)
    grammar = _grammar(body, *(["response_format"] if format_ is not None and format_.get("type") != "text" else []))
    return CompletionRequest(_model(body), prompts, _sampling(body, chat=False),
                             _flag(body, "echo"), stream, include_usage, format_, grammar)


# ---------------------------------------------------------------------------- responses

def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def chat_message(text: str, *, parse_tools: bool,
                 tools: Optional[Sequence[Mapping[str, Any]]] = None) -> tuple[dict[str, Any], bool]:
    """The assistant message for generated ``text``, and whether it carries tool calls.

    With ``parse_tools``, well-formed native tool calls become ``tool_calls`` (``arguments`` as a
    JSON string, fresh ``call_...`` ids) and leave ``content`` (``None`` when nothing else was
    said); malformed ones stay in ``content`` as the model wrote them.
    """
    if parse_tools and tool_parser.has_tool_call(text):
        parsed = tool_parser.parse(text, tools)
        if parsed.calls:
            calls = [{"id": new_id("call").replace("-", "_"), "type": "function",
                      "function": {"name": c.name, "arguments": c.arguments_json()}}
                     for c in parsed.calls]
            return {"role": "assistant", "content": parsed.content or None, "tool_calls": calls}, True
    return {"role": "assistant", "content": text}, False


def chat_choice(index: int, text: str, finish_reason: str, *, parse_tools: bool,
                tools: Optional[Sequence[Mapping[str, Any]]] = None,
                logprobs: Optional[list[dict[str, Any]]] = None,
                reasoning: Optional[ReasoningSplit] = None) -> dict[str, Any]:
    """One ``choices[i]`` of a chat completion; a "stop" ``finish_reason`` becomes "tool_calls" when
    the message carries calls ("length" stays: SGLang's ``serving_chat.py`` changes only "stop").
    With ``reasoning`` (the reply separated by the server's reasoning parser) the message carries
    ``reasoning_content`` and tool calls are read from the answer only; an empty answer is ``""``
    as SGLang sends it (``null`` next to tool calls, as before)."""
    if reasoning is None:
        message, called = chat_message(text, parse_tools=parse_tools, tools=tools)
    else:
        message, called = chat_message(reasoning.answer, parse_tools=parse_tools, tools=tools)
        message["reasoning_content"] = reasoning.reasoning
    return {"index": index, "message": message,
            "logprobs": None if logprobs is None else {"content": logprobs},
            "finish_reason": chat_finish_reason(called, finish_reason)}


def chat_finish_reason(called: bool, finish_reason: Optional[str]) -> Optional[str]:
    """A chat choice's ``finish_reason``, streamed or not: "stop" becomes "tool_calls" when the
    message carries calls; "length" stays (a call cut by ``max_tokens``), as SGLang's chat server
    does."""
    return "tool_calls" if called and finish_reason == "stop" else finish_reason


def completion_choice(index: int, text: str, finish_reason: str,
                      logprobs: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
