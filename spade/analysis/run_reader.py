"""Read what a run directory keeps (docs/analysis.md lists the format) into plain records.

Everything here tolerates a run in progress: a step directory still being written, a metrics
line cut short, a trajectory file not there yet. What is missing is left empty, never guessed.

Environments are identified by ``uid = RUN:GENERATED_STEP:ENV_ID``: the fixed-pool baseline
reuses its env ids (``fixed-NAME``) at every regeneration, designed sets never do.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from .sources import env_source_of

STEP_DIR = re.compile(r"^step_(\d+)$")
STEP_FILE = re.compile(r"^step_(\d+)\.jsonl$")


@dataclass
class Episode:
    """One kept play (a line of kind ``episode``)."""

    step: int
    arm: str  # "nohint" | "hint"
    index: int
    seed: int | None
    opening: str
    turns: list[dict[str, Any]]
    episode_return: float
    end_reason: str

    @property
    def won(self) -> bool:
        return self.episode_return > 0

    @property
    def final_action(self) -> str | None:
        return self.turns[-1].get("action") if self.turns else None

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "arm": self.arm, "index": self.index, "seed": self.seed,
                "opening": self.opening, "turns": self.turns, "return": self.episode_return,
                "end_reason": self.end_reason}


@dataclass
class EnvRecord:
    """One admitted environment of one run, with every play of it the run kept."""

    run: str
    env_id: str
    generated_step: int
    slot: int
    skill: str
    class_name: str
    source: str
    hint: str
    document: str | None = None
    max_turns: int | None = None
    attempts: int = 1
    # returns: step -> list, from the env_returns lines (no-hint at every step of the window,
    # hinted at the regeneration step only)
    nohint_returns: dict[int, list[float]] = field(default_factory=dict)
    hint_returns: dict[int, list[float]] = field(default_factory=dict)
    episodes: list[Episode] = field(default_factory=list)
    # from memory.sqlite when the run kept no trajectories (older runs)
    memory_win_rate: float | None = None
    memory_regret: float | None = None
    env_source: str = "designer"  # the run's selfplay.env_source (spade.analysis.sources)
    tool_report: dict[str, Any] | None = None  # tool use: what admission's tool stages found (its probe scores)

    @property
    def uid(self) -> str:
        return f"{self.run}:{self.generated_step}:{self.env_id}"

    # ------------------------------------------------------------- plays summarised

    @property
    def gen_nohint(self) -> list[float]:
        return self.nohint_returns.get(self.generated_step, [])

    @property
    def gen_hint(self) -> list[float]:
        return self.hint_returns.get(self.generated_step, [])

    @property
    def win_rate(self) -> float | None:
        """Share of no-hint plays with return > 0 at the regeneration step (the memory's win rate);
        the memory's value when no returns were kept."""
        plays = self.gen_nohint
        if plays:
            return sum(1 for r in plays if r > 0) / len(plays)
        return self.memory_win_rate

    @property
    def window_win(self) -> float | None:
        """Mean no-hint return over every step of the env's window (SPEC 1.4's ``win``)."""
        plays = [r for returns in self.nohint_returns.values() for r in returns]
        return sum(plays) / len(plays) if plays else None

    @property
    def regret(self) -> float | None:
        """Mean hinted return minus mean no-hint return, both at the regeneration step (not floored)."""
        hint, nohint = self.gen_hint, self.gen_nohint
        if hint and nohint:
            return sum(hint) / len(hint) - sum(nohint) / len(nohint)
        return self.memory_regret

    def episodes_of(self, arm: str) -> list[Episode]:
        return [e for e in self.episodes if e.arm == arm]


@dataclass
class Rejection:
    step: int
    slot: int
    attempt: int
    skill: str
    kind: str
    stage: str
    message: str
    response: str
    document: str | None = None

    def to_json(self, max_chars: int | None = None) -> dict[str, Any]:
        response = self.response if max_chars is None else self.response[:max_chars]
        return {"step": self.step, "slot": self.slot, "attempt": self.attempt, "skill": self.skill,
                "kind": self.kind, "stage": self.stage, "message": self.message, "response": response,
                "document": self.document}


@dataclass
class Run:
    name: str
    path: Path
    config: dict[str, Any]
    metrics: list[dict[str, Any]]
    envs: list[EnvRecord]
    rejections: list[Rejection]

    @property
    def regeneration_steps(self) -> list[int]:
        return sorted({e.generated_step for e in self.envs} | {r.step for r in self.rejections})

    @property
    def env_source(self) -> str:
        return env_source_of(self.config)

    @property
    def k(self) -> int | None:
        value = (self.config.get("selfplay") or {}).get("k")
        return value if isinstance(value, int) and value > 0 else None


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, ValueError):
        return None


def _jsonl(path: Path) -> Iterator[dict[str, Any]]:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            value = json.loads(line)
        except ValueError:
            continue  # a line being written
        if isinstance(value, dict):
            yield value


def _step_dirs(directory: Path) -> list[tuple[int, Path]]:
    if not directory.is_dir():
        return []
    found = []
    for child in directory.iterdir():
        match = STEP_DIR.match(child.name)
        if match and child.is_dir():
            found.append((int(match.group(1)), child))
    return sorted(found)


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def read_config(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "config.yaml"
    if not path.is_file():
        return {}
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def read_envs(run_dir: Path, run: str) -> list[EnvRecord]:
    envs = []
    for step, directory in _step_dirs(run_dir / "envs"):
        for meta_path in sorted(directory.glob("*.json")):
            meta = _read_json(meta_path)
            if not isinstance(meta, dict):
                continue
            env_id = str(meta.get("env_id") or meta_path.stem)
            source_path = directory / f"{env_id}.py"
            if not source_path.is_file():
                continue  # being written
            envs.append(EnvRecord(
                run=run, env_id=env_id, generated_step=int(meta.get("generated_step", step)),
                slot=int(meta.get("slot", 0)), skill=str(meta.get("skill") or ""),
                class_name=str(meta.get("class_name") or ""), source=_read_text(source_path),
                hint=_read_text(directory / f"{env_id}.hint.txt"), document=meta.get("document"),
                max_turns=meta.get("max_turns"), attempts=int(meta.get("attempts") or 1),
                tool_report=meta.get("tool_report") if isinstance(meta.get("tool_report"), dict) else None))
    envs.sort(key=lambda e: (e.generated_step, e.slot, e.env_id))
    return envs


def read_rejections(run_dir: Path) -> list[Rejection]:
    found = []
    for step, directory in _step_dirs(run_dir / "rejected"):
        for path in sorted(directory.glob("*.json")):
            data = _read_json(path)
            if not isinstance(data, dict):
                continue
            reason = data.get("reason") or {}
            found.append(Rejection(step=int(data.get("step", step)), slot=int(data.get("slot", 0)),
                                   attempt=int(data.get("attempt", 0)), skill=str(data.get("skill") or ""),
                                   kind=str(reason.get("kind") or "unknown"), stage=str(reason.get("stage") or ""),
                                   message=str(reason.get("message") or ""), response=str(data.get("response") or ""),
                                   document=data.get("document")))
    found.sort(key=lambda r: (r.step, r.slot, r.attempt))
    return found


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    rows = [row for row in _jsonl(run_dir / "metrics.jsonl") if isinstance(row.get("step"), int)]
    last: dict[int, dict[str, Any]] = {}
    for row in rows:
        last[row["step"]] = row  # a resumed run may have written a step twice: the later one counts
    return [last[s] for s in sorted(last)]


def _owner(envs_by_id: dict[str, list[EnvRecord]], env_id: str, step: int) -> EnvRecord | None:
    """The environment ``env_id`` that was live at ``step``: the latest generated at or before it."""
    best = None
    for env in envs_by_id.get(env_id, ()):
        if env.generated_step <= step and (best is None or env.generated_step > best.generated_step):
            best = env
    return best


def attach_trajectories(run_dir: Path, envs: list[EnvRecord]) -> None:
    by_id: dict[str, list[EnvRecord]] = {}
    for env in envs:
        by_id.setdefault(env.env_id, []).append(env)
    directory = run_dir / "trajectories"
    if not directory.is_dir():
        return
    files = sorted((int(m.group(1)), p) for p in directory.iterdir() if (m := STEP_FILE.match(p.name)))
    for step, path in files:
        for line in _jsonl(path):
            env_id = str(line.get("env_id") or "")
            line_step = int(line.get("step", step))
            if line.get("kind") == "env_returns":
                generated = line.get("generated_step")
                env = next((e for e in by_id.get(env_id, ()) if e.generated_step == generated), None) \
                    if isinstance(generated, int) else _owner(by_id, env_id, line_step)
                if env is None:
                    continue
                env.nohint_returns[line_step] = [float(r) for r in line.get("nohint_returns") or []]
                hinted = [float(r) for r in line.get("hint_returns") or []]
                if hinted:
                    env.hint_returns[line_step] = hinted
            elif line.get("kind") == "episode":
                env = _owner(by_id, env_id, line_step)
                if env is None:
                    continue
                env.episodes.append(Episode(step=line_step, arm=str(line.get("arm") or "nohint"),
                                            index=int(line.get("index") or 0), seed=line.get("seed"),
                                            opening=str(line.get("opening") or ""), turns=list(line.get("turns") or []),
                                            episode_return=float(line.get("return") or 0.0),
                                            end_reason=str(line.get("end_reason") or "")))
    for env in envs:
        env.episodes.sort(key=lambda e: (e.step, e.arm != "nohint", e.index))


def attach_memory(run_dir: Path, envs: list[EnvRecord]) -> None:
    """Win rate and regret from the designer memory, for runs that kept no returns."""
    from ..designer.memory import Memory, MemoryStoreError, memory_path

    path = memory_path(run_dir)
    if not path.is_file() or all(env.gen_nohint for env in envs):
        return
    try:
        with Memory.open_readonly(path) as memory:
            records = memory.list()
    except (MemoryStoreError, OSError, Exception):  # a database being written: go without it
        return
    by_key = {(r.env_id, r.step): r for r in records}
    for env in envs:
        record = by_key.get((env.env_id, env.generated_step))
        if record is not None:
            env.memory_win_rate, env.memory_regret = record.win_rate, record.regret


def run_names(paths: list[Path]) -> list[str]:
    """Short distinct names: the directory's name, with parents added while two collide."""
    names = [p.name or str(p) for p in paths]
    depth = 1
    while len(set(names)) < len(names) and depth < 6:
        depth += 1
        names = ["/".join(p.resolve().parts[-depth:]) for p in paths]
    if len(set(names)) < len(names):
        names = [f"{name}#{i}" for i, name in enumerate(names)]
    return names


def read_run(path: str | Path, name: str | None = None) -> Run:
    run_dir = Path(path)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"no such run directory: {run_dir}")
    name = name or run_dir.name
    config = read_config(run_dir)
    envs = read_envs(run_dir, name)
    for env in envs:
        env.env_source = env_source_of(config)
    attach_trajectories(run_dir, envs)
    attach_memory(run_dir, envs)
    return Run(name=name, path=run_dir, config=config, metrics=read_metrics(run_dir), envs=envs,
               rejections=read_rejections(run_dir))


def read_runs(paths: list[str | Path]) -> list[Run]:
    resolved = [Path(p) for p in paths]
    return [read_run(p, n) for p, n in zip(resolved, run_names(resolved))]


def signature(paths: list[str | Path]) -> tuple[Any, ...]:
    """Changes whenever a run directory gains or rewrites a file the reader uses (cheap: stat only)."""
    parts: list[Any] = []
    for p in paths:
        root = Path(p)
        for sub in ("metrics.jsonl", "memory.sqlite"):
            try:
                st = (root / sub).stat()
                parts.append((sub, st.st_mtime_ns, st.st_size))
            except OSError:
                parts.append((sub, None))
        for sub in ("envs", "rejected", "trajectories"):
            directory = root / sub
            if not directory.is_dir():
                continue
            for child in directory.iterdir():
                try:
                    st = child.stat()
                except OSError:
                    continue
                parts.append((sub, child.name, st.st_mtime_ns))
    return tuple(sorted(parts, key=repr))
