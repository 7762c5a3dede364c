"""The command line that starts one sandbox: bubblewrap around a zygote, or the bare zygote.

Inside bubblewrap the zygote sees a read-only copy of the system libraries, the Python
installation and the sandbox runtime, a private /tmp, its own /proc and /dev, no network, no
environment variables, and runs as uid/gid 65534 in fresh user, mount, pid, net, ipc, uts and
cgroup namespaces. Nothing of the host's home directories, /etc or the project is visible.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from .config import SandboxConfig

RUNTIME_DIR = Path(__file__).resolve().parent / "runtime"
MOUNT_ROOT = "/opt/spade"
SANDBOX_UID = 65534
SYSTEM_PATHS = ("/usr", "/lib", "/lib64", "/lib32", "/libx32", "/bin", "/sbin")


class BubblewrapMissing(RuntimeError):
    pass


@dataclass(frozen=True)
class LaunchPlan:
    argv: list[str]
    env: dict[str, str]
    readable_paths: tuple[str, ...]  # as seen from inside the sandbox
    bubblewrap: bool


def python_prefix() -> str:
    return os.path.realpath(sys.base_prefix)


def _boot_code(search_dir: str) -> str:
    return (f"import sys; sys.path.insert(0, {search_dir!r}); "
            "from runtime import zygote; zygote.main(int(sys.argv[1]))")


def plan_launch(config: SandboxConfig, channel_fd: int) -> LaunchPlan:
    python = os.path.realpath(sys.executable)
    prefix = python_prefix()
    if config.isolation == "unsafe-local":
        runtime = str(RUNTIME_DIR)
        argv = [python, "-I", "-S", "-B", "-c", _boot_code(str(RUNTIME_DIR.parent)), str(channel_fd)]
        readable = (prefix, *_existing(SYSTEM_PATHS), runtime)
        return LaunchPlan(argv, {"LANG": "C.UTF-8"}, tuple(dict.fromkeys(readable)), bubblewrap=False)

    bwrap = shutil.which(config.bwrap_path)
    if bwrap is None:
        raise BubblewrapMissing(
            f"bubblewrap ({config.bwrap_path!r}) is not installed. Install it (Debian/Ubuntu: "
            "'apt-get install bubblewrap'; Fedora: 'dnf install bubblewrap'), or set "
            "sandbox.isolation: unsafe-local to run generated code without namespaces (not safe).")
    runtime_inside = f"{MOUNT_ROOT}/runtime"
    argv = [
        bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
        "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--hostname", "sandbox",
        "--clearenv", "--setenv", "LANG", "C.UTF-8",
        "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--chdir", "/tmp",
    ]
    for path in SYSTEM_PATHS:
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    if not any(prefix == p or prefix.startswith(p + "/") for p in SYSTEM_PATHS):
        argv += ["--ro-bind", prefix, prefix]
    argv += ["--ro-bind", str(RUNTIME_DIR), runtime_inside]
    argv += [python, "-I", "-S", "-B", "-c", _boot_code(MOUNT_ROOT), str(channel_fd)]
    readable = (prefix, *_existing(SYSTEM_PATHS), runtime_inside)
    return LaunchPlan(argv, {}, tuple(dict.fromkeys(readable)), bubblewrap=True)


def _existing(paths: tuple[str, ...]) -> list[str]:
    return [path for path in paths if os.path.exists(path)]
