"""``spade train`` with ``selfplay.rollout_shards: 2`` under ``torchrun --nproc_per_node 2``: each
rank is a shard (two one-process "nodes"), with its own sandbox service and its own engine (the hf
engine in each rank, or its block of the SGLang servers), and the run equals the single-process
run of the same config and seed (test_train_loop's comparison: play metrics exactly, ``train/``
within its tolerance, the final weights within ``PARAM_TOL``). Equality is the point: a play's
seeds do not depend on the shard that plays it, and rank 1's engine serves every step from the
weights just published (a stale engine would change the step-2 returns and the policy lag).

The SGLang case runs test_train_loop's stand-in servers (SGLang needs a GPU): two servers, one per
shard, each reached only by its shard; rank 0's engine still syncs the weights of both.
"""

from __future__ import annotations

from test_train_loop import (assert_same_metrics, assert_same_weights, graded_config, graded_single_run,  # noqa: F401
                             metrics, run_torchrun_spade, sglang_overrides, tiny_hf, train_config,
                             without_engine_keys)

SHARD_KEYS = ("rollout/shards", "rollout/shard_rounds", "rollout/shard_plays_max", "rollout/shard_plays_min",
              "time/shard_wait_s", "time/shard_play_max_s", "time/shard_play_min_s")


def split_shard_keys(records: list[dict]) -> tuple[list[dict], list[dict]]:
    """(the records without the shard figures, the shard figures of each)."""
    return ([{k: v for k, v in r.items() if k not in SHARD_KEYS} for r in records],
            [{k: r[k] for k in SHARD_KEYS} for r in records])


def assert_two_shards_of_two_plays(shard_figures: list[dict]) -> None:
    for figures in shard_figures:  # 2 envs x 2 plays a step: two plays on each rank, one round
        assert figures["rollout/shards"] == 2 and figures["rollout/shard_rounds"] == 1
        assert figures["rollout/shard_plays_max"] == figures["rollout/shard_plays_min"] == 2


def test_two_hf_shards_match_the_single_process_run(graded_single_run, graded_config, tmp_path):
    run = tmp_path / "run"
    run_torchrun_spade("--config", str(graded_config), "--run-dir", str(run), "selfplay.rollout_shards=2")
    records, shard_figures = split_shard_keys(metrics(run))
    assert_two_shards_of_two_plays(shard_figures)
    # engine/generated_tokens counts both ranks' engines: equal to the one engine's
    assert_same_metrics(metrics(graded_single_run), records)
    assert_same_weights(graded_single_run, run)


def test_two_sglang_shards_match_the_single_process_run(graded_single_run, graded_config, tmp_path):
    run = tmp_path / "run"
    run_torchrun_spade("--config", str(graded_config), "--run-dir", str(run), "selfplay.rollout_shards=2",
                       *sglang_overrides(servers_per_node=2))
    records, shard_figures = split_shard_keys(metrics(run))
    assert_two_shards_of_two_plays(shard_figures)
    assert_same_metrics(metrics(graded_single_run), without_engine_keys(records))
    assert_same_weights(graded_single_run, run)
    logs = [(run / "logs" / f"sglang-server-{i}.log").read_text() for i in (0, 1)]
    assert all("POST /generate -> 200" in log for log in logs), "a shard's server served no rollout"
