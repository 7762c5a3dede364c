"""``spade pool import``: a copy of the released pool, in its own layout (``games/game_*.py``,
``manifest.jsonl``, ``checksums.sha256``, as the released download script fetches it), becomes a pool
directory training draws from. The fixture is written here: made-up environments in that layout,
never the released data."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from spade.cli import main
from spade.envs.pool_files import read_manifest
from spade.selfplay.sources.fixed_pool import FixedPool, read_pool
from spade.pool.released import PoolImportError, import_released_pool, skill_from_file_name
from spade.selfplay.settings import SelfPlaySettings

GAME = '''class Counting{n}Env:
    def reset(self, seed=None):
        return "Name the number {n}.", {{}}

    def step(self, action):
        return "done", float(action.strip() == "{n}"), True, False, {{}}
'''
# (file name, skill as the released manifest writes it, the built-in skill it names)
GAMES = [
    ("game_000000.py", "mathematical_reasoning", "Mathematical Reasoning"),
    ("game_000001.py", "Logical_Deduction", "Logical Deduction"),
    ("game_000002.py", "pattern_recognition", "Pattern Recognition"),
    ("game_000003.py", "mathematical_reasoning", "Mathematical Reasoning"),
    ("game_000004.py", "Causal Inference", "Causal Inference"),
]


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def released_copy(root: Path, *, manifest: bool = True, checksums: bool = True) -> Path:
    """A data set in the released layout: the games, a manifest with the released fields, sha256sum lines."""
    (root / "games").mkdir(parents=True)
    records, sums = [], []
    for n, (file_name, skill, _) in enumerate(GAMES):
        code = GAME.format(n=n)
        (root / "games" / file_name).write_text(code)
        records.append({"game_id": file_name[:-3], "file_name": file_name,
                        "original_file_name": f"game_{n:04d}_{skill.lower()}.py", "skill": skill,
                        "sha256": sha(code), "line_count": code.count("\n"), "byte_count": len(code), "code": code})
        sums.append(f"{sha(code)}  games/{file_name}")
    if manifest:
        (root / "manifest.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if checksums:
        (root / "checksums.sha256").write_text("\n".join(sums) + "\n")
    (root / "README.md").write_text("made-up pool for a test\n")
    return root


def test_import_copies_every_game_with_its_skill_and_training_draws_from_it(tmp_path, capsys):
    source = released_copy(tmp_path / "released")
    out = tmp_path / "pools" / "gpt55"
    assert main(["pool", "import", "--from", str(source), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "5 environments into" in err and "5 checksums verified" in err and "5 manifest records" in err
    assert "Mathematical Reasoning 2" in err and "Logical Deduction 1" in err and "Causal Inference 1" in err
    assert "the paper's pool holds 7872" in err
    for n, (file_name, _, _) in enumerate(GAMES):
        assert (out / file_name).read_bytes() == (source / "games" / file_name).read_bytes()
    records = read_manifest(out)
    assert [r["name"] for r in records] == [f[:-3] for f, _, _ in GAMES]
    assert [r["skill"] for r in records] == [skill for _, _, skill in GAMES]
    first = records[0]
    assert first["source"] == {"released": str(source.resolve()), "file": "games/game_000000.py",
                               "sha256": sha(GAME.format(n=0))}
    assert first["released"]["original_file_name"] == "game_0000_mathematical_reasoning.py"
    assert "code" not in first["released"]  # the source is the .py file, not a second copy
    assert sorted(p.name for p in (out / "released").iterdir()) == ["README.md", "checksums.sha256", "manifest.jsonl"]
    assert not list(out.parent.glob(".*importing*"))  # renamed into place
    entries = read_pool(out)
    assert [(e.name, e.skill) for e in entries] == [(f[:-3], skill) for f, _, skill in GAMES]
    source_pool = FixedPool(SelfPlaySettings(envs_per_set=2, k=1, env_source="fixed_pool", fixed_env_dir=str(out)),
                            sandbox=None, run_dir=tmp_path / "run", seed=0)
    drawn = source_pool.draw(0)
    assert len(drawn) == 2 and all(d.skill == dict((f[:-3], s) for f, _, s in GAMES)[d.entry.name] for d in drawn)


def test_the_games_directory_alone_and_skills_from_file_names(tmp_path, capsys):
    source = released_copy(tmp_path / "released", manifest=False, checksums=False)
    (source / "games" / "game_00048_001_spatial_reasoning.py").write_text(GAME.format(n=9))
    out = tmp_path / "pool"
    assert main(["pool", "import", "--from", str(source / "games"), "--out", str(out), "--expect", "6"]) == 0
    err = capsys.readouterr().err
    assert "6 environments" in err and "0 checksums verified" in err and "(no skill) 5" in err
    skills = {r["name"]: r["skill"] for r in read_manifest(out)}
    assert skills["game_00048_001_spatial_reasoning"] == "Spatial Reasoning" and skills["game_000000"] is None
    assert skill_from_file_name("game_0128_data_retrieval.py") == "Data Retrieval"
    assert skill_from_file_name("game_000001.py") is None


@pytest.mark.parametrize("damage, where", [
    ("manifest_json", "manifest.jsonl:2"),
    ("manifest_no_file", "manifest.jsonl:3"),
    ("missing_game", "manifest.jsonl:4"),
    ("checksum_mismatch", "game_000001.py"),
    ("checksum_line", "checksums.sha256:2"),
    ("manifest_sha", "manifest.jsonl:5"),
    ("expect", "--expect"),
])
def test_a_missing_or_malformed_file_is_named_and_nothing_is_written(tmp_path, capsys, damage, where):
    source = released_copy(tmp_path / "released")
    manifest = source / "manifest.jsonl"
    lines = manifest.read_text().splitlines()
    if damage == "manifest_json":
        lines[1] = lines[1][:40]
    elif damage == "manifest_no_file":
        lines[2] = json.dumps({"skill": "mathematical_reasoning"})
    elif damage == "missing_game":
        (source / "games" / "game_000003.py").unlink()
    elif damage == "checksum_mismatch":
        (source / "games" / "game_000001.py").write_text(GAME.format(n=1) + "# edited\n")
    elif damage == "checksum_line":
        sums = (source / "checksums.sha256").read_text().splitlines()
        sums[1] = "not a checksum"
        (source / "checksums.sha256").write_text("\n".join(sums) + "\n")
    elif damage == "manifest_sha":
        record = json.loads(lines[4])
        record["sha256"] = "0" * 64
        lines[4] = json.dumps(record)
    manifest.write_text("\n".join(lines) + "\n")
    out = tmp_path / "pool"
    args = ["pool", "import", "--from", str(source), "--out", str(out)] + (["--expect", "7872"] if damage == "expect" else [])
    if damage == "checksum_mismatch":  # the manifest's own hash would name the file too; keep only the checksums
        manifest.unlink()
    assert main(args) == 2
    assert where in capsys.readouterr().err
    assert not out.exists() and list(tmp_path.iterdir()) == [source]  # no pool, no temporary directory


def test_games_that_lean_on_the_released_loaders_injected_names_are_reported(tmp_path, capsys):
    source = released_copy(tmp_path / "released")
    (source / "games" / "game_000005.py").write_text(
        "class QueueEnv:\n"
        "    def reset(self, seed=None) -> Tuple[str, dict]:\n"
        "        self.q = deque(range(3))\n"
        "        return str(list(self.q)), {}\n"
        "\n"
        "    def step(self, action):\n"
        "        try:\n"
        "            value = int(action)\n"
        "        except ValueError as error:\n"
        "            return str(error), 0.0, True, False, {}\n"
        "        return 'done', float(value == self.q[0]), True, False, {}\n")
    # numpy, which the released loader also binds, and a name no loader binds
    (source / "games" / "game_000006.py").write_text(
        "class ArrayEnv:\n    def reset(self, seed=None):\n        return str(np.zeros(2)), {}\n"
        "    def step(self, action):\n        return 'done', float(math.pi > 3), True, False, {}\n")
    (source / "games" / "game_000007.py").write_text(
        "class TypoEnv:\n    def reset(self, seed=None):\n        return str(undefined_helper()), {}\n"
        "    def step(self, action):\n        return 'done', 0.0, True, False, {}\n")
    manifest = source / "manifest.jsonl"
    manifest.unlink()
    (source / "checksums.sha256").unlink()
    assert main(["pool", "import", "--from", str(source), "--out", str(tmp_path / "pool")]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert ("3 games use names they neither import nor define "
            "(Tuple 1, deque 1, math 1, np 1, undefined_helper 1)") in err
    # the switch binds deque, Tuple and math, not numpy, and nothing binds undefined_helper
    assert "selfplay.pool.released_loader_names" in err
    assert ("With it, 1 load; 1 still fail because they use numpy (np), which the sandbox imports only with sandbox.offer_numpy; "
            "1 still fail because they use names no loader binds") in err
    assert "game_000006.py uses numpy, importable in the sandbox only with sandbox.offer_numpy (np)" in err
    assert "game_000007.py uses names no loader binds (undefined_helper)" in err
    for name in ("game_000005.py", "game_000006.py", "game_000007.py"):
        assert (tmp_path / "pool" / name).is_file()  # kept: the pool stays the released one


def test_an_existing_pool_is_never_merged_into(tmp_path):
    source = released_copy(tmp_path / "released")
    out = tmp_path / "pool"
    out.mkdir()
    (out / "mine.py").write_text(GAME.format(n=7))
    with pytest.raises(PoolImportError, match="--out.*exists"):
        import_released_pool(source, out)
    assert [p.name for p in out.iterdir()] == ["mine.py"]
    with pytest.raises(PoolImportError, match="--from.*games/game_"):
        import_released_pool(tmp_path / "nowhere", tmp_path / "other")
