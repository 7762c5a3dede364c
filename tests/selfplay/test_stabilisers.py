"""The GRPO stabilisers of the self-play step (``selfplay.plays.drop_equal_return_groups``,
``refill_equal_groups``, ``mask_truncated``) and the ``env_source`` switch, on a fixed pool played
by the real sandbox and a real tiny model (the engine and tokenizer fixtures of test_orchestrator).

Expectations are computed from what the step itself wrote (``RUN/trajectories/step_N.jsonl``: every
play's return), never from the code under test.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spade.config import ConfigError
from spade.selfplay.orchestrator import TRUNCATED_ENDS
from spade.selfplay.sources.fixed_pool import FixedPool
from spade.selfplay.settings import PlayRules, SelfPlaySettings
from spade.selfplay.step import Step
from spade.selfplay.plays.trajectory_log import step_file
from test_orchestrator import COIN_SOURCE, engine, make, tokenizer  # noqa: F401  (fixtures)

ALWAYS_WIN = '''
class AlwaysWinEnv:
    def reset(self, seed=None):
        return "Say anything at all.", {}

    def step(self, action):
        return "done", 1.0, True, False, {}
'''
NEVER_ENDS = '''
class NeverEndsEnv:
    def __init__(self, max_turns=2):
        self.max_turns = max_turns

    def reset(self, seed=None):
        return "Keep talking.", {}

    def step(self, action):
        return "go on", 0.0, False, False, {}
'''


def _pool(tmp_path: Path, **sources: str) -> Path:
    pool = tmp_path / "pool"
    pool.mkdir()
    for name, source in sources.items():
        (pool / f"{name}.py").write_text(source)
    return pool


def _returns(run_dir: Path, step: int) -> dict[str, list[float]]:
    lines = [json.loads(line) for line in step_file(run_dir, step).read_text().splitlines()]
    return {line["env_id"]: line["nohint_returns"] for line in lines if line["kind"] == "env_returns"}


def _flat(returns: list[float]) -> bool:
    return all(r == returns[0] for r in returns)


def test_settings_validation_names_the_keys():
    assert SelfPlaySettings(designer_enabled=False, fixed_env_dir="x").env_source == "fixed_pool"
    pool = SelfPlaySettings(env_source="fixed_pool", fixed_env_dir="x")
    assert pool.designer_enabled is False
    assert SelfPlaySettings().env_source == "designer" and SelfPlaySettings().designer_enabled
    with pytest.raises(ConfigError, match=r"selfplay\.env_source.*designer, fixed_pool, rlve"):
        SelfPlaySettings(env_source="static")
    with pytest.raises(ConfigError, match=r"selfplay\.fixed_env_dir"):
        SelfPlaySettings(env_source="fixed_pool")
    with pytest.raises(ConfigError, match=r"selfplay\.plays\.refill_equal_groups.*drop_equal_return_groups"):
        PlayRules(refill_equal_groups=1)
    with pytest.raises(ConfigError, match=r"selfplay\.plays\.refill_equal_groups"):
        PlayRules(drop_equal_return_groups=True, refill_equal_groups=-1)


def test_fixed_pool_source_is_chosen(sandbox, engine, tokenizer, tmp_path):
    pool = _pool(tmp_path, win=ALWAYS_WIN)
    orch = make(sandbox, engine, tokenizer, tmp_path / "run", None, env_source="fixed_pool", fixed_env_dir=str(pool))
    assert isinstance(orch.source, FixedPool)
    out = sandbox.run(orch.run_step(Step(0)), timeout=120)
    assert out.metrics["env/admitted"] == 1 and "agent/dropped_equal_groups" not in out.metrics
    # off by default: the all-equal group still gives (zero-advantage) samples
    assert len(out.agent_samples) == 2 and all(t.advantage == 0.0 for t in out.agent_samples)
    assert "env_source" in orch.state_dict()


def test_drop_equal_return_groups(sandbox, engine, tokenizer, tmp_path):
    pool = _pool(tmp_path, win=ALWAYS_WIN, coin=COIN_SOURCE)
    run_dir = tmp_path / "run"
    orch = make(sandbox, engine, tokenizer, run_dir, None, env_source="fixed_pool", fixed_env_dir=str(pool),
                g_nohint=4, plays=PlayRules(drop_equal_return_groups=True))
    out = sandbox.run(orch.run_step(Step(0)), timeout=180)
    returns = _returns(run_dir, 0)
    assert returns["fixed-win"] == [1.0] * 4
    flat = {env_id for env_id, r in returns.items() if _flat(r)}
    assert out.metrics["agent/dropped_equal_groups"] == len(flat)
    assert {t.env_id for t in out.agent_samples} == set(returns) - flat
    assert all(t.advantage != 0.0 for t in out.agent_samples)


def test_refill_plays_more_of_the_equal_groups_only(sandbox, engine, tokenizer, tmp_path):
    pool = _pool(tmp_path, win=ALWAYS_WIN, coin=COIN_SOURCE)
    run_dir = tmp_path / "run"
    orch = make(sandbox, engine, tokenizer, run_dir, None, env_source="fixed_pool", fixed_env_dir=str(pool),
                g_nohint=2, plays=PlayRules(drop_equal_return_groups=True, refill_equal_groups=2))
    out = sandbox.run(orch.run_step(Step(0)), timeout=180)
    returns = _returns(run_dir, 0)
    assert returns["fixed-win"] == [1.0] * 6  # g_nohint plays, then two refill rounds of g_nohint
    coin = returns["fixed-coin"]
    # a group gets another round exactly while its returns so far are all equal (at most two rounds)
    assert len(coin) in (2, 4, 6)
    for end in (2, 4):
        assert (len(coin) > end) == _flat(coin[:end]) or len(coin) < end
    assert out.metrics["agent/episodes"] == len(coin) + 6
    assert out.metrics["agent/dropped_equal_groups"] == 1 + _flat(coin)
    indices = [t.index for t in out.agent_samples if t.env_id == "fixed-coin"]
    assert len(indices) == len(set(indices))  # refill plays are new plays, not repeats


def test_mask_truncated(sandbox, engine, tokenizer, tmp_path):
    pool = _pool(tmp_path, endless=NEVER_ENDS)
    plain = make(sandbox, engine, tokenizer, tmp_path / "a", None, env_source="fixed_pool", fixed_env_dir=str(pool))
    unmasked = sandbox.run(plain.run_step(Step(0)), timeout=180)
    assert len(unmasked.agent_samples) == 2  # every play generated something and is trainable
    masked_orch = make(sandbox, engine, tokenizer, tmp_path / "b", None, env_source="fixed_pool",
                       fixed_env_dir=str(pool), plays=PlayRules(mask_truncated=True))
    masked = sandbox.run(masked_orch.run_step(Step(0)), timeout=180)
    episodes = [json.loads(line) for line in step_file(tmp_path / "b", 0).read_text().splitlines()]
    ends = [e["end_reason"] for e in episodes if e.get("kind") == "episode"]
    assert ends and all(end in TRUNCATED_ENDS for end in ends)
    assert masked.agent_samples == [] and masked.metrics["agent/masked_truncated"] == 2
    assert masked.metrics["agent/episodes"] == 2  # still played and counted in the returns


def test_no_corpus_prompt_is_validated():
    with pytest.raises(ConfigError, match=r"selfplay\.no_corpus_prompt.*concepts, corpus_without_document"):
        SelfPlaySettings(no_corpus_prompt="none")
