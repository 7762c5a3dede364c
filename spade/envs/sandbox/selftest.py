"""The start-up self-test: prove each isolation layer is really there, or name the missing one.

Three sources of evidence per sandbox: the zygote's ``hello`` (its namespaces, uid, network
interfaces, whether the system is read-only and /tmp private), a probe child that reports its
rlimits and tries a write and a read Landlock must refuse, and a probe child that makes a
forbidden system call and must die by SIGSYS.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field
from typing import Any

from .runtime.limits import ChildLimits
from .runtime.zygote import NAMESPACES


@dataclass
class SelfTestReport:
    problems: list[str] = field(default_factory=list)  # layer: what is wrong
    warnings: list[str] = field(default_factory=list)
    layers: dict[str, bool] = field(default_factory=dict)

    def check(self, layer: str, ok: bool, problem: str, *, required: bool = True) -> None:
        self.layers[layer] = ok
        if not ok:
            (self.problems if required else self.warnings).append(f"{layer}: {problem}")

    @property
    def ok(self) -> bool:
        return not self.problems


def own_namespaces() -> dict[str, int | None]:
    found: dict[str, int | None] = {}
    for name in NAMESPACES:
        try:
            found[name] = os.stat(f"/proc/self/ns/{name}").st_ino
        except OSError:
            found[name] = None
    return found


def check_zygote(report: SelfTestReport, hello: dict[str, Any], *, bubblewrap: bool, tmp_probe: str) -> None:
    if not bubblewrap:
        report.warnings.append("bubblewrap: not used (isolation: unsafe-local): no namespaces, no uid change, "
                               "the host filesystem is only guarded by Landlock where the kernel has it")
        return
    host = own_namespaces()
    inside = hello.get("namespaces", {})
    for name in NAMESPACES:
        separate = inside.get(name) is not None and inside.get(name) != host.get(name)
        report.check(f"{name} namespace", separate, "the sandbox shares the host's namespace")
    report.check("non-root uid", hello.get("uid") not in (0, None) and hello.get("gid") not in (0, None),
                 f"the zygote runs as uid {hello.get('uid')}")
    interfaces = hello.get("interfaces")
    report.check("no network", interfaces is not None and set(interfaces) <= {"lo"},
                 f"network interfaces visible: {interfaces}")
    report.check("read-only system", hello.get("system_read_only") is True, "the Python installation is writable")
    private_tmp = hello.get("tmp_written") is True and not os.path.exists(tmp_probe)
    report.check("private /tmp", private_tmp, "a file written to /tmp inside appeared outside, or /tmp is not writable")
    report.check("clean environment", set(hello.get("environ", [])) <= {"LANG", "LC_CTYPE", "PWD"},
                 f"host environment variables leak in: {hello.get('environ')}")


def check_probe_child(report: SelfTestReport, probe: dict[str, Any], limits: ChildLimits, *, strict: bool) -> None:
    expected = {
        "rlimit_as": limits.memory_bytes,
        "rlimit_cpu": limits.cpu_seconds + 1,
        "rlimit_nofile": limits.open_files,
        "rlimit_fsize": limits.file_size_bytes,
        "rlimit_nproc": 0,
    }
    wrong = {key: probe.get(key) for key, value in expected.items() if probe.get(key) != value}
    report.check("rlimits", not wrong, f"limits not in force: {wrong}")
    landlock_ok = bool(probe.get("landlock_abi")) and probe.get("write_blocked") is True \
        and probe.get("read_blocked") is True
    report.check("landlock", landlock_ok, f"writes or reads outside the allowed paths are possible "
                 f"(Landlock ABI {probe.get('landlock_abi')}; needs Linux 5.13+ with 'landlock' in the LSM list)",
                 required=strict)


def check_seccomp_probe(report: SelfTestReport, exit_signal: int | None, *, strict: bool) -> None:
    report.check("seccomp", exit_signal == signal.SIGSYS,
                 "a forbidden system call did not kill the child "
                 f"(it ended with signal {exit_signal}); seccomp filters are unavailable", required=strict)
