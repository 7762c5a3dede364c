"""Routing replay (R3), capture side: the compact record, the trajectory field and the hf engine.

The reference routing is transformers' own: one plain forward of prompt + completion with
``output_router_logits=True``, each MoE layer's top-k of the softmax of its router logits (the
engine reads the router's returned ids through hooks in its own pass). Tiny random Qwen3-MoE of
test_rollout_engine (2 layers, 4 experts, top-2).
"""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
import torch

from spade.rl.routing_record import RoutedExperts, bytes_per_token, expert_dtype
from spade.rl.samples import Trajectory
from spade.rollout import GenerationRequest, HFEngine, SamplingParams
from test_rollout_engine import tiny_model

PREFIX = [(7 * i + 3) % 190 + 5 for i in range(40)]
PROMPTS = [PREFIX + [11, 12], PREFIX + [190, 2, 64, 64, 8], PREFIX + [150]]


def reference_routing(model, token_ids) -> torch.Tensor:
    """``[len - 1, layers, top_k]`` expert ids (sorted per token and layer) from router logits."""
    with torch.no_grad():
        out = model(torch.tensor([list(token_ids[:-1])]), output_router_logits=True)
    top_k = model.config.num_experts_per_tok
    layers = [torch.softmax(logits.float(), -1).topk(top_k, dim=-1).indices for logits in out.router_logits]
    return torch.stack(layers, dim=1).sort(dim=-1).values


def generate(engine, prompts, sampling_for):
    async def go():
        return await asyncio.gather(*(engine.generate(GenerationRequest(tuple(p), sampling_for(i)))
                                      for i, p in enumerate(prompts)))
    return asyncio.run(go())


def test_expert_ids_are_bytes_up_to_256_experts_and_the_30b_a3b_cost():
    assert expert_dtype(128) == "uint8" and expert_dtype(256) == "uint8" and expert_dtype(257) == "uint16"
    # Qwen3-30B-A3B: 48 MoE layers, top-8 of 128 experts
    assert bytes_per_token(48, 8, 128) == 384
    record = RoutedExperts.from_ids(torch.randint(0, 300, (5, 3, 2)), num_experts=300)
    assert record.array.dtype == np.uint16 and record.nbytes == 5 * 3 * 2 * 2
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        RoutedExperts.from_ids([[[0, 4]]], num_experts=4)


def test_sglang_int32_buffer_decodes_to_the_compact_record():
    ids = np.random.default_rng(0).integers(0, 128, size=(6, 48, 8)).astype("<i4")
    record = RoutedExperts.from_bytes(ids.tobytes(), source_dtype="int32", num_layers=48, top_k=8, num_experts=128)
    assert record.array.dtype == np.uint8 and record.array.shape == (6, 48, 8)
    assert np.array_equal(record.array, ids)
    with pytest.raises(ValueError, match="whole number of tokens"):
        RoutedExperts.from_bytes(ids.tobytes()[:-4], source_dtype="int32", num_layers=48, top_k=8, num_experts=128)


def test_trajectory_round_trips_its_routing_through_json_and_old_records_are_unchanged():
    routed = RoutedExperts.from_ids(torch.randint(0, 128, (4, 3, 2)), num_experts=128)
    trajectory = Trajectory(token_ids=(1, 2, 3, 4, 5), loss_mask=(0, 0, 1, 1), logprob_temperature=1.0,
                            routed_experts=routed)
    back = Trajectory.from_json(json.loads(json.dumps(trajectory.to_json())))
    assert back == trajectory and back.routed_experts.array.dtype == np.uint8
    plain = Trajectory(token_ids=(1, 2, 3), loss_mask=(0, 1), logprob_temperature=1.0)
    assert "routed_experts" not in plain.to_json()
    sample = back.replace(advantage=1.0).to_train_sample()
    assert torch.equal(sample.routed_experts, routed.to_tensor())
    with pytest.raises(ValueError, match="routed_experts covers 5 tokens"):
        Trajectory(token_ids=(1, 2, 3, 4, 5), loss_mask=(0, 0, 1, 1),
                   routed_experts=RoutedExperts.from_ids(torch.zeros(5, 3, 2, dtype=torch.long), 128))


def test_hf_engine_returns_the_routing_of_every_prompt_and_generated_token_shared_prefix_included():
    """Two prompts share a 40-token prefix the engine computes once for the batch (prefix
    attention); their prefix tokens still get their routing, equal to a plain forward's."""
    model = tiny_model("qwen3-moe")
    engine = HFEngine(model, max_batch_size=8, batch_wait_ms=200.0, eos_token_ids=())
    try:
        results = generate(engine, PROMPTS, lambda i: SamplingParams(
            temperature=1.0, max_new_tokens=6, seed=10 + i, return_routed_experts=i != 2))
        assert engine.stats.batch_sizes == [3] and engine.stats.shared_prefix_tokens > 0
    finally:
        engine.close()
    assert results[2].routed_experts is None  # not asked for
    for prompt, result in zip(PROMPTS[:2], results[:2]):
        sequence = [*prompt, *result.token_ids]
        routed = result.routed_experts
        assert routed.array.shape == (len(sequence) - 1, 2, 2) and routed.array.dtype == np.uint8
        got = routed.to_tensor().sort(dim=-1).values
        assert torch.equal(got, reference_routing(model, sequence))


def test_an_engine_set_to_record_routes_every_request_and_refuses_a_dense_model():
    """``loss.routing_replay: rollout`` builds the hf engine with ``return_routed_experts=True``."""
    with pytest.raises(ValueError, match="routing_replay: rollout.*mixture-of-experts"):
        HFEngine(tiny_model("qwen3"), return_routed_experts=True)
    model = tiny_model("qwen3-moe")
    engine = HFEngine(model, eos_token_ids=(), return_routed_experts=True)
    try:
        [result] = generate(engine, [PROMPTS[2]], lambda i: SamplingParams(temperature=0.0, max_new_tokens=3))
    finally:
        engine.close()
    sequence = [*PROMPTS[2], *result.token_ids]
    assert torch.equal(result.routed_experts.to_tensor().sort(dim=-1).values, reference_routing(model, sequence))


def test_the_conversation_keeps_the_newest_record_and_the_trajectory_carries_it():
    from support.hf_fixtures import make_tokenizer
    from spade.rollout.conversation import Conversation
    from spade.selfplay.trajectories import trajectory_of

    tokenizer = make_tokenizer()
    conversation = Conversation(tokenizer, [{"role": "user", "content": "hello world"}], max_context_tokens=200)

    def record(tokens: int) -> RoutedExperts:
        return RoutedExperts.from_ids(torch.randint(0, 4, (tokens, 2, 2)), num_experts=4)

    reply = tokenizer.convert_tokens_to_ids(["yes", "<|im_end|>"])
    first = record(len(conversation.token_ids) + 1)
    conversation.append_generated(reply, [-0.1, -0.2], routed_experts=first)
    conversation.append_messages([{"role": "user", "content": "what now"}])
    with pytest.raises(ValueError, match="routed_experts covers 3 tokens"):
        conversation.append_generated(reply, [-0.1, -0.2], routed_experts=record(3))
    before = len(conversation.token_ids)
    second = record(before + 1)
    conversation.append_generated(reply, [-0.1, -0.2], routed_experts=second)
    trajectory = trajectory_of(conversation, logprob_temperature=1.0)
    assert trajectory.routed_experts == second  # covers the first turn too
    assert trajectory.routed_experts.num_tokens == len(trajectory.token_ids) - 1
