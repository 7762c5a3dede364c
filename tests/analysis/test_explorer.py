"""The explorer in a real browser: headless Chromium (Debian's package) driven over the DevTools
protocol loads the exported site from disk and the served site from 127.0.0.1, and the test reads
the rendered DOM: one point per environment, a real mouse click on a point shows its source, the
trajectories tab shows the turns, a reload picks up an environment added to a run in progress.
Screenshots are saved (``SPADE_EXPLORER_SCREENSHOT=PATH`` keeps one of the served page)."""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import struct
import subprocess
import threading
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest

from spade.analysis.embeddings import HashingEmbedder
from spade.analysis.explorer import ExplorerServer, build_site, export_site
from spade.cli import main
from test_analysis_fixture import example_source, two_env_run

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None:  # a failure, not a skip: CI installs it (.ci/run)
    raise RuntimeError("headless Chromium is not installed (apt-get install chromium; .ci/run installs it)")


class DevTools:
    """A minimal DevTools-protocol client over one WebSocket (RFC 6455, client frames masked)."""

    def __init__(self, ws_url: str):
        rest = ws_url.split("://", 1)[1]
        host_port, path = rest.split("/", 1)
        host, port = host_port.split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET /{path} HTTP/1.1\r\nHost: {host_port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                           f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
        response = b""
        while b"\r\n\r\n" not in response:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError("DevTools closed the handshake")
            response += chunk
        assert b" 101 " in response.split(b"\r\n", 1)[0], response
        self.buffer = response.split(b"\r\n\r\n", 1)[1]
        self.next_id = 0

    def _read(self, n: int) -> bytes:
        while len(self.buffer) < n:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError("DevTools closed the connection")
            self.buffer += chunk
        data, self.buffer = self.buffer[:n], self.buffer[n:]
        return data

    def _send(self, text: str) -> None:
        payload = text.encode()
        header = bytes([0x81])
        if len(payload) < 126:
            header += bytes([0x80 | len(payload)])
        elif len(payload) < 1 << 16:
            header += bytes([0x80 | 126]) + struct.pack(">H", len(payload))
        else:
            header += bytes([0x80 | 127]) + struct.pack(">Q", len(payload))
        mask = os.urandom(4)
        self.sock.sendall(header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))

    def _message(self) -> dict[str, Any]:
        parts = []
        while True:
            first, second = self._read(2)
            length = second & 0x7F
            if length == 126:
                (length,) = struct.unpack(">H", self._read(2))
            elif length == 127:
                (length,) = struct.unpack(">Q", self._read(8))
            payload = self._read(length)
            if first & 0x0F == 0x8:
                raise ConnectionError("DevTools closed the socket")
            if first & 0x0F in (0x1, 0x0):
                parts.append(payload)
                if first & 0x80:
                    return json.loads(b"".join(parts))

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        self._send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = self._message()
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in result:
            raise AssertionError(f"page error: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, condition: str, timeout_ms: int = 15000) -> Any:
        """Resolve in the page once ``condition`` is truthy (polled by the page itself), or fail."""
        return self.evaluate(f"""new Promise(function (resolve, reject) {{
            var start = Date.now();
            (function poll() {{
                var value; try {{ value = ({condition}); }} catch (e) {{ value = null; }}
                if (value) return resolve(value);
                if (Date.now() - start > {timeout_ms}) return reject(new Error("timed out waiting for: " + {json.dumps(condition)}));
                setTimeout(poll, 50);
            }})();
        }})""")

    def click_at(self, x: float, y: float) -> None:
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.write_bytes(base64.b64decode(data))
        return path


@pytest.fixture(scope="module")
def browser(tmp_path_factory) -> Iterator[DevTools]:
    profile = tmp_path_factory.mktemp("chromium-profile")
    process = subprocess.Popen([CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                                "--disable-extensions", "--disable-background-networking", "--remote-debugging-port=0",
                                "--remote-allow-origins=*", "--allow-file-access-from-files", "--window-size=1400,1000",
                                f"--user-data-dir={profile}", "about:blank"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        line = b""
        while b"DevTools listening on" not in line:  # Chromium says where once it listens
            line = process.stderr.readline()
            if not line and process.poll() is not None:
                pytest.fail("chromium exited before listening")
        port = int(line.decode().split("ws://127.0.0.1:", 1)[1].split("/", 1)[0])
        # keep reading what Chromium logs, so that a full pipe never blocks it
        threading.Thread(target=lambda: [None for _ in iter(process.stderr.readline, b"")], daemon=True).start()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=30) as reply:
            pages = [t for t in json.load(reply) if t.get("type") == "page"]
        tools = DevTools(pages[0]["webSocketDebuggerUrl"])
        tools.call("Page.enable")
        tools.call("Runtime.enable")
        tools.call("Emulation.setDeviceMetricsOverride", width=1400, height=1000, deviceScaleFactor=1, mobile=False)
        yield tools
    finally:
        process.kill()
        process.wait()


def check_page(tools: DevTools, url: str, n_envs: int, shot: Path) -> None:
    tools.call("Page.navigate", url=url)
    assert tools.wait_for(f"document.querySelectorAll('circle.pt').length === {n_envs}")
    assert "environments" in tools.evaluate("document.getElementById('summary').textContent")
    # a real mouse click on the switchboard of step 0
    box = tools.evaluate("""(function () {
        var c = document.querySelector('circle.pt[data-uid$=":0:s000000-e00"]');
        var r = c.getBoundingClientRect(); return [r.left + r.width / 2, r.top + r.height / 2]; })()""")
    tools.click_at(*box)
    assert tools.wait_for("document.getElementById('source').textContent.indexOf('class SwitchboardEnv') >= 0")
    assert tools.evaluate("document.querySelectorAll('#source .kw').length") > 10  # highlighted
    assert "SwitchboardEnv" in tools.evaluate("document.getElementById('detail-title').textContent")
    assert tools.evaluate("document.getElementById('hint').textContent") == "Flip each switch once to learn its wires."
    # trajectories, turn by turn, per arm
    tools.evaluate("document.querySelector('#tabs button[data-tab=trajectories]').click()")
    assert tools.wait_for("document.querySelectorAll('#episodes table.turns tr').length > 3")
    assert "flip" in tools.evaluate("document.querySelector('#episodes table.turns').textContent")
    tools.evaluate("document.querySelector('#arms button[data-arm=hint]').click()")
    assert tools.wait_for("document.getElementById('episodes').textContent.indexOf('HINT: flip each switch once') >= 0")
    # rejected candidates of the step, and a metric curve
    tools.evaluate("document.querySelector('#tabs button[data-tab=rejected]').click()")
    assert "syntax_error" in tools.evaluate("document.getElementById('rejected-env').textContent")
    assert tools.evaluate("document.querySelectorAll('#curve polyline.series').length") >= 1
    # colour by skill and filter to one skill
    tools.evaluate("var s = document.getElementById('f-skill'); s.value = 'Mathematical Reasoning';"
                   "s.dispatchEvent(new Event('change'))")
    assert tools.wait_for("document.querySelectorAll('circle.pt').length === 1")
    tools.evaluate("var s = document.getElementById('f-skill'); s.value = ''; s.dispatchEvent(new Event('change'))")
    tools.evaluate("document.querySelector('#tabs button[data-tab=source]').click()")
    tools.screenshot(shot)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10000


def test_exported_site_opens_from_disk(browser: DevTools, tmp_path: Path) -> None:
    run = two_env_run(tmp_path)
    index = export_site(build_site([run], HashingEmbedder()), tmp_path / "site")
    assert sorted(p.name for p in index.parent.iterdir()) == ["app.css", "app.js", "data.js", "details", "index.html"]
    assert len(list((index.parent / "details").glob("*.js"))) == 3
    check_page(browser, index.as_uri(), 3, tmp_path / "exported.png")


def test_served_site_and_reload_of_a_run_in_progress(browser: DevTools, tmp_path: Path) -> None:
    run = two_env_run(tmp_path)
    server = ExplorerServer([run], HashingEmbedder(), port=0).start()
    try:
        assert server.httpd.server_address[0] == "127.0.0.1"
        shot = Path(os.environ.get("SPADE_EXPLORER_SCREENSHOT") or tmp_path / "served.png")
        check_page(browser, server.url, 3, shot)
        with urllib.request.urlopen(server.url + "data.json", timeout=30) as reply:
            assert len(json.load(reply)["envs"]) == 3
        # the run goes on: a new regeneration step lands, the page reloads
        step = run / "envs" / "step_000004"
        step.mkdir()
        (step / "s000004-e00.py").write_text(example_source("hidden_sequence"))
        (step / "s000004-e00.hint.txt").write_text("")
        (step / "s000004-e00.json").write_text(json.dumps({"env_id": "s000004-e00", "slot": 0, "skill": "Pattern Recognition",
                                                           "class_name": "HiddenSequenceEnv", "generated_step": 4}))
        browser.evaluate("document.getElementById('reload').click()")
        assert browser.wait_for("document.querySelectorAll('circle.pt').length === 4")
    finally:
        server.close()


def test_explore_export_command(tmp_path: Path, capsys) -> None:
    run = two_env_run(tmp_path)
    assert main(["explore", str(run), "--export", str(tmp_path / "site"), "--embedding", "hashing"]) == 0
    assert "(3 environments)" in capsys.readouterr().out
    data = (tmp_path / "site" / "data.js").read_text()
    assert data.startswith("spadeData(") and "</script" not in data
