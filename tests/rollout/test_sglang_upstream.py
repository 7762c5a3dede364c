"""spade's SGLang client, its launcher flags and the test stand-in, held to SGLang 0.5.23's own code.

The other SGLang tests run against ``tests/sglang_standin`` and bodies written from reading
SGLang, so a misreading would sit in both the client and the stand-in. Here SGLang's own code
(``tests/sglang_source.py``; ``make sglang-src`` installs it) is the judge:

* every request the real client sends (captured from ``SGLangEngine`` and the weight senders
  talking over HTTP to a recording server) goes to a route of SGLang's HTTP server with a method
  that route serves, and its JSON body parses into the request struct that route declares, as
  FastAPI does it (pydantic over SGLang's own schema), with no key the struct lacks (SGLang would
  silently ignore a misspelt one). ``/generate`` bodies also pass SGLang's schema gate and become
  its ``SamplingParams``; tensor payloads decode with SGLang's ``MultiprocessingSerializer``;
* the stand-in's routes exist in SGLang's table, its ``meta_info`` keys are keys SGLang's
  ``tokenizer_manager`` writes, its finish reasons and log-prob triples have the layout of
  SGLang's ``FINISH_*.to_json()`` and ``detokenize_logprob_tokens``;
* the command line ``sglang_argv`` builds, for every recipe that runs SGLang, parses with
  ``ServerArgs``' own argument parser into a ``ServerArgs``.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import dataclasses
import json
import types
from pathlib import Path
from typing import Any

import pydantic
import pytest
import torch

import sglang_source as upstream
from sglang_standin import server as standin
from spade.rollout.engine import GenerationRequest, SamplingParams
from spade.rollout.sglang import control_protocol as control
from spade.rollout.sglang import protocol as proto
from spade.rollout.sglang import weight_transport
from spade.rollout.sglang.deployment import ServerPlan, SGLangDeployment
from spade.rollout.sglang.engine import SGLangEngine
from spade.rollout.sglang.weight_transport import BroadcastWeightSender, IpcWeightUpdater
from spade.train_config import load_train_config

REPO = Path(__file__).resolve().parents[2]
HOLD_TOKENS = 77  # a /generate asking for this many tokens is held until the client gives up on it
SERVER_TP = 2  # what the recording servers report in /get_server_info


@pytest.fixture(scope="module")
def sg() -> upstream.SGLang:
    yield upstream.load()
    upstream.unload()


@pytest.fixture(scope="module")
def route_table(sg) -> dict[str, upstream.Route]:
    return upstream.routes()


# ------------------------------------------------------------------ a recording SGLang server


@dataclasses.dataclass(frozen=True)
class Sent:
    server: int
    method: str
    path: str
    body: Any  # the decoded JSON body, None when there was none
    raw: bytes


class RecordingServers:
    """HTTP/1.1 servers that keep every request and answer as SGLang 0.5.23 does (the /generate
    answers are the stand-in's, checked against SGLang below). Tensor payloads are decoded with
    SGLang's own ``MultiprocessingSerializer`` (which also hands the shared memory back)."""

    def __init__(self, sg: upstream.SGLang, count: int) -> None:
        self.sg = sg
        self.count = count
        self.sent: list[Sent] = []
        self.decoded: list[list] = []
        self.errors: list[str] = []  # what the handlers raised
        self.held = asyncio.Event()
        self.release = asyncio.Event()
        self.servers: list[asyncio.AbstractServer] = []
        self.urls: list[str] = []

    async def __aenter__(self) -> "RecordingServers":
        for index in range(self.count):
            server = await asyncio.start_server(
                lambda r, w, i=index: self._connection(i, r, w), "127.0.0.1", 0)
            self.servers.append(server)
            self.urls.append(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.release.set()
        for server in self.servers:
            server.close()
            await server.wait_closed()

    async def _connection(self, index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                line = await reader.readline()
                if not line:
                    return
                method, target, _version = line.decode("latin-1").split(" ", 2)
                headers: dict[str, str] = {}
                while (h := await reader.readline()) not in (b"\r\n", b"\n", b""):
                    k, _, v = h.decode("latin-1").partition(":")
                    headers[k.strip().lower()] = v.strip()
                size = int(headers.get("content-length", "0"))
                raw = await reader.readexactly(size) if size else b""
                path = target.split("?", 1)[0]
                body = json.loads(raw) if raw else None
                self.sent.append(Sent(index, method, path, body, raw))
                try:
                    await self._answer(writer, path, body)
                except Exception as exc:  # a payload SGLang's code cannot take: say which
                    self.errors.append(f"{path}: {exc!r}")
                    self._reply(writer, 500, {"error": {"message": repr(exc)}})
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            writer.close()

    @staticmethod
    def _reply(writer: asyncio.StreamWriter, status: int, payload: Any, ctype: str = "application/json") -> None:
        data = b"" if payload is None and status == 200 and ctype == "" else (
            payload.encode() if isinstance(payload, str) else json.dumps(payload).encode())
        head = (f"HTTP/1.1 {status} X\r\nContent-Type: {ctype or 'application/json'}\r\n"
                f"Content-Length: {len(data)}\r\n\r\n").encode()
        writer.write(head + data)

    async def _answer(self, writer: asyncio.StreamWriter, path: str, body: Any) -> None:
        if path == "/generate":
            await self._generate(writer, body)
        elif path == "/health":
            self._reply(writer, 200, None, "")
        elif path == "/get_server_info":
            self._reply(writer, 200, {"tp_size": SERVER_TP, "dp_size": 1, "version": self.sg.version,
                                      "weight_version": "default"})
        elif path == "/update_weights_from_tensor":
            self.decoded.append([self.sg.serializer.deserialize(entry) for entry in body["serialized_named_tensors"]])
            self._reply(writer, 200, {"success": True, "message": "Success"})
        elif path in ("/begin_weight_update", "/end_weight_update", "/init_weights_update_group",
                      "/destroy_weights_update_group", "/update_weights_from_distributed"):
            self._reply(writer, 200, {"success": True, "message": "Success"})
        elif path in ("/pause_generation", "/continue_generation"):
            self._reply(writer, 200, {"message": "ok", "status": "ok"})
        elif path in ("/release_memory_occupation", "/resume_memory_occupation"):
            self._reply(writer, 200, None)
        elif path == "/flush_cache":
            self._reply(writer, 200, "Cache flushed.\n", "text/plain")
        elif path == "/abort_request":
            self._reply(writer, 200, None, "")
        else:
            self._reply(writer, 404, {"detail": "Not Found"})
        await writer.drain()

    async def _generate(self, writer: asyncio.StreamWriter, body: dict) -> None:
        sp = body["sampling_params"]
        if sp["max_new_tokens"] == HOLD_TOKENS:
            self.held.set()
            await self.release.wait()
            return
        ids = list(range(11, 11 + min(3, sp["max_new_tokens"])))
        request = GenerationRequest(tuple(body["input_ids"]), SamplingParams(max_new_tokens=sp["max_new_tokens"]))
        out = standin.Standin._output(types.SimpleNamespace(tokenizer=None), body["rid"], request, ids,
                                      [-0.5] * len(ids), standin._finish("length", ids), "default", body)
        if not body.get("stream"):
            self._reply(writer, 200, out)
            return
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        for event in (standin._sse(out), standin._sse(standin.STREAM_DONE)):
            writer.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
        writer.write(b"0\r\n\r\n")


def _request(**kw: Any) -> GenerationRequest:
    return GenerationRequest(prompt_ids=(1, 2, 3), sampling=SamplingParams(**kw))


async def _drive_client(rec: RecordingServers) -> None:
    """What spade's client does in a run, against the recording servers."""
    engine = SGLangEngine(rec.urls, weight_updater=IpcWeightUpdater(), control_timeout_s=30, request_timeout_s=30)
    await engine.health()
    await engine.server_info()
    await engine.generate(_request(temperature=0.7, top_p=0.9, top_k=20, max_new_tokens=3, stop_token_ids=(2,),
                                   seed=5, ignore_eos=True))
    await engine.generate(_request(temperature=0.0, max_new_tokens=3))
    async for _chunk in engine.generate_stream(_request(temperature=1.0, max_new_tokens=3)):
        pass
    await engine.release_memory()
    await engine.resume_and_update([("model.w", torch.arange(6, dtype=torch.float32).view(2, 3)),
                                    ("model.b", torch.ones(2, dtype=torch.bfloat16))], version=3)
    await engine.flush_cache()
    # close with a request in flight: the client aborts it on the server
    pending = asyncio.ensure_future(engine.generate(_request(max_new_tokens=HOLD_TOKENS)))
    await asyncio.wait_for(rec.held.wait(), 30)
    await engine.aclose()
    await asyncio.gather(pending, return_exceptions=True)

    # the disaggregated path: a broadcast over a process group (the group itself is not built here)
    other = SGLangEngine(rec.urls, control_timeout_s=30)
    sender = BroadcastWeightSender(other, server_tp_sizes=[1] * len(rec.urls), master_address="127.0.0.1",
                                   master_port=29999, backend="gloo", device="cpu")
    other.weight_updater = sender
    await other.update_weights([("model.w", torch.zeros(3)), ("model.h", torch.zeros(2, 2, dtype=torch.float16))], 4)
    await sender.close()
    await other.aclose()


@pytest.fixture(scope="module")
def recorded(sg) -> RecordingServers:
    """The recording servers after ``_drive_client``: every request the client sent (``sent``) and
    the tensor payloads as SGLang's serializer decoded them when they arrived (``decoded``)."""

    async def run() -> RecordingServers:
        async with RecordingServers(sg, 2) as rec:
            try:
                await asyncio.wait_for(_drive_client(rec), 120)
            finally:
                assert not rec.errors, rec.errors
            return rec

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(weight_transport, "open_update_group", lambda **_kw: object())
        mp.setattr(weight_transport, "close_update_group", lambda _group: None)
        mp.setattr(BroadcastWeightSender, "_broadcast", lambda self, tensors: None)
        return asyncio.run(run())


@pytest.fixture(scope="module")
def sent(recorded) -> list[Sent]:
    return recorded.sent


# ------------------------------------------------------------------ requests: routes and bodies


def _fields(cls: type) -> set[str]:
    import msgspec  # from .sglang-src, on the path once SGLang is loaded

    if isinstance(cls, type) and issubclass(cls, msgspec.Struct):
        return {f.name for f in msgspec.structs.fields(cls)}
    return {f.name for f in dataclasses.fields(cls)}


def parse_like_sglang(sg: upstream.SGLang, table: dict[str, upstream.Route], method: str, path: str,
                      body: Any) -> Any:
    """What SGLang 0.5.23's HTTP server makes of one request: the route must exist and serve the
    method; the body must parse into the route's request struct (FastAPI: pydantic over the
    struct's schema, which SGLang builds in ``srt/utils/msgspec_utils.py``) with no key the struct
    lacks. Returns the parsed struct (None for a route without a body)."""
    route = table.get(path)
    assert route is not None, f"{method} {path}: SGLang {sg.version}'s http_server.py has no such route"
    assert method in route.methods, (
        f"{method} {path}: SGLang serves it with {sorted(route.methods)} (http_server.py:{route.line})")
    if route.body is None:
        assert body in (None, {}), f"{path} takes no body in SGLang (http_server.py:{route.line}), got {body!r}"
        return None
    cls = getattr(sg.io_struct, route.body)
    assert isinstance(body, dict), f"{path}: the body must be a JSON object, got {body!r}"
    unknown = set(body) - _fields(cls)
    assert not unknown, (f"{path}: {sorted(unknown)} not fields of SGLang's {route.body} "
                         f"(it has {sorted(_fields(cls))}); SGLang would ignore them")
    try:
        return pydantic.TypeAdapter(cls).validate_python(body)
    except pydantic.ValidationError as exc:
        raise AssertionError(f"{path}: SGLang's {route.body} refuses the body: {exc}") from None


def check_generate_body(sg: upstream.SGLang, body: dict) -> None:
    """The /generate extras: the schema gate (``srt/entrypoints/api_contract.py``) and SGLang's
    ``SamplingParams`` built, normalized and verified as ``tokenizer_manager.py`` does."""
    gate = sg.api_contract.generate_contract_error(body)
    assert gate is None, f"/generate: SGLang's schema gate answers HTTP 400: {gate}"
    params = sg.sampling_params.SamplingParams(**body["sampling_params"])
    params.normalize(None)
    params.verify(151_936)


EXPECTED_PATHS = {
    "/health", "/get_server_info", "/generate", "/pause_generation", "/release_memory_occupation",
    "/resume_memory_occupation", "/begin_weight_update", "/update_weights_from_tensor", "/end_weight_update",
    "/flush_cache", "/continue_generation", "/abort_request", "/init_weights_update_group",
    "/update_weights_from_distributed", "/destroy_weights_update_group",
}


def test_the_client_run_reaches_every_endpoint_it_uses(sent):
    assert {s.path for s in sent} >= EXPECTED_PATHS, EXPECTED_PATHS - {s.path for s in sent}
    assert any(s.path == "/generate" and s.body["stream"] for s in sent)


def test_every_request_the_client_sends_is_one_sglang_parses(sg, route_table, sent):
    for s in sent:
        parsed = parse_like_sglang(sg, route_table, s.method, s.path, s.body)
        if s.path == "/generate":
            check_generate_body(sg, s.body)
            assert parsed.input_ids == s.body["input_ids"] and parsed.return_logprob is True
        if s.path == "/update_weights_from_tensor":
            assert len(parsed.serialized_named_tensors) == SERVER_TP  # one entry per TP worker
            assert parsed.weight_version == "3" and all(isinstance(b, bytes) for b in parsed.serialized_named_tensors)


def test_what_sglang_makes_of_the_bodies(sg, route_table, sent):
    """The values land in the fields spade means (not just any field): read back from the structs."""
    by_path: dict[str, list] = {}
    for s in sent:
        by_path.setdefault(s.path, []).append(parse_like_sglang(sg, route_table, s.method, s.path, s.body))
    assert [p.mode for p in by_path["/pause_generation"]] == ["abort", "abort"]
    assert sorted(tuple(p.tags) for p in by_path["/release_memory_occupation"]) == [("weights", "kv_cache")] * 2
    resumed = sorted(tuple(p.tags) for p in by_path["/resume_memory_occupation"])
    assert resumed == [("kv_cache",)] * 2 + [("weights",)] * 2
    assert all(p.rid and not p.abort_all for p in by_path["/abort_request"])
    dist = by_path["/update_weights_from_distributed"]
    assert {tuple(p.names) for p in dist} == {("model.w", "model.h")}
    assert {tuple(p.dtypes) for p in dist} == {("float32", "float16")} and {p.weight_version for p in dist} == {"4"}
    assert {tuple(map(tuple, p.shapes)) for p in dist} == {((3,), (2, 2))}
    init = by_path["/init_weights_update_group"]
    assert sorted(p.rank_offset for p in init) == [1, 2] and {p.world_size for p in init} == {3}
    assert {p.backend for p in init} == {"gloo"}
    greedy = [s.body for s in sent if s.path == "/generate" and s.body["sampling_params"]["temperature"] == 0.0]
    params = sg.sampling_params.SamplingParams(**greedy[0]["sampling_params"])
    params.normalize(None)
    assert params.top_k == 1  # SGLang's greedy: what spade.rollout.engine specifies for temperature 0


def test_tensor_payloads_decode_with_sglangs_own_unpickler(recorded):
    """Decoded on arrival by SGLang's ``MultiprocessingSerializer.deserialize`` (its SafeUnpickler
    allows only a list of globals), one entry per TP worker of each of the two servers."""
    assert len(recorded.decoded) == 2 and all(len(entries) == SERVER_TP for entries in recorded.decoded)
    for entries in recorded.decoded:
        for named in entries:
            assert [n for n, _t in named] == ["model.w", "model.b"]
            assert torch.equal(named[0][1], torch.arange(6, dtype=torch.float32).view(2, 3))
            assert named[1][1].dtype == torch.bfloat16 and torch.equal(named[1][1].float(), torch.ones(2))


@pytest.mark.parametrize("body", [
    control.pause_generation_payload("retract"), control.pause_generation_payload("in_place"),
    control.continue_generation_payload(torch_empty_cache=False), control.release_memory_payload(None),
    control.release_memory_payload(["cuda_graph"]), control.abort_request_payload("r", abort_all=True),
    control.begin_weight_update_payload("target"),
    control.update_weights_from_distributed_payload(["w"], ["bfloat16"], [[2]], load_format="flattened_bucket",
                                                    abort_all_requests=True, torch_empty_cache=True, selector="draft"),
    control.update_weights_from_tensor_payload(["AA=="], load_format="direct", abort_all_requests=False,
                                               torch_empty_cache=True, selector="all", weight_version=9),
    control.init_weights_update_group_payload("10.0.0.1", 29500, 1, 3, group_name="g", backend="nccl"),
    control.destroy_weights_update_group_payload("g"),
], ids=lambda b: ",".join(sorted(b)) or "empty")
def test_every_option_of_the_body_builders_parses(sg, route_table, body):
    """Options the run above does not use, built by the same functions."""
    paths = {frozenset(control.pause_generation_payload("abort")): "/pause_generation",
             frozenset(control.continue_generation_payload(torch_empty_cache=False)): "/continue_generation",
             frozenset({"tags"}): "/release_memory_occupation", frozenset({"rid", "abort_all"}): "/abort_request",
             frozenset({"selector"}): "/begin_weight_update",
             frozenset({"group_name"}): "/destroy_weights_update_group"}
    if "names" in body:
        path = "/update_weights_from_distributed"
    elif "serialized_named_tensors" in body:
        path = "/update_weights_from_tensor"
    elif "master_address" in body:
        path = "/init_weights_update_group"
    else:
        path = paths[frozenset(body)]
    parse_like_sglang(sg, route_table, "POST", path, json.loads(json.dumps(body)))


def test_every_endpoint_in_the_clients_table_is_an_sglang_route(sg, route_table):
    for name, (method, path) in proto.ENDPOINTS.items():
        route = route_table.get(path)
        assert route is not None, f"ENDPOINTS[{name!r}] = {path}: not a route of SGLang {sg.version}"
        assert method in route.methods, f"ENDPOINTS[{name!r}]: {method} {path}, SGLang serves {sorted(route.methods)}"


def test_the_checks_catch_a_renamed_field_a_wrong_type_and_a_missing_route(sg, route_table):
    good = control.abort_request_payload("r")
    parse_like_sglang(sg, route_table, "POST", "/abort_request", good)
    with pytest.raises(AssertionError, match="abort_al"):
        parse_like_sglang(sg, route_table, "POST", "/abort_request", {"rid": "r", "abort_al": True})
    with pytest.raises(AssertionError, match="weight_version"):
        parse_like_sglang(sg, route_table, "POST", "/update_weights_from_tensor",
                          {"serialized_named_tensors": ["AA=="], "weight_version": 3})
    with pytest.raises(AssertionError, match="no such route"):
        parse_like_sglang(sg, route_table, "POST", "/update_weights", {})
    with pytest.raises(AssertionError, match="serves it with"):
        parse_like_sglang(sg, route_table, "GET", "/abort_request", None)
    with pytest.raises(AssertionError, match="schema gate"):
        check_generate_body(sg, {"input_ids": [1], "sampling_params": {"seed": 1}})


# ------------------------------------------------------------------ the stand-in's answers


def _sglang_meta_keys() -> dict[str, str]:
    """Every key SGLang 0.5.23's tokenizer manager writes into a /generate answer's meta_info, with
    the place that writes it: ``_handle_batch_output``, ``add_logprob_to_meta_info`` (its log-prob
    fields), ``add_weight_versions_to_meta_info`` (``srt/utils/weight_versions.py``) and
    ``_stream_one_response`` (``response_sent_to_client_ts``, written as ``out["meta_info"][key]``)."""
    tm = upstream.source("srt/managers/tokenizer_manager.py")
    wv = upstream.source("srt/utils/weight_versions.py")
    keys: dict[str, str] = {}
    for path, fn, cls in ((tm, "_handle_batch_output", "TokenizerManager"),
                          (tm, "add_logprob_to_meta_info", "TokenizerManager"),
                          (wv, "add_weight_versions_to_meta_info", None)):
        for key, line in upstream.dict_keys_written(upstream.function_def(path, fn, cls), "meta_info").items():
            keys.setdefault(key, f"{path.relative_to(upstream.package_dir().parent)}:{line}")
    for node in ast.walk(upstream.function_def(tm, "_stream_one_response", "TokenizerManager")):
        if (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Subscript)
                and isinstance(node.value.slice, ast.Constant) and node.value.slice.value == "meta_info"
                and isinstance(node.slice, ast.Constant) and isinstance(node.ctx, ast.Store)):
            keys.setdefault(node.slice.value, f"tokenizer_manager.py:{node.lineno}")
    return keys


def _output_keys() -> set[str]:
    """The top-level keys of a /generate answer (``out_dict`` in ``_handle_batch_output``)."""
    tm = upstream.source("srt/managers/tokenizer_manager.py")
    return set(upstream.dict_keys_written(upstream.function_def(tm, "_handle_batch_output", "TokenizerManager"),
                                          "out_dict"))


def _standin_output(finish: dict, *, logprob: bool = True) -> dict:
    ids = [5, 6, 7]
    request = GenerationRequest((1, 2), SamplingParams(max_new_tokens=3))
    return standin.Standin._output(types.SimpleNamespace(tokenizer=None), "rid-1", request, ids, [-0.1, -0.2, -0.3],
                                   finish, "4", {"return_logprob": logprob})


def test_the_standin_answers_only_with_keys_sglang_writes(sg):
    meta_keys, out_keys = _sglang_meta_keys(), _output_keys()
    # the parts of the client's contract SGLang writes (guards the readers above against going blind)
    assert {"id", "finish_reason", "prompt_tokens", "weight_version", "weight_versions", "completion_tokens",
            "cached_tokens", "input_token_logprobs", "output_token_logprobs"} <= set(meta_keys)
    assert {"output_ids", "meta_info"} <= out_keys
    out = _standin_output(standin._finish("stop", [5, 6, 7]))
    assert set(out) <= out_keys, set(out) - out_keys
    assert set(out["meta_info"]) <= set(meta_keys), set(out["meta_info"]) - set(meta_keys)


def test_the_client_reads_only_keys_sglang_writes():
    """The meta_info keys ``protocol`` reads (``meta.get("k")``, ``_field(meta, "k", ...)``)."""
    read: set[str] = set()
    for node in ast.walk(ast.parse(Path(proto.__file__).read_text())):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func
        if (isinstance(func, ast.Attribute) and func.attr == "get" and isinstance(func.value, ast.Name)
                and func.value.id == "meta" and isinstance(node.args[0], ast.Constant)):
            read.add(node.args[0].value)
        if (isinstance(func, ast.Name) and func.id == "_field" and len(node.args) >= 2
                and isinstance(node.args[0], ast.Name) and node.args[0].id == "meta"):
            read.add(node.args[1].value)
    assert {"finish_reason", "output_token_logprobs", "weight_version"} <= read
    assert read <= set(_sglang_meta_keys()), read - set(_sglang_meta_keys())


def test_finish_reasons_have_sglangs_layout(sg):
    """``_finish`` against SGLang's ``FINISH_*.to_json()`` (``srt/managers/schedule_batch.py``), and
    the client reads SGLang's own objects as the finish reason each stands for."""
    fr = sg.schedule_batch_part
    theirs = {"stop": fr.FINISH_MATCHED_TOKEN(7).to_json(), "length": fr.FINISH_LENGTH(3).to_json(),
              "abort": fr.FINISH_ABORT().to_json()}
    for reason, sglang_json in theirs.items():
        ours = standin._finish(reason, [5, 6, 7])
        assert set(ours) == set(sglang_json) and ours["type"] == sglang_json["type"], (reason, ours, sglang_json)
        assert proto.parse_finish_reason(sglang_json) == reason
    assert proto.parse_finish_reason(fr.FINISH_MATCHED_STR("</s>").to_json()) == "stop"


def test_logprob_triples_have_sglangs_layout(sg):
    """SGLang's ``TokenizerManager.detokenize_logprob_tokens`` (run from its source) without a
    tokenizer gives ``(logprob, token_id, None)``; the stand-in's JSON is the same."""
    tm = upstream.source("srt/managers/tokenizer_manager.py")
    fn = upstream.function_def(tm, "detokenize_logprob_tokens", "TokenizerManager")
    namespace: dict[str, Any] = {}
    exec(compile(ast.fix_missing_locations(ast.Module(body=[fn], type_ignores=[])), str(tm), "exec"),  # noqa: S102
         {"List": list}, namespace)
    sglang_triples = namespace["detokenize_logprob_tokens"](None, [-0.1, -0.2, -0.3], [5, 6, 7], False)
    out = _standin_output(standin._finish("length", [5, 6, 7]))
    assert out["meta_info"]["output_token_logprobs"] == json.loads(json.dumps(sglang_triples))
    request = GenerationRequest((1, 2), SamplingParams(max_new_tokens=3))
    result = proto.parse_generate_response(json.loads(json.dumps(out)), request)
    assert result.logprobs == (-0.1, -0.2, -0.3) and result.weight_version == 4


def test_the_standin_serves_only_sglang_routes(route_table):
    for method, table in (("GET", standin.Standin.GET_ROUTES), ("POST", standin.Standin.POST_ROUTES)):
        for path in table:
            if path.startswith("/spade_standin/"):
                continue
            assert path in route_table, f"the stand-in serves {path}, SGLang 0.5.23 does not"
            assert method in route_table[path].methods, f"{method} {path}: SGLang serves {route_table[path].methods}"


def test_the_standins_sampling_fields_are_sglangs(sg):
    import msgspec

    fields = {f.name: f for f in msgspec.structs.fields(sg.sampling_params.SamplingParams)}
    named = standin._SAMPLING_IMPLEMENTED | set(standin._SAMPLING_DEFAULTS) | standin._SAMPLING_TEXT_ONLY
    assert named <= set(fields), named - set(fields)
    for key, default in standin._SAMPLING_DEFAULTS.items():
        assert fields[key].default == default, (key, default, fields[key].default)


# ------------------------------------------------------------------ launcher flags


def _sglang_recipes() -> list[tuple[str, Any]]:
    found = []
    for path in sorted((REPO / "examples" / "recipes").glob("*.yaml")):
        cfg = load_train_config(path)
        if cfg.engine.kind == "sglang":
            found.append((path.name, cfg.engine.sglang))
    return found


def parse_server_argv(sg: upstream.SGLang, argv: list[str]) -> Any:
    """``argv`` (a ``python -m sglang.launch_server ...`` line) through ``ServerArgs``' own parser
    (``add_cli_args``, then ``from_cli_args``, as ``server_args.py::prepare_server_args`` does for
    ``launch_server``). Stricter than SGLang in one way: its parser takes unambiguous prefixes of
    a flag (argparse's ``allow_abbrev``), which a later release can make ambiguous; ours does not."""
    assert argv[1:3] == ["-m", "sglang.launch_server"], argv[:3]
    assert upstream.source("launch_server.py").is_file()
    parser = argparse.ArgumentParser(allow_abbrev=False)
    sg.server_args.ServerArgs.add_cli_args(parser)
    try:
        namespace, unknown = parser.parse_known_args(argv[3:])
    except SystemExit:
        raise AssertionError(f"SGLang's ServerArgs parser refuses {argv[3:]} (its message is above)") from None
    assert not unknown, f"flags SGLang {sg.version} does not know: {unknown}"
    return sg.server_args.ServerArgs.from_cli_args(namespace)


def test_the_launch_flags_of_every_sglang_recipe_parse_with_server_args(sg):
    from spade.rl.routing_record import RoutingShape

    recipes = _sglang_recipes()
    assert len(recipes) >= 3, "no recipe runs SGLang: the check below would check nothing"
    for name, s in recipes:
        plan = ServerPlan(index=0, url="http://127.0.0.1:1", port=s.port + 1, base_gpu=s.tp * s.dp)
        deployment = types.SimpleNamespace(settings=s, model_dir=Path("/models/m"), python="python", routing=None)
        argv = SGLangDeployment.server_argv(deployment, plan)
        args = parse_server_argv(sg, argv)
        assert not args.enable_return_routed_experts, name
        # loss.routing_replay: rollout (issue 27) adds SGLang's own flag for routed experts
        deployment.routing = RoutingShape(num_layers=48, top_k=8, num_experts=128)
        assert parse_server_argv(sg, SGLangDeployment.server_argv(deployment, plan)).enable_return_routed_experts
        assert (args.model_path, args.tp_size, args.ep_size, args.dp_size) == ("/models/m", s.tp, s.ep, s.dp), name
        assert args.mem_fraction_static == s.mem_fraction and (args.host, args.port) == (s.host, s.port + 1), name
        assert args.base_gpu_id == s.tp * s.dp and args.enable_memory_saver and args.skip_tokenizer_init, name
        for key, value in s.server_args.items():
            assert getattr(args, key.lstrip("-").replace("-", "_")) == value, (name, key)


def test_a_flag_sglang_does_not_know_fails(sg):
    from spade.rollout.sglang.launcher import sglang_argv

    good = sglang_argv("/m", port=30000, python="python")
    parse_server_argv(sg, good)
    with pytest.raises(AssertionError, match="does not know"):
        parse_server_argv(sg, [*good, "--mem-fraction", "0.5"])
    with pytest.raises(AssertionError, match="refuses"):
        parse_server_argv(sg, [*good[:-1], "--tp-size", "two"])


# ------------------------------------------------------------------ answers of the control routes


def _answer_keys(route: upstream.Route) -> set[str]:
    """The keys of the JSON objects SGLang's handler for ``route`` answers with: every dict literal
    with string keys in its function (``http_server.py``)."""
    fn = upstream.function_def(upstream.source("srt/entrypoints/http_server.py"), route.function)
    keys: set[str] = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Dict):
            keys |= {k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
    return keys


def _bare_standin() -> Any:
    """A stand-in without a model, enough for its control handlers that touch no weights."""
    st = object.__new__(standin.Standin)
    st.paused, st.unpaused, st.inflight = False, asyncio.Event(), {}
    return st


def test_the_standins_control_answers_have_sglangs_keys(route_table):
    async def answers() -> dict[str, Any]:
        st = _bare_standin()
        return {"/pause_generation": await st.pause_generation({"mode": "retract"}),
                "/continue_generation": await st.continue_generation({})}

    for path, reply in asyncio.run(answers()).items():
        sglang = _answer_keys(route_table[path])
        assert reply.status == 200 and isinstance(reply.body, dict), (path, reply)
        assert set(reply.body) == sglang, (path, reply.body, sglang)
    for path in ("/update_weights_from_tensor", "/update_weights_from_distributed", "/begin_weight_update",
                 "/end_weight_update", "/init_weights_update_group", "/destroy_weights_update_group"):
        sglang = _answer_keys(route_table[path])
        assert set(standin.ok("x").body) == sglang and set(standin.failed("x").body) == sglang, (path, sglang)


def test_the_recording_engines_answers_have_sglangs_keys(route_table):
    """``tests/sglang_recording.py`` answers the weight routes and pause/continue as SGLang does."""
    import sglang_recording

    log: list = []
    engine = sglang_recording.RecordingEngine(1, log)
    for path in sorted(sglang_recording._WEIGHT_PATHS | {"/pause_generation", "/continue_generation"}):
        payload = {"serialized_named_tensors": []} if path == "/update_weights_from_tensor" else {}
        _status, body = asyncio.run(engine._http(engine.servers[0], "POST", path, payload, 1.0))
        assert set(body) == _answer_keys(route_table[path]), (path, body)


def test_the_hand_written_answers_of_test_sglang_protocol_have_sglangs_layout(sg):
    """The bodies ``tests/rollout/test_sglang_protocol.py`` parses were written by hand from SGLang's
    source: their keys are keys SGLang writes, their finish reasons keys of ``FINISH_*.to_json()``,
    and the sampling keys it lists are those of SGLang's /generate schema gate."""
    import test_sglang_protocol as hand

    meta_keys, out_keys = set(_sglang_meta_keys()), _output_keys()
    fr = sg.schedule_batch_part
    finish_keys = {"stop": set(fr.FINISH_MATCHED_TOKEN(1).to_json()), "length": set(fr.FINISH_LENGTH(1).to_json()),
                   "abort": set(fr.FINISH_ABORT().to_json())}
    for name in ("RECORDED_STOP", "RECORDED_LENGTH", "RECORDED_TWO_VERSIONS", "RECORDED_ABORT",
                 "RECORDED_ABORT_RUNNING"):
        body = getattr(hand, name)
        assert set(body) <= out_keys, (name, set(body) - out_keys)
        assert set(body["meta_info"]) <= meta_keys, (name, set(body["meta_info"]) - meta_keys)
        finish = body["meta_info"]["finish_reason"]
        assert set(finish) <= finish_keys[finish["type"]], (name, finish)
    import msgspec

    assert hand.SGLANG_SAMPLING_KEYS == {f.name for f in msgspec.structs.fields(sg.api_types.SamplingParams)}


def test_the_standins_info_answers_have_sglangs_keys(sg, route_table):
    """``/get_server_info``: ServerArgs' fields plus what ``server_info`` and
    ``srt/utils/common.py::build_server_info`` add (the stand-in's own ``standin`` block aside);
    ``/get_model_info``: the keys ``model_info`` answers with."""
    import threading

    st = _bare_standin()
    st.opts = standin.Options(model_path="/m", host="127.0.0.1", port=1, tp_size=2, weight_version="default",
                              skip_tokenizer_init=True, weights_cpu_backup=False, incremental_streaming=False,
                              die_after_generates=None, die_once_file=None)
    st.version_names, st.version, st.released, st.generates, st.hung_rids = {0: "default"}, 0, set(), 0, []
    st.held, st.faults = threading.Event(), {}
    st.engine = types.SimpleNamespace(stats=types.SimpleNamespace(running=0, generated_tokens=0, aborted=0))
    server_info = asyncio.run(st.server_info({})).body
    model_info = asyncio.run(st.model_info({})).body

    args = {f.name for f in sg.server_args.record_fields(sg.server_args.ServerArgs)}
    common = upstream.source("srt/utils/common.py")
    added = set(upstream.dict_keys_written(upstream.function_def(common, "build_server_info"), "result"))
    sglang_server_info = args | added | _answer_keys(route_table["/server_info"])
    assert "tp_size" in sglang_server_info and "version" in sglang_server_info
    extra = set(server_info) - {"standin"} - sglang_server_info
    assert not extra, f"the stand-in's /get_server_info has keys SGLang's has not: {sorted(extra)}"
    extra = set(model_info) - _answer_keys(route_table["/model_info"])
    assert not extra, f"the stand-in's /get_model_info has keys SGLang's has not: {sorted(extra)}"


def test_extra_args_reach_the_server_args_fields_they_name(sg):
    """``extra_argv``'s encoding (``True`` -> a bare flag, a list -> several values, a dict -> its
    JSON) is how SGLang's parser reads those fields."""
    from spade.rollout.sglang.launcher import sglang_argv

    argv = sglang_argv("/models/qwen3", tp=4, ep=4, dp=1, mem_fraction=0.6, port=30001, python="python",
                       extra_args={"base_gpu_id": 4, "context_length": 4096, "disable_radix_cache": True,
                                   "cuda_graph_bs_decode": [1, 2, 4], "enable_torch_compile": False,
                                   "json_model_override_args": {"rope_theta": 1e6}})
    args = parse_server_argv(sg, argv)
    assert (args.tp_size, args.ep_size, args.dp_size, args.base_gpu_id, args.port) == (4, 4, 1, 4, 30001)
    assert args.mem_fraction_static == 0.6 and args.context_length == 4096 and args.disable_radix_cache is True
    assert args.cuda_graph_bs_decode == [1, 2, 4] and args.enable_torch_compile is False
    assert json.loads(args.json_model_override_args) == {"rope_theta": 1e6}


def test_the_standins_errors_have_sglangs_layout():
    """``error()`` answers ``{"error": {"message"}}`` as ``http_server.py::_create_error_response``
    builds it, and the client reads SGLang's message out of it."""
    fn = upstream.function_def(upstream.source("srt/entrypoints/http_server.py"), "_create_error_response")
    sglang = [node for node in ast.walk(fn) if isinstance(node, ast.Dict)]
    outer = {k.value for k in sglang[0].keys}
    inner = {k.value for k in sglang[0].values[0].keys}
    body = standin.error(400, "boom").body
    assert set(body) == outer and set(body["error"]) == inner, (body, outer, inner)
    assert proto.error_message(body) == "boom"
