"""The designer's environment source (``selfplay.env_source: designer``): one regeneration (SPEC 1.1),
that is designer attempts per slot, admission, hints, and the saved set.

For each slot of the new set (slot ``i`` gets ``active[i % n_active]``) up to ``max_attempts``
designer calls are made, one after the other; each attempt draws a fresh corpus document with an
rng derived from ``(seed, step, slot, attempt)`` (so a resumed run draws the same ones), builds the
designer prompt with the memory block for the slot's skill, generates, and runs the admission
checks in the sandbox. The first admitted candidate fills the slot and gets one hint call; a slot
whose attempts all fail stays empty. Slots run concurrently (the engine batches their calls).

The designer, hint and model-screen calls go through one :class:`~.text_generators.TextGenerator`:
our engine (token-exact; the designer call's trajectory becomes the designer sample), or with
``selfplay.designer_endpoint`` an external OpenAI-compatible endpoint (the "Fixed ED" ablation:
same prompts, corpus documents and memory, no trajectory, nothing trained).

On disk (``run_dir``):

* ``rejected/step_SSSSSS/slot{i}_attempt{j}.json``: every failed attempt with its reason
  (``kind``, ``stage``, ``message``), the raw designer response and the document key;
* ``envs/step_SSSSSS/ENV_ID.py``, ``ENV_ID.hint.txt``, ``ENV_ID.json``: the admitted set.

The other sources of a set (a fixed pool, RLVE) live in :mod:`.fixed_pool` and :mod:`.rlve_source`;
they share :func:`admit_candidate`, :func:`write_rejection` and :func:`save_set` with this one.

With ``memory_seed_dir`` set, every regeneration first makes sure the memory holds the seed
examples (:meth:`Memory.seed`: a no-op once they are stored, and it puts them back after a resume
rolled the memory back to nothing); the examples then reach the prompt through the ordinary
memory selection.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator

from ...designer.corpus import Corpus, attempt_rng
from ...designer.memory import Memory, format_memory_block, load_seed_records
from ...designer.prompts import DesignerRequest, Message, clean_hint, designer_messages, hint_messages
from ...designer.tool_prompts import (TOOL_APP_DOMAINS, draw_tool_variant, parse_screen_verdict, screen_messages,
                                     tool_designer_messages, tool_hint_messages)
from ...designer.skills import Skill, slot_skills
from ...envs.admission import AdmissionVerdict, admit
from ...envs.degenerate_probes import probe_policies
from ...envs.pool_files import HINT_SUFFIX
from ...envs.protocol import ErrorKind, InfrastructureFault, Sandbox, Stage
from ...rollout.conversation import ChatFormat
from ...rollout.engine import RolloutEngine
from ...rl.samples import Trajectory
from .role_thinking import role_chat_format
from .slot_stages import SlotStages
from ..seeds import derive_seed
from ..settings import SelfPlaySettings
from ..step import Step
from .text_generators import GenerationFailed, TextGenerator, TextSampling, text_generator


@dataclass
class EnvSpec:
    """One environment of the current set (JSON round-trips through ``to_json``/``from_json``)."""

    env_id: str
    slot: int
    skill: str
    source: str
    hint: str
    class_name: str
    max_turns: int | None
    generated_step: int
    document: str | None = None
    attempts: int = 1
    tool_report: dict[str, Any] | None = None  # tool use: what admission's tool stages found

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "EnvSpec":
        return cls(**data)


@dataclass
class Rejection:
    slot: int
    attempt: int
    skill: str
    kind: ErrorKind
    stage: Stage
    message: str


@dataclass(frozen=True)
class PenalisedDesign:
    """A designer call whose candidate was rejected but still trains, with the fixed reward ``reward``
    (SPICE's penalty for an invalid question); ``ref`` names its sample in the delay buffer."""

    ref: str
    skill: str
    trajectory: Trajectory
    reward: float


@dataclass
class RegenerationResult:
    envs: list[EnvSpec] = field(default_factory=list)
    designer_fields: dict[str, Trajectory] = field(default_factory=dict)  # env_id -> the designer call
    attempts: int = 0
    rejections: list[Rejection] = field(default_factory=list)
    penalised: list[PenalisedDesign] = field(default_factory=list)  # rejected calls trained on a fixed reward


def tool_report_of(verdict: Any) -> dict[str, Any] | None:
    report = getattr(verdict, "tool_report", None)
    return None if report is None else report.to_json()


def resolve_seed_dir(value: str) -> Path:
    """``memory_seed_dir`` as given (or relative to the working directory), else relative to the
    repository root, where ``examples/`` lives."""
    path = Path(value).expanduser()
    if path.is_absolute() or path.exists():
        return path
    repo = Path(__file__).resolve().parents[2] / path
    return repo if repo.exists() else path


def step_dir(run_dir: Path, kind: str, step: int) -> Path:
    return run_dir / kind / f"step_{step:06d}"


def env_id_for(step: int, slot: int) -> str:
    return f"s{step:06d}-e{slot:02d}"


@dataclass(frozen=True)
class DesignerPrompt:
    """One designer attempt's prompt and what the run records of it (skill, document, ...)."""

    messages: list[Message]
    record: dict[str, Any]


def seed_memory(settings: SelfPlaySettings, memory: Memory | None) -> int:
    """Store the seed examples of ``memory_seed_dir`` that ``memory`` lacks; returns how many."""
    if not settings.memory_seed_dir or not settings.use_memory or memory is None:
        return 0
    skills = [skill.name for skill in settings.skills.skill_list(settings.domain)]
    return len(memory.seed(load_seed_records(resolve_seed_dir(settings.memory_seed_dir), skills)))


def designer_prompt(settings: SelfPlaySettings, *, corpus: Corpus | None, memory: Memory | None, seed: int,
                    step: int, slot: int, attempt: int, skill: Skill) -> DesignerPrompt:
    """The prompt of designer attempt ``attempt`` for ``slot`` of ``step``: the corpus document,
    memory examples and (tool use) app domain and variant drawn from the run's seed, as the run
    draws them (``spade prompts`` shows the same)."""
    s = settings
    document = None
    if s.use_corpus and corpus is not None:
        document = corpus.sample(attempt_rng(seed, step, slot, attempt))
    block = ""
    if s.use_memory and memory is not None:
        selection = memory.select_examples(skill.name, attempt_rng(seed, "memory", step, slot, attempt))
        block = format_memory_block(selection)
    request = DesignerRequest(skill=skill, document=None if document is None else document.text,
                              memory_block=block, difficulty=s.difficulty, max_turns=s.max_turns,
                              reference_policy=s.asks_reference_policy, rules=s.designer_prompt_rules)
    record: dict[str, Any] = {"step": step, "slot": slot, "attempt": attempt, "skill": skill.name,
                              "document": None if document is None else document.key}
    if s.domain == "tool_use":
        rng = attempt_rng(seed, "tool_task", step, slot, attempt)
        app_domain, variant = rng.choice(TOOL_APP_DOMAINS), draw_tool_variant(rng)
        record.update(app_domain=app_domain, variant=variant[0])
        messages = tool_designer_messages(request, app_domain, variant)
    else:
        messages = designer_messages(request, no_corpus=None if s.use_corpus else s.no_corpus_prompt,
                                     rng=attempt_rng(seed, "concepts", step, slot, attempt),
                                     order=s.designer_prompt_order)
    return DesignerPrompt(messages, record)


class GateCounts:
    """One regeneration's ``degenerate_win`` rejections by the winning policy's family, and its
    ``unwinnable`` ones, as step metrics: ``env/rejected_degenerate_win_<family>`` for every family
    of the games probes (0 when none won; tool families as they occur) and ``env/rejected_unwinnable``
    while the winnability gate is on. ``settings`` None: nothing to report (no regeneration yet)."""

    def __init__(self, settings: SelfPlaySettings | None):
        self.settings = settings
        self.families: Counter[str] = Counter()
        self.unwinnable = 0

    def note(self, verdict: AdmissionVerdict) -> None:
        if verdict.error is not None and verdict.error.kind is ErrorKind.DEGENERATE_WIN:
            self.families[verdict.degenerate_family or "unknown"] += 1
        elif verdict.error is not None and verdict.error.kind is ErrorKind.UNWINNABLE:
            self.unwinnable += 1

    def metrics(self) -> dict[str, float]:
        s = self.settings
        if s is None:
            return {}
        out: dict[str, float] = {}
        if s.admission_probe_settings() is not None and s.env_source != "rlve":
            families = {policy.family for policy in probe_policies()} if s.domain == "games" else set()
            for family in sorted(families | set(self.families)):
                out[f"env/rejected_degenerate_win_{family}"] = float(self.families[family])
        if s.admission_winnability_settings() is not None:
            out["env/rejected_unwinnable"] = float(self.unwinnable)
        return out


class DesignerRound:
    """Regenerates the environment set of one regeneration step."""

    def __init__(self, settings: SelfPlaySettings, *, sandbox: Sandbox, engine: RolloutEngine,
                 tokenizer: Any, chat_format: ChatFormat, corpus: Corpus | None, memory: Memory | None,
                 run_dir: Path, seed: int, stop_token_ids: tuple[int, ...] = ()):
        self.settings = settings
        self.sandbox = sandbox
        self.engine = engine
        self.tokenizer = tokenizer
        self.chat_format = chat_format
        self.corpus = corpus
        self.memory = memory
        self.run_dir = run_dir
        self.seed = seed
        self.stop_token_ids = stop_token_ids
        self._gate_counts = GateCounts(None)  # the latest regeneration's rejections by probe family
        self.stages = SlotStages()  # each slot's stage, told to the progress line (the orchestrator's on_stage)
        # The designer's text calls (designer, hint, screen): our engine, or selfplay.designer_endpoint.
        self.generator: TextGenerator = text_generator(settings, engine=engine, tokenizer=tokenizer,
                                                       chat_format=chat_format, stop_token_ids=stop_token_ids)
        # The hint and screen calls: the designer's generator, or one rendering with the role's own
        # thinking switch (selfplay.sampling.hint / .screen thinking, spade.selfplay.sources.role_thinking).
        roles = settings.sampling
        self.hint_generator = self._role_generator(roles.hint.thinking, "selfplay.sampling.hint.thinking")
        self.screen_generator = self._role_generator(roles.screen.thinking, "selfplay.sampling.screen.thinking")
        # the designer call itself: selfplay.sampling.designer.thinking (the released corpus path: off)
        self.designer_generator = self._role_generator(roles.designer.thinking, "selfplay.sampling.designer.thinking")

    def _role_generator(self, thinking: str, key: str) -> TextGenerator:
        if self.settings.designer_endpoint is not None:
            return self.generator  # the endpoint's own settings (extra_body) decide its thinking
        role_format = role_chat_format(self.tokenizer, self.chat_format, thinking, key)
        if role_format is self.chat_format:
            return self.generator
        return text_generator(self.settings, engine=self.engine, tokenizer=self.tokenizer, chat_format=role_format,
                              stop_token_ids=self.stop_token_ids)

    # ------------------------------------------------------------------ designer set

    def seed_memory(self) -> int:
        """Store the seed examples of ``memory_seed_dir`` that the memory lacks; returns how many."""
        return seed_memory(self.settings, self.memory)

    async def regenerate(self, step: int) -> RegenerationResult:
        s = self.settings
        self._gate_counts = GateCounts(s)
        self.seed_memory()
        active = s.skills.active(s.domain, Step(step).regeneration(s.k))
        skills = slot_skills(active, s.envs_per_set)
        if s.set_generation_timeout_s is None:
            outcomes = await asyncio.gather(*(self.fill_slot(step, slot, skill) for slot, skill in enumerate(skills)))
        else:
            outcomes = await self._bounded_slots(step, skills, s.set_generation_timeout_s)
        result = RegenerationResult()
        for attempts, rejections, admitted in outcomes:
            result.attempts += attempts
            result.rejections += rejections
            if admitted is not None:
                spec, fields = admitted
                result.envs.append(spec)
                if fields is not None:  # an external designer's call has no trajectory
                    result.designer_fields[spec.env_id] = fields
        self.save_set(step, result.envs)
        return result

    async def _bounded_slots(self, step: int, skills: list[Skill], seconds: float) -> list[Any]:
        """``selfplay.set_generation_timeout_s`` (released ``generate_games_async``,
        ``core/orchestrator.py:1459-1472``): every slot's designer attempts and admission together
        within ``seconds``, then the hints; when the bound runs out nothing of the set is kept (the
        released code drops every result) and each slot is counted a ``timeout`` rejection."""
        try:
            designed = await asyncio.wait_for(
                asyncio.gather(*(self.design_slot(step, slot, skill) for slot, skill in enumerate(skills))), seconds)
        except asyncio.TimeoutError:
            message = (f"the set's generation ran past selfplay.set_generation_timeout_s ({seconds:g} s): "
                       "nothing of it is kept")
            return [(0, [Rejection(slot, -1, skill.name, ErrorKind.TIMEOUT, Stage.GENERATE, message)], None)
                    for slot, skill in enumerate(skills)]
        hinted = await asyncio.gather(*(self.hinted_spec(step, slot, skill, found)
                                        for slot, (skill, (_, _, found)) in enumerate(zip(skills, designed))
                                        if found is not None))
        by_slot = iter(hinted)
        return [(attempts, rejections, None if found is None else next(by_slot))
                for attempts, rejections, found in designed]

    async def fill_slot(self, step: int, slot: int, skill: Skill):
        """Up to ``max_attempts`` designer attempts for one slot: ``(attempts made, rejections,
        (EnvSpec, the designer's trajectory or None) | None)``. Also what ``spade pool generate``
        runs, one attempt number per pseudo-step."""
        attempts, rejections, found = await self.design_slot(step, slot, skill)
        return attempts, rejections, None if found is None else await self.hinted_spec(step, slot, skill, found)

    async def design_slot(self, step: int, slot: int, skill: Skill):
        """The designer attempts of :meth:`fill_slot` up to the first admitted candidate:
        ``(attempts made, rejections, (verdict, attempt record, generation) | None)``."""
        s = self.settings
        rejections: list[Rejection] = []
        for attempt in range(s.max_attempts):
            drawn = designer_prompt(s, corpus=self.corpus, memory=self.memory, seed=self.seed, step=step, slot=slot,
                                    attempt=attempt, skill=skill)
            prompt, record = drawn.messages, drawn.record
            sampling = TextSampling.of(s.sampling.designer, derive_seed(self.seed, "designer", step, slot, attempt))
            self.stages.enter(slot, "designing")
            try:
                generated = await self.designer_generator.generate(prompt, sampling)
            except GenerationFailed as exc:
                rejections.append(self._reject(record, exc.kind, Stage.GENERATE, exc.message, ""))
                continue
            response = generated.text
            record["finish_reason"] = generated.finish_reason
            self.stages.enter(slot, "admitting")
            verdict = await self.admit_response(response)
            if verdict is None:
                rejections.append(self._reject(record, ErrorKind.CRASHED, Stage.SERVICE,
                                               "the sandbox failed on every try (infrastructure)", response))
                continue
            if not verdict.admitted:
                assert verdict.error is not None
                rejections.append(self._reject(record, verdict.error.kind, verdict.error.stage,
                                               verdict.error.message, response))
                self._gate_counts.note(verdict)
                continue
            return attempt + 1, rejections, (verdict, record, generated)
        self.stages.leave(slot)
        return s.max_attempts, rejections, None

    async def hinted_spec(self, step: int, slot: int, skill: Skill, found: Any) -> tuple[EnvSpec, Trajectory | None]:
        """The hint call for an admitted candidate of :meth:`design_slot`, and its :class:`EnvSpec`."""
        verdict, record, generated = found
        self.stages.enter(slot, "hinting")
        hint = await self.make_hint(verdict.code, step, slot)
        self.stages.leave(slot)
        spec = EnvSpec(env_id=env_id_for(step, slot), slot=slot, skill=skill.name, source=verdict.code, hint=hint,
                       class_name=verdict.class_name or "", max_turns=verdict.max_turns, generated_step=step,
                       document=record["document"], attempts=record["attempt"] + 1, tool_report=tool_report_of(verdict))
        return spec, generated.trajectory

    async def admit_response(self, response: str) -> AdmissionVerdict | None:
        """The admission verdict; None when the sandbox failed on every try (not the candidate's fault)."""
        tool_use = self.settings.domain == "tool_use"
        return await admit_candidate(self.sandbox, self.settings, response,
                                     screen=self.model_screen if tool_use else None, run_seed=self.seed)

    def _reject(self, record: dict[str, Any], kind: ErrorKind, stage: Stage, message: str, response: str) -> Rejection:
        return write_rejection(self.run_dir, record, kind, stage, message, response)

    async def model_screen(self, source: str, tools: list[dict[str, Any]]) -> bool | None:
        """SPEC 3.6: the policy judges whether every criterion can be met with the tools (hint
        ``selfplay.sampling.screen``: the hint's temperature and timeout by default); None (no verdict) when
        the prompt does not fit, the call times out or the reply names no verdict: admission counts
        that as accept."""
        s = self.settings
        sampling = TextSampling.of(s.sampling.screen, derive_seed(self.seed, "screen", source))
        try:
            generated = await self.screen_generator.generate(screen_messages(source, json.dumps(tools)), sampling)
        except GenerationFailed:
            return None
        return parse_screen_verdict(generated.text)

    async def make_hint(self, source: str, step: int, slot: int) -> str:
        """Up to ``hint_attempts`` hint calls (``selfplay.sampling.hint``) on the admitted
        source, until one returns a non-empty reply; "" when every call fails, times out or replies
        with nothing (the environment is then hintless: ``rewards.failed_hint``). The first call's
        seed is the one a single call has always had; later calls derive their own. The released
        code's 3 tries wait 1, 2, 4 s between calls (``core/hint_generator.py:265-287``); spade does
        not wait (a wait changes no sample)."""
        s = self.settings
        messages = tool_hint_messages(source) if s.domain == "tool_use" else hint_messages(source, s.hint_length)
        for attempt in range(s.hint_attempts):
            seed = derive_seed(self.seed, "hint", step, slot, *((attempt,) if attempt else ()))
            sampling = TextSampling.of(s.sampling.hint, seed)
            try:
                generated = await self.hint_generator.generate(messages, sampling)
            except GenerationFailed:
                continue
            if generated.text:  # the released code retries an empty reply too
                # hint_max_chars null: no cap (the token budget binds)
                return clean_hint(generated.text, s.hint_max_chars or len(generated.text))
        return ""

    # ------------------------------------------------------------------ disk

    def save_set(self, step: int, envs: list[EnvSpec]) -> None:
        save_set(self.run_dir, step, envs)

    # ------------------------------------------------------------------ EnvSource

    async def next_set(self, step: int) -> RegenerationResult:
        return await self.regenerate(step)

    def metrics(self) -> dict[str, float]:
        """After a regeneration, once: its ``degenerate_win`` rejections per probe family and its
        ``unwinnable`` rejections (issue 40); {} at the other steps."""
        counts, self._gate_counts = self._gate_counts, GateCounts(None)
        return counts.metrics()

    def observe(self, step: int, envs: list[EnvSpec], nohint_returns: dict[str, list[float]]) -> None:
        """The designer's feedback goes through the delay buffer, not through the source."""

    def play_sandbox(self) -> Sandbox | None:
        return None

    def state_dict(self) -> dict[str, Any]:
        return {}  # every draw is derived from (seed, step, slot, attempt)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


async def admit_candidate(sandbox: Sandbox, settings: SelfPlaySettings, response: str, *,
                          screen: Any = None, run_seed: int = 0) -> AdmissionVerdict | None:
    """Run admission on one designer response (or environment file), retrying an infrastructure
    failure up to ``plays.max_retries`` times; None when the sandbox failed on every try. The
    probes' seeds are drawn from ``run_seed`` (run.seed) and the candidate's code."""
    probes = settings.admission_probe_settings()
    if probes is not None:
        probes = replace(probes, seed_base=run_seed)
    for _ in range(settings.plays.max_retries + 1):
        try:
            return await asyncio.wait_for(
                admit(sandbox, response, max_turns=settings.max_turns,
                      require_tool_env=settings.domain == "tool_use",
                      tool_settings=settings.admission.tool_settings(), screen=screen,
                      determinism=settings.admission.checks_determinism,
                      probes=probes, reference=settings.admission_reference_settings(),
                      code_extraction=settings.code_extraction, smoke_test=settings.admission.smoke_test,
                      winnability=settings.admission_winnability_settings()),
                settings.admission.timeout_s)
        except (InfrastructureFault, asyncio.TimeoutError):
            continue
    return None


def write_rejection(run_dir: Path, record: dict[str, Any], kind: ErrorKind, stage: Stage, message: str,
                    response: str) -> Rejection:
    """Write ``rejected/step_S/slot{i}_attempt{j}.json`` and return the rejection."""
    directory = step_dir(run_dir, "rejected", record["step"])
    directory.mkdir(parents=True, exist_ok=True)
    data = {**record, "reason": {"kind": kind.value, "stage": stage.value, "message": message}, "response": response}
    path = directory / f"slot{record['slot']}_attempt{record['attempt']}.json"
    path.write_text(json.dumps(data, indent=1))
    return Rejection(record["slot"], record["attempt"], record["skill"], kind, stage, message)


def save_set(run_dir: Path, step: int, envs: list[EnvSpec]) -> None:
    """Write the set of ``step`` as ``envs/step_S/ENV_ID.py``, ``.hint.txt`` and ``.json``."""
    directory = step_dir(run_dir, "envs", step)
    directory.mkdir(parents=True, exist_ok=True)
    for env in envs:
        (directory / f"{env.env_id}.py").write_text(env.source)
        (directory / f"{env.env_id}{HINT_SUFFIX}").write_text(env.hint)
        meta = {k: v for k, v in env.to_json().items() if k not in ("source", "hint")}
        (directory / f"{env.env_id}.json").write_text(json.dumps(meta, indent=1))


@dataclass(frozen=True)
class SavedEnv:
    """One environment of a run's saved sets (what :func:`save_set` wrote): ``meta`` is its
    ``ENV_ID.json`` (skill, class name, document, generated step, ...)."""

    step: int
    env_id: str
    source: str
    hint: str
    meta: dict[str, Any]


def read_saved_sets(run_dir: Path) -> Iterator[SavedEnv]:
    """The environments under ``run_dir/envs/step_S/``, by step, then by id. An environment that a
    live run is still writing (no source yet, or metadata not yet whole: save_set writes it last)
    is left out."""
    steps = sorted((int(found.group(1)), directory) for directory in (Path(run_dir) / "envs").glob("step_*")
                   if directory.is_dir() and (found := re.fullmatch(r"step_(\d+)", directory.name)))
    for step, directory in steps:
        for meta_path in sorted(directory.glob("*.json"), key=lambda path: path.stem):
            env_id = meta_path.stem
            source_path = directory / f"{env_id}.py"
            if not source_path.is_file():
                continue
            try:
                meta = json.loads(meta_path.read_text(encoding="utf-8"))
            except ValueError:
                continue
            if not isinstance(meta, dict):
                continue
            hint_path = directory / f"{env_id}{HINT_SUFFIX}"
            yield SavedEnv(step, env_id, source_path.read_text(encoding="utf-8"),
                           hint_path.read_text(encoding="utf-8").strip() if hint_path.is_file() else "", meta)
