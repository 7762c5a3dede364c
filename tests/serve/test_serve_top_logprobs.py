"""``top_logprobs`` (chat) and ``logprobs: N`` (legacy completions) through the real ``openai``
client against a real ``spade serve`` subprocess (test_serve's server on a tiny random Qwen3), and
through the SGLang engine against the SGLang stand-in.

The reference is independent of the engine: transformers' forward of the tiny model over prompt
+ generated tokens (teacher forcing), ``log_softmax(logits / T)`` at the request's temperature
(T = 1 for greedy), its top k by value. The generated tokens are the
greedy path, computed here by transformers' argmax (``top_k=1`` for the sampled case: the path
is greedy, the log-probs are still those at the request's temperature).
"""

from __future__ import annotations

import pytest
import torch

from test_serve import HELLO, MODEL_NAME, model_dir, server, client, tokenizer  # noqa: F401

import openai  # noqa: E402

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def reference_model(model_dir):  # noqa: F811 - the fixture imported above
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def _greedy_ids(model, prompt_ids: list[int], count: int) -> list[int]:
    """transformers' greedy continuation (argmax of the full forward at every step)."""
    ids = list(prompt_ids)
    with torch.no_grad():
        for _ in range(count):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt_ids):]


def _texts(tokenizer, ids) -> list[str]:  # noqa: F811
    return [tokenizer.decode([i], skip_special_tokens=True) for i in ids]


def _reference_top(model, prompt_ids: list[int], generated: list[int], temperature: float,
                   k: int) -> list[list[tuple[int, float]]]:
    """Per generated position, the k most likely (id, log-prob) of log_softmax(logits / T)."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + generated])).logits[0].float()
    logp = torch.log_softmax(logits[len(prompt_ids) - 1:-1] / temperature, dim=-1)
    values, ids = torch.topk(logp, k, dim=-1)
    return [list(zip(i.tolist(), v.tolist())) for i, v in zip(ids, values)]


def _chat_prompt_ids(tokenizer) -> list[int]:  # noqa: F811
    text = tokenizer.apply_chat_template(HELLO, tokenize=False, add_generation_prompt=True)
    return tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids


def test_chat_top_logprobs_match_transformers_under_greedy(client, tokenizer, reference_model):  # noqa: F811
    reply = client.chat.completions.create(model=MODEL_NAME, messages=HELLO, max_tokens=12,
                                           temperature=0, logprobs=True, top_logprobs=5)
    entries = reply.choices[0].logprobs.content
    assert len(entries) >= 5
    prompt = _chat_prompt_ids(tokenizer)
    generated = _greedy_ids(reference_model, prompt, len(entries))
    assert [e.token for e in entries] == _texts(tokenizer, generated)
    reference = _reference_top(reference_model, prompt, generated, 1.0, 5)
    for entry, expected in zip(entries, reference):
        assert len(entry.top_logprobs) == 5  # the count is honoured
        values = [t.logprob for t in entry.top_logprobs]
        assert values == sorted(values, reverse=True)
        # greedy: the most likely alternative is the sampled token
        assert entry.top_logprobs[0].token == entry.token
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob, abs=1e-6)
        assert [t.token for t in entry.top_logprobs] == [
            tokenizer.decode([i], skip_special_tokens=True) for i, _ in expected]
        assert values == pytest.approx([v for _, v in expected], abs=1e-4)
        assert entry.top_logprobs[0].bytes == list(entry.token.encode("utf-8"))


def test_completion_logprobs_n_at_the_request_temperature(client, tokenizer, reference_model):  # noqa: F811
    prompt = tokenizer("the cat", add_special_tokens=False)["input_ids"]
    reply = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=10, temperature=0.7,
                                      seed=3, logprobs=3, extra_body={"top_k": 1})
    logprobs = reply.choices[0].logprobs
    generated = _greedy_ids(reference_model, prompt, len(logprobs.tokens))
    assert logprobs.tokens == _texts(tokenizer, generated)
    reference = _reference_top(reference_model, prompt, generated, 0.7, 3)
    for token, logprob, top, expected in zip(logprobs.tokens, logprobs.token_logprobs,
                                             logprobs.top_logprobs, reference):
        # the greedy path's token is the most likely one, its log-prob at T = 0.7
        assert logprob == pytest.approx(expected[0][1], abs=1e-4)
        # the legacy shape: the N most likely tokens and the sampled one, keyed by text (a
        # byte token's text is U+FFFD, so several can share a key: the later one is kept)
        wanted = {tokenizer.decode([i], skip_special_tokens=True): v for i, v in expected}
        wanted.setdefault(token, logprob)
        assert top == pytest.approx(wanted, abs=1e-4)


def test_streamed_top_logprobs_equal_the_whole_response(client):  # noqa: F811
    args = dict(model=MODEL_NAME, messages=HELLO, max_tokens=10, temperature=0.9, seed=11,
                logprobs=True, top_logprobs=2)
    whole = client.chat.completions.create(**args).choices[0].logprobs.content
    chunks = list(client.chat.completions.create(stream=True, **args))
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs
                for e in c.choices[0].logprobs.content]
    assert [(e.token, [(t.token, round(t.logprob, 5)) for t in e.top_logprobs]) for e in streamed] == \
        [(e.token, [(t.token, round(t.logprob, 5)) for t in e.top_logprobs]) for e in whole]
    assert all(len(e.top_logprobs) == 2 for e in streamed)


@pytest.mark.parametrize("call, param", [
    (lambda c: c.chat.completions.create(model=MODEL_NAME, messages=HELLO, max_tokens=2,
                                         logprobs=True, top_logprobs=21), "top_logprobs"),
    (lambda c: c.chat.completions.create(model=MODEL_NAME, messages=HELLO, max_tokens=2,
                                         top_logprobs=3), "top_logprobs"),
    (lambda c: c.completions.create(model=MODEL_NAME, prompt="the cat", max_tokens=2,
                                    logprobs=21), "logprobs"),
])
def test_out_of_range_counts_are_refused(client, call, param):  # noqa: F811
    with pytest.raises(openai.BadRequestError) as caught:
        call(client)
    assert caught.value.status_code == 400
    assert caught.value.body["param"] == param


def test_alternatives_ties_and_masked_tokens():
    from spade.rollout.hf.sampling import top_alternatives

    logp = torch.log_softmax(torch.tensor([0.5, 2.0, 1.0, 2.0, 1.0, 2.0, -1.0]), dim=0)
    top = top_alternatives(logp, 4)
    assert [t for t, _ in top] == [1, 3, 5, 2]
    assert [v for _, v in top] == pytest.approx(logp[[1, 3, 5, 2]].tolist())
    assert [t for t, _ in top_alternatives(logp.flip(0), 2)] == [1, 3]
    masked = logp.clone()
    masked[[1, 3]] = float("-inf")  # a grammar's mask: such tokens are no alternatives
    assert [t for t, _ in top_alternatives(masked[:4], 3)] == [2, 0]
