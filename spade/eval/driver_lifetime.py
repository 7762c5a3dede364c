"""A harness driver (tau2's, ACEBench's) dies with the evaluation that started it, however it ends.

The driver runs in a process group of its own (``start_new_session``), so a Ctrl-C at the terminal
reaches only ``spade eval``, which then kills the group (``external_harness.run_driver``). The rest
is here:

* ``spade eval`` is terminated (SIGTERM, ``kill PID``): a handler kills every live driver group,
  then lets the signal end the process as it would have (installed only where SIGTERM has its
  default action: a process that handles it itself decides when it ends);
* it exits any other way (an exception, ``sys.exit``, a KeyboardInterrupt that never reached the
  driver's task): an ``atexit`` hook kills the groups still live;
* it is killed outright (SIGKILL, the OOM killer): the kernel sends the driver SIGKILL
  (``PR_SET_PDEATHSIG``, armed in the child before it runs the driver; Linux). The signal follows
  the thread that started the driver, the one running the evaluation's event loop. A process the
  driver itself started is not reached this way (tau2 runs its simulations in threads).
"""

from __future__ import annotations

import atexit
import ctypes
import os
import signal
import sys
import threading
from typing import Any, Callable, Optional

from ..process_group import kill_group

PR_SET_PDEATHSIG = 1

_live: set[int] = set()
_lock = threading.Lock()
_at_exit = False
_on_signal = False
_prctl: Optional[Callable[..., int]] = None
if sys.platform.startswith("linux"):
    try:  # looked up here: the child between fork and exec must not load libraries
        _prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        _prctl = None


def die_with_parent_hook() -> Optional[Callable[[], None]]:
    """A ``preexec_fn`` arming SIGKILL for the child when this process dies (None off Linux); a
    child whose parent is already gone when it is armed exits at once."""
    if _prctl is None:
        return None
    parent = os.getpid()
    prctl = _prctl

    def arm() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return arm


def track(pgid: int) -> None:
    """Kill group ``pgid`` on SIGTERM or exit until :func:`untrack` (handlers installed on first use)."""
    _install()
    with _lock:
        _live.add(pgid)


def untrack(pgid: int) -> None:
    with _lock:
        _live.discard(pgid)


def kill_live_groups() -> None:
    """SIGKILL to every tracked driver group."""
    with _lock:
        groups = list(_live)
        _live.clear()
    for pgid in groups:
        kill_group(pgid)


def _on_sigterm(signum: int, frame: Any) -> None:
    kill_live_groups()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # end as SIGTERM would have, exit status included
    os.kill(os.getpid(), signal.SIGTERM)


def _install() -> None:
    global _at_exit, _on_signal
    with _lock:
        if not _at_exit:
            _at_exit = True
            atexit.register(kill_live_groups)
        if _on_signal or threading.current_thread() is not threading.main_thread():
            return  # only the main thread sets handlers; exit and the parent-death signal still cover it
        _on_signal = True
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return  # ignored, or handled by its owner (a graceful stop): exit and the parent-death signal cover it
    signal.signal(signal.SIGTERM, _on_sigterm)
