"""Hand-rolled HTTP fakes: what they share, once.

``LocalServer(handler)`` serves a ``BaseHTTPRequestHandler`` class on 127.0.0.1 (a free port) from
a daemon thread: ``.url`` is ``http://127.0.0.1:PORT``, ``.close()`` shuts it down (it is also a
context manager). ``JsonHandler`` is a quiet handler with ``read_json()`` and ``send_json()``;
``chat_completion(model, text)`` is the body of an OpenAI chat-completions answer. What each fake
answers (scripts, faults, holds) stays in its test.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class JsonHandler(BaseHTTPRequestHandler):
    """A request handler that logs nothing and speaks JSON."""

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def read_json(self, default: Any = None) -> Any:
        """The request body as JSON; ``default`` when there is none."""
        raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        return json.loads(raw) if raw else default

    def send_json(self, status: int, payload: Any) -> None:
        """``payload`` as a JSON body (an empty body for ``None``), with its length."""
        data = b"" if payload is None else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def chat_completion(model: str, text: str, completion_id: str = "c") -> dict:
    """An OpenAI ``chat.completion`` answering ``text`` (stop), with token counts of 1."""
    return {"id": completion_id, "object": "chat.completion", "created": 0, "model": model,
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


class LocalServer:
    """``handler`` served on 127.0.0.1 (port chosen by the OS) from a daemon thread."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]):
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)  # daemon_threads: its default, True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self, join_timeout_s: float | None = None) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        if join_timeout_s is not None:
            self.thread.join(timeout=join_timeout_s)

    def __enter__(self) -> "LocalServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
