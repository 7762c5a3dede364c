"""tools/device_check.sh on the CPU: the GPU check's stage list runs end to end with tiny shapes
(the code paths the GPU machine runs), so the script is not first run on borrowed minutes.

The whole list runs once in a subprocess under a hard timeout, in ``.venv-device`` (``make
device-mirror``: the GPU machine's packages at its versions, nothing it lacks) with the carried
wheels installed by the script itself, as on the machine; every stage must end with a verdict:
``pass``, or ``skipped`` with a reason where the figure only exists on a GPU (CUDA-IPC,
time-slicing, the GPU tests). ``$OUT/device_check.jsonl`` must hold one well-formed record per
stage in plan order and a closing summary, ``$OUT/device_check.log`` the whole output. The budget
and ``ONLY=`` are checked on cheap stages in the project's own venv.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import prewarmed
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

from device_check import PLAN, STAGE_NAMES  # noqa: E402  (tools/ is not a package)

RECORD_KEYS = {"stage", "verdict", "seconds", "reason", "figures", "device", "hardware", "kind"}
MIRROR = ROOT / ".venv-device"  # make device-mirror
# stages whose figure needs a GPU, and a word their reason must give
SKIPPED_ON_CPU = {"ipc": "CUDA-IPC needs a CUDA GPU", "timeslice": "needs CUDA", "gpu_tests": "need CUDA",
                  "routing_replay": "needs CUDA"}
FIGURES = {  # keys each stage must report
    "matmul": {"bf16_matmul_tflops", "device_copy_gb_s"},
    "timeslice": {"alone_ms", "with_spinner_ms", "slowdown"},
    "ipc": {"bucket_mib", "checksums_equal", "receiver_copy_gb_s"},
    "parity": {"megatron_bf16_mean_abs", "transformers_bf16_mean_abs", "ratio_mean"},
    "env": {"torch", "packages", "absent", "import_failures", "missing_imports"},
    "offload": {"moved_gib", "offload_s_1", "onload_s_1", "exact_restore"},
    "hf_engine": {"batch8_tokens_per_s", "batch32_tokens_per_s", "shared_prefix_tokens_per_s",
                  "shared_prefix_tokens_saved"},
    "train_step": {"tokens_per_s", "achieved_tflops", "step_s", "recompute", "core_attention"},
    "routing_replay": {"tests", "skipped", "failures", "errors"},
    "gpu_tests": {"tests", "skipped", "failures", "errors"},
}


def run_check(out: Path, timeout: float, device: str = "cpu", python: str = "", **env: str
              ) -> tuple[subprocess.CompletedProcess, list[dict]]:
    environment = {k: v for k, v in os.environ.items() if k not in ("ONLY", "BUDGET_S", "DEVICE", "PYTHONPATH")}
    environment.update({"PYTHON": python or prewarmed.python(), "OUT": str(out),
                        "DEVICE_WHEELS": str(out / "no-wheels"), "DEVICE_SITE": str(out / "site"), **env})
    proc = subprocess.run(["bash", "tools/device_check.sh", "--device", device], cwd=ROOT, env=environment,
                          capture_output=True, text=True, timeout=timeout)
    jsonl = out / "device_check.jsonl"
    records = [json.loads(line) for line in jsonl.read_text().splitlines()] if jsonl.exists() else []
    return proc, records


def check_records(records: list[dict], stages: list[str]) -> dict[str, dict]:
    assert [r["stage"] for r in records] == stages + ["summary"]
    for record in records:
        assert set(record) == RECORD_KEYS, record
        assert isinstance(record["seconds"], (int, float)) and record["seconds"] >= 0
        assert record["device"] in ("cpu", "cuda")
    assert [r["kind"] for r in records] == ["stage"] * len(stages) + ["summary"]
    return {r["stage"]: r for r in records[:-1]}


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_every_stage_runs_on_cpu_in_the_machine_mirror_and_reports_a_verdict(tmp_path):
    assert (MIRROR / ".installed").exists(), "the GPU machine's CPU mirror is missing: run `make device-mirror`"
    proc, records = run_check(tmp_path, timeout=360, python=str(MIRROR / "bin" / "python"),
                              DEVICE_WHEELS=str(MIRROR / "wheels"))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    by_stage = check_records(records, list(STAGE_NAMES))
    # every carried wheel was installed by the script and imports beside the others
    carried = by_stage["env"]["figures"]["carried_wheels"].split()
    assert len(carried) == len(list((MIRROR / "wheels").glob("*.whl"))) and carried, carried
    assert all(note.endswith("(carried)") for note in carried), carried
    assert by_stage["env"]["figures"]["missing_imports"] == {}
    assert by_stage["env"]["figures"]["packages"]["transformers"] == "5.19.0"  # spade's pin, carried
    assert records[0]["hardware"].startswith("CPU: ") and len({r["hardware"] for r in records}) == 1
    log = (tmp_path / "device_check.log").read_text()  # the whole output, each stage's lines too
    assert "device_check.sh: python" in log and "== summary" in log and "[gpu_tests]" in log
    for name, record in by_stage.items():
        if name in SKIPPED_ON_CPU:
            assert record["verdict"] == "skipped", record
            assert SKIPPED_ON_CPU[name] in record["reason"], record
        else:
            assert record["verdict"] == "pass", record
        assert FIGURES[name] <= set(record["figures"]), (name, record["figures"])
        assert f"== {name}: {record['verdict'].upper()} in" in proc.stdout
    assert by_stage["env"]["figures"]["import_failures"] == {}
    assert by_stage["env"]["figures"]["torch_api_missing"] == []
    assert by_stage["env"]["figures"]["torch_api_checked"] > 50
    assert by_stage["ipc"]["figures"]["checksums_equal"] is True
    assert by_stage["offload"]["figures"]["exact_restore"] is True
    assert by_stage["offload"]["figures"]["moved_gib"] > 0
    # 16 rows after a 20-token common prefix: the prefix is computed once, 15 x 20 tokens saved
    assert by_stage["hf_engine"]["figures"]["shared_prefix_tokens_saved"] == 15 * 20
    train = by_stage["train_step"]["figures"]
    assert isinstance(train["estimate_gib"], float)  # spade.training.memory_plan's estimate, beside the peak
    assert train["tokens_per_s"] == pytest.approx(32 * 4 / train["step_s"], rel=0.05)  # step_s is rounded
    assert train["core_attention"] == "sdpa"  # the trainer's default without Transformer Engine
    gpu_tests = by_stage["gpu_tests"]["figures"]
    assert gpu_tests["tests"] > 0 and gpu_tests["skipped"] == gpu_tests["tests"]
    # the routing-replay GPU test runs in its own stage only
    assert "tests/test_gpu_routing_replay.py" not in gpu_tests["files"]
    assert by_stage["routing_replay"]["figures"]["tests"] > 0
    assert records[-1]["figures"]["counts"] == {"pass": 6, "fail": 0, "skipped": 4, "timeout": 0, "not run": 0}


def test_only_runs_the_chosen_stages_and_a_spent_budget_leaves_the_rest_not_run(tmp_path):
    matmul, timeslice = (next(p for p in PLAN if p.name == n) for n in ("matmul", "timeslice"))
    budget = matmul.min_s + 1  # matmul may start; after it less than timeslice's minimum is left
    assert budget < timeslice.min_s
    proc, records = run_check(tmp_path, timeout=120, ONLY="timeslice,matmul", BUDGET_S=str(budget))
    by_stage = check_records(records, ["matmul", "timeslice"])  # plan order, whatever ONLY's order
    assert by_stage["matmul"]["verdict"] in ("pass", "timeout")  # a loaded machine may need longer
    assert by_stage["timeslice"]["verdict"] == "not run"
    assert "budget" in by_stage["timeslice"]["reason"]
    assert "== timeslice: NOT RUN" in proc.stdout
    assert records[-1]["figures"]["counts"]["not run"] == 1
    assert proc.returncode == 1  # a stage that did not run fails the check


def test_a_failing_stage_does_not_stop_the_next(tmp_path):
    """Asked for CUDA on a machine without it, each stage fails with the error, and every chosen
    stage still runs."""
    # no visible device: the same on a CPU box and on a GPU machine
    proc, records = run_check(tmp_path, timeout=120, device="cuda", ONLY="matmul,timeslice", CUDA_VISIBLE_DEVICES="")
    by_stage = check_records(records, ["matmul", "timeslice"])
    for record in by_stage.values():
        assert record["verdict"] == "fail" and record["seconds"] > 0
        assert "CUDA" in record["reason"] or "cuda" in record["reason"], record["reason"]
    assert records[-1]["figures"]["counts"]["fail"] == 2 and proc.returncode == 1
    log = (tmp_path / "device_check.log").read_text()
    assert log.count("Traceback (most recent call last)") >= 2  # each stage's, kept in the log


def test_an_unknown_stage_in_only_is_refused_with_the_stage_names(tmp_path):
    proc, records = run_check(tmp_path, timeout=60, ONLY="matmul,mfu")
    assert proc.returncode != 0 and records == []
    log = (tmp_path / "device_check.log").read_text()  # with OUT set, stderr goes to the log too
    for output in (proc.stdout, log):
        assert "unknown stage(s) in ONLY/--only: mfu" in output
        assert ", ".join(STAGE_NAMES) in output


def test_the_torch_api_check_reports_what_this_torch_lacks():
    """The env stage's check of spade's torch API on the machine's torch (2.11 there): names
    this torch has resolve, made-up ones are reported, submodules are imported on the way."""
    import device_stages

    chains = device_stages.torch_api_chains()
    assert {"torch.cuda.ipc_collect", "torch.UntypedStorage", "torch.multiprocessing"} <= set(chains)
    assert "torch.autograd.function.BackwardCFunction" in chains  # from `from torch.x import y`
    made_up = ["torch.cuda.no_such_function", "torch.nn.attention.no_such_module.f"]
    assert device_stages.unresolved_torch_api(["torch.distributed.checkpoint.FileSystemReader", *made_up]) == made_up


def test_the_gpu_shapes_are_models_spade_reads_and_one_512_mib_bucket():
    """What only the GPU run builds, checked here without building it: every model shape reads
    as a spec of its architecture, and the IPC tensors pack into exactly one 512 MiB bucket
    (on the meta device: no memory)."""
    import torch

    import device_stages
    import gpu_mfu
    from spade.models import read_model_spec
    from spade.rollout.weight_buckets import pack_buckets

    shapes = device_stages.Shapes.for_device("cuda")
    for config, layers, hidden in ((shapes.parity_config, 8, 1024), (shapes.offload_config, 28, 2048),
                                   (shapes.engine_config, 28, 1024), (gpu_mfu.QWEN3_4B, 36, 2560)):
        spec = read_model_spec(config)
        assert (spec.num_layers, spec.hidden_size, spec.vocab_size) == (layers, hidden, 151936)
    per_tensor = shapes.ipc_bucket_bytes // shapes.ipc_tensors // 2
    named = [(f"t{i}", torch.empty(per_tensor, dtype=torch.bfloat16, device="meta")) for i in range(shapes.ipc_tensors)]
    buckets = list(pack_buckets(iter(named), shapes.ipc_bucket_bytes))
    assert [b.nbytes for b in buckets] == [512 * 2**20]


def test_the_train_step_is_sized_from_the_devices_memory():
    """An 80 GB H100 cannot hold one unsharded Qwen3-4B step (weights, gradients and Adam alone
    are 67 GiB): fewer of its layers run there, all 36 on a 141 GB H200, each within the stage's
    share of the memory by spade's own estimate (sdpa attention, as users run it)."""
    import device_stages

    shapes = device_stages.Shapes.for_device("cuda")
    h100, h200 = 79.2 * 2**30, 139.8 * 2**30
    (h100_config, h100_sizing), (h200_config, _) = (device_stages.train_config_for(int(m), shapes) for m in (h100, h200))
    assert h200_config["num_hidden_layers"] == 36
    assert 4 <= h100_config["num_hidden_layers"] < 36
    assert h100_config["hidden_size"] == h200_config["hidden_size"] == 2560  # the 4B layer shape kept
    for config, memory in ((h100_config, h100), (h200_config, h200)):
        assert device_stages._step_estimate(config, shapes).total <= device_stages.TRAIN_MEMORY_FRACTION * memory
    deeper = dict(h100_config, num_hidden_layers=h100_config["num_hidden_layers"] + 2)
    assert device_stages._step_estimate(deeper, shapes).total > device_stages.TRAIN_MEMORY_FRACTION * h100
    assert h100_sizing["full_depth_layers"] == 36 and h100_sizing["device_memory_gib"] == pytest.approx(79.2)


def test_memory_returned_is_what_the_driver_sees_free():
    """The offload stage's verdict: bytes the driver has free again (what a colocated server can
    take), not bytes this process's tensors let go of while its allocator keeps them."""
    import device_stages

    GiB = 2**30
    before = device_stages.DeviceMemory(allocated=40 * GiB, reserved=42 * GiB, driver_free=30 * GiB)
    kept = device_stages.DeviceMemory(allocated=10 * GiB, reserved=42 * GiB, driver_free=30 * GiB)
    handed_back = device_stages.DeviceMemory(allocated=10 * GiB, reserved=12 * GiB, driver_free=60 * GiB)
    assert device_stages.returned_to_driver(before, kept, 30 * GiB) == 0.0
    assert device_stages.returned_to_driver(before, handed_back, 30 * GiB) == 1.0
    assert set(handed_back.figures("offloaded")) == {"allocated_gib_offloaded", "reserved_gib_offloaded",
                                                     "driver_free_gib_offloaded"}


def test_the_stages_build_the_attention_users_get():
    """Without Transformer Engine the trainer's default core attention is sdpa; the stages build
    the same (not megatron-core's unfused attention, which keeps [b*heads, s, s] scores)."""
    import device_stages

    from spade.train_config import ModelSection

    assert device_stages.CORE_ATTENTION == ModelSection().core_attention == "sdpa"


def test_the_gpu_machine_has_or_is_carried_every_package_the_gpu_path_imports():
    """Every third-party module spade's GPU path and GPU tests import (at any depth) comes from a
    distribution the GPU machine has, or one tools/fetch_device_wheels.py carries, or is absent
    by design (SGLang, Transformer Engine: their tests skip there)."""
    import importlib.metadata as metadata

    import device_machine
    import device_stages
    import fetch_device_wheels

    carried = {device_machine.normalized(name) for name in fetch_device_wheels.CARRIED} | {"transformers"}
    files = [path for folder in device_stages.GPU_PATH_SOURCES for path in (ROOT / folder).rglob("*.py")]
    files += [ROOT / name for name in (*device_stages.gpu_test_files(), *device_stages.OWN_STAGE_TEST_FILES)]
    owners = metadata.packages_distributions()
    local = {p.stem for p in (ROOT / "tests").rglob("*.py")} | {p.name for p in (ROOT / "tests").iterdir() if p.is_dir()}
    local |= {"spade", "megatron_patches", "gpu_mfu"}
    uncovered = {}
    for name, importers in device_stages.imported_top_level_names(files).items():
        if name in sys.stdlib_module_names or name in local or name in device_stages.ABSENT_BY_DESIGN:
            continue
        dists = {device_machine.normalized(d) for d in owners.get(name, [name])}
        if not dists & (device_machine.MACHINE_PACKAGES | carried):
            uncovered[name] = importers
    assert uncovered == {}
    assert "jsonschema" in device_stages.imported_top_level_names(files)  # the scan sees function-level imports
