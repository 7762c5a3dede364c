"""SPICE's source of sets (``selfplay.env_source: spice``): the Challenger's corpus-grounded questions.

At every regeneration each slot draws one corpus document (from ``(seed, step, slot)``, as the
designer's first attempt draws it) and the kind of question it asks for (``selfplay.spice.mcq_share``),
and the model, as the designer role (its sampling, its thinking switch), answers the Challenger's
prompt (:mod:`spade.designer.spice_prompts`). The reply is then checked:

1. it parses: a question, an answer and, for multiple choice, ``options`` options lettered A, B, ...;
2. the answer is checkable: an option letter, or for free form something ``math-verify`` reads;
3. with ``grounding: quote``, its evidence sentence occurs in the document; with ``self_answer``
   also the Challenger's own check: the model, shown the document, answers the question as it said.

A valid question becomes a one-turn environment (:class:`~spade.envs.spice.QuestionSpec`, no hint)
that the agent, as the Reasoner, plays ``g_nohint`` times without the document
(:class:`~spade.envs.spice.SpiceSandbox`: 1 for a right answer, else 0); its Challenger call is the
designer sample, scored through the delay buffer by ``designer_reward: solver_variance`` (the
Gaussian of the plays' variance). An invalid one is written under ``rejected/`` like any failed
design, and its Challenger call still trains, with the fixed reward ``invalid_penalty``
(:class:`~.designer_source.PenalisedDesign`): SPICE penalises invalid questions rather than
dropping them. A call that produced nothing (timeout, prompt too long) has no sample to penalise.

The Reasoner's advantages are the source's own (:meth:`SpiceSource.advantages`, the hook the
orchestrator asks every source for): Dr. GRPO's centred returns by default.

Figures (``metrics()``): after a regeneration ``spice/challenger_questions``, ``..._valid``,
``..._valid_share``, ``..._mcq``, ``..._free_form``; after each step's plays
``spice/reasoner_accuracy`` (mean of the no-hint returns), ``spice/reasoner_variance_mean`` (the
mean over questions of their plays' variance) and ``spice/challenger_reward_now`` (the mean
Gaussian of those variances: the reward the buffer will give the valid questions when k is 1).
Every draw is derived from the seed: the source keeps no state.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ...config import ConfigError
from ...designer.corpus import Corpus, Document, attempt_rng
from ...agent.actions import parse_action
from ...designer.spice_prompts import (challenger_messages, parse_challenger_reply, quote_in_document,
                                       self_check_messages)
from ...envs.protocol import ErrorKind, Stage
from ...envs.spice import (QuestionSpec, SpiceSandbox, answers_match, boxed_answer, letter_of, math_answer_parses,
                           question_text)
from ..rewards.advantages import agent_advantages
from ..rewards.designer_rewards import SolverVarianceReward
from ..seeds import derive_seed
from ..settings import SelfPlaySettings
from .designer_source import EnvSpec, PenalisedDesign, RegenerationResult, env_id_for, save_set, write_rejection
from .text_generators import GenerationFailed, TextGenerator, TextSampling


@dataclass(frozen=True)
class Verdict:
    """A Challenger reply checked: the question when valid, else the rejection's kind and message."""

    spec: QuestionSpec | None
    kind: ErrorKind | None = None
    message: str = ""


def check_reply(reply: str, kind: str, document_text: str, document_key: str, settings: SelfPlaySettings) -> Verdict:
    """SPICE's validity checks of one Challenger reply (see the module docstring)."""
    config = settings.spice
    parsed = parse_challenger_reply(reply, kind, options=config.options)
    if parsed.problem is not None:
        return Verdict(None, ErrorKind.INVALID_QUESTION, parsed.problem)
    answer = parsed.answer
    if kind == "mcq":
        letter = letter_of(answer)
        if letter is None or ord(letter) - ord("A") >= len(parsed.options):
            return Verdict(None, ErrorKind.INVALID_QUESTION, f"the answer {answer[:40]!r} is not an option's letter")
        answer = letter
    elif not math_answer_parses(answer):
        return Verdict(None, ErrorKind.INVALID_QUESTION, f"math-verify cannot read the answer {answer[:60]!r}")
    if config.grounding in ("quote", "self_answer"):
        problem = quote_in_document(parsed.evidence, document_text, config.min_quote_words)
        if problem is not None:
            return Verdict(None, ErrorKind.UNGROUNDED, problem)
    return Verdict(QuestionSpec(kind=kind, question=parsed.question, answer=answer, options=parsed.options,
                                document=document_key))


@dataclass(frozen=True)
class ChallengerPrompt:
    """One slot's Challenger call: its messages, its document and kind, and what the run records of it."""

    messages: list[dict[str, str]]
    document: Document
    kind: str
    record: dict[str, Any]


def challenger_prompt(settings: SelfPlaySettings, corpus: Corpus, *, seed: int, step: int,
                      slot: int) -> ChallengerPrompt:
    """The Challenger's prompt for ``slot`` of ``step``: the document and question kind drawn from the
    run's seed, as the run draws them (``spade prompts`` shows the same)."""
    document = corpus.sample(attempt_rng(seed, step, slot, 0))
    kind = settings.spice.kind_of(attempt_rng(seed, "spice-kind", step, slot).random())
    record = {"step": step, "slot": slot, "attempt": 0, "skill": settings.spice.skill, "document": document.key,
              "question_kind": kind}
    return ChallengerPrompt(challenger_messages(document.text, kind, options=settings.spice.options), document, kind,
                            record)


class SpiceSource:
    """An :class:`~spade.selfplay.sources.env_source.EnvSource` of Challenger questions (module docstring)."""

    def __init__(self, settings: SelfPlaySettings, *, corpus: Corpus | None, generator: TextGenerator,
                 run_dir: Path, seed: int):
        if corpus is None:
            raise ConfigError("selfplay.env_source: spice reads corpus documents: set selfplay.use_corpus: true "
                              "and give corpus.paths (e.g. examples/corpus/demo.jsonl.gz)")
        self.settings = settings
        self.config = settings.spice
        self.corpus = corpus
        self.generator = generator
        self.run_dir = Path(run_dir)
        self.seed = int(seed)
        self.sandbox = SpiceSandbox()
        self.gaussian = SolverVarianceReward.from_settings(settings.rewards)
        self.last_metrics: dict[str, float] = {}

    async def next_set(self, step: int) -> RegenerationResult:
        result = RegenerationResult()
        slots = await asyncio.gather(*(self._slot(step, slot, result) for slot in range(self.settings.envs_per_set)))
        result.attempts = len(slots)
        for found in slots:
            if found is not None:
                env, trajectory = found
                result.envs.append(env)
                if trajectory is not None:
                    result.designer_fields[env.env_id] = trajectory
        save_set(self.run_dir, step, result.envs)
        kinds = [QuestionSpec.from_source(env.source).kind for env in result.envs]
        self.last_metrics = {
            "spice/challenger_questions": float(len(slots)),
            "spice/challenger_valid": float(len(result.envs)),
            "spice/challenger_valid_share": len(result.envs) / len(slots) if slots else 0.0,
            "spice/challenger_mcq": float(kinds.count("mcq")),
            "spice/challenger_free_form": float(kinds.count("free_form")),
            "spice/challenger_penalised": float(len(result.penalised)),
        }
        return result

    async def _slot(self, step: int, slot: int, result: RegenerationResult) -> tuple[EnvSpec, Any] | None:
        drawn = challenger_prompt(self.settings, self.corpus, seed=self.seed, step=step, slot=slot)
        document, kind, record = drawn.document, drawn.kind, drawn.record
        sampling = TextSampling.of(self.settings.sampling("designer"), derive_seed(self.seed, "spice", step, slot))
        try:
            generated = await self.generator.generate(drawn.messages, sampling)
        except GenerationFailed as exc:
            result.rejections.append(write_rejection(self.run_dir, record, exc.kind, Stage.GENERATE, exc.message, ""))
            return None
        record["finish_reason"] = generated.finish_reason
        verdict = check_reply(generated.text, kind, document.text, document.key, self.settings)
        if verdict.spec is not None and self.config.grounding == "self_answer":
            verdict = await self._self_check(verdict.spec, document.text, step, slot)
        env_id = env_id_for(step, slot)
        if verdict.spec is None:
            assert verdict.kind is not None
            result.rejections.append(write_rejection(self.run_dir, record, verdict.kind, Stage.EXTRACT,
                                                     verdict.message, generated.text))
            if generated.trajectory is not None:
                result.penalised.append(PenalisedDesign(ref=f"{env_id}-invalid", skill=self.config.skill,
                                                        trajectory=generated.trajectory,
                                                        reward=float(self.config.invalid_penalty)))
            return None
        env = EnvSpec(env_id=env_id, slot=slot, skill=self.config.skill, source=verdict.spec.to_source(), hint="",
                      class_name=f"spice_{kind}", max_turns=1, generated_step=step, document=document.key, attempts=1)
        return env, generated.trajectory

    async def _self_check(self, spec: QuestionSpec, document: str, step: int, slot: int) -> Verdict:
        """``grounding: self_answer``: the model answers its own question with the document in view
        (designer sampling, not trained); the question stands only when that answer is its stated one."""
        seed = derive_seed(self.seed, "spice-check", step, slot)
        sampling = TextSampling.of(self.settings.sampling("designer"), seed)
        try:
            generated = await self.generator.generate(self_check_messages(document, question_text(spec)), sampling)
        except GenerationFailed as exc:
            return Verdict(None, ErrorKind.UNGROUNDED, f"the Challenger's own check produced nothing: {exc.message}")
        answer = boxed_answer(parse_action(generated.text))
        if answers_match(spec, answer):
            return Verdict(spec)
        said = "no boxed answer" if answer is None else f"{answer[:40]!r}"
        return Verdict(None, ErrorKind.UNGROUNDED,
                       f"with the document, the Challenger answers its own question with {said}, not {spec.answer!r}")

    def advantages(self, env: EnvSpec, plays: Sequence[Any]) -> list[float | None]:
        """The Reasoner's advantages of one question's answers (``selfplay.spice.reasoner_advantage``):
        centred on their mean (Dr. GRPO, SPICE's), or z-scored (spade's GRPO)."""
        returns = [float(play.episode_return) for play in plays]
        if self.config.reasoner_advantage == "zscore" or not returns:
            return list(agent_advantages(returns))
        mean = math.fsum(returns) / len(returns)
        return [r - mean for r in returns]

    def observe(self, step: int, envs: list[EnvSpec], nohint_returns: dict[str, list[float]]) -> None:
        groups = [nohint_returns[env.env_id] for env in envs if nohint_returns.get(env.env_id)]
        if not groups:
            return
        variances = [_variance(group) for group in groups]
        returns = [r for group in groups for r in group]
        self.last_metrics["spice/reasoner_accuracy"] = math.fsum(returns) / len(returns)
        self.last_metrics["spice/reasoner_variance_mean"] = math.fsum(variances) / len(variances)
        self.last_metrics["spice/challenger_reward_now"] = (
            math.fsum(self.gaussian.of_variance(v) for v in variances) / len(variances))

    def metrics(self) -> dict[str, float]:
        """The latest regeneration's and plays' figures (see the module docstring), once."""
        out, self.last_metrics = self.last_metrics, {}
        return out

    def play_sandbox(self) -> SpiceSandbox:
        return self.sandbox

    def state_dict(self) -> dict[str, Any]:
        return {}  # every draw is derived from (seed, step, slot)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def _variance(values: list[float]) -> float:
    centre = math.fsum(values) / len(values)
    return math.fsum((v - centre) ** 2 for v in values) / len(values)
