"""SPIRAL's pieces without a model: the role baselines (RAE) on a hand-computed example, the
settings' errors, the move taken out of a reply, real TextArena games played on both seats by a
scripted engine (returns, turn samples, seeds), the source's advantages and its checkpointed state.
The run through ``spade train`` is tests/run/test_spiral_train.py."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from spade.config import ConfigError, from_mapping
from spade.rollout.conversation import ChatFormat
from spade.selfplay.plays.player import Player
from spade.selfplay.plays.two_seat_player import TwoSeatGames
from spade.selfplay.rewards.role_baselines import RoleBaselines
from spade.selfplay.settings import SelfPlaySettings
from spade.selfplay.sources.spiral_games import TextArenaGame, action_of
from spade.selfplay.sources.spiral_settings import SpiralSettings
from spade.selfplay.sources.spiral_source import SpiralSource, seat_of
from scripted_engine import ScriptedEngine

ROOT = Path(__file__).resolve().parents[2]


def test_rae_matches_a_hand_computed_example():
    # decay 0.9, one game, seats 0/1; baselines start at 0 and are read before each update
    rae = RoleBaselines(0.9)
    # game 1: seat 0 wins (1), seat 1 loses (-1): advantages 1 - 0, -1 - 0; b0 = 0.1, b1 = -0.1
    assert rae.advantages("kuhn_poker", [(0, 1.0), (1, -1.0)]) == [1.0, -1.0]
    assert rae.baseline("kuhn_poker", 0) == pytest.approx(0.1)
    assert rae.baseline("kuhn_poker", 1) == pytest.approx(-0.1)
    # game 2: seat 0 loses: -1 - 0.1 = -1.1, b0 = 0.09 - 0.1 = -0.01; seat 1 wins: 1 + 0.1 = 1.1, b1 = 0.01
    assert rae.advantages("kuhn_poker", [(0, -1.0), (1, 1.0)]) == pytest.approx([-1.1, 1.1])
    assert rae.baseline("kuhn_poker", 0) == pytest.approx(-0.01)
    assert rae.baseline("kuhn_poker", 1) == pytest.approx(0.01)
    # game 3, a draw: 0 - (-0.01) = 0.01 and 0 - 0.01 = -0.01
    assert rae.advantages("kuhn_poker", [(0, 0.0), (1, 0.0)]) == pytest.approx([0.01, -0.01])
    # another game's baselines are its own
    assert rae.baseline("tic_tac_toe", 0) == 0.0
    restored = RoleBaselines(0.9)
    restored.load_state_dict(rae.state_dict())
    assert restored.values == rae.values and restored.updates == {("kuhn_poker", 0): 3, ("kuhn_poker", 1): 3}


@pytest.mark.parametrize("mapping, key", [
    ({"games": ["chess"]}, "selfplay.spiral.games"),
    ({"games": []}, "selfplay.spiral.games"),
    ({"games": ["kuhn_poker", "kuhn_poker"]}, "selfplay.spiral.games"),
    ({"rae_decay": 1.0}, "selfplay.spiral.rae_decay"),
    ({"games_per_step": 0}, "selfplay.spiral.games_per_step"),
    ({"advantage": "ppo"}, "selfplay.spiral.advantage"),
    ({"invalid_move": "draw"}, "selfplay.spiral.invalid_move"),
    ({"max_turns": 0}, "selfplay.spiral.max_turns"),
])
def test_invalid_settings_name_their_key(mapping, key):
    with pytest.raises(ConfigError, match=re.escape(key)):
        from_mapping(SelfPlaySettings, {"env_source": "spiral", "spiral": mapping}, where="selfplay")


def test_settings_load_as_a_section_of_selfplay():
    settings = from_mapping(SelfPlaySettings, {"env_source": "spiral", "spiral": {
        "games": ["kuhn_poker", "tic_tac_toe", "simple_negotiation"], "advantage": "grpo"}}, where="selfplay")
    assert settings.spiral.games == ("kuhn_poker", "tic_tac_toe", "simple_negotiation")
    assert settings.spiral.advantage == "grpo" and not settings.designer_enabled
    assert SpiralSettings(invalid_move="released").returns_of_invalid_move(1) == {1: -1.5, 0: 0.5}


@pytest.mark.parametrize("reply, move", [
    ("I hold the king, so \\boxed{bet}", "[bet]"),
    ("first \\boxed{check} then \\boxed{[call]}", "[call]"),
    ("\\boxed{\\text{fold}}", "[fold]"),
    ("[4]", "[4]"),
    ("a long answer without any box or bracket at all", "a long answer without any box or bracket at all"),
    ("\\boxed{[Offer:  3 Wood ->  2 Ore]}", "[Offer: 3 Wood -> 2 Ore]"),
])
def test_the_move_is_the_last_box_in_textarena_form(reply, move):
    assert action_of(reply) == move


def test_a_textarena_game_keeps_its_own_random_state():
    import random

    random.seed(123)
    before = random.random()
    random.seed(123)
    game = TextArenaGame("kuhn_poker", seed=5, settings=SpiralSettings())
    other = TextArenaGame("kuhn_poker", seed=5, settings=SpiralSettings())
    assert random.random() == before  # the games did not touch the global generator
    assert game.observation() == other.observation()


class KuhnScript(ScriptedEngine):
    """Checks whenever it may, else calls: every Kuhn Poker round goes to a showdown."""

    def reply_ids(self, prompt: str) -> list[int]:
        last = prompt.rsplit("available actions are:", 1)[-1]
        return self.text_ids("\\boxed{check}" if "[check]" in last else "\\boxed{call}")


class Nonsense(ScriptedEngine):
    def reply_ids(self, prompt: str) -> list[int]:
        return self.text_ids("hmm")


def two_seat_games(engine_class, tmp_path: Path, **spiral) -> tuple[TwoSeatGames, SpiralSource, SelfPlaySettings]:
    from chat_templates import bpe_tokenizer

    tokenizer = bpe_tokenizer()
    settings = from_mapping(SelfPlaySettings, {"env_source": "spiral", "max_context_tokens": 4096,
                                               "spiral": {"games_per_step": 3, **spiral}}, where="selfplay")
    player = Player(settings, sandbox=None, engine=engine_class(tokenizer), tokenizer=tokenizer,
                    chat_format=ChatFormat(tokenizer), seed=11,
                    stop_token_ids=(tokenizer.convert_tokens_to_ids("<|im_end|>"),))
    source = SpiralSource(settings, run_dir=tmp_path, seed=11)
    return source.step_player(player), source, settings


def test_both_seats_of_kuhn_poker_play_to_the_end(tmp_path):
    games, source, _ = two_seat_games(KuhnScript, tmp_path)
    envs = asyncio.run(source.next_set(0)).envs
    assert [e.skill for e in envs] == ["kuhn_poker"] and (tmp_path / "envs" / "step_000000").is_dir()
    plays = asyncio.run(games.play(0, envs, with_hint=False))
    mine = plays.nohint[envs[0].env_id]
    assert [p.index for p in mine] == [0, 1, 2, 3, 4, 5]
    for g in range(3):
        seat0, seat1 = mine[2 * g], mine[2 * g + 1]
        assert seat0.episode_return + seat1.episode_return == 0.0  # zero-sum, decided by the cards
        assert seat0.end_reason == "terminated" and seat0.seed == seat1.seed
        for play in (seat0, seat1):
            # five rounds of check-check: each seat moves once a round, each move its own turn sample
            assert play.turns == 5 and len(play.turn_samples) == 5
            assert all(t.action == "[check]" for t in play.turn_log)
            assert "Observation:" in play.opening and "Kuhn Poker" in play.opening
    metrics = games.step_metrics()
    assert metrics["spiral/kuhn_poker/games"] == 3.0 and metrics["spiral/kuhn_poker/invalid_move_share"] == 0.0
    assert metrics["spiral/kuhn_poker/moves_mean"] == 10.0
    again, _, _ = two_seat_games(KuhnScript, tmp_path)  # the same seed deals the same cards
    assert [p.episode_return for p in asyncio.run(again.play(0, envs, with_hint=False)).nohint[envs[0].env_id]] \
        == [p.episode_return for p in mine]


def test_an_invalid_move_ends_the_game_under_either_rule(tmp_path):
    for rule, returns in (("loss", (-1.0, 1.0)), ("released", (-1.5, 0.5))):
        games, source, _ = two_seat_games(Nonsense, tmp_path, invalid_move=rule, games_per_step=1)
        envs = asyncio.run(source.next_set(0)).envs
        seat_a, seat_b = asyncio.run(games.play(0, envs, with_hint=False)).nohint[envs[0].env_id]
        mover = seat_a if seat_a.turns else seat_b  # Kuhn Poker's first round opens with seat 1
        other = seat_b if mover is seat_a else seat_a
        assert (mover.turns, other.turns) == (1, 0) and other.training_trajectories == ()
        assert (mover.episode_return, other.episode_return) == returns
        assert mover.turn_log[-1].observation.startswith("game over (invalid_move)")
        assert games.step_metrics()["spiral/kuhn_poker/invalid_move_share"] == 1.0


def test_the_source_scores_with_role_baselines_and_keeps_them_in_its_state(tmp_path):
    games, source, settings = two_seat_games(KuhnScript, tmp_path)
    envs = asyncio.run(source.next_set(0)).envs
    plays = asyncio.run(games.play(0, envs, with_hint=False))
    mine = plays.nohint[envs[0].env_id]
    source.observe(0, envs, {})
    advantages = source.advantages(envs[0], mine)
    rae = RoleBaselines(settings.spiral.rae_decay)
    assert advantages == pytest.approx(rae.advantages("kuhn_poker", [(seat_of(p), p.episode_return) for p in mine]))
    figures = source.metrics()
    assert {"spiral/kuhn_poker/seat0/return_mean", "spiral/kuhn_poker/seat1/return_mean",
            "spiral/kuhn_poker/seat0/baseline", "spiral/kuhn_poker/seat1/win_share"} <= set(figures)
    state = source.state_dict()
    resumed = SpiralSource(settings, run_dir=tmp_path, seed=11)
    resumed.load_state_dict(state)
    assert resumed.baselines.values == source.baselines.values and resumed.baselines.values
    # GRPO's ablation: z-scores among the step's plays, baselines untouched
    grpo = SpiralSource(from_mapping(SelfPlaySettings, {"env_source": "spiral", "spiral": {"advantage": "grpo"}},
                                     where="selfplay"), run_dir=tmp_path, seed=11)
    z = grpo.advantages(envs[0], mine)
    assert sum(z) == pytest.approx(0.0, abs=1e-9) and grpo.baselines.values == {}
    # SPIRAL's own ablation: the return itself
    raw = SpiralSource(from_mapping(SelfPlaySettings, {"env_source": "spiral", "spiral": {"advantage": "none"}},
                                    where="selfplay"), run_dir=tmp_path, seed=11)
    assert raw.advantages(envs[0], mine) == [p.episode_return for p in mine] and raw.baselines.values == {}


def test_two_seats_of_tictactoe_and_negotiation_get_real_observations():
    for name, needle in (("tic_tac_toe", "Tic Tac Toe"), ("simple_negotiation", "Negotiation")):
        game = TextArenaGame(name, seed=3, settings=SpiralSettings())
        seat, observation = game.observation()
        assert seat in (0, 1) and needle in observation


def test_refuses_rollout_shards_and_partial_rollouts(tmp_path):
    for extra, key in (({"rollout_shards": 2}, "selfplay.rollout_shards"),
                       ({"partial_rollouts": {"enabled": True}}, "selfplay.partial_rollouts.enabled")):
        settings = from_mapping(SelfPlaySettings, {"env_source": "spiral", **extra}, where="selfplay")
        with pytest.raises(ConfigError, match=re.escape(key)):
            SpiralSource(settings, run_dir=tmp_path, seed=1)


def test_the_step_line_says_what_the_games_did():
    from spade.run.console import step_line

    metrics = {"designer/attempts": 0.0, "env/admitted": 1.0, "env/rejected": 0.0, "agent/episodes": 8.0,
               "agent/return_mean": -0.5, "spiral/kuhn_poker/games": 4.0, "spiral/kuhn_poker/seat0/return_mean": 0.5,
               "spiral/kuhn_poker/seat1/return_mean": -1.5, "spiral/kuhn_poker/invalid_move_share": 0.75}
    line = step_line(0, 2, metrics)  # the source told apart by its figures
    assert "kuhn_poker 4 games, seat returns 0.5 / -1.5, 75% ended by an invalid move" in line


def test_spade_prompts_shows_spirals_turn_prompt_on_a_real_game(capsys):
    import json

    from spade.cli import main

    assert main(["prompts", "--config", str(ROOT / "examples" / "spiral_smoke_cpu.yaml"), "--seed", "3",
                 "--reply", "so \\boxed{bet}", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    (turn,) = shown["agent"]
    assert turn["role"] == "user" and turn["content"].startswith("You are playing a two-player zero-sum game.")
    assert "Kuhn Poker" in turn["content"] and turn["content"].endswith("within \\boxed{}.")
    assert shown["agent_with_hint"] is None and shown["designer"] is None and shown["action"] == "[bet]"
    assert "reset with seed 3" in shown["observation_from"]


class FirstFreeCell(ScriptedEngine):
    """TicTacToe: the lowest free cell."""

    def reply_ids(self, prompt: str) -> list[int]:
        cells = re.findall(r"'\[(\d)\]'", prompt.rsplit("Available Moves:", 1)[-1])
        return self.text_ids(f"\\boxed{{{cells[0] if cells else 4}}}")


class Refuser(ScriptedEngine):
    """Simple Negotiation: never trades."""

    def reply_ids(self, prompt: str) -> list[int]:
        return self.text_ids("No deal. \\boxed{Deny}")


def test_tictactoe_and_negotiation_play_to_their_end(tmp_path):
    games, source, _ = two_seat_games(FirstFreeCell, tmp_path, games=["tic_tac_toe"], games_per_step=1)
    envs = asyncio.run(source.next_set(0)).envs
    seat0, seat1 = asyncio.run(games.play(0, envs, with_hint=False)).nohint[envs[0].env_id]
    # seat 0 opens and takes 0, 1, 2 while seat 1 takes 3, 4: the top row wins on move 7
    assert (seat0.episode_return, seat1.episode_return, seat0.turns, seat1.turns) == (1.0, -1.0, 4, 3)
    assert seat0.turn_log[-1].observation == "game over (terminated): seat 0 1, seat 1 -1"
    games, source, _ = two_seat_games(Refuser, tmp_path, games=["simple_negotiation"], games_per_step=1)
    envs = asyncio.run(source.next_set(0)).envs
    seat0, seat1 = asyncio.run(games.play(0, envs, with_hint=False)).nohint[envs[0].env_id]
    assert (seat0.episode_return, seat1.episode_return) == (0.0, 0.0)  # nothing traded: a draw
    assert seat0.end_reason == seat1.end_reason == "terminated" and seat0.turns + seat1.turns > 2


def test_zero_advantage_seats_are_left_out_when_asked(tmp_path):
    from types import SimpleNamespace

    from spade.selfplay.orchestrator import Orchestrator, StepOutput
    from spade.selfplay.step import Step

    for drop, samples in ((True, 0), (False, 2)):
        # nobody trades: every seat draws (0), and with raw returns every advantage is 0
        games, source, settings = two_seat_games(Refuser, tmp_path, games=["simple_negotiation"], games_per_step=1,
                                                 advantage="none", drop_zero_advantage=drop)
        envs = asyncio.run(source.next_set(0)).envs
        plays = asyncio.run(games.play(0, envs, with_hint=False))
        out = StepOutput(Step(0))
        Orchestrator.score_agent_plays(SimpleNamespace(settings=settings, source=source), out, plays)
        assert len({(t.env_id, t.index) for t in out.agent_samples}) == samples  # seats that train
    with pytest.raises(ConfigError, match=re.escape("selfplay.spiral.drop_zero_advantage")):
        from_mapping(SelfPlaySettings, {"spiral": {"drop_zero_advantage": "yes"}}, where="selfplay")
