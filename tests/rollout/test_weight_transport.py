"""Weight transport to SGLang: serialized tensors decoded by an unrelated process, the update
process group over gloo, and BroadcastWeightSender against stand-in servers (real subprocesses
serving a real model; SGLang itself needs a GPU)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import urllib.request
from pathlib import Path

import prewarmed
import pytest
import torch
import torch.multiprocessing as torch_mp

from support.hf_fixtures import save_tiny_hf, tiny_model
from sglang_standin import standin_launcher
from spade.rollout.sglang import protocol as proto
from spade.rollout.engine import GenerationRequest, SamplingParams
from spade.rollout.sglang.launcher import free_port
from spade.rollout.sglang.engine import SGLangEngine
from spade.rollout.weight_buckets import pack_buckets, unpack_bucket
from spade.rollout.sglang.weight_transport import (
    BroadcastWeightSender,
    WeightSyncBroken,
    deserialize_named_tensors,
    serialize_named_tensors,
)

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def bits(t: torch.Tensor) -> bytes:
    flat = t.detach().contiguous().reshape(-1)
    return b"" if flat.numel() == 0 else flat.view(torch.uint8).numpy().tobytes()


def sha(t: torch.Tensor) -> str:
    return hashlib.sha256(bits(t)).hexdigest()


def run_python(code: str, *args: str, stdin: str = "", timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([prewarmed.python(), "-c", code, *args], input=stdin, capture_output=True,
                          text=True, timeout=timeout, env=ENV, cwd=ROOT)


# ----------------------------------------------------------------- serialized tensors

DECODE = r"""
import hashlib, json, sys
import torch
from spade.rollout.sglang.weight_transport import deserialize_named_tensors

def bits(t):
    flat = t.contiguous().reshape(-1)
    return b"" if flat.numel() == 0 else flat.view(torch.uint8).numpy().tobytes()

out = []
for payload in json.load(sys.stdin):
    out.append([{"name": n, "dtype": str(t.dtype), "shape": list(t.shape),
                 "sha": hashlib.sha256(bits(t)).hexdigest(),
                 "storage": t.untyped_storage().data_ptr()}
                for n, t in deserialize_named_tensors(payload)])
print(json.dumps(out))
"""


def loose_tensors() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        ("bf16", torch.randn(5, 7, generator=g).to(torch.bfloat16)),
        ("f32", torch.randn(4, 3, generator=g)),
        ("f16", torch.randn(2, 2, 2, generator=g).to(torch.float16)),
        ("i64", torch.randint(-2**62, 2**62, (9,), generator=g, dtype=torch.int64)),
        ("i8", torch.randint(-128, 127, (6,), generator=g, dtype=torch.int8)),
        ("mask", torch.rand(11, generator=g) > 0.5),
        ("scalar", torch.tensor(-3.25)),
        ("empty", torch.empty(0, 4)),
        ("strided", torch.randn(6, 4, generator=g).t()),  # non-contiguous view
        ("param", torch.nn.Parameter(torch.randn(3, generator=g))),  # requires grad
    ]


def test_serialized_tensors_decode_bit_exact_in_an_unrelated_process():
    loose = loose_tensors()
    bucket = next(pack_buckets([(f"b.{n}", t) for n, t in loose[:7]], 1 << 20))
    views = unpack_bucket(bucket)  # views into one buffer
    before = torch_mp.get_sharing_strategy()
    payloads = [serialize_named_tensors(loose), serialize_named_tensors(views)]
    assert torch_mp.get_sharing_strategy() == before  # restored after the dump

    proc = run_python(DECODE, stdin=json.dumps(payloads))
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout)
    for sent, received in zip([loose, views], got):
        assert [r["name"] for r in received] == [n for n, _ in sent]
        for (name, t), r in zip(sent, received):
            assert r["dtype"] == str(t.dtype) and r["shape"] == list(t.shape), name
            assert r["sha"] == sha(t), f"{name} differs after the round trip"
    # the bucket views arrive as views of one shared storage
    non_empty = [r["storage"] for r, (_, t) in zip(got[1], views) if t.numel()]
    assert len(set(non_empty)) == 1 and len(non_empty) == 7


def test_serialize_restores_strategy_on_error_and_rejects_foreign_pickles(monkeypatch):
    from multiprocessing.reduction import ForkingPickler

    before = torch_mp.get_sharing_strategy()
    seen = []

    def failing_dump(self, obj):
        seen.append(torch_mp.get_sharing_strategy())
        raise RuntimeError("dump failed")

    with monkeypatch.context() as m:
        m.setattr(ForkingPickler, "dump", failing_dump)
        with pytest.raises(RuntimeError, match="dump failed"):
            serialize_named_tensors([("x", torch.ones(2))])
    assert seen == ["file_system"] and torch_mp.get_sharing_strategy() == before
    with pytest.raises(TypeError):
        serialize_named_tensors([("x", [1.0, 2.0])])

    import base64
    import pickle

    evil = base64.b64encode(pickle.dumps([("x", os.system)])).decode()
    with pytest.raises(pickle.UnpicklingError, match="posix.system|os.system"):
        deserialize_named_tensors(evil)
    with pytest.raises(ValueError, match="base64"):
        deserialize_named_tensors("not base64 !")
    # raw bytes are accepted too (SGLang's convention), and decoding in-process gives the tensors
    t = torch.arange(6, dtype=torch.int32).reshape(2, 3)
    [(name, back)] = deserialize_named_tensors(base64.b64decode(serialize_named_tensors([("t", t)])))
    assert name == "t" and torch.equal(back, t)


# ----------------------------------------------------------------- update process group

GROUP = r"""
import hashlib, json, os, sys
import torch, torch.distributed as dist
from spade.rollout.sglang.weight_transport import close_update_group, open_update_group

role, port, world_port, spec = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])

def bits(t):
    flat = t.contiguous().reshape(-1)
    return b"" if flat.numel() == 0 else flat.view(torch.uint8).numpy().tobytes()

def make(dtype, shape, g):
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(-1000, 1000, shape, generator=g).to(dtype)

if role == "trainer":
    # the trainer already has its own torch.distributed world (here: one rank)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{world_port}", rank=0, world_size=1)
group = open_update_group(backend="gloo", master_address="127.0.0.1", master_port=port,
                          rank=0 if role == "trainer" else 1, world_size=2, group_name="spade_test",
                          timeout_s=30)
g = torch.Generator().manual_seed(1)
out = {"size": group.size(), "rank": group.rank(), "sha": []}
for name, dtype, shape in spec:
    dtype = getattr(torch, dtype)
    t = make(dtype, shape, g) if role == "trainer" else torch.empty(shape, dtype=dtype)
    dist.broadcast(t, src=0, group=group)
    out["sha"].append(hashlib.sha256(bits(t)).hexdigest())
close_update_group(group)
if role == "trainer":
    x = torch.ones(2)
    dist.all_reduce(x)  # the trainer's own world still works
    out["world"] = [dist.get_world_size(), x.tolist()]
    dist.destroy_process_group()
print(json.dumps(out), flush=True)
# Skip interpreter teardown: torch's gloo threads can abort the process there ("terminate called
# without an active exception") when the peer has just closed; that race is torch's, not ours.
os._exit(0)
"""


def test_update_group_over_gloo_between_unrelated_processes():
    spec = [["bf16", "bfloat16", [3, 5]], ["i64", "int64", [7]], ["scalar", "float32", []],
            ["empty", "float32", [0, 4]], ["mask", "bool", [6]], ["f16", "float16", [2, 2, 2]]]
    port, world_port = str(free_port()), str(free_port())
    args = [port, world_port, json.dumps(spec)]
    procs = [subprocess.Popen([prewarmed.python(), "-c", GROUP, role, *args], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=ENV, cwd=ROOT)
             for role in ("trainer", "server")]
    outs = []
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=60)
            assert p.returncode == 0, stderr[-3000:]
            outs.append(json.loads(stdout))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    trainer, server = outs
    assert (trainer["size"], trainer["rank"], server["size"], server["rank"]) == (2, 0, 2, 1)
    assert server["sha"] == trainer["sha"] and len(set(trainer["sha"])) == len(spec)
    assert trainer["world"] == [1, [1.0, 1.0]]


# ----------------------------------------------------------------- BroadcastWeightSender


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def test_sender_argument_checks():
    engine = SGLangEngine(["http://127.0.0.1:1", "http://127.0.0.1:2"])
    with pytest.raises(ValueError, match="2 servers"):
        BroadcastWeightSender(engine, server_tp_sizes=[1], master_address="127.0.0.1",
                              master_port=1, backend="gloo")
    sender = BroadcastWeightSender(engine, server_tp_sizes=[2, 3], master_address="127.0.0.1",
                                   master_port=1, backend="gloo")
    assert sender.rank_offsets == [1, 3] and sender.world_size == 6
    assert sender.device == torch.device("cpu")


def test_broadcast_sender_updates_two_standin_servers(tmp_path):
    model_dir = save_tiny_hf("qwen3", tmp_path / "model")
    new_state = {k: v.clone() for k, v in tiny_model("qwen3", seed=1).state_dict().items()}
    expected = {k: sha(v) for k, v in new_state.items()}

    async def main():
        servers = [standin_launcher(model_dir, log_path=tmp_path / f"server{i}.log") for i in range(2)]
        try:
            await asyncio.gather(*(s.start() for s in servers))
            engine = SGLangEngine([s.url for s in servers])
            sender = BroadcastWeightSender(
                engine, server_tp_sizes=[1, 1], master_address="127.0.0.1", master_port=free_port(),
                backend="gloo", max_bucket_bytes=48 << 10, timeout_s=60)
            engine.weight_updater = sender
            before = [get_json(s.url + "/spade_standin/weights") for s in servers]
            assert before[0] != expected

            await engine.update_weights(((k, v) for k, v in new_state.items()), 7)  # lazy, like hf_weights
            assert engine.weight_version == 7
            for s in servers:
                assert get_json(s.url + "/spade_standin/weights") == expected  # bit for bit
                assert get_json(s.url + "/get_server_info")["weight_version"] == "7"
            req = GenerationRequest((3, 5, 7), SamplingParams(temperature=0.0, max_new_tokens=4))
            result = await engine.generate(req)
            assert result.weight_version == 7 and len(result.token_ids) == 4

            logs = [get_json(s.url + "/spade_standin/log") for s in servers]
            for offset, log in zip([1, 2], logs):
                init, begin, *updates, end = log
                assert init["endpoint"] == "/init_weights_update_group" and init["status"] == 200
                # SGLang 0.5.23 loads weights only inside a session
                assert (begin["endpoint"], end["endpoint"]) == ("/begin_weight_update", "/end_weight_update")
                assert begin["status"] == end["status"] == 200
                assert (init["body"]["rank_offset"], init["body"]["world_size"]) == (offset, 3)
                assert init["body"]["backend"] == "gloo"
                assert len(updates) >= 3, "the small bucket bound must split the model"
                assert all(u["endpoint"] == "/update_weights_from_distributed" and u["status"] == 200
                           for u in updates)
                assert [u["body"]["flush_cache"] for u in updates] == [False] * (len(updates) - 1) + [True]
                assert [u["body"].get("weight_version") for u in updates] == [None] * (len(updates) - 1) + ["7"]
                assert [n for u in updates for n in u["body"]["names"]] == list(new_state)

            # a server refusing the update raises, names the server, and the group stays usable
            with pytest.raises(proto.SGLangServerError, match="no_such.weight"):
                await sender.send([("no_such.weight", torch.zeros(3))], 8)
            assert engine.weight_version == 7
            name = "model.norm.weight"
            await sender.send([(name, torch.full_like(new_state[name], 0.5))], 9)
            digest = sha(torch.full_like(new_state[name], 0.5))
            assert all(get_json(s.url + "/spade_standin/weights")[name] == digest for s in servers)
            assert engine.weight_version == 9

            await sender.close()
            assert all(get_json(s.url + "/spade_standin/log")[-1]["endpoint"] == "/destroy_weights_update_group"
                       for s in servers)

            # a server dying in the middle of a transfer breaks the sender until it is replaced; it is
            # noticed from the dead peer, not by the collective's timeout (which would overrun the
            # generous deadline below)
            sender = BroadcastWeightSender(
                engine, server_tp_sizes=[1, 1], master_address="127.0.0.1", master_port=free_port(),
                backend="gloo", group_name="second", timeout_s=90, failure_grace_s=2)
            await sender.connect()
            await servers[1].stop(grace_s=0)
            with pytest.raises(WeightSyncBroken, match="cannot connect|Connection"):
                await asyncio.wait_for(sender.send(list(new_state.items()), 10), 45)
            with pytest.raises(WeightSyncBroken, match="close"):
                await sender.send(list(new_state.items()), 10)
            await sender.close()
            await engine.aclose()
        finally:
            await asyncio.gather(*(s.stop(grace_s=2) for s in servers))

    asyncio.run(asyncio.wait_for(main(), 100))



# ----------------------------------------------------------------- update_weights_by_ipc over two ranks

IPC_RANK = r"""
import asyncio, json, os, sys
import torch
import torch.distributed as dist
from support.hf_fixtures import tiny_model
from spade.collectives import barrier, broadcast_object, gather_object_to_0
from spade.rollout.sglang import protocol as proto
from spade.rollout.sglang.engine import SGLangEngine
from spade.rollout.sglang.weight_transport import Collectives, IpcFeed, WeightSyncFailed, update_weights_by_ipc

rank, port, url = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
world = Collectives(gather_to_0=gather_object_to_0, barrier=barrier, broadcast_from_0=broadcast_object)
state = {k: v.detach().clone() for k, v in tiny_model("qwen3", seed=1).state_dict().items()}
feed = IpcFeed({0: (0, 1)})  # the TP-2 server's worker t is fed by rank t, as colocated training does

async def main():
    engine = SGLangEngine([url]) if rank == 0 else None
    buckets = await update_weights_by_ipc(engine, iter(state.items()), 7, feed=feed, rank=rank,
                                          max_bucket_bytes=48 << 10, collectives=world)
    try:  # refused by the server: every rank learns it, none is left waiting in a collective
        await update_weights_by_ipc(engine, iter([("no_such.weight", torch.zeros(3))]), 8, feed=feed, rank=rank,
                                    collectives=world)
        outcome = "none"
    except (WeightSyncFailed, proto.SGLangServerError) as exc:
        outcome = f"{type(exc).__name__}: {exc}"
    version = None
    if engine is not None:
        version = engine.weight_version
        await engine.aclose()
    print("RESULT " + json.dumps({"rank": rank, "buckets": buckets, "outcome": outcome, "version": version}), flush=True)

asyncio.run(main())
dist.destroy_process_group()
os._exit(0)
"""


@pytest.mark.timeout(300)
def test_update_weights_by_ipc_from_two_ranks_each_feeding_one_tp_worker(tmp_path):
    """Training's sync: rank t serializes for TP worker t, rank 0 gathers and posts."""
    model_dir = save_tiny_hf("qwen3", tmp_path / "model")
    expected = {k: sha(v) for k, v in tiny_model("qwen3", seed=1).state_dict().items()}
    env = {**ENV, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}

    async def main():
        server = standin_launcher(model_dir, tp=2, log_path=tmp_path / "tp2.log")
        await server.start()
        try:
            port = str(free_port())
            # output to files, not pipes: torch's shared-memory manager (a grandchild) keeps inherited pipes open
            outputs = [tmp_path / f"rank{rank}.out" for rank in range(2)]
            procs = []
            for rank, output in enumerate(outputs):
                with open(output, "wb") as sink:
                    procs.append(await asyncio.create_subprocess_exec(
                        prewarmed.python(), "-c", IPC_RANK, str(rank), port, server.url, env=env, cwd=ROOT,
                        stdout=sink, stderr=subprocess.STDOUT))
            try:
                await asyncio.wait_for(asyncio.gather(*(p.wait() for p in procs)), 200)
            finally:
                for p in procs:
                    if p.returncode is None:
                        p.kill()
            texts = [output.read_text() for output in outputs]
            for p, text in zip(procs, texts):
                assert p.returncode == 0, text[-3000:]
            results = [json.loads(line[len("RESULT "):]) for text in texts for line in text.splitlines()
                       if line.startswith("RESULT ")]
            return results, get_json(server.url + "/spade_standin/weights"), get_json(server.url + "/spade_standin/log")
        finally:
            await server.stop(grace_s=2)

    (first, second), digests, log = asyncio.run(main())
    assert digests == expected  # both entries decoded, equal, and loaded
    assert first["buckets"] == second["buckets"] >= 3 and first["version"] == 7
    assert first["outcome"].startswith("SGLangServerError") and "no_such.weight" in first["outcome"]
    assert second["outcome"].startswith("WeightSyncFailed") and "no_such.weight" in second["outcome"]
    updates = [c for c in log if c["endpoint"] == "/update_weights_from_tensor"]
    assert all(c["body"]["serialized_named_tensors"] == "<2 entries>" for c in updates)
    assert [c["body"].get("weight_version") for c in updates] == [None] * (first["buckets"] - 1) + ["7", "8"]
    assert log[-1]["endpoint"] == "/end_weight_update"  # the refused session was closed


def test_ipc_update_names_the_new_version_only_once_every_bucket_is_loaded(tmp_path):
    """SGLang (0.5.23, ``update_weights_from_tensor`` in tokenizer_control_mixin.py) reports a
    request's ``weight_version`` as its own as soon as that request has loaded, so the version may
    travel only with the last bucket: between buckets the server must still name the old one."""
    from spade.rollout.sglang.weight_transport import push_weights_by_ipc

    model_dir = save_tiny_hf("qwen3", tmp_path / "model")
    new_state = {k: v.clone() for k, v in tiny_model("qwen3", seed=1).state_dict().items()}
    expected = {k: sha(v) for k, v in new_state.items()}
    seen: list[tuple[str, bool]] = []  # after each bucket: (the server's version, all weights new)

    class Watched(SGLangEngine):
        async def post_to(self, indices, endpoint, payload):
            answers = await super().post_to(indices, endpoint, payload)
            if endpoint == "update_weights_from_tensor":
                url = self.servers[0].url
                seen.append((get_json(url + "/get_server_info")["weight_version"],
                             get_json(url + "/spade_standin/weights") == expected))
            return answers

    async def main():
        server = standin_launcher(model_dir, log_path=tmp_path / "server.log")
        await server.start()
        try:
            engine = Watched([server.url])
            buckets = await push_weights_by_ipc(engine, ((k, v) for k, v in new_state.items()), 7, tp=1,
                                                max_bucket_bytes=48 << 10)
            await engine.aclose()
            return buckets
        finally:
            await server.stop(grace_s=2)

    buckets = asyncio.run(asyncio.wait_for(main(), 100))
    assert buckets >= 3 and len(seen) == buckets
    assert seen[-1] == ("7", True)
    assert all(version != "7" and not complete for version, complete in seen[:-1])


@pytest.mark.gpu
def test_cuda_ipc_update_gives_each_tp_worker_a_share_of_its_own(tmp_path, monkeypatch):
    """On CUDA each dump of a bucket is a new IPC share (its own reference-counter slot): the two
    entries for a TP-2 server's workers differ, and the server loads the weights bit for bit."""
    from spade.rollout.sglang import weight_transport

    model_dir = save_tiny_hf("qwen3", tmp_path / "model")
    new_state = {k: v.clone() for k, v in tiny_model("qwen3", seed=1).state_dict().items()}
    expected = {k: sha(v) for k, v in new_state.items()}
    entries: list[str] = []
    serialize = weight_transport.serialize_named_tensors

    def recording(named):
        entries.append(serialize(named))
        return entries[-1]

    monkeypatch.setattr(weight_transport, "serialize_named_tensors", recording)

    async def main():
        server = standin_launcher(model_dir, tp=2, log_path=tmp_path / "tp2.log")
        await server.start()
        try:
            engine = SGLangEngine([server.url])
            buckets = await weight_transport.push_weights_by_ipc(
                engine, ((k, v.cuda()) for k, v in new_state.items()), 3, max_bucket_bytes=48 << 10, device="cuda")
            await engine.aclose()
            return buckets, get_json(server.url + "/spade_standin/weights")
        finally:
            await server.stop(grace_s=2)

    buckets, digests = asyncio.run(asyncio.wait_for(main(), 100))
    assert digests == expected
    assert len(entries) == 2 * buckets and buckets >= 2
    assert all(a != b for a, b in zip(entries[0::2], entries[1::2]))


def test_the_recording_servers_can_open_payloads_in_another_process_as_real_servers_do():
    """CUDA will not open a CUDA-IPC handle in the process that made it, so the GPU tests of the
    publish order decode in a child process (tests/sglang_recording.py); the same path on CPU
    reads the sender's shared-memory files from another pid and gets the sent values."""
    from sglang_recording import RecordingEngine

    weights = {"a.weight": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b.bias": torch.full((4,), 0.5)}
    engine = RecordingEngine(1, [], decode_in_child=True)
    try:
        from spade.rollout.sglang.weight_transport import serialize_named_tensors

        entry = serialize_named_tensors(list(weights.items()))
        asyncio.run(engine._http(engine.servers[0], "POST", "/update_weights_from_tensor",
                                 {"serialized_named_tensors": [entry]}, 30))
    finally:
        engine.close_decoder()
    [seen] = engine.received_elsewhere
    assert seen["pid"] != os.getpid() and engine.received == []
    assert seen["read"] == [["a.weight", [2, 3], 15.0], ["b.bias", [4], 2.0]]
