"""The environment explorer: a page that maps every environment of some runs and lets one read each.

The page is three static files (``explorer_assets/``: ``index.html``, ``app.js``, ``app.css``,
plain JS with no outside library) and data as JavaScript files, so the same site works served and
opened from disk (a browser will not ``fetch`` ``file://`` URLs, but it runs ``<script>`` files):

* ``data.js``: ``spadeData({...})`` with the runs (metric curves per step, rejected candidates per
  step, env_source and what does not apply to it) and one summary row per environment (map
  position, class name, skill, win rate, regret, an rlve problem's level and accuracy ...); ``map``
  says what the map's axes are (an rlve run has no code to embed: its problems sit on a grid of
  environment identifier by level);
* ``details/KEY.js``: ``spadeDetail("UID", {...})`` with one environment's source, hint,
  document excerpt and kept trajectories, loaded when its point is clicked.

``build_site`` computes both from run directories; ``export_site`` writes them with the assets
(``spade explore --export DIR``); ``ExplorerServer`` serves them from memory on 127.0.0.1 and
rebuilds when a run directory changed (a run in progress: the page reloads its data).
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import threading
import time
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable
from urllib.parse import unquote, urlparse

from .embeddings import Embedder
from .report import analyze, step_table
from .run_reader import EnvRecord, Run, read_runs, signature

ASSETS = Path(__file__).resolve().parent / "explorer_assets"
ASSET_FILES = ("index.html", "app.js", "app.css")
MAX_RESPONSE_CHARS = 20000  # of a rejected candidate's raw response shown
MAX_METRIC_KEYS = 60
SUMMARY_KEYS = ("uid", "run", "env_id", "generated_step", "slot", "skill", "class_name", "x", "y", "win_rate",
                "window_win", "regret", "learnable", "reward_levels", "partial_levels", "physics", "formula_revealed",
                "lines", "state_variables", "turns", "hint_contains_answer", "kept_episodes", "attempts", "env_source",
                "level", "accuracy", "map")
CURVE_KEYS = ("vendi_per_n", "learnable_share", "win_rate_median", "win_rate_mean", "regret_median", "regret_mean",
              "reward_levels_mean", "partial_levels_mean", "formula_reveal_share", "state_gated_share",
              "lines_mean", "state_variables_mean", "turns_mean", "duplicate_share", "hint_contains_answer_share",
              "hint_one_turn_win_rate", "nohint_one_turn_win_rate", "n_envs", "distinct_envs", "rejected",
              "rlve_accuracy", "rlve_level_mean", "rlve_distinct_environments")


def detail_key(uid: str) -> str:
    return hashlib.sha1(uid.encode("utf-8")).hexdigest()[:16]


def _js_call(function: str, *args: Any) -> str:
    # "</" never appears raw, so the payload cannot end a <script> element early if inlined
    body = ", ".join(json.dumps(a, allow_nan=False, default=str).replace("</", "<\\/") for a in args)
    return f"{function}({body});\n"


def _clean(value: Any) -> Any:
    if isinstance(value, float) and value != value:  # NaN is not JSON
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def _numeric_metrics(run: Run) -> dict[str, list[list[float]]]:
    """metrics.jsonl as curves: key -> [[step, value], ...], numeric keys only."""
    curves: dict[str, list[list[float]]] = {}
    for row in run.metrics:
        for key, value in row.items():
            if key == "step" or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if value != value or value in (float("inf"), float("-inf")):
                continue
            curves.setdefault(key, []).append([row["step"], float(value)])
    keep = sorted(curves, key=lambda k: (not k.startswith(("agent/", "designer/", "env/", "rlve/")), k))[:MAX_METRIC_KEYS]
    return {k: curves[k] for k in keep}


def map_caption(rows: list[dict[str, Any]], embedding: str) -> str:
    """What the map's two axes are: t-SNE of code embeddings, rlve problems on a grid, or both."""
    kinds = {row.get("map") for row in rows}
    parts = []
    if "tsne" in kinds:
        parts.append(f"t-SNE of {embedding} embeddings of the sources")
    if "rlve_grid" in kinds:
        parts.append("rlve problems by rlve-gym environment (x, sorted by name) and difficulty level (y)")
    return "; ".join(parts) or "no environments"


def _detail(env: EnvRecord) -> dict[str, Any]:
    return {"uid": env.uid, "source": env.source, "hint": env.hint, "document": env.document,
            "max_turns": env.max_turns, "nohint_returns": {str(k): v for k, v in sorted(env.nohint_returns.items())},
            "hint_returns": {str(k): v for k, v in sorted(env.hint_returns.items())},
            "episodes": [e.to_json() for e in env.episodes]}


@dataclass
class Site:
    data_js: str
    details: dict[str, str] = field(default_factory=dict)  # key -> js
    built_at: float = 0.0


def build_site(run_dirs: list[str | Path], embedder: Embedder, seed: int = 0,
               progress: Callable[[str], None] | None = None) -> Site:
    runs = read_runs(run_dirs)
    analysis = analyze(runs, embedder, None, seed=seed, progress=progress)
    rows = {row["uid"]: row for row in analysis.rows}
    steps = step_table(analysis.data)
    out_runs = []
    for run in runs:
        rejected: dict[str, list[dict[str, Any]]] = {}
        for rejection in run.rejections:
            rejected.setdefault(str(rejection.step), []).append(rejection.to_json(MAX_RESPONSE_CHARS))
        curves = {key: [[s["step"], s.get(key)] for s in steps if s["run"] == run.name and s.get(key) is not None]
                  for key in CURVE_KEYS}
        summary = next(r for r in analysis.data["runs"] if r["name"] == run.name)
        for cell in summary.get("rlve", {}).get("by_level", []):  # accuracy of each level's plays, every step
            if cell["accuracy"] is not None:
                curves.setdefault(f"rlve_accuracy_level_{cell['level']}", []).append([cell["step"], cell["accuracy"]])
        out_runs.append({"name": run.name, "path": str(run.path), "k": run.k, "env_source": summary["env_source"],
                         "not_applicable": summary["not_applicable"],
                         "regeneration_steps": run.regeneration_steps, "curves": curves,
                         "metrics": _numeric_metrics(run), "rejected": rejected,
                         "last_step": run.metrics[-1]["step"] if run.metrics else None})
    envs = []
    details = {}
    for env in analysis.envs:
        row = rows[env.uid]
        summary = {k: row.get(k) for k in SUMMARY_KEYS}
        summary["detail"] = detail_key(env.uid)
        envs.append(summary)
        details[summary["detail"]] = _js_call("spadeDetail", env.uid, _clean(_detail(env)))
    data = {"built_at": time.strftime("%Y-%m-%d %H:%M:%S"), "build": time.time_ns(), "embedding": analysis.data["embedding"],
            "map": map_caption(analysis.rows, analysis.data["embedding"]), "runs": out_runs, "envs": envs}
    return Site(data_js=_js_call("spadeData", _clean(data)), details=details, built_at=time.time())


def export_site(site: Site, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    for name in ASSET_FILES:
        shutil.copyfile(ASSETS / name, out / name)
    (out / "data.js").write_text(site.data_js, encoding="utf-8")
    details = out / "details"
    if details.is_dir():
        for stale in details.glob("*.js"):
            if stale.stem not in site.details:
                stale.unlink()
    details.mkdir(exist_ok=True)
    for key, js in site.details.items():
        (details / f"{key}.js").write_text(js, encoding="utf-8")
    return out / "index.html"


class _SiteCache:
    """The current site; rebuilt (once at a time) when a run directory's signature changed."""

    def __init__(self, run_dirs: list[str | Path], embedder: Embedder, seed: int,
                 progress: Callable[[str], None] | None):
        self.run_dirs = run_dirs
        self.embedder = embedder
        self.seed = seed
        self.progress = progress
        self._lock = threading.Lock()
        self._site: Site | None = None
        self._signature: tuple[Any, ...] | None = None

    def get(self) -> Site:
        with self._lock:
            current = signature(self.run_dirs)
            if self._site is None or current != self._signature:
                self._site = build_site(self.run_dirs, self.embedder, self.seed, self.progress)
                self._signature = current
            return self._site

    def cached(self) -> Site | None:
        return self._site


_DETAIL_PATH = re.compile(r"^/details/([0-9a-f]{16})\.js$")
_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
          ".css": "text/css; charset=utf-8", ".json": "application/json"}


class ExplorerServer:
    """``ThreadingHTTPServer`` on 127.0.0.1 serving the site of ``run_dirs``."""

    def __init__(self, run_dirs: list[str | Path], embedder: Embedder, port: int = 0, seed: int = 0,
                 progress: Callable[[str], None] | None = None):
        self.cache = _SiteCache(run_dirs, embedder, seed, progress)
        cache = self.cache

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _send(self, status: int, body: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
                path = unquote(urlparse(self.path).path)
                if path in ("/", "/index.html"):
                    path = "/index.html"
                try:
                    if path.lstrip("/") in ASSET_FILES:
                        name = path.lstrip("/")
                        self._send(HTTPStatus.OK, (ASSETS / name).read_bytes(), _TYPES[Path(name).suffix])
                    elif path == "/data.js":
                        self._send(HTTPStatus.OK, cache.get().data_js.encode("utf-8"), _TYPES[".js"])
                    elif path == "/data.json":
                        js = cache.get().data_js
                        self._send(HTTPStatus.OK, js[len("spadeData("):-3].encode("utf-8"), _TYPES[".json"])
                    elif (match := _DETAIL_PATH.match(path)) is not None:
                        site = cache.cached() or cache.get()
                        js = site.details.get(match.group(1))
                        if js is None:
                            site = cache.get()
                            js = site.details.get(match.group(1))
                        if js is None:
                            self._send(HTTPStatus.NOT_FOUND, b"no such environment", "text/plain")
                        else:
                            self._send(HTTPStatus.OK, js.encode("utf-8"), _TYPES[".js"])
                    else:
                        self._send(HTTPStatus.NOT_FOUND, b"not found", "text/plain")
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self.httpd.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def serve_forever(self) -> None:
        self.httpd.serve_forever()

    def start(self) -> "ExplorerServer":
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="spade-explorer", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)
