"""Designed two-player games in SPIRAL's source (``selfplay.spiral.designed``, spade's extension,
issue 44): the switch and its errors; a regeneration that asks the designer for games, rejects a
one-sided one and admits an honest TicTacToe in the real sandbox; both seats of it played by a
scripted engine through the same two-seat player, scored with role baselines of their own; and
the run through ``spade train`` with the switch on is tests/run/test_spiral_train.py."""

from __future__ import annotations

import json
import re

import pytest

from scripted_engine import ScriptedEngine
from spade.config import ConfigError, from_mapping
from spade.designer.two_seat_prompts import TWO_SEAT_SYSTEM
from spade.envs.two_seat import valid_moves
from spade.rollout.conversation import ChatFormat
from spade.selfplay.plays.player import Player
from spade.selfplay.settings import SelfPlaySettings
from spade.selfplay.sources.spiral_source import SpiralSource
from spade.selfplay.sources.text_generators import GeneratedText
from support.two_seat_games import tic_tac_toe

def spiral_settings(**spiral) -> SelfPlaySettings:
    return from_mapping(SelfPlaySettings, {"env_source": "spiral", "max_context_tokens": 4096,
                                           "spiral": {"games_per_step": 2, "max_turns": 20, **spiral}},
                        where="selfplay")


@pytest.mark.parametrize("mapping, key", [
    ({"designed": {"games": 0}}, "selfplay.spiral.designed.games"),
    ({"designed": {"enabled": "yes"}}, "selfplay.spiral.designed.enabled"),
    ({"designed": {"degenerate_share": 0.0}}, "selfplay.spiral.designed.degenerate_share"),
    ({"designed": {"probe_seeds": 0}}, "selfplay.spiral.designed.probe_seeds"),
    ({"designed": {"admission_timeout_s": 0}}, "selfplay.spiral.designed.admission_timeout_s"),
    ({"designed": {"on": True}}, "selfplay.spiral.designed.on"),
    ({"games": []}, "selfplay.spiral.games"),
])
def test_invalid_settings_name_their_key(mapping, key):
    with pytest.raises(ConfigError, match=re.escape(key)):
        from_mapping(SelfPlaySettings, {"env_source": "spiral", "spiral": mapping}, where="selfplay")


def test_off_by_default(tmp_path):
    assert not SelfPlaySettings().spiral.designed.enabled
    assert spiral_settings(games=[], designed={"enabled": True}).spiral.games == ()
    with pytest.raises(ConfigError, match=r"selfplay\.spiral\.designed\.enabled"):
        SpiralSource(spiral_settings(designed={"enabled": True}), run_dir=tmp_path, seed=1)  # no sandbox, no designer


class Designer:
    """The designer role's generator: the replies given, one per call, in order."""

    def __init__(self, *replies: str):
        self.replies = list(replies)
        self.prompts: list[list[dict]] = []

    async def generate(self, messages, sampling) -> GeneratedText:
        self.prompts.append(messages)
        return GeneratedText(self.replies.pop(0), "stop")


def fenced(source: str) -> str:
    return f"A game of noughts and crosses.\n```python\n{source}\n```"


class FirstValidMove(ScriptedEngine):
    """Plays the first valid move the prompt lists."""

    def reply_ids(self, prompt: str) -> list[int]:
        return self.text_ids("\\boxed{%s}" % valid_moves(prompt)[0])


def test_a_regeneration_designs_admits_and_plays_a_two_seat_game(sandbox, tmp_path):
    from chat_templates import bpe_tokenizer

    settings = spiral_settings(games=["kuhn_poker"], designed={"enabled": True, "max_attempts": 2})
    designer = Designer(fenced(tic_tac_toe("one_sided")), fenced(tic_tac_toe("honest")))
    source = SpiralSource(settings, run_dir=tmp_path, seed=3, sandbox=sandbox.service, generator=designer)
    result = sandbox.run(source.next_set(0), timeout=300)
    assert [(e.skill, e.slot) for e in result.envs] == [("kuhn_poker", 0), ("designed_0", 1)]
    designed = result.envs[1]
    assert designed.class_name == "TicTacToeEnv" and "class TicTacToeEnv" in designed.source and designed.hint == ""
    assert designed.env_id == "spiral-000000-designed_0" and designed.attempts == 2 and result.attempts == 2
    assert [r.kind.value for r in result.rejections] == ["one_sided"]
    rejected = json.loads((tmp_path / "rejected" / "step_000000" / "slot1_attempt0.json").read_text())
    assert rejected["reason"]["kind"] == "one_sided" and rejected["theme"] in designer.prompts[0][1]["content"]
    assert designer.prompts[0][0]["content"] == TWO_SEAT_SYSTEM
    assert (tmp_path / "envs" / "step_000000" / f"{designed.env_id}.py").read_text() == designed.source

    tokenizer = bpe_tokenizer()
    player = Player(settings, sandbox=sandbox.service, engine=FirstValidMove(tokenizer), tokenizer=tokenizer,
                    chat_format=ChatFormat(tokenizer), seed=3,
                    stop_token_ids=(tokenizer.convert_tokens_to_ids("<|im_end|>"),))
    games = source.step_player(player)
    plays = sandbox.run(games.play(0, [designed], with_hint=False), timeout=120)
    mine = plays.nohint[designed.env_id]
    assert [p.index for p in mine] == [0, 1, 2, 3]
    for g in range(2):
        seat0, seat1 = mine[2 * g], mine[2 * g + 1]
        # the first valid move on both seats: the first mover takes 1, 3, 5, 7 and wins on the diagonal
        assert seat0.episode_return + seat1.episode_return == 0.0 and seat0.end_reason == "terminated"
        assert abs(seat0.episode_return) == 1.0 and seat0.turns + seat1.turns == 7
        assert all("Tic-tac-toe" in p.opening and "Valid moves" in p.opening for p in (seat0, seat1))
        assert all(t.action.startswith("[") for p in (seat0, seat1) for t in p.turn_log)
    figures = games.step_metrics()
    assert figures["spiral/designed_0/games"] == 2.0 and figures["spiral/designed_0/env_error_share"] == 0.0
    assert figures["spiral/designed_0/moves_mean"] == 7.0
    source.observe(0, result.envs, {})
    advantages = source.advantages(designed, mine)
    assert advantages[:2] == [p.episode_return for p in mine[:2]]  # the game's baselines start at 0
    assert {key[0] for key in source.baselines.values} == {designed.env_id}
    assert "spiral/designed_0/seat0/baseline" in source.metrics()
    # the next regeneration's designed game starts its own baselines; the old ones are dropped
    source.designed.generator = Designer(fenced(tic_tac_toe("honest")))
    again = sandbox.run(source.next_set(1), timeout=300)
    assert again.envs[1].env_id == "spiral-000001-designed_0" and source.baselines.values == {}
