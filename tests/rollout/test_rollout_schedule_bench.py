"""Smoke run of benchmarks/rollout_schedule.py (real orchestrator and sandbox, simulated engine).

The engine is simulated on purpose: the benchmark measures the schedule, so its replies must have
set lengths and latencies (the module docstring states the model); everything else is real.
"""

from __future__ import annotations

import json
import math
import re
import statistics

import pytest

from benchmark_modules import load_benchmark


def test_episode_lengths_follow_the_stated_log_normal():
    """The per-episode reply length is log-normal with the stated median and sigma, capped, and a
    reply is exactly that many tokens: reasoning, one valid boxed action of the game, end of turn."""
    bench = load_benchmark("rollout_schedule")
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
    """--quick: the four schedules run; samples per step equal the configured groups (partial: whole
    groups, at least as many); the update's simulated time is in every step; the printed ratios are
    the stated formulas over the printed figures."""
    bench = load_benchmark("rollout_schedule")
    out = tmp_path / "figures.json"
    assert bench.main(["--quick", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    data = json.loads(out.read_text())
    names = ["sync", "partial", "overlap", "partial+overlap"]
    assert list(data["schedules"]) == names
    schedules = data["schedules"]
    sync, partial = schedules["sync"], schedules["partial"]
    quick = bench.QUICK
    per_step = quick["envs_per_set"] * quick["g_nohint"]
    assert sync["envs_per_set"] == quick["envs_per_set"] and partial["envs_per_set"] == quick["partial_envs"]
    assert math.ceil(partial["complete_fraction"] * partial["envs_per_set"]) == quick["envs_per_set"]
    for name in ("sync", "overlap"):  # the synchronous set: every episode plays its turn budget, nothing cut
        figures = schedules[name]
        assert figures["samples"] == [per_step] * quick["steps"]
        assert figures["requests"] == per_step * quick["max_turns"] * quick["steps"]
        assert figures["carried_over"] == figures["aborted"] == [0] * quick["steps"]
        assert figures["discarded_tokens"] == 0 and figures["complete_fraction"] is None
    for name in ("partial", "partial+overlap"):
        assert all(n >= per_step and n % quick["g_nohint"] == 0 for n in schedules[name]["samples"])
    assert [schedules[n]["overlap"] for n in names] == [False, False, True, True]
    for figures in schedules.values():
        wall = figures["wall_s"]
        assert figures["train_s"] == quick["train_seconds"]
        assert all(w >= quick["train_seconds"] for w in figures["step_wall_s"])  # the update is in every step
        assert wall == pytest.approx(sum(figures["step_wall_s"]), rel=0.05)
        assert 0 <= figures["idle_s"] <= wall and figures["busy_integral"] > 0
        assert figures["samples_per_s"] == pytest.approx(sum(figures["samples"]) / wall)
        assert figures["mean_step_s"] == pytest.approx(wall / quick["steps"])
        assert figures["idle_share"] == pytest.approx(figures["idle_s"] / wall)
    # without overlap the engine idles through every update
    for name in ("sync", "partial"):
        assert schedules[name]["idle_s"] >= quick["steps"] * quick["train_seconds"] * 0.95
    ratios = data["ratios"]
    assert list(ratios) == names[1:]
    for name in names[1:]:
        other = schedules[name]
        assert ratios[name]["samples_per_s"] == pytest.approx(other["samples_per_s"] / sync["samples_per_s"])
        assert ratios[name]["step_wall_s"] == pytest.approx(other["mean_step_s"] / sync["mean_step_s"])

    # the table: one column per schedule, and each printed ratio is that column over sync's
    rows = {}
    for line in printed.splitlines():
        match = re.match(r"(step wall time \(s, mean\)|engine idle share|samples per second)\s+(\S+)\s+(\S+)\s+(\S+)"
                         r"\s+(\S+)$", line)
        if match:
            rows[match[1]] = [float(x) for x in match.groups()[1:]]
    assert set(rows) == {"step wall time (s, mean)", "engine idle share", "samples per second"}
    assert rows["samples per second"][0] == pytest.approx(sync["samples_per_s"], abs=1e-3)
    printed_ratios = {m[1]: (float(m[2]), float(m[3])) for m in re.finditer(
        r"^  (\S+)\s+step wall time (\S+)  engine idle share \S+  samples per second (\S+)$", printed, re.M)}
    assert list(printed_ratios) == names[1:]
    for k, name in enumerate(names[1:], start=1):
        wall, speed = printed_ratios[name]
        assert wall == pytest.approx(rows["step wall time (s, mean)"][k] / rows["step wall time (s, mean)"][0], rel=0.02)
        assert speed == pytest.approx(rows["samples per second"][k] / rows["samples per second"][0], rel=0.02)
