"""A seccomp-BPF filter, assembled here, that kills the process on forbidden system calls.

Built per child after fork (it embeds the child's own pid, so signals can go to itself only) and
loaded with prctl; building and loading take microseconds, so no libseccomp is needed. The policy
is a deny list: everything a text game needs (memory, reading its own modules, clocks, its socket)
stays allowed; new processes, exec, new sockets, tracing, signals to others, mounts and namespaces,
kernel keyrings, BPF and io_uring are fatal. A killed child dies by SIGSYS, which the supervisor
reports as ``sandbox_violation``.
"""

from __future__ import annotations

import ctypes
import platform
import struct

PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2

RET_ALLOW = 0x7FFF0000
RET_KILL_PROCESS = 0x80000000

_LD_ABS_W = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_RET_K = 0x06

_OFFSET_NR = 0
_OFFSET_ARCH = 4
_OFFSET_ARG0_LOW = 16

X32_SYSCALL_BIT = 0x40000000

# The names below are looked up in these tables (from the kernel's unistd headers).
# None: the call does not exist on that architecture.
_SYSCALLS: dict[str, tuple[int | None, int | None]] = {
    # name: (x86_64, aarch64)
    "execve": (59, 221), "execveat": (322, 281),
    "fork": (57, None), "vfork": (58, None), "clone": (56, 220), "clone3": (435, 435),
    "socket": (41, 198), "socketpair": (53, 199), "connect": (42, 203), "bind": (49, 200),
    "listen": (50, 201), "accept": (43, 202), "accept4": (288, 242),
    "ptrace": (101, 117), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271),
    "kcmp": (312, 272),
    "kill": (62, 129), "tkill": (200, 130), "tgkill": (234, 131),
    "rt_sigqueueinfo": (129, 138), "rt_tgsigqueueinfo": (297, 240),
    "pidfd_open": (434, 434), "pidfd_send_signal": (424, 424), "pidfd_getfd": (438, 438),
    "mount": (165, 40), "umount2": (166, 39), "pivot_root": (155, 41), "chroot": (161, 51),
    "unshare": (272, 97), "setns": (308, 268),
    "fsopen": (430, 430), "fsconfig": (431, 431), "fsmount": (432, 432), "fspick": (433, 433),
    "move_mount": (429, 429), "open_tree": (428, 428), "mount_setattr": (442, 442),
    "bpf": (321, 280), "perf_event_open": (298, 241), "userfaultfd": (323, 282),
    "io_uring_setup": (425, 425), "io_uring_enter": (426, 426), "io_uring_register": (427, 427),
    "keyctl": (250, 219), "add_key": (248, 217), "request_key": (249, 218),
    "kexec_load": (246, 104), "kexec_file_load": (320, 294),
    "init_module": (175, 105), "finit_module": (313, 273), "delete_module": (176, 106),
    "reboot": (169, 142), "swapon": (167, 224), "swapoff": (168, 225), "acct": (163, 89),
    "syslog": (103, 116), "settimeofday": (164, 170), "clock_settime": (227, 112),
    "clock_adjtime": (305, 266), "adjtimex": (159, 171),
    "sethostname": (170, 161), "setdomainname": (171, 162),
    "iopl": (172, None), "ioperm": (173, None), "personality": (135, 92), "uselib": (134, None),
    "open_by_handle_at": (304, 265), "name_to_handle_at": (303, 264), "quotactl": (179, 60),
    "mknod": (133, None), "mknodat": (259, 33), "fanotify_init": (300, 262), "vhangup": (153, 58),
    "memfd_secret": (447, 447), "process_madvise": (440, 440), "lookup_dcookie": (212, 18),
    "migrate_pages": (256, 238), "move_pages": (279, 239),
    "setuid": (105, 146), "setgid": (106, 144), "setreuid": (113, 145), "setregid": (114, 143),
    "setresuid": (117, 147), "setresgid": (119, 149), "setgroups": (116, 159),
}

SIGNAL_SYSCALLS = ("kill", "tkill", "tgkill")
DENIED_SYSCALLS = tuple(name for name in _SYSCALLS if name not in SIGNAL_SYSCALLS)

_ARCHES = {"x86_64": (0, 0xC000003E), "aarch64": (1, 0xC00000B7)}


class SeccompUnavailable(Exception):
    pass


def _arch() -> tuple[int, int]:
    machine = platform.machine()
    if machine not in _ARCHES:
        raise SeccompUnavailable(f"no syscall table for architecture {machine!r}")
    return _ARCHES[machine]


def _number(name: str, column: int) -> int | None:
    return _SYSCALLS[name][column]


def build_filter(own_pid: int) -> bytes:
    """The BPF program as packed ``struct sock_filter`` entries.

    Layout: check arch; load nr; signal calls jump to a block that allows them only when the
    first argument is ``own_pid``; every denied number jumps to the final kill return; else allow.
    Classic BPF only jumps forward, so the kill return comes last.
    """
    column, audit_arch = _arch()
    program: list[tuple[int, int | str, int | str, int]] = []  # (code, jt, jf, k); labels resolved later

    program.append((_LD_ABS_W, 0, 0, _OFFSET_ARCH))
    program.append((_JEQ_K, 0, "kill", audit_arch))
    program.append((_LD_ABS_W, 0, 0, _OFFSET_NR))
    if column == 0:
        program.append((_JGE_K, "kill", 0, X32_SYSCALL_BIT))
    for name in SIGNAL_SYSCALLS:
        program.append((_JEQ_K, "signal", 0, _number(name, column)))
    for name in DENIED_SYSCALLS:
        number = _number(name, column)
        if number is not None:
            program.append((_JEQ_K, "kill", 0, number))
    labels = {}
    program.append((_RET_K, 0, 0, RET_ALLOW))
    labels["signal"] = len(program)
    program.append((_LD_ABS_W, 0, 0, _OFFSET_ARG0_LOW))
    program.append((_JEQ_K, 0, "kill", own_pid & 0xFFFFFFFF))
    program.append((_RET_K, 0, 0, RET_ALLOW))
    labels["kill"] = len(program)
    program.append((_RET_K, 0, 0, RET_KILL_PROCESS))

    packed = bytearray()
    for index, (code, jt, jf, k) in enumerate(program):
        jt = labels[jt] - index - 1 if isinstance(jt, str) else jt
        jf = labels[jf] - index - 1 if isinstance(jf, str) else jf
        if not (0 <= jt <= 255 and 0 <= jf <= 255):
            raise AssertionError("seccomp program too long for 8-bit jumps")
        packed += struct.pack("=HBBI", code, jt, jf, k)
    return bytes(packed)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install(own_pid: int) -> None:
    """Load the filter into the calling process (irreversible; needs no_new_privs)."""
    program = build_filter(own_pid)
    libc = ctypes.CDLL(None, use_errno=True)
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    prctl = libc.prctl
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    if prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise SeccompUnavailable(f"prctl(NO_NEW_PRIVS) failed: errno {ctypes.get_errno()}")
    if prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0) != 0:
        raise SeccompUnavailable(f"prctl(SECCOMP) failed: errno {ctypes.get_errno()}")
