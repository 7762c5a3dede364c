"""``spade pool import``: the released environment pool, from a local copy, into a pool directory
(the format of :mod:`spade.selfplay.sources.fixed_pool`).

**The released layout** (the data set ``spare-rl/spare-gpt55-static-corpus`` as the released
``cmd/games/_download_gpt55_pool`` script downloads it, and the released trainer's static pool)::

    ROOT/games/game_*.py          one environment per file: the file's text is its source
    ROOT/manifest.jsonl           optional: one JSON object per environment
    ROOT/checksums.sha256         optional: ``<sha256>  <path relative to ROOT>`` lines (sha256sum -c)
    ROOT/validation_manifest.jsonl, validation_summary.json, snapshot_summary.json, README.md

The released trainer reads only ``games/game_*.py`` (the file's stem is the environment's name) and
never a skill; the skill of an environment here comes, in this order, from its manifest record's
``skill``, from the skill part of its record's ``original_file_name``, or from the skill part of its
own file name, as the released generator names files (``game_<step>_<index>_<skill>.py``). A skill
written as a slug (``mathematical_reasoning``, ``Mathematical_Reasoning``) is read as the built-in
skill of that name; any other label is kept as written. A manifest record is matched to its file by
``file_name`` (or ``game_id`` + ``.py``, or ``name``); its ``sha256``, when present, must match.

``--from`` is ROOT or its ``games/`` directory. Nothing is merged into an existing directory: the
pool is written into a temporary sibling of ``--out`` and renamed into place at the end, so a failed
import leaves nothing behind. The pool keeps the released names and bytes (so the released draw
order is reproduced), one manifest line per environment (``name``, ``skill``, ``source`` with the
released file and its sha256, ``released`` with the manifest record less its ``code``), and the
released metadata files under ``released/`` (not read by training). The released pool has no hints.
"""

from __future__ import annotations

import ast
import builtins
import hashlib
import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..designer.skills import ALL_SKILLS
from ..envs.pool_files import MANIFEST
from ..envs.sandbox.runtime.limits import DEFAULT_ALLOWED_IMPORTS
from ..envs.sandbox.runtime.loader_names import RELEASED_LOADER_NAMES, offered

GAMES_DIR = "games"
GAME_GLOB = "game_*.py"  # the released trainer's glob
RELEASED_MANIFEST = "manifest.jsonl"
RELEASED_CHECKSUMS = "checksums.sha256"
RELEASED_METADATA = ("manifest.jsonl", "validation_manifest.jsonl", "validation_summary.json",
                     "snapshot_summary.json", "checksums.sha256", "README.md")
RELEASED_COPY_DIR = "released"
PAPER_POOL_SIZE = 7872  # the released launcher's MIN_POOL_GAMES
NO_SKILL = "(no skill)"

_SKILL_SLUG = re.compile(r"game_\d+(?:_\d+)*_([A-Za-z][A-Za-z0-9_]*)")
_CHECKSUM_LINE = re.compile(r"([0-9a-fA-F]{64}) [ *](.+)")
_KNOWN_SKILLS = {skill.name.lower(): skill.name for skill in ALL_SKILLS}

Report = Callable[[str], None]


class PoolImportError(ValueError):
    """A released file that is missing or malformed (the message names the file and line)."""


@dataclass
class ImportSummary:
    out: Path
    total: int
    per_skill: dict[str, int] = field(default_factory=dict)
    checksums_verified: int = 0
    manifest_records: int = 0
    not_in_manifest: list[str] = field(default_factory=list)
    uncompilable: list[str] = field(default_factory=list)
    unbound: dict[str, list[str]] = field(default_factory=dict)  # game -> names it uses but never binds

    def unbound_by_outcome(self) -> dict[str, list[str]]:
        """The games of :attr:`unbound` by what happens to them at load under
        ``selfplay.pool.released_loader_names``: ``covered`` (the switch binds every such name),
        ``numpy`` (uses ``np``/``numpy``, which the released loader binds and the sandbox offers only
        with ``sandbox.offer_numpy``), ``other`` (uses a name no loader binds: it fails at load either way)."""
        groups: dict[str, list[str]] = {"covered": [], "numpy": [], "other": []}
        for game, names in self.unbound.items():
            missing = set(names) - SWITCH_NAMES
            if not missing:
                groups["covered"].append(game)
            elif missing & NUMPY_NAMES:
                groups["numpy"].append(game)
            else:
                groups["other"].append(game)
        return groups


# The names selfplay.pool.released_loader_names binds under the default import allow-list, and the
# released loader's names for numpy, which it does not.
SWITCH_NAMES = frozenset(name for name, _, _ in offered(DEFAULT_ALLOWED_IMPORTS))
NUMPY_NAMES = frozenset(name for name, module, _ in RELEASED_LOADER_NAMES if module == "numpy")


@dataclass(frozen=True)
class _Released:
    """A copy of the released data set: where its games and metadata are."""

    root: Path
    games: Path


def _locate(source: Path) -> _Released:
    if (source / GAMES_DIR).is_dir():
        return _Released(source, source / GAMES_DIR)
    if source.is_dir() and any(source.glob(GAME_GLOB)):
        root = source.parent if source.name == GAMES_DIR else source
        return _Released(root, source)
    raise PoolImportError(f"--from: {source} holds neither {GAMES_DIR}/{GAME_GLOB} nor {GAME_GLOB} (the layout "
                          "of the released pool spare-rl/spare-gpt55-static-corpus: give the directory its "
                          "download went to, or its games/ directory)")


def skill_name(label: str | None) -> str | None:
    """The built-in skill ``label`` names (any case, ``_`` or ``-`` for spaces), else ``label``."""
    if label is None or not label.strip():
        return None
    key = " ".join(re.split(r"[\s_-]+", label.strip())).lower()
    return _KNOWN_SKILLS.get(key, label.strip())


def skill_from_file_name(file_name: str) -> str | None:
    """The skill part of a released file name (``game_00048_001_mathematical_reasoning.py``)."""
    match = _SKILL_SLUG.fullmatch(Path(file_name).stem)
    return skill_name(match.group(1)) if match else None


def unbound_names(tree: ast.AST) -> list[str]:
    """Names the code reads that nothing in it binds (assignment, import, def, class, argument) and
    that are not builtins. The released loader supplies common standard-library names (and numpy)
    to every game, so a released game may use them without importing them; spade's sandbox binds
    them only with ``selfplay.pool.released_loader_names``, and numpy only with ``sandbox.offer_numpy``."""
    bound: set[str] = set(dir(builtins))
    read: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.ImportFrom) and any(alias.name == "*" for alias in node.names):
            return []  # a star import binds names the code does not show
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            bound.update(node.names)
        elif isinstance(node, ast.MatchAs) and node.name:
            bound.add(node.name)
    return sorted(read - bound)


def _record_file(record: dict[str, Any]) -> str | None:
    for key, suffix in (("file_name", ""), ("game_id", ".py"), ("name", ".py")):
        value = record.get(key)
        if isinstance(value, str) and value:
            name = Path(value).name
            return name if name.endswith(".py") else name + suffix
    return None


def read_released_manifest(path: Path) -> dict[str, tuple[int, dict[str, Any]]]:
    """``{file name: (line number, record)}`` of a released ``manifest.jsonl``."""
    records: dict[str, tuple[int, dict[str, Any]]] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise PoolImportError(f"{path}:{number}: not a JSON line ({exc.msg})") from None
        if not isinstance(record, dict):
            raise PoolImportError(f"{path}:{number}: a manifest line must be a JSON object")
        name = _record_file(record)
        if name is None:
            raise PoolImportError(f"{path}:{number}: the record names no file (no 'file_name', 'game_id' or 'name')")
        if name in records:
            raise PoolImportError(f"{path}:{number}: {name} is listed twice (first at line {records[name][0]})")
        skill = record.get("skill")
        if skill is not None and not isinstance(skill, str):
            raise PoolImportError(f"{path}:{number}: 'skill' must be a string, got {skill!r}")
        records[name] = (number, record)
    return records


def read_checksums(path: Path) -> dict[str, tuple[int, str]]:
    """``{path relative to the data set: (line number, sha256)}`` of a ``sha256sum`` file."""
    sums: dict[str, tuple[int, str]] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        match = _CHECKSUM_LINE.fullmatch(line.rstrip("\n"))
        if match is None:
            raise PoolImportError(f"{path}:{number}: not a checksum line ('<64 hex digits>  <path>')")
        relative = match.group(2).strip()
        if relative.startswith("./"):
            relative = relative[2:]
        sums[relative] = (number, match.group(1).lower())
    return sums


def import_released_pool(source: Path | str, out: Path | str, *, expect: int | None = None,
                         report: Report = print) -> ImportSummary:
    """Import the released pool at ``source`` into the new pool directory ``out`` (module docstring)."""
    source, out = Path(source), Path(out)
    if out.exists():
        raise PoolImportError(f"--out: {out} exists; give a new directory (an import never merges into a pool)")
    released = _locate(source)
    files = sorted(released.games.glob(GAME_GLOB))
    if expect is not None and len(files) != expect:
        raise PoolImportError(f"--expect: {released.games} has {len(files)} {GAME_GLOB} files, not {expect}")
    manifest_path = released.root / RELEASED_MANIFEST
    manifest = read_released_manifest(manifest_path) if manifest_path.is_file() else {}
    present = {path.name for path in files}
    for name, (number, _) in manifest.items():
        if name not in present:
            raise PoolImportError(f"{manifest_path}:{number}: {GAMES_DIR}/{name} is missing from {released.games}")
    checksum_path = released.root / RELEASED_CHECKSUMS
    checksums = read_checksums(checksum_path) if checksum_path.is_file() else {}
    games_prefix = os.path.relpath(released.games, released.root)

    summary = ImportSummary(out=out, total=len(files), manifest_records=len(manifest))
    lines: list[str] = []
    out.parent.mkdir(parents=True, exist_ok=True)
    work = out.parent / f".{out.name}.importing-{os.getpid()}"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir()
    try:
        for path in files:
            data = path.read_bytes()
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise PoolImportError(f"{path}: not UTF-8 text (byte {exc.start})") from None
            digest = hashlib.sha256(data).hexdigest()
            relative = path.name if games_prefix == "." else f"{games_prefix}/{path.name}"
            if relative in checksums:
                number, expected = checksums[relative]
                if expected != digest:
                    raise PoolImportError(f"{path}: its sha256 {digest} differs from {checksum_path}:{number} ({expected})")
                summary.checksums_verified += 1
            number, record = manifest.get(path.name, (None, {}))
            if number is not None and isinstance(record.get("sha256"), str) and record["sha256"].lower() != digest:
                raise PoolImportError(f"{path}: its sha256 {digest} differs from {manifest_path}:{number} "
                                      f"({record['sha256']})")
            if manifest and number is None:
                summary.not_in_manifest.append(path.name)
            original = record.get("original_file_name")
            skill = (skill_name(record.get("skill")) or (skill_from_file_name(original) if isinstance(original, str) else None)
                     or skill_from_file_name(path.name))
            try:
                unbound = unbound_names(ast.parse(text, str(path)))
            except (SyntaxError, ValueError):
                summary.uncompilable.append(path.name)
            else:
                if unbound:
                    summary.unbound[path.name] = unbound
            (work / path.name).write_bytes(data)
            line = {"name": path.stem, "skill": skill,
                    "source": {"released": str(released.root.resolve()), "file": relative, "sha256": digest}}
            kept = {key: value for key, value in record.items() if key != "code"}
            if kept:
                line["released"] = kept
            lines.append(json.dumps(line, sort_keys=True))
            summary.per_skill[skill or NO_SKILL] = summary.per_skill.get(skill or NO_SKILL, 0) + 1
        (work / MANIFEST).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        copies = [name for name in RELEASED_METADATA if (released.root / name).is_file()]
        if copies:
            (work / RELEASED_COPY_DIR).mkdir()
            for name in copies:
                shutil.copyfile(released.root / name, work / RELEASED_COPY_DIR / name)
        os.rename(work, out)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    for name in summary.uncompilable:
        report(f"  warning: {name} does not compile here; training's admission will reject it when drawn")
    if summary.unbound:
        counts: dict[str, int] = {}
        for names in summary.unbound.values():
            for name in names:
                counts[name] = counts.get(name, 0) + 1
        common = ", ".join(f"{name} {count}" for name, count in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:8])
        groups = summary.unbound_by_outcome()
        report(f"  warning: {len(summary.unbound)} games use names they neither import nor define ({common}). "
               "The released loader binds common standard-library names (and numpy) in every game; spade's "
               "sandbox does so only with selfplay.pool.released_loader_names (on in "
               "baseline_fixed_pool.yaml), and admission rejects these games when drawn without it. With it, "
               f"{len(groups['covered'])} load; {len(groups['numpy'])} still fail because they use numpy "
               f"(np), which the sandbox imports only with sandbox.offer_numpy; {len(groups['other'])} still fail because they use "
               "names no loader binds")
        for outcome, why in (("numpy", "uses numpy, importable in the sandbox only with sandbox.offer_numpy"),
                             ("other", "uses names no loader binds")):
            for game in groups[outcome]:
                names = ", ".join(n for n in summary.unbound[game] if n not in SWITCH_NAMES)
                report(f"  warning: {game} {why} ({names}); admission will reject it when drawn")
    for name in summary.not_in_manifest:
        report(f"  warning: {name} has no record in {manifest_path}")
    return summary
