"""Length-prefixed JSON frames: a 4-byte big-endian length, then that many bytes of UTF-8 JSON.

Used on every hop (client <-> supervisor <-> sandboxed child). Never pickle: a frame from a
sandbox is data to be checked, not code to be run. This module runs inside the sandbox too, so it
imports only the standard library.
"""

from __future__ import annotations

import json
import socket
import struct
from typing import Any

HEADER = struct.Struct(">I")
MAX_JSON_DEPTH = 64


class FrameError(Exception):
    """A frame that breaks the protocol: too large, truncated, not JSON, too deep."""


def encode(message: Any) -> bytes:
    payload = json.dumps(message, separators=(",", ":"), allow_nan=False).encode("utf-8")
    return HEADER.pack(len(payload)) + payload


def decode_payload(payload: bytes) -> Any:
    """Parse a frame body; refuse invalid JSON and nesting deeper than MAX_JSON_DEPTH."""
    try:
        message = json.loads(payload)
    except (ValueError, RecursionError) as exc:
        raise FrameError(f"frame is not valid JSON: {str(exc)[:200]}") from None
    if too_deep(message):
        raise FrameError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
    return message


def too_deep(message: Any) -> bool:
    pending = [(message, 1)]
    while pending:
        value, depth = pending.pop()
        if isinstance(value, dict):
            children = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        if depth > MAX_JSON_DEPTH:
            return True
        pending.extend((child, depth + 1) for child in children)
    return False


def recv_frame(sock: socket.socket, max_bytes: int) -> Any | None:
    """Blocking read of one frame; None on a clean end of stream before a header."""
    header = _recv_exactly(sock, HEADER.size, allow_eof=True)
    if header is None:
        return None
    (length,) = HEADER.unpack(header)
    if length > max_bytes:
        raise FrameError(f"frame of {length} bytes exceeds the limit of {max_bytes}")
    body = _recv_exactly(sock, length, allow_eof=False)
    return decode_payload(body)


def _recv_exactly(sock: socket.socket, n: int, *, allow_eof: bool) -> bytes | None:
    chunks = bytearray()
    while len(chunks) < n:
        chunk = sock.recv(n - len(chunks))
        if not chunk:
            if allow_eof and not chunks:
                return None
            raise FrameError("stream ended inside a frame")
        chunks += chunk
    return bytes(chunks)
