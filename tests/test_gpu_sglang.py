"""The GPU half of the SGLang path: what the CPU suite runs against the stand-in
(tests/rollout/test_sglang_standin.py, tests/run/test_train_loop.py), here on CUDA against a real SGLang
server, through the same spade entry points.

* CUDA-IPC hand-over (no SGLang needed): tensors packed into a bucket on the GPU and serialized by
  ``serialize_named_tensors`` are opened by an unrelated process on the same GPU, bit for bit, and
  are the same memory (a write on one side is seen on the other).
* Real SGLang, in this interpreter (the image runs trainer and servers in one environment; with a
  GPU and without SGLang, or with a second torch/NCCL, these fail instead of skipping). A small
  random Qwen3 with peaked next-token distributions, served with spade's own command line:
  - teacher-forced log-probs: transformers scores the tokens SGLang sampled, and its log-probs
    equal SGLang's within bf16 noise, and differ from them under other weights; before and after
    a colocated weight update and after a memory release and resume (seconds, GB/s printed);
  - seeded sampling is reproducible alone, repeated and batched;
  - a server killed mid-rollout is restarted by spade's deployment with the current weights and
    the failed requests complete on it;
  - with 2 GPUs: a TP=2 server, and a disaggregated server fed by NCCL broadcast;
  - ``spade train`` two steps with a colocated server on one GPU.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from support.configs import example_envs, write_config

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parent.parent


def test_cuda_ipc_handles_open_in_another_process_as_the_same_memory(tmp_path):
    from spade.rollout.weight_buckets import pack_buckets, unpack_bucket
    from spade.rollout.sglang.weight_transport import serialize_named_tensors

    gen = torch.Generator().manual_seed(0)
    named = [("a.weight", torch.randn(64, 32, generator=gen).to(torch.bfloat16)),
             ("b.bias", torch.randn(7, generator=gen)),
             ("c.ids", torch.arange(5, dtype=torch.int64))]
    bucket = next(pack_buckets(((n, t.cuda()) for n, t in named), 1 << 20))
    views = unpack_bucket(bucket)
    payload = tmp_path / "payload.txt"
    payload.write_text(serialize_named_tensors(views))
    torch.cuda.synchronize()
    child = textwrap.dedent(f"""
        import sys, torch
        sys.path.insert(0, {str(ROOT)!r})
        from spade.rollout.sglang.weight_transport import deserialize_named_tensors
        named = deserialize_named_tensors(open({str(payload)!r}).read())
        torch.save([(n, t.cpu()) for n, t in named], {str(tmp_path / 'seen.pt')!r})
        dict(named)["b.bias"].fill_(3.0)          # write through the shared memory
        torch.cuda.synchronize()
    """)
    subprocess.run([sys.executable, "-c", child], check=True, timeout=300)
    seen = torch.load(tmp_path / "seen.pt")
    assert [n for n, _ in seen] == [n for n, _ in named]
    for (_, got), (_, want) in zip(seen, named):
        assert got.dtype == want.dtype and torch.equal(got, want)
    assert torch.equal(dict(views)["b.bias"].cpu(), torch.full((7,), 3.0))  # one memory, not a copy


# ---------------------------------------------------------------------------------------- real SGLang

MAX_MEAN_ABS = 0.05  # bf16 kernels: SGLang's and transformers' log-probs of the same tokens
MAX_ABS = 0.3
MIN_WRONG_MEAN_ABS = 0.5  # the same tokens scored with other weights: far off (the model is not flat)


@pytest.fixture(scope="module")
def sglang_installed() -> str:
    """The interpreter the servers run with (this one: the image has one environment). With a
    GPU, a missing SGLang or a second torch/NCCL is a broken image: the test fails, it does not
    skip (conftest skips the module only where there is no CUDA GPU)."""
    from spade.rollout.sglang.runtime_versions import RuntimeVersionMismatch, check_sglang_runtime

    try:
        check_sglang_runtime(sys.executable)
    except RuntimeVersionMismatch as exc:
        pytest.fail(f"the GPU checks need SGLang in this environment:\n{exc}")
    return sys.executable


def needs_gpus(count: int) -> None:
    if torch.cuda.device_count() < count:
        pytest.skip(f"needs {count} GPUs, {torch.cuda.device_count()} visible")


def random_state(model_dir: Path, seed: int) -> dict[str, torch.Tensor]:
    """Weights for the served architecture, random and far from flat (see support.hf_fixtures.randomize_)."""
    from transformers import AutoModelForCausalLM

    from support.hf_fixtures import randomize_

    torch.manual_seed(seed)
    model = randomize_(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16))
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory) -> Path:
    """A small random Qwen3 in bf16 with weights that give peaked next-token distributions, so
    that log-probs tell one set of weights from another."""
    from support.models import save_tiny_qwen3

    directory = tmp_path_factory.mktemp("sglang_qwen3")
    return save_tiny_qwen3(directory, 4096, dtype=torch.bfloat16, randomize=True, hidden_size=512,
                           intermediate_size=1024, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
                           head_dim=64, max_position_embeddings=4096, rope_theta=1e6, torch_dtype="bfloat16",
                           eos_token_id=2, bos_token_id=1)


class Scorer:
    """transformers on the GPU (bf16), scoring given tokens after a prompt (teacher forcing): the
    log-probs of ``softmax(logits / T)``, what SGLang reports for the tokens it sampled at T
    (full vocabulary, before top-k/top-p). Computed with spade's own ``logprobs_from_logits``."""

    def __init__(self, model_dir: Path):
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).cuda().eval()
        self.original = {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def score(self, prompt, tokens, temperature: float, state=None) -> list[float]:
        from spade.rl.logprobs import logprobs_from_logits

        self.model.load_state_dict(self.original if state is None else state)
        ids = torch.tensor([list(prompt) + list(tokens)], device="cuda")
        with torch.no_grad():
            logits = self.model(ids).logits[0, len(prompt) - 1:-1].float()
        return logprobs_from_logits(logits / max(temperature, 1e-6), ids[0, len(prompt):]).cpu().tolist()


@pytest.fixture(scope="module")
def scorer(qwen3_dir) -> Scorer:
    return Scorer(qwen3_dir)


def assert_scored(result, request, scorer: Scorer, state=None, *, wrong_state=None) -> None:
    """SGLang's log-probs of its own sampled tokens equal transformers' for those tokens under
    ``state`` (within bf16 noise), and are far from the same tokens under ``wrong_state``."""
    temperature = request.sampling.temperature or 1.0  # greedy: SGLang reports T = 1
    assert len(result.token_ids) == request.sampling.max_new_tokens
    got = torch.tensor(result.logprobs)
    want = torch.tensor(scorer.score(request.prompt_ids, result.token_ids, temperature, state))
    diff = (got - want).abs()
    assert diff.mean() <= MAX_MEAN_ABS and diff.max() <= MAX_ABS, (diff.mean().item(), diff.max().item())
    if wrong_state is not None:
        other = torch.tensor(scorer.score(request.prompt_ids, result.token_ids, temperature, wrong_state))
        assert (got - other).abs().mean() >= MIN_WRONG_MEAN_ABS, "the log-probs do not tell the weights apart"


def sampled(prompt, *, seed: int, tokens: int = 24, temperature: float = 0.7):
    from spade.rollout.engine import GenerationRequest, SamplingParams

    return GenerationRequest(tuple(prompt), SamplingParams(temperature=temperature, max_new_tokens=tokens,
                                                           ignore_eos=True, seed=seed))


@pytest.fixture(scope="module")
def server(qwen3_dir, sglang_installed, tmp_path_factory):
    from spade.rollout.sglang.deployment import SERVER_ENV_DEFAULTS
    from spade.rollout.sglang.launcher import ServerLauncher, free_port, sglang_argv

    port = free_port()
    argv = sglang_argv(qwen3_dir, port=port, mem_fraction=0.3, python=sglang_installed,
                       extra_args={"enable_deterministic_inference": True})
    log = tmp_path_factory.mktemp("sglang_logs") / "server.log"
    launcher = ServerLauncher(argv, port=port, log_path=log, start_timeout_s=600, env=SERVER_ENV_DEFAULTS)
    loop = asyncio.new_event_loop()
    loop.run_until_complete(launcher.start())
    yield loop, launcher
    loop.run_until_complete(launcher.close())
    loop.close()


async def update_by_ipc(engine, named, version: int) -> float:
    from spade.rollout.sglang.weight_transport import push_weights_by_ipc

    started = time.perf_counter()
    await push_weights_by_ipc(engine, named, version, max_bucket_bytes=256 << 20, device="cuda")
    return time.perf_counter() - started


PROMPT = (5, 17, 300, 41, 9)


def test_real_sglang_logprobs_update_and_release(server, qwen3_dir, scorer):
    """Teacher forcing: transformers scores the tokens SGLang sampled (seeded, T = 0.7) and must
    give SGLang's own log-probs, before a colocated update (the checkpoint's weights), after it
    (the new weights, and far from the old ones) and after a memory release and resume + update."""
    from spade.rollout.sglang.engine import SGLangEngine

    loop, launcher = server
    request = sampled(PROMPT, seed=11, tokens=32)
    greedy = sampled(PROMPT, seed=0, tokens=16, temperature=0.0)
    state = random_state(qwen3_dir, seed=1)

    async def scenario():
        engine = SGLangEngine([launcher.url], weight_updater=update_by_ipc)
        before = await engine.generate(request)
        before_greedy = await engine.generate(greedy)
        named = [(k, v.cuda()) for k, v in state.items()]
        seconds = await update_by_ipc(engine, named, 5)
        nbytes = sum(t.numel() * t.element_size() for _, t in named)
        after = await engine.generate(request)

        free_before = torch.cuda.mem_get_info()[0]
        await engine.release_memory()
        free_released = torch.cuda.mem_get_info()[0]
        await engine.resume_and_update(named, 6)  # weights region, update session, KV cache, continue
        resumed = await engine.generate(request)
        await engine.aclose()
        return before, before_greedy, after, resumed, seconds, nbytes, free_before, free_released

    before, before_greedy, after, resumed, seconds, nbytes, free_before, free_released = \
        loop.run_until_complete(scenario())
    print(f"\nSGLANG_WEIGHT_UPDATE {nbytes / 1e9:.3f} GB in {seconds:.3f} s ({nbytes / seconds / 1e9:.2f} GB/s)")
    print(f"SGLANG_RELEASE freed {(free_released - free_before) / 2**30:.2f} GiB")

    assert after.weight_version == 5 and resumed.weight_version == 6
    assert_scored(before, request, scorer, wrong_state=state)
    assert_scored(before_greedy, greedy, scorer)
    assert_scored(after, request, scorer, state, wrong_state=scorer.original)
    assert_scored(resumed, request, scorer, state, wrong_state=scorer.original)
    assert free_released - free_before > 0.5 * nbytes  # at least the weights came back to the GPU pool


def test_real_sglang_seeded_sampling_is_reproducible(server):
    """With --enable-deterministic-inference a seed fixes the completion: the same seeded request
    gives the same tokens and log-probs alone, again, and batched with seven others; another seed
    gives other tokens."""
    from spade.rollout.sglang.engine import SGLangEngine

    loop, launcher = server
    request = sampled(PROMPT, seed=1234, tokens=48, temperature=1.0)

    async def scenario():
        engine = SGLangEngine([launcher.url])
        first = await engine.generate(request)
        again = await engine.generate(request)
        crowd = [sampled((7 + i, 3, 99 + i), seed=i, tokens=64, temperature=1.0) for i in range(7)]
        batched = await asyncio.gather(engine.generate(request), *(engine.generate(r) for r in crowd))
        other = await engine.generate(sampled(PROMPT, seed=4321, tokens=48, temperature=1.0))
        await engine.aclose()
        return first, again, batched[0], other

    first, again, batched, other = loop.run_until_complete(scenario())
    for twin in (again, batched):
        assert twin.token_ids == first.token_ids
        assert twin.logprobs == pytest.approx(first.logprobs, abs=1e-4, rel=0)
    assert other.token_ids != first.token_ids  # the seed matters


def test_real_sglang_server_killed_mid_rollout_restarts_with_the_current_weights(qwen3_dir, scorer,
                                                                                 sglang_installed, tmp_path):
    """spade's deployment (one colocated server, CUDA-IPC sync) on this GPU: the model's weights
    are replaced (version 3), long completions are in flight, and the server's whole process group
    is killed. The failed requests make the engine call the recovery hook, which does what the
    rollout manager does (``SGLangRolloutManager._recover_servers`` -> ``SGLangDeployment.recover``):
    the owner restarts the server, releases its memory, sends it the current weights and gives its
    KV cache back; the requests are retried there and complete. The restarted server serves the
    current weights, not the checkpoint it loads at start."""
    from spade.rollout.sglang.deployment import SGLangDeployment
    from spade.rollout.sglang.settings import SGLangSection
    from spade.rollout.sglang.launcher import free_port

    settings = SGLangSection(port=free_port(), mem_fraction=0.2, start_timeout_s=600, max_retries=2, max_restarts=1,
                             server_args={"enable_deterministic_inference": True})
    deployment = SGLangDeployment(settings, model_dir=qwen3_dir, log_dir=tmp_path, device=torch.device("cuda", 0),
                                  local_rank=0, python=sglang_installed)
    state = random_state(qwen3_dir, seed=3)
    named = [(k, v.cuda()) for k, v in state.items()]

    def weights():
        return iter(named)

    async def recover(index: int) -> None:
        await deployment.recover([index], weights, 3)

    deployment.recover_hook = recover
    long = [sampled((11 + i, 2, 250), seed=100 + i, tokens=512) for i in range(4)]
    probe = sampled(PROMPT, seed=7, tokens=32)

    async def scenario():
        await deployment.start()
        try:
            await deployment.sync_weights(weights, 3)
            engine, launcher = deployment.engine, deployment.launchers[0]
            first_pid = launcher.pid
            tasks = [asyncio.ensure_future(engine.generate(r)) for r in long]
            while engine.servers[0].in_flight < len(long):
                await asyncio.sleep(0)  # let every request go out, then kill the server under them
            os.killpg(first_pid, signal.SIGKILL)
            results = await asyncio.gather(*tasks)
            after = await engine.generate(probe)
            return first_pid, launcher.pid, results, after, dict(deployment.restarts), engine.servers[0].failures
        finally:
            await deployment.close()

    first_pid, pid, results, after, restarts, failures = asyncio.run(scenario())
    assert pid != first_pid and restarts == {0: 1} and failures >= 1
    for request, result in zip(long, results):
        assert result.weight_version == 3
        assert_scored(result, request, scorer, state)
    assert after.weight_version == 3
    assert_scored(after, probe, scorer, state, wrong_state=scorer.original)


def test_real_sglang_tp2_server_scores_and_takes_an_update(qwen3_dir, scorer, sglang_installed, tmp_path):
    """A server over two GPUs (--tp-size 2): its log-probs match transformers' before and after an
    IPC update that feeds both TP workers from this process (the one on GPU 1 reads GPU 0's
    buckets over NVLink/PCIe)."""
    needs_gpus(2)
    from spade.rollout.sglang.deployment import SERVER_ENV_DEFAULTS
    from spade.rollout.sglang.engine import SGLangEngine
    from spade.rollout.sglang.launcher import ServerLauncher, free_port, sglang_argv
    from spade.rollout.sglang.weight_transport import push_weights_by_ipc

    port = free_port()
    launcher = ServerLauncher(sglang_argv(qwen3_dir, tp=2, port=port, mem_fraction=0.2, python=sglang_installed),
                              port=port, log_path=tmp_path / "tp2.log", start_timeout_s=600, env=SERVER_ENV_DEFAULTS)
    state = random_state(qwen3_dir, seed=4)
    request = sampled(PROMPT, seed=5, tokens=32)

    async def scenario():
        await launcher.start()
        try:
            engine = SGLangEngine([launcher.url])
            info = (await engine.server_info())[0]
            before = await engine.generate(request)
            await push_weights_by_ipc(engine, [(k, v.cuda()) for k, v in state.items()], 2, tp=2, device="cuda")
            after = await engine.generate(request)
            await engine.aclose()
            return info, before, after
        finally:
            await launcher.close()

    info, before, after = asyncio.run(scenario())
    assert int(info.get("tp_size", 0)) == 2
    assert_scored(before, request, scorer, wrong_state=state)
    assert after.weight_version == 2
    assert_scored(after, request, scorer, state, wrong_state=scorer.original)


def test_real_sglang_disaggregated_server_gets_weights_by_nccl_broadcast(qwen3_dir, scorer, sglang_installed,
                                                                         tmp_path):
    """``engine.sglang.urls``: a server spade did not launch, on GPU 1, and spade's deployment on
    GPU 0 (as global rank 0). The deployment opens an NCCL group with the server's worker
    (/init_weights_update_group) and broadcasts the new weights bucket by bucket
    (/update_weights_from_distributed): both sides must load one NCCL for the group to form. The
    server then serves exactly those weights. NCCL does not put two ranks on one GPU: 2 GPUs."""
    needs_gpus(2)
    from spade.rollout.sglang.deployment import SERVER_ENV_DEFAULTS, SGLangDeployment
    from spade.rollout.sglang.settings import SGLangSection
    from spade.rollout.sglang.launcher import ServerLauncher, free_port, sglang_argv

    port = free_port()
    launcher = ServerLauncher(sglang_argv(qwen3_dir, port=port, mem_fraction=0.2, python=sglang_installed,
                                          extra_args={"base_gpu_id": 1}),
                              port=port, log_path=tmp_path / "external.log", start_timeout_s=600,
                              env=SERVER_ENV_DEFAULTS)
    deployment = SGLangDeployment(SGLangSection(urls=(launcher.url,), bucket_mb=8), model_dir=qwen3_dir,
                                  log_dir=tmp_path, device=torch.device("cuda", 0), local_rank=0)
    state = random_state(qwen3_dir, seed=6)
    named = [(k, v.cuda()) for k, v in state.items()]
    request = sampled(PROMPT, seed=9, tokens=32)

    async def scenario():
        await launcher.start()
        try:
            await deployment.start()
            method, connected = deployment.method, deployment.sender is not None and deployment.sender.connected
            started = time.perf_counter()
            await deployment.sync_weights(lambda: iter(named), 4)
            seconds = time.perf_counter() - started
            return method, connected, seconds, await deployment.engine.generate(request)
        finally:
            await deployment.close()  # leaves the group, then the server goes
            await launcher.close()

    method, connected, seconds, result = asyncio.run(scenario())
    print(f"\nSGLANG_BROADCAST_UPDATE {seconds:.3f} s")
    assert method == "broadcast" and connected
    assert result.weight_version == 4
    assert_scored(result, request, scorer, state, wrong_state=scorer.original)


# ---------------------------------------------------------------------------------------- spade train


def test_spade_train_on_one_gpu_with_a_colocated_sglang_server(tmp_path, sglang_installed):
    """``spade train`` with ``engine.kind: sglang`` on one GPU: the server colocated with the trainer
    (memory released during the train step, training state offloaded during rollouts, weights by
    CUDA IPC), two steps on a fixed pool of example games with a small random Qwen3. The run must
    complete with a real update and no restart, and the weight sync time is printed."""
    import json

    from chat_templates import bpe_tokenizer
    from support.models import save_tiny_qwen3

    hf = tmp_path / "hf"
    save_tiny_qwen3(hf, bpe_tokenizer(), dtype=torch.bfloat16, special_ids=True, hidden_size=256, intermediate_size=512,
                    head_dim=64, max_position_embeddings=4096, rope_theta=1e6, torch_dtype="bfloat16")
    envs = example_envs(tmp_path / "envs")
    cfg = tmp_path / "gpu.yaml"
    write_config(cfg, {
        "model": {"hf_dir": hf, "dtype": "bfloat16"},
        "selfplay": {
            "k": 2,
            "envs_per_set": 2,
            "g_nohint": 4,
            "g_hint": 4,
            "designer_enabled": False,
            "fixed_env_dir": envs,
            "use_corpus": False,
            "max_turns": 2,
            "max_context_tokens": 1024,
            "sampling": {
                "designer": {"top_k": None, "top_p": 1.0},
                "agent": {"temperature": 1.0, "max_tokens": 24, "top_k": None, "top_p": 1.0},
                "hint": {"max_tokens": 16, "top_k": None, "top_p": 1.0},
                "screen": {"top_k": None, "top_p": 1.0},
            },
        },
        "engine": {"kind": "sglang", "sglang": {"mem_fraction": 0.3, "start_timeout_s": 600}},
        "run": {"steps": 2, "checkpoint_every": 2, "micro_batch_tokens": 4096},
    })
    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "spade", "train", "--config", str(cfg), "--run-dir", str(run)],
                          cwd=ROOT, capture_output=True, text=True, timeout=840)
    server_log = run / "logs" / "sglang-server-0.log"
    assert proc.returncode == 0, proc.stderr[-6000:] + (server_log.read_text()[-4000:] if server_log.exists() else "")
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1]
    assert all(r["engine/restarts_total"] == 0 for r in records)
    assert records[0]["train/samples"] > 0 and records[0]["engine/generated_tokens"] > 0
    for r in records:
        print(f"\nSPADE_TRAIN_SGLANG step {r['step']}: sync {r['time/sync_s']:.3f} s, "
              f"engine {r['time/engine_tokens_per_s']:.0f} tokens/s")
