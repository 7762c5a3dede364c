"""``selfplay.rewards.step_timeout_penalty`` (issue 39): the released ``regret_based`` designer reward's
-0.5 for a game whose load, reset or step timed out in a play of its generation step
(``core/utils/delayed_env_rewards.py:336-340``), from the sandbox's timeout through the player and the
delay buffer to the released reward, each part against hand-computed values."""

from __future__ import annotations

import json

import pytest

from spade.config import ConfigError, from_mapping
from spade.selfplay.rewards.advantages import designer_advantages
from spade.selfplay.rewards.delay_buffer import DesignerBuffer
from spade.selfplay.rewards.designer_rewards import DesignerEvidence, ReleasedRegretReward, designer_reward_for, score_released
from spade.selfplay.rewards.reward_settings import RewardSettings
from spade.selfplay.settings import SelfPlaySettings
from spade.selfplay.step import Step
from test_orchestrator import COIN_SOURCE, ScriptedDesigner, engine, make, tokenizer  # noqa: F401  (fixtures)

approx = pytest.approx
LOGIC = "Logical Deduction"
RELEASED = dict(designer_reward="regret_released", step_timeout_penalty=-0.5, failed_hint="hint_return_zero")
# passes admission (seeds 42 and 123), hangs in step() on any other reset seed: every play times out
HANGS_IN_PLAY = COIN_SOURCE.replace(
    "        self.turn += 1\n",
    "        self.turn += 1\n        while self.seed not in (42, 123):\n            pass\n").replace(
    "        self.rng = random.Random(seed)\n", "        self.seed = seed\n        self.rng = random.Random(seed)\n")


def test_settings_default_off_and_bound_to_the_released_reward():
    assert RewardSettings().step_timeout_penalty is None
    assert RewardSettings(**RELEASED).step_timeout_penalty == -0.5
    with pytest.raises(ValueError, match=r"step_timeout_penalty: applies to designer_reward regret_released only"):
        RewardSettings(step_timeout_penalty=-0.5)  # regret_plateau would silently ignore it
    with pytest.raises(ConfigError, match=r"selfplay\.rewards.*step_timeout_penalty: expected a number"):
        from_mapping(SelfPlaySettings, {"rewards": {"designer_reward": "regret_released",
                                                    "step_timeout_penalty": "half"}}, where="selfplay")


def test_penalty_replaces_the_regret_and_is_centred_with_the_set():
    reward = designer_reward_for(RewardSettings(**RELEASED))
    assert reward == ReleasedRegretReward(-0.5)
    # hinted mean 0.75, window mean 0.5 -> 0.25; hinted 1, window 0.25 -> 0.75; a timed-out game -> -0.5
    # whatever its plays say (its regret would be 1 - 0 = 1)
    sets = [DesignerEvidence((1.0, 1.0, 0.0, 1.0), (0.0, 1.0), ((1.0, 0.0),)),
            DesignerEvidence((1.0,), (0.0, 0.0), ((1.0, 0.0),)),
            DesignerEvidence((1.0,), (0.0,), (), step_timeout=True)]
    rewards = score_released(reward, [LOGIC] * 3, sets)
    assert rewards == approx([0.25, 0.75, -0.5])
    mean = (0.25 + 0.75 - 0.5) / 3
    assert designer_advantages(rewards, [LOGIC] * 3, scale=2.0) == approx(
        [2 * (0.25 - mean), 2 * (0.75 - mean), 2 * (-0.5 - mean)])
    # off (spade, and every reward but regret_released): the flag changes nothing
    assert ReleasedRegretReward()(sets[2]) == approx(1.0)


def test_buffer_keeps_a_timed_out_game_without_plays_only_under_the_penalty():
    spade = DesignerBuffer(2, RewardSettings(designer_reward="regret_released", failed_hint="hint_return_zero"))
    assert not spade.takes([], [], step_timeout=True)
    assert spade.takes([], [0.0]) and not DesignerBuffer(2).takes([], [0.0])  # failed_hint drop
    released = DesignerBuffer(2, RewardSettings(**RELEASED))
    assert released.takes([], [], step_timeout=True) and not released.takes([], [])
    released.add(0, "hung", LOGIC, "hung", [], [], step_timeout=True)
    released.add(0, "fine", LOGIC, "fine", [1.0, 1.0], [0.0, 1.0])
    released.record_window_returns(1, "hung", [])  # left out of the window's plays (hung)
    released.record_window_returns(1, "fine", [1.0, 1.0])
    resumed = DesignerBuffer.from_json(json.loads(json.dumps(released.to_json())))
    assert resumed == released and [p.step_timeout for p in resumed.pending] == [True, False]
    out = {r.env_id: r for r in resumed.release(2)}
    assert out["hung"].reward == -0.5 and out["hung"].win == 0.0 and out["hung"].n_window_plays == 0
    assert out["fine"].reward == approx(max(0.0, 1.0 - 3 / 4))


def test_timed_out_game_gets_the_penalty_through_a_real_step(sandbox, engine, tokenizer, tmp_path):  # noqa: F811
    """Two designed games, one hanging in play: its plays time out in the sandbox, are dropped
    (env_faults retry_then_drop), it is left out of step 1, and at step k = 2 its designer sample is
    released with -0.5, centred with the other game's released regret."""
    from spade.selfplay.plays.play_rules import PlayRules

    designer = ScriptedDesigner(engine, tokenizer, [COIN_SOURCE, HANGS_IN_PLAY])
    orch = make(sandbox, designer, tokenizer, tmp_path, None, use_memory=False, g_hint=1,
                rewards=RewardSettings(**RELEASED), plays=PlayRules(env_faults="retry_then_drop"))
    out0 = sandbox.run(orch.run_step(Step(0)), timeout=180)
    coin, hung = (env.env_id for env in orch.envs)
    assert out0.metrics["env/admitted"] == 2 and orch.player.timed_out_envs == {hung}
    pending = {p.env_id: p for p in orch.buffer.pending}
    assert pending[hung].step_timeout and pending[hung].nohint_returns == ()
    assert not pending[coin].step_timeout and len(pending[coin].nohint_returns) == 2
    sandbox.run(orch.run_step(Step(1)), timeout=180)
    pending = {p.env_id: p for p in orch.buffer.pending}
    (_, later), = pending[coin].later_returns
    window = list(pending[coin].nohint_returns) + list(later)
    hint_mean = sum(pending[coin].hint_returns) / len(pending[coin].hint_returns)
    out2 = sandbox.run(orch.run_step(Step(2)), timeout=180)
    rewards = {t.env_id: t.reward for t in out2.designer_samples}
    expected = {coin: max(0.0, hint_mean - sum(window) / len(window)), hung: -0.5}
    assert rewards == approx(expected)
    scale, mean = out2.metrics["designer/advantage_scale"], sum(expected.values()) / 2
    assert {t.env_id: t.advantage for t in out2.designer_samples} == approx(
        {env_id: scale * (r - mean) for env_id, r in expected.items()})
