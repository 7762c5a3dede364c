"""The GPU half of the SGLang path: what the CPU suite runs against the stand-in, here on CUDA and,
where SGLang is installed, against a real SGLang server.

* CUDA-IPC hand-over (no SGLang needed): tensors packed into a bucket on the GPU and serialized by
  ``serialize_named_tensors`` are opened by an unrelated process on the same GPU, bit for bit, and
  are the same memory (a write on one side is seen on the other).
* Real SGLang (skipped unless ``SPADE_SGLANG_PYTHON`` or this interpreter can import sglang): a
  small random Qwen3 served with spade's own command line; greedy tokens and their log-probs equal
  transformers' on the same weights; a colocated weight update (IPC handles inside an update
  session) changes the served model to exactly the new weights; releasing the server's memory
  gives GPU memory back and resuming + updating restores generation; the update's seconds and
  GB/s are printed for the GPU check's log.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parent.parent


def sglang_python() -> str | None:
    """An interpreter that has SGLang: $SPADE_SGLANG_PYTHON (the Docker image's /opt/sglang) or ours."""
    for python in filter(None, [os.environ.get("SPADE_SGLANG_PYTHON"), sys.executable]):
        probe = subprocess.run([python, "-c", "import sglang"], capture_output=True, timeout=120)
        if probe.returncode == 0:
            return python
    return None


def test_cuda_ipc_handles_open_in_another_process_as_the_same_memory(tmp_path):
    from spade.rollout.weight_buckets import pack_buckets, unpack_bucket
    from spade.rollout.weight_transport import serialize_named_tensors

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
        from spade.rollout.weight_transport import deserialize_named_tensors
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


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory) -> Path:
    from transformers import AutoModelForCausalLM, Qwen3Config

    directory = tmp_path_factory.mktemp("sglang_qwen3")
    config = Qwen3Config(vocab_size=4096, hidden_size=512, intermediate_size=1024, num_hidden_layers=4,
                         num_attention_heads=8, num_key_value_heads=4, head_dim=64, max_position_embeddings=4096,
                         rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=False, torch_dtype="bfloat16",
                         eos_token_id=2, bos_token_id=1)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).to(torch.bfloat16).save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def server(qwen3_dir, tmp_path_factory):
    python = sglang_python()
    if python is None:
        pytest.skip("SGLang is not installed (set SPADE_SGLANG_PYTHON to an interpreter that has it)")
    from spade.rollout.sglang_deployment import SERVER_ENV_DEFAULTS
    from spade.rollout.server_launcher import ServerLauncher, free_port, sglang_argv

    port = free_port()
    argv = sglang_argv(qwen3_dir, port=port, mem_fraction=0.3, python=python,
                       extra_args={"enable_deterministic_inference": True})
    log = tmp_path_factory.mktemp("sglang_logs") / "server.log"
    launcher = ServerLauncher(argv, port=port, log_path=log, start_timeout_s=600, env=SERVER_ENV_DEFAULTS)
    loop = asyncio.new_event_loop()
    loop.run_until_complete(launcher.start())
    yield loop, launcher
    loop.run_until_complete(launcher.close())
    loop.close()


def reference_greedy(model_dir: Path, prompt: list[int], steps: int, state=None):
    """Greedy tokens and their log-probs (T = 1) from transformers on the GPU, bf16."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).cuda().eval()
    if state is not None:
        model.load_state_dict(state)
    ids, logprobs = list(prompt), []
    with torch.no_grad():
        for _ in range(steps):
            logits = model(torch.tensor([ids], device="cuda")).logits[0, -1].float()
            lp = torch.log_softmax(logits, -1)
            token = int(lp.argmax())
            ids.append(token)
            logprobs.append(float(lp[token]))
    return ids[len(prompt):], logprobs


async def update_by_ipc(engine, named, version: int) -> float:
    from spade.rollout.weight_transport import push_weights_by_ipc

    started = time.perf_counter()
    await push_weights_by_ipc(engine, named, version, max_bucket_bytes=256 << 20, device="cuda")
    return time.perf_counter() - started


def test_real_sglang_generation_update_release(server, qwen3_dir):
    from transformers import AutoModelForCausalLM

    from spade.rollout.engine import GenerationRequest, SamplingParams
    from spade.rollout.sglang_engine import SGLangEngine

    loop, launcher = server
    prompt = [5, 17, 300, 41, 9]
    request = GenerationRequest(tuple(prompt), SamplingParams(temperature=0.0, max_new_tokens=8, ignore_eos=True))

    async def scenario():
        engine = SGLangEngine([launcher.url], weight_updater=update_by_ipc)
        before = await engine.generate(request)
        torch.manual_seed(1)
        fresh = AutoModelForCausalLM.from_pretrained(qwen3_dir, dtype=torch.bfloat16)
        for p in fresh.parameters():
            p.data.normal_(0, 0.05)
        state = {k: v.detach().clone() for k, v in fresh.state_dict().items()}
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
        return before, after, resumed, state, seconds, nbytes, free_before, free_released

    before, after, resumed, state, seconds, nbytes, free_before, free_released = loop.run_until_complete(scenario())
    print(f"\nSGLANG_WEIGHT_UPDATE {nbytes / 1e9:.3f} GB in {seconds:.3f} s ({nbytes / seconds / 1e9:.2f} GB/s)")
    print(f"SGLANG_RELEASE freed {(free_released - free_before) / 2**30:.2f} GiB")

    tokens, logprobs = reference_greedy(qwen3_dir, prompt, 8)
    assert list(before.token_ids) == tokens
    assert before.logprobs == pytest.approx(logprobs, abs=0.05)  # bf16 kernels differ
    new_tokens, new_logprobs = reference_greedy(qwen3_dir, prompt, 8, state)
    assert list(after.token_ids) == new_tokens and after.weight_version == 5
    assert after.logprobs == pytest.approx(new_logprobs, abs=0.05)
    assert list(resumed.token_ids) == new_tokens and resumed.weight_version == 6
    assert free_released - free_before > 0.5 * nbytes  # at least the weights came back to the GPU pool


# ---------------------------------------------------------------------------------------- spade train


def test_spade_train_on_one_gpu_with_a_colocated_sglang_server(tmp_path):
    """``spade train`` with ``engine.kind: sglang`` on one GPU: the server colocated with the trainer
    (memory released during the train step, training state offloaded during rollouts, weights by
    CUDA IPC), two steps on a fixed pool of example games with a small random Qwen3. The run must
    complete with a real update and no restart, and the weight sync time is printed."""
    import json
    import shutil

    from transformers import AutoModelForCausalLM, Qwen3Config

    from chat_templates import bpe_tokenizer

    python = sglang_python()
    if python is None:
        pytest.skip("SGLang is not installed (set SPADE_SGLANG_PYTHON to an interpreter that has it)")
    hf = tmp_path / "hf"
    tokenizer = bpe_tokenizer()
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=4096,
                         rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=False, torch_dtype="bfloat16",
                         eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"), pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).to(torch.bfloat16).save_pretrained(hf)
    tokenizer.save_pretrained(hf)
    envs = tmp_path / "envs"
    envs.mkdir()
    for name in ("hidden_sequence.py", "remainder_oracle.py"):
        shutil.copy(ROOT / "examples" / "envs" / name, envs / name)
    cfg = tmp_path / "gpu.yaml"
    cfg.write_text(f"""
model: {{hf_dir: {hf}, dtype: bfloat16}}
selfplay: {{k: 2, envs_per_set: 2, g_nohint: 4, g_hint: 4, designer_enabled: false, fixed_env_dir: {envs},
           use_corpus: false, agent_max_tokens: 24, hint_max_tokens: 16, max_turns: 2, max_context_tokens: 1024,
           agent_temperature: 1.0, top_k: null, top_p: 1.0}}
engine:
  kind: sglang
  sglang: {{mem_fraction: 0.3, start_timeout_s: 600, server_command: [{python}, -m, sglang.launch_server]}}
run: {{steps: 2, checkpoint_every: 2, micro_batch_tokens: 4096}}
""")
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
