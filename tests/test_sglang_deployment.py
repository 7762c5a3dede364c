"""Placement of colocated SGLang servers and the command line each one is launched with (pure
logic; the launch itself is exercised against a real server process in test_sglang_train.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from spade.rollout.sglang_deployment import (
    DeploymentError,
    RankInfo,
    SGLangDeployment,
    advertised_host,
    plan_servers,
    server_environment,
)
from spade.rollout.sglang_settings import SGLangSection


def world(nodes: int, per_node: int) -> list[RankInfo]:
    return [RankInfo(rank=n * per_node + i, local_rank=i, node=f"node{n}") for n in range(nodes) for i in range(per_node)]


HOSTS = {"node0": "10.0.0.1", "node1": "10.0.0.2"}


def test_one_server_per_gpu_on_one_node():
    plans = plan_servers(world(1, 8), SGLangSection(servers_per_node=8, tp=1), HOSTS)
    assert [p.url for p in plans] == [f"http://10.0.0.1:{30000 + i}" for i in range(8)]
    assert [p.base_gpu for p in plans] == list(range(8))
    assert [p.ipc_ranks for p in plans] == [(i,) for i in range(8)]
    assert {p.owner_rank for p in plans} == {0}


def test_one_tp8_server_per_node_over_two_nodes():
    plans = plan_servers(world(2, 8), SGLangSection(tp=8, ep=8), HOSTS)
    assert [(p.index, p.url, p.owner_rank, p.base_gpu) for p in plans] == [
        (0, "http://10.0.0.1:30000", 0, 0), (1, "http://10.0.0.2:30000", 8, 0)]
    assert plans[0].ipc_ranks == tuple(range(8)) and plans[1].ipc_ranks == tuple(range(8, 16))


def test_tp2_servers_take_consecutive_gpus_fed_by_the_same_gpus_ranks():
    # ranks listed out of order: placement follows (node, local rank), not list order
    ranks = list(reversed(world(1, 8)))
    plans = plan_servers(ranks, SGLangSection(servers_per_node=4, tp=2, port=31000), HOSTS)
    assert [p.port for p in plans] == [31000, 31001, 31002, 31003]
    assert [p.base_gpu for p in plans] == [0, 2, 4, 6]
    assert [p.ipc_ranks for p in plans] == [(0, 1), (2, 3), (4, 5), (6, 7)]


def test_not_enough_gpus_is_a_clear_error():
    with pytest.raises(DeploymentError, match=r"servers_per_node \* tp \* dp = 2 \* 4 \* 1 = 8"):
        plan_servers(world(1, 4), SGLangSection(servers_per_node=2, tp=4), HOSTS)


def test_advertised_host():
    assert advertised_host(SGLangSection()) == "127.0.0.1"
    assert advertised_host(SGLangSection(host="0.0.0.0", advertise_host="gpu-17")) == "gpu-17"
    assert advertised_host(SGLangSection(host="0.0.0.0")) not in ("0.0.0.0", "")


def test_server_command_line(tmp_path: Path):
    settings = SGLangSection(tp=2, ep=2, mem_fraction=0.55, port=32000, server_args={"chunked_prefill_size": 4096,
                                                                                    "enable_metrics": True})
    deployment = SGLangDeployment(settings, model_dir=tmp_path, log_dir=tmp_path, device=torch.device("cpu"),
                                  local_rank=0, python="/usr/bin/python3")
    plan = plan_servers(world(1, 4), dataclasses.replace(settings, servers_per_node=2), HOSTS)[1]
    argv = deployment.server_argv(plan)
    assert argv[:3] == ["/usr/bin/python3", "-m", "sglang.launch_server"]

    def value(flag: str) -> str:
        return argv[argv.index(flag) + 1]

    assert value("--model-path") == str(tmp_path) and value("--tp-size") == "2" and value("--ep-size") == "2"
    assert value("--port") == "32001" and value("--base-gpu-id") == "2" and value("--mem-fraction-static") == "0.55"
    assert "--enable-memory-saver" in argv and "--skip-tokenizer-init" in argv and "--enable-metrics" in argv
    assert value("--chunked-prefill-size") == "4096"

    wrapped = SGLangDeployment(dataclasses.replace(settings, server_command=("python", "my_server.py")),
                               model_dir=tmp_path, log_dir=tmp_path, device=torch.device("cpu"), local_rank=0)
    assert wrapped.server_argv(plan)[:3] == ["python", "my_server.py", "--model-path"]


def test_servers_do_not_inherit_torchrun_worker_variables():
    trainer_env = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "3", "MASTER_ADDR": "10.0.0.1",
                   "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "x", "PATH": "/usr/bin", "HF_HOME": "/hf",
                   "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "1"}
    env = server_environment(SGLangSection(server_env={"NCCL_DEBUG": "INFO"}), base=trainer_env)
    assert not set(env) & {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"}
    assert env["PATH"] == "/usr/bin" and env["HF_HOME"] == "/hf" and env["NCCL_DEBUG"] == "INFO"
    assert env["SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"] == "0"  # /health: liveness, not a generation
