"""The start-up self-test refuses to run generated code when an isolation layer is missing.

Each check of ``spade.envs.sandbox.selftest`` is driven with degraded evidence from a real
sandbox: bubblewrap started with one layer taken away (a namespace left shared, uid 0, the host's
/tmp, a leaked environment variable), or the real zygote's hello / probe child's report with one
fact changed where the layer cannot be removed from outside (a writable system, rlimits, Landlock,
seccomp). The supervisor runs in this process so that the launch can be degraded; each case must
name exactly the layers that are missing. Then ``spade env check`` with an unusable bubblewrap
exits with status 3 and says why.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FAST_LIMITS, ROOT
from spade.envs.sandbox import sandbox_process, selftest, supervisor
from spade.envs.sandbox.config import SandboxConfig
from spade.envs.sandbox.launcher import LaunchPlan

NAMESPACES = ("pid", "net", "ipc", "uts", "cgroup")

if shutil.which("bwrap") is None:  # a failure, as in conftest.make_harness: make setup installs it
    raise RuntimeError("bubblewrap is not installed: run 'make test', which installs it")


def self_test(monkeypatch, *, argv=None, hello=None, probe=None, seccomp=None, isolation="bubblewrap"):
    """The supervisor's start-up report with the launch or the evidence degraded."""
    real_plan = sandbox_process.plan_launch

    def plan(config, fd):
        planned = real_plan(config, fd)
        return planned if argv is None else LaunchPlan(argv(list(planned.argv)), planned.env,
                                                        planned.readable_paths, planned.bubblewrap)

    monkeypatch.setattr(sandbox_process, "plan_launch", plan)
    real_probe = supervisor.Supervisor._probe

    async def degraded_probe(self, sandbox, op, payload):
        result = await real_probe(self, sandbox, op, payload)
        if op == "selftest" and probe is not None:
            return probe(dict(result) if isinstance(result, dict) else result)
        if op == "selftest_seccomp" and seccomp is not None:
            return seccomp(result)
        return result

    monkeypatch.setattr(supervisor.Supervisor, "_probe", degraded_probe)
    real_check_zygote = supervisor.check_zygote

    def check_zygote(report, facts, **kwargs):  # the zygote's hello, as the check sees it
        if hello is not None:
            facts = hello(dict(facts))
        real_check_zygote(report, facts, **kwargs)

    monkeypatch.setattr(supervisor, "check_zygote", check_zygote)

    async def run():
        sup = supervisor.Supervisor(SandboxConfig(**{**FAST_LIMITS, "pool_size": 1, "isolation": isolation}))
        try:
            return await asyncio.wait_for(sup.start(), 60)
        finally:
            await sup.shutdown()

    return asyncio.run(run())


def failed_layers(report) -> set[str]:
    return {name for name, ok in report.layers.items() if not ok}


def test_an_intact_sandbox_passes(monkeypatch):
    report = self_test(monkeypatch)
    assert report.ok and failed_layers(report) == set() and report.problems == []


def without_namespace(name: str):
    def edit(argv: list[str]) -> list[str]:
        at = argv.index("--unshare-all")
        keep = [f"--unshare-{ns}" for ns in ("user", *NAMESPACES) if ns != name]
        argv = argv[:at] + keep + argv[at + 1:]
        if name == "uts":  # bubblewrap sets the hostname only in a namespace of its own
            at = argv.index("--hostname")
            argv = argv[:at] + argv[at + 2:]
        return argv
    return edit


def replace(old: list[str], new: list[str]):
    def edit(argv: list[str]) -> list[str]:
        for i in range(len(argv)):
            if argv[i:i + len(old)] == old:
                return argv[:i] + new + argv[i + len(old):]
        raise AssertionError(f"{old} not in {argv}")
    return edit


LAUNCH_DEGRADATIONS = {
    **{f"shared {ns} namespace": (without_namespace(ns), {f"{ns} namespace"} | ({"no network"} if ns == "net" else set()))
       for ns in NAMESPACES},
    "uid 0": (replace(["--uid", "65534", "--gid", "65534"], ["--uid", "0", "--gid", "0"]), {"non-root uid"}),
    "host /tmp": (replace(["--tmpfs", "/tmp"], ["--bind", "/tmp", "/tmp"]), {"private /tmp"}),
    "leaked environment": (replace(["--clearenv"], ["--setenv", "SPADE_LEAKED", "1"]), {"clean environment"}),
}


@pytest.mark.parametrize("name", list(LAUNCH_DEGRADATIONS))
def test_a_layer_missing_from_the_launch_is_refused(monkeypatch, name):
    edit, expected = LAUNCH_DEGRADATIONS[name]
    before = set(Path("/tmp").glob("spade-probe-*"))
    try:
        report = self_test(monkeypatch, argv=edit)
    finally:
        for leftover in set(Path("/tmp").glob("spade-probe-*")) - before:  # "host /tmp" writes there
            leftover.unlink(missing_ok=True)
    assert not report.ok
    assert failed_layers(report) == expected
    for layer in expected:
        assert any(problem.startswith(f"{layer}: ") for problem in report.problems), report.problems


def host_namespace(name: str):
    """The zygote's hello claiming the host's namespace: bubblewrap cannot run unprivileged without
    its own user and mount namespaces, so those two are degraded in the evidence."""
    def edit(hello: dict) -> dict:
        return {**hello, "namespaces": {**hello["namespaces"], name: selftest.own_namespaces()[name]}}
    return edit


EVIDENCE_DEGRADATIONS = {
    "shared user namespace": (dict(hello=host_namespace("user")), {"user namespace"}),
    "shared mount namespace": (dict(hello=host_namespace("mnt")), {"mnt namespace"}),
    "writable system": (dict(hello=lambda h: {**h, "system_read_only": False}), {"read-only system"}),
    "no rlimit on memory": (dict(probe=lambda p: {**p, "rlimit_as": -1}), {"rlimits"}),
    "no rlimit on processes": (dict(probe=lambda p: {**p, "rlimit_nproc": 100}), {"rlimits"}),
    "no landlock": (dict(probe=lambda p: {**p, "landlock_abi": 0}), {"landlock"}),
    "landlock lets writes through": (dict(probe=lambda p: {**p, "write_blocked": False}), {"landlock"}),
    "landlock lets reads through": (dict(probe=lambda p: {**p, "read_blocked": False}), {"landlock"}),
    "no seccomp": (dict(seccomp=lambda ended: "exit code 0"), {"seccomp"}),
    "probe child failed": (dict(probe=lambda p: "the child crashed"), {"hardening"}),  # not a dict
}


@pytest.mark.parametrize("name", list(EVIDENCE_DEGRADATIONS))
def test_degraded_evidence_is_refused(monkeypatch, name):
    evidence, expected = EVIDENCE_DEGRADATIONS[name]
    report = self_test(monkeypatch, **evidence)
    assert not report.ok
    assert failed_layers(report) == expected
    assert any(problem.split(":")[0] in expected for problem in report.problems), report.problems


def test_without_bubblewrap_landlock_and_seccomp_are_warnings(monkeypatch):
    """isolation: unsafe-local asks for no namespaces; missing Landlock or seccomp is said, not fatal."""
    report = self_test(monkeypatch, isolation="unsafe-local", probe=lambda p: {**p, "landlock_abi": 0},
                       seccomp=lambda ended: "exit code 0")
    assert report.ok and failed_layers(report) == {"landlock", "seccomp"}
    assert any(w.startswith("landlock: ") for w in report.warnings)
    assert any(w.startswith("seccomp: ") for w in report.warnings)
    assert any(w.startswith("bubblewrap: not used") for w in report.warnings)


# ---------------------------------------------------------------------------- the command line

UNUSABLE_BWRAP = """#!/bin/sh
echo "bwrap: setting up uid map: Permission denied" >&2
exit 1
"""


@pytest.mark.parametrize("bwrap", ["unusable", "missing"])
def test_env_check_with_an_unusable_bubblewrap_exits_3(tmp_path, bwrap):
    """What a kernel without unprivileged user namespaces (or no bubblewrap at all) looks like."""
    if bwrap == "unusable":
        path = tmp_path / "bwrap"
        path.write_text(UNUSABLE_BWRAP)
        path.chmod(0o755)
    else:
        path = tmp_path / "no-such-bwrap"
    config = tmp_path / "sandbox.yaml"
    config.write_text(f"sandbox:\n  bwrap_path: {path}\n  start_timeout_s: 20\n")
    done = subprocess.run([sys.executable, "-m", "spade", "env", "check", "--config", str(config),
                           str(ROOT / "examples" / "envs" / "hidden_sequence.py")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr[-3000:]
    assert "refusing to run generated code" in done.stderr and done.stdout == ""
    if bwrap == "unusable":
        assert "setting up uid map: Permission denied" in done.stderr
    else:
        assert str(path) in done.stderr and "apt-get install bubblewrap" in done.stderr
