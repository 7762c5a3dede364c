"""SPICE's numbers (``selfplay.spice``, read with ``selfplay.env_source: spice``).

SPICE (Liu et al. 2025, "SPICE: Self-Play In Corpus Environments Improves Reasoning", arXiv
2510.24684): one model is both the Challenger, which reads a corpus document and poses a question
with a checkable answer, and the Reasoner, which answers it without the document. Here the
Challenger is the designer role and its question a one-turn environment the agent (the
Reasoner) plays ``g_nohint`` times (:mod:`.spice_source`). The Challenger's reward is the
Gaussian of the Reasoner group's correctness variance (``selfplay.rewards.designer_reward:
solver_variance``, ``sv_target`` 0.25, ``sv_sigma`` 0.1); a question that is not valid gets
``invalid_penalty`` instead. The paper's setup section was not available to check these numbers
against (docs/fidelity.md, "SPICE"): the defaults below are this project's, some written from
memory of the paper.

* ``mcq_share``: the share of slots asking for a multiple-choice question (the rest ask for a
  free-form answer, an integer or expression checked with ``math-verify``). SPICE trains on both
  kinds together; 0.5 (this project's choice: no mix is known from the paper).
* ``options``: options of a multiple-choice question (4; the paper's count is not verified).
* ``invalid_penalty``: the Challenger's reward for an invalid question (SPICE penalises one with a
  small negative reward; -0.1 is remembered, not verified against the paper's text).
* ``grounding``: what makes a question valid beyond its format. ``quote`` (default): the reply's
  ``<evidence>`` (at least ``min_quote_words`` words) must occur in the document, spade's
  deterministic stand-in for "the answer is supported by the document"; ``self_answer``: the
  Challenger's own check: the model (designer sampling, a call that is not trained) answers the
  question with the document in view, and the question is valid only when that answer matches
  the one it stated (the quote is checked too); ``none``: format and answer checks only.
* ``reasoner_advantage``: ``centred`` (SPICE's Dr. GRPO: each answer's return less the mean of its
  question's answers, not divided by their standard deviation) or ``zscore`` (spade's GRPO
  advantage, divided by it). The Challenger's are centred either way (designer advantages).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from ...config import require

_WHERE = "selfplay.spice"
GROUNDINGS: tuple[str, ...] = ("quote", "self_answer", "none")
REASONER_ADVANTAGES: tuple[str, ...] = ("centred", "zscore")


@dataclass(frozen=True)
class SpiceSettings:
    """``selfplay.spice``: the Challenger's question kinds, validity checks and penalty."""

    mcq_share: float = 0.5         # share of slots asking for a multiple-choice question (the rest: free form)
    options: int = 4               # options of a multiple-choice question
    invalid_penalty: float = -0.1  # the Challenger's reward for an invalid question (SPICE's rho; value not verified)
    # quote: the reply's evidence must occur in the document; self_answer: that, and the model answering its own
    # question with the document in view must give the stated answer; none: neither
    grounding: Literal["quote", "self_answer", "none"] = "quote"
    min_quote_words: int = 5       # the shortest evidence that counts (grounding quote)
    skill: str = "spice"   # the skill every question is filed under (designer advantages are centred per skill)
    # the Reasoner's advantages: centred (SPICE's Dr. GRPO: a return less its question's mean) or zscore (spade's GRPO)
    reasoner_advantage: Literal["centred", "zscore"] = "centred"

    def __post_init__(self) -> None:
        def key(name: str) -> str:
            return f"{_WHERE}.{name}"

        require(isinstance(self.mcq_share, (int, float)) and not isinstance(self.mcq_share, bool)
                and 0.0 <= self.mcq_share <= 1.0, key("mcq_share"), f"must be in [0, 1], got {self.mcq_share!r}")
        require(isinstance(self.options, int) and not isinstance(self.options, bool) and 2 <= self.options <= 26,
                key("options"), f"must be an integer in [2, 26], got {self.options!r}")
        require(isinstance(self.invalid_penalty, (int, float)) and not isinstance(self.invalid_penalty, bool)
                and math.isfinite(self.invalid_penalty), key("invalid_penalty"),
                f"must be a finite number, got {self.invalid_penalty!r}")
        require(self.grounding in GROUNDINGS, key("grounding"),
                f"{self.grounding!r} is not allowed; choose one of: {', '.join(GROUNDINGS)}")
        require(isinstance(self.min_quote_words, int) and not isinstance(self.min_quote_words, bool)
                and self.min_quote_words >= 1, key("min_quote_words"),
                f"must be an integer >= 1, got {self.min_quote_words!r}")
        require(isinstance(self.skill, str) and bool(self.skill.strip()), key("skill"), "must be a non-empty name")
        require(self.reasoner_advantage in REASONER_ADVANTAGES, key("reasoner_advantage"),
                f"{self.reasoner_advantage!r} is not allowed; choose one of: {', '.join(REASONER_ADVANTAGES)}")

    def kind_of(self, draw: float) -> str:
        """The question kind of a slot whose uniform draw in [0, 1) is ``draw``."""
        return "mcq" if draw < self.mcq_share else "free_form"


def check_spice_selfplay(selfplay) -> None:
    """What ``selfplay.env_source: spice`` needs of the rest of ``selfplay`` (each failure names its key):
    corpus documents, the variance reward, Challenger samples kept without a hint, one rollout shard."""
    require(selfplay.use_corpus, "selfplay.use_corpus",
            "must be true with env_source: spice (the Challenger writes each question from a corpus document)")
    require(selfplay.rewards.designer_reward == "solver_variance", "selfplay.rewards.designer_reward",
            f"{selfplay.rewards.designer_reward!r} with env_source: spice; allowed: solver_variance (SPICE's "
            "Gaussian of the Reasoner group's variance; the others read hinted plays a question does not have)")
    require(selfplay.rewards.failed_hint == "hint_return_zero", "selfplay.rewards.failed_hint",
            f"{selfplay.rewards.failed_hint!r} with env_source: spice; allowed: hint_return_zero (a question "
            "has no hint: 'drop' would leave every Challenger sample out)")
    require(selfplay.rollout_shards == 1, "selfplay.rollout_shards",
            f"{selfplay.rollout_shards} shards with env_source: spice; allowed: 1 (questions are played by "
            "rank 0's source)")
