"""What a person gives ``spade env run`` and ``spade env play``: typed lines and action files.

A tool call in Qwen3's JSON form needs new lines (``<tool_call>``, a new line, the JSON, a new line,
``</tool_call>``), which one line of a terminal or of a file cannot hold. In a tool environment's
raw responses (every line of its actions file; every typed line but the ``TOOL {json}`` and
``answer TEXT`` shorthands) the two-character escape ``\\n`` stands for a new line and ``\\\\``
for one backslash; every other backslash is kept as written. So a JSON string that itself needs
JSON's escape for a new line is written ``\\\\n``. Games take their lines as typed (``\\boxed{...}``,
``\\neq`` stay).

The terminal prompt edits its line with GNU readline (arrows, Ctrl-A/E, history) when standard
input and output are a terminal, and turns Ctrl-C at the prompt into :class:`PlayInterrupted`.
"""

from __future__ import annotations

import re
import signal
import sys
import threading
from typing import Optional

from .common import UsageError, read_text

_ESCAPE = re.compile(r"\\([\\n])")


class PlayInterrupted(Exception):
    """Ctrl-C at the prompt: the person stopped the play."""


def decode_escapes(text: str) -> str:
    """``\\n`` -> a new line, ``\\\\`` -> a backslash; any other backslash stays."""
    return _ESCAPE.sub(lambda m: "\n" if m.group(1) == "n" else "\\", text)


def read_actions_file(path: str, *, escapes: bool) -> list[str]:
    """One action per line of ``path`` (blank lines skipped), escapes decoded when ``escapes``."""
    lines = [line for line in read_text(path).splitlines() if line.strip()]
    check_text(lines, path)
    return [decode_escapes(line) for line in lines] if escapes else lines


def check_text(actions: list[str], where: str) -> None:
    """UsageError naming the first action holding bytes that are not UTF-8 (read with
    ``surrogateescape``, from a file or the command line): no model writes such a reply."""
    for number, action in enumerate(actions, 1):
        byte = next((ord(c) - 0xDC00 for c in action if "\udc80" <= c <= "\udcff"), None)
        if byte is not None:
            raise UsageError(f"{where}: action {number} holds byte 0x{byte:02x}, which is not UTF-8")


_line_editing: Optional[bool] = None


def enable_line_editing() -> bool:
    """Load readline (line editing and history for ``input``) when the prompt is a terminal;
    whether it is on. Not loaded for piped input, whose output stays free of terminal codes."""
    global _line_editing
    if _line_editing is None:
        _line_editing = False
        if sys.stdin.isatty() and sys.stdout.isatty():
            try:
                import readline  # noqa: F401  (input() edits lines once it is loaded)
            except ImportError:
                pass
            else:
                _line_editing = True
    return _line_editing


def prompt(turn: int) -> Optional[str]:
    """One line typed at ``[turn] >``; None at the end of input (Ctrl-D). Ctrl-C raises
    :class:`PlayInterrupted` at once: the prompt reads on the main thread with Python's own SIGINT
    handler, not asyncio's (which would only cancel the play once the line is in)."""
    enable_line_editing()
    previous = signal.getsignal(signal.SIGINT)
    restore = (previous not in (None, signal.SIG_IGN)  # an ignored Ctrl-C stays ignored
               and threading.current_thread() is threading.main_thread())
    if restore:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return input(f"\n[{turn}] > ")
    except EOFError:
        return None
    except KeyboardInterrupt:
        raise PlayInterrupted() from None
    finally:
        if restore:
            signal.signal(signal.SIGINT, previous)
