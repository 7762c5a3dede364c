"""SGLang's control endpoints: the bodies spade sends and how their answers are read (pure
functions, no I/O). The endpoint table, the errors and where each field comes from (SGLang 0.5.23's
source) are in ``protocol``.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional, Sequence

from .protocol import SGLangProtocolError, SGLangServerError, error_message

# srt/constants.py: the memory regions /release_memory_occupation and /resume_memory_occupation
# know ("tags": null means all three). A region can only be resumed after it was released.
SUPPORTED_MEMORY_TAGS: tuple[str, ...] = ("weights", "kv_cache", "cuda_graph")
# What spade releases around a train step (CUDA graphs stay resident).
MEMORY_TAGS: tuple[str, ...] = ("weights", "kv_cache")
# io_struct.py PauseGenerationReqInput.mode
PAUSE_MODES: tuple[str, ...] = ("abort", "retract", "in_place")
# io_struct.py: the ``selector`` of BeginWeightUpdateReqInput and the update requests
WEIGHT_UPDATE_SELECTORS: tuple[str, ...] = ("target", "draft", "all")


# ------------------------------------------------------------------- server and model info


def server_info_tp_size(info: Any) -> int:
    """The tensor-parallel size from a ``/server_info`` answer (its flat ``tp_size`` field)."""
    if not isinstance(info, Mapping):
        raise SGLangProtocolError(f"SGLang /server_info: expected a JSON object, got {type(info).__name__}")
    tp = info.get("tp_size")
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise SGLangProtocolError(f"SGLang /server_info: tp_size must be a positive int, got {tp!r}")
    return tp


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
        message = error_message(data)
        if message is not None:
            raise SGLangServerError(f"SGLang {endpoint} failed: {message}")
    if status >= 400:
        raise SGLangServerError(f"SGLang {endpoint} failed with HTTP {status}: {data!r}")
    return data
