"""Admission of designed two-seat games (issue 44) through the real sandbox: the contract's checks,
and the round robin of degenerate policies that rejects a game one seat cannot win (``one_sided``),
that nobody wins (``always_draw``) or that a content-free reply wins (``degenerate_win``), while an
honest TicTacToe is admitted with wins on the rules for both seats."""

from __future__ import annotations

import random

import pytest

from spade.designer.two_seat_prompts import THEMES, draw_theme, two_seat_designer_messages
from spade.envs.protocol import ErrorKind, Stage
from spade.envs.two_seat import action_of, valid_moves
from spade.envs.two_seat_admission import admit_two_seat
from spade.envs.two_seat_probes import SeatProbeSettings, seat_policies
from support.two_seat_games import tic_tac_toe

SETTINGS = SeatProbeSettings(turns=20)


def admitted(sandbox, source: str, settings: SeatProbeSettings = SETTINGS):
    return sandbox.run(admit_two_seat(sandbox.service, f"```python\n{source}\n```", settings), timeout=300)


def test_an_honest_game_is_admitted_with_wins_on_the_rules_for_both_seats(sandbox):
    verdict = admitted(sandbox, tic_tac_toe("honest"))
    assert verdict.admitted, verdict.error
    assert verdict.class_name == "TicTacToeEnv" and "Valid moves: [1]" in (verdict.first_observation or "")
    report = verdict.report
    assert report is not None and not report.budget_exhausted
    pool = len(seat_policies())
    assert len(report.matches) == pool * pool * SETTINGS.seed_count  # every pair, both seats, every seed
    assert all(report.wins_on_rules(seat) for seat in (0, 1))
    assert report.to_json()["verdict"] is None
    assert set(verdict.timings_ms) >= {"load", "smoke", "determinism", "degenerate_probe"}
    # and on other runs' probe seeds too (a copied number can be TicTacToe's strong last cell)
    for seed_base in (1, 7, 11):
        again = admitted(sandbox, tic_tac_toe("honest"), SeatProbeSettings(turns=20, seed_base=seed_base))
        assert again.admitted, (seed_base, again.error)


@pytest.mark.parametrize("variant, kind, stage, words", [
    ("one_sided", ErrorKind.ONE_SIDED, Stage.WINNABILITY, "seat 1 never wins on the rules"),
    ("always_draw", ErrorKind.ALWAYS_DRAW, Stage.WINNABILITY, "no seat wins on the rules"),
    ("degenerate_win", ErrorKind.DEGENERATE_WIN, Stage.DEGENERATE_PROBE, "'boxed_0' of family 'constant'"),
    ("no_player", ErrorKind.BAD_RETURN, Stage.SMOKE, "info['player']"),
])
def test_broken_games_are_rejected_with_a_named_reason(sandbox, variant, kind, stage, words):
    verdict = admitted(sandbox, tic_tac_toe(variant))
    assert not verdict.admitted and verdict.error is not None
    assert (verdict.error.kind, verdict.error.stage) == (kind, stage), verdict.error
    assert words in verdict.error.message


def test_the_contract_is_checked_at_smoke_and_determinism(sandbox):
    no_moves = tic_tac_toe().replace('f"Answer with \\\\boxed{{cell}}.\\nValid moves: {valid}"', 'f"Cells: {valid}"')
    assert no_moves != tic_tac_toe()
    verdict = admitted(sandbox, no_moves)
    assert (verdict.error.kind, verdict.error.stage) == (ErrorKind.BAD_RETURN, Stage.SMOKE)
    assert "Valid moves" in verdict.error.message
    # rewards that are not zero-sum break the contract when the first game ends
    not_zero_sum = tic_tac_toe().replace("rewards[mover], rewards[1 - mover] = 1, -1", "rewards[mover] = 1")
    verdict = admitted(sandbox, not_zero_sum)
    assert verdict.error.kind is ErrorKind.BAD_RETURN and "summing to 0" in verdict.error.message
    # a game that is not a function of its seed: it counts its resets and shows the count
    counting = tic_tac_toe().replace("self.moves = 0\n",
                                     "self.moves = 0\n        self.games = getattr(self, 'games', 0) + 1\n")
    counting = counting.replace('f"Tic-tac-toe. You', 'f"Game {self.games}. Tic-tac-toe. You')
    assert "Game {self.games}" in counting and "self.games = getattr" in counting
    verdict = admitted(sandbox, counting)
    assert (verdict.error.kind, verdict.error.stage) == (ErrorKind.NONDETERMINISTIC_RESET, Stage.DETERMINISM)
    # a game that never ends on its own
    endless = tic_tac_toe().replace("self.board[int(cell) - 1] = \"XO\"[mover]", "pass")
    endless = endless.replace(" or self.moves >= self.max_turns", "")
    verdict = admitted(sandbox, endless)
    assert (verdict.error.kind, verdict.error.stage) == (ErrorKind.NEVER_ENDS, Stage.SMOKE)
    verdict = sandbox.run(admit_two_seat(sandbox.service, "no code here", SETTINGS))
    assert verdict.error.kind is ErrorKind.SYNTAX_ERROR


def test_the_move_format_and_the_valid_moves_line():
    assert action_of("I take the centre. \\boxed{5}") == "[5]"
    assert action_of("\\boxed{\\text{call}}") == "[call]"
    assert valid_moves("Board ...\nValid moves: [1], [bid 3], [pass]") == ("1", "bid 3", "pass")
    assert valid_moves("Available actions: '[a]' '[b]'") == ("a", "b")
    assert valid_moves("no list here [1]") == ()


def test_the_designer_prompt_states_the_contract():
    (system, user) = two_seat_designer_messages(draw_theme(random.Random(0)), max_turns=12)
    assert system["role"] == "system" and "zero-sum" in system["content"]
    text = user["content"]
    assert any(theme in text for theme in THEMES)
    for piece in ('info["player"]', 'info["rewards"]', 'info["invalid_move"]', "Valid moves: [a], [b]",
                  "random.Random(seed)", "max_turns=12", "```python"):
        assert piece in text, piece
