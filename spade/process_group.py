"""Ending a subprocess that was started in a session of its own (``start_new_session=True``)
together with every process it started: a harness driver, an inference server."""

from __future__ import annotations

import contextlib
import os
import signal


def kill_group(pgid: int, sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to process group ``pgid``; a group that is gone already (or not ours) is left be."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
