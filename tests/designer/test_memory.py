"""The designer memory: capacity and eviction, example selection, the prompt block, durability."""

from __future__ import annotations

import random
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from spade.designer.memory import (
    EXCERPT_CHARS,
    MEMORY_FILENAME,
    Memory,
    MemoryRecord,
    MemorySelection,
    MemoryStoreError,
    format_memory_block,
    memory_path,
    win_rate,
)

SKILL, OTHER = "Logical Deduction", "Optimization"


def record(env_id: str, *, skill: str = SKILL, step: int = 0, win: float = 0.5, regret: float = 0.0,
           **extra: Any) -> MemoryRecord:
    source = extra.pop("source", f"class {env_id.title()}Env:\n    pass\n")
    return MemoryRecord(env_id=env_id, skill=skill, step=step, win_rate=win, regret=regret, source=source,
                        hint=extra.pop("hint", f"hint for {env_id}"), class_name=f"{env_id.title()}Env", **extra)


@pytest.fixture
def memory(tmp_path: Path) -> Memory:
    with Memory(memory_path(tmp_path)) as opened:
        yield opened


def ids(records: list[MemoryRecord] | tuple[MemoryRecord, ...]) -> list[str]:
    return [r.env_id for r in records]


def test_path_and_win_rate_helper(tmp_path: Path) -> None:
    assert memory_path(tmp_path) == tmp_path / MEMORY_FILENAME == tmp_path / "memory.sqlite"
    assert win_rate([1.0, 0.0, -0.5, 0.2]) == 0.5
    assert win_rate([0.0] * 16) == 0.0
    with pytest.raises(ValueError):
        win_rate([])


def test_record_validation() -> None:
    with pytest.raises(ValueError, match="win_rate"):
        record("a", win=1.5)
    with pytest.raises(ValueError, match="regret"):
        record("a", regret=float("nan"))
    with pytest.raises(ValueError, match="step"):
        record("a", step=-1)
    with pytest.raises(ValueError, match="env_id"):
        record("")
    assert record("a", regret=-0.7).regret == -0.7  # raw regret, not floored


def test_add_list_get_and_excerpt(memory: Memory) -> None:
    long_source = "x = 1\n" * 1000
    stored = memory.add(record("a", step=4, win=0.25, regret=-0.1, source=long_source, metadata={"doc": "d:3"}))
    assert stored.seq is not None
    got = memory.get("a")
    assert got == stored
    assert got.source == long_source and got.excerpt == long_source[:EXCERPT_CHARS] and len(got.excerpt) == 2000
    assert got.metadata == {"doc": "d:3"} and got.hint == "hint for a" and got.class_name == "AEnv"
    assert memory.get("missing") is None and "a" in memory and "missing" not in memory
    assert len(memory) == 1 and ids(memory.list()) == ["a"]
    with pytest.raises(MemoryStoreError, match="already in memory"):
        memory.add(record("a"))
    with pytest.raises(ValueError, match="not JSON-serialisable"):
        memory.add(record("b", metadata={"bad": object()}))


def test_capacity_evicts_oldest_first(tmp_path: Path) -> None:
    with Memory(tmp_path / "m.sqlite", capacity=3) as memory:
        for i in range(5):
            memory.add(record(f"e{i}", step=i))
        assert len(memory) == 3
        assert ids(memory.list()) == ["e2", "e3", "e4"]
        assert memory.get("e0") is None and memory.get("e1") is None
        assert memory.get("e0", include_evicted=True).env_id == "e0"  # kept for rollback and `show`
        memory.add(record("e5", step=5))
        assert ids(memory.list()) == ["e3", "e4", "e5"]
    with Memory(tmp_path / "m.sqlite", capacity=2) as smaller:
        assert ids(smaller.list()) == ["e4", "e5"]


def test_evicted_records_never_selected(tmp_path: Path) -> None:
    with Memory(tmp_path / "m.sqlite", capacity=2) as memory:
        memory.add(record("old_pos", win=0.5, regret=5.0))
        memory.add(record("old_neg", win=0.99))
        memory.add(record("new1", win=0.5, regret=0.1))
        memory.add(record("new2", win=0.6, regret=0.2))
        for seed in range(20):
            selection = memory.select_examples(SKILL, random.Random(seed))
            assert set(ids(selection.positives)) == {"new1", "new2"} and selection.negative is None


def test_rollback_restores_the_live_set_of_a_checkpoint(tmp_path: Path) -> None:
    with Memory(tmp_path / "m.sqlite", capacity=3) as memory:
        for step in range(6):
            memory.add(record(f"s{step}", step=step))
        assert ids(memory.list()) == ["s3", "s4", "s5"]
        assert memory.rollback(after_step=3) == 2
        assert ids(memory.list()) == ["s1", "s2", "s3"]
        memory.add(record("s4b", step=4))
        assert ids(memory.list()) == ["s2", "s3", "s4b"]
        assert memory.prune() == 2
        assert memory.get("s1", include_evicted=True) is None and len(memory) == 3


# --------------------------------------------------------------------------
# Selection


def build_selection_memory(memory: Memory) -> None:
    # 14 eligible same-skill records: win rates inside [0.15, 0.85] (both ends included), regrets 0..13
    for i in range(14):
        memory.add(record(f"pos{i:02d}", win=[0.15, 0.85, 0.5, 0.3][i % 4], regret=i / 10))
    # high regret but not eligible: outside the window, or another skill
    memory.add(record("low_win", win=0.1499, regret=9.0))
    memory.add(record("high_win", win=0.8501, regret=9.0))
    memory.add(record("other_skill", skill=OTHER, win=0.5, regret=9.0))
    # negatives: exactly 0.9 and 0.1 are not extreme
    memory.add(record("edge_easy", win=0.9, regret=-1.0))
    memory.add(record("edge_hard", win=0.1, regret=-1.0))
    memory.add(record("too_easy", win=0.95))
    memory.add(record("too_hard", win=0.0))
    memory.add(record("other_easy", skill=OTHER, win=1.0))


def test_positives_come_from_the_top_10_by_regret_of_the_same_skill(memory: Memory) -> None:
    build_selection_memory(memory)
    top10 = {f"pos{i:02d}" for i in range(4, 14)}
    seen: set[str] = set()
    for seed in range(300):
        selection = memory.select_examples(SKILL, random.Random(seed))
        chosen = ids(selection.positives)
        assert len(chosen) == 2 and len(set(chosen)) == 2
        assert set(chosen) <= top10
        seen |= set(chosen)
    assert seen == top10  # every one of the 10 can be drawn


def test_positives_are_shown_highest_regret_first(memory: Memory) -> None:
    """Whichever two are drawn, their order is the pool's, so two prompts that drew the same
    records begin with the same text (a prefix the engines compute once)."""
    build_selection_memory(memory)
    regret = {r.env_id: r.regret for r in memory.list()}
    for seed in range(50):
        first, second = memory.select_examples(SKILL, random.Random(seed)).positives
        assert regret[first.env_id] >= regret[second.env_id]


def test_negative_is_extreme_and_of_the_same_skill_only(memory: Memory) -> None:
    """The released code draws the negative among the skill's own extreme records
    (``core/env_memory.py`` ``low_quality_examples(skill=...)``): a skill without one gets none,
    even when other skills have some."""
    build_selection_memory(memory)
    negatives = {memory.select_examples(SKILL, random.Random(seed)).negative.env_id for seed in range(100)}
    assert negatives == {"too_easy", "too_hard"}
    memory.add(record("lonely", skill="Spatial Reasoning", win=0.5, regret=0.3))
    for seed in range(20):
        selection = memory.select_examples("Spatial Reasoning", random.Random(seed))
        assert selection.negative is None  # "other_easy" and SKILL's extremes belong to other skills
        assert ids(selection.positives) == ["lonely"]  # fewer than two eligible: what there is
    assert "Do not write" not in format_memory_block(memory.select_examples("Spatial Reasoning", random.Random(0)))


def test_selection_is_a_function_of_the_rng(memory: Memory) -> None:
    build_selection_memory(memory)
    first = memory.select_examples(SKILL, random.Random(42))
    again = memory.select_examples(SKILL, random.Random(42))
    assert first == again
    rng = random.Random(3)
    memory.select_examples(SKILL, rng)
    state = rng.getstate()
    expected = memory.select_examples(SKILL, rng)
    resumed = random.Random()
    resumed.setstate(state)
    assert memory.select_examples(SKILL, resumed) == expected


def test_empty_memory_gives_no_block(memory: Memory) -> None:
    selection = memory.select_examples(SKILL, random.Random(0))
    assert selection.empty and selection == MemorySelection(skill=SKILL)
    assert format_memory_block(selection) == ""
    memory.add(record("mid", skill=OTHER, win=0.5, regret=1.0))  # nothing this skill can use
    assert format_memory_block(memory.select_examples(SKILL, random.Random(0))) == ""


def test_ties_in_regret_prefer_newer_records(memory: Memory) -> None:
    for i in range(12):
        memory.add(record(f"t{i:02d}", win=0.5, regret=0.2))
    seen = set()
    for seed in range(200):
        seen |= set(ids(memory.select_examples(SKILL, random.Random(seed)).positives))
    assert seen == {f"t{i:02d}" for i in range(2, 12)}


# --------------------------------------------------------------------------
# The prompt block


def test_block_labels_positives_and_names_the_negative_in_one_line() -> None:
    """The released block: each positive with its skill, win rate, regret and code; the negative as
    ONE line naming its class, with its win rate and why, and none of its code."""
    positive = record("p", win=0.45, regret=0.31, source="class PEnv:\n    '''uses ``` inside'''\n")
    easy = record("e", win=0.95, regret=0.02, source="class EEnv:\n    SECRET_BODY = 1\n")
    hard = record("h", win=0.0, regret=-0.05, source="class HEnv:\n    SECRET_BODY = 2\n")
    block = format_memory_block(MemorySelection(SKILL, (positive,), easy))
    assert f"### Example 1 (skill: {SKILL}, win rate 0.45, regret 0.31)" in block
    assert "````python\nclass PEnv:" in block  # a longer fence than the backticks inside
    negative_lines = [line for line in block.splitlines() if "EEnv" in line]
    assert negative_lines == ["- too easy (win rate 0.95): class EEnv"]
    assert "SECRET_BODY" not in block and "too hard" not in block
    assert block.rstrip("\n").endswith("- too easy (win rate 0.95): class EEnv")  # the negative comes last
    alone = format_memory_block(MemorySelection(SKILL, (), hard))
    assert alone == "Do not write environments like this one:\n- too hard (win rate 0.00): class HEnv\n"
    unnamed = MemoryRecord(env_id="env-7", skill=SKILL, step=0, win_rate=0.02, regret=0.0, source="x = 1\n")
    assert "class env-7" in format_memory_block(MemorySelection(SKILL, (), unnamed))


def test_block_shows_only_the_excerpt() -> None:
    source = "".join(f"line_{i} = {i}\n" for i in range(1000))
    block = format_memory_block(MemorySelection(SKILL, (record("p", win=0.5, regret=0.2, source=source),)))
    assert source[:EXCERPT_CHARS].rstrip("\n") in block
    assert source[:EXCERPT_CHARS + 20] not in block
    assert f"first 2,000 of {len(source):,} characters" in block


# --------------------------------------------------------------------------
# Durability


def test_persistence_across_reopen(tmp_path: Path) -> None:
    path = memory_path(tmp_path / "run")  # the run directory is created if needed
    with Memory(path) as memory:
        stored = memory.add_many([record("a", step=0, metadata={"n": [1, 2]}), record("b", step=4, win=0.95)])
    with Memory(path) as reopened:
        assert reopened.list() == stored
    readonly = Memory.open_readonly(path)
    assert readonly.list() == stored and readonly.capacity == 200
    with pytest.raises(MemoryStoreError, match="read-only"):
        readonly.add(record("c"))
    readonly.close()
    with pytest.raises(MemoryStoreError, match="no memory database"):
        Memory.open_readonly(tmp_path / "absent.sqlite")


def test_failed_batch_is_all_or_nothing(memory: Memory) -> None:
    memory.add(record("kept"))
    with pytest.raises(MemoryStoreError):
        memory.add_many([record("new1"), record("new2"), record("kept")])
    assert ids(memory.list()) == ["kept"]


@pytest.mark.parametrize("crash_at", ["INSERT", "COMMIT"])
def test_crash_mid_write_loses_nothing_committed(tmp_path: Path, crash_at: str) -> None:
    path = tmp_path / "memory.sqlite"
    with Memory(path) as memory:
        memory.add_many([record("c1"), record("c2")])
    # A process that dies (no cleanup at all) inside a batch: after its second INSERT ran, or just
    # before COMMIT. A tiny page cache makes SQLite write uncommitted pages into the database file,
    # so the committed state survives only through the rollback journal.
    script = textwrap.dedent(f"""
        import os
        from spade.designer.memory import Memory, MemoryRecord
        CRASH_AT = {crash_at!r}
        memory = Memory({str(path)!r})
        memory._db.execute("PRAGMA cache_size=2")
        inserts = 0
        def trace(statement):
            global inserts
            inserts += statement.startswith("INSERT INTO records")
            if (CRASH_AT == "INSERT" and inserts == 2) or (CRASH_AT == "COMMIT" and statement == "COMMIT"):
                os._exit(9)
        memory._db.set_trace_callback(trace)
        rec = lambda i: MemoryRecord(env_id=f"lost{{i}}", skill="s", step=1, win_rate=0.5, regret=0.0,
                                     source="x" * 100_000)
        memory.add_many([rec(i) for i in range(30)])
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 9, result.stderr
    if crash_at == "COMMIT":
        assert Path(f"{path}-journal").exists()  # a hot journal: the torn write is still on disk
    readonly = Memory.open_readonly(path)  # what `spade memory list` does first
    assert ids(readonly.list()) == ["c1", "c2"]
    readonly.close()
    with Memory(path) as memory:
        assert ids(memory.list()) == ["c1", "c2"]
        assert memory._db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        memory.add(record("after"))
        assert ids(memory.list()) == ["c1", "c2", "after"]


def test_not_a_memory_database(tmp_path: Path) -> None:
    path = tmp_path / "other.sqlite"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE t (x)")
    db.commit()
    db.close()
    with pytest.raises(MemoryStoreError, match="not a spade memory database"):
        Memory.open_readonly(path)
    garbage = tmp_path / "garbage.sqlite"
    garbage.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(MemoryStoreError, match="cannot open"):
        Memory(garbage)


# --------------------------------------------------------------------------
# Seeding (selfplay.memory_seed_dir)

SEED_DIR = Path(__file__).resolve().parents[2] / "examples" / "seed_envs"


def test_seed_records_one_per_example_and_skill() -> None:
    from spade.designer.memory import load_seed_records

    examples = sorted(SEED_DIR.glob("*.py"))
    assert len(examples) >= 2
    records = load_seed_records(SEED_DIR, [SKILL, OTHER])
    assert len(records) == 2 * len(examples)
    assert {(r.skill, r.source) for r in records} == {(s, p.read_text()) for s in (SKILL, OTHER) for p in examples}
    assert all(r.step == 0 and r.metadata["seed"] and r.class_name.endswith("Env") for r in records)
    assert all(r.calibration == "calibrated" for r in records)  # shown as positives
    assert len({r.env_id for r in records}) == len(records)


def test_seeding_is_idempotent_survives_rollback_and_respects_eviction(tmp_path: Path) -> None:
    from spade.designer.memory import load_seed_records

    seeds = load_seed_records(SEED_DIR, [SKILL])
    with Memory(memory_path(tmp_path), capacity=len(seeds)) as memory:
        assert len(memory.seed(seeds)) == len(seeds)
        assert memory.seed(seeds) == []  # already there
        memory.rollback(-1)  # a resume without a checkpoint wipes everything ...
        assert len(memory) == 0 and len(memory.seed(seeds)) == len(seeds)  # ... and seeding puts them back
        memory.add_many([record(f"e{i}", step=1) for i in range(len(seeds))])  # the seeds age out
        assert not any(memory.is_live(s) for s in seeds)
        assert memory.seed(seeds) == []  # evicted seeds stay evicted


def test_seed_sidecar_is_validated(tmp_path: Path) -> None:
    from spade.designer.memory import load_seed_records

    (tmp_path / "a.py").write_text("class AEnv:\n    pass\n")
    (tmp_path / "a.json").write_text('{"win_rate": 0.05, "regret": 0.1, "skills": ["Optimization"]}')
    (only,) = load_seed_records(tmp_path, [SKILL, OTHER])
    assert only.skill == OTHER and only.win_rate == 0.05 and only.calibration == "too hard"
    (tmp_path / "a.json").write_text('{"wins": 1}')
    with pytest.raises(ValueError, match="unknown keys"):
        load_seed_records(tmp_path, [SKILL])
    with pytest.raises(ValueError, match="does not exist"):
        load_seed_records(tmp_path / "missing", [SKILL])
