"""The designer's skills (SPEC 5) and which of them are active at each regeneration (SPEC 1.1).

Every environment the designer writes targets one skill. At regeneration number ``r`` (that is,
step ``r * k``) a curriculum picks the active skills, and environment slot ``i`` of the new set gets
``active[i % len(active)]``.

- ``games``: a round-robin window of 3 over the 6 game skills, moving by 3 each regeneration, so
  the two halves alternate: skills 0-2, then 3-5, then 0-2 again ...
- ``tool_use``: all 6 tool-use skills every time.
- ``two_skill`` curriculum (the paper's ablation): two skills, both active at every regeneration (a
  window of 2 over 2 skills). Games with the default list: Mathematical Reasoning and Pattern
  Recognition, as the paper ran it; a custom list or tool use: its first two skills.

The skill list and the window are configurable (:class:`SkillSettings`). Standard library only.

The description the designer prompt shows with each skill is ``selfplay.skills.descriptions``
(:data:`DESCRIPTION_SETS`): ``spade`` (the default) is the two-sentence text of :data:`GAME_SKILLS`
and :data:`TOOL_USE_SKILLS`; ``released`` is the released code's one-line description, in our
words (:data:`RELEASED_DESCRIPTIONS`: games ``spade/core/game_generator.py:42-105``, tool use
``spade/core/prompts/tool_use_template.py:14-69`` of spade-rl/spade at 9b2b813).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar, get_args

__all__ = [
    "ALL_SKILLS",
    "CURRICULA",
    "Curriculum",
    "DESCRIPTION_SETS",
    "DOMAINS",
    "Domain",
    "GAME_SKILLS",
    "RELEASED_DESCRIPTIONS",
    "Skill",
    "SkillSettings",
    "TOOL_USE_SKILLS",
    "active_skills",
    "domain_skills",
    "skill_by_name",
    "slot_skills",
]

Domain = Literal["games", "tool_use"]
Curriculum = Literal["full", "two_skill"]
DOMAINS: tuple[str, ...] = get_args(Domain)
CURRICULA: tuple[str, ...] = get_args(Curriculum)
# The paper's two-skill ablation (games): these two of the six.
PAPER_TWO_SKILLS = ("Mathematical Reasoning", "Pattern Recognition")

T = TypeVar("T")


@dataclass(frozen=True)
class Skill:
    """A skill name and the description the designer prompt shows for it."""

    name: str
    description: str


GAME_SKILLS: tuple[Skill, ...] = (
    Skill(
        "Mathematical Reasoning",
        "The goal is a quantity that has to be worked out over several steps: arithmetic, algebra, "
        "number theory, counting or probability, with the pieces revealed through play.",
    ),
    Skill(
        "Logical Deduction",
        "A hidden configuration is pinned down from clues and feedback; every answer must follow "
        "from ruling out the possibilities that contradict what has been observed.",
    ),
    Skill(
        "Spatial Reasoning",
        "Positions, directions, grids, maps or shapes that the agent cannot see all at once; it "
        "must keep track of where things are and how moves change them.",
    ),
    Skill(
        "Pattern Recognition",
        "A hidden rule produces sequences, symbols or transformations; the agent probes it, "
        "states the rule it has induced and applies it to new cases.",
    ),
    Skill(
        "Optimization",
        "Among many feasible choices under constraints the agent must find the best one "
        "(cheapest, shortest, largest), guided by feedback on how good each attempt is.",
    ),
    Skill(
        "Causal Inference",
        "A hidden system of causes and effects; the agent intervenes on variables and observes the "
        "results to separate real causes from coincidences and predict an outcome.",
    ),
)

TOOL_USE_SKILLS: tuple[Skill, ...] = (
    # The meaning of each follows the released skill table (tool_use_template.py, TOOL_USE_SKILLS);
    # the category and example task shapes the designer also sees are in tool_prompts.TOOL_SKILL_FOCUS.
    Skill(
        "API Orchestration",
        "Several calls that change the state are chained one after another, each one building on "
        "the state the call before it left behind.",
    ),
    Skill(
        "Data Retrieval",
        "The agent first finds out what a request needs through query tools (looking up, filtering "
        "and combining records) and then acts on exactly that.",
    ),
    Skill(
        "State Modification",
        "A sequence of operations that change the backend, each depending on the state the earlier "
        "ones produced; records are created, changed or removed precisely as asked.",
    ),
    Skill(
        "Error Recovery",
        "Some calls fail or are refused; the agent checks the state before it acts, reads the error, "
        "and retries with corrected arguments or by another route.",
    ),
    Skill(
        "Tool Selection",
        "Look-alike and distractor tools are on offer; the agent picks the one that fits the current "
        "state and request and fills in its required parameters.",
    ),
    Skill(
        "Multi-Step Workflows",
        "Ordered sequences of steps in which the later steps need the results of the earlier ones.",
    ),
)

ALL_SKILLS: tuple[Skill, ...] = GAME_SKILLS + TOOL_USE_SKILLS

DescriptionSet = Literal["spade", "released"]
DESCRIPTION_SETS: tuple[str, ...] = get_args(DescriptionSet)
# The released one-line descriptions (their meaning; the wording is ours).
RELEASED_DESCRIPTIONS: dict[str, str] = {
    "Mathematical Reasoning": "Working out mathematical problems and equations",
    "Logical Deduction": "Reaching conclusions from stated premises and rules",
    "Spatial Reasoning": "Grasping how things sit in space and turning them in the mind",
    "Pattern Recognition": "Spotting regularities in sequences, numbers or text",
    "Optimization": "Finding the best solution within constraints",
    "Causal Inference": "Understanding how causes lead to effects",
    "API Orchestration": "Chaining several state-changing tool calls one after another",
    "Data Retrieval": "Finding information with query tools first, then acting on it exactly",
    "State Modification": "Running state-changing operations, each depending on the state before it",
    "Error Recovery": "Coping with failed calls: check the state before acting, retry with corrections",
    "Tool Selection": "Picking the right tool among alternatives for the current state",
    "Multi-Step Workflows": "Running ordered steps whose later ones need the results of earlier ones",
}
_BY_NAME = {skill.name: skill for skill in ALL_SKILLS}


def skill_by_name(name: str) -> Skill:
    """The built-in skill called ``name``; ValueError listing the known names otherwise."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown skill {name!r}; known skills: {', '.join(_BY_NAME)}") from None


def domain_skills(domain: Domain) -> tuple[Skill, ...]:
    """The six skills of ``domain`` (``"games"`` or ``"tool_use"``), in SPEC order."""
    if domain == "games":
        return GAME_SKILLS
    if domain == "tool_use":
        return TOOL_USE_SKILLS
    raise ValueError(f"domain: {domain!r} is not allowed; choose one of: {', '.join(DOMAINS)}")


def active_skills(
    domain: Domain,
    regeneration_index: int,
    window: int | None = None,
    *,
    skills: Sequence[Skill] | None = None,
    curriculum: Curriculum = "full",
) -> tuple[Skill, ...]:
    """The skills active at regeneration number ``regeneration_index`` (``step // k``).

    ``skills`` defaults to the domain's six. ``window`` defaults to 3 for games and to the whole
    list for tool use. With ``n`` skills and window ``w`` the active skills are ``w`` consecutive
    ones (wrapping around) starting at ``(regeneration_index * w) % n``. ``curriculum="two_skill"``
    keeps two skills with a window of 2 (any other explicit window is an error): for games with the
    default list the paper's pair (``PAPER_TWO_SKILLS``), otherwise the first two of the list.
    """
    if not _is_int(regeneration_index) or regeneration_index < 0:
        raise ValueError(f"regeneration_index: must be an integer >= 0, got {regeneration_index!r}")
    defaults = domain_skills(domain)  # also validates ``domain``
    pool = tuple(skills) if skills is not None else defaults
    if curriculum == "two_skill":
        if window not in (None, 2):
            raise ValueError(f"window: the two_skill curriculum uses a window of 2, got {window}")
        if len(pool) < 2:
            raise ValueError(f"skills: the two_skill curriculum needs at least 2 skills, got {len(pool)}")
        if domain == "games" and skills is None:
            pool = tuple(skill for name in PAPER_TWO_SKILLS for skill in pool if skill.name == name)
        pool, window = pool[:2], 2
    elif curriculum != "full":
        raise ValueError(f"curriculum: {curriculum!r} is not allowed; choose one of: {', '.join(CURRICULA)}")
    if not pool:
        raise ValueError("skills: empty; at least one skill is needed")
    if window is None:
        window = 3 if domain == "games" else len(pool)
    if not _is_int(window) or not 1 <= window <= len(pool):
        raise ValueError(f"window: must be an integer in [1, {len(pool)}], got {window!r}")
    start = (regeneration_index * window) % len(pool)
    return tuple(pool[(start + j) % len(pool)] for j in range(window))


def slot_skills(active: Sequence[T], n_slots: int) -> list[T]:
    """Skill of each environment slot: slot ``i`` gets ``active[i % len(active)]``."""
    if not _is_int(n_slots) or n_slots < 0:
        raise ValueError(f"n_slots: must be an integer >= 0, got {n_slots!r}")
    if len(active) == 0:
        raise ValueError("active: empty; at least one skill is needed")
    return [active[i % len(active)] for i in range(n_slots)]


@dataclass(frozen=True)
class SkillSettings:
    """Configurable curriculum.

    ``skills``: names of built-in skills (see :data:`ALL_SKILLS`) replacing the domain's list, in
    rotation order; ``None`` keeps the domain's six. ``window``: skills active per regeneration;
    ``None`` means the domain default (games 3, tool use all). ``curriculum``: ``"full"`` or
    ``"two_skill"``.
    """

    curriculum: Curriculum = "full"
    skills: tuple[str, ...] | None = None
    window: int | None = None
    descriptions: DescriptionSet = "spade"  # see the module doc

    def __post_init__(self) -> None:
        if self.curriculum not in CURRICULA:
            raise ValueError(
                f"curriculum: {self.curriculum!r} is not allowed; choose one of: {', '.join(CURRICULA)}"
            )
        if self.skills is not None:
            if len(self.skills) == 0:
                raise ValueError("skills: empty; list at least one skill or leave it unset")
            if len(set(self.skills)) != len(self.skills):
                raise ValueError(f"skills: duplicate names in {list(self.skills)}")
            for name in self.skills:
                skill_by_name(name)
        if self.window is not None and (not _is_int(self.window) or self.window < 1):
            raise ValueError(f"window: must be an integer >= 1, got {self.window!r}")
        if self.curriculum == "two_skill" and self.window not in (None, 2):
            raise ValueError(f"window: the two_skill curriculum uses a window of 2, got {self.window}")
        if self.descriptions not in DESCRIPTION_SETS:
            raise ValueError(f"descriptions: {self.descriptions!r} is not allowed; choose one of: "
                             f"{', '.join(DESCRIPTION_SETS)}")

    def skill_list(self, domain: Domain) -> tuple[Skill, ...]:
        """The configured skills, or the domain's six, with the configured descriptions."""
        chosen = domain_skills(domain) if self.skills is None else tuple(skill_by_name(n) for n in self.skills)
        if self.descriptions == "released":
            chosen = tuple(Skill(skill.name, RELEASED_DESCRIPTIONS[skill.name]) for skill in chosen)
        return chosen

    def active(self, domain: Domain, regeneration_index: int) -> tuple[Skill, ...]:
        """:func:`active_skills` with these settings."""
        skills = None if self.skills is None else self.skill_list(domain)
        active = active_skills(domain, regeneration_index, self.window, skills=skills, curriculum=self.curriculum)
        if self.descriptions == "released":  # also for the domain's own list (the two_skill pair is picked by name)
            active = tuple(Skill(skill.name, RELEASED_DESCRIPTIONS[skill.name]) for skill in active)
        return active


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
