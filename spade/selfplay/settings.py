"""Every number of the self-play step (SPEC sections 1, 2), with the SPEC defaults.

``SelfPlaySettings`` is a frozen dataclass loadable with :func:`spade.config.from_mapping` (the
nested ``rewards`` and ``skills`` sections too); ``__post_init__`` rejects out-of-range values with
a :class:`~spade.config.ConfigError` that names the key (``selfplay.<field>``).

No-hint plays per environment per step (``g_nohint``). The paper's text says 16; its released code
played 8 (global batch 192 / 24 environments). This project defaults to 16. The cost is linear:
every step plays ``envs_per_set * g_nohint`` trained episodes (24 x 16 = 384 instead of 192), so
rollout time, the number of agent samples in the Megatron update, and the activation / log-prob
memory of that update all double relative to the paper's code (each sample is up to
``max_context_tokens`` = 32,768 tokens). Set ``g_nohint: 8`` to reproduce the paper's code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Sequence

from ..config import require
from ..agent.actions import ACTION_EXTRACTIONS
from ..agent.prompts import GAME_PROMPTS
from ..designer.extract import CODE_EXTRACTIONS
from ..designer.prompts import DESIGNER_RULES, DIFFICULTIES, HINT_LENGTHS, PROMPT_ORDERS
from ..designer.skills import DOMAINS, Domain, SkillSettings
from ..envs.degenerate_probes import ProbeSettings
from ..envs.reference_policy import ReferenceSettings
from ..envs.winnability import WinnabilitySettings
from ..rollout.engine import SamplingParams
from .admission_settings import MOVED_ADMISSION_KEYS, AdmissionSettings
from .sampling_settings import MOVED_SAMPLING_KEYS, RoleSampling, SamplingSettings
from .sources.endpoint import EndpointSettings
from .rewards.reward_settings import RewardSettings
from .plays.partial_rollout_settings import PartialRolloutSettings
from .batch_rules import BatchRules
from .plays.play_rules import MOVED_PLAY_KEYS, PlayRules
from .sources.pool_settings import PoolSettings
from .sources.rlve_settings import RLVESettings
from .sources.spice_settings import SpiceSettings, check_spice_selfplay
from .sources.spiral_settings import SpiralSettings

Difficulty = Literal["easy", "medium", "hard"]
EnvSourceName = Literal["designer", "fixed_pool", "rlve", "spice", "spiral"]
ENV_SOURCES: tuple[str, ...] = ("designer", "fixed_pool", "rlve", "spice", "spiral")

_WHERE = "selfplay"
__all__ = ["AdmissionSettings", "PlayRules", "RoleSampling", "SamplingSettings", "SelfPlaySettings"]


@dataclass(frozen=True)
class SelfPlaySettings:
    """One self-play step (SPEC 1) and its ablation switches.

    Ablations: ``use_corpus=False`` (designer prompts without a document: the paper's concepts
    prompt, or the corpus prompt minus its document, by ``no_corpus_prompt``), ``use_memory=False``
    (no memory block, no memory records), ``train_designer=False`` (frozen designer: designer
    samples are never emitted). Baselines: ``env_source`` ``fixed_pool`` (the environments come
    from ``fixed_env_dir``, see :mod:`spade.selfplay.sources.fixed_pool`) or ``rlve`` (rlve-gym's generators);
    neither makes designer calls or designer samples.
    """

    # The flat keys of older spades: the sampling keys (designer_temperature, agent_max_tokens,
    # top_p, ...), the admission keys (admission_probes, degenerate_threshold, the tool_admission
    # section, ...) and the play keys (max_concurrent_episodes, agent_sample_form, ...): each still
    # loads, at its place in ``sampling``, ``admission`` or ``plays``.
    MOVED_KEYS: ClassVar[dict[str, Any]] = {**MOVED_SAMPLING_KEYS, **MOVED_ADMISSION_KEYS, **MOVED_PLAY_KEYS}

    domain: Domain = "games"
    k: int = 4                       # regeneration interval (tool use: 8)
    envs_per_set: int = 24           # B
    g_nohint: int = 16               # no-hint plays per env per step (paper code: 8; see module doc)
    g_hint: int = 16                 # hinted plays per env, regeneration step only (never trained)
    max_attempts: int = 5            # designer attempts per slot
    # How each role samples: temperature, top_p, top_k, max_tokens, timeout_s and thinking of the
    # designer, agent, hint and tool-use screen calls (spade.selfplay.sampling_settings)
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    # How a candidate environment is admitted: the smoke test, spade's added stages (determinism,
    # degenerate-policy probes, winnability, reference policy) and their numbers
    # (spade.selfplay.admission_settings)
    admission: AdmissionSettings = field(default_factory=AdmissionSettings)
    max_turns: int = 25               # an environment's own smaller max_turns wins
    max_context_tokens: int = 32768   # agent episodes; also caps designer and hint calls
    difficulty: Difficulty = "medium"
    # A bound on the designer attempts and admission of a whole set (null: none); the released code
    # gives them 900 s together and keeps nothing of a set that runs over (core/orchestrator.py:1459-1472)
    set_generation_timeout_s: float | None = None
    # Hint calls per admitted environment before it counts as hintless (a failed or empty reply
    # tries again): 1 (spade), 3 (the released code, core/hint_generator.py:265-287)
    hint_attempts: int = 1
    # A cap on the hint's characters after cleaning; None (the released code: the parsed reply is
    # kept whole, core/hint_generator.py) lets the token budget sampling.hint.max_tokens bind alone.
    hint_max_chars: int | None = None
    memory_capacity: int = 200
    use_corpus: bool = True
    # The games designer prompt when use_corpus is false: "concepts" (the paper's code: example game
    # concepts and a binary win/lose reward, designer.prompts.concepts_designer_messages) or
    # "corpus_without_document" (the corpus prompt with its document section left out). Tool use
    # keeps its own prompt without the document either way.
    no_corpus_prompt: Literal["concepts", "corpus_without_document"] = "concepts"
    # Order of the games designer prompt's sections (designer.prompts.PROMPT_ORDERS): "released" (the
    # paper's code) or "shared_prefix" (same sections, document last: one regeneration's prompts share
    # their long prefix, which the engines compute once).
    designer_prompt_order: Literal["released", "shared_prefix"] = "released"
    # -- prompts and extraction (issue 39): the default is spade's behaviour, the other value the
    # released code's (spade-rl/spade 9b2b813; docs/fidelity.md, "Issue 39: prompts and extraction").
    # The box of an agent reply that is the action (agent.actions.parse_action): "last_box", or
    # "first_flat_box" (the released parser: the first brace-free box, else the last box by depth).
    action_extraction: Literal["last_box", "first_flat_box"] = "last_box"
    # The agent's games opening (agent.prompts.first_user_message): "spade", or "paper" (the
    # appendix's and the released qwen3_game template's layout: task line, "Observation:", the
    # step-by-step request last, the hint inside the observation).
    agent_game_prompt: Literal["spade", "paper"] = "spade"
    # The rules the games designer prompt states (designer.prompts): "spade" (with the ban on
    # observations that state the answer or a formula giving it away, seeded rng, JSON info ...) or
    # "released" (the released items only). The skills' descriptions: selfplay.skills.descriptions.
    designer_prompt_rules: Literal["spade", "released"] = "spade"
    # How the code is taken out of a designer reply (designer.extract.extract_code): "spade" or
    # "released" (the first closed ```python block of the whole reply, repair on the error line only).
    code_extraction: Literal["spade", "released"] = "spade"
    # The games hint prompt's length (designer.prompts.hint_messages): "four_sentences", or
    # "three_sentences" (the released "1-3 sentences (under 100 words)").
    hint_length: Literal["four_sentences", "three_sentences"] = "four_sentences"
    use_memory: bool = True
    train_designer: bool = True
    # The "Fixed ED" ablation: designer, hint and tool-use screen calls go to this external
    # OpenAI-compatible endpoint (spade.selfplay.sources.endpoint); the designer is then not trained.
    designer_endpoint: EndpointSettings | None = None
    # Where the sets come from (spade.selfplay.sources.env_source): the designer (SPADE), a fixed pool of
    # environment files (Fixed-env GRPO) or rlve-gym's generators (Fixed-env RLVE). The baselines
    # have no designer: ``designer_enabled`` is derived from this (an older config's
    # ``designer_enabled: false`` still means the fixed pool).
    env_source: EnvSourceName = "designer"
    designer_enabled: bool = True
    fixed_env_dir: str | None = None
    pool: PoolSettings = field(default_factory=PoolSettings)  # env_source fixed_pool: how sets are drawn
    rlve: RLVESettings = field(default_factory=RLVESettings)  # env_source rlve: its difficulty controller
    spice: SpiceSettings = field(default_factory=SpiceSettings)  # env_source spice: the Challenger's questions
    spiral: SpiralSettings = field(default_factory=SpiralSettings)  # env_source spiral: its games and advantages
    # Partial rollouts (issue 26; spade.selfplay.plays.partial_rollout_settings): off = the synchronous schedule.
    partial_rollouts: PartialRolloutSettings = field(default_factory=PartialRolloutSettings)
    # Rollout shards (issue 26; spade.selfplay.plays.rollout_shards): the no-hint and hinted plays of a
    # step spread over this many processes (one per node), each with its own sandbox service and
    # engine; plays.max_concurrent is then per shard. 1 = every play on global rank 0.
    rollout_shards: int = 1
    # Example environments (*.py, optional NAME.json) stored in the memory before the first
    # regeneration, one record per skill, so the first designer prompts carry two worked examples
    # in the memory block (designer.memory.load_seed_records); ignored with use_memory false.
    # None (the paper): the memory starts empty.
    memory_seed_dir: str | None = None
    rewards: RewardSettings = field(default_factory=RewardSettings)
    skills: SkillSettings = field(default_factory=SkillSettings)
    # How a step's batch is sized and assembled (spade.selfplay.batch_rules): plays per environment,
    # the cut to the global batch, the release of waiting designer samples at the last step.
    batch: BatchRules = field(default_factory=BatchRules)
    # How plays run (spade.selfplay.plays.play_rules): how many at once and how often retried, the
    # trajectories kept, what a play becomes for training, the stabilisers, the tool-use mask; and
    # where spade and the released code differ: reset seeds of the two arms, environment faults, the
    # hinted arm's budgets, the tool-use mask scope, the released loader's names for designed games,
    # play timeouts. Defaults: spade's behaviour.
    plays: PlayRules = field(default_factory=PlayRules)

    def engine_sampling(self, stop_token_ids: Sequence[int], seed: int | None) -> SamplingParams:
        """The engine's sampling of one agent play (``sampling.agent``), stopping at ``stop_token_ids``."""
        agent = self.sampling.agent
        return SamplingParams(temperature=agent.temperature, top_p=agent.top_p, top_k=agent.top_k,
                              max_new_tokens=agent.max_tokens, stop_token_ids=tuple(stop_token_ids), seed=seed)

    def nohint_plays(self, n_envs: int) -> int:
        """No-hint plays per environment of a set of ``n_envs`` (``batch.nohint_plays``)."""
        return self.batch.plays_per_env(self.g_nohint, n_envs)

    def __post_init__(self) -> None:
        def key(name: str) -> str:
            return f"{_WHERE}.{name}"

        require(self.domain in DOMAINS, key("domain"), f"{self.domain!r} is not allowed; choose one of: "
                f"{', '.join(DOMAINS)}")
        for name in ("k", "envs_per_set", "g_nohint", "max_attempts", "max_turns", "max_context_tokens",
                     "memory_capacity", "rollout_shards", "hint_attempts"):
            value = getattr(self, name)
            require(isinstance(value, int) and not isinstance(value, bool) and value >= 1, key(name),
                    f"must be an integer >= 1, got {value!r}")
        require(self.hint_max_chars is None or (isinstance(self.hint_max_chars, int)
                and not isinstance(self.hint_max_chars, bool) and self.hint_max_chars >= 1), key("hint_max_chars"),
                f"must be an integer >= 1 or null (no cap), got {self.hint_max_chars!r}")
        require(isinstance(self.sampling, SamplingSettings), key("sampling"), "must be a sampling section")
        require(isinstance(self.admission, AdmissionSettings), key("admission"), "must be an admission section")
        require(isinstance(self.plays, PlayRules), key("plays"), "must be a plays section")
        require(isinstance(self.g_hint, int) and not isinstance(self.g_hint, bool) and self.g_hint >= 0,
                key("g_hint"), f"must be an integer >= 0, got {self.g_hint!r}")
        bound = self.set_generation_timeout_s
        require(bound is None or (isinstance(bound, (int, float)) and not isinstance(bound, bool) and bound > 0),
                key("set_generation_timeout_s"), f"must be a number of seconds > 0 or null (no bound), got {bound!r}")
        require(self.difficulty in DIFFICULTIES, key("difficulty"),
                f"{self.difficulty!r} is not allowed; choose one of: {', '.join(DIFFICULTIES)}")
        require(self.no_corpus_prompt in ("concepts", "corpus_without_document"), key("no_corpus_prompt"),
                f"{self.no_corpus_prompt!r} is not allowed; choose one of: concepts, corpus_without_document")
        require(self.designer_prompt_order in PROMPT_ORDERS, key("designer_prompt_order"),
                f"{self.designer_prompt_order!r} is not allowed; choose one of: {', '.join(PROMPT_ORDERS)}")
        for name, allowed in (("action_extraction", ACTION_EXTRACTIONS), ("agent_game_prompt", GAME_PROMPTS),
                              ("designer_prompt_rules", DESIGNER_RULES), ("code_extraction", CODE_EXTRACTIONS),
                              ("hint_length", tuple(HINT_LENGTHS))):
            require(getattr(self, name) in allowed, key(name),
                    f"{getattr(self, name)!r} is not allowed; choose one of: {', '.join(allowed)}")
        require(self.plays.sample_form == "sequence" or self.domain == "games", key("plays.sample_form"),
                "per_turn with domain tool_use; allowed: sequence (the released tool-use episodes are one sequence)")
        require(self.plays.sample_form == "sequence" or not self.partial_rollouts.enabled, key("plays.sample_form"),
                "per_turn with partial_rollouts.enabled: true; allowed: sequence with partial rollouts (a carried "
                "play keeps one sequence), or partial_rollouts.enabled: false")
        require(self.env_source in ENV_SOURCES, key("env_source"),
                f"{self.env_source!r} is not allowed; choose one of: {', '.join(ENV_SOURCES)}")
        if self.env_source == "designer" and not self.designer_enabled:
            object.__setattr__(self, "env_source", "fixed_pool")
        # spice: the Challenger is the designer role (its calls are designer samples, it reads the corpus)
        object.__setattr__(self, "designer_enabled", self.env_source in ("designer", "spice"))
        require(self.env_source != "fixed_pool" or bool(self.fixed_env_dir), key("fixed_env_dir"),
                "the fixed-pool baseline (env_source: fixed_pool) needs a directory of environment .py files")
        require(self.memory_seed_dir is None or (isinstance(self.memory_seed_dir, str) and self.memory_seed_dir),
                key("memory_seed_dir"), "must be a directory of example environments or null")
        require(isinstance(self.rewards, RewardSettings), key("rewards"), "must be a rewards section")
        require(isinstance(self.skills, SkillSettings), key("skills"), "must be a skills section")
        require(isinstance(self.batch, BatchRules), key("batch"), "must be a batch section")
        require(not (self.plays.drops_faults and self.partial_rollouts.enabled), key("plays.env_faults"),
                "retry_then_drop with partial_rollouts.enabled: true; allowed: score_zero with partial rollouts "
                "(a carried play cannot be played again from its start), or partial_rollouts.enabled: false")
        require(self.plays.nohint_play_timeout_s is None or not self.partial_rollouts.enabled,
                key("plays.nohint_play_timeout_s"), "a bound with partial_rollouts.enabled: true; allowed: null with "
                "partial rollouts (a carried play runs over several steps), or partial_rollouts.enabled: false")
        require(self.designer_endpoint is None or not self.train_designer, key("train_designer"),
                "must be false with selfplay.designer_endpoint set: an external designer makes no trainable samples")
        require(self.rollout_shards == 1 or not self.partial_rollouts.enabled, key("rollout_shards"),
                f"{self.rollout_shards} shards with partial_rollouts.enabled: true; allowed: 1 with partial "
                "rollouts (their stop signal does not cross processes), or partial_rollouts.enabled: false")
        require(self.rollout_shards == 1 or self.env_source != "rlve", key("rollout_shards"),
                f"{self.rollout_shards} shards with env_source: rlve; allowed: 1 (rlve-gym's environments are "
                "played in the worker processes of rank 0's source)")
        if self.env_source == "spice":
            require(isinstance(self.spice, SpiceSettings), key("spice"), "must be a spice section")
            check_spice_selfplay(self)
        try:
            self.skills.active(self.domain, 0)
        except ValueError as exc:
            require(False, key("skills"), str(exc))

    def admission_probe_settings(self) -> ProbeSettings | None:
        """The degenerate-policy probes' settings, or None when they are off."""
        a = self.admission
        if not a.runs_probes:
            return None
        # a quarter of the candidate's admission time at most: a game with slow steps is judged on the
        # policies played by then instead of timing out of admission
        return ProbeSettings(threshold=float(a.probe_threshold), max_steps=a.probe_steps,
                             max_seconds=a.timeout_s / 4, seed_count=a.probe_seeds)

    def admission_winnability_settings(self) -> WinnabilitySettings | None:
        """The winnability stage's settings (games only), or None when it is off."""
        a = self.admission
        if not a.winnability_gate or a.paper_exact or self.domain != "games":
            return None
        return WinnabilitySettings(min_return=float(a.reference_min_return), unproven=a.winnability_unproven,
                                   max_steps=a.probe_steps, max_seconds=a.timeout_s / 4)

    @property
    def asks_reference_policy(self) -> bool:
        """The games designer prompt asks for a reference_policy() method and admission plays it
        (the switch on, the paper-exact switch off, games the designer writes in this run)."""
        return (self.admission.reference_policy and not self.admission.paper_exact and self.domain == "games"
                and self.env_source == "designer")

    def admission_reference_settings(self) -> ReferenceSettings | None:
        """The reference-policy stage's settings (the probes' step and time budgets; no seeds: the
        candidate's own probe seeds), or None when it is off."""
        if not self.asks_reference_policy:
            return None
        a = self.admission
        return ReferenceSettings(min_return=float(a.reference_min_return), seeds=(),
                                 max_steps=a.probe_steps, max_seconds=a.timeout_s / 4)
