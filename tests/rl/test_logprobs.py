"""Chunked token log-probs against the plain log_softmax path, on one rank and over 2 TP ranks."""

from __future__ import annotations

import math
import os
import socket
import subprocess
from pathlib import Path

import prewarmed
import pytest
import torch

from spade.rl.logprobs import logprobs_from_logits, token_logprobs

ROOT = Path(__file__).resolve().parents[2]
TP_WORKER = ROOT / "tests" / "dist" / "logprob_tp_worker.py"


def make_inputs(seq_len=11, batch=3, hidden_size=8, vocab=29, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(seq_len, batch, hidden_size, generator=gen).to(dtype)
    weight = torch.randn(vocab, hidden_size, generator=gen).to(dtype)
    targets = torch.randint(0, vocab, (batch, seq_len), generator=gen)
    upstream = torch.randn(batch, seq_len, generator=gen).to(dtype)
    return hidden, weight, targets, upstream


def reference(hidden, weight, targets, temperature=1.0):
    """log_softmax(hidden @ W.T / temperature) gathered at targets, as [B, T], with gradients."""
    logits = torch.einsum("tbh,vh->btv", hidden, weight) / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def forward_backward(fn, hidden, weight, targets, upstream, **kwargs):
    h = hidden.clone().requires_grad_()
    w = weight.clone().requires_grad_()
    out = fn(h, w, targets, **kwargs)
    (out * upstream).sum().backward()
    return out.detach(), h.grad, w.grad


def test_logprobs_from_logits_by_hand():
    # softmax([0, ln 3]) = [1/4, 3/4]
    logits = torch.tensor([[0.0, math.log(3.0)], [0.0, math.log(3.0)]], dtype=torch.float64)
    out = logprobs_from_logits(logits, torch.tensor([1, 0]))
    torch.testing.assert_close(out, torch.tensor([math.log(0.75), math.log(0.25)], dtype=torch.float64))
    assert logprobs_from_logits(logits.to(torch.bfloat16), torch.tensor([1, 0])).dtype == torch.float32


@pytest.mark.parametrize("chunk_size", [1, 4, 7, 16, 33, 1024])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_chunked_matches_reference_fp64(chunk_size, temperature):
    hidden, weight, targets, upstream = make_inputs()  # 33 tokens: most chunk sizes do not divide it
    out, gh, gw = forward_backward(token_logprobs, hidden, weight, targets, upstream,
                                   chunk_size=chunk_size, temperature=temperature)
    ref, rh, rw = forward_backward(reference, hidden, weight, targets, upstream, temperature=temperature)
    assert out.shape == (3, 11) and out.dtype == torch.float64
    assert (out - ref).abs().max() < 1e-6
    assert (gh - rh).abs().max() < 1e-6
    assert (gw - rw).abs().max() < 1e-6
    # and against the simple path on materialised logits
    plain = logprobs_from_logits(torch.einsum("tbh,vh->btv", hidden, weight) / temperature, targets)
    assert (out - plain).abs().max() < 1e-6


def test_chunked_matches_reference_fp32():
    hidden, weight, targets, upstream = make_inputs(seq_len=40, batch=2, hidden_size=32, vocab=300,
                                                    dtype=torch.float32)
    out, gh, gw = forward_backward(token_logprobs, hidden, weight, targets, upstream, chunk_size=9)
    ref, rh, rw = forward_backward(reference, hidden, weight, targets, upstream)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gh, rh, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gw, rw, rtol=1e-5, atol=1e-5)


def test_bf16_inputs_give_fp32_logprobs_and_bf16_grads():
    hidden, weight, targets, upstream = make_inputs(seq_len=16, batch=2, hidden_size=16, vocab=64,
                                                    dtype=torch.float32)
    ref, rh, rw = forward_backward(reference, hidden, weight, targets, upstream)
    out, gh, gw = forward_backward(token_logprobs, hidden.bfloat16(), weight.bfloat16(), targets,
                                   upstream, chunk_size=5)
    assert out.dtype == torch.float32 and gh.dtype == torch.bfloat16 and gw.dtype == torch.bfloat16
    torch.testing.assert_close(out, ref, rtol=0.05, atol=0.1)
    torch.testing.assert_close(gh.float(), rh, rtol=0.05, atol=0.05)
    torch.testing.assert_close(gw.float(), rw, rtol=0.05, atol=0.05)


def test_gradcheck():
    hidden, weight, targets, _ = make_inputs(seq_len=5, batch=2, hidden_size=4, vocab=7)
    h, w = hidden.requires_grad_(), weight.requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: token_logprobs(a, b, targets, chunk_size=3, temperature=0.8),
                                    (h, w))


def test_no_logits_are_saved_for_backward():
    seq_len, batch, hidden_size, vocab = 64, 2, 8, 500
    hidden, weight, targets, upstream = make_inputs(seq_len, batch, hidden_size, vocab, dtype=torch.float32)
    saved: list[int] = []

    def pack(x: torch.Tensor) -> torch.Tensor:
        saved.append(x.numel())
        return x

    h, w = hidden.requires_grad_(), weight.requires_grad_()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        out = token_logprobs(h, w, targets, chunk_size=16)
    (out * upstream).sum().backward()
    # hidden, weight, targets and one log-sum-exp per token: nothing of size tokens x vocab
    assert saved and max(saved) <= max(hidden.numel(), weight.numel())
    assert sum(saved) < seq_len * batch * vocab // 10


def test_weight_without_grad():
    hidden, weight, targets, upstream = make_inputs()
    h = hidden.clone().requires_grad_()
    (token_logprobs(h, weight, targets, chunk_size=5) * upstream).sum().backward()
    ref_h = hidden.clone().requires_grad_()
    (reference(ref_h, weight, targets) * upstream).sum().backward()
    assert (h.grad - ref_h.grad).abs().max() < 1e-6
    assert weight.grad is None


def test_tp_group_of_size_one_is_the_single_rank_path():
    hidden, weight, targets, _ = make_inputs()
    assert torch.equal(token_logprobs(hidden, weight, targets),
                       token_logprobs(hidden, weight, targets, tp_group=None))


def test_validation():
    hidden, weight, targets, _ = make_inputs(seq_len=4, batch=2, hidden_size=3, vocab=5)
    with pytest.raises(ValueError, match="hidden must be"):
        token_logprobs(hidden[0], weight, targets)
    with pytest.raises(ValueError, match="targets must be"):
        token_logprobs(hidden, weight, targets.t())
    with pytest.raises(ValueError, match="output_weight must be"):
        token_logprobs(hidden, weight[:, :2], targets)
    with pytest.raises(ValueError, match="chunk_size"):
        token_logprobs(hidden, weight, targets, chunk_size=0)
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(hidden, weight, targets, temperature=0.0)
    with pytest.raises(ValueError, match=r"\[0, 5\)"):
        token_logprobs(hidden, weight, torch.full_like(targets, 5))
    with pytest.raises(ValueError, match=r"\[0, 5\)"):
        token_logprobs(hidden, weight, torch.full_like(targets, -100))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_vocab_parallel_two_ranks_match_single_rank():
    port = free_port()
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    cmd = [*prewarmed.torchrun(), "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port", str(port),
           str(TP_WORKER)]
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    # The two ranks share one stdout pipe, so their lines may interleave: count, don't split.
    assert result.stdout.count("OK rank 0 ") == 4, output  # 4 cases per rank (one with per-token temperatures)
    assert result.stdout.count("OK rank 1 ") == 4, output


def test_vocab_size_keeps_padded_rows_out_of_the_softmax():
    """Rows past vocab_size (Megatron's padding) get no probability and no gradient."""
    torch.manual_seed(0)
    hidden = torch.randn(5, 2, 8, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(12, 8, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 9, (2, 5))
    ours = token_logprobs(hidden, weight, targets, chunk_size=3, vocab_size=9)
    reference = logprobs_from_logits(torch.einsum("tbh,vh->btv", hidden, weight[:9]), targets)
    torch.testing.assert_close(ours, reference, rtol=0, atol=1e-12)
    ours.sum().backward()
    assert torch.all(weight.grad[9:] == 0)
    with pytest.raises(ValueError, match="vocabulary ids"):
        token_logprobs(hidden, weight, torch.full((2, 5), 10), vocab_size=9)
