"""The command line that starts one sandbox: bubblewrap around a zygote, or the bare zygote.

Inside bubblewrap the zygote sees a read-only copy of the system libraries, the Python
installation and the sandbox runtime, a private /tmp, its own /proc and /dev, no network, no
environment variables, and runs as uid/gid 65534 in fresh user, mount, pid, net, ipc, uts and
cgroup namespaces. Nothing of the host's home directories, /etc or the project is visible.

With ``sandbox.offer_numpy`` the trainer's numpy package (and ``numpy.libs``, the wheel's bundled
OpenBLAS, which numpy's extension modules find beside it) is mounted read-only under
``/opt/spade/site`` and is readable to every child; the zygote imports it from there
(:attr:`LaunchPlan.numpy_site`). Nothing else of the site-packages is mounted.
"""

from __future__ import annotations

import importlib.util
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
SITE_INSIDE = f"{MOUNT_ROOT}/site"


class BubblewrapMissing(RuntimeError):
    pass


class NumpyMissing(RuntimeError):
    pass


@dataclass(frozen=True)
class LaunchPlan:
    argv: list[str]
    env: dict[str, str]
    readable_paths: tuple[str, ...]  # as seen from inside the sandbox
    bubblewrap: bool
    numpy_site: str | None = None  # the folder holding numpy, as seen inside; None: not offered


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
        numpy = numpy_folders() if config.offer_numpy else ()
        readable = (prefix, *_existing(SYSTEM_PATHS), runtime, *numpy)
        return LaunchPlan(argv, {"LANG": "C.UTF-8"}, tuple(dict.fromkeys(readable)), bubblewrap=False,
                          numpy_site=os.path.dirname(numpy[0]) if numpy else None)

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
    numpy_site = None
    if config.offer_numpy:
        numpy_site = SITE_INSIDE
        for folder in numpy_folders():
            argv += ["--ro-bind", folder, f"{SITE_INSIDE}/{os.path.basename(folder)}"]
    argv += [python, "-I", "-S", "-B", "-c", _boot_code(MOUNT_ROOT), str(channel_fd)]
    readable = (prefix, *_existing(SYSTEM_PATHS), runtime_inside, *([numpy_site] if numpy_site else []))
    return LaunchPlan(argv, {}, tuple(dict.fromkeys(readable)), bubblewrap=True, numpy_site=numpy_site)


def numpy_folders() -> tuple[str, ...]:
    """numpy's package folder of this installation and, when there, ``numpy.libs`` beside it."""
    spec = importlib.util.find_spec("numpy")
    if spec is None or not spec.submodule_search_locations:
        raise NumpyMissing("sandbox.offer_numpy is on but numpy is not installed in the trainer's environment "
                           "(pip install numpy), or set sandbox.offer_numpy: false")
    package = os.path.realpath(list(spec.submodule_search_locations)[0])
    libs = os.path.join(os.path.dirname(package), "numpy.libs")
    return (package, libs) if os.path.isdir(libs) else (package,)


def _existing(paths: tuple[str, ...]) -> list[str]:
    return [path for path in paths if os.path.exists(path)]
