"""A small HTTP/1.1 server on asyncio streams (stdlib only), enough for an OpenAI-style API.

One coroutine per connection reads requests in turn (keep-alive unless the client asks to close
or speaks HTTP/1.0), hands each to the application's ``handler`` and writes its answer: a
``Response`` (body with ``Content-Length``) or a ``StreamResponse`` (an async iterator of byte
chunks sent with chunked transfer encoding, e.g. server-sent events). Request bodies come with
``Content-Length`` or chunked encoding and are limited to ``max_body_bytes``. A client that goes
away mid-stream closes the iterator, so the application can stop its work: the server notices
when a write fails, or, before each chunk, when the client has closed its end (EOF on the read
side: an HTTP/1.1 client sends nothing while it waits for the answer, so EOF means it is gone).
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, AsyncIterator, Awaitable, Callable, Optional, Union
from urllib.parse import parse_qs, urlsplit

log = logging.getLogger(__name__)

MAX_HEADER_BYTES = 64 << 10


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]  # lower-case names
    body: bytes = b""

    def json(self) -> Any:
        return json.loads(self.body.decode("utf-8"))


def json_bytes(value: Any) -> bytes:
    """``value`` as UTF-8 JSON, non-ASCII text as written; a value holding a lone surrogate (a tool
    call's arguments decoded from a model's ``"\\ud800"``), which UTF-8 cannot encode, is written
    with ``\\uXXXX`` escapes instead of failing the response."""
    text = json.dumps(value, ensure_ascii=False)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(value).encode("utf-8")


@dataclass
class Response:
    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def json(cls, value: Any, status: int = 200) -> "Response":
        return cls(status, json_bytes(value))


@dataclass
class StreamResponse:
    chunks: AsyncIterator[bytes]
    status: int = 200
    content_type: str = "text/event-stream"
    headers: dict[str, str] = field(default_factory=dict)


Handler = Callable[[Request], Awaitable[Union[Response, StreamResponse]]]


class BadHTTP(Exception):
    """The bytes on the connection are not an HTTP request we can read."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class HTTPServer:
    """Serve ``handler`` on ``host:port`` (port 0: any free port; ``port`` is set by ``start``)."""

    def __init__(self, handler: Handler, host: str = "127.0.0.1", port: int = 0, *,
                 max_body_bytes: int = 64 << 20) -> None:
        self.handler = handler
        self.host = host
        self.port = port
        self.max_body_bytes = max_body_bytes
        self._server: Optional[asyncio.base_events.Server] = None
        self._connections: set[asyncio.Task] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._connection, self.host, self.port,
                                                  limit=MAX_HEADER_BYTES)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._connections):
                task.cancel()
            await asyncio.gather(*self._connections, return_exceptions=True)
            await self._server.wait_closed()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._connections.add(task)
        try:
            while True:
                try:
                    request, keep_alive = await self._read_request(reader)
                except BadHTTP as exc:
                    await _write_response(writer, Response.json(
                        {"error": {"message": str(exc), "type": "invalid_request_error",
                                   "param": None, "code": None}}, exc.status), False)
                    return
                if request is None:
                    return
                try:
                    answer = await self.handler(request)
                except Exception:  # noqa: BLE001 - one failed request must not stop the server
                    log.exception("handler failed on %s %s", request.method, request.path)
                    answer = Response.json({"error": {"message": "internal server error",
                                                      "type": "internal_error", "param": None,
                                                      "code": None}}, 500)
                if isinstance(answer, StreamResponse):
                    keep_alive = await _write_stream(reader, writer, answer, keep_alive)
                else:
                    await _write_response(writer, answer, keep_alive)
                if not keep_alive:
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        except asyncio.CancelledError:
            # close() ends the connection; a task that ends cancelled makes asyncio's stream
            # callback (Python 3.11) log a spurious traceback
            return
        finally:
            self._connections.discard(task)
            writer.close()

    async def _read_request(self, reader: asyncio.StreamReader) -> tuple[Optional[Request], bool]:
        try:
            line = await reader.readuntil(b"\r\n")
        except asyncio.IncompleteReadError as exc:
            if not exc.partial:
                return None, False  # the client closed an idle connection
            raise
        except asyncio.LimitOverrunError:
            raise BadHTTP(431, "request line too long") from None
        parts = line.decode("latin-1").strip().split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise BadHTTP(400, "malformed HTTP request line")
        method, target, version = parts
        headers: dict[str, str] = {}
        size = len(line)
        while True:
            try:
                line = await reader.readuntil(b"\r\n")
            except asyncio.LimitOverrunError:
                raise BadHTTP(431, "header line too long") from None
            size += len(line)
            if size > MAX_HEADER_BYTES:
                raise BadHTTP(431, "request headers too large")
            if line == b"\r\n":
                break
            name, sep, value = line.decode("latin-1").partition(":")
            if not sep:
                raise BadHTTP(400, "malformed header line")
            headers[name.strip().lower()] = value.strip()
        connection = headers.get("connection", "").lower()
        keep_alive = "close" not in connection if version == "HTTP/1.1" else "keep-alive" in connection
        body = await self._read_body(reader, headers)
        url = urlsplit(target)
        return Request(method.upper(), url.path or "/", parse_qs(url.query), headers, body), keep_alive

    async def _read_body(self, reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
        if "chunked" in headers.get("transfer-encoding", "").lower():
            body = bytearray()
            while True:
                size_line = await reader.readuntil(b"\r\n")
                try:
                    size = int(size_line.split(b";")[0].strip(), 16)
                except ValueError:
                    raise BadHTTP(400, "malformed chunk size") from None
                if size == 0:
                    while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers
                        pass
                    return bytes(body)
                if len(body) + size > self.max_body_bytes:
                    raise BadHTTP(413, f"request body over {self.max_body_bytes} bytes")
                body += await reader.readexactly(size)
                await reader.readexactly(2)
        length = headers.get("content-length")
        if length is None:
            return b""
        try:
            count = int(length)
        except ValueError:
            raise BadHTTP(400, "malformed Content-Length") from None
        if count < 0:
            raise BadHTTP(400, "malformed Content-Length")
        if count > self.max_body_bytes:
            raise BadHTTP(413, f"request body over {self.max_body_bytes} bytes")
        return await reader.readexactly(count)


def _head(status: int, content_type: str, extra: dict[str, str], keep_alive: bool) -> list[str]:
    try:
        reason = HTTPStatus(status).phrase
    except ValueError:
        reason = "Status"
    lines = [f"HTTP/1.1 {status} {reason}", f"Content-Type: {content_type}",
             f"Connection: {'keep-alive' if keep_alive else 'close'}"]
    lines += [f"{k}: {v}" for k, v in extra.items()]
    return lines


async def _write_response(writer: asyncio.StreamWriter, response: Response, keep_alive: bool) -> None:
    lines = _head(response.status, response.content_type, response.headers, keep_alive)
    lines.append(f"Content-Length: {len(response.body)}")
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + response.body)
    await writer.drain()


async def _write_stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                        response: StreamResponse, keep_alive: bool) -> bool:
    """Send the chunks; returns whether the connection can be reused. Raises ``ConnectionError``
    when the client went away (after closing the iterator)."""
    extra = {"Cache-Control": "no-cache", **response.headers, "Transfer-Encoding": "chunked"}
    lines = _head(response.status, response.content_type, extra, keep_alive)
    chunks = response.chunks
    try:
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        await writer.drain()
        async for chunk in chunks:
            if reader.at_eof():
                raise ConnectionResetError("the client closed the connection mid-stream")
            if chunk:
                writer.write(f"{len(chunk):x}\r\n".encode("latin-1") + chunk + b"\r\n")
                await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return keep_alive
    finally:
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            await aclose()
