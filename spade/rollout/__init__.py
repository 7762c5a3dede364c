"""Rollout engines behind one async interface, and token-exact conversations.

``engine`` defines the interface (``RolloutEngine``, ``SamplingParams``, ``GenerationRequest``,
``GenerationResult``); ``hf/`` is the in-process transformers engine (``hf.engine.HFEngine``),
``sglang/`` the client of SGLang servers with their deployment and weight transport;
``conversation.Conversation`` builds multi-turn episodes from template deltas.
"""

from .conversation import BudgetExceeded, ChatFormat, Conversation, TemplateError
from .engine import (
    EngineClosed,
    FinishReason,
    GenerationRequest,
    GenerationResult,
    RolloutEngine,
    SamplingParams,
)
from .hf.engine import HFEngine
from .hf.scheduler import HFEngineStats

__all__ = [
    "BudgetExceeded",
    "ChatFormat",
    "Conversation",
    "EngineClosed",
    "FinishReason",
    "GenerationRequest",
    "GenerationResult",
    "HFEngine",
    "HFEngineStats",
    "RolloutEngine",
    "SamplingParams",
    "TemplateError",
]
