"""How each role samples: the ``selfplay.sampling`` section, one record per role.

Four roles call the model: the designer (writes an environment), the agent (plays it), the hint
call (writes a hint for the hinted arm) and the tool-use model screen (judges a candidate). Each has
one record here, and every call reads its values from that record and nowhere else
(``TextSampling.of``, ``SelfPlaySettings.engine_sampling``).

The agent's record differs from the others in two ways. Its ``timeout_s`` is always null: a play
is bounded by ``selfplay.plays``' timeouts and the turn and token budgets, not by one call. And it
has no ``thinking`` of its own: the agent's plays render with ``model.thinking``, the switch that
also sets the template keywords every other role starts from, so a second key for it could only
disagree with the first. What the agent record has instead is ``hinted_thinking``, the hinted
arm's switch (the released games runs rendered the hinted plays without thinking while the no-hint
plays thought).

Before this section the same values were flat ``selfplay`` keys (``agent_max_tokens``, ``top_p``
shared by every role, ``hint_sampling: released`` for the released hint call's top-p 0.9 and no
top-k, ...). :data:`MOVED_SAMPLING_KEYS` maps each onto its new place; a config that still uses
one loads with a warning that names the new key.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Mapping

from ..config import require

Thinking = Literal["auto", "on", "off"]
THINKING_CHOICES: tuple[str, ...] = ("auto", "on", "off")
SamplingRole = Literal["designer", "agent", "hint", "screen"]
ROLES: tuple[str, ...] = ("designer", "agent", "hint", "screen")
RELEASED_HINT_TOP_P = 0.9  # the released hint call's top-p (slime/model_adapter.py:155); no top-k


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class RoleSampling:
    """The sampling of one role's calls. The defaults are the agent's."""

    ROLE: ClassVar[str] = "agent"

    # Sampling temperature (0: greedy; the trainer's log-probs use the same temperature)
    temperature: float = 0.6
    # Nucleus sampling: the smallest set of tokens whose probabilities reach this sum (1: off)
    top_p: float = 0.95
    # Draw only from this many most likely tokens; null: off
    top_k: int | None = 20
    # The reply's token budget (the agent's: per turn; selfplay.max_context_tokens caps every call too)
    max_tokens: int = 8192
    # A bound in seconds on one call; null: none
    timeout_s: float | None = None

    def __post_init__(self) -> None:
        def key(name: str) -> str:
            return f"selfplay.sampling.{self.ROLE}.{name}"

        require(_number(self.temperature) and 0.0 <= self.temperature <= 10.0, key("temperature"),
                f"must be in [0, 10], got {self.temperature!r}")
        require(_number(self.top_p) and 0.0 < self.top_p <= 1.0, key("top_p"), f"must be in (0, 1], got {self.top_p!r}")
        require(self.top_k is None or (isinstance(self.top_k, int) and not isinstance(self.top_k, bool)
                                       and self.top_k >= 1), key("top_k"),
                f"must be >= 1 or null (off), got {self.top_k!r}")
        require(isinstance(self.max_tokens, int) and not isinstance(self.max_tokens, bool) and self.max_tokens >= 1,
                key("max_tokens"), f"must be an integer >= 1, got {self.max_tokens!r}")
        require(self.timeout_s is None or (_number(self.timeout_s) and self.timeout_s > 0), key("timeout_s"),
                f"must be > 0 or null (no bound), got {self.timeout_s!r}")
        for name in self._thinking_fields():
            value = getattr(self, name)
            if isinstance(value, bool):  # YAML 1.1 reads an unquoted on / off as a boolean
                value = "on" if value else "off"
                object.__setattr__(self, name, value)
            require(value in THINKING_CHOICES, key(name),
                    f"{value!r} is not allowed; choose one of: {', '.join(THINKING_CHOICES)}")

    def _thinking_fields(self) -> tuple[str, ...]:
        return ()


@dataclass(frozen=True)
class AgentSampling(RoleSampling):
    """The agent's plays, both arms (the engine's sampling of every turn)."""

    # Thinking of the hinted arm's plays: auto follows model.thinking, as the no-hint plays always do;
    # on / off pass enable_thinking=True / False to the chat template for these plays alone (a template
    # without that switch refuses them). The released 8B runs: off for games
    # (core/orchestrator.py:1861-1880), auto for tool use (its hinted arm takes the agent's path). docs/fidelity.md, "Issue 39".
    hinted_thinking: Thinking | bool = "auto"
    # Always null: a play is bounded by selfplay.plays' timeouts and the turn and token budgets, not per call
    timeout_s: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.timeout_s is None, "selfplay.sampling.agent.timeout_s",
                f"must be null: a play is bounded by selfplay.plays' timeouts, not per call; got {self.timeout_s!r}")

    def _thinking_fields(self) -> tuple[str, ...]:
        return ("hinted_thinking",)


@dataclass(frozen=True)
class CallSampling(RoleSampling):
    """A designer-side call (designer, hint, screen): its sampling and its thinking switch."""

    # Thinking of this role's calls: auto follows model.thinking; on / off pass enable_thinking=True /
    # False to the chat template for this role alone (a template without that switch refuses them).
    # With selfplay.designer_endpoint the endpoint decides (its extra_body).
    thinking: Thinking | bool = "auto"

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.timeout_s is not None, f"selfplay.sampling.{self.ROLE}.timeout_s",
                "must be a number of seconds > 0: a call needs a bound, got null")

    def _thinking_fields(self) -> tuple[str, ...]:
        return ("thinking",)


@dataclass(frozen=True)
class DesignerSampling(CallSampling):
    """The designer call that writes an environment."""

    ROLE: ClassVar[str] = "designer"

    # The designer reply's token budget (the released 8B thinking runs: 20,000)
    max_tokens: int = 16384
    # A bound in seconds on one designer call
    timeout_s: float | None = 300.0
    # Thinking of the designer call (auto: model.thinking). The released 8B runs with a corpus: off (the
    # corpus-grounded call keeps the launchers' enable_thinking false, spade/core/corpus_orchestrator.py:113)
    thinking: Thinking | bool = "auto"


@dataclass(frozen=True)
class HintSampling(CallSampling):
    """The hint call on an admitted environment (its hint feeds the hinted arm)."""

    ROLE: ClassVar[str] = "hint"

    # The hint call's temperature
    temperature: float = 0.3
    # The hint call's top-p. The reproduction recipes: 0.9, what the released hint call got from its
    # adapter, passing none itself (slime/model_adapter.py:155, core/hint_generator.py:250-256)
    top_p: float = 0.95
    # The hint call's top-k; null: off. The reproduction recipes: null (the released hint call passes none)
    top_k: int | None = 20
    # The hint reply's token budget (tool use: 2,048)
    max_tokens: int = 4096
    # A bound in seconds on one hint call
    timeout_s: float | None = 120.0
    # Thinking of the hint call (auto: model.thinking). The released 8B runs: off (the hint call keeps
    # --apply-chat-template-kwargs enable_thinking false; only the designer and the agent think)
    thinking: Thinking | bool = "auto"


@dataclass(frozen=True)
class ScreenSampling(CallSampling):
    """The tool-use model screen (SPEC 3.6) that judges a candidate environment."""

    ROLE: ClassVar[str] = "screen"

    # The screen call's temperature (the hint's)
    temperature: float = 0.3
    # The screen reply's token budget: the released validator's 16,384 (--spade-env-validator-max-tokens)
    max_tokens: int = 16384
    # A bound in seconds on one screen call (the hint's)
    timeout_s: float | None = 120.0
    # Thinking of the screen call (auto: model.thinking). The released 8B runs: off, as the hint's
    thinking: Thinking | bool = "auto"


@dataclass(frozen=True)
class SamplingSettings:
    """One sampling record per role: ``selfplay.sampling.designer``, ``.agent``, ``.hint``, ``.screen``."""

    # The designer call (defaults: temperature 0.6, top-p 0.95, top-k 20, 16,384 tokens, 300 s)
    designer: DesignerSampling = field(default_factory=DesignerSampling)
    # The agent's plays (defaults: temperature 0.6, top-p 0.95, top-k 20, 8,192 tokens per turn, no call bound)
    agent: AgentSampling = field(default_factory=AgentSampling)
    # The hint call (defaults: temperature 0.3, top-p 0.95, top-k 20, 4,096 tokens, 120 s)
    hint: HintSampling = field(default_factory=HintSampling)
    # The tool-use model screen (defaults: temperature 0.3, top-p 0.95, top-k 20, 16,384 tokens, 120 s)
    screen: ScreenSampling = field(default_factory=ScreenSampling)

    def __post_init__(self) -> None:
        for role, cls in (("designer", DesignerSampling), ("agent", AgentSampling), ("hint", HintSampling),
                          ("screen", ScreenSampling)):
            require(isinstance(getattr(self, role), cls), f"selfplay.sampling.{role}", f"must be a {role} record")

    def __call__(self, role: SamplingRole) -> RoleSampling:
        """The record of ``role`` named at run time (``designer``, ``agent``, ``hint`` or ``screen``)."""
        require(role in ROLES, "selfplay.sampling", f"no role {role!r}; roles: {', '.join(ROLES)}")
        return getattr(self, role)

    def replace(self, **roles: Mapping[str, Any]) -> SamplingSettings:
        """A copy with some fields of some roles changed: ``replace(agent={"max_tokens": 64})``."""
        return dataclasses.replace(self, **{role: dataclasses.replace(self(role), **dict(values))  # type: ignore[arg-type]
                                            for role, values in roles.items()})


def _each(name: str) -> tuple[str, ...]:
    return tuple(f"sampling.{role}.{name}" for role in ROLES)


# The flat selfplay keys this section replaced, with where each value goes now (paths relative to
# selfplay). A key that fed several roles fans out to each (top_p / top_k were shared by every role;
# the screen took the hint's temperature and timeout). hint_sampling was a choice, not a value: each
# of its choices names the values it stood for ("released": the released hint call's top-p 0.9 and
# no top-k). spade.config.from_mapping applies this table (SelfPlaySettings.MOVED_KEYS).
MOVED_SAMPLING_KEYS: dict[str, Any] = {
    "designer_temperature": "sampling.designer.temperature",
    "agent_temperature": "sampling.agent.temperature",
    "hint_temperature": ("sampling.hint.temperature", "sampling.screen.temperature"),
    "top_p": _each("top_p"),
    "top_k": _each("top_k"),
    "designer_max_tokens": "sampling.designer.max_tokens",
    "agent_max_tokens": "sampling.agent.max_tokens",
    "hint_max_tokens": "sampling.hint.max_tokens",
    "screen_max_tokens": "sampling.screen.max_tokens",
    "designer_timeout_s": "sampling.designer.timeout_s",
    "hint_timeout_s": ("sampling.hint.timeout_s", "sampling.screen.timeout_s"),
    "designer_thinking": "sampling.designer.thinking",
    "hint_thinking": "sampling.hint.thinking",
    "screen_thinking": "sampling.screen.thinking",
    "hint_arm_thinking": "sampling.agent.hinted_thinking",
    # last: "released" overrides what a flat top_p / top_k gave the hint, as it did
    "hint_sampling": {"shared": {},
                      "released": {"sampling.hint.top_p": RELEASED_HINT_TOP_P, "sampling.hint.top_k": None}},
}
