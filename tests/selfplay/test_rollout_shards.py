"""Rollout shards (``selfplay.rollout_shards``, issue 26): placement, the split of a step's
requests, the settings it is refused with, and a torchrun world of four where one, two and four
shards play the same step.

The torchrun test drives benchmarks/rollout_shards.py's worker: real players, real sandbox
services (one per shard), token-exact conversations and the gloo messages a training run uses;
only the model is simulated (benchmarks/rollout_schedule.py's engine: a reply that depends only on
the request, held for a set latency), because the check is that shards change where plays run and
how long the step takes, never what is played. The speed targets are the benchmark's to show
(docs/performance.md); this test asserts only a margin no loaded machine should erase.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace
from pathlib import Path

import prewarmed
import pytest

from spade.config import ConfigError
from spade.selfplay.plays.player import PlayRequest
from spade.selfplay.plays.rollout_shards import ShardChannel, ShardLayout, ShardServer, split_requests

ROOT = Path(__file__).resolve().parents[2]


def test_shards_sit_one_per_node_of_equal_size():
    assert ShardLayout.of(1, 4).ranks == (0,)
    assert ShardLayout.of(2, 4).ranks == (0, 2)  # torchrun's node-major ranks: each node's local rank 0
    assert ShardLayout.of(4, 4).ranks == (0, 1, 2, 3)
    assert ShardLayout.of(2, 16).ranks == (0, 8)
    layout = ShardLayout.of(2, 4)
    assert [layout.shard_of(r) for r in range(4)] == [0, None, 1, None]
    for shards, world in ((3, 4), (0, 4), (8, 4)):
        with pytest.raises(ConfigError, match=r"selfplay\.rollout_shards.*allowed: a divisor.*\(1, 2, 4\)"):
            ShardLayout.of(shards, world)


def test_requests_split_into_contiguous_blocks_that_rejoin_in_order():
    requests = [PlayRequest(None, False, i) for i in range(10)]  # type: ignore[arg-type]
    blocks = split_requests(requests, 4)
    assert [len(b) for b in blocks] == [3, 3, 2, 2]
    assert [r for block in blocks for r in block] == requests
    assert split_requests(requests[:2], 4) == [requests[:1], requests[1:2], [], []]
    assert split_requests(requests, 1) == [requests]


def test_shards_are_refused_where_they_cannot_work():
    from spade.selfplay.plays.partial_rollout_settings import PartialRolloutSettings
    from spade.selfplay.settings import SelfPlaySettings
    from spade.train_config import from_dict

    with pytest.raises(ConfigError, match=r"selfplay\.rollout_shards.*integer >= 1"):
        SelfPlaySettings(rollout_shards=0)
    with pytest.raises(ConfigError, match=r"selfplay\.rollout_shards.*partial_rollouts"):
        SelfPlaySettings(rollout_shards=2, partial_rollouts=PartialRolloutSettings(enabled=True))
    with pytest.raises(ConfigError, match=r"selfplay\.rollout_shards.*rlve"):
        SelfPlaySettings(rollout_shards=2, env_source="rlve")
    with pytest.raises(ConfigError, match=r"run\.overlap.*rollout_shards"):
        from_dict({"run": {"overlap": 1}, "selfplay": {"rollout_shards": 2}})
    assert from_dict({"selfplay": {"rollout_shards": 2}}).selfplay.rollout_shards == 2
    assert replace(SelfPlaySettings(), rollout_shards=4).rollout_shards == 4


def test_rank_0_does_not_serve_as_a_remote_shard():
    with pytest.raises(ValueError, match="not a shard other than rank 0"):
        ShardServer(None, ShardChannel(ShardLayout.of(2, 4), 0, None))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not a shard other than rank 0"):
        ShardServer(None, ShardChannel(ShardLayout.of(2, 4), 1, None))  # type: ignore[arg-type]


def test_one_two_and_four_shards_play_the_same_step(tmp_path):
    """``torchrun --nproc_per_node 4``: 8 games x 8 plays, 3 turns each, 4 episodes at a time per
    shard. Every shard count gives the same plays (env, index, return, turns, tokens and loss
    mask); each shard plays its block (64 / shards plays); the step takes less wall time and rank
    0 less CPU as the shards grow."""
    out = tmp_path / "figures.json"
    proc = subprocess.run([prewarmed.python(), str(ROOT / "benchmarks" / "rollout_shards.py"), "--quick", "--sigma",
                           "0.25", "--timeout", "400", "--json", str(out)], cwd=ROOT, capture_output=True,
                          text=True, timeout=450)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    rows = {row["shards"]: row for row in json.loads(out.read_text())["rows"]}
    assert sorted(rows) == [1, 2, 4]
    for shards, row in rows.items():
        assert row["plays"] == [64] and row["same_plays"], (shards, row)
    for shards in (2, 4):
        (metrics,) = rows[shards]["shard_metrics"]
        assert metrics["rollout/shards"] == shards and metrics["rollout/shard_rounds"] == 1
        assert metrics["rollout/shard_plays_max"] == metrics["rollout/shard_plays_min"] == 64 // shards
    assert rows[2]["speedup"] > 1.3 and rows[4]["speedup"] > 2.0, proc.stdout
    assert rows[4]["cpu_ratio"] < 0.6, proc.stdout  # about 1/4 measured (docs/performance.md)
