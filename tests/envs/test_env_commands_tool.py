"""``spade env check / run / play`` on tool environments, as a user runs them: the real CLI in a
subprocess against examples/envs/tool_use/ and the real sandbox. The responses given to ``run`` are
raw agent text (``<tool_call>`` blocks, ``<answer>``), read by the parser training uses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from spade.envs.tool_use.local import example_paths, load_trusted, scripted_calls

TIMEOUT = 120
FIXTURES = Path(__file__).parents[1] / "fixtures"
TOOL_EXAMPLES = example_paths()
BANKING = ROOT / "examples" / "envs" / "tool_use" / "banking.py"
GAME = ROOT / "examples" / "envs" / "hidden_sequence.py"


def spade(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "spade", *args], cwd=ROOT, input=stdin, capture_output=True,
                          text=True, timeout=TIMEOUT)


def call(name: str, arguments: dict) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def solution_responses(path: Path, seed: int) -> list[str]:
    """The environment's scripted path, one call per response, then the final answer."""
    return [call(n, a) for n, a in scripted_calls(path.read_text(), seed)] + ["<answer>done</answer>"]


def run_json(path: Path, seed: int, responses: list[str], *extra: str) -> dict:
    result = spade("env", "run", str(path), "--seed", str(seed), "--json", *extra, "--actions", *responses)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout)


def test_check_runs_the_tool_stages_and_reports_them():
    assert len(TOOL_EXAMPLES) >= 5
    result = spade("env", "check", "--json", *map(str, TOOL_EXAMPLES), str(GAME))
    assert result.returncode == 0, result.stdout + result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    *tools, game = lines
    for line in tools:
        assert line["admitted"] and line["tool_use"] is True
        assert {"tool_schema", "reset_gate", "tool_probes"} <= set(line["timings_ms"])
        report = line["tool_report"]
        assert 3 <= report["tools"] <= 8 and 3 <= report["instructions"] <= 5
        assert report["screen"] is None  # no model here: the screen is not asked
    # a game is checked as before: no tool stages, no tool keys (the degenerate-policy probes' report instead)
    assert set(game) == {"path", "admitted", "class_name", "error", "first_observation", "timings_ms", "probe_report",
                         "winnability_report"}
    assert "tool_schema" not in game["timings_ms"]

    text = spade("env", "check", "-v", str(BANKING), str(GAME))
    assert text.returncode == 0, text.stderr
    out = text.stdout
    assert "banking.py: admitted (BankingEnv)" in out and "hidden_sequence.py: admitted (HiddenSequenceEnv)" in out
    for stage in ("load", "smoke", "determinism", "tool_schema", "reset_gate", "tool_probes"):
        assert f"ok   {stage} (" in out, stage
    assert "tools 5, instructions 3" in out
    assert "criteria true at reset: none" in out
    assert "criteria unchangeable by any probe call:" in out and "reset gate errors: none" in out
    assert "model screen: not asked" in out
    # the game's verdict is one line, then its degenerate-policy probes (issue 23), no tool stages
    game_lines = out.rstrip().splitlines()[out.rstrip().splitlines().index(f"{GAME}: admitted (HiddenSequenceEnv)"):]
    assert game_lines[1].startswith("  degenerate-policy probes") and not any("tool_schema" in line for line in game_lines)


def test_check_rejects_a_broken_tool_environment_and_on_a_switch(tmp_path):
    source = BANKING.read_text()
    two_tools = tmp_path / "two_tools.py"
    # drop three of the five tools: below the 3-tool minimum
    start = source.index('            "pay": {')
    end = source.index("        }\n        self._user_messages")
    two_tools.write_text(source[:start] + source[end:])
    result = spade("env", "check", "--verbose", str(two_tools))
    assert result.returncode == 1
    assert "rejected at tool_schema: bad_tool_schema: 2 tools" in result.stdout
    assert "FAIL tool_schema" in result.stdout and "ok   determinism" in result.stdout

    # banking's first two criteria are reported unchangeable by the probes; --reject makes it a rejection
    report = json.loads(spade("env", "check", "--json", str(BANKING)).stdout)["tool_report"]
    assert report["unchangeable"]
    strict = spade("env", "check", "--json", "--reject", "unchangeable", str(BANKING))
    assert strict.returncode == 1
    error = json.loads(strict.stdout)["error"]
    assert (error["stage"], error["kind"]) == ("tool_probes", "criterion_unchangeable")
    assert spade("env", "check", "--reject", "everything", str(BANKING)).returncode == 2


@pytest.mark.parametrize("path", TOOL_EXAMPLES, ids=lambda p: p.stem)
def test_run_plays_the_scripted_solution_to_return_one(path):
    seed = 5
    report = run_json(path, seed, solution_responses(path, seed))
    assert report["tool_use"] is True and report["parser"] == "qwen3" and report["error"] is None
    steps = report["steps"]
    assert [s["kind"] for s in steps] == ["calls"] * (len(steps) - 1) + ["answer"]
    assert all(c["returncode"] == 0 for s in steps[:-1] for c in s["calls"])
    assert steps[-1]["calls"] == [] and steps[-1]["answer"] == "done"
    assert steps[-1]["reward"] == 1.0 and steps[-1]["terminated"]
    assert report["end_reason"] == "terminated" and report["return"] == 1.0
    # the requests arrive one at a time: each completed one brings the next
    completed = [s for s in steps if any(c["advanced"] for c in s["calls"])]
    assert [s.get("next_instruction") is not None for s in completed][:-1] == [True] * (len(completed) - 1)


def test_run_reads_raw_responses_as_training_does():
    seed = 3
    (transfer, balance, pay, decline) = scripted_calls(BANKING.read_text(), seed)
    responses = [
        # a thought, then two calls in one turn: the first completes request 1, the second does not
        "<think>start with the transfer</think>Sure." + call(*transfer) + call(*balance),
        "I will pay now.",                                     # no call, no answer: format error
        '<tool_call>\n{"name": "pay", "arguments": {"payee": \n</tool_call>',  # malformed JSON
        # the XML parameter form; the schema types the amount as an integer
        f"<tool_call>\n<function=pay>\n<parameter=payee>\nlandlord\n</parameter>\n"
        f"<parameter=amount>\n{pay[1]['amount']}\n</parameter>\n</function>\n</tool_call>",
        "<answer>done</answer>",                              # too early: request 3 is open
        call("no_such_tool", {}),  # runs, as in the released training loop: the unknown-tool error, 0
        call(*decline),
        "<answer>done</answer>",
    ]
    report = run_json(BANKING, seed, responses)
    steps = report["steps"]
    assert [s["kind"] for s in steps] == ["calls", "format_error", "format_error", "calls", "answer", "calls",
                                          "calls", "answer"]
    first = steps[0]
    assert [c["name"] for c in first["calls"]] == ["transfer", "get_balance"]
    assert [c["advanced"] for c in first["calls"]] == [1, 0]
    assert first["next_instruction"] == f"Then pay my landlord {pay[1]['amount']}."
    assert steps[1]["reward"] == -0.1 and not steps[1]["terminated"]
    assert steps[1]["observation"].startswith("Format error")
    assert steps[2]["reward"] == -0.1 and "not valid JSON" in steps[2]["observation"]
    assert steps[3]["calls"][0]["arguments"] == {"payee": "landlord", "amount": pay[1]["amount"]}
    # the call that completes a request ends its result with the next one (the released notice)
    instructions = load_trusted(BANKING.read_text())()
    instructions.reset(seed=seed)
    assert first["calls"][0]["output"].endswith(
        f"\n\n[STEP 1 COMPLETE — NEW INSTRUCTION] {instructions._user_messages[1]}")
    assert "[STEP" not in first["calls"][1]["output"]
    assert steps[3]["calls"][0]["output"] == (f"paid {pay[1]['amount']} to landlord"
                                              f"\n\n[STEP 2 COMPLETE — NEW INSTRUCTION] {instructions._user_messages[2]}")
    assert steps[6]["calls"][0]["output"].endswith("\n\n[ALL STEPS COMPLETE] Submit <answer>done</answer>.")
    # the early answer names the request still open
    assert f"step 3 of 3" in steps[4]["observation"] and instructions._user_messages[2] in steps[4]["observation"]
    assert steps[4]["reward"] == 0.0 and not steps[4]["terminated"]
    assert steps[5]["reward"] == 0.0 and steps[5]["calls"][0]["returncode"] == 1
    assert "unknown tool 'no_such_tool'" in steps[5]["calls"][0]["output"]
    assert steps[7]["reward"] == 1.0 and report["return"] == 1.0 and report["end_reason"] == "terminated"

    text = spade("env", "run", str(BANKING), "--seed", str(seed), "--actions", *responses)
    assert text.returncode == 0, text.stderr
    out = text.stdout
    assert out.startswith("BankingEnv (tool environment; qwen3 tool-call parser)\n")
    assert "tools: get_balance, transfer, pay, decline_request, stock_quote" in out
    assert f"call transfer({json.dumps(transfer[1])}) -> returncode 0" in out
    assert "[reward -0.1]" in out and "[reward 1, terminated]" in out
    assert out.rstrip().endswith("return: 1")


def test_run_out_of_responses_is_unterminated():
    report = run_json(BANKING, 3, [call(*scripted_calls(BANKING.read_text(), 3)[0])])
    assert report["end_reason"] == "policy_stopped" and report["return"] == 0.0
    assert report["stop_detail"] == "no more responses"


def test_the_parser_comes_from_the_chat_format(tmp_path):
    template = FIXTURES / "qwen3_thinking_2507.jinja"
    responses = solution_responses(BANKING, 1)
    assert run_json(BANKING, 1, responses, "--chat-template", str(template))["return"] == 1.0
    model = tmp_path / "model"
    model.mkdir()
    (model / "tokenizer_config.json").write_text(json.dumps({"chat_template": (FIXTURES / "qwen3_hybrid.jinja")
                                                             .read_text()}))
    assert run_json(BANKING, 1, responses, "--model", str(model))["parser"] == "qwen3"
    # a template with no tool-call syntax: no parser is known, a usage error
    chatml = tmp_path / "chatml.jinja"
    chatml.write_text("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}")
    result = spade("env", "run", str(BANKING), "--chat-template", str(chatml), "--actions", "<answer>x</answer>")
    assert result.returncode == 2 and "no native tool-call parser" in result.stderr


def test_play_lets_a_person_call_tools_by_typing():
    seed = 3
    transfer, _, pay, _ = scripted_calls(BANKING.read_text(), seed)
    typed = "\n".join([
        f"transfer {json.dumps(transfer[1])}",           # TOOL {json}
        "what now?",                                      # neither: a format error
        # raw, as the model writes it (the XML form fits on one typed line)
        f"<tool_call><function=pay><parameter=payee>landlord</parameter>"
        f"<parameter=amount>{pay[1]['amount']}</parameter></function></tool_call>",
        'decline_request {"reason": "not a banking request"}',
        "answer done",
    ]) + "\n"
    result = spade("env", "play", str(BANKING), "--seed", str(seed), stdin=typed)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "transfer(source: checking|savings, target: checking|savings, amount: integer)" in out
    assert f"user: {'Move'} {transfer[1]['amount']} from savings to checking." in out
    assert f"tool: moved {transfer[1]['amount']} from savings to checking" in out
    # the next request is told inside the tool result, not as a user turn of its own
    assert f"[STEP 1 COMPLETE — NEW INSTRUCTION] Then pay my landlord {pay[1]['amount']}." in out
    assert "user: Then pay" not in out
    assert "user: Format error" in out
    assert f"tool: paid {pay[1]['amount']} to landlord" in out
    assert "Correct!" in out
    assert "rewards per turn: 0, -0.1, 0, 0, 1; ended: terminated" in out
    assert out.rstrip().endswith("return: 1")

    # Ctrl-D (end of input) ends the episode unterminated
    quit_early = spade("env", "play", str(BANKING), "--seed", str(seed), stdin=f"transfer {json.dumps(transfer[1])}\n")
    assert quit_early.returncode == 0 and quit_early.stdout.rstrip().endswith("return: 0")
