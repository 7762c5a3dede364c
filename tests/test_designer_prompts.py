"""Designer and hint prompts carry every demand of SPEC section 5 and their inputs."""

from __future__ import annotations

import pytest

from spade.designer.prompts import DesignerRequest, clean_hint, designer_messages, hint_messages
from spade.designer.skills import GAME_SKILLS

SKILL = GAME_SKILLS[0]


def test_system_prompt_states_every_demand():
    system = designer_messages(DesignerRequest(SKILL, "doc"))[0]["content"]
    for demand in ("hidden state", "several turns", "random.Random(seed)", "standard library",
                   "[0, 1]", "1.0 only for full", "never the answer", "derivable from the interaction",
                   "ending in `Env`", "reset(self, seed=None)", "\\boxed{...}", "```python"):
        assert demand in system, demand


def test_user_prompt_includes_skill_document_memory_and_difficulty():
    request = DesignerRequest(SKILL, "Euclid's algorithm finds the gcd.", memory_block="## Memory\nan example",
                              difficulty="hard", max_turns=12)
    user = designer_messages(request)[1]["content"]
    assert SKILL.name in user and SKILL.description in user
    assert "<document>\nEuclid's algorithm finds the gcd.\n</document>" in user
    assert "## Memory\nan example" in user
    assert "occasionally" in user and "12 turns" in user


def test_no_corpus_and_no_memory_leave_their_sections_out():
    user = designer_messages(DesignerRequest(SKILL, None))[1]["content"]
    assert "<document>" not in user and "Memory" not in user


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
    from spade.rollout.engine import GenerationResult, RolloutEngine
    from spade.selfplay.designer_round import DesignerRound
    from spade.selfplay.settings import SelfPlaySettings

    seed_dir = Path(__file__).resolve().parent.parent / "examples" / "seed_envs"
    examples = sorted(p.read_text() for p in seed_dir.glob("*.py"))
    assert len(examples) == 2
    tokenizer = bpe_tokenizer()

    class Recorder(RolloutEngine):
        def __init__(self):
            self.prompts = []

        @property
        def weight_version(self):
            return 0

        async def generate(self, request):
            self.prompts.append(tokenizer.decode(list(request.prompt_ids)))
            ids = tokenizer.encode("no code here (", add_special_tokens=False)
            return GenerationResult(ids, [-1.0] * len(ids), "stop", 0)  # rejected at the syntax stage

        async def update_weights(self, named_tensors, version):
            pass

        def close(self):
            pass

    def prompts_of(seed_dir_setting, run):
        settings = SelfPlaySettings(envs_per_set=2, max_attempts=2, memory_seed_dir=seed_dir_setting,
                                    max_context_tokens=8192, skills=SkillSettings(window=1))
        engine = Recorder()
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
        assert prompt.count("### Well-calibrated example") == 2 and "Example to avoid" not in prompt
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


# ------------------------------------------------------------------ the no-corpus prompt (issue 15)


def test_concepts_prompt_has_concepts_and_a_binary_reward_and_no_document():
    from spade.designer.prompts import CONCEPTS_DESIGNER_SYSTEM, DESIGNER_SYSTEM, GAME_CONCEPTS

    request = DesignerRequest(SKILL, "a document that must not appear", memory_block="## Memory\nan example",
                              difficulty="easy", max_turns=10)
    system, user = (m["content"] for m in designer_messages(request, no_corpus="concepts"))
    assert system == CONCEPTS_DESIGNER_SYSTEM != DESIGNER_SYSTEM
    # the same contract, except the reward: binary instead of partial
    assert "binary win/lose reward" in system and "partial rewards for real progress" not in system
    assert "partial rewards for real progress" in DESIGNER_SYSTEM
    for demand in ("hidden state", "random.Random(seed)", "standard library", "ending in `Env`", "```python"):
        assert demand in system, demand
    assert "## Example concepts" in user and all(f"- {concept}" in user for concept in GAME_CONCEPTS)
    assert len(GAME_CONCEPTS) >= 5
    assert "<document>" not in user and "a document that must not appear" not in user
    assert SKILL.name in user and "## Memory\nan example" in user and "10 turns" in user
    assert "1.0 when the agent wins, 0.0 otherwise" in user


def test_corpus_without_document_is_the_corpus_prompt_minus_its_document():
    request = DesignerRequest(SKILL, None, memory_block="## Memory\nm")
    assert designer_messages(request, no_corpus="corpus_without_document") == designer_messages(request)
    user = designer_messages(request, no_corpus="corpus_without_document")[1]["content"]
    assert "<document>" not in user and "## Example concepts" not in user


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
    from spade.designer.prompts import CONCEPTS_DESIGNER_SYSTEM, DESIGNER_SYSTEM
    from spade.rollout.conversation import ChatFormat
    from spade.rollout.engine import GenerationResult, RolloutEngine
    from spade.selfplay.designer_round import DesignerRound
    from spade.selfplay.settings import SelfPlaySettings

    tokenizer = bpe_tokenizer()
    corpus = Corpus(CorpusSettings(paths=(str(Path(__file__).resolve().parent.parent / "examples" / "corpus"
                                              / "demo.jsonl.gz"),), max_words=50))

    class Recorder(RolloutEngine):
        def __init__(self):
            self.prompts = []

        @property
        def weight_version(self):
            return 0

        async def generate(self, request):
            self.prompts.append(tokenizer.decode(list(request.prompt_ids)))
            ids = tokenizer.encode("no code here (", add_special_tokens=False)
            return GenerationResult(ids, [-1.0] * len(ids), "stop", 0)  # rejected at the syntax stage

        async def update_weights(self, named_tensors, version):
            pass

        def close(self):
            pass

    def prompts_of(name, **settings):
        engine = Recorder()
        round_ = DesignerRound(SelfPlaySettings(envs_per_set=1, max_attempts=1, max_context_tokens=8192,
                                                use_memory=False, **settings),
                               sandbox=None, engine=engine, tokenizer=tokenizer, chat_format=ChatFormat(tokenizer),
                               corpus=corpus, memory=None, run_dir=tmp_path / name, seed=3)
        asyncio.run(round_.regenerate(0))
        (prompt,) = engine.prompts
        return prompt

    with_corpus = prompts_of("a", use_corpus=True, no_corpus_prompt="concepts")
    assert with_corpus == prompts_of("b", use_corpus=True, no_corpus_prompt="corpus_without_document")
    assert "<document>" in with_corpus and DESIGNER_SYSTEM in with_corpus
    concepts = prompts_of("c", use_corpus=False)  # the default: the paper's variant
    assert CONCEPTS_DESIGNER_SYSTEM in concepts and "## Example concepts" in concepts and "<document>" not in concepts
    plain = prompts_of("d", use_corpus=False, no_corpus_prompt="corpus_without_document")
    assert DESIGNER_SYSTEM in plain and "<document>" not in plain and "## Example concepts" not in plain
    # corpus_without_document is the corpus prompt with its document section cut out
    start, end = with_corpus.index("## Source document"), with_corpus.index("</document>") + len("</document>\n\n")
    assert with_corpus[:start] + with_corpus[end:] == plain


def test_prompts_of_one_regeneration_differ_only_at_their_end():
    """The document comes after the instructions, skill, memory block and difficulty: two slots of
    a regeneration (same skill and memory, different documents) share all but the last part."""
    skill = GAME_SKILLS[0]
    a, b = (designer_messages(DesignerRequest(skill=skill, document=doc, memory_block="## Environments from your "
                                              "memory\nexample code", difficulty="medium", max_turns=10))
            for doc in ("first document", "second document"))
    text_a, text_b = a[1]["content"], b[1]["content"]
    common = next(i for i, (x, y) in enumerate(zip(text_a, text_b)) if x != y)
    assert text_a[:common].endswith("<document>\n") and "## Difficulty" in text_a[:common]
    assert "example code" in text_a[:common] and a[0] == b[0]
