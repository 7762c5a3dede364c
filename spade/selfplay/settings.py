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

from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Literal, Sequence

from ..config import require
from ..agent.actions import ACTION_EXTRACTIONS
from ..agent.prompts import GAME_PROMPTS
from ..designer.extract import CODE_EXTRACTIONS
from ..designer.prompts import DESIGNER_RULES, DIFFICULTIES, HINT_LENGTHS, PROMPT_ORDERS
from ..designer.skills import DOMAINS, Domain, SkillSettings
from ..envs.degenerate_probes import DEFAULT_MAX_STEPS, DEFAULT_SEED_COUNT, DEFAULT_THRESHOLD, ProbeSettings
from ..envs.reference_policy import DEFAULT_MIN_RETURN, ReferenceSettings
from ..envs.winnability import UNPROVEN_RULES, WinnabilitySettings
from ..envs.tool_use.admission import ToolAdmissionSettings
from ..rollout.engine import SamplingParams
from .sampling_settings import MOVED_SAMPLING_KEYS, RoleSampling, SamplingSettings
from .sources.endpoint import EndpointSettings
from .rewards.reward_settings import RewardSettings
from .plays.partial_rollout_settings import PartialRolloutSettings
from .batch_rules import BatchRules
from .plays.play_rules import PlayRules
from .sources.pool_settings import PoolSettings
from .sources.rlve_settings import RLVESettings
from .sources.spice_settings import SpiceSettings, check_spice_selfplay
from .sources.spiral_settings import SpiralSettings

Difficulty = Literal["easy", "medium", "hard"]
EnvSourceName = Literal["designer", "fixed_pool", "rlve", "spice", "spiral"]
ENV_SOURCES: tuple[str, ...] = ("designer", "fixed_pool", "rlve", "spice", "spiral")
AGENT_SAMPLE_FORMS: tuple[str, ...] = ("sequence", "per_turn")
SMOKE_TESTS: tuple[str, ...] = ("paper", "released")

_WHERE = "selfplay"
__all__ = ["RoleSampling", "SamplingSettings", "SelfPlaySettings"]


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

    # The flat sampling keys of older spades (designer_temperature, agent_max_tokens, top_p, ...):
    # each still loads, at its place in ``sampling`` (spade.selfplay.sampling_settings).
    MOVED_KEYS: ClassVar[dict[str, Any]] = MOVED_SAMPLING_KEYS

    domain: Domain = "games"
    k: int = 4                       # regeneration interval (tool use: 8)
    envs_per_set: int = 24           # B
    g_nohint: int = 16               # no-hint plays per env per step (paper code: 8; see module doc)
    g_hint: int = 16                 # hinted plays per env, regeneration step only (never trained)
    max_attempts: int = 5            # designer attempts per slot
    # How each role samples: temperature, top_p, top_k, max_tokens, timeout_s and thinking of the
    # designer, agent, hint and tool-use screen calls (spade.selfplay.sampling_settings)
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    max_turns: int = 25               # an environment's own smaller max_turns wins
    max_context_tokens: int = 32768   # agent episodes; also caps designer and hint calls
    difficulty: Difficulty = "medium"
    max_concurrent_episodes: int = 64
    max_play_retries: int = 3         # retries of a play (or an admission) after an InfrastructureFault
    admission_timeout_s: float = 60.0  # validation of one candidate
    # A bound on the designer attempts and admission of a whole set (null: none); the released code
    # gives them 900 s together and keeps nothing of a set that runs over (core/orchestrator.py:1459-1472)
    set_generation_timeout_s: float | None = None
    # Hint calls per admitted environment before it counts as hintless (a failed or empty reply
    # tries again): 1 (spade), 3 (the released code, core/hint_generator.py:265-287)
    hint_attempts: int = 1
    # A cap on the hint's characters after cleaning; None (the released code: the parsed reply is
    # kept whole, core/hint_generator.py) lets the token budget sampling.hint.max_tokens bind alone.
    hint_max_chars: int | None = None
    # What a no-hint play becomes for training (spade.selfplay.plays.turn_samples): "sequence" (one
    # token-exact sample per episode, every turn's reasoning kept) or "per_turn" (the released 8B
    # thinking actor: each turn's prompt is the template's rendering of the messages so far, earlier
    # reasoning dropped, one sample per turn, each with the episode's advantage). Games only.
    agent_sample_form: Literal["sequence", "per_turn"] = "sequence"
    # Admission's determinism stage (two resets with one seed give one first observation): this
    # project's addition to the paper's checks (SPEC 3.5). false leaves it out (admission_paper_exact:
    # every addition out).
    admission_determinism: bool = True
    # Admission's degenerate-policy probes (spade.envs.degenerate_probes; games only): cheap policies
    # that know nothing of the game (constant replies, the first observation's numbers and words,
    # random short replies) play it on three seeds; one whose mean return reaches
    # degenerate_threshold rejects it (degenerate_win). spade's addition, on in every recipe;
    # degenerate_probe_steps caps the step calls all probes of one candidate make.
    admission_probes: bool = True
    degenerate_threshold: float = DEFAULT_THRESHOLD
    degenerate_probe_steps: int = DEFAULT_MAX_STEPS
    # seeds per round of the probes, drawn per candidate from run.seed and its code (issue 40)
    degenerate_probe_seeds: int = DEFAULT_SEED_COUNT
    # Winnability (spade.envs.winnability; games only, issue 40): the actions solution() returns and
    # an optional reference_policy() are played on the probes' seeds; when something was offered and
    # nothing reaches reference_min_return the game is rejected (unwinnable). winnability_unproven:
    # what a game whose designer offered only a description gets (admit | reject). spade's addition,
    # off here and in the paper recipes, on in spade's GPU recipes.
    winnability_gate: bool = False
    winnability_unproven: Literal["admit", "reject"] = "admit"
    # Optional winnability proof (spade.envs.reference_policy; games designed in the run only): the
    # designer prompt asks for a reference_policy(observation) method, and admission plays it on the
    # probes' seeds after the probes; a mean return below reference_min_return rejects the game
    # (reference_lost; no method: reference_missing). spade's addition, off here and in the paper recipes.
    require_reference_policy: bool = False
    reference_min_return: float = DEFAULT_MIN_RETURN
    # true: every admission gate the paper lacks is off (determinism, the probes and the reference
    # policy, whatever their own switches say): the paper's admission exactly, for a reproduction row.
    admission_paper_exact: bool = False
    # Admission's smoke test: "paper" (SPEC 3.4: reset(seed=42), three checked probe actions,
    # reset(seed=123)) or "released" (the released validate_game, spade.envs.released_smoke: the
    # loader's checked actions, then reset() and "1", "2", "test" unchecked, all within 60 s).
    admission_smoke_test: Literal["paper", "released"] = "paper"
    keep_trajectories: int = 4        # episodes kept on disk per arm per env per step (0: returns only)
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
    # engine; max_concurrent_episodes is then per shard. 1 = every play on global rank 0.
    rollout_shards: int = 1
    # Stabilisers (off in the paper's games recipes): leave out the agent samples of an environment
    # whose no-hint returns are all equal (zero advantage, nothing to learn), and give a sample
    # whose episode was cut by the token or turn budget no loss (the paper's tool-use runs did).
    drop_equal_return_groups: bool = False
    refill_equal_groups: int = 0      # extra rounds of g_nohint plays for an all-equal group before it is dropped
    mask_truncated: bool = False
    # Example environments (*.py, optional NAME.json) stored in the memory before the first
    # regeneration, one record per skill, so the first designer prompts carry two worked examples
    # in the memory block (designer.memory.load_seed_records); ignored with use_memory false.
    # None (the paper): the memory starts empty.
    memory_seed_dir: str | None = None
    rewards: RewardSettings = field(default_factory=RewardSettings)
    skills: SkillSettings = field(default_factory=SkillSettings)
    # Tool use: whether the tokens of a malformed tool call carry loss. Default True = masked
    # (mask 0), as the paper's code did: the -0.1 format penalty still reaches the episode's return
    # only through the return rule, and the garbled call itself is not reinforced or punished.
    tool_mask_malformed_calls: bool = True
    tool_admission: ToolAdmissionSettings = field(default_factory=ToolAdmissionSettings)
    # How a step's batch is sized and assembled (spade.selfplay.batch_rules): plays per environment,
    # the cut to the global batch, the release of waiting designer samples at the last step.
    batch: BatchRules = field(default_factory=BatchRules)
    # How plays run where spade and the released code differ (spade.selfplay.plays.play_rules): reset
    # seeds of the two arms, environment faults, the hinted arm's budgets, the tool-use mask scope,
    # the released loader's names for designed games. Defaults: spade's behaviour.
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
                     "max_concurrent_episodes", "memory_capacity", "rollout_shards", "hint_attempts"):
            value = getattr(self, name)
            require(isinstance(value, int) and not isinstance(value, bool) and value >= 1, key(name),
                    f"must be an integer >= 1, got {value!r}")
        require(self.hint_max_chars is None or (isinstance(self.hint_max_chars, int)
                and not isinstance(self.hint_max_chars, bool) and self.hint_max_chars >= 1), key("hint_max_chars"),
                f"must be an integer >= 1 or null (no cap), got {self.hint_max_chars!r}")
        require(isinstance(self.sampling, SamplingSettings), key("sampling"), "must be a sampling section")
        require(isinstance(self.admission_determinism, bool), key("admission_determinism"),
                f"must be true or false, got {self.admission_determinism!r}")
        require(self.admission_smoke_test in SMOKE_TESTS, key("admission_smoke_test"),
                f"{self.admission_smoke_test!r} is not allowed; choose one of: {', '.join(SMOKE_TESTS)}")
        require(isinstance(self.degenerate_probe_seeds, int) and not isinstance(self.degenerate_probe_seeds, bool)
                and 1 <= self.degenerate_probe_seeds <= 64, key("degenerate_probe_seeds"),
                f"must be an integer from 1 to 64, got {self.degenerate_probe_seeds!r}")
        require(self.winnability_unproven in UNPROVEN_RULES, key("winnability_unproven"),
                f"must be one of: {', '.join(UNPROVEN_RULES)}; got {self.winnability_unproven!r}")
        for name in ("admission_probes", "admission_paper_exact", "require_reference_policy", "winnability_gate"):
            require(isinstance(getattr(self, name), bool), key(name),
                    f"must be true or false, got {getattr(self, name)!r}")
        require(isinstance(self.degenerate_threshold, (int, float)) and not isinstance(self.degenerate_threshold, bool)
                and 0.0 < self.degenerate_threshold <= 1.0, key("degenerate_threshold"),
                f"must be a number in (0, 1] (a mean episode return, clipped to [-1, 1]), got {self.degenerate_threshold!r}")
        minimum = self.reference_min_return
        require(isinstance(minimum, (int, float)) and not isinstance(minimum, bool) and 0.0 < minimum <= 1.0,
                key("reference_min_return"),
                f"must be a number in (0, 1] (a mean episode return, clipped to [-1, 1]), got {minimum!r}")
        require(isinstance(self.degenerate_probe_steps, int) and not isinstance(self.degenerate_probe_steps, bool)
                and self.degenerate_probe_steps >= 1, key("degenerate_probe_steps"),
                f"must be an integer >= 1, got {self.degenerate_probe_steps!r}")
        require(isinstance(self.g_hint, int) and not isinstance(self.g_hint, bool) and self.g_hint >= 0,
                key("g_hint"), f"must be an integer >= 0, got {self.g_hint!r}")
        require(isinstance(self.keep_trajectories, int) and not isinstance(self.keep_trajectories, bool)
                and self.keep_trajectories >= 0, key("keep_trajectories"),
                f"must be an integer >= 0, got {self.keep_trajectories!r}")
        require(isinstance(self.refill_equal_groups, int) and not isinstance(self.refill_equal_groups, bool)
                and self.refill_equal_groups >= 0, key("refill_equal_groups"),
                f"must be an integer >= 0, got {self.refill_equal_groups!r}")
        require(self.refill_equal_groups == 0 or self.drop_equal_return_groups, key("refill_equal_groups"),
                "refills only the groups drop_equal_return_groups would drop: switch that on too")
        require(isinstance(self.max_play_retries, int) and self.max_play_retries >= 0, key("max_play_retries"),
                f"must be an integer >= 0, got {self.max_play_retries!r}")
        bound = self.set_generation_timeout_s
        require(bound is None or (isinstance(bound, (int, float)) and not isinstance(bound, bool) and bound > 0),
                key("set_generation_timeout_s"), f"must be a number of seconds > 0 or null (no bound), got {bound!r}")
        require(self.admission_timeout_s > 0, key("admission_timeout_s"), f"must be > 0, got {self.admission_timeout_s}")
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
        require(self.agent_sample_form in AGENT_SAMPLE_FORMS, key("agent_sample_form"),
                f"{self.agent_sample_form!r} is not allowed; choose one of: {', '.join(AGENT_SAMPLE_FORMS)}")
        require(self.agent_sample_form == "sequence" or self.domain == "games", key("agent_sample_form"),
                "per_turn with domain tool_use; allowed: sequence (the released tool-use episodes are one sequence)")
        require(self.agent_sample_form == "sequence" or not self.partial_rollouts.enabled, key("agent_sample_form"),
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
        require(isinstance(self.plays, PlayRules), key("plays"), "must be a plays section")
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

    @property
    def admission_checks_determinism(self) -> bool:
        """The determinism stage runs (its switch on, the paper-exact switch off)."""
        return self.admission_determinism and not self.admission_paper_exact

    def tool_admission_settings(self) -> ToolAdmissionSettings:
        """The tool-use stages' switches; ``admission_paper_exact`` turns the schema gate off too."""
        if self.admission_paper_exact and self.tool_admission.schema_gate:
            return replace(self.tool_admission, schema_gate=False)
        return self.tool_admission

    def admission_probe_settings(self) -> ProbeSettings | None:
        """The degenerate-policy probes' settings, or None when they are off."""
        if self.admission_paper_exact or not self.admission_probes:
            return None
        # a quarter of the candidate's admission time at most: a game with slow steps is judged on the
        # policies played by then instead of timing out of admission
        return ProbeSettings(threshold=float(self.degenerate_threshold), max_steps=self.degenerate_probe_steps,
                             max_seconds=self.admission_timeout_s / 4, seed_count=self.degenerate_probe_seeds)

    def admission_winnability_settings(self) -> WinnabilitySettings | None:
        """The winnability stage's settings (games only), or None when it is off."""
        if not self.winnability_gate or self.admission_paper_exact or self.domain != "games":
            return None
        return WinnabilitySettings(min_return=float(self.reference_min_return), unproven=self.winnability_unproven,
                                   max_steps=self.degenerate_probe_steps, max_seconds=self.admission_timeout_s / 4)

    @property
    def asks_reference_policy(self) -> bool:
        """The games designer prompt asks for a reference_policy() method and admission plays it
        (the switch on, the paper-exact switch off, games the designer writes in this run)."""
        return (self.require_reference_policy and not self.admission_paper_exact and self.domain == "games"
                and self.env_source == "designer")

    def admission_reference_settings(self) -> ReferenceSettings | None:
        """The reference-policy stage's settings (the probes' step and time budgets; no seeds: the
        candidate's own probe seeds), or None when it is off."""
        if not self.asks_reference_policy:
            return None
        return ReferenceSettings(min_return=float(self.reference_min_return), seeds=(),
                                 max_steps=self.degenerate_probe_steps, max_seconds=self.admission_timeout_s / 4)
