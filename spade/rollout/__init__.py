"""Rollout engines behind one async interface, and token-exact conversations.

``engine`` defines the interface (``RolloutEngine``, ``SamplingParams``, ``GenerationRequest``,
``GenerationResult``); ``hf_engine.HFEngine`` is the in-process transformers engine;
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
from .hf_engine import EngineStats, HFEngine

__all__ = [
    "BudgetExceeded",
    "ChatFormat",
    "Conversation",
    "EngineClosed",
    "EngineStats",
    "FinishReason",
    "GenerationRequest",
    "GenerationResult",
    "HFEngine",
    "RolloutEngine",
    "SamplingParams",
    "TemplateError",
]
