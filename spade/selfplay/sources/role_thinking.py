"""Thinking per designer-side role: the chat format of the hint and the model-screen calls.

``model.thinking`` gives every role the same template keywords (the shared ``ChatFormat``).
``selfplay.sampling.hint.thinking`` / ``.screen.thinking`` override ``enable_thinking`` for one role:
``auto`` keeps the shared format; ``on`` / ``off`` render that role's prompts with
``enable_thinking`` True / False, checked as ``model.thinking`` is (a template without the switch
refuses them, the error names the key). The released 8B runs switch thinking on for the designer
and the agent only, so their hint and validator calls ran without it.
"""

from __future__ import annotations

from typing import Any, Mapping

from ...rollout.conversation import ChatFormat, thinking_template_kwargs


def role_template_kwargs(chat_template: Any, shared: Mapping[str, Any], setting: str, key: str) -> dict[str, Any]:
    """The template keywords of a role: the shared ones, with ``enable_thinking`` set unless ``auto``."""
    return {**shared, **thinking_template_kwargs(chat_template, setting, key)}


def role_chat_format(tokenizer: Any, shared: ChatFormat, setting: str, key: str) -> ChatFormat:
    """``shared`` itself when the role's keywords are the shared ones, else a format of its own."""
    kwargs = role_template_kwargs(getattr(tokenizer, "chat_template", None), shared.template_kwargs, setting, key)
    return shared if kwargs == shared.template_kwargs else ChatFormat(tokenizer, kwargs)
