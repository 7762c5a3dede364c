"""A recording stand-in for SGLang servers at the HTTP boundary, for tests of call order.

``RecordingEngine`` is the real ``SGLangEngine`` (placement, release/resume bookkeeping, the
bodies it builds) with only its transport replaced: every request is appended to ``calls`` (as
``Call``: server index, path, memory tags) and answered the way SGLang 0.5.23 answers it
(``protocol.ENDPOINTS``: weight endpoints ``{"success", "message"}``, memory endpoints
``null``, pause/continue ``{"status": "ok"}``, ``/flush_cache`` plain text). The weight payloads are
decoded as a server worker would (which also gives the shared memory back) and kept in ``received``
unless ``keep=False``. CUDA refuses to open a CUDA-IPC handle in the process that made it (torch's
sender and receiver caches use different keys, so the rebuild asks the driver), as a real server
is always another process: with ``decode_in_child=True`` one long-lived child process decodes every
payload instead, as a server worker does, and ``received_elsewhere`` holds what it read (name,
shape, sum of the values, its pid).
``on_call`` runs before each answer (a test hook: delay, check another process's progress).

``RecordingMemory`` stands for the trainer's ``TrainingMemory``: it appends its moves to the same
log, so one list shows the order of server calls and trainer offloads.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Optional

from spade.rollout.sglang.engine import SGLangEngine
from spade.rollout.sglang.weight_transport import deserialize_named_tensors


@dataclasses.dataclass(frozen=True)
class Call:
    server: Optional[int]  # None: the trainer, not a server
    what: str  # the HTTP path, or the trainer's move ("offload_state", ...)
    tags: tuple[str, ...] = ()


@dataclasses.dataclass
class _Move:
    seconds: float = 0.0
    total_bytes: int = 0


_WEIGHT_PATHS = {"/begin_weight_update", "/end_weight_update", "/update_weights_from_tensor",
                 "/update_weight_version", "/init_weights_update_group", "/destroy_weights_update_group",
                 "/update_weights_from_distributed"}


# The child: one payload file path a line in, one JSON line out; it ends when its stdin closes.
_DECODER = """
import json, os, sys
import torch
from spade.rollout.sglang.weight_transport import deserialize_named_tensors
for line in sys.stdin:
    named = deserialize_named_tensors(open(line.strip()).read())
    read = [[name, list(t.shape), float(t.double().sum())] for name, t in named]
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    del named
    print(json.dumps({"pid": os.getpid(), "read": read}), flush=True)
"""


class ChildDecoder:
    """A process of its own that opens weight payloads, as a server's worker does."""

    def __init__(self) -> None:
        root = Path(__file__).resolve().parent.parent
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
        self.process = subprocess.Popen([sys.executable, "-c", _DECODER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True, env=env)
        self.folder = tempfile.TemporaryDirectory(prefix="spade-decoder-")

    def decode(self, payload: str) -> dict:
        path = Path(self.folder.name) / "payload.txt"
        path.write_text(payload)
        self.process.stdin.write(f"{path}\n")
        self.process.stdin.flush()
        answer = self.process.stdout.readline()
        if not answer:
            raise RuntimeError(f"the decoding process ended (exit status {self.process.wait()})")
        return json.loads(answer)

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=60)
        self.process.stdout.close()
        self.folder.cleanup()


class RecordingEngine(SGLangEngine):
    def __init__(self, servers: int, log: list, on_call: Optional[Callable[[Call], Any]] = None, *,
                 keep: bool = True, decode_in_child: bool = False) -> None:
        super().__init__([f"http://127.0.0.1:{40000 + i}" for i in range(servers)])
        self.calls = log
        self.on_call = on_call
        self.keep = keep  # False: decode and drop (the sender's buffers can be freed, as after a real load)
        self.received: list[list] = []  # decoded entries of each /update_weights_from_tensor body
        self.decoder = ChildDecoder() if decode_in_child else None
        self.received_elsewhere: list[dict] = []  # decode_in_child: what the child read, per entry

    def close_decoder(self) -> None:
        if self.decoder is not None:
            self.decoder.close()
            self.decoder = None

    async def _http(self, s: Any, method: str, path: str, payload: Optional[dict], timeout: float) -> tuple[int, Any]:
        index = self.servers.index(s)
        tags = tuple((payload or {}).get("tags") or ()) if "memory_occupation" in path else ()
        call = Call(index, path, tags)
        if path == "/update_weights_from_tensor" and self.decoder is not None:
            self.received_elsewhere.extend(self.decoder.decode(entry) for entry in payload["serialized_named_tensors"])
        elif path == "/update_weights_from_tensor":
            decoded = [deserialize_named_tensors(entry) for entry in payload["serialized_named_tensors"]]
            if self.keep:
                self.received.append(decoded)
            del decoded
        if self.on_call is not None:
            result = self.on_call(call)
            if hasattr(result, "__await__"):
                await result
        self.calls.append(call)
        if path == "/update_weight_version":  # http_server.py: the version comes back as new_version
            return 200, {"success": True, "message": "", "new_version": (payload or {}).get("new_version")}
        if path in _WEIGHT_PATHS:
            return 200, {"success": True, "message": ""}
        if path in ("/pause_generation", "/continue_generation"):
            return 200, {"message": "", "status": "ok"}
        if path == "/flush_cache":
            return 200, "Cache flushed."
        return 200, None


class RecordingMemory:
    """The trainer's memory moves, appended to ``log`` (``TrainingMemory``)."""

    def __init__(self, log: list, on_move: Optional[Callable[[str], None]] = None) -> None:
        self.calls = log
        self.on_move = on_move

    def _move(self, what: str) -> _Move:
        if self.on_move is not None:
            self.on_move(what)
        self.calls.append(Call(None, what))
        return _Move()

    def onload(self):
        return [self._move("onload")]

    def onload_params(self):
        return self._move("onload_params")

    def offload_state(self):
        return self._move("offload_state")

    def offload_params(self):
        return self._move("offload_params")
