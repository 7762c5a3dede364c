"""Routing replay (R3), trainer side, in one process (gloo world of one, EP1): Megatron's routers
take the rollout's experts for the tokens that have a record.

The "engine" is the tiny transformers Qwen3-MoE (2 layers, 4 experts, top-2) whose routing
``spade.rollout.hf.routing`` captures; the trainer is Megatron loaded from the same weights, each
parameter perturbed by ``PERTURB`` (relative), so that its own routers pick other experts for
some tokens. Independent references: the routing map each Megatron ``TopKRouter`` returns (read by
a forward hook, not by the replay code), the transformers routing of both weight sets, and the
engine's log-probs from transformers.

Measured (seeded: 4 sequences of 24-40 tokens, perturbation 2%): router agreement 0.931 of
token-layer decisions without replay (0.948 of the layers' own choices on replayed inputs); mean
|trainer - engine| log-prob 0.0542 without replay, 0.0360 with it: ratio 0.66 (the rest is the
perturbed dense weights, which replay does not touch; at 1%: 0.980 agreement, ratio 0.86; at 3%:
0.903, ratio 0.72). The multi-rank layouts (EP2, TP2 x EP2) are in test_routing_replay_distributed.py.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from megatron_fixtures import megatron_world  # noqa: F401  (fixture)
from spade.config import ConfigError, from_mapping
from spade.models import ParallelLayout
from spade.models.builder import BuildOptions
from spade.rl.samples import Trajectory
from spade.rollout.hf.routing import capture_routed_experts
from spade.training import LossSettings, build_model, compute_logprobs, init_parallel, make_micro_batches
from spade.training.train_step import forward_backward
from test_models_parity import VOCAB, checkpoint_state, tiny_hf

FP32 = BuildOptions(params_dtype=torch.float32)
PERTURB = 0.02
LENGTHS = (40, 31, 24, 33)


def perturbed(hf_model, scale: float, seed: int = 7):
    """A copy whose every parameter moved by ``scale`` times its own size, in random directions."""
    import copy

    model = copy.deepcopy(hf_model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=gen) * param.abs().mean() * scale)
    return model


def engine_trajectories(engine_model) -> list[Trajectory]:
    gen = torch.Generator().manual_seed(0)
    out = []
    for length in LENGTHS:
        ids = torch.randint(0, VOCAB, (length,), generator=gen).tolist()
        with torch.no_grad():
            logits = engine_model(torch.tensor([ids])).logits[0, :-1]
        logprobs = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[1:]).unsqueeze(1)).squeeze(1)
        out.append(Trajectory(token_ids=tuple(ids), loss_mask=(1,) * (length - 1), rollout_logprobs=logprobs.tolist(),
                              logprob_temperature=1.0, advantage=1.0,
                              routed_experts=capture_routed_experts(engine_model, ids)))
    return out


def trainer(hf_model, spec, replay: bool):
    from megatron_patches.router_replay import attach

    init_parallel(ParallelLayout(), seed=1234)
    model = build_model(spec, ParallelLayout(), options=FP32, hf_state=checkpoint_state(hf_model, spec))
    if replay:
        attach(model.chunks)
    return model


def routing_maps(model, run) -> list[torch.Tensor]:
    """Every TopKRouter's returned routing map ``[tokens, experts]`` during ``run()``, in call order."""
    from megatron_patches.router_replay import routers

    maps, handles = [], []
    for router in routers(model.chunks[0]):
        handles.append(router.register_forward_hook(
            lambda module, args, output: maps.append((module.layer_number - 1, output[1].detach().clone()))))
    try:
        run()
    finally:
        for handle in handles:
            handle.remove()
    return maps


def one_hot(ids: torch.Tensor, experts: int) -> torch.Tensor:
    return torch.zeros(*ids.shape[:-1], experts, dtype=torch.bool).scatter_(-1, ids, True)


@pytest.fixture(scope="module")
def setup():
    hf_model, spec = tiny_hf("qwen3-moe")
    return hf_model, spec, engine_trajectories(hf_model)


def test_routing_replay_setting_is_validated():
    assert LossSettings().routing_replay == "off"
    with pytest.raises(ConfigError, match=r"routing_replay.*off, rollout"):
        from_mapping(LossSettings, {"routing_replay": "always"}, where="loss")


@pytest.mark.usefixtures("megatron_world")
def test_with_replay_every_router_routes_every_recorded_token_as_the_engine(setup):
    hf_model, spec, trajectories = setup
    model = trainer(perturbed(hf_model, PERTURB), spec, replay=True)
    samples = [t.to_train_sample() for t in trajectories]
    # the last sample carries only half its record: its other tokens route by the trainer
    half = samples[-1].routed_experts.shape[0] // 2
    samples[-1] = dataclasses.replace(samples[-1], routed_experts=samples[-1].routed_experts[:half])
    micro_batches = make_micro_batches(samples, 10_000, packed=False)
    assert len(micro_batches) == 1
    batch = micro_batches[0]
    maps = routing_maps(model, lambda: compute_logprobs(model.chunks, micro_batches))
    assert sorted(layer for layer, _ in maps) == [0, 1]
    experts = spec.moe.num_experts
    for layer, routing_map in maps:
        routed = batch.routed_experts[:, :, layer].long()  # [B, S, K], -1 unrecorded
        got = routing_map.reshape(batch.input_ids.shape[1], batch.batch_size, experts).transpose(0, 1)
        recorded = routed[..., 0] >= 0
        assert recorded.sum() == sum(int(s.routed_experts.shape[0]) for s in samples)
        assert torch.equal(got[recorded], one_hot(routed[recorded], experts))
    # unrecorded tokens: the trainer's own choice, at the first layer the perturbed model's routing
    # (deeper layers see hidden states that the replayed tokens before them shaped)
    own = capture_routed_experts(perturbed(hf_model, PERTURB), samples[-1].token_ids.tolist()).to_tensor()
    row = batch.sample_indices.index(len(samples) - 1)
    for layer, routing_map in maps[:1]:
        got = routing_map.reshape(batch.input_ids.shape[1], batch.batch_size, experts)[half:samples[-1].length - 1, row]
        assert torch.equal(got, one_hot(own[half:, layer], experts))


@pytest.mark.usefixtures("megatron_world")
def test_replay_lowers_the_logprob_mismatch_and_agreement_matches_transformers(setup):
    from megatron_patches.router_replay import agreement_counts

    hf_model, spec, trajectories = setup
    shifted = perturbed(hf_model, PERTURB)
    samples = [t.to_train_sample() for t in trajectories]
    micro_batches = make_micro_batches(samples, 10_000, packed=False)
    mismatch, agreement = {}, {}
    for replay in (False, True):
        model = trainer(shifted, spec, replay=True)
        if not replay:
            for chunk in model.chunks:  # measure only: the routers keep their own choice
                for module in chunk.modules():
                    if hasattr(module, "router_replay") and module.router_replay is not None:
                        module.router_replay.replay = False
        logprobs = compute_logprobs(model.chunks, micro_batches)
        agree, total = agreement_counts(model.chunks)
        agreement[replay] = agree / total
        mismatch[replay] = torch.cat([(lp - s.rollout_logprobs).abs() for lp, s in zip(logprobs, samples)]).mean().item()
    # the reference agreement: transformers' routing of the two weight sets
    same = total_ref = 0
    for t in trajectories:
        mine = capture_routed_experts(shifted, list(t.token_ids)).to_tensor().sort(-1).values
        theirs = t.routed_experts.to_tensor().sort(-1).values
        same += int((mine == theirs).all(-1).sum())
        total_ref += mine.shape[0] * mine.shape[1]
    # without replay the trainer's routing is the perturbed transformers model's, end to end; with
    # it, a layer's own choice is measured on hidden states the replayed layers below produced
    assert agreement[False] == pytest.approx(same / total_ref)
    assert agreement[False] < 1.0 and 0.5 < agreement[True] < 1.0  # the perturbation moved some decisions
    ratio = mismatch[True] / mismatch[False]
    print(f"agreement {agreement[False]:.3f} / {agreement[True]:.3f}; mismatch off {mismatch[False]:.4f} on {mismatch[True]:.4f}, ratio {ratio:.2f}")
    assert ratio < 0.8  # 0.66 measured


@pytest.mark.usefixtures("megatron_world")
def test_same_weights_agree_fully_and_replay_changes_nothing(setup):
    from megatron_patches.router_replay import agreement_counts

    hf_model, spec, trajectories = setup
    samples = [t.to_train_sample() for t in trajectories]
    micro_batches = make_micro_batches(samples, 10_000, packed=False)
    plain = compute_logprobs(trainer(hf_model, spec, replay=False).chunks, micro_batches)
    model = trainer(hf_model, spec, replay=True)
    replayed = compute_logprobs(model.chunks, micro_batches)
    assert agreement_counts(model.chunks) == (sum(2 * (s.length - 1) for s in samples),) * 2
    for a, b in zip(plain, replayed):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


@pytest.mark.usefixtures("megatron_world")
def test_gradients_reach_the_gate_weights_of_the_replayed_experts(setup):
    """The router weight's gradient under replay is that of the trainer's own logits gathered at
    the recorded experts: zero for an expert no token was routed to by the record."""
    hf_model, spec, trajectories = setup
    model = trainer(perturbed(hf_model, PERTURB), spec, replay=True)
    samples = [t.to_train_sample() for t in trajectories]
    # every recorded token of every layer avoids expert 3: its gate row gets no gradient
    routed = [s.routed_experts.clone() for s in samples]
    for r in routed:
        r[r == 3] = 0
        r[..., 1] = torch.where(r[..., 0] == r[..., 1], (r[..., 0] + 1) % 3, r[..., 1])
    samples = [dataclasses.replace(s, routed_experts=r) for s, r in zip(samples, routed)]
    micro_batches = make_micro_batches(samples, 10_000, packed=False)
    forward_backward(model.chunks, micro_batches, LossSettings(routing_replay="rollout"))
    for name, param in model.unwrapped()[0].named_parameters():
        if name.endswith("router.weight"):
            grad = param.main_grad
            assert grad[:3].abs().sum() > 0 and torch.isfinite(grad).all()
            assert torch.count_nonzero(grad[3]) == 0, name


@pytest.mark.usefixtures("megatron_world")
def test_records_through_the_checkpointed_json_give_the_same_logprobs(setup):
    """The delay buffer's pending designer samples are checkpointed as Trajectory JSON: a record
    read back trains exactly like the one kept in memory."""
    hf_model, spec, trajectories = setup
    model = trainer(perturbed(hf_model, PERTURB), spec, replay=True)
    back = [Trajectory.from_json(json.loads(json.dumps(t.to_json()))) for t in trajectories]
    before = compute_logprobs(model.chunks, make_micro_batches([t.to_train_sample() for t in trajectories], 10_000,
                                                               packed=False))
    after = compute_logprobs(model.chunks, make_micro_batches([t.to_train_sample() for t in back], 10_000,
                                                              packed=False))
    for a, b in zip(before, after):
        assert torch.equal(a, b)


def test_routing_replay_is_on_in_every_30b_a3b_recipe_and_off_elsewhere():
    """spade's own recipes; the reproduction recipes (examples/recipes/paper/) keep the released
    runs' setting, off (tests/test_paper_recipes.py holds them to it)."""
    from pathlib import Path

    from spade.train_config import load_train_config

    recipes = sorted(path for path in (Path(__file__).resolve().parents[2] / "examples").rglob("*.yaml")
                     if "paper" not in path.parts)
    seen = {"rollout": 0, "off": 0}
    for path in recipes:
        try:
            config = load_train_config(path)
        except Exception:  # not a train config (env specs, launch assets)
            continue
        moe_30b = "30B-A3B" in str(config.model.hf_dir)
        assert config.loss.routing_replay == ("rollout" if moe_30b else "off"), path.name
        seen[config.loss.routing_replay] += 1
    assert seen["rollout"] >= 5 and seen["off"] >= 3, seen


def test_replay_with_recompute_over_several_pipeline_stages_is_refused_by_name():
    from megatron_patches.router_replay import check_supported

    check_supported(pipeline_stages=1, recompute="full")
    check_supported(pipeline_stages=2, recompute="none")
    with pytest.raises(ValueError, match="loss.routing_replay: rollout .*pp=2, recompute='full'"):
        check_supported(pipeline_stages=2, recompute="full")
