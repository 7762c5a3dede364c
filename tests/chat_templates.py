"""Chat templates and a small byte-level BPE tokenizer for the conversation and engine tests.

The templates are written for these tests: ``CHATML`` (the plain ``<|im_start|>role\\ncontent
<|im_end|>\\n`` format), ``CHATML_DEFAULT_SYSTEM`` (the same, inserting a fixed system message
when the conversation has none, as SmolLM2's does) and ``QWEN3_STYLE`` (ChatML plus Qwen3's habits:
``<think>...</think>`` is removed from assistant turns that come before the latest user message,
consecutive tool results share one user turn wrapped in ``<tool_response>`` tags, and
``enable_thinking=False`` appends an empty think block to the generation prompt);
``chatml_with_tools`` builds the serve tests' templates (ChatML with a tools system turn).

``bpe_tokenizer`` trains a byte-level BPE (deterministic, offline) on a small corpus in which
"hello" is frequent, so "hello" is one token while "he" + "llo" is another valid spelling.
"""

from __future__ import annotations

CHATML = (
    "{%- for m in messages -%}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

DEFAULT_SYSTEM = "You are a careful assistant for tests."
CHATML_DEFAULT_SYSTEM = (
    "{%- if messages[0]['role'] != 'system' -%}"
    "{{- '<|im_start|>system\\n" + DEFAULT_SYSTEM + "<|im_end|>\\n' -}}"
    "{%- endif -%}" + CHATML
)

QWEN3_STYLE = r"""
{%- set state = namespace(latest_user=-1) -%}
{%- for m in messages -%}
  {%- if m['role'] == 'user' -%}{%- set state.latest_user = loop.index0 -%}{%- endif -%}
{%- endfor -%}
{%- for m in messages -%}
  {%- set body = m['content'] -%}
  {%- if m['role'] == 'assistant' and loop.index0 < state.latest_user and '</think>' in body -%}
    {%- set body = body.split('</think>')[-1].lstrip('\n') -%}
  {%- endif -%}
  {%- if m['role'] == 'tool' -%}
    {%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' -%}
      {{- '<|im_start|>user' -}}
    {%- endif -%}
    {{- '\n<tool_response>\n' + body + '\n</tool_response>' -}}
    {%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' -%}
      {{- '<|im_end|>\n' -}}
    {%- endif -%}
  {%- else -%}
    {{- '<|im_start|>' + m['role'] + '\n' + body + '<|im_end|>\n' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<|im_start|>assistant\n' -}}
  {%- if enable_thinking is defined and not enable_thinking -%}
    {{- '<think>\n\n</think>\n\n' -}}
  {%- endif -%}
{%- endif -%}
""".strip()

# The serve tests' templates: a system turn that lists the tools as JSON lines (only with tools; the
# heading, in Jinja string text, opens it), the ChatML turns, then a generation prompt of the test's.
_TOOLS_AND_TURNS = r"""
{%- if tools -%}
{{- '<|im_start|>system\nTOOLS_HEADING<tools>' -}}
{%- for t in tools -%}{{- '\n' + (t | tojson) -}}{%- endfor -%}
{{- '\n</tools><|im_end|>\n' -}}
{%- endif -%}
{%- for m in messages -%}
{{- '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' -}}
{%- endfor -%}
"""
GENERATION_PROMPT = r"""
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}"""
# Qwen3-Thinking-2507's: the generation prompt opens <think>, the reply starts inside the reasoning
GENERATION_PROMPT_OPENS_THINK = r"""
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n<think>\n' -}}{%- endif -%}"""


def chatml_with_tools(generation_prompt: str, tools_heading: str = "") -> str:
    return (_TOOLS_AND_TURNS.replace("TOOLS_HEADING", tools_heading) + generation_prompt).strip()


SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
PLAIN_ADDED_TOKENS = ["<think>", "</think>", "<tool_response>", "</tool_response>"]

CORPUS = [
    "hello hello hello world, hello there. hello again!",
    "The cat sat on the mat and looked at the dog.",
    "Move left, move right, move up, move down. Your score is 3.",
    "Think step by step: the answer is \\boxed{42}.",
    "You are a careful assistant for tests. Please play the game.",
    "system user assistant tool response observation action reward",
] * 20


def bpe_tokenizer(chat_template: str = CHATML, vocab_size: int = 400):
    """A byte-level BPE ``PreTrainedTokenizerFast`` with ChatML specials and ``chat_template``."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(CORPUS, trainer=trainer)
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in PLAIN_ADDED_TOKENS])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    tokenizer.chat_template = chat_template
    return tokenizer
