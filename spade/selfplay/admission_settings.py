"""How a candidate environment is admitted: the ``selfplay.admission`` section.

Admission (:mod:`spade.envs.admission`) runs the paper's smoke test and then the checks this
project adds: determinism, the degenerate-policy probes, winnability and the optional reference
policy. This record holds the switches and numbers of those stages; ``paper_exact`` turns every
addition off at once. Which stages a step runs also depends on the rest of ``selfplay`` (the
domain, where environments come from): :class:`~spade.selfplay.settings.SelfPlaySettings` composes
them (``admission_probe_settings``, ``admission_winnability_settings``, ...).

Before this section the same values were flat ``selfplay`` keys (``admission_probes``,
``degenerate_threshold``, ``admission_timeout_s``, ...) and the ``selfplay.tool_admission`` section. :data:`MOVED_ADMISSION_KEYS` maps each onto
its new place; a config that still uses one loads with a warning that names the new key.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

from ..config import require
from ..envs.degenerate_probes import DEFAULT_MAX_STEPS, DEFAULT_SEED_COUNT, DEFAULT_THRESHOLD
from ..envs.reference_policy import DEFAULT_MIN_RETURN
from ..envs.tool_use.admission import ToolAdmissionSettings
from ..envs.winnability import UNPROVEN_RULES

SMOKE_TESTS: tuple[str, ...] = ("paper", "released")
_WHERE = "selfplay.admission"


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class AdmissionSettings:
    """The admission stages' switches and numbers (``selfplay.admission``)."""

    # A bound in seconds on the validation of one candidate
    timeout_s: float = 60.0
    # Admission's smoke test: "paper" (SPEC 3.4: reset(seed=42), three checked probe actions,
    # reset(seed=123)) or "released" (the released validate_game, spade.envs.released_smoke: the
    # loader's checked actions, then reset() and "1", "2", "test" unchecked, all within 60 s).
    smoke_test: Literal["paper", "released"] = "paper"
    # Admission's determinism stage (two resets with one seed give one first observation): this
    # project's addition to the paper's checks (SPEC 3.5). false leaves it out (paper_exact:
    # every addition out).
    determinism: bool = True
    # Admission's degenerate-policy probes (spade.envs.degenerate_probes; games only): cheap policies
    # that know nothing of the game (constant replies, the first observation's numbers and words,
    # random short replies) play it on three seeds; one whose mean return reaches
    # probe_threshold rejects it (degenerate_win). spade's addition, on in every recipe.
    probes: bool = True
    # The mean return at which a probe policy wins a candidate and rejects it
    probe_threshold: float = DEFAULT_THRESHOLD
    # A cap on the step calls all probes of one candidate make (winnability and the reference policy too)
    probe_steps: int = DEFAULT_MAX_STEPS
    # seeds per round of the probes, drawn per candidate from run.seed and its code (issue 40)
    probe_seeds: int = DEFAULT_SEED_COUNT
    # Winnability (spade.envs.winnability; games only, issue 40): the actions solution() returns and
    # an optional reference_policy() are played on the probes' seeds; when something was offered and
    # nothing reaches reference_min_return the game is rejected (unwinnable). spade's addition,
    # off here and in the paper recipes, on in spade's GPU recipes.
    winnability_gate: bool = False
    # What a game whose designer offered only a description gets from the winnability stage (admit | reject)
    winnability_unproven: Literal["admit", "reject"] = "admit"
    # Optional winnability proof (spade.envs.reference_policy; games designed in the run only): the
    # designer prompt asks for a reference_policy(observation) method, and admission plays it on the
    # probes' seeds after the probes; a mean return below reference_min_return rejects the game
    # (reference_lost; no method: reference_missing). spade's addition, off here and in the paper recipes.
    reference_policy: bool = False
    # The mean return over the probes' seeds a winnability proof or the reference policy must reach
    reference_min_return: float = DEFAULT_MIN_RETURN
    # true: every admission gate the paper lacks is off (determinism, the probes and the reference
    # policy, whatever their own switches say): the paper's admission exactly, for a reproduction row.
    paper_exact: bool = False
    # The tool-use stages' switches (spade.envs.tool_use.admission): tool counts, the schema gate,
    # the stricter criterion gates, the model screen
    tool_use: ToolAdmissionSettings = field(default_factory=ToolAdmissionSettings)

    def __post_init__(self) -> None:
        def key(name: str) -> str:
            return f"{_WHERE}.{name}"

        require(_number(self.timeout_s) and self.timeout_s > 0, key("timeout_s"), f"must be > 0, got {self.timeout_s}")
        require(self.smoke_test in SMOKE_TESTS, key("smoke_test"),
                f"{self.smoke_test!r} is not allowed; choose one of: {', '.join(SMOKE_TESTS)}")
        for name in ("determinism", "probes", "winnability_gate", "reference_policy", "paper_exact"):
            require(isinstance(getattr(self, name), bool), key(name), f"must be true or false, got {getattr(self, name)!r}")
        for name in ("probe_threshold", "reference_min_return"):
            value = getattr(self, name)
            require(_number(value) and 0.0 < value <= 1.0, key(name),
                    f"must be a number in (0, 1] (a mean episode return, clipped to [-1, 1]), got {value!r}")
        require(_count(self.probe_steps) and self.probe_steps >= 1, key("probe_steps"),
                f"must be an integer >= 1, got {self.probe_steps!r}")
        require(_count(self.probe_seeds) and 1 <= self.probe_seeds <= 64, key("probe_seeds"),
                f"must be an integer from 1 to 64, got {self.probe_seeds!r}")
        require(self.winnability_unproven in UNPROVEN_RULES, key("winnability_unproven"),
                f"must be one of: {', '.join(UNPROVEN_RULES)}; got {self.winnability_unproven!r}")
        require(isinstance(self.tool_use, ToolAdmissionSettings), key("tool_use"), "must be a tool_use section")

    @property
    def checks_determinism(self) -> bool:
        """The determinism stage runs (its switch on, the paper-exact switch off)."""
        return self.determinism and not self.paper_exact

    @property
    def runs_probes(self) -> bool:
        """The degenerate-policy probes run (their switch on, the paper-exact switch off)."""
        return self.probes and not self.paper_exact

    def tool_settings(self) -> ToolAdmissionSettings:
        """The tool-use stages' switches as they run: ``paper_exact`` turns the schema gate off too."""
        if self.paper_exact and self.tool_use.schema_gate:
            return replace(self.tool_use, schema_gate=False)
        return self.tool_use


# The flat selfplay keys this section replaced, with where each value goes now (paths relative to
# selfplay). spade.config.from_mapping applies this table (SelfPlaySettings.MOVED_KEYS).
MOVED_ADMISSION_KEYS: dict[str, Any] = {
    "admission_timeout_s": "admission.timeout_s",
    "admission_smoke_test": "admission.smoke_test",
    "admission_determinism": "admission.determinism",
    "admission_probes": "admission.probes",
    "degenerate_threshold": "admission.probe_threshold",
    "degenerate_probe_steps": "admission.probe_steps",
    "degenerate_probe_seeds": "admission.probe_seeds",
    "winnability_gate": "admission.winnability_gate",
    "winnability_unproven": "admission.winnability_unproven",
    "require_reference_policy": "admission.reference_policy",
    "reference_min_return": "admission.reference_min_return",
    "admission_paper_exact": "admission.paper_exact",
    "tool_admission": "admission.tool_use",  # a whole section: its keys keep their names
}
