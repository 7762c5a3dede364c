"""A game's turn budget during self-play plays (issue 29): the game keeps its own ``max_turns``
default and the run's ``selfplay.max_turns`` caps it, as the released loader does
(``SyntheticGameEnv(respect_game_max_turns=True)``: build with the class's default, fall back to
``max_turns=<budget>`` when that fails, cap at the budget). Through the real sandbox."""

from __future__ import annotations

import textwrap

from spade.envs.runner import EndReason
from spade.selfplay.sources.designer_source import EnvSpec
from spade.selfplay.plays.player import Player, PlayRequest
from spade.selfplay.settings import SelfPlaySettings


def counting_game(signature: str) -> str:
    """A game that never ends by itself before its own ``max_turns`` and says what it was built with."""
    return textwrap.dedent(f'''
        class CountEnv:
            def __init__(self, {signature}):
                self.max_turns = max_turns

            def reset(self, seed=None):
                self.turn = 0
                return f"built with max_turns={{self.max_turns}}; reply with \\\\boxed{{{{anything}}}}", {{}}

            def step(self, action):
                self.turn += 1
                return f"turn {{self.turn}}", 0.1, False, self.turn >= self.max_turns, {{}}
    ''')


def play(sandbox, source: str, budget: int, **settings):
    player = Player(SelfPlaySettings(max_turns=budget, **settings), sandbox=sandbox.service, engine=None, tokenizer=None,
                    chat_format=None, seed=0)
    spec = EnvSpec(env_id="e", slot=0, skill="Optimization", source=source, hint="", class_name="CountEnv",
                   max_turns=budget, generated_step=0)

    async def policy(messages):
        return "\\boxed{wait}"

    return sandbox.run(player._episode(PlayRequest(spec, False, 0), policy, 0))


def test_game_keeps_its_own_smaller_default(sandbox):
    result = play(sandbox, counting_game("max_turns=12"), budget=25)
    assert "built with max_turns=12" in result.messages[0].content
    assert len(result.turns) == 12 and result.end_reason is EndReason.TRUNCATED  # the game's own end


def test_run_budget_caps_a_larger_default(sandbox):
    result = play(sandbox, counting_game("max_turns=40"), budget=25)
    assert "built with max_turns=40" in result.messages[0].content
    assert len(result.turns) == 25 and result.end_reason is EndReason.TURN_BUDGET


def test_class_without_a_default_gets_the_budget(sandbox):
    result = play(sandbox, counting_game("max_turns"), budget=7)
    assert "built with max_turns=7" in result.messages[0].content
    assert len(result.turns) == 7 and result.end_reason is EndReason.TRUNCATED


def test_other_load_errors_are_not_retried(sandbox):
    broken = counting_game("max_turns=12").replace("self.max_turns = max_turns", "raise ValueError('broken')")
    result = play(sandbox, broken, budget=25)
    assert result.end_reason is EndReason.ENV_ERROR and "broken" in result.error.message


def test_fixed_pool_games_are_built_with_the_budget(sandbox, tmp_path):
    """The released fixed-pool adapter builds its games with a forced budget (``make_synthetic_env``
    without ``respect_game_max_turns``); the pool baseline keeps building them with the run's."""
    result = play(sandbox, counting_game("max_turns=12"), budget=25, env_source="fixed_pool",
                  fixed_env_dir=str(tmp_path))
    assert "built with max_turns=25" in result.messages[0].content and len(result.turns) == 25
