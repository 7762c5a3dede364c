"""SGLang's native HTTP protocol: our dataclasses to SGLang JSON and back (pure functions, no I/O).

Everything here was written from SGLang's source, not copied from it. Where each field comes from
(paths inside https://github.com/sgl-project/sglang):

* ``/generate`` request: ``python/sglang/srt/managers/io_struct.py::GenerateReqInput`` (fields
  ``input_ids``, ``sampling_params``, ``rid``, ``return_logprob``, ``logprob_start_len``,
  ``stream``) and ``python/sglang/srt/sampling/sampling_params.py::SamplingParams`` (``temperature``,
  ``top_p``, ``top_k`` with ``-1`` = off, ``max_new_tokens``, ``stop_token_ids``, ``no_stop_trim``,
  ``sampling_seed``). ``temperature < 1e-6`` is turned by SGLang into ``top_k = 1, temperature = 1``,
  i.e. greedy with log-probs at ``T = 1``, which is what ``engine.py`` specifies.
  ``sampling_seed`` is the per-request seed field name (newer SGLang; older releases lack it and
  reject unknown fields, so it is only sent when ``SamplingParams.seed`` is set).
* ``/generate`` response: ``python/sglang/srt/managers/tokenizer_manager.py::_handle_batch_output``
  builds ``{"text", "output_ids", "meta_info"}``; ``meta_info`` holds ``id`` (the rid),
  ``finish_reason``, ``prompt_tokens``, ``completion_tokens``, ``cached_tokens``, ``weight_version``
  (a *string*, ``ServerArgs.weight_version``, default ``"default"``), and with ``return_logprob``
  ``output_token_logprobs`` as ``[logprob, token_id, text_or_None]`` triples.
* ``finish_reason``: ``python/sglang/srt/managers/schedule_batch.py`` ``FINISH_*.to_json()``:
  ``{"type": "stop", "matched": <token id | str>}``, ``{"type": "length", "length": n}``,
  ``{"type": "abort", "message": ..., "status_code": ..., "err_type": ...}``; ``None`` while
  unfinished (streaming only).
* errors: ``http_server.py::_create_error_response`` -> HTTP 400 ``{"error": {"message": ...}}``.
* control endpoints (``python/sglang/srt/entrypoints/http_server.py``; payloads from
  ``io_struct.py``): see ``ENDPOINTS`` and the ``*_payload`` builders below.

Which log-probs SGLang returns: its sampler takes ``log(softmax(logits / T))`` over the full
vocabulary before top-k/top-p, the distribution ``engine.py`` specifies. The server must not be
started with ``SGLANG_RETURN_ORIGINAL_LOGPROB=1`` (that returns ``T = 1`` log-probs). This needs a
GPU check against ``spade.rl.logprobs`` (issue 5).
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional, Sequence

from .engine import FinishReason, GenerationRequest, GenerationResult

# Which SGLang these translations were read from. The index holds many snapshots; the routes below
# were read from sgl-project/sglang python/sglang/srt/entrypoints/http_server.py at commit
# 9c0549b727fe222444495cea6b369697534d60f0 (/generate, /health, /get_server_info, /flush_cache,
# /init_weights_update_group, /update_weights_from_tensor, /update_weights_from_distributed,
# /release_memory_occupation, /resume_memory_occupation, /abort_request) plus later main-branch
# io_struct.py / http_server.py for /pause_generation, /continue_generation, the ``tags`` of the
# memory endpoints, ``weight_version`` and ``sampling_params.sampling_seed`` (SGLang >= 0.5.x).
SGLANG_REFERENCE = (
    "sgl-project/sglang http_server.py@9c0549b727fe222444495cea6b369697534d60f0 "
    "+ main-branch io_struct.py/sampling_params.py (0.5.x: pause/continue_generation, tags, "
    "sampling_seed, weight_version)"
)
SGLANG_MIN_VERSION = "0.5.0"

# name -> (HTTP method, path). All POST bodies are JSON objects.
ENDPOINTS: dict[str, tuple[str, str]] = {
    "generate": ("POST", "/generate"),
    "health": ("GET", "/health"),
    "health_generate": ("GET", "/health_generate"),
    "get_server_info": ("GET", "/get_server_info"),
    "get_model_info": ("GET", "/get_model_info"),
    "flush_cache": ("POST", "/flush_cache"),
    "abort_request": ("POST", "/abort_request"),
    "pause_generation": ("POST", "/pause_generation"),
    "continue_generation": ("POST", "/continue_generation"),
    "release_memory_occupation": ("POST", "/release_memory_occupation"),
    "resume_memory_occupation": ("POST", "/resume_memory_occupation"),
    "init_weights_update_group": ("POST", "/init_weights_update_group"),
    "update_weights_from_distributed": ("POST", "/update_weights_from_distributed"),
    "update_weights_from_tensor": ("POST", "/update_weights_from_tensor"),
}

# io_struct.py ReleaseMemoryOccupationReqInput / ResumeMemoryOccupationReqInput: "Currently we only
# support `weights` and `kv_cache`" (None means all).
MEMORY_TAGS: tuple[str, ...] = ("weights", "kv_cache")
# io_struct.py PauseGenerationReqInput.mode
PAUSE_MODES: tuple[str, ...] = ("abort", "retract", "in_place")

_FINISH_TYPES: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}


class SGLangProtocolError(ValueError):
    """An SGLang response did not have the shape this client expects (names the field)."""


class SGLangServerError(RuntimeError):
    """SGLang answered with an error (``{"error": {"message": ...}}`` or ``success: false``)."""


# ---------------------------------------------------------------------------------- /generate


def generate_payload(request: GenerationRequest, rid: str) -> dict[str, Any]:
    """The ``/generate`` JSON body for one request (token ids in, log-probs of output tokens out)."""
    s = request.sampling
    sampling: dict[str, Any] = {
        "temperature": float(s.temperature),  # 0 -> SGLang: greedy (top_k=1, T=1)
        "top_p": float(s.top_p),
        "top_k": -1 if s.top_k is None else int(s.top_k),
        "max_new_tokens": int(s.max_new_tokens),
        # keep a matched stop token in the output (our contract: stop token included)
        "no_stop_trim": True,
    }
    if s.stop_token_ids:
        sampling["stop_token_ids"] = list(s.stop_token_ids)
    if s.seed is not None:
        sampling["sampling_seed"] = int(s.seed)
    if s.ignore_eos:
        sampling["ignore_eos"] = True  # SamplingParams.ignore_eos
    return {
        "input_ids": list(request.prompt_ids),
        "sampling_params": sampling,
        "rid": str(rid),
        "return_logprob": True,
        "logprob_start_len": -1,  # log-probs of output tokens only
        "stream": False,
    }


def _field(obj: Mapping[str, Any], name: str, where: str) -> Any:
    if name not in obj:
        raise SGLangProtocolError(f"SGLang /generate response: missing field {where}{name!r}")
    return obj[name]


def parse_finish_reason(value: Any) -> FinishReason:
    """``meta_info.finish_reason`` (a ``FINISH_*.to_json()`` dict) -> ``"stop" | "length" | "abort"``."""
    if value is None:
        raise SGLangProtocolError(
            "SGLang /generate response: meta_info.finish_reason is null (request not finished; "
            "streaming responses are not supported)"
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


def parse_generate_response(
    data: Any, request: GenerationRequest, *, default_weight_version: int = 0
) -> GenerationResult:
    """A non-streaming ``/generate`` response for one request -> ``GenerationResult``.

    ``default_weight_version`` is used when the server reports no numeric ``weight_version``.
    Raises ``SGLangServerError`` for an error body and ``SGLangProtocolError`` naming the field for
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
    if "error" in data:
        err = data["error"]
        msg = err.get("message") if isinstance(err, Mapping) else err
        raise SGLangServerError(f"SGLang /generate error: {msg}")

    output_ids = _field(data, "output_ids", "")
    if not isinstance(output_ids, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in output_ids
    ):
        raise SGLangProtocolError("SGLang /generate response: output_ids must be a list of ints")
    meta = _field(data, "meta_info", "")
    if not isinstance(meta, Mapping):
        raise SGLangProtocolError("SGLang /generate response: meta_info must be an object")

    finish = parse_finish_reason(_field(meta, "finish_reason", "meta_info."))

    triples = meta.get("output_token_logprobs")
    if triples is None:
        if output_ids:
            raise SGLangProtocolError(
                "SGLang /generate response: missing field meta_info.output_token_logprobs "
                "(was return_logprob sent?)"
            )
        triples = []
    if not isinstance(triples, list):
        raise SGLangProtocolError(
            "SGLang /generate response: meta_info.output_token_logprobs must be a list"
        )
    if len(triples) != len(output_ids):
        raise SGLangProtocolError(
            f"SGLang /generate response: meta_info.output_token_logprobs has {len(triples)} "
            f"entries but output_ids has {len(output_ids)}"
        )
    logprobs: list[float] = []
    for i, (entry, tok) in enumerate(zip(triples, output_ids)):
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
    version = parse_weight_version(meta.get("weight_version"), default_weight_version)
    return GenerationResult(
        token_ids=tuple(output_ids),
        logprobs=tuple(logprobs),
        finish_reason=finish,
        weight_version=version,
    )


# -------------------------------------------------------------------- control endpoint bodies


def _tags(tags: Optional[Iterable[str]]) -> Optional[list[str]]:
    if tags is None:
        return None
    out = [str(t) for t in tags]
    bad = [t for t in out if t not in MEMORY_TAGS]
    if bad:
        raise ValueError(f"unknown memory tags {bad}; SGLang supports {list(MEMORY_TAGS)}")
    return out


def release_memory_payload(tags: Optional[Iterable[str]] = MEMORY_TAGS) -> dict[str, Any]:
    """``/release_memory_occupation`` body (``ReleaseMemoryOccupationReqInput.tags``)."""
    return {"tags": _tags(tags)}


def resume_memory_payload(tags: Optional[Iterable[str]] = MEMORY_TAGS) -> dict[str, Any]:
    """``/resume_memory_occupation`` body (``ResumeMemoryOccupationReqInput.tags``)."""
    return {"tags": _tags(tags)}


def pause_generation_payload(mode: str = "abort") -> dict[str, Any]:
    """``/pause_generation`` body (``PauseGenerationReqInput.mode``: abort | retract | in_place)."""
    if mode not in PAUSE_MODES:
        raise ValueError(f"pause mode must be one of {PAUSE_MODES}, got {mode!r}")
    return {"mode": mode}


def continue_generation_payload() -> dict[str, Any]:
    """``/continue_generation`` body (``ContinueGenerationReqInput`` has no fields)."""
    return {}


def abort_request_payload(rid: str = "", abort_all: bool = False) -> dict[str, Any]:
    """``/abort_request`` body (``AbortReq.rid``, ``AbortReq.abort_all``)."""
    return {"rid": str(rid), "abort_all": bool(abort_all)}


def update_weights_from_tensor_payload(
    serialized_named_tensors: Sequence[str],
    *,
    load_format: Optional[str] = None,
    flush_cache: bool = True,
    weight_version: Optional[int] = None,
) -> dict[str, Any]:
    """``/update_weights_from_tensor`` body (``UpdateWeightsFromTensorReqInput``).

    ``serialized_named_tensors``: one base64 string per tensor-parallel rank, each a serialized
    list of ``(name, tensor)`` whose tensors are CUDA-IPC handles (SGLang's
    ``MultiprocessingSerializer``); producing them needs a GPU (issue 5).
    """
    body: dict[str, Any] = {
        "serialized_named_tensors": list(serialized_named_tensors),
        "load_format": load_format,
        "flush_cache": bool(flush_cache),
    }
    if weight_version is not None:
        body["weight_version"] = str(int(weight_version))
    return body


def update_weights_from_distributed_payload(
    names: Sequence[str],
    dtypes: Sequence[str],
    shapes: Sequence[Sequence[int]],
    *,
    group_name: str = "weight_update_group",
    flush_cache: bool = True,
    weight_version: Optional[int] = None,
) -> dict[str, Any]:
    """``/update_weights_from_distributed`` body (``UpdateWeightsFromDistributedReqInput``): the
    metadata of tensors the trainer then broadcasts over the group from ``init_weights_update_group``."""
    if not (len(names) == len(dtypes) == len(shapes)):
        raise ValueError(
            f"names/dtypes/shapes differ in length: {len(names)}/{len(dtypes)}/{len(shapes)}"
        )
    body: dict[str, Any] = {
        "names": [str(n) for n in names],
        "dtypes": [str(d).removeprefix("torch.") for d in dtypes],
        "shapes": [[int(x) for x in s] for s in shapes],
        "group_name": group_name,
        "flush_cache": bool(flush_cache),
    }
    if weight_version is not None:
        body["weight_version"] = str(int(weight_version))
    return body


def init_weights_update_group_payload(
    master_address: str,
    master_port: int,
    rank_offset: int,
    world_size: int,
    *,
    group_name: str = "weight_update_group",
    backend: str = "nccl",
) -> dict[str, Any]:
    """``/init_weights_update_group`` body (``InitWeightsUpdateGroupReqInput``)."""
    return {
        "master_address": str(master_address),
        "master_port": int(master_port),
        "rank_offset": int(rank_offset),
        "world_size": int(world_size),
        "group_name": group_name,
        "backend": backend,
    }


def check_control_response(endpoint: str, status: int, data: Any) -> Any:
    """Raise ``SGLangServerError`` for a failed control call; return the decoded body otherwise.

    Weight endpoints answer ``{"success": bool, "message": str}`` (400 on failure); the memory
    endpoints answer an empty 200 or ``{"error": {"message"}}`` with 400; ``/flush_cache`` answers
    plain text with 400 when requests are still running.
    """
    if isinstance(data, Mapping):
        if data.get("success") is False:
            raise SGLangServerError(f"SGLang {endpoint} failed: {data.get('message', '')}")
        if "error" in data:
            err = data["error"]
            msg = err.get("message") if isinstance(err, Mapping) else err
            raise SGLangServerError(f"SGLang {endpoint} failed: {msg}")
    if status >= 400:
        raise SGLangServerError(f"SGLang {endpoint} failed with HTTP {status}: {data!r}")
    return data
