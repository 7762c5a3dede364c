"""SGLang's native HTTP protocol: our dataclasses to SGLang JSON and back (pure functions, no I/O).

Everything here was written by reading SGLang's source, none of it copied. It was checked against
the source of the release spade pins, the ``sglang==0.5.23`` wheel from PyPI (paths below are inside
that package, ``sglang/...``):

* ``/generate`` request. Routed in ``srt/entrypoints/http_server.py`` (``generate_request``): the
  raw body first passes a schema gate (``srt/entrypoints/api_contract.py`` ->
  ``api/v1/api_types.py::GenerateRequest``, which ignores unknown top-level keys but **rejects
  unknown keys inside ``sampling_params``** with HTTP 400 ``{"error": "<text>"}``), then is parsed
  into ``srt/managers/io_struct.py::GenerateReqInput`` (``input_ids``, ``sampling_params``, ``rid``,
  ``return_logprob``, ``logprob_start_len`` with ``-1`` = output tokens only, ``stream``). Sampling
  fields: ``srt/sampling/sampling_params.py::SamplingParams`` (``temperature``, ``top_p``,
  ``top_k`` where ``-1`` means the whole vocabulary, ``max_new_tokens``, ``stop_token_ids``,
  ``ignore_eos``, ``no_stop_trim``, ``sampling_seed``). A temperature below ``1e-6`` becomes
  ``top_k = 1, temperature = 1``: greedy, with log-probs at ``T = 1``, which is what ``engine.py``
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
  ``ENDPOINTS`` and the ``*_payload`` builders below.

Weight updates need a session in 0.5.23: ``/update_weights_from_tensor`` and
``/update_weights_from_distributed`` answer ``success: false`` unless they run between
``/begin_weight_update`` and ``/end_weight_update``
(``srt/managers/scheduler_components/weight_updater.py``). ``/init_weights_update_group``,
``/update_weights_from_*`` refuse servers started with ``--dp-size > 1`` (an assertion: HTTP 500).

Which log-probs SGLang returns (``srt/layers/sampler.py``, ``Sampler.forward``): on the default
path the log of ``softmax(logits / T)`` over the full vocabulary, taken before top-k/top-p
filtering (the filters work on copies), the distribution ``engine.py`` specifies (details there).
``SGLANG_RETURN_ORIGINAL_LOGPROB`` ("1"/"true") would make them ``T = 1`` log-probs: the launcher
sets it to "0" (``sglang_deployment.SERVER_ENV_DEFAULTS``) and ``engine.sglang.server_env`` refuses
it. A GPU check against ``spade.rl.logprobs`` still has to confirm the numbers on real hardware.
"""

from __future__ import annotations

import base64
import binascii
import io
import pickle
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

from .engine import FinishReason, GenerationChunk, GenerationRequest, GenerationResult

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

# srt/constants.py: the memory regions /release_memory_occupation and /resume_memory_occupation
# know ("tags": null means all three). A region can only be resumed after it was released.
SUPPORTED_MEMORY_TAGS: tuple[str, ...] = ("weights", "kv_cache", "cuda_graph")
# What spade releases around a train step (CUDA graphs stay resident).
MEMORY_TAGS: tuple[str, ...] = ("weights", "kv_cache")
# io_struct.py PauseGenerationReqInput.mode
PAUSE_MODES: tuple[str, ...] = ("abort", "retract", "in_place")
# io_struct.py: the ``selector`` of BeginWeightUpdateReqInput and the update requests
WEIGHT_UPDATE_SELECTORS: tuple[str, ...] = ("target", "draft", "all")

_FINISH_TYPES: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}

# The globals a serialized_named_tensors entry may name. SGLang 0.5.23 decodes each entry with
# base64 (standard alphabet, strict: no newlines) and then ``SafeUnpickler``
# (srt/utils/common.py), a pickle.Unpickler whose find_class only resolves an exact allow-list of
# (module, name) pairs and raises for anything else. This is the part of that list a
# ``ForkingPickler`` dump of ``[(name, tensor), ...]`` made with torch's reducers can reach (torch's
# rebuild functions, tensor and storage classes, torch.Size, dtypes); SGLang allows more (plain
# builtins and collections, SGLang's own bucket classes, NPU variants), which our payloads do not
# need. A payload naming anything outside this set must not be sent.
_ALLOWED_DTYPES = (
    "bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64",
    "float16", "bfloat16", "float32", "float64", "complex64", "complex128",
    "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu",
    "float4_e2m1fn_x2",
)
_ALLOWED_REBUILDS = (
    "rebuild_tensor", "rebuild_cuda_tensor", "rebuild_meta_tensor", "rebuild_nested_tensor",
    "rebuild_sparse_coo_tensor", "rebuild_sparse_compressed_tensor", "rebuild_storage_fd",
    "rebuild_storage_filename", "rebuild_storage_empty", "rebuild_typed_storage",
    "rebuild_typed_storage_child",
)
SGLANG_TENSOR_PAYLOAD_GLOBALS: frozenset[tuple[str, str]] = frozenset(
    [("torch", d) for d in _ALLOWED_DTYPES]
    + [("torch.multiprocessing.reductions", f) for f in _ALLOWED_REBUILDS]
    + [
        ("torch", "Tensor"), ("torch", "Size"), ("torch", "device"), ("torch", "dtype"),
        ("torch.nn.parameter", "Parameter"),
        ("torch.storage", "UntypedStorage"), ("torch.storage", "TypedStorage"),
        ("torch", "UntypedStorage"),
        ("torch._utils", "_rebuild_tensor_v2"), ("torch._utils", "_rebuild_parameter"),
        ("torch._tensor", "_rebuild_from_type_v2"),
        ("multiprocessing.resource_sharer", "DupFd"),  # the file_descriptor sharing strategy
        ("copyreg", "__newobj__"), ("collections", "OrderedDict"),
    ]
)


class SGLangProtocolError(ValueError):
    """An SGLang response did not have the shape this client expects (names the field)."""


class SGLangServerError(RuntimeError):
    """SGLang answered with an error (``{"error": ...}``, ``{"object": "error"}`` or ``success: false``)."""


def _error_message(data: Any) -> Optional[str]:
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


def generate_payload(request: GenerationRequest, rid: str, *, stream: bool = False) -> dict[str, Any]:
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
    return {
        "input_ids": list(request.prompt_ids),
        "sampling_params": sampling,
        "rid": str(rid),
        "return_logprob": True,
        "logprob_start_len": -1,  # log-probs of output tokens only
        "stream": bool(stream),
    }


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


def _result_version(meta: Mapping[str, Any], default: int) -> int:
    newest = parse_weight_version(meta.get("weight_version"), default)
    oldest = parse_weight_versions(meta.get("weight_versions"), default)
    return newest if oldest is None else oldest


def parse_generate_response(
    data: Any, request: GenerationRequest, *, default_weight_version: int = 0
) -> GenerationResult:
    """A non-streaming ``/generate`` response for one request -> ``GenerationResult``.

    ``default_weight_version`` is used when the server reports no numeric weight version. Raises
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
    message = _error_message(data)
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
    )


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
        message = _error_message(data)
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
        self.seen += len(new)
        if self.seen > self.request.sampling.max_new_tokens:
            raise SGLangProtocolError(
                f"SGLang /generate response: {self.seen} output_ids exceed max_new_tokens="
                f"{self.request.sampling.max_new_tokens}"
            )
        if raw_finish is None:
            return GenerationChunk(tuple(new), tuple(logprobs))
        self.finished = True
        return GenerationChunk(tuple(new), tuple(logprobs), parse_finish_reason(raw_finish),
                               _result_version(meta, self.default_weight_version))


# ------------------------------------------------------------------- server and model info


def server_info_tp_size(info: Any) -> int:
    """The tensor-parallel size from a ``/server_info`` answer (its flat ``tp_size`` field)."""
    if not isinstance(info, Mapping):
        raise SGLangProtocolError(f"SGLang /server_info: expected a JSON object, got {type(info).__name__}")
    tp = info.get("tp_size")
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise SGLangProtocolError(f"SGLang /server_info: tp_size must be a positive int, got {tp!r}")
    return tp


def model_info_weight_version(info: Any, default: int) -> int:
    """The live weight version from a ``/model_info`` answer (``weight_version``, a string)."""
    if not isinstance(info, Mapping):
        raise SGLangProtocolError(f"SGLang /model_info: expected a JSON object, got {type(info).__name__}")
    return parse_weight_version(info.get("weight_version"), default)


# -------------------------------------------------------------------- control endpoint bodies


def _tags(tags: Optional[Iterable[str]]) -> Optional[list[str]]:
    if tags is None:
        return None
    out = [str(t) for t in tags]
    bad = [t for t in out if t not in SUPPORTED_MEMORY_TAGS]
    if bad:
        raise ValueError(f"unknown memory tags {bad}; SGLang supports {list(SUPPORTED_MEMORY_TAGS)}")
    return out


def release_memory_payload(tags: Optional[Iterable[str]] = MEMORY_TAGS) -> dict[str, Any]:
    """``/release_memory_occupation`` body (``ReleaseMemoryOccupationReqInput.tags``; None = all).

    SGLang asserts the server is idle (drained, or paused) when this arrives."""
    return {"tags": _tags(tags)}


def resume_memory_payload(tags: Optional[Iterable[str]] = MEMORY_TAGS) -> dict[str, Any]:
    """``/resume_memory_occupation`` body (``ResumeMemoryOccupationReqInput.tags``; None = all).

    A released ``weights`` region comes back without its contents (unless the server runs with
    ``--enable-weights-cpu-backup``): send the weights before generating again."""
    return {"tags": _tags(tags)}


def pause_generation_payload(mode: str = "abort") -> dict[str, Any]:
    """``/pause_generation`` body (``PauseGenerationReqInput.mode``: abort | retract | in_place).

    ``abort`` ends running and queued requests (``finish_reason`` abort, partial output);
    ``retract`` moves running requests back to the queue; ``in_place`` freezes them with their
    KV cache (``/flush_cache`` then fails while they exist)."""
    if mode not in PAUSE_MODES:
        raise ValueError(f"pause mode must be one of {PAUSE_MODES}, got {mode!r}")
    return {"mode": mode}


def continue_generation_payload(*, torch_empty_cache: Optional[bool] = None) -> dict[str, Any]:
    """``/continue_generation`` body (``ContinueGenerationReqInput``; SGLang empties the CUDA
    allocator cache before resuming unless ``torch_empty_cache`` is false)."""
    return {} if torch_empty_cache is None else {"torch_empty_cache": bool(torch_empty_cache)}


def abort_request_payload(rid: str = "", abort_all: bool = False) -> dict[str, Any]:
    """``/abort_request`` body (``AbortReq.rid``, ``AbortReq.abort_all``).

    SGLang aborts every request whose rid *starts with* ``rid``; an empty rid without
    ``abort_all`` is ignored."""
    return {"rid": str(rid), "abort_all": bool(abort_all)}


def _selector(selector: str) -> str:
    if selector not in WEIGHT_UPDATE_SELECTORS:
        raise ValueError(f"selector must be one of {WEIGHT_UPDATE_SELECTORS}, got {selector!r}")
    return selector


def begin_weight_update_payload(selector: str = "all") -> dict[str, Any]:
    """``/begin_weight_update`` body (``BeginWeightUpdateReqInput.selector``).

    Opens the session the ``/update_weights_from_*`` calls need; fails (``success: false``) when
    one is already open. With released memory, resume the ``weights`` region first."""
    return {"selector": _selector(selector)}


def end_weight_update_payload() -> dict[str, Any]:
    """``/end_weight_update`` body (``EndWeightUpdateReqInput`` has no fields): closes the session
    and finalizes the loaded weights; fails when no session is open."""
    return {}


def _update_options(
    body: dict[str, Any],
    *,
    flush_cache: bool,
    weight_version: Optional[int],
    abort_all_requests: Optional[bool],
    torch_empty_cache: Optional[bool],
    selector: Optional[str],
) -> dict[str, Any]:
    body["flush_cache"] = bool(flush_cache)
    if weight_version is not None:
        body["weight_version"] = str(int(weight_version))  # a str field: a number is refused
    if abort_all_requests is not None:
        body["abort_all_requests"] = bool(abort_all_requests)
    if torch_empty_cache is not None:
        body["torch_empty_cache"] = bool(torch_empty_cache)
    if selector is not None:
        body["selector"] = _selector(selector)
    return body


def update_weights_from_tensor_payload(
    serialized_named_tensors: Sequence[str],
    *,
    load_format: Optional[str] = None,
    flush_cache: bool = True,
    weight_version: Optional[int] = None,
    abort_all_requests: Optional[bool] = None,
    torch_empty_cache: Optional[bool] = None,
    selector: Optional[str] = None,
) -> dict[str, Any]:
    """``/update_weights_from_tensor`` body (``UpdateWeightsFromTensorReqInput``).

    ``serialized_named_tensors``: one base64 string per tensor-parallel rank of the server (rank
    ``r`` decodes entry ``r`` only), each the base64 (standard alphabet, no newlines) of a pickled
    list of ``(name, tensor)`` whose tensors are CUDA-IPC handles (or shared-memory CPU tensors).
    The server unpickles it with an allow-list of globals (``SGLANG_TENSOR_PAYLOAD_GLOBALS``,
    ``payload_globals``). ``load_format``: None (the model's ``load_weights``), ``"direct"``, or
    ``"flattened_bucket"`` (a pickled ``{"flattened_tensor", "metadata"}`` of SGLang's own bucket
    classes). ``flush_cache=True`` fails the call when requests are still running. Must run inside
    a weight-update session (``begin_weight_update_payload``).
    """
    body: dict[str, Any] = {
        "serialized_named_tensors": list(serialized_named_tensors),
        "load_format": load_format,
    }
    return _update_options(
        body, flush_cache=flush_cache, weight_version=weight_version,
        abort_all_requests=abort_all_requests, torch_empty_cache=torch_empty_cache, selector=selector,
    )


def update_weights_from_distributed_payload(
    names: Sequence[str],
    dtypes: Sequence[str],
    shapes: Sequence[Sequence[int]],
    *,
    group_name: str = "weight_update_group",
    flush_cache: bool = True,
    weight_version: Optional[int] = None,
    load_format: Optional[str] = None,
    abort_all_requests: Optional[bool] = None,
    torch_empty_cache: Optional[bool] = None,
    selector: Optional[str] = None,
) -> dict[str, Any]:
    """``/update_weights_from_distributed`` body (``UpdateWeightsFromDistributedReqInput``): the
    metadata of tensors the trainer then broadcasts (``src=0``) over the group from
    ``init_weights_update_group``. Dtypes are torch attribute names (``"bfloat16"``).

    Without ``load_format`` each server worker receives one broadcast per tensor, in this order.
    With ``load_format="flattened_bucket"`` it receives a single ``uint8`` broadcast: the raw bytes
    of the tensors back to back in this order, no padding, each tensor's byte offset a multiple of
    its dtype's item size. Must run inside a weight-update session.
    """
    if not (len(names) == len(dtypes) == len(shapes)):
        raise ValueError(
            f"names/dtypes/shapes differ in length: {len(names)}/{len(dtypes)}/{len(shapes)}"
        )
    body: dict[str, Any] = {
        "names": [str(n) for n in names],
        "dtypes": [str(d).removeprefix("torch.") for d in dtypes],
        "shapes": [[int(x) for x in s] for s in shapes],
        "group_name": group_name,
    }
    if load_format is not None:
        body["load_format"] = load_format
    return _update_options(
        body, flush_cache=flush_cache, weight_version=weight_version,
        abort_all_requests=abort_all_requests, torch_empty_cache=torch_empty_cache, selector=selector,
    )


def init_weights_update_group_payload(
    master_address: str,
    master_port: int,
    rank_offset: int,
    world_size: int,
    *,
    group_name: str = "weight_update_group",
    backend: str = "nccl",
) -> dict[str, Any]:
    """``/init_weights_update_group`` body (``InitWeightsUpdateGroupReqInput``).

    Each TP worker ``t`` of the server joins as rank ``rank_offset + t`` of a ``world_size`` group
    whose rank 0 (the trainer) hosts the TCP store at ``master_address:master_port``; see
    ``weight_transport.open_update_group`` for the matching trainer side. The call returns only
    after every member has joined."""
    return {
        "master_address": str(master_address),
        "master_port": int(master_port),
        "rank_offset": int(rank_offset),
        "world_size": int(world_size),
        "group_name": group_name,
        "backend": backend,
    }


def destroy_weights_update_group_payload(group_name: str = "weight_update_group") -> dict[str, Any]:
    """``/destroy_weights_update_group`` body (``DestroyWeightsUpdateGroupReqInput``); fails when
    the server has no group of that name."""
    return {"group_name": group_name}


def update_weight_version_payload(version: int, *, abort_all_requests: bool = False) -> dict[str, Any]:
    """``/update_weight_version`` body (``UpdateWeightVersionReqInput``). SGLang's own default for
    ``abort_all_requests`` is true; this builder always says which it is."""
    return {"new_version": str(int(version)), "abort_all_requests": bool(abort_all_requests)}


def check_control_response(endpoint: str, status: int, data: Any) -> Any:
    """Raise ``SGLangServerError`` for a failed control call; return the decoded body otherwise.

    Weight endpoints answer ``{"success": bool, "message": str}`` (400 on failure); the memory
    endpoints answer 200 ``null`` or 400 ``{"error": {"message"}}``; ``/flush_cache`` answers plain
    text, 400 when requests are still running; FastAPI's own errors (a body that does not parse,
    422 turned into 400) are ``{"object": "error", "message", ...}``.
    """
    if isinstance(data, Mapping):
        if data.get("success") is False:
            raise SGLangServerError(f"SGLang {endpoint} failed: {data.get('message', '')}")
        message = _error_message(data)
        if message is not None:
            raise SGLangServerError(f"SGLang {endpoint} failed: {message}")
    if status >= 400:
        raise SGLangServerError(f"SGLang {endpoint} failed with HTTP {status}: {data!r}")
    return data


# ------------------------------------------------------------- serialized tensor payload check


class _Placeholder:
    """Stands in for every global while listing a pickle's globals: nothing real is called."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> "_Placeholder":
        return _Placeholder()

    def __setstate__(self, state: Any) -> None:
        pass

    def __setitem__(self, key: Any, value: Any) -> None:
        pass

    def append(self, value: Any) -> None:
        pass

    def extend(self, values: Any) -> None:
        pass


class _GlobalLister(pickle.Unpickler):
    def __init__(self, data: bytes) -> None:
        super().__init__(io.BytesIO(data))
        self.names: set[tuple[str, str]] = set()

    def find_class(self, module: str, name: str) -> Any:
        self.names.add((module, name))
        return _Placeholder

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("persistent ids are not allowed in a tensor payload")


def payload_globals(entry: Union[str, bytes]) -> set[tuple[str, str]]:
    """The ``(module, name)`` globals a ``serialized_named_tensors`` entry names, found without
    resolving any of them. ``str`` is base64 text (decoded strictly, as SGLang does), ``bytes``
    the raw pickle. Every result must be in ``SGLANG_TENSOR_PAYLOAD_GLOBALS``."""
    if isinstance(entry, str):
        try:
            data = base64.b64decode(entry, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ValueError(f"not valid base64 ({exc})") from None
    else:
        data = bytes(entry)
    lister = _GlobalLister(data)
    lister.load()
    return lister.names
