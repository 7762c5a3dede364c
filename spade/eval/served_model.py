"""The model under test served over HTTP for a harness that talks to it as an OpenAI-compatible
endpoint (tau2, ACEBench): ``spade serve``'s own application on a free 127.0.0.1 port."""

from __future__ import annotations

import contextlib
from typing import AsyncIterator

from .chat_interface import ChatModelLike

SERVED_NAME = "spade-agent"  # the model name the endpoint answers to
DEFAULT_CONTEXT = 32768  # when neither the model nor its engine states a context length


@contextlib.asynccontextmanager
async def serve_chat_model(model: ChatModelLike) -> AsyncIterator[str]:
    """Serve the model's engine and tokenizer with ``spade serve``'s application on a free
    127.0.0.1 port for as long as the context lasts; yields the base URL (``.../v1``). The model's
    chat-template keywords (``model.thinking``) reach every prompt the harness sends, and a thinking
    model's reasoning is kept out of ``content`` (``spade serve``'s default reasoning parser)."""
    from ..serve.http import HTTPServer
    from ..serve.service import ModelService

    eos = set(getattr(model.engine, "eos_token_ids", ()) or ()) | set(model.stop_token_ids)
    if getattr(model.tokenizer, "eos_token_id", None) is not None:
        eos.add(int(model.tokenizer.eos_token_id))
    context = model.max_context_tokens or getattr(model.engine, "max_context_tokens", None) or DEFAULT_CONTEXT
    service = ModelService(model.engine, model.tokenizer, SERVED_NAME, max_context_tokens=context,
                           eos_token_ids=eos, template_kwargs=model.template_kwargs)
    server = HTTPServer(service.handle, "127.0.0.1", 0)
    await server.start()
    try:
        yield f"http://127.0.0.1:{server.port}/v1"
    finally:
        await server.close()
