"""The Responses API (``POST /v1/responses``) as a second wire format for the chat path.

A Responses request is translated into the chat-completions request that asks for the same
generation (``to_chat``), answered by the server's chat endpoint (``ModelService``: the chat
template, SGLang's tool-call rules, the reasoning parser, constrained decoding), and the answer is
translated back: a whole ``response`` object (``response_object``) or, with ``stream: true``, the
Responses API's typed server-sent events (``ResponseEvents``), read off the chat chunks as they
come. Nothing here generates or parses model text; it only maps shapes (the openai package's
``types/responses`` are the reference for every field).

Input: a string (one user turn) or a list of items: messages (``user`` / ``system`` /
``developer`` / ``assistant``; string content or ``input_text`` / ``output_text`` parts),
``function_call`` items (joined to the assistant turn they follow, as the chat history's
``tool_calls``), ``function_call_output`` items (``tool`` messages) and ``reasoning`` items (the
next assistant turn's ``reasoning_content``); ``instructions`` is a system message in front.
Function ``tools`` in the Responses API's flat shape, ``tool_choice`` and ``parallel_tool_calls``
as chat takes them,
``temperature``, ``top_p``, ``max_output_tokens``, ``text.format`` (chat's ``response_format``),
``include: ["message.output_text.logprobs"]`` with ``top_logprobs``; the extension fields ``seed``,
``top_k`` and ``chat_template_kwargs`` pass through. This server keeps no responses: ``store`` must
be false or absent, and ``previous_response_id``, ``conversation``, ``background``, ``prompt`` and
``item_reference`` inputs are refused with a 400 naming the field, as are other tool types.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable, Mapping, Optional

from .http import Response, StreamResponse, json_bytes
from .protocol import APIError, listed_tools

ChatEndpoint = Callable[[Any], Awaitable["Response | StreamResponse"]]

LOGPROBS_INCLUDE = "message.output_text.logprobs"
# include values that ask for nothing this server has (no encrypted reasoning: reasoning items
# carry their text in ``content``); accepted and ignored
IGNORED_INCLUDES = ("reasoning.encrypted_content",)
_REFUSED: dict[str, str] = {  # field: why (refused unless null / absent)
    "previous_response_id": "previous_response_id is not supported: this server keeps no responses; "
                            "send the whole conversation in input",
    "conversation": "conversation is not supported: this server keeps no conversations",
    "prompt": "prompt (stored prompt templates) is not supported",
    "max_tool_calls": "max_tool_calls is not supported",
    "context_management": "context_management is not supported",
}
_PASSED = ("model", "temperature", "top_p", "parallel_tool_calls", "seed", "top_k",
           "chat_template_kwargs")


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


@dataclass
class Translated:
    """A Responses request as a chat-completions body, and what the response object echoes."""

    chat: dict[str, Any]
    echo: dict[str, Any]
    stream: bool
    logprobs: bool
    message_input: list[int] = field(default_factory=list)  # chat message k came from input[i]


# ---------------------------------------------------------------------------- request

def _text_parts(value: Any, where: str, allowed: tuple[str, ...]) -> str:
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise APIError(f"{where} must be a string or a list of content parts", where)
    pieces = []
    for j, part in enumerate(value):
        kind = part.get("type") if isinstance(part, Mapping) else None
        text = part.get("text", part.get("refusal")) if isinstance(part, Mapping) else None
        if kind not in allowed or not isinstance(text, str):
            raise APIError(f"{where}[{j}] must be a text part ({' or '.join(allowed)}); got type "
                           f"{json.dumps(kind)}: only text input is supported", f"{where}[{j}]")
        pieces.append(text)
    return "".join(pieces)


def _messages(body: Mapping[str, Any]) -> tuple[list[dict[str, Any]], list[int]]:
    """Chat messages for ``instructions`` + ``input``, and the input index of each (-1:
    instructions)."""
    messages: list[dict[str, Any]] = []
    origin: list[int] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise APIError("instructions must be a string", "instructions")
        messages.append({"role": "system", "content": instructions})
        origin.append(-1)
    value = body.get("input")
    if value is None:
        raise APIError("input is required", "input")
    if isinstance(value, str):
        return messages + [{"role": "user", "content": value}], origin + [0]
    if not isinstance(value, list):
        raise APIError("input must be a string or a list of input items", "input")
    names: dict[str, str] = {}  # call_id -> function name
    reasoning: Optional[str] = None  # a reasoning item's text, for the next assistant turn

    def assistant(i: int, open_turn: bool) -> dict[str, Any]:
        nonlocal reasoning
        last = messages[-1] if messages else None
        if open_turn and last is not None and last["role"] == "assistant":
            target = last
        else:
            target = {"role": "assistant", "content": ""}
            messages.append(target)
            origin.append(i)
        if reasoning is not None:
            target["reasoning_content"] = reasoning
            reasoning = None
        return target

    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, Mapping):
            raise APIError(f"{where} must be an object", where)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise APIError(f"{where}.role must be one of user, system, developer, assistant, "
                               f"got {json.dumps(role)}", f"{where}.role")
            allowed = ("output_text", "refusal") if role == "assistant" else ("input_text",)
            text = _text_parts(item.get("content"), f"{where}.content", allowed)
            if role == "assistant":
                turn = assistant(i, open_turn=False)
                turn["content"] = text
            else:
                messages.append({"role": "system" if role == "developer" else role, "content": text})
                origin.append(i)
        elif kind == "function_call":
            name, call_id = item.get("name"), item.get("call_id")
            if not isinstance(name, str) or not name:
                raise APIError(f"{where}.name is required", f"{where}.name")
            if not isinstance(call_id, str) or not call_id:
                raise APIError(f"{where}.call_id is required", f"{where}.call_id")
            arguments = item.get("arguments", "{}")
            if not isinstance(arguments, str):
                raise APIError(f"{where}.arguments must be a JSON string", f"{where}.arguments")
            turn = assistant(i, open_turn=True)
            turn.setdefault("tool_calls", []).append(
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}})
            names[call_id] = name
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or not call_id:
                raise APIError(f"{where}.call_id is required", f"{where}.call_id")
            output = _text_parts(item.get("output"), f"{where}.output", ("input_text",))
            message = {"role": "tool", "tool_call_id": call_id, "content": output}
            if call_id in names:
                message["name"] = names[call_id]
            messages.append(message)
            origin.append(i)
        elif kind == "reasoning":
            parts = item.get("content") or []
            if not isinstance(parts, list):
                raise APIError(f"{where}.content must be a list", f"{where}.content")
            text = "".join(p.get("text", "") for p in parts if isinstance(p, Mapping)
                           and p.get("type") == "reasoning_text" and isinstance(p.get("text"), str))
            reasoning = text or None
        elif kind == "item_reference":
            raise APIError(f"{where}: item_reference is not supported: this server keeps no "
                           "items; send the item itself", f"{where}.type")
        else:
            raise APIError(f"{where}.type {json.dumps(kind)} is not supported; input items may be "
                           "message, function_call, function_call_output or reasoning",
                           f"{where}.type")
    if not messages or all(m["role"] == "system" for m in messages):
        raise APIError("input has no turn to answer", "input")
    return messages, origin


def _tools(value: Any) -> Optional[list[dict[str, Any]]]:
    if value is None:
        return None
    out = []
    for where, tool in listed_tools(value):
        kind = tool.get("type") if isinstance(tool, Mapping) else None
        if kind != "function":
            raise APIError(f"{where}.type {json.dumps(kind)} is not supported; only function tools "
                           "are", f"{where}.type")
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            raise APIError(f"{where}.name is required", f"{where}.name")
        function = {k: tool[k] for k in ("name", "description", "parameters", "strict")
                    if tool.get(k) is not None}
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(value: Any) -> Any:
    if value is None or value in ("none", "auto", "required"):
        return value
    if isinstance(value, Mapping) and value.get("type") == "function":
        if not isinstance(value.get("name"), str):
            raise APIError("tool_choice.name is required", "tool_choice.name")
        return {"type": "function", "function": {"name": value["name"]}}
    raise APIError("tool_choice must be \"none\", \"auto\", \"required\" or "
                   "{\"type\": \"function\", \"name\": ...}", "tool_choice")


def _text_format(text: Any) -> Optional[dict[str, Any]]:
    """``text.format`` as chat's ``response_format`` (None: plain text)."""
    if text is None:
        return None
    if not isinstance(text, Mapping):
        raise APIError("text must be an object", "text")
    format_ = text.get("format")
    if format_ is None or (isinstance(format_, Mapping) and format_.get("type") == "text"):
        return None
    if not isinstance(format_, Mapping):
        raise APIError("text.format must be an object", "text.format")
    if format_.get("type") == "json_schema":
        schema = {k: format_[k] for k in ("name", "description", "schema", "strict")
                  if format_.get(k) is not None}
        return {"type": "json_schema", "json_schema": schema}
    return dict(format_)


def to_chat(body: Any) -> Translated:
    """The chat-completions body for a Responses request (``APIError`` naming the field)."""
    if not isinstance(body, Mapping):
        raise APIError("the request body must be a JSON object")
    for key, why in _REFUSED.items():
        if body.get(key) is not None:
            raise APIError(why, key)
    if body.get("store") not in (None, False):
        raise APIError("store: true is not supported: this server keeps no responses (send "
                       "store: false or leave it out)", "store")
    if body.get("background") not in (None, False):
        raise APIError("background: true is not supported", "background")
    if body.get("truncation") not in (None, "disabled"):
        raise APIError("truncation: only \"disabled\" is supported", "truncation")
    reasoning = body.get("reasoning")
    if reasoning is not None and (not isinstance(reasoning, Mapping)
                                  or reasoning.get("effort") is not None):
        raise APIError("reasoning.effort is not supported; a thinking model's switch is "
                       "chat_template_kwargs {\"enable_thinking\": ...}", "reasoning.effort")
    include = body.get("include") or []
    if not isinstance(include, list) or not all(isinstance(v, str) for v in include):
        raise APIError("include must be a list of strings", "include")
    unknown = [v for v in include if v != LOGPROBS_INCLUDE and v not in IGNORED_INCLUDES]
    if unknown:
        raise APIError(f"include {json.dumps(unknown[0])} is not supported; supported: "
                       f"{LOGPROBS_INCLUDE}, {', '.join(IGNORED_INCLUDES)}", "include")
    max_out = body.get("max_output_tokens")
    if max_out is not None and (isinstance(max_out, bool) or not isinstance(max_out, int)
                                or max_out < 1):
        raise APIError(f"max_output_tokens must be an integer >= 1, got {json.dumps(max_out)}",
                       "max_output_tokens")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise APIError(f"stream must be true or false, got {json.dumps(stream)}", "stream")
    messages, origin = _messages(body)
    tools = _tools(body.get("tools"))
    chat: dict[str, Any] = {k: body[k] for k in _PASSED if body.get(k) is not None}
    chat["messages"] = messages
    if tools:
        chat["tools"] = tools
    choice = _tool_choice(body.get("tool_choice"))
    if choice is not None:
        chat["tool_choice"] = choice
    if max_out is not None:
        chat["max_tokens"] = max_out
    response_format = _text_format(body.get("text"))
    if response_format is not None:
        chat["response_format"] = response_format
    logprobs = LOGPROBS_INCLUDE in include  # log-probs come back only when included
    if logprobs:
        chat["logprobs"] = True
        if body.get("top_logprobs") is not None:
            chat["top_logprobs"] = body["top_logprobs"]
    if stream:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    echo = {
        "instructions": body.get("instructions"),
        "max_output_tokens": max_out,
        "metadata": body.get("metadata") or {},
        "parallel_tool_calls": body.get("parallel_tool_calls", True) is not False,
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "tool_choice": body.get("tool_choice") or "auto",
        "tools": list(body.get("tools") or []),
        "text": {"format": (body.get("text") or {}).get("format") or {"type": "text"}},
        "top_logprobs": body.get("top_logprobs"),
        "user": body.get("user"),
    }
    return Translated(chat, echo, stream, logprobs, origin)


_PARAMS = {"max_tokens": "max_output_tokens", "logprobs": "include", "stream_options": "stream"}


def _param(param: Optional[str], translated: Translated) -> Optional[str]:
    """A chat error's ``param`` in the Responses request's terms."""
    if param is None:
        return None
    head, dot, rest = param.partition(".")
    if head == "response_format":  # chat's json_schema object is text.format itself here
        rest = rest.removeprefix("json_schema").lstrip(".")
        return "text.format" + ("." + rest if rest else "")
    if head in _PARAMS:
        return _PARAMS[head]
    if param.startswith("messages"):
        try:
            k = int(param[len("messages["):param.index("]")])
            i = translated.message_input[k]
        except (ValueError, IndexError):
            return "input"
        return "instructions" if i < 0 else f"input[{i}]"
    if param.startswith(("tools[", "tool_choice.")) and ".function." in param:
        return param.replace(".function.", ".", 1)  # the Responses API's flat tool shape
    return param


def _mapped(error: APIError, translated: Translated) -> APIError:
    return APIError(error.message, _param(error.param, translated), error.status, error.kind,
                    error.code)


# ---------------------------------------------------------------------------- response

def response_object(translated: Translated, model: str, *, response_id: str, created: float,
                    status: str, output: list[dict[str, Any]],
                    usage: Optional[dict[str, int]] = None,
                    error: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """A ``response`` object (openai ``types.responses.Response``)."""
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    return {
        "id": response_id, "object": "response", "created_at": created, "status": status,
        "completed_at": time.time() if status == "completed" else None,
        "error": error, "incomplete_details": incomplete, "model": model, "output": output,
        "previous_response_id": None, "reasoning": None, "store": False,
        "truncation": "disabled", "background": False,
        "usage": None if usage is None else _usage(usage),
        **translated.echo,
    }


def _usage(chat_usage: Mapping[str, int]) -> dict[str, Any]:
    # reasoning tokens are not counted apart (as in chat usage); no prompt cache is reported
    return {"input_tokens": chat_usage["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": chat_usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": chat_usage["total_tokens"]}


def _logprobs(entries: Optional[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    return [{"token": e["token"], "logprob": e["logprob"], "bytes": e.get("bytes") or [],
             "top_logprobs": [{"token": t["token"], "logprob": t["logprob"],
                               "bytes": t.get("bytes") or []} for t in e.get("top_logprobs") or []]}
            for e in entries or []]


def reasoning_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {"id": item_id, "type": "reasoning", "summary": [], "status": status,
            "content": [{"type": "reasoning_text", "text": text}] if status == "completed" else []}


def text_part(text: str, logprobs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}


def message_item(item_id: str, parts: list[dict[str, Any]], status: str) -> dict[str, Any]:
    return {"id": item_id, "type": "message", "role": "assistant", "status": status,
            "content": parts}


def call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {"id": item_id, "type": "function_call", "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


def output_items(choice: Mapping[str, Any], logprobs: bool) -> list[dict[str, Any]]:
    """A chat choice as Responses output items: reasoning, the message, the function calls."""
    message = choice["message"]
    items = []
    if message.get("reasoning_content"):
        items.append(reasoning_item(new_id("rs"), message["reasoning_content"], "completed"))
    calls = message.get("tool_calls") or []
    status = "incomplete" if choice.get("finish_reason") == "length" else "completed"
    if message.get("content") or not calls:
        entries = _logprobs((choice.get("logprobs") or {}).get("content")) if logprobs else []
        items.append(message_item(new_id("msg"), [text_part(message.get("content") or "", entries)],
                                  status))
    for call in calls:
        items.append(call_item(new_id("fc"), call["id"], call["function"]["name"],
                               call["function"]["arguments"], "completed"))
    return items


# ---------------------------------------------------------------------------- the endpoint

async def create(body: Any, chat: ChatEndpoint, model: str) -> Response | StreamResponse:
    """Answer a Responses request through ``chat`` (the chat-completions handler)."""
    translated = to_chat(body)
    try:
        answer = await chat(translated.chat)
    except APIError as exc:
        raise _mapped(exc, translated) from None
    if isinstance(answer, StreamResponse):
        return StreamResponse(ResponseEvents(translated, model).run(answer.chunks))
    data = json.loads(answer.body)
    if answer.status != 200:
        error = data.get("error") or {}
        raise _mapped(APIError(error.get("message", "error"), error.get("param"), answer.status,
                               error.get("type", "invalid_request_error"), error.get("code")),
                      translated)
    choice = data["choices"][0]
    status = "incomplete" if choice.get("finish_reason") == "length" else "completed"
    return Response.json(response_object(
        translated, data.get("model", model), response_id=new_id("resp"), created=time.time(),
        status=status, output=output_items(choice, translated.logprobs), usage=data.get("usage")))


class ResponseEvents:
    """Chat-completion chunks in, the Responses API's events out (``event: TYPE`` + ``data:``).

    ``response.created`` and ``response.in_progress``; per output item ``output_item.added``,
    its parts and deltas (``reasoning_text.delta``, ``output_text.delta``,
    ``function_call_arguments.delta``), their ``.done`` events and ``output_item.done``; then
    ``response.completed`` (``response.incomplete`` when ``max_output_tokens`` ran out,
    ``response.failed`` at an engine error) carrying the whole response. Items follow each
    other as the chat stream's deltas change kind (reasoning, content, tool calls)."""

    def __init__(self, translated: Translated, model: str) -> None:
        self.translated = translated
        self.model = model
        self.id = new_id("resp")
        self.created = time.time()
        self.sequence = 0
        self.output: list[dict[str, Any]] = []
        self._open: Optional[dict[str, Any]] = None  # the item receiving deltas
        self._text = ""
        self._logprobs: list[dict[str, Any]] = []

    def _event(self, kind: str, **fields: Any) -> bytes:
        value = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return (f"event: {kind}\ndata: ".encode("utf-8")
                + json_bytes(value) + b"\n\n")

    def _response(self, status: str, usage: Optional[dict[str, int]] = None,
                  error: Optional[dict[str, Any]] = None) -> dict[str, Any]:
        return response_object(self.translated, self.model, response_id=self.id,
                               created=self.created, status=status, output=list(self.output),
                               usage=usage, error=error)

    def _where(self) -> dict[str, Any]:
        return {"item_id": self._open["id"], "output_index": len(self.output)}

    def _start(self, kind: str) -> list[bytes]:
        if self._open is not None and self._open["type"] == kind:
            return []
        events = self._close("completed")
        item_id = new_id({"reasoning": "rs", "message": "msg"}[kind])
        self._open = (reasoning_item(item_id, "", "in_progress") if kind == "reasoning"
                      else message_item(item_id, [], "in_progress"))
        self._text, self._logprobs = "", []
        part = ({"type": "reasoning_text", "text": ""} if kind == "reasoning"
                else text_part("", []))
        events.append(self._event("response.output_item.added", output_index=len(self.output),
                                  item=self._open))
        events.append(self._event("response.content_part.added", content_index=0, part=part,
                                  **self._where()))
        return events

    def _close(self, status: str) -> list[bytes]:
        if self._open is None:
            return []
        events = []
        if self._open["type"] == "reasoning":
            events.append(self._event("response.reasoning_text.done", content_index=0,
                                      text=self._text, **self._where()))
            part = {"type": "reasoning_text", "text": self._text}
            item = reasoning_item(self._open["id"], self._text, "completed")
        else:
            events.append(self._event("response.output_text.done", content_index=0,
                                      text=self._text, logprobs=self._logprobs, **self._where()))
            part = text_part(self._text, self._logprobs)
            item = message_item(self._open["id"], [part], status)
        events.append(self._event("response.content_part.done", content_index=0, part=part,
                                  **self._where()))
        events.append(self._event("response.output_item.done", output_index=len(self.output),
                                  item=item))
        self.output.append(item)
        self._open = None
        return events

    def _delta(self, delta: Mapping[str, Any], logprobs: list[dict[str, Any]]) -> list[bytes]:
        events: list[bytes] = []
        if delta.get("reasoning_content"):
            events += self._start("reasoning")
            self._text += delta["reasoning_content"]
            events.append(self._event("response.reasoning_text.delta", content_index=0,
                                      delta=delta["reasoning_content"], **self._where()))
        if delta.get("content"):
            events += self._start("message")
            self._text += delta["content"]
            self._logprobs += logprobs
            events.append(self._event("response.output_text.delta", content_index=0,
                                      delta=delta["content"], logprobs=logprobs, **self._where()))
        for call in delta.get("tool_calls") or []:
            events += self._close("completed")
            function = call["function"]
            item = call_item(new_id("fc"), call["id"], function["name"], "", "in_progress")
            index = len(self.output)
            events.append(self._event("response.output_item.added", output_index=index, item=item))
            events.append(self._event("response.function_call_arguments.delta", item_id=item["id"],
                                      output_index=index, delta=function["arguments"]))
            events.append(self._event("response.function_call_arguments.done", item_id=item["id"],
                                      output_index=index, arguments=function["arguments"]))
            item = {**item, "arguments": function["arguments"], "status": "completed"}
            events.append(self._event("response.output_item.done", output_index=index, item=item))
            self.output.append(item)
        return events

    async def run(self, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        yield self._event("response.created", response=self._response("in_progress"))
        yield self._event("response.in_progress", response=self._response("in_progress"))
        finish: Optional[str] = None
        buffer = b""
        try:
            async for raw in chunks:
                buffer += raw
                while b"\n\n" in buffer:
                    line, buffer = buffer.split(b"\n\n", 1)
                    if not line.startswith(b"data: ") or line == b"data: [DONE]":
                        continue
                    data = json.loads(line[len(b"data: "):])
                    if "error" in data:
                        for event in self._close("incomplete"):
                            yield event
                        error = {"code": "server_error", "message": data["error"].get("message", "")}
                        yield self._event("response.failed",
                                          response=self._response("failed", error=error))
                        return
                    for choice in data.get("choices") or []:
                        logprobs = _logprobs((choice.get("logprobs") or {}).get("content")) \
                            if self.translated.logprobs else []
                        for event in self._delta(choice.get("delta") or {}, logprobs):
                            yield event
                        finish = choice.get("finish_reason") or finish
                    if data.get("usage"):
                        status = "incomplete" if finish == "length" else "completed"
                        if self._open is None and not self.output:
                            for event in self._start("message"):
                                yield event
                        for event in self._close(status):
                            yield event
                        kind = "response.incomplete" if status == "incomplete" else "response.completed"
                        yield self._event(kind, response=self._response(status, data["usage"]))
        finally:
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                await aclose()
