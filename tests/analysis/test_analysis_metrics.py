"""Each metric family against hand-built sets whose values are known."""

from __future__ import annotations

import math

import numpy as np
import pytest

from spade.analysis import collapse, diversity, learnability
from spade.analysis.hint_leakage import contains_answer, hint_leakage, normalise
from spade.analysis.program_size import line_counts, program_size, state_variables
from spade.analysis.reward_levels import reward_levels
from spade.analysis.run_reader import Episode
from spade.analysis.tsne_map import tsne_coordinates


def unit(rows: list[list[float]]) -> np.ndarray:
    e = np.asarray(rows, dtype=float)
    return e / np.linalg.norm(e, axis=1, keepdims=True)


# ------------------------------------------------------------------ Vendi

@pytest.mark.parametrize("n", [1, 2, 5, 24])
def test_identical_environments_give_vendi_per_n_of_one_over_n(n: int) -> None:
    e = np.tile(unit([[0.3, -1.0, 2.0]]), (n, 1))
    assert diversity.vendi_score(e) == pytest.approx(1.0)
    assert diversity.vendi_per_n(e) == pytest.approx(1.0 / n)


def test_orthogonal_environments_give_vendi_per_n_of_one() -> None:
    assert diversity.vendi_per_n(np.eye(7)) == pytest.approx(1.0)


def test_two_equal_clusters_count_as_two_and_an_uneven_split_as_less() -> None:
    a, b = [1.0, 0.0], [0.0, 1.0]
    assert diversity.vendi_score(unit([a, a, b, b])) == pytest.approx(2.0)
    # eigenvalues 3/4 and 1/4: exp(entropy)
    expected = math.exp(-(0.75 * math.log(0.75) + 0.25 * math.log(0.25)))
    assert diversity.vendi_score(unit([a, a, a, b])) == pytest.approx(expected)


def test_sampled_vendi_draws_samples_of_the_pool_and_takes_a_small_pool_whole() -> None:
    rng = np.random.default_rng(0)
    small = unit(rng.normal(size=(30, 16)).tolist())
    whole = diversity.sampled_vendi_per_n(small)
    assert whole["draws"] == 1 and whole["sample_size"] == 30
    assert whole["vendi_per_n"] == pytest.approx(diversity.vendi_per_n(small))
    same = np.tile(unit([[1.0, 2.0]]), (250, 1))
    sampled = diversity.sampled_vendi_per_n(same, sample_size=100, draws=20)
    assert sampled["draws"] == 20 and sampled["sample_size"] == 100
    assert sampled["vendi_per_n"] == pytest.approx(0.01)
    assert diversity.sampled_vendi_per_n(np.zeros((0, 3)))["vendi_per_n"] is None


# ------------------------------------------------------------------ learnable share, distributions

def test_learnable_share_counts_the_inclusive_band_and_skips_unknown() -> None:
    assert learnability.learnable_share([0.0, 0.2, 0.5, 0.8, 0.81, 1.0, None]) == pytest.approx(3 / 6)
    assert learnability.learnable_share([None]) is None
    assert learnability.is_learnable(0.19) is False and learnability.is_learnable(None) is None


def test_distribution_has_quantiles_and_a_fixed_range_histogram() -> None:
    d = learnability.distribution([0.0, 0.25, 0.5, 1.0, None], 0.0, 1.0, bins=4)
    assert d["n"] == 4 and d["mean"] == pytest.approx(0.4375) and d["median"] == pytest.approx(0.375)
    assert d["histogram"] == [1, 1, 1, 1] and d["edges"][0] == 0.0 and d["edges"][-1] == 1.0
    clipped = learnability.distribution([-3.0, 3.0], -1.0, 1.0, bins=2)
    assert clipped["histogram"] == [1, 1]


# ------------------------------------------------------------------ reward levels

def test_reward_levels_count_distinct_values_and_strictly_partial_ones() -> None:
    levels = reward_levels([0.0, 0.1, 0.1000000001, 0.3, 1.0, 0.0, -0.1])
    assert levels["levels"] == 5  # -0.1, 0, 0.1, 0.3, 1
    assert levels["partial_levels"] == 2  # 0.1, 0.3
    assert reward_levels([])["levels"] == 0


# ------------------------------------------------------------------ program size

SOURCE = '''"""A toy."""
import random

# a comment
LIMIT = 3


class Helper:
    def __init__(self):
        self.not_counted = 1


class CounterEnv:
    SIDES = 6

    def __init__(self, max_turns: int = 5):
        self.max_turns = max_turns
        self.reset()

    def reset(self, seed=None):
        self.rng = random.Random(seed)
        self.target, self.turn = self.rng.randint(1, 9), 0
        self.history: list = []
        return "go", {}

    def step(self, action):
        self.turn += 1
        self.history.append(action)
        local = 4
        return "ok", 0.0, False, False, {}
'''


def test_state_variables_are_the_self_attributes_assigned_in_the_env_class() -> None:
    assert state_variables(SOURCE, "CounterEnv") == ["history", "max_turns", "rng", "target", "turn"]
    assert state_variables(SOURCE, None) == ["history", "max_turns", "rng", "target", "turn"]
    assert state_variables("def broken(:\n", None) is None


def test_line_counts_and_turns() -> None:
    counts = line_counts(SOURCE)
    assert counts["lines"] == len(SOURCE.splitlines())
    assert counts["code_lines"] == counts["lines"] - 8 - 1  # 8 blank lines, one comment line
    size = program_size(SOURCE, "CounterEnv", [2, 4, 9])
    assert size["state_variables"] == 5 and size["turns"] == pytest.approx(5.0)
    assert program_size(SOURCE, "CounterEnv", [])["turns"] is None


# ------------------------------------------------------------------ collapse

def test_streaks_chain_near_duplicates_by_similarity_or_class_name() -> None:
    a, b, c = [1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]
    vectors = unit([a, a, a, b, c, [0.0, 0.2, 1.0], c])
    names = ["MazeEnv", "Maze2Env", "maze_env", "KnapsackEnv", "ZEnv", "YEnv", "WEnv"]
    # sims: 0-1-2 identical; 3 alone; 4,5 cos 0.98 ; 5,6 cos 0.98
    assert collapse.streaks(vectors, names) == [(0, 3), (3, 1), (4, 3)]
    summary = collapse.collapse_summary(vectors, names)
    assert summary["longest_streak"] == 3 and summary["streaks_at_least_min"] == 2
    assert summary["share_in_streaks"] == pytest.approx(6 / 7)
    # class names alone make a streak even with unlike embeddings
    assert collapse.streaks(np.eye(3), ["GridMazeEnv", "GridMaze3Env", "gridmaze"]) == [(0, 3)]


def test_set_duplicate_share() -> None:
    vectors = unit([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
    assert collapse.set_duplicate_share(vectors, ["A", "B", "C", "D"]) == pytest.approx(0.5)
    assert collapse.set_duplicate_share(np.eye(2), ["AEnv", "BEnv"]) == 0.0


# ------------------------------------------------------------------ hint leakage

def episode(arm: str, actions: list[str], ret: float) -> Episode:
    return Episode(step=0, arm=arm, index=0, seed=1, opening="", turns=[{"action": a, "reward": 0.0} for a in actions],
                   episode_return=ret, end_reason="terminated")


def test_hint_containing_the_winning_action_is_a_leak() -> None:
    assert normalise("\\boxed{  Guess   691 }") == "guess 691"
    assert contains_answer("Try \\boxed{guess 691} right away.", "\\boxed{guess 691}")
    assert contains_answer("The number is 691.", "\\boxed{691}")
    assert not contains_answer("The number is 6910.", "\\boxed{691}")
    assert not contains_answer("Step 3 of the plan", "\\boxed{3}")  # a lone digit needs a box or quotes
    assert contains_answer("answer with '3'", "\\boxed{3}")
    episodes = [episode("hint", ["\\boxed{guess 691}"], 1.0), episode("hint", ["\\boxed{mod 7}", "\\boxed{guess 691}"], 1.0),
                episode("nohint", ["\\boxed{mod 7}", "\\boxed{guess 12}"], 0.0), episode("nohint", ["\\boxed{mod 5}"], 0.0)]
    leak = hint_leakage("Guess 691 and you win.", episodes)
    assert leak["hint_contains_answer"] is True and leak["winning_actions"] == ["guess 691"]
    assert leak["hint_one_turn_win_rate"] == 0.5 and leak["nohint_one_turn_win_rate"] == 0.0


def test_a_hint_that_gives_a_plan_is_not_a_leak_and_no_win_means_unknown() -> None:
    won = [episode("nohint", ["\\boxed{mod 13}", "\\boxed{guess 691}"], 1.0)]
    assert hint_leakage("Ask large moduli first and combine the remainders.", won)["hint_contains_answer"] is False
    assert hint_leakage("anything", [episode("nohint", ["x"], 0.0)])["hint_contains_answer"] is None
    assert hint_leakage("", won)["hint_contains_answer"] is None


# ------------------------------------------------------------------ t-SNE

def test_tsne_map_puts_clusters_apart_and_scales_to_the_unit_square() -> None:
    rng = np.random.default_rng(1)
    centres = rng.normal(size=(2, 32)) * 5
    points = np.concatenate([centres[0] + rng.normal(size=(12, 32)) * 0.1, centres[1] + rng.normal(size=(12, 32)) * 0.1])
    coords = tsne_coordinates(points, seed=0)
    assert coords.shape == (24, 2) and coords.min() >= 0.0 and coords.max() <= 1.0
    inside = max(np.ptp(coords[:12], axis=0).max(), np.ptp(coords[12:], axis=0).max())
    between = np.linalg.norm(coords[:12].mean(0) - coords[12:].mean(0))
    assert between > 2 * inside
    assert tsne_coordinates(np.ones((2, 4))).shape == (2, 2)
    assert tsne_coordinates(np.zeros((0, 4))).shape == (0, 2)


def test_tsne_of_a_collapsed_set_gives_repeats_one_point() -> None:
    """The collapse the paper shows (one environment again and again): identical embeddings crashed
    scikit-learn's t-SNE (a zero variance in its PCA initialisation). In a subprocess, so that a
    regression shows as a failed test rather than a killed test run."""
    import subprocess
    import sys

    code = (
        "import numpy as np\n"
        "from spade.analysis.tsne_map import tsne_coordinates\n"
        "same = np.tile([[0.2, -1.0, 0.5, 3.0]], (6, 1))\n"
        "coords = tsne_coordinates(same)\n"
        "assert coords.shape == (6, 2) and (coords == coords[0]).all()\n"
        "mixed = np.concatenate([same, np.eye(4)])\n"
        "coords = tsne_coordinates(mixed)\n"
        "assert coords.shape == (10, 2) and np.isfinite(coords).all()\n"
        "assert (coords[:6] == coords[0]).all() and len({tuple(c) for c in coords}) == 5\n"
        "line = np.outer(np.arange(1, 6), [1.0, 2.0, 0.0])\n"  # distinct rows on one line: rank 1
        "assert np.isfinite(tsne_coordinates(line)).all()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
