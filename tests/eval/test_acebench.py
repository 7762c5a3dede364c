"""ACEBench-Agent run by ACEBench's own code from a local checkout, in its own venv.

Everywhere: without a checkout (or without the venv) the benchmark is reported as skipped with
the reason, never 0; settings errors name their key; the benchmark is in the tool suite.

With a checkout (``$SPADE_ACEBENCH_DIR``) and the venv (``make acebench``), end to end, on the
first item of each agent category:

- scripted agent and user endpoints playing a trajectory worked out by hand from ACEBench's data
  (multi_step_0: turn on Wi-Fi, log Eve in, order one Super Supreme Pizza at Domino's, add the
  spending reminder; multi_turn_0: the four calls of its milestones): ACEBench's checker must
  find the final states equal to its possible answers (100, 100); with the order left out of
  the multi-step script, end-to-end fails and the process accuracy is 1 of 3 milestones found;
- the tiny random model served in process by ``spade serve``'s application, the user simulator
  on the same server: every agent and user turn reaches our engine, and our records and score
  equal ACEBench's own score files. The checkout is never written.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from pathlib import Path

import pytest

from spade.eval.acebench import (ACEBENCH_SAMPLING, CATEGORIES, AceBenchAgent, AceBenchSettings, acebench_python,
                                 check_python, checkout)
from spade.eval.runner import format_table, read_records, read_summary, run_suite
from spade.eval.suites import BenchmarkOptions, benchmark_names, build_benchmarks
from spade.eval.types import BenchmarkUnavailable, SamplingSettings
from support.engines import CountingEngine
from support.http import JsonHandler, LocalServer, chat_completion

pytestmark = pytest.mark.timeout(300)


class _NoModel:
    """Never asked for anything: a skipped benchmark must not touch the model."""

    concurrency = 1

    @property
    def engine(self):
        raise AssertionError("a skipped benchmark used the model")


# ---------------------------------------------------------------------------- without a checkout


def test_missing_checkout_is_skipped_with_the_reason(tmp_path, monkeypatch):
    monkeypatch.delenv("SPADE_ACEBENCH_DIR", raising=False)
    bench = AceBenchAgent(AceBenchSettings())
    scores = asyncio.run(run_suite([bench], _NoModel(), out_dir=tmp_path))
    score = scores["acebench_agent"]
    assert score.score is None and "no ACEBench checkout" in score.skipped and "SPADE_ACEBENCH_DIR" in score.skipped
    entry = read_summary(tmp_path)["benchmarks"]["acebench_agent"]
    assert entry["score"] is None and entry["skipped"] == score.skipped
    assert "skipped: no ACEBench checkout" in format_table(scores)
    assert not (tmp_path / "acebench_agent.jsonl").exists() and not (tmp_path / "acebench").exists()
    with pytest.raises(BenchmarkUnavailable, match="no ACEBench checkout"):
        bench.load(0)


def test_a_directory_that_is_not_a_checkout_is_skipped(tmp_path):
    (tmp_path / "repo" / "data_all").mkdir(parents=True)
    (tmp_path / "out").mkdir()
    bench = AceBenchAgent(AceBenchSettings(repo=str(tmp_path / "repo")))
    score = asyncio.run(run_suite([bench], _NoModel(), out_dir=tmp_path / "out"))["acebench_agent"]
    assert score.score is None and "is not an ACEBench checkout" in score.skipped
    assert "data_agent_multi_step.json" in score.skipped


def test_a_checkout_without_the_venv_is_skipped(tmp_path):
    repo = _fake_checkout(tmp_path / "repo")
    (tmp_path / "out").mkdir()
    bench = AceBenchAgent(AceBenchSettings(repo=str(repo), python=str(tmp_path / "none" / "bin" / "python")))
    score = asyncio.run(run_suite([bench], _NoModel(), out_dir=tmp_path / "out"))["acebench_agent"]
    assert score.score is None and "no ACEBench venv" in score.skipped and "make acebench" in score.skipped
    # The main venv lacks ACEBench's dependencies (pandas, openpyxl, wcwidth): skipped, naming them.
    bench = AceBenchAgent(AceBenchSettings(repo=str(repo), python=sys.executable))
    score = asyncio.run(run_suite([bench], _NoModel(), out_dir=tmp_path / "out"))["acebench_agent"]
    assert score.score is None and "lacks what ACEBench needs" in score.skipped and "pandas" in score.skipped


def test_settings_errors_name_the_key():
    for pairs, key in ((["categories=multi_step,single_turn"], "acebench.categories"),
                       (["language=fr"], "acebench.language"), (["max_dialog_turns=0"], "acebench.max_dialog_turns"),
                       (["max_dialog_turns=many"], "acebench.max_dialog_turns"),
                       (["user_url=http://h/v1"], "acebench.user_model"),
                       (["agent_url=localhost:8000"], "acebench.agent_url"), (["user_top_p=0"], "acebench.user_top_p"),
                       (["skip_failed=maybe"], "acebench.skip_failed"), (["colour=red"], "KEY one of")):
        with pytest.raises(ValueError, match=key):
            AceBenchSettings.from_pairs(pairs)
    parsed = AceBenchSettings.from_pairs(["categories=multi_turn", "user_url=https://api.example/v1",
                                          "user_model=gpt-4o", "timeout_s=none", "skip_failed=false", "repo=/x"])
    assert parsed.categories == ("multi_turn",) and parsed.timeout_s is None and not parsed.skip_failed
    assert parsed.repo == "/x" and parsed.user_model == "gpt-4o"


def test_registered_in_the_tool_suite_with_paper_defaults():
    assert "acebench_agent" in benchmark_names("tool") and "acebench_agent" in benchmark_names("all")
    (bench,) = build_benchmarks(["acebench_agent"])
    assert bench.settings.categories == CATEGORIES == ("multi_step", "multi_turn")
    assert bench.settings.language == "en" and bench.settings.max_dialog_turns == 40
    assert bench.sampling == ACEBENCH_SAMPLING == SamplingSettings(1, 0.7, 1.0, None, 16384)
    (one,) = build_benchmarks(["acebench_agent"], BenchmarkOptions(n=2, acebench=AceBenchSettings(repo="/r")))
    assert one.sampling.n == 2 and one.settings.repo == "/r"  # --samples sets the trials


def test_cli_reads_acebench_settings():
    from spade.cli.common import UsageError
    from spade.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(["eval", "--model", "embedded", "--benchmarks", "acebench_agent",
                              "--acebench", "categories=multi_turn", "--acebench", "language=xx"])
    from spade.cli.eval import run_eval

    with pytest.raises(UsageError, match="acebench.language"):
        run_eval(args)


def _fake_checkout(root: Path) -> Path:
    """The file layout ``checkout`` looks for (empty files): enough to reach the venv check."""
    names = [f"data_all/data_en/{p}data_agent_{c}.json" for c in CATEGORIES for p in ("", "possible_answer/")]
    names += ["eval_main.py", "generate.py", "model_inference/common_inference.py", "model_eval/checker.py"]
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("")
    return root


# ---------------------------------------------------------------------------- with a checkout


def _checkout_and_python() -> tuple[str, str]:
    repo = os.environ.get("SPADE_ACEBENCH_DIR")
    if not repo:
        pytest.skip("end-to-end ACEBench needs a checkout: set SPADE_ACEBENCH_DIR")
    try:
        checkout(AceBenchSettings(repo=repo))
        python = acebench_python()
        check_python(python)
    except BenchmarkUnavailable as exc:
        pytest.skip(f"end-to-end ACEBench: {exc}")
    return repo, str(python)


# multi_step_0 (Eve, Domino's): Wi-Fi on, log in, order, reminder; the reminder's text is the data's.
STEP_SCRIPT = ["[turn_on_wifi()]", "[login_food_platform(username='Eve', password='password123')]",
               "[add_food_delivery_order(username='Eve', merchant_name=\"Domino's\", "
               "items=[{'product': 'Super Supreme Pizza', 'quantity': 1}])]",
               "[add_reminder(title=\"Today's spending\", description=\"Today's spending 88.0 yuan\", "
               "time='2024-07-15 09:30')]", "finish conversation"]
# multi_turn_0 (Grace to Frank): its four milestones, then the end of the dialogue.
TURN_SCRIPT = ["[turn_on_wifi()]", "[get_earliest_message_id()]", "[delete_message(message_id=3)]",
               "[send_message(sender_name='Grace', receiver_name='Frank', message='Are you free tomorrow to have "
               "lunch with me?')]", "finish conversation"]
USER_LINE = "Please send Frank my lunch invitation."


class Scripted(JsonHandler):
    """Agent and user endpoint: the agent's step is the number of execution results in the history
    ACEBench sends it; the user (model 'scripted-user') speaks one line."""

    requests: list[dict] = []
    step_script: list[str] = STEP_SCRIPT

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = self.read_json()
        type(self).requests.append(body)
        if body["model"] == "scripted-user":
            text = USER_LINE
        else:
            history = body["messages"][-1]["content"]
            script = TURN_SCRIPT if USER_LINE in history else type(self).step_script
            step = len(re.findall(r"(?m)^execution", history))
            text = script[min(step, len(script) - 1)]
        self.send_json(200, chat_completion(body["model"], text, "s"))


@pytest.fixture
def scripted():
    Scripted.requests, Scripted.step_script = [], STEP_SCRIPT
    with LocalServer(Scripted) as server:
        yield f"{server.url}/v1"


class _Engine:
    weight_version = 0


class _EndpointOnly:
    """The row's model when the agent is an outside endpoint (agent_url): only its engine's version."""

    concurrency = 2
    engine = _Engine()


def _files(repo: str) -> set[str]:
    return {str(p.relative_to(repo)) for p in Path(repo).rglob("*") if ".git" not in p.parts}


def _check_against_acebench(score, out: Path) -> dict:
    """Our records and score equal ACEBench's score files (first line: its accuracies; then one
    line per failed item, by index)."""
    records = read_records(out / "acebench_agent.jsonl")
    score_dir = out / "acebench" / "score_all" / "score_en" / "spade_trial0"
    files = {}
    for category in CATEGORIES:
        lines = [json.loads(x) for x in (score_dir / f"data_agent_{category}_score.json").read_text().splitlines()]
        files[category] = lines
        head, failed = lines[0], {row["id"] for row in lines[1:]}
        ours = [r for r in records.values() if r.group == category]
        assert [r.item_id for r in ours] == [f"{category}/agent_{category}_0"]
        assert [0 not in failed] == [s.correct for s in ours[0].samples]
        assert score.groups[category] == pytest.approx(100 * head["end_to_end_accuracy"])
        assert ours[0].samples[0].detail["process_accuracy"] == pytest.approx(head["process_accuracy"])
    assert score.score == pytest.approx(sum(score.groups.values()) / 2)
    assert read_summary(out)["benchmarks"]["acebench_agent"]["score"] == pytest.approx(score.score)
    return files


@pytest.mark.slow
def test_hand_worked_trajectories_pass_acebench_and_a_wrong_one_fails(scripted, tmp_path):
    repo, python = _checkout_and_python()
    before = _files(repo)
    settings = AceBenchSettings(repo=repo, python=python, agent_url=scripted, agent_model="scripted-agent",
                                user_url=scripted, user_model="scripted-user", timeout_s=240)
    bench = AceBenchAgent(settings, sampling=SamplingSettings(n=1, temperature=0.0, max_new_tokens=64))
    score = asyncio.run(run_suite([bench], _EndpointOnly(), seed=1, limit=1, out_dir=tmp_path / "right"))
    score = score["acebench_agent"]
    _check_against_acebench(score, tmp_path / "right")
    assert score.groups == {"multi_step": 100.0, "multi_turn": 100.0} and score.score == 100.0
    users = [r for r in Scripted.requests if r["model"] == "scripted-user"]
    agents = [r for r in Scripted.requests if r["model"] == "scripted-agent"]
    assert len(users) == 1 and len(agents) == 2 * 5  # multi_turn: the user opens; then 4 calls + the end, each
    assert all(r["temperature"] == 0.0 and r["max_tokens"] == 64 for r in agents)

    Scripted.step_script = [s for s in STEP_SCRIPT if "add_food_delivery_order" not in s]
    score = asyncio.run(run_suite([bench], _EndpointOnly(), seed=1, limit=1, out_dir=tmp_path / "wrong"))
    score = score["acebench_agent"]
    files = _check_against_acebench(score, tmp_path / "wrong")
    assert score.groups["multi_step"] == 0.0 and score.groups["multi_turn"] == 100.0
    (record,) = [r for r in read_records(tmp_path / "wrong" / "acebench_agent.jsonl").values()
                 if r.group == "multi_step"]
    # Of the 3 milestones (login, order, reminder) the executed calls hold the login only:
    # the reminder's milestone is spelled 'Today's spending' (not valid Python) in ACEBench's data.
    assert record.samples[0].detail["process_accuracy"] == pytest.approx(0.333)
    assert record.samples[0].answer == files["multi_step"][1]["error_type"] == "class attributes wrong"
    assert _files(repo) == before  # ACEBench wrote into DIR/acebench only


@pytest.fixture(scope="module")
def tiny_chat_model(tmp_path_factory):
    from chat_templates import bpe_tokenizer
    from support.models import save_tiny_qwen3
    from transformers import AutoTokenizer

    from spade.eval.runner import ChatModel
    from spade.rollout.hf.engine import HFEngine

    _checkout_and_python()
    directory = tmp_path_factory.mktemp("acebench_model")
    template = ("{%- for m in messages -%}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}"
                "{%- endfor -%}{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}")
    tokenizer = bpe_tokenizer(template)
    save_tiny_qwen3(directory, tokenizer, size="1x32", max_position_embeddings=32768, randomize=True)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    engine = CountingEngine(HFEngine(directory, tokenizer, device="cpu", dtype="float32", max_batch_size=4,
                                     max_context_tokens=32768))
    yield ChatModel(engine, tokenizer, concurrency=2, max_context_tokens=32768)
    engine.inner.close()


def _spoken_turns(transcript: Path) -> int:
    """Rows of ACEBench's dialogue table whose sender is the agent or the user (model turns)."""
    rows = [line.split("|") for line in transcript.read_text().splitlines()]
    return sum(1 for r in rows if len(r) > 3 and r[1].strip().isdigit() and r[2].strip() in ("agent", "user"))


@pytest.mark.slow
def test_served_tiny_model_as_agent_and_user(tiny_chat_model, tmp_path):
    repo, python = _checkout_and_python()
    settings = AceBenchSettings(repo=repo, python=python, max_dialog_turns=4, user_max_tokens=8, timeout_s=240)
    bench = AceBenchAgent(settings, sampling=SamplingSettings(n=1, temperature=0.7, top_p=1.0, max_new_tokens=8))
    before = tiny_chat_model.engine.calls
    score = asyncio.run(run_suite([bench], tiny_chat_model, seed=2, limit=1, out_dir=tmp_path))["acebench_agent"]
    _check_against_acebench(score, tmp_path)
    assert score.items == 2 and score.samples == 2 and score.score == 0.0
    # ACEBench's dialogue transcripts (its own files) went to DIR/acebench.
    transcripts = tmp_path / "acebench" / "data_all" / "data_en" / "dialogue_history"
    assert (transcripts / "multi_step" / "spade_trial0" / "0_dialogue_history.txt").is_file()
    assert (transcripts / "multi_turn" / "spade_trial0" / "0_dialogue_history.txt").is_file()
    # Both roles were played by our engine: one generation per agent or user turn ACEBench recorded
    # (multi-step opens with the task from the data; multi-turn with the simulated user's first line).
    turns = sum(_spoken_turns(transcripts / c / "spade_trial0" / "0_dialogue_history.txt") for c in CATEGORIES) - 1
    assert tiny_chat_model.engine.calls - before == turns >= 3
    records = read_records(tmp_path / "acebench_agent.jsonl")
    assert all(s.detail["finish_reasons"] and s.detail["run_error"] is None for r in records.values() for s in r.samples)
    # A rerun with the same --out finds every item done and scores the same.
    calls = tiny_chat_model.engine.calls
    again = asyncio.run(run_suite([bench], tiny_chat_model, seed=2, limit=1, out_dir=tmp_path))["acebench_agent"]
    assert again.groups == score.groups and tiny_chat_model.engine.calls == calls


def test_without_a_user_endpoint_the_score_is_labelled_self_simulated(tmp_path):
    """The released tool_use.yaml runs ACEBench's user simulator on an external model (gpt-4o);
    a run whose user is the model under test is marked off-protocol."""
    from spade.eval.acebench import category_score
    from spade.eval.endpoint_options import user_simulator

    report = {"trials": {"0": {c: {"accuracy": 0.5, "process_accuracy": 0.5, "items": [], "result_file": "r",
                                   "score_file": "s"} for c in ("multi_step", "multi_turn")}}}
    records = {"multi_step": [], "multi_turn": []}
    own = category_score("acebench_agent", report, records, tmp_path, None,
                         user_simulator(AceBenchSettings(), "acebench"))
    assert own.score == 50.0 and own.off_protocol.startswith("self-simulated user")
    external = AceBenchSettings(user_url="https://api.example/v1", user_model="gpt-4o")
    paper = category_score("acebench_agent", report, records, tmp_path, None, user_simulator(external, "acebench"))
    assert paper.off_protocol is None and "gpt-4o" in paper.notes["user_simulator"]


def test_user_and_dialogue_settings_are_the_released_ones():
    """tool_use.yaml: 40 dialogue turns, agent T 0.7, top_p 1.0; the user's sampling is ACEBench's
    own APIUSER default (the released suite does not set it)."""
    s = AceBenchSettings()
    assert s.max_dialog_turns == 40 and (ACEBENCH_SAMPLING.temperature, ACEBENCH_SAMPLING.top_p) == (0.7, 1.0)
    assert (s.user_temperature, s.user_top_p) == (0.001, 1.0)
