"""The pieces the learning check (benchmarks/learning.py, docs/learning.md) depends on: the
fixed-set source plays only training seeds, the held-out split is disjoint from them and
deterministic, the bootstrap interval matches hand-computed cases, the report writer writes the
numbers it was given and a PNG, and the control switch takes the direction out of the update."""

from __future__ import annotations

import random
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from spade.analysis.bootstrap import DifferenceInterval, bootstrap_difference
from spade.analysis.learning_report import (ArmResult, LearningReport, RegenerationFigures, moving_average,
                                            selfplay_summary, write_report)
from spade.eval.heldout import (TRAINING_SEED_LIMIT, HeldOutEpisode, HeldOutResult, HeldOutSplit, is_training_seed,
                                pool_envs)
from spade.rl.loss import policy_loss
from spade.rl.samples import TrainSample
from spade.selfplay.sources.fixed_pool import FixedPool
from spade.selfplay.plays.player import Player
from spade.selfplay.seeds import derive_seed, reset_seed
from spade.train_config import load_train_config
from spade.training.advantage_control import shuffle_advantages, shuffle_seed
from spade.training.train_step import LossSettings

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "examples" / "learn" / "fixed.yaml"
GAMES = ROOT / "examples" / "learn" / "games"


# ---------------------------------------------------------------------------- seeds


def test_the_held_out_split_is_deterministic_and_outside_every_training_seed():
    split = HeldOutSplit(200)
    assert split.seeds() == HeldOutSplit(200).seeds() == tuple(range(2 ** 31, 2 ** 31 + 200))
    assert not any(is_training_seed(seed) for seed in split.seeds())
    assert all(split.holds(seed) for seed in split.seeds()) and not split.holds(2 ** 31 + 200)
    assert HeldOutSplit(3, offset=10).seeds() == (2 ** 31 + 10, 2 ** 31 + 11, 2 ** 31 + 12)
    # derive_seed, where every training reset seed comes from, never reaches the held-out range
    rng = random.Random(0)
    drawn = [derive_seed(rng.getrandbits(64), "reset", rng.randrange(1000), f"fixed-{i}", i % 16) for i in range(20000)]
    assert max(drawn) < TRAINING_SEED_LIMIT and all(is_training_seed(s) for s in drawn)
    with pytest.raises(ValueError, match="episodes_per_env"):
        HeldOutSplit(0)


def test_the_fixed_set_source_plays_the_learning_games_on_training_seeds_only(sandbox, tmp_path):
    config = load_train_config(CONFIG)
    s = config.selfplay
    assert s.env_source == "fixed_pool" and Path(s.fixed_env_dir) == GAMES
    assert s.g_hint == 0 and not s.train_designer
    settings = s
    source = FixedPool(settings, sandbox=sandbox.service, run_dir=tmp_path / "run", seed=config.run.seed)
    player = Player(settings, sandbox=sandbox.service, engine=None, tokenizer=None, chat_format=None,
                    seed=config.run.seed)
    held_out = set(HeldOutSplit(1000).seeds())
    names = sorted(env.name for env in pool_envs(GAMES))
    assert len(names) == 3
    for step in range(4):
        result = sandbox.run(source.next_set(step), timeout=180)
        assert not result.rejections  # every game passes the training's admission
        assert sorted(e.env_id for e in result.envs) == [f"fixed-{n}" for n in names]  # the whole set, every step
        groups = player.fresh_groups(step, result.envs)
        seeds = [play.env_seed for group in groups for play in group.unfinished]
        seeds += [reset_seed(config.run.seed, step, r.env.env_id, r.index, hinted=r.hinted)
                  for r in player.requests(result.envs, with_hint=True)]
        assert len(seeds) == 2 * 3 * s.g_nohint  # no hinted plays: the pool has no hints
        assert all(is_training_seed(seed) for seed in seeds) and not held_out & set(seeds)


def test_held_out_results_pair_up_by_game_and_seed_and_round_trip():
    first = HeldOutResult((HeldOutEpisode("b", 2 ** 31 + 1, 1.0, "terminated", "4"),
                           HeldOutEpisode("a", 2 ** 31, 0.0, "policy_stopped", "")))
    assert first.returns() == [0.0, 1.0] and first.mean == 0.5 and first.by_env() == {"a": 0.0, "b": 1.0}
    assert HeldOutResult.from_dict(first.to_dict()) == first


# ---------------------------------------------------------------------------- the bootstrap


def test_the_paired_bootstrap_matches_a_hand_computed_case():
    # differences (0, 0, 1): a resample's mean is 0, 1/3, 2/3 or 1 with probabilities 8/27, 12/27,
    # 6/27, 1/27; the 2.5% quantile is 0 (8/27 > 0.025) and the 97.5% one is 1 (26/27 < 0.975)
    interval = bootstrap_difference([1.0, 0.0, 0.0], [1.0, 0.0, 1.0], paired=True, resamples=20000, seed=3)
    assert (interval.mean_before, interval.mean_after) == pytest.approx((1 / 3, 2 / 3))
    assert interval.difference == pytest.approx(1 / 3)
    assert (interval.low, interval.high) == (0.0, 1.0)
    # the same difference in every pair: every resample gives it
    constant = bootstrap_difference([0.0, 0.5, 0.25], [0.5, 1.0, 0.75], paired=True, resamples=500, seed=0)
    assert (constant.low, constant.high) == pytest.approx((0.5, 0.5))
    # unpaired, one value a side: the difference itself
    single = bootstrap_difference([0.25], [1.0], paired=False, resamples=100, seed=0)
    assert (single.low, single.high) == (0.75, 0.75)


def test_a_known_zero_difference_gives_an_interval_around_zero_and_the_seed_fixes_it():
    rng = np.random.default_rng(7)
    values = (rng.random(300) < 0.3).astype(float)
    paired = bootstrap_difference(values, values, paired=True, seed=1)
    assert (paired.low, paired.high) == (0.0, 0.0) and paired.contains_zero()
    shuffled = rng.permutation(values)  # the same returns in another order: no difference in the means
    unpaired = bootstrap_difference(values, shuffled, paired=False, seed=1)
    assert unpaired.difference == 0.0 and unpaired.low < 0.0 < unpaired.high and not unpaired.above_zero()
    assert bootstrap_difference(values, shuffled, paired=False, seed=1) == unpaired
    assert bootstrap_difference(values, shuffled, paired=False, seed=2) != unpaired
    with pytest.raises(ValueError, match="paired"):
        bootstrap_difference([0.0, 1.0], [1.0], paired=True)


# ---------------------------------------------------------------------------- the report


def interval(before: float, after: float, low: float, high: float) -> DifferenceInterval:
    return DifferenceInterval(before, after, low, high, 120, 120, True, 0.95, 10000, 0)


def test_the_report_writer_writes_the_numbers_and_a_png(tmp_path):
    assert moving_average([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 5) == [1.0, 1.5, 2.0, 2.5, 3.0, 4.0]
    report = LearningReport(date="2026-12-07", cpu="Test CPU", cores=2, command="learning.py --quick", steps=6,
                            heldout_episodes=120, seconds=600.0,
                            arms=(ArmResult("learned", interval(0.25, 0.5, 0.125, 0.375), (0.2, 0.3, 0.4, 0.5, 0.5, 0.6)),
                                  ArmResult("control", interval(0.25, 0.2625, -0.05, 0.075), (0.2, 0.25, 0.2, 0.3, 0.2, 0.25))),
                            selfplay=(RegenerationFigures(0, 16.0, 4.0, 0.125, 0.5),),
                            learned_vs_control=interval(0.2625, 0.5, 0.125, 0.375))
    markdown, png = write_report(report, tmp_path / "out")
    text = markdown.read_text()
    assert "| learned | 0.250 | 0.500 | +0.250 | [+0.125, +0.375] | above 0 | 6 |" in text
    assert "| control | 0.250 | 0.263 | +0.013 | [-0.050, +0.075] | contains 0 | 6 |" in text
    assert "| 0 | 16 | 4 | 0.25 | 0.125 | 0.500 |" in text
    assert "learned minus control on the same held-out episodes: 0.500 - 0.263 = +0.237, 95% interval [+0.125, +0.375] (above 0)" in text
    assert "learned 0.250 -> 0.500 (+0.250, 95% CI [+0.125, +0.375])" in report.headline()
    assert "2026-12-07, Test CPU, 2 cores, 10.0 minutes: `learning.py --quick`" in text
    assert "![training curves and held-out returns](learning.png)" in text
    header = png.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", header[16:24])
    assert (width, height) == (1100, 400)


def test_the_self_play_figures_come_from_the_regeneration_rows():
    rows = [{"step": 0, "designer/attempts": 16.0, "env/admitted": 2.0},
            {"step": 1, "agent/return_mean": 0.1},
            {"step": 2, "designer/attempts": 16.0, "env/admitted": 4.0, "designer/reward_mean": 0.2,
             "designer/regret_mean": 0.3}]
    figures = selfplay_summary(rows)
    assert [(f.step, f.admission_rate, f.designer_reward, f.regret) for f in figures] == [
        (0, 0.125, None, None), (2, 0.25, 0.2, 0.3)]


# ---------------------------------------------------------------------------- the control


def one_token_samples(actions: list[int], advantages: list[float], version: int = 3) -> list[TrainSample]:
    return [TrainSample(token_ids=[5, a], loss_mask=[1], advantages=adv, weight_version=version)
            for a, adv in zip(actions, advantages)]


def update_direction(samples: list[TrainSample]) -> torch.Tensor:
    """Minus the gradient of the GRPO loss for a two-action policy at uniform logits (on policy)."""
    logits = torch.zeros(2, requires_grad=True)
    logp = torch.log_softmax(logits, dim=0)
    chosen = torch.stack([logp[int(s.token_ids[1])] for s in samples]).unsqueeze(-1)
    advantages = torch.tensor([float(s.advantages) for s in samples])
    loss, _ = policy_loss(chosen, chosen.detach(), advantages, torch.ones(len(samples), 1))
    loss.backward()
    return -logits.grad


def test_the_control_switch_removes_the_direction_of_the_update():
    assert LossSettings().control_shuffle_advantages is False
    assert load_train_config(CONFIG, ["loss.control_shuffle_advantages=true"]).loss.control_shuffle_advantages
    # plays of action 0 won, plays of action 1 lost: the update raises action 0
    samples = one_token_samples([0, 0, 0, 1, 1, 1], [1.0, 1.0, 1.0, -1.0, -1.0, -1.0])
    learned = update_direction(samples)
    assert learned[0] > 0 > learned[1]
    seed = shuffle_seed(samples)
    assert seed == shuffle_seed(samples) and seed != shuffle_seed(one_token_samples([0], [0.0], version=4))  # the next step
    shuffled = shuffle_advantages(samples, seed)
    assert sorted(s.advantages for s in shuffled) == sorted(s.advantages for s in samples)
    assert [s.token_ids.tolist() for s in shuffled] == [s.token_ids.tolist() for s in samples]
    assert not torch.allclose(update_direction(shuffled), learned)
    # over permutations the update has no sign: its mean over seeds is about 0, the learned one is not
    directions = torch.stack([update_direction(shuffle_advantages(samples, k))[0] for k in range(400)])
    assert abs(float(directions.mean())) < 0.1 * float(learned[0])
    assert float(directions.min()) < 0 < float(directions.max())
