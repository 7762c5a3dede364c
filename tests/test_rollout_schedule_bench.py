"""Smoke run of benchmarks/rollout_schedule.py (real orchestrator and sandbox, simulated engine).

The engine is simulated on purpose: the benchmark measures the schedule, so its replies must have
set lengths and latencies (the module docstring states the model); everything else is real.
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
import statistics
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _load():
    spec = importlib.util.spec_from_file_location("rollout_schedule", ROOT / "benchmarks" / "rollout_schedule.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_episode_lengths_follow_the_stated_log_normal():
    """The per-episode reply length is log-normal with the stated median and sigma, capped, and a
    reply is exactly that many tokens: reasoning, one valid boxed action of the game, end of turn."""
    bench = _load()
    tokenizer, _ = bench.load_tokenizer()
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    engine = bench.SimulatedEngine(tokenizer, eos_id=eos, median=200, sigma=1.0, cap=2000, token_latency_s=0.001)
    lengths = [engine.episode_length(seed) for seed in range(4000)]
    logs = [math.log(n) for n in lengths if n < 2000]
    assert statistics.median(lengths) == pytest.approx(200, rel=0.08)
    assert statistics.pstdev([math.log(n) for n in lengths]) == pytest.approx(1.0, abs=0.06)
    assert max(lengths) == 2000 and min(lengths) >= 1 and len(logs) < len(lengths)

    from spade.rollout.engine import GenerationRequest, SamplingParams
    opening = "A secret whole number N lies between 1 and 50 (inclusive)."
    first = [{"role": "user", "content": opening}]
    later = first + [{"role": "assistant", "content": "x"}, {"role": "user", "content": "N mod 4 = 1"}]
    for messages, turns in ((first, 0), (later, 1)):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
        ids = engine.reply(GenerationRequest(tuple(prompt), SamplingParams(max_new_tokens=4096, seed=77 + turns)))
        assert len(ids) == engine.episode_length(77) and ids[-1] == eos  # one length for the whole episode
        action = re.findall(r"\\boxed\{([^}]*)\}", tokenizer.decode(list(ids[:-1])))
        assert len(action) == 1 and action[0] in bench.GAMES["remainder_oracle"]["actions"]


def test_rollout_schedule_quick(tmp_path, capsys):
    """--quick: both schedules run; samples per step equal the configured groups (partial: whole
    groups, at least as many); the printed ratios are the stated formulas over the printed figures."""
    bench = _load()
    out = tmp_path / "figures.json"
    assert bench.main(["--quick", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    data = json.loads(out.read_text())
    assert "overlap (run.overlap): not built" in printed and data["overlap"] == "not built"
    sync, partial = data["schedules"]["sync"], data["schedules"]["partial"]
    quick = bench.QUICK
    per_step = quick["envs_per_set"] * quick["g_nohint"]
    assert sync["envs_per_set"] == quick["envs_per_set"] and partial["envs_per_set"] == quick["partial_envs"]
    assert math.ceil(partial["complete_fraction"] * partial["envs_per_set"]) == quick["envs_per_set"]
    assert sync["samples"] == [per_step] * quick["steps"]
    assert all(n >= per_step and n % quick["g_nohint"] == 0 for n in partial["samples"])
    # the synchronous schedule: every episode plays its turn budget, nothing is cut or carried
    assert sync["requests"] == per_step * quick["max_turns"] * quick["steps"]
    assert sync["carried_over"] == sync["aborted"] == [0] * quick["steps"] and sync["discarded_tokens"] == 0
    assert sync["complete_fraction"] is None
    for figures in (sync, partial):
        wall = figures["wall_s"]
        assert wall == pytest.approx(sum(figures["step_wall_s"]), rel=0.05)
        assert 0 <= figures["idle_s"] <= wall and figures["busy_integral"] > 0
        assert figures["samples_per_s"] == pytest.approx(sum(figures["samples"]) / wall)
        assert figures["mean_step_s"] == pytest.approx(wall / quick["steps"])
        assert figures["idle_share"] == pytest.approx(figures["idle_s"] / wall)
    ratios = data["ratios"]
    assert ratios["samples_per_s"] == pytest.approx(partial["samples_per_s"] / sync["samples_per_s"])
    assert ratios["step_wall_s"] == pytest.approx(partial["mean_step_s"] / sync["mean_step_s"])

    # the table: each ratio is partial / sync of the printed columns (to the printed precision)
    rows = {}
    for line in printed.splitlines():
        match = re.match(r"(step wall time \(s, mean\)|engine idle share|samples per second)\s+(\S+)\s+(\S+)\s+(\S+)$",
                         line)
        if match:
            rows[match[1]] = [float(x) for x in match.groups()[1:]]
    assert set(rows) == {"step wall time (s, mean)", "engine idle share", "samples per second"}
    for label in ("step wall time (s, mean)", "samples per second"):
        a, b, ratio = rows[label]
        assert ratio == pytest.approx(b / a, rel=0.02), label
    assert rows["engine idle share"][:2] == pytest.approx([sync["idle_share"], partial["idle_share"]], abs=1e-4)
    assert rows["samples per second"][0] == pytest.approx(sync["samples_per_s"], abs=1e-3)
