"""Each scorer and extractor against hand-computed cases, the Reasoning-Gym defects included."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest

from spade.eval import extract
from spade.eval.aime import AIME, math_equal
from spade.eval.gpqa import GPQADiamond, shuffled_options
from spade.eval.reasoning_gym_bench import ReasoningGymHard, hard_settings, score_rg_answer, tasks_of
from spade.eval.types import BenchmarkUnavailable, SamplingSettings

from pathlib import Path

FIXTURES = Path(__file__).parents[1] / "fixtures" / "eval"


def test_last_boxed_balances_braces():
    assert extract.last_boxed(r"so \boxed{\frac{1}{2}} and \boxed{3}") == "3"
    assert extract.last_boxed(r"\boxed{\frac{1}{2}}") == r"\frac{1}{2}"
    assert extract.last_boxed(r"\boxed{unclosed") is None
    assert extract.last_boxed(r"\boxed{1} then \boxed{unclosed") is None  # an earlier box does not stand in
    assert extract.last_boxed("nothing") is None


def test_boxed_choice():
    assert extract.boxed_choice(r"I think \boxed{C}") == "C"
    assert extract.boxed_choice(r"\boxed{\text{B}}") == "B"
    assert extract.boxed_choice("The answer is (D).") is None  # prose never counts
    assert extract.boxed_choice(r"\boxed{E}") is None
    assert extract.boxed_choice("Answer: Because") is None


@pytest.mark.parametrize("gold,answer,expected", [
    ("204", "204", True), ("204", r"\frac{408}{2}", True), ("204", "205", False),
    ("8", "8.0", True), ("42", None, False), ("42", "banana", False),
])
def test_math_verify_equivalence(gold, answer, expected):
    assert math_equal(gold, answer) is expected


def test_aime_fixture_items_and_scoring():
    bench = AIME(2025, data_dir=FIXTURES, sampling=SamplingSettings(n=2))
    items = bench.load(seed=0)
    assert [i.item_id for i in items] == ["fx-1", "fx-2", "fx-3"]
    assert "\\boxed{}" in items[0].messages[0]["content"]
    good = asyncio.run(bench.score(items[0], r"17+25 = \boxed{42}"))
    bad = asyncio.run(bench.score(items[0], "42 without a box"))
    assert (good.correct, good.answer, bad.correct, bad.answer) == (True, "42", False, None)
    assert len(bench.load(seed=0, limit=2)) == 2


def test_missing_data_is_unavailable_not_zero(tmp_path):
    with pytest.raises(BenchmarkUnavailable, match="aime2026"):
        AIME(2026, data_dir=tmp_path).load(seed=0)
    with pytest.raises(BenchmarkUnavailable, match="gpqa_diamond"):
        GPQADiamond(data_dir=tmp_path).load(seed=0)


def test_gpqa_shuffle_tracks_the_correct_option():
    options, letter = shuffled_options("right", ["w1", "w2", "w3"], row=3)
    assert options["ABCD".index(letter)] == "right" and sorted(options) == ["right", "w1", "w2", "w3"]
    assert shuffled_options("right", ["w1", "w2", "w3"], 3) == (options, letter)
    letters = Counter(shuffled_options("r", ["a", "b", "c"], i)[1] for i in range(400))
    assert set(letters) == set("ABCD") and min(letters.values()) > 60
    bench = GPQADiamond(data_dir=FIXTURES)
    items = bench.load(seed=5)
    item = items[0]
    right = asyncio.run(bench.score(item, f"... \\boxed{{{item.reference}}}"))
    wrong_letter = "ABCD"[("ABCD".index(item.reference) + 1) % 4]
    wrong = asyncio.run(bench.score(item, f"\\boxed{{{wrong_letter}}}"))
    assert right.correct and not wrong.correct
    body = item.messages[0]["content"]
    assert f"{item.reference}: Carbon dioxide" in body


def test_hard_settings_cover_the_hundred_tasks_in_four_categories():
    data = hard_settings()
    counts = {c: len(tasks_of(c)) for c in ("math", "algorithmic", "cognition", "logic")}
    assert counts == {"math": 31, "algorithmic": 36, "cognition": 24, "logic": 9}
    assert set(data["params"]) == {t for c in counts for t in tasks_of(c)}
    assert data["params"]["ab"] == {"length": 25}


def _entry(task: str):
    import reasoning_gym

    dataset = reasoning_gym.create_dataset(task, seed=1, size=2, **hard_settings()["params"][task])
    return dataset, dataset[0]


def test_game_of_life_halting_defect_is_worked_around():
    dataset, entry = _entry("game_of_life_halting")
    gold = str(entry["answer"])
    other = "False" if gold == "True" else "True"
    assert dataset.score_answer(answer="banana", entry=entry) == 1.0  # the package's defect
    assert score_rg_answer("game_of_life_halting", dataset, entry, "banana")[0] == 0.0
    assert score_rg_answer("game_of_life_halting", dataset, entry, other)[0] == 0.0
    assert score_rg_answer("game_of_life_halting", dataset, entry, gold.lower())[0] == 1.0


def test_prime_factorization_raising_scorer_counts_as_failure():
    dataset, entry = _entry("prime_factorization")
    with pytest.raises(ValueError):
        dataset.score_answer(answer="banana", entry=entry)
    score, detail = score_rg_answer("prime_factorization", dataset, entry, "banana")
    assert score == 0.0 and "ValueError" in detail["scorer_error"]
    assert score_rg_answer("prime_factorization", dataset, entry, entry["answer"])[0] == 1.0
    assert score_rg_answer("prime_factorization", dataset, entry, None) == (0.0, {"reason": "no <answer> tag"})


def test_reasoning_gym_items_and_win_rate():
    bench = ReasoningGymHard("logic", episodes=2, tasks=["syllogism", "aiw"])
    items = bench.load(seed=0)
    assert [i.item_id for i in items] == ["syllogism/0", "syllogism/1", "aiw/0", "aiw/1"]
    assert items == bench.load(seed=0)  # same seed, same items
    entry = bench._loaded["aiw"].entries[0]
    win = asyncio.run(bench.score(items[2], f"<answer>{entry['answer']}</answer>"))
    loss = asyncio.run(bench.score(items[2], f"{entry['answer']}"))
    assert win.correct and win.score == 1.0 and not loss.correct


def test_generation_failure_takes_the_next_index(monkeypatch):
    bench = ReasoningGymHard("logic", episodes=2, tasks=["aiw"])
    bench._dataset("aiw", 0)
    real = bench._loaded["aiw"].dataset

    class Flaky:
        def __getitem__(self, index):
            if index == 0:
                raise ValueError("cannot generate")
            return real[index]

        def score_answer(self, answer, entry):
            return real.score_answer(answer=answer, entry=entry)

    bench._loaded["aiw"].dataset = Flaky()
    items = bench.load(seed=0)
    assert [i.item_id for i in items] == ["aiw/1", "aiw/2"]
    assert items[0].meta["replaced_failures"] == 1
