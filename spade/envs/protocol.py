"""The environment contract (SPEC sections 3-4) and the vocabulary of failures.

A generated environment is a Python class with ``reset(seed=None) -> (str, dict)`` and
``step(action: str) -> (str, float, bool, bool, dict)``. Everything that can go wrong while
admitting or running one is exactly one :class:`ErrorKind`, raised at one :class:`Stage`.

Everything above the sandbox talks to it through two small protocols, :class:`Sandbox` (``open``)
and :class:`EnvInstance` (``reset``, ``step``, ``close``): the real service
(``spade.envs.sandbox.client.SandboxService``) is the default everywhere; a test or another
isolation technology can stand in where the real one cannot run.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any, Optional, Protocol, runtime_checkable

from .sandbox.runtime.returns import episode_return  # SPEC 1.3; in the runtime so the sandbox shares it


class ErrorKind(str, enum.Enum):
    SYNTAX_ERROR = "syntax_error"
    NO_ENV_CLASS = "no_env_class"
    IMPORT_BLOCKED = "import_blocked"
    INIT_ERROR = "init_error"
    RESET_ERROR = "reset_error"
    STEP_ERROR = "step_error"
    BAD_RETURN = "bad_return"
    NOT_SERIALIZABLE = "not_serializable"
    OUTPUT_TOO_LARGE = "output_too_large"
    EXIT_CALLED = "exit_called"
    CRASHED = "crashed"
    TIMEOUT = "timeout"
    MEMORY_LIMIT = "memory_limit"
    CPU_LIMIT = "cpu_limit"
    SANDBOX_VIOLATION = "sandbox_violation"
    SOURCE_TOO_LARGE = "source_too_large"
    NONDETERMINISTIC_RESET = "nondeterministic_reset"
    PROTOCOL_ERROR = "protocol_error"
    NO_OUTPUT = "no_output"  # the designer's generation returned nothing
    PROMPT_TOO_LONG = "prompt_too_long"  # the designer prompt does not fit the context budget
    # tool-use admission (SPEC 3.6, 5)
    BAD_TOOL_SCHEMA = "bad_tool_schema"  # schemas not valid JSON Schema objects, or SPEC 5's structure broken
    CRITERION_ERROR = "criterion_error"  # a criterion raises on the fresh state under every gate seed
    SCREEN_REJECTED = "screen_rejected"  # the model screen judged some criterion unreachable
    CRITERION_TRUE_AT_RESET = "criterion_true_at_reset"  # diagnostics, rejections only when switched on
    CRITERION_UNCHANGEABLE = "criterion_unchangeable"
    TRIVIAL_INSTRUCTION = "trivial_instruction"
    DEGENERATE_WIN = "degenerate_win"  # a policy that knows nothing of the game wins it (issue 23)
    REFERENCE_LOST = "reference_lost"  # the game's own reference_policy() does not win it (issue 23)
    REFERENCE_MISSING = "reference_missing"  # required, but the class has no reference_policy() (issue 23)
    UNWINNABLE = "unwinnable"  # what the designer offered (solution() actions, reference_policy) does not win (issue 40)
    # designed two-seat games (spade.envs.two_seat_probes, issue 44)
    ONE_SIDED = "one_sided"  # one seat never wins on the rules against the probe policies
    ALWAYS_DRAW = "always_draw"  # no seat ever wins on the rules: every game drawn, cut or forfeited
    NEVER_ENDS = "never_ends"  # no probe game ends within the turn budget
    # SPICE questions (spade.selfplay.sources.spice_source, issue 44)
    INVALID_QUESTION = "invalid_question"  # no question, no checkable answer, or malformed options
    UNGROUNDED = "ungrounded"  # the evidence the Challenger gave is not in its document


class Stage(str, enum.Enum):
    """Where a failure happened: an admission stage, or a runtime call."""

    GENERATE = "generate"  # the designer's generation, before any code exists
    EXTRACT = "extract"
    SYNTAX = "syntax"
    LOAD = "load"
    SMOKE = "smoke"
    DETERMINISM = "determinism"
    DEGENERATE_PROBE = "degenerate_probe"  # after determinism: games and tool environments (envs.*degenerate_probes)
    REFERENCE_POLICY = "reference_policy"  # games only, after the probes, when required (spade.envs.reference_policy)
    WINNABILITY = "winnability"  # games only, after the probes, when switched on (spade.envs.winnability)
    TOOL_SCHEMA = "tool_schema"  # tool environments only, after determinism
    RESET_GATE = "reset_gate"
    TOOL_PROBES = "tool_probes"
    MODEL_SCREEN = "model_screen"
    RESET = "reset"
    STEP = "step"
    SERVICE = "service"


@dataclass(frozen=True)
class EnvError:
    """One classified failure.

    ``infrastructure`` is True when the sandbox itself failed (a sandbox process died, the
    supervisor went away): the caller should retry, not penalise the environment.
    """

    kind: ErrorKind
    stage: Stage
    message: str
    infrastructure: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "stage": self.stage.value,
            "message": self.message,
            "infrastructure": self.infrastructure,
        }


class EnvFault(Exception):
    """The environment misbehaved. Penalise it; do not retry."""

    def __init__(self, error: EnvError):
        super().__init__(f"{error.kind.value} at {error.stage.value}: {error.message}")
        self.error = error


class InfrastructureFault(EnvFault):
    """The sandbox failed through no fault of the environment. Retry elsewhere."""


def raise_for(error: EnvError) -> None:
    raise (InfrastructureFault if error.infrastructure else EnvFault)(error)


@dataclass(frozen=True)
class ResetResult:
    observation: str
    info: dict[str, Any] = field(default_factory=dict)
    output: str = ""  # what the environment printed, capped


@dataclass(frozen=True)
class StepResult:
    observation: str
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any] = field(default_factory=dict)
    output: str = ""

    def as_tuple(self) -> tuple[str, float, bool, bool, dict[str, Any]]:
        return (self.observation, self.reward, self.terminated, self.truncated, self.info)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@runtime_checkable
class EnvInstance(Protocol):
    """One live environment: what the admission checks and the episode runner call."""

    class_name: str
    max_turns: Optional[int]

    async def reset(self, seed: Optional[int] = None) -> ResetResult: ...

    async def step(self, action: str) -> StepResult: ...

    async def close(self) -> None: ...


@runtime_checkable
class Sandbox(Protocol):
    """Where environments run. ``open`` loads ``source`` and instantiates its environment class;
    it raises :class:`EnvFault` for a bad environment, :class:`InfrastructureFault` when the
    sandbox itself failed."""

    async def open(self, source: str, *, max_turns: Optional[int] = None) -> EnvInstance: ...
