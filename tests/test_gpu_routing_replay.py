"""Routing replay (R3) on a GPU: the engine side (transformers' Qwen3-MoE routers read by
``spade.rollout.hf.routing``) and the trainer side (Megatron's routers replaying them, local and
Transformer Engine specs) both on CUDA. The same checks as test_routing_replay.py on CPU: every
recorded token is routed to the engine's experts, and the log-prob mismatch against the engine
with slightly perturbed trainer weights is lower with replay than without.

Skipped without a CUDA GPU (conftest). ``tools/gpu_check.sh`` (stage ``routing-replay``) and
``tools/device_check.sh`` (stage ``routing_replay``) run it; with ``ROUTING_REPLAY_FIGURES`` set to
a path, the measured figures are written there as JSON.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from megatron_fixtures import megatron_world  # noqa: F401  (fixture)
from spade.models import ParallelLayout
from spade.models.builder import BuildOptions, transformer_engine_usable
from spade.rl.samples import Trajectory
from spade.rollout.hf.routing import capture_routed_experts
from spade.training import build_model, compute_logprobs, init_parallel, make_micro_batches
from test_models_parity import VOCAB, checkpoint_state, tiny_hf
from test_routing_replay import LENGTHS, PERTURB, one_hot, perturbed, routing_maps

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("megatron_world")]


def cuda_trajectories(engine_model) -> list[Trajectory]:
    gen = torch.Generator().manual_seed(0)
    out = []
    for length in LENGTHS:
        ids = torch.randint(0, VOCAB, (length,), generator=gen).tolist()
        with torch.no_grad():
            logits = engine_model(torch.tensor([ids], device="cuda")).logits[0, :-1].float()
        logprobs = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[1:], device="cuda").unsqueeze(1))
        out.append(Trajectory(token_ids=tuple(ids), loss_mask=(1,) * (length - 1),
                              rollout_logprobs=logprobs.squeeze(1).cpu().tolist(), logprob_temperature=1.0,
                              advantage=1.0, routed_experts=capture_routed_experts(engine_model, ids)))
    return out


@pytest.mark.parametrize("use_te", [False, True])
def test_replay_on_gpu_routes_as_the_engine_and_lowers_the_mismatch(use_te):
    from megatron_patches.router_replay import agreement_counts, attach

    if use_te and not transformer_engine_usable():
        pytest.fail("transformer_engine is not importable: the GPU image must have it (see the Dockerfile)")
    hf_model, spec = tiny_hf("qwen3-moe")
    trajectories = cuda_trajectories(hf_model.cuda())
    samples = [t.to_train_sample() for t in trajectories]
    batches = make_micro_batches(samples, 10_000, packed=False)
    state = checkpoint_state(perturbed(hf_model.cpu(), PERTURB), spec)
    figures, mismatch = {"use_te": use_te}, {}
    for replay in (False, True):
        init_parallel(ParallelLayout(), seed=1234)
        model = build_model(spec, ParallelLayout(), hf_state=state,
                            options=BuildOptions(params_dtype=torch.float32, use_transformer_engine=use_te))
        replays = attach(model.chunks)
        for r in replays:
            r.replay = replay
        logprobs = []
        maps = routing_maps(model, lambda: logprobs.extend(compute_logprobs(model.chunks, batches)))
        agree, total = agreement_counts(model.chunks)
        figures[f"agreement_{'replay' if replay else 'own'}"] = agree / total
        mismatch[replay] = torch.cat([(lp.cpu() - s.rollout_logprobs).abs() for lp, s in zip(logprobs, samples)]
                                     ).mean().item()
        if replay:
            batch = batches[0]
            for layer, routing_map in maps:
                routed = batch.routed_experts[:, :, layer].long()
                got = routing_map.cpu().reshape(batch.input_ids.shape[1], batch.batch_size, -1).transpose(0, 1)
                recorded = routed[..., 0] >= 0
                assert torch.equal(got[recorded], one_hot(routed[recorded], got.shape[-1])), layer
    figures.update(mismatch_own=mismatch[False], mismatch_replay=mismatch[True],
                   ratio=mismatch[True] / mismatch[False])
    print("routing replay on GPU:", json.dumps(figures))
    path = os.environ.get("ROUTING_REPLAY_FIGURES")
    if path:
        with open(path, "a") as handle:
            handle.write(json.dumps(figures) + "\n")
    assert figures["agreement_own"] < 1.0
    assert figures["ratio"] < 0.9  # 0.66 on CPU (test_routing_replay.py)
