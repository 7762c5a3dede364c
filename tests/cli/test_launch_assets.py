"""The scale-out assets (issue 5): launch scripts, 8-GPU / multi-node recipes and the Dockerfile.

No GPU and no Docker daemon needed: the recipes load with the current config loader, the shell
scripts parse, and the Dockerfile pins its base image and megatron-core as requirements.txt does.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest

from spade.train_config import load_train_config

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "examples" / "recipes"
SCALE_OUT_RECIPES = sorted([*RECIPES.glob("*_8gpu.yaml"), *RECIPES.glob("*_multinode.yaml")])
LAUNCH_SCRIPTS = sorted((ROOT / "examples" / "launch").glob("*.sh"))
DOCKERFILE = ROOT / "Dockerfile"


def _pinned(package: str) -> str:
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        name, sep, version = line.strip().partition("==")
        if sep and name.lower() == package:
            return version
    raise AssertionError(f"{package} is not pinned in requirements.txt")


def test_the_assets_exist():
    names = {p.name for p in SCALE_OUT_RECIPES}
    assert {"qwen3_4b_games_8gpu.yaml", "qwen3_8b_games_8gpu.yaml", "qwen3_30b_a3b_games_8gpu.yaml",
            "qwen3_4b_games_multinode.yaml", "qwen3_8b_games_multinode.yaml",
            "qwen3_30b_a3b_games_multinode.yaml"} <= names
    assert {"single_node.sh", "multi_node.sh", "docker_run.sh"} <= {p.name for p in LAUNCH_SCRIPTS}
    assert DOCKERFILE.is_file() and (ROOT / ".dockerignore").is_file()
    assert (ROOT / "docs" / "scale_out.md").is_file()


@pytest.mark.parametrize("path", SCALE_OUT_RECIPES, ids=lambda p: p.name)
def test_scale_out_recipe_loads(path):
    config = load_train_config(path, [])
    assert config.engine.kind == "sglang" and config.engine.sglang.colocated
    # the node's 8 GPUs carry the servers: servers_per_node * tp * dp == 8
    sglang = config.engine.sglang
    assert sglang.servers_per_node * sglang.tp * sglang.dp == 8
    if "multinode" in path.name:
        assert sglang.host == "0.0.0.0"  # other nodes' orchestrator traffic reaches the servers
    assert config.parallel.sequence_parallel
    # the paper's batch sizes come through from games_base.yaml (the RLVE baseline: RLVE's released batch)
    expected = (16, 16, 0) if config.selfplay.env_source == "rlve" else (24, 16, 16)
    assert (config.selfplay.envs_per_set, config.selfplay.g_nohint, config.selfplay.g_hint) == expected


def test_scale_out_layouts():
    for name in ("qwen3_4b_games_8gpu.yaml", "qwen3_8b_games_8gpu.yaml", "qwen3_4b_games_multinode.yaml",
                 "qwen3_8b_games_multinode.yaml"):
        config = load_train_config(RECIPES / name)
        assert (config.parallel.tp, config.parallel.pp, config.parallel.ep) == (2, 1, 1)
        assert config.model.recompute == "full"  # the paper's 4B and 8B runs
    for name in ("qwen3_30b_a3b_games_8gpu.yaml", "qwen3_30b_a3b_games_multinode.yaml"):
        parallel = load_train_config(RECIPES / name).parallel
        assert (parallel.tp, parallel.ep, parallel.etp) == (4, 8, 1)
    assert load_train_config(RECIPES / "qwen3_8b_games_8gpu.yaml").loss.kl_coef == 0.005


@pytest.mark.parametrize("path", LAUNCH_SCRIPTS, ids=lambda p: p.name)
def test_launch_script_parses(path):
    result = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    text = path.read_text()
    assert text.startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in text


@pytest.mark.parametrize("path", LAUNCH_SCRIPTS, ids=lambda p: p.name)
def test_launch_script_prints_usage(path):
    result = subprocess.run(["bash", str(path), "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "Variables" in result.stdout


def test_multi_node_script_refuses_without_rendezvous(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    result = subprocess.run(["bash", str(ROOT / "examples" / "launch" / "multi_node.sh")],
                            capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 2
    assert "NNODES" in result.stderr and "MASTER_ADDR" in result.stderr


def test_dockerfile_pins_base_image_and_megatron_core():
    text = DOCKERFILE.read_text()
    base = re.search(r"^ARG BASE_IMAGE=(\S+)$", text, re.M)
    froms = re.findall(r"^FROM\s+(\S+)", text, re.M)
    assert froms, "no FROM line"
    stages = set(re.findall(r"^FROM\s+\S+\s+AS\s+(\S+)", text, re.M | re.I))
    # a stage built on an earlier stage (FROM base AS te) names no image
    images = [base.group(1) if f == "${BASE_IMAGE}" and base else f for f in froms if f not in stages]
    assert images, "no FROM line names an image"
    for image in images:
        name, _, tag = image.rpartition(":")
        assert name and tag and "/" not in tag, f"base image {image!r} is not pinned by tag"
        assert tag != "latest", f"base image {image!r} uses latest"
    version = _pinned("megatron-core")
    arg = re.search(r"^ARG MEGATRON_CORE_VERSION=(\S+)$", text, re.M)
    assert f"megatron-core=={version}" in text or (arg and arg.group(1) == version
                                                    and '"megatron-core==${MEGATRON_CORE_VERSION}"' in text)
    # the image's CUDA torch stays: torch is filtered out of the pinned requirements
    assert "--no-deps" in text and re.search(r"grep -vE '\^\(torch\|", text)
    assert "bubblewrap" in text


# (a baseline named for another size varies that size's recipe: tests/test_ablation_recipes.py)
ABLATIONS = sorted(p for p in [*RECIPES.glob("ablation_*.yaml"), *RECIPES.glob("baseline_*.yaml")]
                   if "qwen3_4b" not in p.name and "qwen3_8b" not in p.name)


@pytest.mark.parametrize("path", ABLATIONS, ids=lambda p: p.name)
def test_ablations_run_on_the_engine_and_layout_of_the_run_they_vary(path):
    """The paper's ablations and baselines are 30B-A3B runs on one 8-GPU node: each must differ
    from that recipe only in its own switches, never in the engine or the parallel layout."""
    reference = load_train_config(RECIPES / "qwen3_30b_a3b_games_8gpu.yaml", [])
    config = load_train_config(path, [])
    assert config.engine == reference.engine and config.parallel == reference.parallel
    assert config.model == reference.model and config.optimizer == reference.optimizer
    changed = {name for name in ("selfplay", "loss", "run", "corpus", "sandbox")
               if getattr(config, name) != getattr(reference, name)}
    assert changed == {"selfplay"}, f"{path.name} changes {sorted(changed)}"


# ------------------------------------------------------------------ what the scripts launch

RECORDER = "#!/bin/sh\nprintf '%s\\n' \"$@\" > \"$RECORD\"\n"  # a stand-in torchrun / docker: its argv, one a line
# a stand-in python: `-m torch.distributed.run ...` (the scripts' own torchrun) is recorded as
# torchrun's argv and starts nothing; anything else (the scripts' `spade train --check`) runs for real
PYTHON_RECORDER = f"""#!/bin/sh
if [ "$1" = "-m" ] && [ "$2" = "torch.distributed.run" ]; then
  shift 2; printf '%s\\n' "$@" > "$RECORD"; exit 0
fi
exec {sys.executable} "$@"
"""


def _launch(tmp_path: Path, script: str, args: list[str], **env: str) -> list[str]:
    """Run ``examples/launch/<script>`` with stand-ins for torchrun (PATH's and the python's own,
    ``python -m torch.distributed.run``) and docker; the argv torchrun or docker was given."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in ("torchrun", "docker"):
        (bin_dir / name).write_text(RECORDER)
        (bin_dir / name).chmod(0o755)
    python = bin_dir / "python"
    python.write_text(PYTHON_RECORDER)
    python.chmod(0o755)
    record = tmp_path / "argv"
    environment = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "RECORD": str(record),
                   "PYTHON": str(python), **env}
    result = subprocess.run(["bash", str(ROOT / "examples" / "launch" / script), *args], capture_output=True,
                            text=True, env=environment, timeout=120)
    assert result.returncode == 0, result.stderr
    return record.read_text().splitlines()


def _spade_train(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The ``-m spade train ...`` part of a torchrun command line, parsed by spade's own parser."""
    from spade.cli import build_parser

    start = argv.index("-m")
    assert argv[start + 1:start + 3] == ["spade", "train"], argv
    return build_parser().parse_args(argv[start + 2:]), argv[:start]


def _model_dir(tmp_path: Path) -> str:
    """What the scripts' ``spade train --check`` reads of a model directory: its config.json and a
    chat template (the hybrid Qwen3 one, which every thinking setting accepts). No weights."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "chat_template.jinja").write_text((ROOT / "tests" / "fixtures" / "qwen3_hybrid.jinja").read_text())
    return str(model)


def test_single_node_script_runs_spade_train_under_torchrun(tmp_path):
    recipe = "examples/recipes/qwen3_8b_games_8gpu.yaml"
    model = _model_dir(tmp_path)
    argv = _launch(tmp_path, "single_node.sh", [recipe, "runs/x", "run.steps=3"], HF_DIR=model, MASTER_PORT="29611")
    args, launcher = _spade_train(argv)
    assert launcher == ["--nnodes", "1", "--nproc_per_node", "8", "--rdzv_backend", "c10d",
                        "--rdzv_endpoint", "localhost:29611"]
    assert (args.config, args.run_dir, args.overrides) == (recipe, "runs/x", ["run.steps=3", f"model.hf_dir={model}"])
    config = load_train_config(ROOT / args.config, args.overrides)
    assert config.run.steps == 3 and config.model.hf_dir == model


def test_single_node_script_stops_before_torchrun_without_the_model(tmp_path):
    """The scripts' preflight fails on the login shell, in seconds, before any rank starts."""
    bin_dir = tmp_path / "bin"
    with pytest.raises(AssertionError, match="model.hf_dir: .*no config.json"):
        _launch(tmp_path, "single_node.sh", ["examples/recipes/qwen3_8b_games_8gpu.yaml", "runs/x"],
                HF_DIR=str(tmp_path / "absent"))
    assert not (tmp_path / "argv").exists() and (bin_dir / "torchrun").exists()


def test_multi_node_script_runs_spade_train_with_the_rendezvous(tmp_path):
    model_override = f"model.hf_dir={_model_dir(tmp_path)}"
    argv = _launch(tmp_path, "multi_node.sh", ["examples/recipes/qwen3_4b_games_multinode.yaml", "/shared/run",
                                               model_override],
                   NNODES="2", NODE_RANK="1", MASTER_ADDR="10.0.0.1", NPROC="4")
    args, launcher = _spade_train(argv)
    assert launcher == ["--nnodes", "2", "--node_rank", "1", "--nproc_per_node", "4",
                        "--rdzv_id", "spade-qwen3_4b_games_multinode", "--rdzv_backend", "c10d",
                        "--rdzv_endpoint", "10.0.0.1:29500"]
    assert (args.config, args.run_dir, args.overrides) == ("examples/recipes/qwen3_4b_games_multinode.yaml",
                                                           "/shared/run", [model_override])


def test_docker_script_runs_the_single_node_script_in_the_image(tmp_path):
    argv = _launch(tmp_path, "docker_run.sh", ["single", "examples/recipes/qwen3_4b_games_8gpu.yaml", "runs/y"],
                   IMAGE="spade:test", MODELS_DIR=str(tmp_path / "models"), RUNS_DIR=str(tmp_path / "runs"))
    image = argv.index("spade:test")
    assert argv[0] == "run" and argv[image + 1:] == ["examples/launch/single_node.sh",
                                                     "examples/recipes/qwen3_4b_games_8gpu.yaml", "runs/y"]
    flags = argv[1:image]
    assert flags[flags.index("--gpus") + 1] == "all" and "--ipc=host" in flags
    mounts = [flags[i + 1] for i, flag in enumerate(flags) if flag == "-v"]
    assert mounts == [f"{tmp_path / 'models'}:/workspace/spade/models:ro", f"{tmp_path / 'runs'}:/workspace/spade/runs"]
