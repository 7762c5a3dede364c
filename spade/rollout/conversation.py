"""Token-exact multi-turn conversations (ARCHITECTURE principle 5, SPEC section 4).

A ``Conversation`` is the token sequence of one episode, grown by appending and never rebuilt:

* the opening messages are rendered with the chat template (plus its generation prompt) once;
* each completion is appended exactly as the engine produced it (ids and log-probs), with loss
  mask 1, including the end-of-turn token the policy generated;
* each later batch of messages (user observations, tool results) is appended as its *template
  delta*, with loss mask 0.

The delta technique. Re-rendering the whole conversation and tokenising it again would change
history: the text of a completion does not always tokenise back into the ids that were sampled,
and some templates rewrite earlier turns (Qwen3 drops ``<think>...</think>`` from assistant turns
before the latest user message). So ``ChatFormat`` measures what the template adds, on a fixed
dummy conversation ``[user "d", assistant "d"]``:

* ``closing``: the ids the template puts after an assistant message's content (ChatML:
  ``<|im_end|>`` and ``\\n``), found as the common suffix of two renderings that differ only in the
  assistant content. After a completion that ended with a prefix of ``closing`` (its EOS), the rest
  of ``closing`` is appended; after a completion that stopped on some other stop token, all of it.
* the delta of new messages: render ``dummy + messages`` with the generation prompt, tokenise, and
  keep the ids after the dummy assistant turn's ``closing``.

When nothing was generated (the "completions" are the template's own assistant tokens), prompt
plus closings plus deltas equal the tokenisation of the full rendering; the tests check this for
ChatML and a Qwen3-style template. Messages that the template groups (Qwen3 wraps consecutive tool
results in one user turn) must be appended together, in one ``append_messages`` call.

Reasoning (thinking mode) and what a training sample is. Qwen3's hybrid template takes
``enable_thinking`` (``model.thinking``, see ``thinking_template_kwargs``): on, or left to the
template (Qwen3-8B thinks by default), the generation prompt is ``<|im_start|>assistant\n`` and the
model opens its own ``<think>`` block; off, the generation prompt also holds an empty
``<think>\n\n</think>\n\n``. The same keyword goes into every rendering (the opening prompt, every
delta, the dummy used to measure ``closing``), so every generation prompt of an episode is the
configured one. When it renders history, that template drops the reasoning of assistant turns
before the latest user message. spade does not re-render, so an episode is one sequence in which
each turn's reasoning stays exactly as generated: the model sees its earlier reasoning when it
writes the next turn, and the training sample is that same sequence (one per episode), so the
tokens trained on are token for token the ones the engine conditioned on and sampled, and the
importance ratios compare like with like. The price: later turns see a history the template would
not have produced (Qwen3 learned with earlier reasoning removed) and the context grows by every
turn's reasoning. The alternative, as the paper's released code forms its samples, re-renders the
history at every turn (earlier reasoning removed) both to generate and as that turn's sample
prompt, one sample per assistant turn; ``selfplay.plays.sample_form: per_turn`` plays that way
(``spade.selfplay.plays.turn_samples``: one fresh Conversation per turn, earlier completions re-tokenised
from their text by the template).

Budgets: ``max_context_tokens`` bounds the whole sequence and ``max_turns`` the number of
completions. An episode ends when the next turn cannot fit: appending messages raises
``BudgetExceeded`` (and sets ``end_reason``) if afterwards fewer than ``min_response_tokens``
would remain for the reply. Use ``max_new_tokens(limit)`` to size each generation request.
"""

from __future__ import annotations

from typing import Any, Literal, Mapping, Optional, Sequence

from ..rl.routing_record import RoutedExperts

EndReason = Literal["length", "abort", "context", "turns"]
THINKING_CHOICES: tuple[str, ...] = ("auto", "on", "off")
THINKING_SWITCH = "enable_thinking"  # the keyword Qwen3's hybrid templates read

_DUMMY_USER = {"role": "user", "content": "d"}


class TemplateError(ValueError):
    """The chat template cannot be extended by appending (the delta technique does not apply)."""


class BudgetExceeded(RuntimeError):
    """The next turn does not fit the context or turn budget; ``reason`` is "context" or "turns"."""

    def __init__(self, reason: EndReason, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def thinking_template_kwargs(chat_template: Any, thinking: str, key: str = "model.thinking") -> dict[str, Any]:
    """The ``apply_chat_template`` keywords for a thinking setting, given the chat template
    (``tokenizer.chat_template``: its text, a mapping of named templates, or None).

    ``auto`` passes nothing (the template's default: Qwen3-8B thinks, the Instruct-2507 models have
    no switch); ``on`` / ``off`` pass ``enable_thinking=True`` / ``False`` and need a template that
    reads it, since Jinja ignores keywords a template never mentions and the setting would be
    silently lost. Errors name ``key``.
    """
    if thinking not in THINKING_CHOICES:
        raise ValueError(f"{key}: {thinking!r} is not allowed; choose one of: {', '.join(THINKING_CHOICES)}")
    if thinking == "auto":
        return {}
    texts = list(chat_template.values()) if isinstance(chat_template, Mapping) else [chat_template]
    if not any(isinstance(text, str) and THINKING_SWITCH in text for text in texts):
        raise TemplateError(f"{key}: {thinking!r} needs a chat template with an {THINKING_SWITCH} switch "
                            "(hybrid Qwen3 models such as Qwen3-8B); this model's template has none, so "
                            "use auto")
    return {THINKING_SWITCH: thinking == "on"}


def _find(haystack: Sequence[int], needle: Sequence[int], start: int) -> int:
    n = len(needle)
    for i in range(start, len(haystack) - n + 1):
        if list(haystack[i:i + n]) == list(needle):
            return i
    return -1


class ChatFormat:
    """A tokenizer's chat template measured for appending (see the module docstring)."""

    def __init__(self, tokenizer: Any, chat_template_kwargs: Optional[Mapping[str, Any]] = None):
        self.tokenizer = tokenizer
        self.template_kwargs = dict(chat_template_kwargs or {})
        self._head = self.render_ids([_DUMMY_USER], add_generation_prompt=False)
        first = self._assistant_turn("a")
        second = self._assistant_turn("b")
        common = 0
        while common < min(len(first), len(second)) and first[-1 - common] == second[-1 - common]:
            common += 1
        if common == 0:
            raise TemplateError("the template adds nothing after an assistant message; cannot find "
                                "where a turn ends")
        self.closing: tuple[int, ...] = tuple(first[len(first) - common:])

    def render_ids(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool) -> list[int]:
        """Tokenise the template's rendering of ``messages`` (the reference, full-rendering path)."""
        text = self.tokenizer.apply_chat_template(
            [dict(m) for m in messages], tokenize=False,
            add_generation_prompt=add_generation_prompt, **self.template_kwargs,
        )
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is not None:  # the fast tokenizer's own encoder: same ids, without transformers' per-call overhead
            return backend.encode(text, add_special_tokens=False).ids
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _assistant_turn(self, content: str) -> list[int]:
        ids = self.render_ids([_DUMMY_USER, {"role": "assistant", "content": content}], False)
        if ids[:len(self._head)] != self._head:
            raise TemplateError("rendering an assistant reply changes the tokens of the user turn "
                                "before it")
        return ids[len(self._head):]

    def prompt_ids(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """The opening prompt: ``messages`` rendered with the generation prompt."""
        return self.render_ids(messages, add_generation_prompt=True)

    def message_delta(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """Ids that append ``messages`` (then the generation prompt) after a closed assistant turn."""
        dummy = [_DUMMY_USER, {"role": "assistant", "content": "d"}]
        full = self.render_ids(dummy + [dict(m) for m in messages], add_generation_prompt=True)
        if full[:len(self._head)] != self._head:
            raise TemplateError("appending messages changes the tokens of earlier turns")
        end = _find(full, self.closing, len(self._head))
        if end < 0:
            raise TemplateError("the assistant turn's closing tokens are missing once later "
                                "messages follow it")
        return full[end + len(self.closing):]

    def closing_after(self, generated: Sequence[int]) -> tuple[int, ...]:
        """The rest of ``closing`` not already produced at the end of ``generated``."""
        for matched in range(len(self.closing), 0, -1):
            if len(generated) >= matched and tuple(generated[-matched:]) == self.closing[:matched]:
                return self.closing[matched:]
        return self.closing


class Conversation:
    """One episode's token sequence with its loss mask and rollout log-probs (token-aligned)."""

    def __init__(
        self,
        tokenizer: Any,
        messages: Sequence[Mapping[str, Any]],
        *,
        max_context_tokens: int,
        max_turns: Optional[int] = None,
        min_response_tokens: int = 1,
        chat_template_kwargs: Optional[Mapping[str, Any]] = None,
        chat_format: Optional[ChatFormat] = None,
    ) -> None:
        if not messages:
            raise ValueError("a conversation needs at least one opening message")
        if max_turns is not None and max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.format = chat_format or ChatFormat(tokenizer, chat_template_kwargs)
        self.tokenizer = tokenizer
        self.max_context_tokens = max_context_tokens
        self.max_turns = max_turns
        self.min_response_tokens = min_response_tokens
        self.messages: list[dict[str, Any]] = [dict(m) for m in messages]
        prompt = self.format.prompt_ids(messages)
        if len(prompt) + min_response_tokens > max_context_tokens:
            raise BudgetExceeded("context", f"the opening prompt ({len(prompt)} tokens) leaves no "
                                 f"room for a reply within {max_context_tokens} tokens")
        self.prompt_ids: tuple[int, ...] = tuple(prompt)
        self._tokens: list[int] = list(prompt)
        self._mask: list[int] = [0] * len(prompt)
        self._logprobs: list[float] = [0.0] * len(prompt)
        self._versions: list[Optional[int]] = [None] * len(prompt)  # per id: the weights that generated it
        self._all_logprobs_known = True
        self.turns = 0
        self.weight_versions: list[int] = []  # the engine weight version of each generated turn
        self.end_reason: Optional[EndReason] = None
        self._awaiting_reply = True
        self._last_generated: tuple[int, ...] = ()
        self._last_start = len(self._tokens)  # where the last completion begins
        # the newest engine routing record (routing replay): it covers every id but the last of the
        # prompt + completion it came with, so the latest one covers all earlier turns too
        self.routed_experts: Optional[RoutedExperts] = None

    # ------------------------------------------------------------------ state

    @property
    def token_ids(self) -> list[int]:
        return list(self._tokens)

    @property
    def loss_mask(self) -> list[int]:
        """1 for ids the policy generated (its end-of-turn token included), else 0."""
        return list(self._mask)

    @property
    def rollout_logprobs(self) -> Optional[list[float]]:
        """The engine's log-prob per id (0.0 where the mask is 0); None if a turn came without."""
        return list(self._logprobs) if self._all_logprobs_known else None

    @property
    def remaining_tokens(self) -> int:
        return self.max_context_tokens - len(self._tokens)

    @property
    def turns_left(self) -> Optional[int]:
        return None if self.max_turns is None else self.max_turns - self.turns

    @property
    def ended(self) -> bool:
        return self.end_reason is not None

    @property
    def can_generate(self) -> bool:
        """A reply is due and fits."""
        return self._awaiting_reply and not self.ended and self.remaining_tokens >= self.min_response_tokens

    def max_new_tokens(self, per_turn_limit: int) -> int:
        """The ``max_new_tokens`` for the next request: the per-turn limit, capped by the context."""
        return max(0, min(per_turn_limit, self.remaining_tokens))

    def train_fields(self) -> dict[str, Any]:
        """``token_ids`` with target-aligned ``loss_mask`` / ``rollout_logprobs`` (entry ``i`` is
        about ``token_ids[i + 1]``), the layout ``spade.training.batching.TrainSample`` takes, and
        ``token_weight_versions`` (target-aligned: the weight version that generated each target id,
        None for ids the policy did not generate or whose version is unknown)."""
        logprobs = self.rollout_logprobs
        return {
            "token_ids": self.token_ids,
            "loss_mask": self._mask[1:],
            "rollout_logprobs": None if logprobs is None else logprobs[1:],
            "weight_version": min(self.weight_versions) if self.weight_versions else None,
            "token_weight_versions": self._versions[1:],
            "routed_experts": self.routed_experts,
        }

    # ------------------------------------------------------------------ growing

    def append_generated(
        self,
        token_ids: Sequence[int],
        logprobs: Optional[Sequence[float]] = None,
        finish_reason: str = "stop",
        weight_version: Optional[int] = None,
        routed_experts: Optional[RoutedExperts] = None,
    ) -> str:
        """Append a completion verbatim; returns its text (end-of-turn tokens left out).

        A completion that did not stop ("length", "abort") ends the episode (SPEC 4).
        ``weight_version`` is the engine's version of the weights that generated it;
        ``routed_experts`` the engine's routing of the prompt and completion (routing replay).
        """
        if not self._awaiting_reply or self.ended:
            raise RuntimeError("no reply is due: append messages first, or the episode has ended")
        token_ids = [int(t) for t in token_ids]
        if not token_ids:
            raise ValueError("a completion has at least one token")
        if len(token_ids) > self.remaining_tokens:
            raise ValueError(f"{len(token_ids)} generated tokens exceed the {self.remaining_tokens} "
                             "left in the context budget")
        if logprobs is not None and len(logprobs) != len(token_ids):
            raise ValueError(f"{len(token_ids)} tokens but {len(logprobs)} log-probs")
        fed = len(self._tokens) + len(token_ids) - 1  # the ids the engine ran the model on
        if routed_experts is not None and routed_experts.num_tokens != fed:
            raise ValueError(f"routed_experts covers {routed_experts.num_tokens} tokens, expected prompt + "
                             f"completion - 1 = {fed}")
        self._last_start = len(self._tokens)
        self._tokens += token_ids
        if routed_experts is not None:
            self.routed_experts = routed_experts
        self._mask += [1] * len(token_ids)
        if logprobs is None:
            self._all_logprobs_known = False
            self._logprobs += [0.0] * len(token_ids)
        else:
            self._logprobs += [float(x) for x in logprobs]
        if weight_version is not None:
            self.weight_versions.append(int(weight_version))
        self._versions += [None if weight_version is None else int(weight_version)] * len(token_ids)
        self.turns += 1
        self._awaiting_reply = False
        self._last_generated = tuple(token_ids)
        text = self._completion_text(token_ids)
        self.messages.append({"role": "assistant", "content": text})
        if finish_reason != "stop":
            self.end_reason = "abort" if finish_reason == "abort" else "length"
        elif self.max_turns is not None and self.turns >= self.max_turns:
            self.end_reason = "turns"
        return text

    def mask_last_completion(self) -> None:
        """Take the last completion out of the loss (mask 0), e.g. a malformed tool call when
        ``selfplay.plays.tool_mask_malformed_calls`` is on. Its tokens stay in the sequence."""
        if self.turns == 0:
            raise RuntimeError("nothing has been generated yet")
        end = self._last_start + len(self._last_generated)
        self._mask[self._last_start:end] = [0] * (end - self._last_start)

    def append_message(self, role: str, content: str, **fields: Any) -> list[int]:
        """Append one message (see ``append_messages``)."""
        return self.append_messages([{"role": role, "content": content, **fields}])

    def append_messages(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """Close the last completion per the template, append ``messages`` and the generation
        prompt (loss mask 0); returns the appended ids.

        Raises ``BudgetExceeded`` (conversation unchanged, ``end_reason`` set) when the turn budget
        is spent or the reply after these messages would get fewer than ``min_response_tokens``.
        """
        if self.end_reason in ("context", "turns"):
            raise BudgetExceeded(self.end_reason, f"the episode has ended ({self.end_reason})")
        if self.ended:
            raise RuntimeError(f"the episode has ended ({self.end_reason}): the last completion "
                               "did not stop")
        if self._awaiting_reply:
            raise RuntimeError("a reply is due: append the completion first (append all messages "
                               "of one turn in a single append_messages call)")
        if not messages:
            raise ValueError("no messages to append")
        piece = list(self.format.closing_after(self._last_generated))
        piece += self.format.message_delta(messages)
        if len(self._tokens) + len(piece) + self.min_response_tokens > self.max_context_tokens:
            self.end_reason = "context"
            raise BudgetExceeded("context", f"{len(piece)} more tokens leave no room for a reply "
                                 f"within {self.max_context_tokens} ({self.remaining_tokens} left)")
        self._tokens += piece
        self._mask += [0] * len(piece)
        self._logprobs += [0.0] * len(piece)
        self._versions += [None] * len(piece)
        self.messages += [dict(m) for m in messages]
        self._awaiting_reply = True
        return piece

    def _completion_text(self, token_ids: list[int]) -> str:
        drop = len(self.format.closing) - len(self.format.closing_after(token_ids))
        content = token_ids[:len(token_ids) - drop] if drop else token_ids
        return self.tokenizer.decode(content, skip_special_tokens=False)
