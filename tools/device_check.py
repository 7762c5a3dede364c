"""The GPU check for the lent GPU machine (no Docker, no network, no SGLang or Transformer Engine):
stages cheapest first, each in its own process, under one time budget.

    bash tools/device_check.sh                      # on the GPU machine (installs carried wheels)
    bash tools/device_check.sh --device cpu         # the same stages with tiny shapes, here
    ONLY=ipc,offload bash tools/device_check.sh     # rerun chosen stages

Each stage prints its verdict (PASS, FAIL, SKIPPED with the reason, TIMEOUT) and its seconds as
soon as it ends. A stage is started only while the budget (``--budget`` / ``BUDGET_S``, default
420 s) leaves it at least its ``min_s``, and runs for at most its ``cap_s`` or what is left; a
stage that no longer fits is reported ``not run``. A failing stage does not stop the others.
With ``OUT`` set, every stage's record (verdict, seconds, reason, figures) is appended to
``$OUT/device_check.jsonl`` as it ends, and a last ``summary`` record closes the file. Exit
status 1 if any stage failed, timed out or did not run.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

TOOLS = Path(__file__).resolve().parent
STAGE_SCRIPT = TOOLS / "device_stages.py"
RESULT_MARKER = "DEVICE_CHECK_RESULT "  # device_stages.RESULT_MARKER (not imported: it loads torch)
DEFAULT_BUDGET_S = 420.0
VERDICTS = ("pass", "fail", "skipped", "timeout", "not run")


@dataclass(frozen=True)
class StagePlan:
    name: str
    expected_s: float  # on one H200 (../shared/notes/device.md)
    cap_s: float  # never longer than this
    min_s: float  # not started with less than this left


PLAN: tuple[StagePlan, ...] = (  # cheapest first; the test stage (no figures) last
    StagePlan("env", 8, 60, 5),
    StagePlan("matmul", 10, 60, 8),
    StagePlan("timeslice", 15, 60, 10),
    StagePlan("ipc", 15, 90, 10),
    StagePlan("parity", 30, 120, 20),
    StagePlan("offload", 40, 150, 25),
    StagePlan("hf_engine", 50, 150, 25),
    StagePlan("train_step", 65, 180, 40),
    StagePlan("routing_replay", 25, 120, 15),  # R3 routing replay (tests/test_gpu_routing_replay.py)
    StagePlan("gpu_tests", 75, 200, 30),
)
STAGE_NAMES = tuple(stage.name for stage in PLAN)


@dataclass
class StageRecord:
    """One line of device_check.jsonl."""

    stage: str
    verdict: str
    seconds: float
    reason: str = ""
    figures: dict[str, Any] = field(default_factory=dict)
    device: str = ""
    hardware: str = ""  # the GPU (name, memory) or the CPU the figures were measured on
    kind: str = "stage"


def parse_only(text: Optional[str]) -> tuple[str, ...]:
    """``"ipc,offload"`` -> those stages in plan order; empty -> all. Unknown names are an error."""
    if not text:
        return STAGE_NAMES
    wanted = [name.strip() for name in text.split(",") if name.strip()]
    unknown = sorted(set(wanted) - set(STAGE_NAMES))
    if unknown:
        raise SystemExit(f"device_check: unknown stage(s) in ONLY/--only: {', '.join(unknown)} "
                         f"(stages: {', '.join(STAGE_NAMES)})")
    return tuple(name for name in STAGE_NAMES if name in wanted)


def resolve_device(requested: str) -> str:
    if requested != "auto":
        return requested
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                           capture_output=True, text=True, timeout=120)
    return "cuda" if probe.stdout.strip() == "True" else "cpu"


_GPU_NAME = ("import torch; p = torch.cuda.get_device_properties(0); "
             "print(f'{p.name}, {p.total_memory / 2**30:.1f} GiB')")


def describe_hardware(device: str) -> str:
    """What every record's figures were measured on: the GPU and its memory, or the CPU model."""
    if device == "cuda":
        probe = subprocess.run([sys.executable, "-c", _GPU_NAME], capture_output=True, text=True, timeout=120)
        return probe.stdout.strip() or f"an unreadable GPU ({probe.stderr.strip()[-200:]})"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"CPU: {line.split(':', 1)[1].strip()}, {os.cpu_count()} cores"
    except OSError:
        pass
    import platform

    return f"CPU: {platform.processor() or platform.machine()}, {os.cpu_count()} cores"


def _stream(pipe, name: str, lines: list[str]) -> None:
    for line in pipe:
        lines.append(line)
        if not line.startswith(RESULT_MARKER):
            sys.stdout.write(f"  [{name}] {line}")
            sys.stdout.flush()


def run_stage(plan: StagePlan, device: str, timeout_s: float, prior_path: Path) -> StageRecord:
    """Run one stage in its own process group, at most ``timeout_s`` seconds."""
    env = dict(os.environ, DEVICE_CHECK_PRIOR=str(prior_path), PYTHONUNBUFFERED="1")
    started = time.perf_counter()
    # The interpreter device_check.sh was given (PYTHON), as the check itself runs: the same
    # Python as sys.executable, under the name it was started by.
    python = os.environ.get("PYTHON") or sys.executable
    child = subprocess.Popen([python, str(STAGE_SCRIPT), "run", plan.name, "--device", device],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                             start_new_session=True)
    lines: list[str] = []
    reader = threading.Thread(target=_stream, args=(child.stdout, plan.name, lines), daemon=True)
    reader.start()
    try:
        child.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        reader.join(timeout=5)
        return StageRecord(plan.name, "timeout", round(time.perf_counter() - started, 1),
                           f"stopped after {timeout_s:.0f} s", device=device)
    reader.join(timeout=5)
    seconds = round(time.perf_counter() - started, 1)
    results = [line[len(RESULT_MARKER):] for line in lines if line.startswith(RESULT_MARKER)]
    if not results:
        tail = "".join(lines[-5:]).strip()
        return StageRecord(plan.name, "fail", seconds, f"exit status {child.returncode} without a result: {tail}"[:2000],
                           device=device)
    result = json.loads(results[-1])
    return StageRecord(plan.name, result["verdict"], seconds, result.get("reason", ""), result.get("figures", {}),
                       device=device)


def _headline(record: StageRecord) -> str:
    figures = ", ".join(f"{k}={v}" for k, v in record.figures.items()
                        if isinstance(v, (int, float)) and not isinstance(v, bool))[:400]
    reason = f" ({record.reason})" if record.reason else ""
    return f"== {record.stage}: {record.verdict.upper()} in {record.seconds:.1f}s{reason}" + (
        f"\n   {figures}" if figures else "")


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default=os.environ.get("DEVICE", "auto"))
    parser.add_argument("--budget", type=float, default=float(os.environ.get("BUDGET_S", DEFAULT_BUDGET_S)),
                        help="seconds for all stages together (default %(default)s)")
    parser.add_argument("--only", default=os.environ.get("ONLY", ""), help="comma-separated stages to run")
    parser.add_argument("--out", default=os.environ.get("OUT", ""), help="folder for device_check.jsonl")
    args = parser.parse_args(argv)
    chosen = parse_only(args.only)
    start = time.perf_counter()
    device = resolve_device(args.device)
    hardware = describe_hardware(device)
    jsonl = Path(args.out) / "device_check.jsonl" if args.out else None
    if jsonl is not None:
        jsonl.parent.mkdir(parents=True, exist_ok=True)
        jsonl.write_text("")
    print(f"device_check: device {device} ({hardware}), budget {args.budget:.0f} s, stages {', '.join(chosen)}",
          flush=True)
    records: list[StageRecord] = []
    figures_so_far: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        prior_path = Path(tmp) / "prior.json"
        for plan in PLAN:
            if plan.name not in chosen:
                continue
            left = args.budget - (time.perf_counter() - start)
            if left < plan.min_s:
                record = StageRecord(plan.name, "not run", 0.0, f"{max(left, 0):.0f} s of the {args.budget:.0f} s "
                                     f"budget left, the stage needs at least {plan.min_s:.0f} s", device=device)
            else:
                print(f"== {plan.name}: starting (at most {min(plan.cap_s, left):.0f} s)", flush=True)
                prior_path.write_text(json.dumps(figures_so_far))
                record = run_stage(plan, device, min(plan.cap_s, left), prior_path)
                figures_so_far[plan.name] = record.figures
            record.hardware = hardware
            print(_headline(record), flush=True)
            records.append(record)
            if jsonl is not None:
                with jsonl.open("a") as handle:
                    handle.write(json.dumps(asdict(record), default=str) + "\n")
    counts = {verdict: sum(r.verdict == verdict for r in records) for verdict in VERDICTS}
    total = round(time.perf_counter() - start, 1)
    print(f"== summary ({total:.0f} s of a {args.budget:.0f} s budget, device {device}: {hardware})")
    for record in records:
        print(f"   {record.stage:<11} {record.verdict:<8} {record.seconds:6.1f}s  {record.reason[:100]}")
    if jsonl is not None:
        summary = StageRecord("summary", "fail" if counts["fail"] + counts["timeout"] + counts["not run"] else "pass",
                              total, "", {"counts": counts, "budget_s": args.budget}, device=device,
                              hardware=hardware, kind="summary")
        with jsonl.open("a") as handle:
            handle.write(json.dumps(asdict(summary)) + "\n")
    return 1 if counts["fail"] + counts["timeout"] + counts["not run"] else 0


if __name__ == "__main__":
    sys.exit(main())
