"""Start-up check: the trainer and the SGLang servers must run on one torch and one NCCL.

Two seams depend on it. The colocated weight sync hands CUDA-IPC handles pickled by the trainer's
torch to the server's torch, which rebuilds the tensors from a private argument layout; two torch
builds need not agree on it. The disaggregated weight sync puts the trainer's rank 0 and the
servers' workers into one NCCL communicator, and NCCL refuses peers of another version
("Mismatched NCCL version detected"). Both fail late and obscurely, so a run checks at start-up:

    from spade.rollout.sglang.runtime_versions import check_sglang_runtime
    check_sglang_runtime(python)        # raises RuntimeVersionMismatch; prints both sides

``current_versions()`` describes this process; ``probe_interpreter(python)`` runs the same
collection in a subprocess of ``python`` (the interpreter that will run
``python -m sglang.launch_server``) and reads back one JSON line, with sglang's version; it never
raises for what it finds (a missing torch or sglang, a crash, a timeout): the result says so.
``compare_versions`` is the rule: torch (the full version string, local build tag included), its
CUDA version and its NCCL version must be equal on both sides.

``python -m spade.rollout.sglang.runtime_versions [--python PY]`` runs the check from a shell (the GPU
check starts with it); exit status 1 on a mismatch.
"""

from __future__ import annotations

import argparse
import inspect
import json
import subprocess
import sys
from dataclasses import asdict, dataclass
from typing import Callable, Mapping, Optional, Sequence

MARKER = "SPADE_RUNTIME_VERSIONS "  # prefix of the probe's one JSON line (imports may print too)
COMPARED = ("torch", "cuda", "nccl")


@dataclass(frozen=True)
class RuntimeVersions:
    """What one interpreter runs. ``None`` fields are absent (a CPU torch has no CUDA and no
    NCCL); ``error`` says why nothing could be read (no torch, the probe crashed or hung),
    ``nccl_error`` and ``sglang_error`` why that one part could not."""

    python: str
    python_version: Optional[str] = None
    torch: Optional[str] = None
    cuda: Optional[str] = None
    nccl: Optional[str] = None
    sglang: Optional[str] = None
    error: Optional[str] = None
    nccl_error: Optional[str] = None
    sglang_error: Optional[str] = None

    @property
    def usable(self) -> bool:
        return self.error is None

    def describe(self) -> str:
        if self.error is not None:
            return f"{self.python}: {self.error}"
        nccl = self.nccl or (f"none ({self.nccl_error})" if self.nccl_error else "none")
        sglang = self.sglang or f"unavailable ({self.sglang_error})"
        return (f"{self.python} (Python {self.python_version}): torch {self.torch}, CUDA {self.cuda or 'none'}, "
                f"NCCL {nccl}, sglang {sglang}")


@dataclass(frozen=True)
class VersionCheck:
    """The comparison of the trainer's and the SGLang interpreter's versions."""

    trainer: RuntimeVersions
    sglang: RuntimeVersions
    mismatches: tuple[str, ...] = ()  # one line per differing field (or problem)

    @property
    def ok(self) -> bool:
        return not self.mismatches

    def report(self) -> str:
        head = "trainer and SGLang run one torch and one NCCL" if self.ok else \
            "trainer and SGLang runtime check failed"
        lines = [head + ":", f"  trainer: {self.trainer.describe()}", f"  SGLang:  {self.sglang.describe()}"]
        lines += [f"  differs: {m}" for m in self.mismatches]
        return "\n".join(lines)


class RuntimeVersionMismatch(RuntimeError):
    """The SGLang interpreter runs another torch, CUDA or NCCL than the trainer (or cannot be read)."""

    def __init__(self, check: VersionCheck):
        self.check = check
        advice = []
        if any(m.split(":", 1)[0] in COMPARED for m in check.mismatches):
            advice.append("The CUDA-IPC weight hand-over needs one torch build and the NCCL broadcast one NCCL "
                          "version: run SGLang from the trainer's Python environment (the Docker image has one).")
        if any(m.startswith("sglang:") for m in check.mismatches):
            advice.append("Install sglang into that environment, or point the servers at one that has it.")
        super().__init__("\n".join([check.report(), *advice]))


def _collect(import_sglang: bool = True) -> dict:
    """Runs here and, by its source, in the probed interpreter: standard library and torch only.
    Without ``import_sglang`` sglang's version comes from its installed metadata."""
    import importlib
    import platform
    import sys
    from importlib import metadata

    out = {"python": sys.executable, "python_version": platform.python_version()}
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - any failure to import is the finding
        out["error"] = f"torch cannot be imported: {type(exc).__name__}: {exc}"
        return out
    out["torch"] = str(torch.__version__)
    out["cuda"] = torch.version.cuda
    if torch.version.cuda is not None:
        try:
            raw = torch.cuda.nccl.version()  # (major, minor, patch[, suffix])
            out["nccl"] = ".".join(str(part) for part in raw[:3]) + "".join(str(part) for part in raw[3:])
        except Exception as exc:  # noqa: BLE001
            out["nccl_error"] = f"{type(exc).__name__}: {exc}"
    try:
        if import_sglang:
            version = getattr(importlib.import_module("sglang"), "__version__", None) or metadata.version("sglang")
        else:
            version = metadata.version("sglang")
        out["sglang"] = str(version)
    except metadata.PackageNotFoundError:
        out["sglang_error"] = "not installed"
    except Exception as exc:  # noqa: BLE001
        out["sglang_error"] = f"{type(exc).__name__}: {exc}"
    return out


def _from_dict(values: Mapping) -> RuntimeVersions:
    known = {k: values[k] for k in RuntimeVersions.__dataclass_fields__ if k in values}
    return RuntimeVersions(**known)


def current_versions(*, import_sglang: bool = False) -> RuntimeVersions:
    """This process's versions. sglang's is read from its installed metadata unless
    ``import_sglang`` (importing it into the trainer is not wanted)."""
    return _from_dict(_collect(import_sglang=import_sglang))


def probe_script() -> str:
    """The source the probed interpreter runs: ``_collect`` and one marked JSON line."""
    return (inspect.getsource(_collect) + "\nimport json\n"
            f"print({MARKER!r} + json.dumps(_collect()), flush=True)\n")


def probe_interpreter(python: Optional[str] = None, *, env: Optional[Mapping[str, str]] = None,
                      timeout_s: float = 300.0) -> RuntimeVersions:
    """The versions seen by ``python`` (default: this interpreter, in a fresh process), run with
    ``env`` (default: this process's; pass the servers' environment, it may change library
    paths). Whatever goes wrong is reported in the result's ``error``, never raised."""
    python = python or sys.executable
    try:
        proc = subprocess.run([python, "-c", probe_script()], capture_output=True, text=True, timeout=timeout_s,
                              env=None if env is None else dict(env), stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        return RuntimeVersions(python=python, error="no such interpreter")
    except PermissionError as exc:
        return RuntimeVersions(python=python, error=f"cannot be run: {exc}")
    except subprocess.TimeoutExpired:
        return RuntimeVersions(python=python, error=f"the version probe did not finish in {timeout_s:.0f} s")
    lines = [line for line in proc.stdout.splitlines() if line.startswith(MARKER)]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        return RuntimeVersions(python=python, error=f"the version probe exited with status {proc.returncode}: "
                               + " | ".join(tail))
    values = json.loads(lines[-1][len(MARKER):])
    values["python"] = python  # the path the servers are started with, not its resolved target
    return _from_dict(values)


def compare_versions(trainer: RuntimeVersions, sglang: RuntimeVersions, *,
                     require_sglang: bool = True) -> VersionCheck:
    """The rule: torch, CUDA and NCCL equal on both sides, both sides readable and (with
    ``require_sglang``) sglang importable on the SGLang side."""
    problems: list[str] = []
    for side, versions in (("trainer", trainer), ("SGLang", sglang)):
        if versions.error is not None:
            problems.append(f"{side} side unreadable: {versions.error}")
    if not problems:
        for name in COMPARED:
            mine, theirs = getattr(trainer, name), getattr(sglang, name)
            if mine != theirs:
                problems.append(f"{name}: trainer {mine or 'none'} ({trainer.python}) vs "
                                f"SGLang {theirs or 'none'} ({sglang.python})")
        for side, versions in (("trainer", trainer), ("SGLang", sglang)):
            if versions.cuda is not None and versions.nccl is None:
                problems.append(f"nccl: the {side} side's CUDA torch reports no NCCL version ({versions.nccl_error})")
    if require_sglang and sglang.error is None and sglang.sglang is None:
        problems.append(f"sglang: not importable by {sglang.python} ({sglang.sglang_error})")
    return VersionCheck(trainer=trainer, sglang=sglang, mismatches=tuple(problems))


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def check_sglang_runtime(python: Optional[str] = None, *, env: Optional[Mapping[str, str]] = None,
                         require_sglang: bool = True, timeout_s: float = 300.0,
                         emit: Optional[Callable[[str], None]] = _stderr) -> VersionCheck:
    """The start-up check: this process against ``python`` (the interpreter that will run
    ``-m sglang.launch_server``, started with ``env``). Emits both sides' versions (``emit``,
    default stderr; None: quiet) and returns the result when they match; raises
    ``RuntimeVersionMismatch`` naming both sides when they do not."""
    check = compare_versions(current_versions(), probe_interpreter(python, env=env, timeout_s=timeout_s),
                             require_sglang=require_sglang)
    if not check.ok:
        raise RuntimeVersionMismatch(check)
    if emit is not None:
        emit(check.report())
    return check


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="Compare this interpreter's torch/CUDA/NCCL with the one that "
                                     "runs SGLang.")
    parser.add_argument("--python", default=None, help="the SGLang interpreter (default: this one)")
    parser.add_argument("--allow-missing-sglang", action="store_true", help="compare torch/NCCL only")
    parser.add_argument("--json", action="store_true", help="also print both sides as one JSON line")
    args = parser.parse_args(argv)
    try:
        check = check_sglang_runtime(args.python, require_sglang=not args.allow_missing_sglang, emit=print)
        status = 0
    except RuntimeVersionMismatch as exc:
        print(exc, flush=True)
        check, status = exc.check, 1
    if args.json:
        print(json.dumps({"trainer": asdict(check.trainer), "sglang": asdict(check.sglang),
                          "mismatches": list(check.mismatches)}))
    return status


if __name__ == "__main__":
    raise SystemExit(main())
