"""A protocol-faithful stand-in for ``python -m sglang.launch_server``, serving a real model on CPU.

Why it exists: SGLang cannot run on the CPU-only machines the test suite runs on, so the tests
that need a *server process* (launch, health, generation over HTTP, weight updates, faults and
restarts) start this script instead. The tests against real SGLang live under the ``gpu`` marker.

Run it with the same command line as SGLang (``sglang_argv(...)`` with ``python -m
sglang.launch_server`` replaced by ``python tests/sglang_standin/server.py``)::

    python tests/sglang_standin/server.py --model-path DIR --port P [--host H] [--tp-size N]
        [--weight-version V] [--enable-weights-cpu-backup] [any other SGLang flag, ignored]

What is real: the model (``spade.rollout.hf.engine.HFEngine`` over the HF directory, float32 on
CPU, tokenizer from the same directory), the request/response JSON of SGLang's native endpoints
(see ``spade/rollout/sglang/protocol.py`` for where each field comes from), the tensor payload
format of ``/update_weights_from_tensor`` (decoded with ``spade.rollout.sglang.weight_transport``) and
the process group of ``/init_weights_update_group`` + ``/update_weights_from_distributed``.

What is simulated, and how:

* ``--tp-size N``: one process plays N tensor-parallel workers. ``/update_weights_from_tensor``
  needs exactly N ``serialized_named_tensors`` entries; every entry is decoded and must hold the
  same names and bit-identical values (what N workers each loading the full tensors would see).
  The broadcast path needs ``--tp-size 1`` (one process can hold one member of a group name).
* Memory release (``--enable-memory-saver``): the released tags are tracked, nothing is freed.
  ``/generate`` while anything is released fails with HTTP 400, weight updates while the weights
  are released fail, and ``/release_memory_occupation`` with requests in flight fails: each of
  these is an ordering bug in the client. Resuming ``kv_cache`` before ``weights`` is allowed.
  Without ``--enable-weights-cpu-backup``, SGLang's memory saver does not keep the weights'
  contents across a release, so after a weights release ``/generate`` fails until a weight
  update has arrived (with the flag, the old weights are kept).
* ``/pause_generation``: mode ``abort`` aborts what is running; every mode holds new
  ``/generate`` requests until ``/continue_generation``. Aborted requests answer with no tokens
  (SGLang returns the partial output).
* ``"stream": true`` answers server-sent events as SGLang does (``spade/rollout/sglang/protocol.py`` describes
  the format): cumulative events by default, deltas with ``--incremental-streaming-output``; the
  events a slow reader did not take are merged into the next one (the newest state, or the
  concatenated deltas), then ``data: [DONE]``. A stream aborted by ``/abort_request`` or
  ``/pause_generation`` ends with an abort event holding the partial output. A client that goes
  away stops its generation at once (SGLang waits two seconds).
* ``no_stop_trim`` is always in effect (the matched stop token stays in ``output_ids``).
* Test-only: ``GET /spade_standin/log`` lists the control calls received, in order
  (``{"endpoint", "body", "status"}``, tensor payloads summarised); ``GET /spade_standin/weights``
  gives the sha256 of every tensor of the model (to check a weight transfer bit for bit).
* Test-only, holding generation: ``POST /spade_standin/hold {"forward": N}`` holds the model's
  worker thread inside its N-th forward from now until ``POST /spade_standin/release``;
  ``GET /spade_standin/held`` answers ``{"held": true}`` once the worker is there (at most 60 s); ``standin.engine`` reports the
  engine's counters (``running`` rows, ``generated_tokens``, ``aborted``).
* Faults: with ``SPADE_STANDIN_DIE_AFTER_GENERATES=N`` the process exits (``os._exit(1)``) on
  receiving its N-th ``/generate``, before replying. With ``SPADE_STANDIN_DIE_ONCE_FILE=PATH``
  too, it only does so if PATH does not exist yet, and creates it first, so a restarted server
  with the same command line and environment keeps running.
* Test-only, at run time: ``POST /spade_standin/fault {"endpoint": PATH, "times": N, "status": S}``
  makes the next N requests to PATH fail with HTTP S (``{"error": {"message"}}``) without being
  handled; ``{"endpoint": PATH, "times": N, "hang": true}`` makes them never answer (a hung
  ``/generate`` is registered under its rid, so ``/abort_request`` ends it; its rid is listed in
  ``/get_server_info`` under ``standin.hung_rids``). Faults on one path fire in the order posted;
  ``standin.faults_pending`` counts those not fired yet; ``{"endpoint": PATH, "clear": true}``
  drops PATH's.
  ``/spade_standin/*`` calls are not logged.

HTTP: a small asyncio HTTP/1.1 server (standard library): keep-alive, ``Content-Length`` bodies,
JSON in and out; event streams with chunked transfer encoding.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import json
import os
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Optional

_ROOT = Path(__file__).resolve().parents[2]
if str(_ROOT) not in sys.path:  # run as a script from anywhere: make ``spade`` importable
    sys.path.insert(0, str(_ROOT))

import torch  # noqa: E402

from spade.rollout.engine import Constraint, GenerationRequest, GenerationResult, SamplingParams  # noqa: E402
from spade.rollout.hf.engine import HFEngine  # noqa: E402
from spade.rollout.weight_buckets import dtype_from_name  # noqa: E402
from spade.rollout.sglang.weight_transport import (  # noqa: E402
    close_update_group,
    deserialize_named_tensors,
    open_update_group,
)

MEMORY_TAGS = ("weights", "kv_cache")
# SGLang's SamplingParams fields. The stand-in implements the first group; the second must keep
# SGLang's defaults (they would change what is sampled); the third only concern text.
_SAMPLING_IMPLEMENTED = {"temperature", "top_p", "top_k", "max_new_tokens", "stop_token_ids",
                         "sampling_seed", "ignore_eos", "no_stop_trim", "json_schema", "regex", "ebnf",
                         "structural_tag", "min_p", "frequency_penalty", "presence_penalty",
                         "repetition_penalty"}
# SGLang's grammar fields (srt/sampling/sampling_params.py); at most one per request, as SGLang
# checks (a ValueError -> 400). The stand-in's engine decodes them with xgrammar, as SGLang does.
_CONSTRAINT_FIELDS = ("json_schema", "regex", "ebnf", "structural_tag")
_SAMPLING_DEFAULTS: dict[str, Any] = {
    "min_p": 0.0, "frequency_penalty": 0.0, "presence_penalty": 0.0, "repetition_penalty": 1.0,
    "min_new_tokens": 0, "n": 1, "json_schema": None, "regex": None,
    "ebnf": None, "structural_tag": None, "logit_bias": None, "custom_params": None,
    "stop": None, "stop_regex": None,
}
_SAMPLING_TEXT_ONLY = {"skip_special_tokens", "spaces_between_special_tokens", "stream_interval"}


class BadRequest(ValueError):
    """Answered with HTTP 400 ``{"error": {"message"}}`` (SGLang's ``_create_error_response``)."""


@dataclass
class Reply:
    status: int
    body: Any = None  # dict/list -> JSON, str -> text, None -> empty
    events: Optional[AsyncIterator[bytes]] = None  # set: a text/event-stream answer instead


def ok(message: str) -> Reply:
    return Reply(200, {"success": True, "message": message})


def failed(message: str) -> Reply:
    """Weight endpoints: HTTP 400 ``{"success": false, "message"}``."""
    return Reply(400, {"success": False, "message": message})


def error(status: int, message: str) -> Reply:
    return Reply(status, {"error": {"message": message}})


@dataclass
class Options:
    model_path: str
    host: str
    port: int
    tp_size: int
    weight_version: str
    skip_tokenizer_init: bool
    weights_cpu_backup: bool
    incremental_streaming: bool
    die_after_generates: Optional[int]
    die_once_file: Optional[str]
    return_routed_experts: bool = False  # --enable-return-routed-experts
    ignored: list[str] = field(default_factory=list)


def parse_args(argv: Optional[list[str]] = None) -> Options:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--model-path", "--model", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--tp-size", "--tensor-parallel-size", "--tp", type=int, default=1)
    p.add_argument("--weight-version", default="default")
    p.add_argument("--skip-tokenizer-init", action="store_true")
    p.add_argument("--enable-weights-cpu-backup", action="store_true")
    p.add_argument("--incremental-streaming-output", action="store_true")
    p.add_argument("--enable-return-routed-experts", action="store_true")
    # accepted and ignored (they change nothing on one CPU)
    p.add_argument("--ep-size", "--expert-parallel-size", type=int, default=1)
    p.add_argument("--dp-size", "--data-parallel-size", type=int, default=1)
    p.add_argument("--mem-fraction-static", type=float, default=None)
    p.add_argument("--enable-memory-saver", action="store_true")
    args, unknown = p.parse_known_args(argv)
    if args.tp_size < 1:
        p.error("--tp-size must be >= 1")
    die_after = os.environ.get("SPADE_STANDIN_DIE_AFTER_GENERATES")
    return Options(
        model_path=args.model_path, host=args.host, port=args.port, tp_size=args.tp_size,
        weight_version=str(args.weight_version), skip_tokenizer_init=args.skip_tokenizer_init,
        weights_cpu_backup=args.enable_weights_cpu_backup,
        incremental_streaming=args.incremental_streaming_output,
        return_routed_experts=args.enable_return_routed_experts,
        die_after_generates=int(die_after) if die_after else None,
        die_once_file=os.environ.get("SPADE_STANDIN_DIE_ONCE_FILE") or None,
        ignored=unknown,
    )


def say(msg: str) -> None:
    print(f"[standin {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _bits(t: torch.Tensor) -> bytes:
    """The tensor's raw bytes (any dtype, 0-d and empty included)."""
    flat = t.detach().contiguous().reshape(-1)
    if flat.numel() == 0:
        return b""
    return flat.view(torch.uint8).numpy().tobytes()


def _int_list(value: Any, what: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise BadRequest(f"{what} must be a list of ints")
    return list(value)


class Standin:
    """The server's state and endpoint handlers (all run on the event loop)."""

    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self.engine = HFEngine(opts.model_path, device="cpu", dtype=torch.float32)
        self.tokenizer = None if opts.skip_tokenizer_init else self.engine.tokenizer
        # HFEngine counts versions as ints; SGLang's weight_version is a free string.
        self.version_names: dict[int, str] = {0: opts.weight_version}
        self.version = 0
        self.released: set[str] = set()
        self.weights_lost = False  # released without CPU backup and not reloaded since
        self.paused = False
        self.unpaused: Optional[asyncio.Event] = None
        self.inflight: dict[str, asyncio.Task] = {}
        self.abort_messages: dict[str, str] = {}
        self.generates = 0
        self.log: list[dict[str, Any]] = []
        self.groups: dict[str, Any] = {}
        self.update_session = False  # between /begin_weight_update and /end_weight_update
        self.faults: dict[str, list[dict[str, Any]]] = {}  # path -> pending faults (POST /spade_standin/fault)
        self.hung_rids: list[str] = []
        self.held = threading.Event()  # the worker is inside the held forward
        self.release = threading.Event()
        self._hold_at: Optional[int] = None  # forwards left until the hold (POST /spade_standin/hold)
        self.engine.model.register_forward_hook(self._maybe_hold)

    def _maybe_hold(self, module, args, out) -> None:  # noqa: ARG002 - a forward hook (worker thread)
        if self._hold_at is None:
            return
        self._hold_at -= 1
        if self._hold_at == 0:
            self._hold_at = None
            self.held.set()
            self.release.wait(60)
            self.held.clear()

    @property
    def weight_version(self) -> str:
        return self.version_names[self.version]

    # ------------------------------------------------------------------ routing

    async def handle(self, method: str, path: str, body: Any) -> Reply:
        if self.unpaused is None:
            self.unpaused = asyncio.Event()
            self.unpaused.set()
        route = self.GET_ROUTES.get(path) if method == "GET" else self.POST_ROUTES.get(path)
        if route is None:
            known = path in self.GET_ROUTES or path in self.POST_ROUTES
            return error(405 if known else 404, f"{method} {path} is not served")
        entry = None
        if method == "POST" and path != "/generate" and not path.startswith("/spade_standin/"):
            entry = {"endpoint": path, "body": _summary(body)}
            self.log.append(entry)
        fault = self._next_fault(path)
        if method == "POST" and body is not None and not isinstance(body, dict):
            reply = error(400, "the request body must be a JSON object")
        elif fault is not None:
            reply = await self._inject(fault, path, body if isinstance(body, dict) else {})
        else:
            try:
                reply = await route(self, body or {})
            except BadRequest as exc:
                reply = error(400, str(exc))
        if entry is not None:
            entry["status"] = reply.status
        return reply

    # ------------------------------------------------------------------ health and info

    async def health(self, _body: dict) -> Reply:
        return Reply(200)

    async def health_generate(self, _body: dict) -> Reply:
        if self.released or self.paused or self.weights_lost:
            return error(503, "not serving (memory released or generation paused)")
        probe = GenerationRequest((0,), SamplingParams(temperature=0.0, max_new_tokens=1))
        await self.engine.generate(probe)
        return Reply(200)

    async def server_info(self, _body: dict) -> Reply:
        o = self.opts
        return Reply(200, {
            "model_path": o.model_path, "tokenizer_path": o.model_path, "tp_size": o.tp_size,
            "dp_size": 1, "ep_size": 1, "host": o.host, "port": o.port,
            "skip_tokenizer_init": o.skip_tokenizer_init, "enable_memory_saver": True,
            "enable_weights_cpu_backup": o.weights_cpu_backup,
            "weight_version": self.weight_version, "version": "spade-standin",
            "standin": {"released": sorted(self.released), "paused": self.paused,
                        "generates": self.generates, "ignored_args": o.ignored, "hung_rids": self.hung_rids,
                        "held": self.held.is_set(),
                        "engine": {"running": self.engine.stats.running,
                                   "generated_tokens": self.engine.stats.generated_tokens,
                                   "aborted": self.engine.stats.aborted},
                        "faults_pending": sum(f["times"] for fs in self.faults.values() for f in fs)},
        })

    async def model_info(self, _body: dict) -> Reply:
        return Reply(200, {
            "model_path": self.opts.model_path, "tokenizer_path": self.opts.model_path,
            "is_generation": True, "preferred_sampling_params": None,
            "weight_version": self.weight_version,
        })

    async def standin_log(self, _body: dict) -> Reply:
        return Reply(200, self.log)

    async def standin_fault(self, body: dict) -> Reply:
        path, times = body.get("endpoint"), body.get("times", 1)
        if not isinstance(path, str) or not path.startswith("/") or path.startswith("/spade_standin/"):
            raise BadRequest(f"fault endpoint must be a served path, got {path!r}")
        if body.get("clear") is True:
            self.faults.pop(path, None)
            return Reply(200)
        if not isinstance(times, int) or times < 1:
            raise BadRequest(f"times must be a positive int, got {times!r}")
        if body.get("hang") is True:
            fault: dict[str, Any] = {"hang": True}
        elif isinstance(body.get("status"), int) and 400 <= body["status"] < 600:
            fault = {"status": body["status"]}
        else:
            raise BadRequest('a fault needs "hang": true or an HTTP error "status"')
        self.faults.setdefault(path, []).append({**fault, "times": times})
        return Reply(200)

    def _next_fault(self, path: str) -> Optional[dict[str, Any]]:
        pending = self.faults.get(path)
        if not pending:
            return None
        fault = pending[0]
        fault["times"] -= 1
        if fault["times"] == 0:
            pending.pop(0)
        return fault

    async def _inject(self, fault: dict[str, Any], path: str, body: dict) -> Reply:
        say(f"fault injection on {path}: {fault}")
        if "status" in fault:
            return error(fault["status"], f"fault injection: HTTP {fault['status']} on {path}")
        if path == "/generate":
            rid = str(body.get("rid") or uuid.uuid4().hex)
            task = asyncio.ensure_future(asyncio.Event().wait())
            self.inflight[rid] = task
            self.hung_rids.append(rid)
            try:
                await asyncio.wait({task})
            finally:
                self.inflight.pop(rid, None)
            return error(503, f"hung request {rid} aborted")
        await asyncio.Event().wait()  # never answers
        return Reply(500)

    async def standin_hold(self, body: dict) -> Reply:
        forward = body.get("forward")
        if not isinstance(forward, int) or forward < 1:
            raise BadRequest(f"forward must be a positive int, got {forward!r}")
        self.release.clear()
        self._hold_at = forward
        return Reply(200)

    async def standin_wait_held(self, _body: dict) -> Reply:
        return Reply(200, {"held": await asyncio.to_thread(self.held.wait, 60)})

    async def standin_release(self, _body: dict) -> Reply:
        self.release.set()
        return Reply(200)

    async def standin_weights(self, _body: dict) -> Reply:
        state = self.engine.model.state_dict()
        return Reply(200, {name: hashlib.sha256(_bits(t)).hexdigest() for name, t in state.items()})

    # ------------------------------------------------------------------ generation

    async def generate(self, body: dict) -> Reply:
        self.generates += 1
        self._maybe_die()
        if self.released:
            return error(400, f"generate while memory is released ({sorted(self.released)}): "
                              f"resume_memory_occupation first")
        while self.paused:
            await self.unpaused.wait()
            if self.released:
                return error(400, f"generate while memory is released ({sorted(self.released)})")
        if self.weights_lost:
            return error(400, "the weights were released without --enable-weights-cpu-backup and "
                              "no weight update has arrived since: the model memory holds garbage")
        request = self._request(body)
        rid = str(body.get("rid") or uuid.uuid4().hex)
        if rid in self.inflight:
            raise BadRequest(f"duplicate rid {rid!r}")
        if body.get("stream"):
            return Reply(200, events=self._events(rid, request, body))
        task = asyncio.ensure_future(self.engine.generate(request))
        self.inflight[rid] = task
        try:
            await asyncio.wait({task})
        finally:
            self.inflight.pop(rid, None)
        if task.cancelled():
            message = self.abort_messages.pop(rid, "aborted")
            finish = {"type": "abort", "message": message, "status_code": 200, "err_type": None}
            return Reply(200, self._output(rid, request, (), (), finish, self.weight_version, body))
        result: GenerationResult = task.result()
        finish = _finish(result.finish_reason, result.token_ids)
        version = self.version_names[result.weight_version]
        return Reply(200, self._output(rid, request, result.token_ids, result.logprobs, finish, version, body,
                                       result.top_logprobs, result.routed_experts))

    async def _events(self, rid: str, request: GenerationRequest, body: dict) -> AsyncIterator[bytes]:
        """The event stream of one request (module docstring)."""
        pieces: asyncio.Queue = asyncio.Queue()

        async def run() -> None:
            async for chunk in self.engine.generate_stream(request):
                pieces.put_nowait(chunk)

        task = asyncio.ensure_future(run())
        task.add_done_callback(lambda _: pieces.put_nowait(None))
        self.inflight[rid] = task
        ids: list[int] = []
        logprobs: list[float] = []
        tops: list = []
        sent = 0
        try:
            while True:
                batch = [await pieces.get()]
                while not pieces.empty():
                    batch.append(pieces.get_nowait())
                finish, version = None, self.weight_version
                for chunk in batch:
                    if chunk is None:  # the run ended: aborted (cancelled) or failed
                        if task.cancelled():
                            message = self.abort_messages.pop(rid, "aborted")
                            finish = {"type": "abort", "message": message, "status_code": 200,
                                      "err_type": None}
                        elif task.exception() is not None:
                            yield _sse({"error": {"message": f"generation failed: {task.exception()!r}",
                                                  "type": "internal_error", "code": 500}})
                            yield _sse(STREAM_DONE)
                            return
                        continue
                    ids += chunk.token_ids
                    logprobs += chunk.logprobs
                    tops += chunk.top_logprobs
                    if chunk.last:
                        finish = _finish(chunk.finish_reason, ids)
                        version = self.version_names[chunk.weight_version]
                if finish is None and len(ids) == sent:
                    continue
                start = sent if self.opts.incremental_streaming else 0
                event = self._output(rid, request, ids[start:], logprobs[start:], finish, version, body,
                                     tops[start:])
                event["meta_info"]["completion_tokens"] = len(ids)
                yield _sse(event)
                sent = len(ids)
                if finish is not None:
                    yield _sse(STREAM_DONE)
                    return
        finally:
            if not task.done():
                task.cancel()  # the client went away: stop generating
            self.inflight.pop(rid, None)

    def _maybe_die(self) -> None:
        n = self.opts.die_after_generates
        if n is None or self.generates != n:
            return
        marker = self.opts.die_once_file
        if marker is not None:
            try:  # O_EXCL: of several servers sharing the marker, exactly one dies
                fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                return
            os.write(fd, f"died on /generate #{n} (port {self.opts.port})\n".encode())
            os.close(fd)
        say(f"fault injection: exiting on /generate #{n}")
        os._exit(1)

    def _request(self, body: dict) -> GenerationRequest:
        if body.get("return_text_in_logprobs"):
            raise BadRequest("return_text_in_logprobs is not supported by the stand-in")
        top = body.get("top_logprobs_num") or 0
        if not isinstance(top, int) or isinstance(top, bool) or top < 0:
            raise BadRequest(f"top_logprobs_num must be a non-negative integer, got {top!r}")
        if "input_ids" in body and body["input_ids"] is not None:
            ids = body["input_ids"]
            if ids and isinstance(ids[0], list):
                raise BadRequest("batched input_ids are not supported by the stand-in")
            prompt = _int_list(ids, "input_ids")
        elif isinstance(body.get("text"), str):
            if self.tokenizer is None:
                raise BadRequest("text input needs the tokenizer (server started with --skip-tokenizer-init)")
            prompt = list(self.tokenizer(body["text"])["input_ids"])
        else:
            raise BadRequest("either input_ids or text is needed")
        if not prompt:
            raise BadRequest("the prompt is empty")
        sp = body.get("sampling_params") or {}
        if not isinstance(sp, dict):
            raise BadRequest("sampling_params must be an object")
        for key, value in sp.items():
            if key in _SAMPLING_IMPLEMENTED or key in _SAMPLING_TEXT_ONLY:
                continue
            if key not in _SAMPLING_DEFAULTS:
                raise BadRequest(f"unknown sampling parameter {key!r}")  # SGLang: TypeError -> 400
            if value not in (None, _SAMPLING_DEFAULTS[key]) and value != []:
                raise BadRequest(f"sampling parameter {key}={value!r} is not supported by the stand-in")
        temperature = float(sp.get("temperature", 1.0))
        top_k = int(sp.get("top_k", -1))
        seed = sp.get("sampling_seed")
        grammars = [key for key in _CONSTRAINT_FIELDS if sp.get(key) is not None]
        if len(grammars) > 1:
            raise BadRequest("Only one of regex, json_schema, ebnf or structural_tag can be set")
        constraint = None
        if grammars:
            spec = sp[grammars[0]]
            if not isinstance(spec, str):
                raise BadRequest(f"{grammars[0]} must be a string")
            constraint = Constraint(grammars[0], spec)
        try:
            sampling = SamplingParams(
                temperature=0.0 if temperature < 1e-6 else temperature,  # SGLang: greedy
                top_p=float(sp.get("top_p", 1.0)),
                top_k=None if top_k <= 0 else top_k,
                max_new_tokens=int(sp.get("max_new_tokens", 128)),
                stop_token_ids=tuple(_int_list(sp.get("stop_token_ids") or [], "stop_token_ids")),
                seed=None if seed is None else int(seed),
                ignore_eos=bool(sp.get("ignore_eos", False)),
                top_logprobs=top,
                # SGLang answers it only with --enable-return-routed-experts (else no capturer, no key)
                return_routed_experts=bool(body.get("return_routed_experts")) and self.opts.return_routed_experts,
                constraint=constraint,
                min_p=float(sp.get("min_p") or 0.0),
                frequency_penalty=float(sp.get("frequency_penalty") or 0.0),
                presence_penalty=float(sp.get("presence_penalty") or 0.0),
                repetition_penalty=float(sp.get("repetition_penalty") or 1.0),
            )
        except (TypeError, ValueError) as exc:
            raise BadRequest(f"bad sampling_params: {exc}") from None
        return GenerationRequest(tuple(prompt), sampling)

    def _output(self, rid: str, request: GenerationRequest, ids, logprobs, finish: dict,
                version: str, body: dict, top_logprobs=(), routed_experts=None) -> dict:
        """A /generate answer as SGLang 0.5.23 builds it (paths in the wheel, ``sglang/srt/...``):
        ``{"output_ids", "meta_info"}`` for a server without a tokenizer
        (``managers/tokenizer_manager.py:2706``, ``"text"`` added with one, :2666); ``meta_info``
        from ``_handle_batch_output`` (``id``, ``finish_reason``, ``prompt_tokens``,
        ``weight_version`` at :2508-2511; ``completion_tokens``, ``cached_tokens`` at :2556-2557)
        and, with ``return_logprob``, ``add_logprob_to_meta_info`` (:2868-2869) whose triples are
        ``detokenize_logprob_tokens``' ``(logprob, token_id, None)`` (:3104-3108). A subset of
        SGLang's keys: ``tests/rollout/test_sglang_upstream.py`` checks them against that source. With
        ``top_logprobs_num``, ``meta_info.output_top_logprobs``: per output token a list of
        ``(logprob, token_id, None)``, most likely first (``detokenize_top_logprobs_tokens``).
        With ``return_routed_experts`` on a server started with ``--enable-return-routed-experts``,
        ``meta_info.routed_experts``: base64 of the int32 ``[prompt + output - 1, layers, top_k]``
        ids (``tokenizer_manager.py``: ``pybase64.b64encode(val.numpy().tobytes())``); the hf
        engine reads them from transformers' routers. Without the flag SGLang has no capturer and
        answers without the key, as here."""
        meta: dict[str, Any] = {
            "id": rid,
            "finish_reason": finish,
            "prompt_tokens": len(request.prompt_ids),
            "completion_tokens": len(ids),
            "cached_tokens": 0,
            "weight_version": version,
        }
        if body.get("return_logprob"):
            meta["input_token_logprobs"] = []
            meta["output_token_logprobs"] = [[float(lp), int(t), None] for lp, t in zip(logprobs, ids)]
            if body.get("top_logprobs_num"):
                meta["input_top_logprobs"] = []
                meta["output_top_logprobs"] = [[[float(lp), int(t), None] for t, lp in top]
                                               for top in top_logprobs]
        if routed_experts is not None:
            ids32 = routed_experts.to_tensor().to(torch.int32)
            meta["routed_experts"] = base64.b64encode(ids32.numpy().tobytes()).decode("utf-8")
        out: dict[str, Any] = {"output_ids": list(ids), "meta_info": meta}
        if self.tokenizer is not None:
            out["text"] = self.tokenizer.decode(list(ids))
        return out

    def _abort(self, rid: str, message: str) -> bool:
        task = self.inflight.get(rid)
        if task is None or task.done():
            return False
        self.abort_messages[rid] = message
        task.cancel()
        return True

    async def abort_request(self, body: dict) -> Reply:
        if body.get("abort_all"):
            for rid in list(self.inflight):
                self._abort(rid, "aborted by /abort_request")
        elif body.get("rid"):
            self._abort(str(body["rid"]), "aborted by /abort_request")
        return Reply(200)

    async def pause_generation(self, body: dict) -> Reply:
        mode = body.get("mode", "abort")
        if mode not in ("abort", "retract", "in_place"):
            raise BadRequest(f"unknown pause mode {mode!r}")
        self.paused = True
        self.unpaused.clear()
        if mode == "abort":
            for rid in list(self.inflight):
                self._abort(rid, "aborted by /pause_generation")
        # srt/entrypoints/http_server.py:1839 (pause_generation) answers this object
        return Reply(200, {"message": "Generation paused successfully.", "status": "ok"})

    async def continue_generation(self, _body: dict) -> Reply:
        self.paused = False
        self.unpaused.set()
        # srt/entrypoints/http_server.py:1852 (continue_generation)
        return Reply(200, {"message": "Generation continued successfully.", "status": "ok"})

    async def flush_cache(self, _body: dict) -> Reply:
        if self.inflight:
            return Reply(400, "Cache not flushed: requests are running.\n")
        return Reply(200, "Cache flushed.\n")

    # ------------------------------------------------------------------ memory

    @staticmethod
    def _tags(body: dict) -> list[str]:
        tags = body.get("tags")
        if tags is None:
            return list(MEMORY_TAGS)
        if not isinstance(tags, list) or any(t not in MEMORY_TAGS for t in tags):
            raise BadRequest(f"tags must be a subset of {list(MEMORY_TAGS)}, got {tags!r}")
        return tags

    async def release_memory(self, body: dict) -> Reply:
        tags = self._tags(body)
        if self.inflight:
            return error(400, f"release_memory_occupation with {len(self.inflight)} request(s) running")
        already = [t for t in tags if t in self.released]
        if already:
            return error(400, f"already released: {already}")
        self.released.update(tags)
        if "weights" in tags and not self.opts.weights_cpu_backup:
            self.weights_lost = True
        return Reply(200)

    async def resume_memory(self, body: dict) -> Reply:
        tags = self._tags(body)
        missing = [t for t in tags if t not in self.released]
        if missing:
            return error(400, f"not released: {missing}")
        self.released.difference_update(tags)
        return Reply(200)

    # ------------------------------------------------------------------ weights

    async def begin_weight_update(self, _body: dict) -> Reply:
        if self.update_session:
            return failed("a weight-update session is already open; call end_weight_update() first")
        self.update_session = True
        return ok("weight-update session open")

    async def end_weight_update(self, _body: dict) -> Reply:
        if not self.update_session:
            return failed("no weight-update session is open; call begin_weight_update() first")
        self.update_session = False
        return ok("weight-update session closed")

    async def _load(self, named: list[tuple[str, torch.Tensor]], weight_version: Any) -> Optional[str]:
        """Load into the model; returns an error message or None."""
        if not self.update_session:  # SGLang 0.5.23: weight_updater.py refuses updates outside one
            return "update_weights must run between begin_weight_update() and end_weight_update()"
        if "weights" in self.released:
            return "weights are released: resume_memory_occupation(weights) before updating them"
        new = self.version + 1
        try:
            await self.engine.update_weights(named, new)
        except (KeyError, ValueError, RuntimeError, TypeError) as exc:
            return f"loading the weights failed: {exc}"
        self.version_names[new] = self.weight_version if weight_version is None else str(weight_version)
        self.version = new
        self.weights_lost = False
        return None

    async def update_weights_from_tensor(self, body: dict) -> Reply:
        entries = body.get("serialized_named_tensors")
        tp = self.opts.tp_size
        if not isinstance(entries, list):
            return failed("serialized_named_tensors must be a list (one entry per TP rank)")
        if len(entries) != tp:
            return failed(f"serialized_named_tensors has {len(entries)} entries; this server has "
                          f"tp_size={tp} and needs one per TP rank")
        if body.get("load_format") not in (None, "direct"):
            return failed(f"load_format {body.get('load_format')!r} is not supported by the stand-in")
        try:
            ranks = [deserialize_named_tensors(e) for e in entries]
        except Exception as exc:  # noqa: BLE001 - anything undecodable is the client's fault
            return failed(f"cannot decode serialized_named_tensors: {exc!r}")
        reference = ranks[0]
        for r, other in enumerate(ranks[1:], start=1):
            if [n for n, _ in other] != [n for n, _ in reference]:
                return failed(f"TP rank {r} got other tensor names than rank 0")
            for (name, a), (_, b) in zip(reference, other):
                if a.dtype != b.dtype or a.shape != b.shape or _bits(a) != _bits(b):
                    return failed(f"TP rank {r} got other values for {name} than rank 0")
        problem = await self._load(reference, body.get("weight_version"))
        if problem:
            return failed(problem)
        return ok("Succeeded to update model weights.")

    async def init_weights_update_group(self, body: dict) -> Reply:
        if self.opts.tp_size != 1:
            return failed("the stand-in serves the broadcast path only with --tp-size 1")
        name = body.get("group_name", "weight_update_group")
        if name in self.groups:
            return failed(f"a weight update group named {name!r} already exists")
        try:
            group = await asyncio.to_thread(
                open_update_group, backend=str(body.get("backend", "nccl")),
                master_address=str(body["master_address"]), master_port=int(body["master_port"]),
                rank=int(body["rank_offset"]), world_size=int(body["world_size"]), group_name=name,
                timeout_s=float(os.environ.get("SPADE_STANDIN_GROUP_TIMEOUT_S", "120")),
            )
        except Exception as exc:  # noqa: BLE001
            return failed(f"Failed to initialize custom process group: {exc!r}")
        self.groups[name] = group
        return ok("Succeeded to initialize custom process group.")

    async def update_weights_from_distributed(self, body: dict) -> Reply:
        name = body.get("group_name", "weight_update_group")
        group = self.groups.get(name)
        if group is None:
            return failed(f"no weight update group named {name!r}")
        names, dtypes, shapes = body.get("names"), body.get("dtypes"), body.get("shapes")
        if not (isinstance(names, list) and isinstance(dtypes, list) and isinstance(shapes, list)
                and len(names) == len(dtypes) == len(shapes)):
            return failed("names, dtypes and shapes must be lists of one length")
        try:
            empties = [torch.empty([int(s) for s in shape], dtype=dtype_from_name(str(d)))
                       for d, shape in zip(dtypes, shapes)]
        except (ValueError, TypeError) as exc:
            return failed(f"bad tensor metadata: {exc}")

        def receive() -> None:
            import torch.distributed as dist

            for tensor in empties:  # in the order of ``names``, like SGLang's workers
                dist.broadcast(tensor, src=0, group=group)

        try:
            await asyncio.to_thread(receive)
        except Exception as exc:  # noqa: BLE001
            return failed(f"receiving the tensors failed: {exc!r}")
        # Judged only after receiving everything, so the group stays in step with the sender.
        problem = await self._load(list(zip(map(str, names), empties)), body.get("weight_version"))
        if problem:
            return failed(problem)
        return ok("Succeeded to update parameter online from distributed.")

    async def destroy_weights_update_group(self, body: dict) -> Reply:
        name = body.get("group_name", "weight_update_group")
        group = self.groups.pop(name, None)
        if group is None:
            return failed(f"no weight update group named {name!r}")
        close_update_group(group)
        return ok("Succeeded to destroy custom process group.")

    GET_ROUTES = {
        "/health": health,
        "/health_generate": health_generate,
        "/get_server_info": server_info,
        "/get_model_info": model_info,
        "/spade_standin/log": standin_log,
        "/spade_standin/weights": standin_weights,
        "/spade_standin/held": standin_wait_held,
    }
    POST_ROUTES = {
        "/generate": generate,
        "/abort_request": abort_request,
        "/pause_generation": pause_generation,
        "/continue_generation": continue_generation,
        "/flush_cache": flush_cache,
        "/release_memory_occupation": release_memory,
        "/resume_memory_occupation": resume_memory,
        "/update_weights_from_tensor": update_weights_from_tensor,
        "/begin_weight_update": begin_weight_update,
        "/end_weight_update": end_weight_update,
        "/init_weights_update_group": init_weights_update_group,
        "/update_weights_from_distributed": update_weights_from_distributed,
        "/destroy_weights_update_group": destroy_weights_update_group,
        "/spade_standin/fault": standin_fault,
        "/spade_standin/hold": standin_hold,
        "/spade_standin/release": standin_release,
    }
    # SGLang serves these as GET too
    GET_ROUTES["/flush_cache"] = flush_cache


STREAM_DONE = "[DONE]"


def _sse(value: Any) -> bytes:
    """One server-sent event: ``data: <json>`` (or the literal ``[DONE]``) and a blank line."""
    data = value if isinstance(value, str) else json.dumps(value)
    return f"data: {data}\n\n".encode()


def _finish(reason: str, ids) -> dict:
    """SGLang's ``FINISH_*.to_json()`` for one of our finish reasons (``srt/managers/schedule_batch.py``:
    ``FINISH_MATCHED_TOKEN`` :289, ``FINISH_LENGTH`` :325, ``FINISH_ABORT`` :339)."""
    if reason == "stop":
        return {"type": "stop", "matched": ids[-1]}
    if reason == "length":
        return {"type": "length", "length": len(ids)}
    return {"type": "abort", "message": "aborted", "status_code": 200, "err_type": None}


def _summary(body: Any) -> Any:
    """The body for the log, with tensor payloads replaced by their count."""
    if not isinstance(body, dict):
        return body
    out = dict(body)
    if "serialized_named_tensors" in out and isinstance(out["serialized_named_tensors"], list):
        out["serialized_named_tensors"] = f"<{len(out['serialized_named_tensors'])} entries>"
    return out


# ---------------------------------------------------------------------------------- HTTP/1.1

_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            411: "Length Required", 500: "Internal Server Error", 503: "Service Unavailable"}


async def _read_request(reader: asyncio.StreamReader) -> Optional[tuple[str, str, str, dict, bytes]]:
    line = await reader.readline()
    if not line.strip():
        return None
    method, target, version = line.decode("latin-1").strip().split(" ", 2)
    headers: dict[str, str] = {}
    while True:
        h = await reader.readline()
        if h in (b"\r\n", b"\n", b""):
            break
        k, _, v = h.decode("latin-1").partition(":")
        headers[k.strip().lower()] = v.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        raise BadRequest("chunked request bodies are not supported")
    body = await reader.readexactly(int(headers.get("content-length", "0") or 0))
    return method.upper(), target.split("?", 1)[0], version, headers, body


def _encode(reply: Reply, keep_alive: bool) -> bytes:
    if reply.body is None:
        payload, ctype = b"", "application/json"
    elif isinstance(reply.body, str):
        payload, ctype = reply.body.encode(), "text/plain; charset=utf-8"
    else:
        payload, ctype = json.dumps(reply.body).encode(), "application/json"
    head = (f"HTTP/1.1 {reply.status} {_REASONS.get(reply.status, 'Status')}\r\n"
            f"Content-Type: {ctype}\r\nContent-Length: {len(payload)}\r\n"
            f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n")
    return head.encode("latin-1") + payload


async def _write_events(writer: asyncio.StreamWriter, reply: Reply, keep_alive: bool) -> None:
    """A text/event-stream answer in chunked encoding; a failed write closes the events (which
    stops the request) and ends the connection."""
    head = (f"HTTP/1.1 {reply.status} {_REASONS.get(reply.status, 'Status')}\r\n"
            f"Content-Type: text/event-stream; charset=utf-8\r\nTransfer-Encoding: chunked\r\n"
            f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n")
    events = reply.events
    try:
        writer.write(head.encode("latin-1"))
        await writer.drain()
        async for event in events:
            writer.write(f"{len(event):x}\r\n".encode("latin-1") + event + b"\r\n")
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
    finally:
        await events.aclose()


async def serve(opts: Options) -> None:
    standin = Standin(opts)

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    request = await _read_request(reader)
                except (asyncio.IncompleteReadError, ConnectionError, ValueError):
                    return
                if request is None:
                    return
                method, path, version, headers, raw = request
                keep_alive = (headers.get("connection", "").lower() != "close"
                              and version.upper() == "HTTP/1.1")
                try:
                    body = json.loads(raw) if raw.strip() else None
                except ValueError:
                    reply = error(400, "the request body is not valid JSON")
                else:
                    try:
                        reply = await standin.handle(method, path, body)
                    except Exception as exc:  # noqa: BLE001 - a server answers, it does not die
                        say(f"{method} {path} failed: {exc!r}")
                        reply = error(500, f"internal error: {exc!r}")
                if path not in ("/health", "/spade_standin/log"):
                    say(f"{method} {path} -> {reply.status}")
                if reply.events is not None:
                    await _write_events(writer, reply, keep_alive)
                else:
                    writer.write(_encode(reply, keep_alive))
                    await writer.drain()
                if not keep_alive:
                    return
        except (ConnectionError, OSError):
            return
        finally:
            writer.close()

    server = await asyncio.start_server(connection, opts.host, opts.port, reuse_address=True)
    say(f"serving {opts.model_path} (tp_size={opts.tp_size}) on http://{opts.host}:{opts.port}; "
        f"ignored arguments: {opts.ignored}")
    say("The server is fired up and ready to roll!")
    async with server:
        await server.serve_forever()


def main(argv: Optional[list[str]] = None) -> None:
    opts = parse_args(argv)
    asyncio.run(serve(opts))


if __name__ == "__main__":
    main()
