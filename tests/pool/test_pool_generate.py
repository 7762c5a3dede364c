"""``spade pool generate`` and ``spade pool assemble``: a pool written through the training's designer
round (prompts, admission, hints), resumed after a SIGKILL, and assembled from a run's saved sets.

The designer is either the tiny random Qwen3 on the in-process hf engine (it writes no valid
environment: every attempt is rejected and counted) or a local OpenAI-compatible HTTP server in
this test process (a TEST DOUBLE for the frontier model: it answers designer calls with the
example environments, hint calls with a fixed hint, and can hold a request open so the generator
is killed in the middle of an attempt)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from spade.cli import main
from spade.designer.prompts import HINT_SYSTEM
from spade.designer.skills import GAME_SKILLS
from spade.selfplay.sources.designer_source import EnvSpec, save_set
from spade.envs.pool_files import read_manifest
from spade.selfplay.sources.fixed_pool import FixedPool, read_pool
from spade.selfplay.settings import SelfPlaySettings
from support.http import JsonHandler, LocalServer, chat_completion

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples" / "envs").glob("*.py"))
SKILLS = [skill.name for skill in GAME_SKILLS]
HINT = "Probe before you answer."
FAST = ["selfplay.use_corpus=false", "selfplay.use_memory=false", "selfplay.max_context_tokens=8192",
        "selfplay.sampling.designer.max_tokens=16", "selfplay.sampling.hint.max_tokens=8", "selfplay.max_turns=5",
        "sandbox.load_timeout_s=10.0", "sandbox.reset_timeout_s=5.0", "sandbox.step_timeout_s=5.0"]
TIMEOUT_S = 180


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory) -> Path:
    from chat_templates import bpe_tokenizer
    from support.models import save_tiny_qwen3

    directory = tmp_path_factory.mktemp("tiny_designer")
    return save_tiny_qwen3(directory, bpe_tokenizer(), size="1x32", max_position_embeddings=8192, special_ids=True)


def test_a_local_model_designer_attempts_are_rejected_counted_and_continued(tiny_hf, tmp_path, capsys):
    out = tmp_path / "pool"
    argv = ["pool", "generate", "--designer", str(tiny_hf), "--n", "2", "--out", str(out), "--concurrency", "2",
            "--max-attempts", "2", *FAST]
    assert main(argv) == 1  # stopped by --max-attempts: a random model writes no environment
    assert "0 of 2 environments" in capsys.readouterr().err
    state = json.loads((out / "generation" / "state.json").read_text())
    assert state["done_below"] == 2 and state["done_above"] == []
    rejected = [json.loads((out / "generation" / "rejected" / f"step_{a:06d}" / "slot0_attempt0.json").read_text())
                for a in (0, 1)]
    # n = 2 over six skills: the first two skills get one environment each, one attempt each
    assert [r["skill"] for r in rejected] == SKILLS[:2]
    assert all(r["reason"]["kind"] and r["reason"]["stage"] for r in rejected)
    assert not list(out.glob("*.py")) and read_manifest(out) == []
    # the rerun continues the attempt numbers (attempt 2 under its own seeds), for the skill still short
    assert main([*argv[:-len(FAST) - 2], "--max-attempts", "1", *FAST]) == 1
    state = json.loads((out / "generation" / "state.json").read_text())
    assert state["done_below"] == 3
    third = json.loads((out / "generation" / "rejected" / "step_000002" / "slot0_attempt0.json").read_text())
    assert third["skill"] == SKILLS[0] and third["attempt"] == 0 and third["step"] == 2


class FakeEndpoint:
    """An OpenAI-compatible chat-completions server (see the module docstring)."""

    def __init__(self, hold_after: int | None = None):
        self.designer_prompts: list[str] = []
        self.hint_calls = 0
        self.hold_after = hold_after  # hold designer request number hold_after (0-based) open
        self.held = threading.Event()
        self.release = threading.Event()
        outer = self

        class Handler(JsonHandler):
            def do_GET(self):
                self.send_json(200, {"object": "list", "data": [{"id": "fake", "object": "model", "created": 0,
                                                                 "owned_by": "test"}]})

            def do_POST(self):
                request = self.read_json()
                system = request["messages"][0]["content"]
                if HINT_SYSTEM[:60] in system:
                    outer.hint_calls += 1
                    text = HINT
                else:
                    number = len(outer.designer_prompts)
                    outer.designer_prompts.append(request["messages"][-1]["content"])
                    if number == outer.hold_after:
                        outer.held.set()
                        outer.release.wait(TIMEOUT_S)
                        return
                    source = EXAMPLES[number % len(EXAMPLES)].read_text()
                    text = f"Here is the game.\n```python\n{source}\n```"
                self.send_json(200, chat_completion(request["model"], text))

        self.server = LocalServer(Handler)
        self.url = f"{self.server.url}/v1"

    def close(self) -> None:
        self.release.set()
        self.server.close()


def generate_cmd(url: str, out: Path, n: int) -> list[str]:
    return [sys.executable, "-m", "spade", "pool", "generate", "--designer", url, "--model", "fake", "--n", str(n),
            "--out", str(out), "--concurrency", "1", *FAST]


ENV = {**os.environ, "OPENAI_API_KEY": "test-key"}


def test_generation_killed_mid_attempt_resumes_where_it_stopped(tmp_path):
    out = tmp_path / "pool"
    first_server = FakeEndpoint(hold_after=2)  # answers two designer calls, holds the third
    try:
        proc = subprocess.Popen(generate_cmd(first_server.url, out, 4), cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            assert first_server.held.wait(TIMEOUT_S), "the generator never reached its third attempt"
            os.kill(proc.pid, signal.SIGKILL)  # in the middle of attempt 2's designer call
            stdout, _ = proc.communicate(timeout=TIMEOUT_S)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    finally:
        first_server.close()
    assert proc.returncode == -signal.SIGKILL
    assert [line.split()[0] for line in stdout.splitlines() if line.startswith("[")] == ["[1/4]", "[2/4]"]
    before = {p.name: p.read_text() for p in out.glob("env_*")}
    assert sorted(before) == ["env_000000.hint.txt", "env_000000.py", "env_000001.hint.txt", "env_000001.py"]
    assert [r["attempt"] for r in read_manifest(out)] == [0, 1]

    (out / "env_000007.py").write_text("class Half")  # as if an attempt died between its files and its line
    server = FakeEndpoint()
    try:
        proc = subprocess.run(generate_cmd(server.url, out, 4), cwd=ROOT, env=ENV, capture_output=True, text=True,
                              timeout=TIMEOUT_S)
    finally:
        server.close()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [line.split()[0] for line in proc.stdout.splitlines() if line.startswith("[")] == ["[3/4]", "[4/4]"]
    # the two kept environments are untouched, the unfinished one is gone; attempt 2 was made
    # again under its own number
    assert not (out / "env_000007.py").exists()
    assert {name: (out / name).read_text() for name in before} == before
    records = read_manifest(out)
    assert [r["attempt"] for r in records] == [0, 1, 2, 3] and len(server.designer_prompts) == 2
    assert [r["name"] for r in records] == [f"env_{a:06d}" for a in range(4)]
    # balanced: n = 4 over six skills gives the first four one each, in order of their shortfall
    assert [r["skill"] for r in records] == SKILLS[:4]
    for record, prompt in zip(records[2:], server.designer_prompts):
        assert record["skill"] in prompt  # the designer prompt asked for that skill
    for record in records:
        assert record["hint"] == HINT and (out / f"{record['name']}.hint.txt").read_text() == HINT
        assert record["class_name"].endswith("Env") and record["domain"] == "games"
        assert set(record["timings_s"]) == {"designer", "admission", "hint", "total"}
        assert record["timings_s"]["admission"] > 0 and {"load", "smoke"} <= set(record["admission_ms"])
    assert [r["source"] for r in records] == [{"designer": first_server.url, "model": "fake"}] * 2 + \
        [{"designer": server.url, "model": "fake"}] * 2
    # the pool as training reads it: manifest skills, hints
    entries = read_pool(out)
    assert [(e.name, e.skill) for e in entries] == [(r["name"], r["skill"]) for r in records]
    assert json.loads((out / "generation" / "state.json").read_text())["done_below"] == 4

    again = subprocess.run(generate_cmd("http://127.0.0.1:9/v1", out, 4), cwd=ROOT, env=ENV, capture_output=True,
                           text=True, timeout=TIMEOUT_S)
    assert again.returncode == 2 and "not reachable" in again.stderr  # the endpoint is checked first


def test_assemble_from_runs_saved_by_the_designer_round(tmp_path, capsys):
    sources = {path.stem: path.read_text() for path in EXAMPLES}
    names = sorted(sources)

    def spec(step: int, slot: int, name: str, skill: str) -> EnvSpec:
        return EnvSpec(env_id=f"s{step:06d}-e{slot:02d}", slot=slot, skill=skill, source=sources[name],
                       hint=f"hint for {name}", class_name=f"{name}Env", max_turns=None, generated_step=step,
                       document=f"doc-{name}")

    run = tmp_path / "runs" / "spade-a"
    save_set(run, 0, [spec(0, 0, names[0], SKILLS[0]), spec(0, 1, names[1], SKILLS[1])])
    save_set(run, 4, [spec(4, 0, names[2], SKILLS[2]), spec(4, 1, names[0], SKILLS[0])])  # names[0] again
    other = tmp_path / "other" / "spade-a"  # the same directory name: kept apart
    save_set(other, 8, [spec(8, 0, names[3], SKILLS[3])])
    out = tmp_path / "pool"

    assert main(["pool", "assemble", "--from", str(run), "--out", str(out), "--steps", ":4"]) == 0
    assert [r["name"] for r in read_manifest(out)] == ["spade-a-s000000-e00", "spade-a-s000000-e01"]
    capsys.readouterr()
    assert main(["pool", "assemble", "--from", str(run), str(other), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "2 environments added" in err and "(3 duplicate sources skipped)" in err
    records = read_manifest(out)
    # step 0 again and step 4's copy of names[0] are duplicates of what the pool holds
    assert [r["name"] for r in records] == ["spade-a-s000000-e00", "spade-a-s000000-e01", "spade-a-s000004-e00",
                                            "spade-a2-s000008-e00"]
    assert [r["skill"] for r in records] == SKILLS[:4]
    third = records[2]
    assert third["source"] == {"run": str(run.resolve()), "env_id": "s000004-e00", "step": 4}
    assert third["hint"] == f"hint for {names[2]}" and third["document"] == f"doc-{names[2]}"
    assert (out / "spade-a-s000004-e00.py").read_text() == sources[names[2]]
    assert (out / "spade-a-s000004-e00.hint.txt").read_text() == f"hint for {names[2]}"
    # a pool training can draw from, skills from the manifest
    source = FixedPool(SelfPlaySettings(envs_per_set=2, k=1, env_source="fixed_pool", fixed_env_dir=str(out)),
                       sandbox=None, run_dir=tmp_path / "train", seed=0)
    assert [e.skill for e in source.entries] == SKILLS[:4]
    assert main(["pool", "assemble", "--from", str(tmp_path / "nowhere"), "--out", str(out)]) == 2
    assert main(["pool", "assemble", "--from", str(run), "--out", str(out), "--steps", "x:y"]) == 2
