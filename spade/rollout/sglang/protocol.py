"""SGLang's native HTTP protocol: our dataclasses to SGLang JSON and back (pure functions, no I/O).

This module: the endpoint table, the errors, and ``/generate`` (request, answer, stream).
``control_protocol``: the control endpoints' bodies and answers; ``tensor_payload``: the
globals a serialized tensor payload may name.

Everything here was written by reading SGLang's source, none of it copied. It was checked against
the source of the release spade pins, the ``sglang==0.5.23`` wheel from PyPI (paths below are inside
that package, ``sglang/...``), and ``tests/rollout/test_sglang_upstream.py`` keeps it so with that wheel's
own code (``make sglang-src``): every route and method in ``ENDPOINTS`` is in its HTTP server's
route table, every body the client sends parses into the route's ``io_struct`` request with no
unknown key, and the ``meta_info`` keys read here are keys its tokenizer manager writes:

* ``/generate`` request. Routed in ``srt/entrypoints/http_server.py`` (``generate_request``): the
  raw body first passes a schema gate (``srt/entrypoints/api_contract.py`` ->
  ``api/v1/api_types.py::GenerateRequest``, which ignores unknown top-level keys but **rejects
  unknown keys inside ``sampling_params``** with HTTP 400 ``{"error": "<text>"}``), then is parsed
  into ``srt/managers/io_struct.py::GenerateReqInput`` (``input_ids``, ``sampling_params``, ``rid``,
  ``return_logprob``, ``logprob_start_len`` with ``-1`` = output tokens only, ``stream``). Sampling
  fields: ``srt/sampling/sampling_params.py::SamplingParams`` (``temperature``, ``top_p``,
  ``top_k`` where ``-1`` means the whole vocabulary, ``max_new_tokens``, ``stop_token_ids``,
  ``ignore_eos``, ``no_stop_trim``, ``sampling_seed``). A temperature below ``1e-6`` becomes
  ``top_k = 1, temperature = 1``: greedy, with log-probs at ``T = 1``, which is what ``spade.rollout.engine``
  specifies.
* ``/generate`` response. With ``--skip-tokenizer-init`` the scheduler hands token ids straight to
  the tokenizer manager (``BatchTokenIDOutput``) and ``srt/managers/tokenizer_manager.py``
  (``_handle_batch_output``) answers ``{"output_ids", "meta_info"}`` (no ``"text"`` key; a
  tokenizer-backed server adds one). ``meta_info`` holds ``id`` (the rid), ``finish_reason``,
  ``prompt_tokens``, ``weight_version`` (a *string*; ``ServerArgs.weight_version``, default
  ``"default"``, replaced by the ``weight_version`` of a successful weight update),
  ``weight_versions`` (``[{"version", "start", "end"}]``: which version produced which slice of
  the output, more than one span only when an update landed mid-request), ``num_retractions``,
  ``reasoning_tokens``, ``completion_tokens``, ``cached_tokens``, and with ``return_logprob``
  ``input_token_logprobs``, ``output_token_logprobs`` as ``[logprob, token_id, null]`` triples
  (the text slot is ``null`` without a tokenizer) and ``output_token_logprobs_length``.
  ``output_ids`` always include a matched stop token (``output_ids_through_stop``).
* ``/generate`` with ``"stream": true`` (``http_server.py::serve_generate_request``) answers
  ``text/event-stream``: one ``data: <json>\n\n`` event per output of the tokenizer manager's
  ``_stream_one_response``, then ``data: [DONE]\n\n``; an error raised mid-stream becomes
  ``data: {"error": {"message", "type", "code", ...}}`` before the ``[DONE]``. Each event has the
  same shape as the non-streaming answer, with ``meta_info.finish_reason`` ``null`` until the last
  one. By default the events are *cumulative*: ``output_ids`` and
  ``meta_info.output_token_logprobs`` hold everything generated so far, and a slow reader gets
  only the newest state (older events are dropped, not queued). A server started with
  ``--incremental-streaming-output`` sends *deltas* instead: the ids and log-probs since the
  previous event (queued events are concatenated). In both modes ``meta_info.completion_tokens``
  counts all ids so far, which is how ``StreamProgress`` tells the two apart. A stream abort whose
  ``status_code`` is 400 or more is the request's error. A client that disconnects has its request
  aborted by the server two seconds after the response ends (``create_abort_task``); our client
  also posts ``/abort_request`` at once.
* ``finish_reason``: ``srt/managers/schedule_batch.py`` ``FINISH_*.to_json()``:
  ``{"type": "stop", "matched": <token id | [token ids] | str>}``, ``{"type": "length",
  "length": n}``, ``{"type": "abort", "message", "status_code", "err_type"}``; an abort in the
  waiting queue (``tokenizer_manager.py::_handle_abort_req``) has only ``type`` and ``message``.
  An abort with ``status_code >= 400`` is not a result but an HTTP error (below).
* errors of ``/generate``: HTTP 400 ``{"error": "<schema text>"}`` (contract gate); HTTP 400 (or the
  error's own status) ``{"error": {"message": ...}}`` (``http_server.py::_create_error_response``);
  other statuses ``{"object": "error", "message", "type", "param", "code"}`` (FastAPI exceptions,
  ``srt/entrypoints/openai/protocol.py::ErrorResponse``).
* control endpoints: ``srt/entrypoints/http_server.py`` (routes), bodies from ``io_struct.py``
  (msgspec structs; unknown keys are ignored, a ``str`` field does not accept a number). See
  ``ENDPOINTS`` below and the ``*_payload`` builders in ``control_protocol``.

Weight updates need a session in 0.5.23: ``/update_weights_from_tensor`` and
``/update_weights_from_distributed`` answer ``success: false`` unless they run between
``/begin_weight_update`` and ``/end_weight_update``
(``srt/managers/scheduler_components/weight_updater.py``). ``/init_weights_update_group``,
``/update_weights_from_*`` refuse servers started with ``--dp-size > 1`` (an assertion: HTTP 500).

Routed experts (routing replay, ``loss.routing_replay: rollout``): a server started with
``--enable-return-routed-experts`` (``arg_groups/fields/exec_.py``) answers a body with
``"return_routed_experts": true`` (``io_struct.GenerateReqInput``) with ``meta_info.routed_experts``:
base64 of the int32 expert ids of positions ``[routed_experts_start_len, seqlen - 1)`` (start 0 by
default: every prompt and output token but the last), ``[tokens, num_hidden_layers, top_k]``
(``state_capturer/routed_experts.py``, ``tokenizer_manager.py``). The ids come from the token
slots of the KV cache, so tokens served from the prefix cache keep the routing they were computed
with. A server without the flag silently returns no field, which ``parse_generate_response`` refuses.

Which log-probs SGLang returns (``srt/layers/sampler.py``, ``Sampler.forward``): on the default
path the log of ``softmax(logits / T)`` over the full vocabulary, taken before top-k/top-p
filtering (the filters work on copies), the distribution ``spade.rollout.engine`` specifies (details there).
``SGLANG_RETURN_ORIGINAL_LOGPROB`` ("1"/"true") would make them ``T = 1`` log-probs: the launcher
sets it to "0" (``deployment.SERVER_ENV_DEFAULTS``) and ``engine.sglang.server_env`` refuses
it. A GPU check against ``spade.rl.logprobs`` still has to confirm the numbers on real hardware.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional, Sequence

from ..engine import FinishReason, GenerationChunk, GenerationRequest, GenerationResult
from ...rl.routing_record import RoutedExperts, RoutingShape

SGLANG_REFERENCE = (
    "sglang==0.5.23 (PyPI wheel): srt/entrypoints/http_server.py, srt/entrypoints/api_contract.py, "
    "api/v1/api_types.py, srt/managers/io_struct.py, srt/sampling/sampling_params.py, "
    "srt/managers/tokenizer_manager.py, srt/managers/tokenizer_control_mixin.py, "
    "srt/managers/schedule_batch.py, srt/managers/scheduler_components/weight_updater.py, "
    "srt/utils/common.py (MultiprocessingSerializer, SafeUnpickler, init_custom_process_group)"
)
# The weight-update session (/begin_weight_update, /end_weight_update) and /server_info are new
# relative to the 0.4/early-0.5 servers this module was first written for; nothing older than the
# pinned release has been checked.
SGLANG_MIN_VERSION = "0.5.23"

# name -> (HTTP method, path). All POST bodies are JSON objects.
ENDPOINTS: dict[str, tuple[str, str]] = {
    "generate": ("POST", "/generate"),
    # Both run a one-token generation unless the server has
    # SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=0 (then /health is a plain liveness check); 503 while
    # starting, and after 20 s without scheduler output (e.g. while generation is paused).
    "health": ("GET", "/health"),
    "health_generate": ("GET", "/health_generate"),
    # 200 when the server takes new requests (not paused, healthy), 503 otherwise; no generation.
    "ready": ("GET", "/ready"),
    # The resolved startup configuration (flat ServerArgs fields: "tp_size", "dp_size", ... and
    # "version", the SGLang release). Its "weight_version" is the startup value, not the live one.
    "server_info": ("GET", "/server_info"),
    # Live model facts, among them "weight_version" as changed by weight updates.
    "model_info": ("GET", "/model_info"),
    # Deprecated spellings of the two above (still served by 0.5.23, with a warning in its log).
    "get_server_info": ("GET", "/get_server_info"),
    "get_model_info": ("GET", "/get_model_info"),
    # Plain-text answer; 400 with the reason when requests are still running or queued.
    "flush_cache": ("POST", "/flush_cache"),
    "abort_request": ("POST", "/abort_request"),  # empty 200
    "pause_generation": ("POST", "/pause_generation"),  # {"message", "status": "ok"}
    "continue_generation": ("POST", "/continue_generation"),  # {"message", "status": "ok"}
    "release_memory_occupation": ("POST", "/release_memory_occupation"),  # 200 null
    "resume_memory_occupation": ("POST", "/resume_memory_occupation"),  # 200 null
    # The weight endpoints answer {"success", "message"} with 200, or 400 when success is false.
    "begin_weight_update": ("POST", "/begin_weight_update"),
    "end_weight_update": ("POST", "/end_weight_update"),
    "init_weights_update_group": ("POST", "/init_weights_update_group"),
    "destroy_weights_update_group": ("POST", "/destroy_weights_update_group"),
    "update_weights_from_distributed": ("POST", "/update_weights_from_distributed"),
    "update_weights_from_tensor": ("POST", "/update_weights_from_tensor"),
    # {"success", "message", "new_version"}
    "update_weight_version": ("POST", "/update_weight_version"),
}

_FINISH_TYPES: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}


class SGLangProtocolError(ValueError):
    """An SGLang response did not have the shape this client expects (names the field)."""


class SGLangServerError(RuntimeError):
    """SGLang answered with an error (``{"error": ...}``, ``{"object": "error"}`` or ``success: false``)."""


def error_message(data: Any) -> Optional[str]:
    """The message of an SGLang error body, or None when ``data`` is not one."""
    if not isinstance(data, Mapping):
        return None
    if "error" in data:
        err = data["error"]
        if isinstance(err, Mapping):
            return str(err.get("message", err))
        return str(err)
    if data.get("object") == "error":
        return str(data.get("message", ""))
    return None


# ---------------------------------------------------------------------------------- /generate


def generate_payload(request: GenerationRequest, rid: str, *, stream: bool = False,
                     return_routed_experts: bool = False) -> dict[str, Any]:
    """The ``/generate`` JSON body for one request (token ids in, log-probs of output tokens out;
    ``stream``: as server-sent events, see ``StreamProgress``).

    ``sampling_seed`` is sent when the request has a seed, but SGLang 0.5.23 only uses it on a
    server started with ``--enable-deterministic-inference`` (or ``--rl-on-policy-target``); other
    servers ignore it (``srt/sampling/sampling_batch_info.py``).
    """
    s = request.sampling
    sampling: dict[str, Any] = {
        "temperature": float(s.temperature),  # 0 -> SGLang: greedy (top_k=1, T=1)
        "top_p": float(s.top_p),
        "top_k": -1 if s.top_k is None else int(s.top_k),  # -1: whole vocabulary
        "max_new_tokens": int(s.max_new_tokens),
        # output_ids keep a matched stop token anyway; this keeps it in the detokenized text too,
        # should the server have a tokenizer (our contract: stop token included).
        "no_stop_trim": True,
    }
    if s.stop_token_ids:
        sampling["stop_token_ids"] = list(s.stop_token_ids)
    if s.seed is not None:
        sampling["sampling_seed"] = int(s.seed)
    if s.ignore_eos:
        sampling["ignore_eos"] = True
    if s.constraint is not None:  # json_schema / regex / ebnf / structural_tag, as serving_chat sends them
        sampling[s.constraint.kind] = s.constraint.spec
    # SGLang's own fields with the same definitions (SamplingParams' docstring), sent when set
    for name, off in (("min_p", 0.0), ("frequency_penalty", 0.0), ("presence_penalty", 0.0),
                      ("repetition_penalty", 1.0)):
        if getattr(s, name) != off:
            sampling[name] = float(getattr(s, name))
    payload = {
        "input_ids": list(request.prompt_ids),
        "sampling_params": sampling,
        "rid": str(rid),
        "return_logprob": True,
        "logprob_start_len": -1,  # log-probs of output tokens only
        "stream": bool(stream),
    }
    if s.top_logprobs:
        payload["top_logprobs_num"] = int(s.top_logprobs)  # -> meta_info.output_top_logprobs
    if return_routed_experts or s.return_routed_experts:
        # GenerateReqInput.return_routed_experts -> meta_info.routed_experts (a server started with
        # --enable-return-routed-experts); routed_experts_start_len 0 (its default): every position
        payload["return_routed_experts"] = True
    return payload


def _field(obj: Mapping[str, Any], name: str, where: str) -> Any:
    if name not in obj:
        raise SGLangProtocolError(f"SGLang /generate response: missing field {where}{name!r}")
    return obj[name]


def parse_finish_reason(value: Any) -> FinishReason:
    """``meta_info.finish_reason`` (a ``FINISH_*.to_json()`` dict) -> ``"stop" | "length" | "abort"``."""
    if value is None:
        raise SGLangProtocolError(
            "SGLang /generate response: meta_info.finish_reason is null (the request is not "
            "finished: a stream event read as a whole response?)"
        )
    if isinstance(value, str):  # tolerate a bare type string
        kind = value
    elif isinstance(value, Mapping):
        kind = value.get("type")
    else:
        raise SGLangProtocolError(
            f"SGLang /generate response: meta_info.finish_reason must be an object, got {value!r}"
        )
    if kind not in _FINISH_TYPES:
        raise SGLangProtocolError(
            f"SGLang /generate response: unknown meta_info.finish_reason.type {kind!r} "
            f"(expected one of {sorted(_FINISH_TYPES)})"
        )
    return _FINISH_TYPES[kind]


def parse_weight_version(value: Any, default: int) -> int:
    """SGLang's ``weight_version`` is a free string (default ``"default"``); we set it to ``str(int)``."""
    if value is None or isinstance(value, bool):
        return default
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return default
    raise SGLangProtocolError(
        f"SGLang /generate response: meta_info.weight_version must be a string, got {value!r}"
    )


def parse_weight_versions(spans: Any, default: int) -> Optional[int]:
    """``meta_info.weight_versions`` (``[{"version", "start", "end"}, ...]``, oldest first) -> the
    version of the first span, or None when the field is absent or empty.

    A result reports one weight version. When an update landed while the request was running
    (possible with ``pause_generation`` modes ``retract``/``in_place``), its tokens come from
    several versions; the oldest is the conservative one for staleness accounting.
    """
    if spans is None:
        return None
    if not isinstance(spans, list):
        raise SGLangProtocolError(
            f"SGLang /generate response: meta_info.weight_versions must be a list, got {spans!r}"
        )
    if not spans:
        return None
    first = spans[0]
    if not isinstance(first, Mapping) or "version" not in first:
        raise SGLangProtocolError(
            "SGLang /generate response: meta_info.weight_versions[0] must be an object with a "
            f"'version', got {first!r}"
        )
    return parse_weight_version(first["version"], default)


def _ids(value: Any) -> list[int]:
    if not isinstance(value, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in value
    ):
        raise SGLangProtocolError("SGLang /generate response: output_ids must be a list of ints")
    return value


def _output_logprobs(triples: Any, ids: Sequence[int], start: int) -> list[float]:
    """The log-probs of ``ids`` from ``meta_info.output_token_logprobs`` entries (``start``: the
    index of ``ids[0]`` in the whole output, for messages)."""
    if triples is None:
        if ids:
            raise SGLangProtocolError(
                "SGLang /generate response: missing field meta_info.output_token_logprobs "
                "(was return_logprob sent?)"
            )
        triples = []
    if not isinstance(triples, list):
        raise SGLangProtocolError(
            "SGLang /generate response: meta_info.output_token_logprobs must be a list"
        )
    if len(triples) != len(ids):
        raise SGLangProtocolError(
            f"SGLang /generate response: meta_info.output_token_logprobs has {len(triples)} "
            f"entries but output_ids has {len(ids)}"
        )
    logprobs: list[float] = []
    for j, (entry, tok) in enumerate(zip(triples, ids)):
        i = start + j
        if not isinstance(entry, (list, tuple)) or len(entry) < 2:
            raise SGLangProtocolError(
                f"SGLang /generate response: meta_info.output_token_logprobs[{i}] must be "
                f"[logprob, token_id, text], got {entry!r}"
            )
        lp, tid = entry[0], entry[1]
        if not isinstance(lp, (int, float)) or isinstance(lp, bool):
            raise SGLangProtocolError(
                f"SGLang /generate response: meta_info.output_token_logprobs[{i}][0] (logprob) "
                f"must be a number, got {lp!r}"
            )
        if tid != tok:
            raise SGLangProtocolError(
                f"SGLang /generate response: meta_info.output_token_logprobs[{i}][1] is token "
                f"{tid!r} but output_ids[{i}] is {tok}"
            )
        logprobs.append(float(lp))
    return logprobs


def _output_top_logprobs(entries: Any, count: int, start: int, wanted: int) -> tuple:
    """Each output token's alternatives from ``meta_info.output_top_logprobs`` (SGLang 0.5.23,
    ``TokenizerManager.detokenize_top_logprobs_tokens``: per token a list of ``[logprob,
    token_id, text]``, most likely first, or null), as ``(token_id, logprob)`` tuples; ``()``
    when none were asked for (``wanted`` 0); masked-out tokens (-inf, or null) are left out, as the
    hf engine leaves them out. ``start``: the index of the first entry (errors)."""
    if not wanted:
        return ()
    where = "SGLang /generate response: meta_info.output_top_logprobs"
    if not isinstance(entries, list) or len(entries) != count:
        raise SGLangProtocolError(f"{where} must be a list with one entry per output token "
                                  f"({count}), got {entries!r:.200}")
    out = []
    for i, entry in enumerate(entries):
        if entry is None:
            out.append(())
            continue
        if not isinstance(entry, list):
            raise SGLangProtocolError(f"{where}[{start + i}] must be a list, got {entry!r:.200}")
        pairs = []
        for triple in entry:
            if not (isinstance(triple, (list, tuple)) and len(triple) >= 2
                    and isinstance(triple[0], (int, float, type(None))) and isinstance(triple[1], int)):
                raise SGLangProtocolError(f"{where}[{start + i}] entries must be [logprob, "
                                          f"token_id, text], got {triple!r:.200}")
            # a token a grammar masked out has log-prob -inf, which SGLang's JSON writes as null
            if triple[0] is not None and math.isfinite(triple[0]):
                pairs.append((int(triple[1]), float(triple[0])))
        out.append(tuple(pairs[:wanted]))
    return tuple(out)


def _result_version(meta: Mapping[str, Any], default: int) -> int:
    newest = parse_weight_version(meta.get("weight_version"), default)
    oldest = parse_weight_versions(meta.get("weight_versions"), default)
    return newest if oldest is None else oldest


def parse_generate_response(
    data: Any, request: GenerationRequest, *, default_weight_version: int = 0,
    routing: Optional[RoutingShape] = None,
) -> GenerationResult:
    """A non-streaming ``/generate`` response for one request -> ``GenerationResult``.

    ``default_weight_version`` is used when the server reports no numeric weight version.
    ``routing``: decode ``meta_info.routed_experts`` (routing replay; required then). Raises
    ``SGLangServerError`` for an error body and ``SGLangProtocolError`` naming the field for
    anything malformed.
    """
    if isinstance(data, list):
        if len(data) != 1:
            raise SGLangProtocolError(
                f"SGLang /generate response: expected one result, got a list of {len(data)}"
            )
        data = data[0]
    if not isinstance(data, Mapping):
        raise SGLangProtocolError(
            f"SGLang /generate response: expected a JSON object, got {type(data).__name__}"
        )
    message = error_message(data)
    if message is not None:
        raise SGLangServerError(f"SGLang /generate error: {message}")

    output_ids = _ids(_field(data, "output_ids", ""))
    meta = _field(data, "meta_info", "")
    if not isinstance(meta, Mapping):
        raise SGLangProtocolError("SGLang /generate response: meta_info must be an object")

    finish = parse_finish_reason(_field(meta, "finish_reason", "meta_info."))

    logprobs = _output_logprobs(meta.get("output_token_logprobs"), output_ids, 0)

    completion = meta.get("completion_tokens")
    if completion is not None and completion != len(output_ids):
        raise SGLangProtocolError(
            f"SGLang /generate response: meta_info.completion_tokens={completion} but output_ids "
            f"has {len(output_ids)} tokens"
        )
    if len(output_ids) > request.sampling.max_new_tokens:
        raise SGLangProtocolError(
            f"SGLang /generate response: {len(output_ids)} output_ids exceed max_new_tokens="
            f"{request.sampling.max_new_tokens}"
        )
    return GenerationResult(
        token_ids=tuple(output_ids),
        logprobs=tuple(logprobs),
        finish_reason=finish,
        weight_version=_result_version(meta, default_weight_version),
        top_logprobs=_output_top_logprobs(meta.get("output_top_logprobs"), len(output_ids), 0,
                                          request.sampling.top_logprobs),
        routed_experts=None if routing is None else _routed_experts(meta, routing, request, output_ids),
    )


def _routed_experts(meta: Mapping[str, Any], routing: RoutingShape, request: GenerationRequest,
                    output_ids: Sequence[int]) -> Optional[RoutedExperts]:
    value = meta.get("routed_experts")
    if value is None:
        if not output_ids:
            return None
        raise SGLangProtocolError("SGLang /generate response: no meta_info.routed_experts (was the server started "
                                  "with --enable-return-routed-experts, which loss.routing_replay: rollout adds?)")
    if not isinstance(value, str):
        raise SGLangProtocolError(f"SGLang /generate response: meta_info.routed_experts must be a base64 string, "
                                  f"got {type(value).__name__}")
    try:
        return routing.decode_sglang(value, len(request.prompt_ids) + len(output_ids) - 1)
    except ValueError as exc:
        raise SGLangProtocolError(f"SGLang /generate response: meta_info.routed_experts: {exc}") from None


# ------------------------------------------------------------------- /generate, streaming

STREAM_DONE = "[DONE]"


def sse_data(event: bytes) -> Optional[str]:
    """The data of one server-sent event (the ``data:`` lines joined by newlines), or None for an
    event without data (a comment or keep-alive)."""
    lines = []
    for line in event.decode("utf-8").splitlines():
        if line.startswith("data:"):
            value = line[5:]
            lines.append(value[1:] if value.startswith(" ") else value)
    return "\n".join(lines) if lines else None


class StreamProgress:
    """Reads the events of one streamed ``/generate`` into ``GenerationChunk``s: the ids and
    log-probs new since the previous event, and on the last event (``finish_reason`` set) the
    finish reason and weight version. Works with cumulative and incremental events (see the
    module docstring); raises ``SGLangServerError`` for an error event or an abort with an HTTP
    error status, ``SGLangProtocolError`` naming the field for anything malformed."""

    def __init__(self, request: GenerationRequest, *, default_weight_version: int = 0) -> None:
        self.request = request
        self.default_weight_version = default_weight_version
        self.seen = 0  # output ids delivered so far
        self.finished = False

    def next_chunk(self, data: Any) -> GenerationChunk:
        if self.finished:
            raise SGLangProtocolError("SGLang /generate stream: an event after the last one")
        if isinstance(data, list) and len(data) == 1:
            data = data[0]
        if not isinstance(data, Mapping):
            raise SGLangProtocolError(
                f"SGLang /generate stream: expected a JSON object per event, got {type(data).__name__}"
            )
        message = error_message(data)
        if message is not None:
            raise SGLangServerError(f"SGLang /generate error: {message}")
        output_ids = _ids(_field(data, "output_ids", ""))
        meta = _field(data, "meta_info", "")
        if not isinstance(meta, Mapping):
            raise SGLangProtocolError("SGLang /generate response: meta_info must be an object")
        raw_finish = meta.get("finish_reason")
        if isinstance(raw_finish, Mapping) and raw_finish.get("type") == "abort":
            status = raw_finish.get("status_code")
            if isinstance(status, int) and status >= 400:
                raise SGLangServerError(
                    f"SGLang /generate error (HTTP {status}): {raw_finish.get('message', '')}"
                )
        total = meta.get("completion_tokens")
        if total is None or len(output_ids) == total:  # cumulative (the default)
            if len(output_ids) < self.seen:
                raise SGLangProtocolError(
                    f"SGLang /generate stream: output_ids went back from {self.seen} to "
                    f"{len(output_ids)} ids"
                )
            start = self.seen
        elif self.seen + len(output_ids) == total:  # incremental (--incremental-streaming-output)
            start = 0
        elif raw_finish is not None and isinstance(raw_finish, Mapping) and raw_finish.get("type") == "abort":
            # an abort event of an incremental stream repeats only the last id: nothing new
            output_ids, start = [], 0
        else:
            raise SGLangProtocolError(
                f"SGLang /generate stream: {len(output_ids)} output_ids after {self.seen} do not "
                f"add up to meta_info.completion_tokens={total}"
            )
        new = output_ids[start:]
        triples = meta.get("output_token_logprobs")
        if isinstance(triples, list):
            if len(triples) == len(output_ids):
                triples = triples[start:]
            elif len(triples) == self.seen + len(new):
                triples = triples[self.seen:]
        logprobs = _output_logprobs(triples, new, self.seen)
        top = self.request.sampling.top_logprobs
        tops = meta.get("output_top_logprobs") if top else None
        if isinstance(tops, list):  # cumulative or incremental, like output_token_logprobs
            if len(tops) == len(output_ids):
                tops = tops[start:]
            elif len(tops) == self.seen + len(new):
                tops = tops[self.seen:]
        top_logprobs = _output_top_logprobs(tops, len(new), self.seen, top)
        self.seen += len(new)
        if self.seen > self.request.sampling.max_new_tokens:
            raise SGLangProtocolError(
                f"SGLang /generate response: {self.seen} output_ids exceed max_new_tokens="
                f"{self.request.sampling.max_new_tokens}"
            )
        if raw_finish is None:
            return GenerationChunk(tuple(new), tuple(logprobs), top_logprobs=top_logprobs)
        self.finished = True
        return GenerationChunk(tuple(new), tuple(logprobs), parse_finish_reason(raw_finish),
                               _result_version(meta, self.default_weight_version), top_logprobs)
