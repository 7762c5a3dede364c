"""Landlock through raw system calls: no writes anywhere, reads only beneath a few directories.

Inside bubblewrap the visible filesystem is already small and read-only; Landlock is the second
wall, and the only one in ``unsafe-local`` mode, where it keeps host files (keys, /etc, the home
directory) unreadable. From ABI 6 on it also scopes signals and abstract unix sockets.
"""

from __future__ import annotations

import ctypes
import os

SYS_CREATE_RULESET = 444  # same number on x86_64 and aarch64
SYS_ADD_RULE = 445
SYS_RESTRICT_SELF = 446
CREATE_RULESET_VERSION = 1
RULE_PATH_BENEATH = 1
PR_SET_NO_NEW_PRIVS = 38

EXECUTE = 1 << 0
WRITE_FILE = 1 << 1
READ_FILE = 1 << 2
READ_DIR = 1 << 3
_ABI1_ALL = (1 << 13) - 1  # EXECUTE .. MAKE_SYM
REFER = 1 << 13  # ABI 2
TRUNCATE = 1 << 14  # ABI 3
IOCTL_DEV = 1 << 15  # ABI 5
NET_BIND_TCP = 1 << 0  # ABI 4
NET_CONNECT_TCP = 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
SCOPE_SIGNAL = 1 << 1

ALLOWED_BENEATH_READ_PATHS = READ_FILE | READ_DIR


class LandlockUnavailable(Exception):
    pass


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


def abi_version() -> int:
    """The kernel's Landlock ABI, or 0 when Landlock is absent or disabled."""
    version = _syscall(ctypes.c_long(SYS_CREATE_RULESET), None, ctypes.c_size_t(0),
                       ctypes.c_uint32(CREATE_RULESET_VERSION))
    return max(0, int(version))


def _handled_fs(abi: int) -> int:
    rights = _ABI1_ALL
    if abi >= 2:
        rights |= REFER
    if abi >= 3:
        rights |= TRUNCATE
    if abi >= 5:
        rights |= IOCTL_DEV
    return rights


def restrict(readable_paths: list[str]) -> int:
    """Forbid all writes and every read outside ``readable_paths``; returns the ABI used.

    Already-open descriptors (the child's socket, /dev/null on stdio) are unaffected.
    """
    abi = abi_version()
    if abi < 1:
        raise LandlockUnavailable("the kernel does not offer Landlock (or it is disabled)")
    attr = _RulesetAttr(_handled_fs(abi), 0, 0)
    size = 8
    if abi >= 4:
        attr.handled_access_net = NET_BIND_TCP | NET_CONNECT_TCP
        size = 16
    if abi >= 6:
        attr.scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL
        size = 24
    ruleset = _syscall(ctypes.c_long(SYS_CREATE_RULESET), ctypes.byref(attr), ctypes.c_size_t(size),
                       ctypes.c_uint32(0))
    if ruleset < 0:
        raise LandlockUnavailable(f"landlock_create_ruleset failed: errno {ctypes.get_errno()}")
    try:
        for path in readable_paths:
            _allow_reads_beneath(int(ruleset), path)
        if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise LandlockUnavailable(f"prctl(NO_NEW_PRIVS) failed: errno {ctypes.get_errno()}")
        if _syscall(ctypes.c_long(SYS_RESTRICT_SELF), ctypes.c_int(int(ruleset)), ctypes.c_uint32(0)) != 0:
            raise LandlockUnavailable(f"landlock_restrict_self failed: errno {ctypes.get_errno()}")
    finally:
        os.close(int(ruleset))
    return abi


def _allow_reads_beneath(ruleset: int, path: str) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return  # a path that does not exist needs no rule
    try:
        access = ALLOWED_BENEATH_READ_PATHS if os.path.isdir(path) else READ_FILE
        rule = _PathBeneathAttr(access, fd)
        if _syscall(ctypes.c_long(SYS_ADD_RULE), ctypes.c_int(ruleset), ctypes.c_int(RULE_PATH_BENEATH),
                    ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
            raise LandlockUnavailable(f"landlock_add_rule({path}) failed: errno {ctypes.get_errno()}")
    finally:
        os.close(fd)
