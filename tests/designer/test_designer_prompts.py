"""The games designer and hint prompts: the released code's layout and contract (issue 29), every
demand of SPEC section 5, and their inputs.

Reference: the released ``spade/core/prompts/corpus_template.py`` (document, then the interactive
specification, then skill and difficulty), ``core/orchestrator.py`` (the memory block appended last;
the system message is the short role of ``template.py``) and ``template.py``'s multi-turn prompt for
the no-corpus ablation."""

from __future__ import annotations

import random

import pytest

from spade.designer.prompts import (
    DESIGNER_SYSTEM,
    DIFFICULTIES,
    GAME_SPEC,
    GAME_SPEC_NO_DOCUMENT,
    DesignerRequest,
    clean_hint,
    designer_messages,
    hint_messages,
)
from spade.designer.skills import GAME_SKILLS, Skill
from spade.rollout.engine import GenerationResult, RolloutEngine

SKILL = GAME_SKILLS[0]
MEMORY = "## Environments from your memory\nan example"


class PromptRecorder(RolloutEngine):
    """An engine that records each prompt it is sent and answers with a reply that is not code (the
    candidate is rejected at the syntax stage)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.prompts = []

    @property
    def weight_version(self):
        return 0

    async def generate(self, request):
        self.prompts.append(self.tokenizer.decode(list(request.prompt_ids)))
        ids = self.tokenizer.encode("no code here (", add_special_tokens=False)
        return GenerationResult(ids, [-1.0] * len(ids), "stop", 0)

    async def update_weights(self, named_tensors, version):
        pass

    def close(self):
        pass


def user_of(request: DesignerRequest, **kwargs) -> str:
    messages = designer_messages(request, **kwargs)
    assert [m["role"] for m in messages] == ["system", "user"]
    return messages[1]["content"]


def test_specification_states_the_released_class_contract():
    """solution() and close() in the interface, partial rewards, termination only at the goal, the
    boxed action as a state-changing command, a per-turn reminder of the action syntax."""
    for demand in ("def solution(self)", "def close(self)", "def reset(self, seed=None)", "def step(self, action)",
                   "partial reward", "1.0 is paid only for full success",
                   "`terminated=True` only when the goal is reached", "`truncated=True`",
                   "command that changes the environment", "It is not a final answer to be graded once",
                   "reminds the agent of the reply format", "Reply with your next action as \\boxed{<action>}",
                   "No single action reaches the goal", "Hidden state", "random.Random(seed)",
                   "standard library", "never state the answer", "worked out from the interaction alone",
                   "must end in `Env`", "```python"):
        assert demand in GAME_SPEC, demand
    assert GAME_SPEC_NO_DOCUMENT == GAME_SPEC.replace(GAME_SPEC[GAME_SPEC.index("\n\n## Grounding"):
                                                                GAME_SPEC.index("\n\n## Interface")], "")


def test_system_message_is_the_role_only_and_shared():
    """The released system message names the role; the contract is in the user message."""
    prompts = [designer_messages(DesignerRequest(skill, doc, memory_block=MEMORY, difficulty=level), **kwargs)
               for skill in GAME_SKILLS[:2] for doc in ("one", None) for level in DIFFICULTIES
               for kwargs in ({}, {"no_corpus": "concepts", "rng": random.Random(1)})]
    assert {p[0]["content"] for p in prompts} == {DESIGNER_SYSTEM}
    assert len(DESIGNER_SYSTEM) < 300 and "def solution" not in DESIGNER_SYSTEM


def test_sections_come_in_the_released_order():
    """Document first, then the specification, then skill and difficulty, the memory block last."""
    request = DesignerRequest(SKILL, "Euclid's algorithm finds the gcd.", memory_block=MEMORY, difficulty="hard")
    user = user_of(request)
    positions = [user.index(marker) for marker in (
        "<document>\nEuclid's algorithm finds the gcd.\n</document>", "## How the agent acts", "## Grounding",
        "## Interface", f"Skill to train: {SKILL.name} ({SKILL.description})", "Difficulty: hard",
        "```python block", MEMORY)]
    assert positions == sorted(positions)
    assert user.startswith("You are given a reference document.")
    assert user.endswith(MEMORY)


def test_difficulty_line_is_the_interaction_step_count_without_win_rates():
    assert set(DIFFICULTIES) == {"easy", "medium", "hard"}
    for level, steps in (("easy", 2), ("medium", 3), ("hard", 3)):
        user = user_of(DesignerRequest(SKILL, "doc", difficulty=level))
        assert f"Difficulty: {level}: the goal should need {steps}+ interaction steps." in user
    for text in (*DIFFICULTIES.values(), user_of(DesignerRequest(SKILL, "doc"))):
        assert "%" not in text and "half the time" not in text and "occasionally" not in text


def test_turns_are_the_environments_own_default_not_the_run_budget():
    """The example class defaults to 12 turns (the released example); the run's budget is not
    quoted and no 'won in roughly 4 to N actions' range is given."""
    for budget in (10, 25, 40):
        user = user_of(DesignerRequest(SKILL, "doc", max_turns=budget))
        assert "def __init__(self, max_turns=12, **kwargs):" in user and "self.max_turns = max_turns" in user
        assert "roughly 4 to" not in user and f"{budget} turns" not in user


def test_no_corpus_and_no_memory_leave_their_sections_out():
    user = user_of(DesignerRequest(SKILL, None))
    assert "<document>" not in user and "Memory" not in user and "## Grounding" not in user
    assert GAME_SPEC_NO_DOCUMENT in user


def test_unknown_difficulty_is_refused():
    with pytest.raises(ValueError, match="easy, medium, hard"):
        designer_messages(DesignerRequest(SKILL, "doc", difficulty="extreme"))


def test_hint_prompt_shows_the_source_and_forbids_the_answer():
    messages = hint_messages("class AEnv: pass")
    assert "Never state the secret answer" in messages[0]["content"]
    assert "```python\nclass AEnv: pass\n```" in messages[1]["content"]


def test_clean_hint():
    assert clean_hint("<think>the secret is 7</think>\n  Use   binary\nsearch. ") == "Use binary search."
    assert len(clean_hint("x" * 5000)) == 1000


def test_memory_seeding_puts_exactly_the_seed_examples_in_the_designer_prompt(tmp_path):
    """A designer round with ``memory_seed_dir``: before anything was played, every designer prompt
    carries the memory block with exactly the seed examples as its two positives (and no negative);
    without seeding (the paper's setting) the first prompts have no memory block."""
    import asyncio
    from pathlib import Path

    from chat_templates import bpe_tokenizer
    from spade.designer.memory import Memory, format_memory_block, load_seed_records, memory_path
    from spade.designer.skills import SkillSettings
    from spade.rollout.conversation import ChatFormat
    from spade.selfplay.sources.designer_source import DesignerRound
    from spade.selfplay.settings import SelfPlaySettings

    seed_dir = Path(__file__).resolve().parents[2] / "examples" / "seed_envs"
    examples = sorted(p.read_text() for p in seed_dir.glob("*.py"))
    assert len(examples) == 2
    tokenizer = bpe_tokenizer()

    def prompts_of(seed_dir_setting, run):
        settings = SelfPlaySettings(envs_per_set=2, max_attempts=2, memory_seed_dir=seed_dir_setting,
                                    max_context_tokens=8192, skills=SkillSettings(window=1))
        engine = PromptRecorder(tokenizer)
        with Memory(memory_path(run)) as memory:
            round_ = DesignerRound(settings, sandbox=None, engine=engine, tokenizer=tokenizer,
                                   chat_format=ChatFormat(tokenizer), corpus=None, memory=memory, run_dir=run, seed=1)
            result = asyncio.run(round_.regenerate(0))
            seeded = [r for r in memory.list() if r.metadata.get("seed")]
        assert result.attempts == 4 and not result.envs
        return engine.prompts, seeded

    prompts, seeded = prompts_of(str(seed_dir), tmp_path / "seeded")
    assert len(prompts) == 4 and len(seeded) == 2 * 6  # both examples for each of the six game skills
    for prompt in prompts:
        assert prompt.count("## Environments from your memory") == 1
        assert prompt.count("### Example ") == 2 and "Do not write" not in prompt
        for example in examples:
            assert example.rstrip("\n") in prompt
    # the block is the ordinary memory block of those records
    skill = SkillSettings(window=1).active("games", 0)[0].name
    records = [r for r in load_seed_records(seed_dir, [skill])]
    from spade.designer.memory import MemorySelection

    block = format_memory_block(MemorySelection(skill, positives=tuple(records)))
    reversed_block = format_memory_block(MemorySelection(skill, positives=tuple(reversed(records))))
    assert all(block in p or reversed_block in p for p in prompts)

    unseeded, none = prompts_of(None, tmp_path / "paper")
    assert none == [] and not any("## Environments from your memory" in p for p in unseeded)


# ------------------------------------------------------------------ the no-corpus prompt (issue 15, 29)


def test_concepts_prompt_samples_three_concepts_of_the_skill():
    """The released no-corpus prompt draws 3 of the 4 concepts written for the skill."""
    from spade.designer.prompts import GAME_CONCEPTS, SKILL_CONCEPTS

    assert {s.name for s in GAME_SKILLS} <= set(SKILL_CONCEPTS)
    assert all(len(ideas) == 4 for ideas in SKILL_CONCEPTS.values())
    for skill in GAME_SKILLS:
        seen = set()
        for seed in range(30):
            user = user_of(DesignerRequest(skill, None), no_corpus="concepts", rng=random.Random(seed))
            shown = [idea for idea in SKILL_CONCEPTS[skill.name] if f"- {idea}" in user]
            assert len(shown) == 3, skill.name
            others = [idea for name, ideas in SKILL_CONCEPTS.items() if name != skill.name for idea in ideas]
            assert not any(f"- {idea}" in user for idea in [*others, *GAME_CONCEPTS])
            seen.update(shown)
        assert seen == set(SKILL_CONCEPTS[skill.name])  # every concept of the skill comes up
    again = [user_of(DesignerRequest(SKILL, None), no_corpus="concepts", rng=random.Random(5)) for _ in range(2)]
    assert again[0] == again[1]  # a function of the rng
    custom = Skill("Juggling", "Keep several things going at once.")
    user = user_of(DesignerRequest(custom, None), no_corpus="concepts", rng=random.Random(0))
    assert sum(f"- {idea}" in user for idea in GAME_CONCEPTS) == 3  # another skill: the generic ideas


def test_concepts_prompt_has_a_binary_reward_the_run_budget_and_no_document():
    request = DesignerRequest(SKILL, "a document that must not appear", memory_block=MEMORY, difficulty="easy",
                              max_turns=20)
    user = user_of(request, no_corpus="concepts", rng=random.Random(0))
    assert "Binary reward" in user and "no partial rewards" in user and "Partial rewards:" not in user
    assert "def __init__(self, max_turns=20, **kwargs):" in user  # the released prompt passes the budget
    assert "at most 20 turns" in user and "roughly 10 to 15 turns" in user
    assert "def close(self)" in user and "def solution(self)" not in user  # the released multi-turn interface
    assert "<document>" not in user and "a document that must not appear" not in user
    assert "Difficulty:" not in user  # the released multi-turn prompt has no difficulty line
    assert SKILL.name in user and user.endswith(MEMORY)


def test_corpus_without_document_is_the_corpus_prompt_minus_its_document():
    request = DesignerRequest(SKILL, None, memory_block="## Memory\nm")
    assert designer_messages(request, no_corpus="corpus_without_document") == designer_messages(request)
    user = user_of(request, no_corpus="corpus_without_document")
    assert "<document>" not in user and "## Concept ideas" not in user


def test_unknown_no_corpus_prompt_is_refused():
    with pytest.raises(ValueError, match="selfplay.no_corpus_prompt.*concepts, corpus_without_document"):
        designer_messages(DesignerRequest(SKILL, None), no_corpus="none")


def test_no_corpus_prompt_config_key():
    from spade.config import ConfigError, from_mapping
    from spade.selfplay.settings import SelfPlaySettings

    assert SelfPlaySettings().no_corpus_prompt == "concepts"  # the paper's variant by default
    with pytest.raises(ConfigError, match="selfplay.no_corpus_prompt.*concepts, corpus_without_document"):
        from_mapping(SelfPlaySettings, {"no_corpus_prompt": "empty"}, where="selfplay")


def test_designer_round_builds_the_prompt_the_settings_name(tmp_path):
    """Through a real designer round: with the corpus on, the prompt carries the document and does
    not depend on no_corpus_prompt; with it off, each variant gives its own prompt."""
    import asyncio
    from pathlib import Path

    from chat_templates import bpe_tokenizer
    from spade.designer.corpus import Corpus, CorpusSettings
    from spade.rollout.conversation import ChatFormat
    from spade.selfplay.sources.designer_source import DesignerRound
    from spade.selfplay.settings import SelfPlaySettings

    tokenizer = bpe_tokenizer()
    corpus = Corpus(CorpusSettings(paths=(str(Path(__file__).resolve().parents[2] / "examples" / "corpus"
                                              / "demo.jsonl.gz"),), max_words=50))

    def prompts_of(name, **settings):
        engine = PromptRecorder(tokenizer)
        round_ = DesignerRound(SelfPlaySettings(envs_per_set=1, max_attempts=1, max_context_tokens=8192,
                                                use_memory=False, **settings),
                               sandbox=None, engine=engine, tokenizer=tokenizer, chat_format=ChatFormat(tokenizer),
                               corpus=corpus, memory=None, run_dir=tmp_path / name, seed=3)
        asyncio.run(round_.regenerate(0))
        (prompt,) = engine.prompts
        return prompt

    with_corpus = prompts_of("a", use_corpus=True, no_corpus_prompt="concepts")
    assert with_corpus == prompts_of("b", use_corpus=True, no_corpus_prompt="corpus_without_document")
    assert "<document>" in with_corpus and DESIGNER_SYSTEM in with_corpus and GAME_SPEC in with_corpus
    concepts = prompts_of("c", use_corpus=False)  # the default: the paper's variant
    assert DESIGNER_SYSTEM in concepts and "## Concept ideas for" in concepts and "<document>" not in concepts
    assert concepts == prompts_of("c2", use_corpus=False)  # concepts drawn from the run's seed
    plain = prompts_of("d", use_corpus=False, no_corpus_prompt="corpus_without_document")
    assert DESIGNER_SYSTEM in plain and "<document>" not in plain and "## Concept ideas" not in plain
    assert GAME_SPEC_NO_DOCUMENT in plain and GAME_SPEC not in plain
    # the document opens the user message, right after the shared system message
    assert with_corpus.index(DESIGNER_SYSTEM) < with_corpus.index("<document>") < with_corpus.index(GAME_SPEC)


def test_prompts_of_one_regeneration_share_the_system_message_and_differ_at_the_document():
    """Two slots of a regeneration (same skill and memory, different documents) now differ from the
    document on, which opens the user message: what the engines can share is the system message and
    the sentence before the document (the content order is the released one)."""
    skill = GAME_SKILLS[0]
    a, b = (designer_messages(DesignerRequest(skill=skill, document=doc, memory_block=MEMORY, difficulty="medium"))
            for doc in ("first document", "second document"))
    assert a[0] == b[0]
    text_a, text_b = a[1]["content"], b[1]["content"]
    common = next(i for i, (x, y) in enumerate(zip(text_a, text_b)) if x != y)
    assert text_a[:common].endswith("<document>\n") and "## How the agent acts" not in text_a[:common]
    assert skill.description not in text_a[:common] and MEMORY not in text_a[:common]
    assert text_a[text_a.index("</document>"):] == text_b[text_b.index("</document>"):]


def test_shared_prefix_order_keeps_the_sections_and_moves_the_document_last():
    """``selfplay.designer_prompt_order: shared_prefix``: the released prompt's sections, with the
    document moved behind the specification, the skill and difficulty and the memory block, so two
    slots of a regeneration share everything up to the document; the closing request comes last."""
    skill = GAME_SKILLS[0]
    released = user_of(DesignerRequest(skill, "first document", memory_block=MEMORY, difficulty="medium"))
    a, b = (user_of(DesignerRequest(skill, doc, memory_block=MEMORY, difficulty="medium"), order="shared_prefix")
            for doc in ("first document", "second document"))
    for section in (GAME_SPEC, f"Skill to train: {skill.name}", MEMORY, "<document>\nfirst document\n</document>",
                    "Write the complete module in one ```python block."):
        assert section in released and section in a, section
    positions = [a.index(m) for m in ("## How the agent acts", "Difficulty: medium", MEMORY, "<document>",
                                      "```python block.")]
    assert positions == sorted(positions)
    common = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    assert a[:common].endswith("<document>\n") and MEMORY in a[:common] and GAME_SPEC in a[:common]
    assert a.endswith("Write the complete module in one ```python block.")
    with pytest.raises(ValueError, match="designer_prompt_order.*released, shared_prefix"):
        designer_messages(DesignerRequest(skill, "d"), order="document_first")


def test_designer_prompt_order_config_key():
    from spade.config import ConfigError, from_mapping
    from spade.selfplay.settings import SelfPlaySettings

    assert SelfPlaySettings().designer_prompt_order == "released"
    with pytest.raises(ConfigError, match="selfplay.designer_prompt_order.*released, shared_prefix"):
        from_mapping(SelfPlaySettings, {"designer_prompt_order": "sorted"}, where="selfplay")


# -- selfplay.designer_prompt_rules and selfplay.hint_length (issue 39) -----------------------------

SPADE_ONLY_RULES = ("a formula that gives it away", "random.Random(seed)", "JSON-serialisable", "no `input()`",
                    "uses up the turn")


def sections(text: str) -> list[str]:
    return [line for line in text.split("\n") if line.startswith("## ")]


def test_designer_prompt_rules_spade_is_the_default_and_unchanged():
    request = DesignerRequest(SKILL, "DOC")
    assert designer_messages(request) == designer_messages(DesignerRequest(SKILL, "DOC", rules="spade"))
    assert GAME_SPEC in user_of(request)
    for rule in SPADE_ONLY_RULES:
        assert rule in user_of(request)


@pytest.mark.parametrize("document", ["DOC", None])
def test_released_rules_state_the_released_items_only(document):
    spade_text = user_of(DesignerRequest(SKILL, document))
    released = user_of(DesignerRequest(SKILL, document, rules="released"))
    for rule in SPADE_ONLY_RULES:
        assert rule not in released
    assert "formula" not in released  # nothing forbids revealing the governing formula
    assert sections(released) == sections(spade_text)  # the same sections, in the same order
    for kept in ("## How the agent acts", "## Do not", "## Check before you answer"):
        block = spade_text.split(kept, 1)[1].split("\n## ", 1)[0]
        assert block in released  # the sections whose items are the released ones are shared word for word
    for item in ("total reward stays within [0, 1]", "never call a name you did not import", "randomised by the seed",
                 "# never the solution", "never `self.solution`", "a helpful observation and reward 0.0",
                 "Partial reward for progress toward the goal; `terminated=True` only when the goal is reached."):
        assert item in released
    assert ("## Grounding" in released) == (document is not None)


def test_released_rules_in_the_concepts_prompt():
    request = DesignerRequest(SKILL, None, rules="released")
    released = user_of(request, no_corpus="concepts", rng=random.Random(3))
    spade_text = user_of(DesignerRequest(SKILL, None), no_corpus="concepts", rng=random.Random(3))
    assert "formula" in spade_text and "formula" not in released
    for item in ("Never call `input()`", "the player's whole reply", "No backslash inside an f-string expression",
                 "show the valid actions instead"):
        assert item in released and item not in spade_text
    assert sections(released) == sections(spade_text)


def test_unknown_designer_prompt_rules_are_refused():
    with pytest.raises(ValueError, match="selfplay.designer_prompt_rules: 'paper'.*spade, released"):
        designer_messages(DesignerRequest(SKILL, "DOC", rules="paper"))


def test_hint_length_both_values():
    default = hint_messages("class AEnv: pass")
    assert default == hint_messages("class AEnv: pass", "four_sentences")
    assert "Write a short hint (at most four sentences) that" in default[0]["content"]
    released = hint_messages("class AEnv: pass", "three_sentences")
    assert "Write a short hint (one to three sentences, fewer than 100 words) that" in released[0]["content"]
    assert released[1] == default[1]
    assert released[0]["content"].replace("one to three sentences, fewer than 100 words", "at most four sentences") \
        == default[0]["content"]
    with pytest.raises(ValueError, match="selfplay.hint_length: 'short'.*four_sentences, three_sentences"):
        hint_messages("x", "short")


def test_prompt_keys_reach_the_designer_prompt_and_are_validated():
    from spade.config import ConfigError, from_mapping
    from spade.selfplay.sources.designer_source import designer_prompt
    from spade.selfplay.settings import SelfPlaySettings

    defaults = SelfPlaySettings()
    assert (defaults.designer_prompt_rules, defaults.hint_length, defaults.skills.descriptions) == (
        "spade", "four_sentences", "spade")
    released = from_mapping(SelfPlaySettings, {"designer_prompt_rules": "released", "use_corpus": False,
                                               "no_corpus_prompt": "corpus_without_document",
                                               "skills": {"descriptions": "released"}}, where="selfplay")
    drawn = designer_prompt(released, corpus=None, memory=None, seed=0, step=0, slot=0, attempt=0,
                            skill=released.skills.active("games", 0)[0])
    user = drawn.messages[1]["content"]
    assert "formula" not in user and "Reward scale" in user
    assert "Skill to train: Mathematical Reasoning (Working out mathematical problems and equations). Difficulty:" in user
    for name, value in (("designer_prompt_rules", "paper"), ("hint_length", "long")):
        with pytest.raises(ConfigError, match=f"selfplay.{name}: '{value}' is not allowed; choose one of"):
            from_mapping(SelfPlaySettings, {name: value}, where="selfplay")
