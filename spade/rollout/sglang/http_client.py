"""A small HTTP/1.1 client on asyncio streams (standard library only) for SGLang's native API.

``HTTPClient`` keeps a pool of keep-alive connections per server (``Peer.idle``). ``request``
sends one JSON body and reads one JSON answer (a plain-text answer comes back as ``str``);
``stream`` asks for server-sent events and puts each event's JSON on a queue, then a
``StreamEnd``. A failed exchange (connection, timeout, HTTP 5xx) raises ``TransportError``
(``RequestTimeout`` when the request may still be running on the server): the engine retries
those elsewhere. Which bodies and answers SGLang uses is ``protocol``'s business.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Optional
from urllib.parse import urlsplit

from . import protocol as proto


class TransportError(ConnectionError):
    """The HTTP exchange with a server failed (connection, timeout, 5xx): retryable elsewhere."""


class RequestTimeout(TransportError):
    """The request reached the server but no reply came in time (it may still be running there)."""


@dataclass
class Peer:
    """One server: its ``url`` (``host``, ``port`` and path ``prefix`` read from it) and its idle
    keep-alive connections."""

    url: str
    host: str
    port: int
    prefix: str
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = field(default_factory=list)


def parse_url(url: str) -> tuple[str, int, str]:
    parts = urlsplit(url if "://" in url else "http://" + url)
    if parts.scheme != "http":
        raise ValueError(f"only http:// SGLang URLs are supported, got {url!r}")
    if not parts.hostname:
        raise ValueError(f"no host in {url!r}")
    return parts.hostname, parts.port or 80, parts.path.rstrip("/")


class HTTPClient:
    """JSON over keep-alive HTTP/1.1 to the ``Peer`` it is handed. ``connect_timeout_s`` bounds
    each new connection; at most ``max_idle_connections`` stay pooled per server; none is pooled
    once ``closed()`` says the engine is closed."""

    def __init__(self, *, connect_timeout_s: float, max_idle_connections: int, closed: Callable[[], bool]) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.max_idle_connections = max_idle_connections
        self._is_closed = closed

    async def request(
        self, s: Peer, method: str, path: str, payload: Optional[dict], timeout: float
    ) -> tuple[int, Any]:
        body = b"" if payload is None else json.dumps(payload).encode()
        head = (
            f"{method} {s.prefix}{path} HTTP/1.1\r\nHost: {s.host}:{s.port}\r\n"
            f"Content-Type: application/json\r\nAccept: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: keep-alive\r\n\r\n"
        ).encode()
        # A pooled connection the server has since closed fails before any reply byte: retry
        # once on a fresh connection (the request never reached the server).
        while True:
            reused = bool(s.idle)
            try:
                if reused:
                    reader, writer = s.idle.pop()
                else:
                    reader, writer = await asyncio.wait_for(
                        asyncio.open_connection(s.host, s.port), self.connect_timeout_s
                    )
            except (OSError, asyncio.TimeoutError) as exc:
                raise TransportError(f"cannot connect to {s.url}: {exc!r}") from exc
            try:
                writer.write(head + body)
                await writer.drain()
                status, headers, raw, got_bytes = await asyncio.wait_for(
                    self._read_response(reader), timeout
                )
            except asyncio.CancelledError:
                writer.close()
                raise
            except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError) as exc:
                writer.close()
                if reused and not getattr(exc, "_got_bytes", False) and not isinstance(
                    exc, asyncio.TimeoutError
                ):
                    continue
                error = RequestTimeout if isinstance(exc, asyncio.TimeoutError) else TransportError
                raise error(f"{method} {s.url}{path} failed: {exc!r}") from exc
            break
        keep = headers.get("connection", "").lower() != "close" and not self._is_closed()
        if keep and len(s.idle) < self.max_idle_connections:
            s.idle.append((reader, writer))
        else:
            writer.close()
        if status >= 500:
            raise TransportError(f"{method} {s.url}{path}: HTTP {status}: {raw[:200]!r}")
        if not raw:
            return status, None
        ctype = headers.get("content-type", "")
        try:
            data = json.loads(raw)
        except ValueError:
            if "json" in ctype:
                raise proto.SGLangProtocolError(
                    f"{method} {s.url}{path}: response body is not valid JSON: {raw[:200]!r}"
                )
            data = raw.decode("utf-8", "replace")
        return status, data

    @classmethod
    async def _read_response(cls, reader: asyncio.StreamReader) -> tuple[int, dict, bytes, bool]:
        status, headers = await cls._read_head(reader)
        try:
            raw = b"".join([piece async for piece in cls._body_pieces(reader, headers)])
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
            exc._got_bytes = True  # type: ignore[attr-defined]
            raise
        return status, headers, raw, True

    @staticmethod
    async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict]:
        """The status line and headers (lower-case names) of a response."""
        line = await reader.readline()
        if not line:
            raise asyncio.IncompleteReadError(b"", None)  # closed before replying
        try:
            parts = line.decode("latin-1").split(" ", 2)
            if not parts[0].startswith("HTTP/1."):
                raise ValueError
            status = int(parts[1])
        except (ValueError, IndexError):
            exc = ValueError(f"bad HTTP status line {line!r}")
            exc._got_bytes = True  # type: ignore[attr-defined]
            raise exc
        headers: dict[str, str] = {}
        try:
            while True:
                h = await reader.readline()
                if h in (b"\r\n", b"\n"):
                    break
                if not h:
                    raise asyncio.IncompleteReadError(b"", None)
                k, _, v = h.decode("latin-1").partition(":")
                headers[k.strip().lower()] = v.strip()
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
            exc._got_bytes = True  # type: ignore[attr-defined]
            raise
        return status, headers

    @staticmethod
    async def _body_pieces(reader: asyncio.StreamReader, headers: dict) -> AsyncIterator[bytes]:
        """The body as it arrives: chunk by chunk (chunked encoding), or all at once. A body
        delimited by the connection's end sets ``headers["connection"] = "close"``."""
        if headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                        pass
                    return
                yield await reader.readexactly(size)
                await reader.readexactly(2)
        elif "content-length" in headers:
            yield await reader.readexactly(int(headers["content-length"]))
        else:
            headers["connection"] = "close"
            while True:
                piece = await reader.read(1 << 16)
                if not piece:
                    return
                yield piece

    async def stream(self, s: Peer, path: str, payload: dict, events: asyncio.Queue, timeout: float) -> None:
        """POST ``payload`` asking for server-sent events; put each event's JSON on ``events``,
        then a ``StreamEnd`` (with the error, if the exchange failed); ``timeout`` bounds the wait
        for the answer's head and for each event."""
        try:
            await self._read_events(s, path, payload, events, timeout)
        except asyncio.CancelledError:
            events.put_nowait(StreamEnd(cancelled=True))
            raise
        except Exception as exc:  # noqa: BLE001 - handed to the reading generator
            events.put_nowait(StreamEnd(error=exc))
        else:
            events.put_nowait(StreamEnd())

    async def _read_events(self, s: Peer, path: str, payload: dict, events: asyncio.Queue,
                           timeout: float) -> None:
        body = json.dumps(payload).encode()
        head = (
            f"POST {s.prefix}{path} HTTP/1.1\r\nHost: {s.host}:{s.port}\r\n"
            f"Content-Type: application/json\r\nAccept: text/event-stream\r\n"
            f"Content-Length: {len(body)}\r\nConnection: keep-alive\r\n\r\n"
        ).encode()
        try:  # a fresh connection: a pooled one may have been closed by the server meanwhile
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(s.host, s.port), self.connect_timeout_s)
        except (OSError, asyncio.TimeoutError) as exc:
            raise TransportError(f"cannot connect to {s.url}: {exc!r}") from exc
        reusable = False
        try:
            try:
                writer.write(head + body)
                await writer.drain()
                status, headers = await asyncio.wait_for(self._read_head(reader), timeout)
                if status != 200 or "text/event-stream" not in headers.get("content-type", ""):
                    raw = await asyncio.wait_for(self._read_body(reader, headers), timeout)
                    reusable = headers.get("connection", "").lower() != "close"
                    if status >= 500:
                        raise TransportError(f"POST {s.url}{path}: HTTP {status}: {raw[:200]!r}")
                    try:
                        data = json.loads(raw) if raw else None
                    except ValueError:
                        data = raw.decode("utf-8", "replace")
                    if status >= 400:
                        raise proto.SGLangServerError(f"SGLang {path} failed with HTTP {status}: {data!r}")
                    events.put_nowait(data)  # a server that answered in one piece
                    return
                buffer, done = b"", False
                pieces = self._body_pieces(reader, headers).__aiter__()
                while True:
                    try:
                        piece = await asyncio.wait_for(pieces.__anext__(), timeout)
                    except StopAsyncIteration:
                        break
                    buffer += piece.replace(b"\r\n", b"\n")
                    while b"\n\n" in buffer:
                        event, buffer = buffer.split(b"\n\n", 1)
                        data = proto.sse_data(event)
                        if data is None:
                            continue
                        if data == proto.STREAM_DONE:
                            done = True
                            continue
                        try:
                            events.put_nowait(json.loads(data))
                        except ValueError:
                            raise proto.SGLangProtocolError(
                                f"SGLang {path} stream: an event is not valid JSON: {data[:200]!r}") from None
                reusable = done and headers.get("connection", "").lower() != "close"
            except asyncio.TimeoutError as exc:
                raise RequestTimeout(f"POST {s.url}{path}: no event within {timeout} s") from exc
            except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
                if isinstance(exc, proto.SGLangProtocolError):
                    raise
                raise TransportError(f"POST {s.url}{path} failed: {exc!r}") from exc
        finally:
            if reusable and not self._is_closed() and len(s.idle) < self.max_idle_connections:
                s.idle.append((reader, writer))
            else:
                writer.close()

    @classmethod
    async def _read_body(cls, reader: asyncio.StreamReader, headers: dict) -> bytes:
        return b"".join([piece async for piece in cls._body_pieces(reader, headers)])


@dataclass
class StreamEnd:
    """The end of a streamed exchange: normal, failed (``error``) or cancelled (engine closed or
    caller gone)."""

    error: Optional[BaseException] = None
    cancelled: bool = False
