"""rlve-gym behind the environment contract, with real worker processes.

* The adapter scores the agent's ``\\boxed{}`` answers exactly as rlve-gym's own verifier scores
  ``<answer></answer>`` outputs: the reference is a separate process that regenerates the same
  problems, reads their answers from the environment objects' own fields, and calls their
  verifiers directly (Multiplication also by hand: the product of the two factors).
* Problems are drawn from the difficulty window of RLVE's rule (Multiplication's controller: level
  ``d`` has ``digit_num = d + 2``).
* The source's state round-trips: a resumed source draws the same next set at the raised level.
* Worker failures become the right faults; closing, and SIGKILL of the parent, leave no worker.
* ``spade train`` runs two steps with ``env_source: rlve`` and leaves no process behind.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import prewarmed
import psutil
import pytest

from spade.agent.actions import parse_action
from spade.envs.protocol import EnvFault, ErrorKind, InfrastructureFault
from spade.envs.rlve import ANSWER_INSTRUCTION, ProblemSpec, RLVESandbox, RLVEWorkers, WorkerDied, to_rlve_output
from spade.selfplay.sources.rlve_settings import RLVESettings
from spade.selfplay.sources.rlve_source import RLVESource
from spade.selfplay.settings import SelfPlaySettings
from support.configs import write_config

ROOT = Path(__file__).resolve().parents[2]
# rlve-gym runs only in worker processes (it reseeds global random state): found, not imported here
if importlib.util.find_spec("Gym") is None:
    raise ImportError("rlve-gym is not installed (make setup installs it)")
pytestmark = pytest.mark.timeout(300)

REFERENCE = r'''
import json, sys
from Gym.environments import identifier2environment
out = {}
for name, seed, parameter in json.loads(sys.argv[1]):
    env = identifier2environment[name]()
    assert env.generator(seed=seed, parameter=parameter)
    p = env.parameter
    if name == "Multiplication":
        answers = {"right": str(p["reference_answer"]), "wrong": str(p["reference_answer"] + 1)}
        fields = {"a": p["a"], "b": p["b"], "reference_answer": p["reference_answer"]}
    else:  # Sudoku: the solution, and the solution with a given cell overwritten
        rows = [r.split() for r in p["reference_answer"].splitlines()]
        i, j = next((i, j) for i, row in enumerate(p["sudoku"]) for j, cell in enumerate(row) if cell)
        rows[i][j] = str(p["sudoku"][i][j] % p["NM"] + 1)
        answers = {"right": p["reference_answer"], "invalid": "\n".join(" ".join(r) for r in rows)}
        fields = {}
    scores = {}
    for key, text in answers.items():
        env2 = identifier2environment[name]()
        env2.set_config(env.get_config())
        scores[key] = env2.verifier("<answer>" + text + "</answer>")["reward"]
    env3 = identifier2environment[name]()
    env3.set_config(env.get_config())
    scores["none"] = env3.verifier("no answer here")["reward"]
    out[name] = {"answers": answers, "scores": scores, "fields": fields, "rewards": env.rewards,
                 "prompt": env.prompt_generator()}
print(json.dumps(out))
'''


def run(coro):
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def workers():
    pool = RLVEWorkers(1)
    yield pool
    pool.close()


def settings(**rlve) -> SelfPlaySettings:
    values = {"environments": ("Multiplication", "Sudoku"), "workers": 1, **rlve}
    return SelfPlaySettings(env_source="rlve", k=1, envs_per_set=2, g_nohint=2, g_hint=0,
                            rlve=RLVESettings(**values))


def sample(workers, environment: str, *, max_difficulty: int, choice_seed: int, problem_seed: int) -> dict:
    return run(workers.call(problem_seed, {"op": "sample", "environment": environment, "max_difficulty": max_difficulty,
                                           "window": 4, "choice_seed": choice_seed, "problem_seed": problem_seed,
                                           "timeout_s": 10.0}, 60.0))


def spec_of(answer: dict, environment: str, seed: int) -> ProblemSpec:
    from spade.envs.rlve import prompt_digest

    return ProblemSpec(environment, seed, answer["parameter"], answer["difficulty"], answer["threshold"],
                       prompt_digest(answer["prompt"]))


def test_the_adapter_scores_like_rlves_own_verifier(workers):
    mult = sample(workers, "Multiplication", max_difficulty=1, choice_seed=1, problem_seed=11)
    sudoku = sample(workers, "Sudoku", max_difficulty=0, choice_seed=2, problem_seed=12)
    problems = [["Multiplication", 11, mult["parameter"]], ["Sudoku", 12, sudoku["parameter"]]]
    ref = json.loads(subprocess.run([sys.executable, "-c", REFERENCE, json.dumps(problems)], capture_output=True,
                                    text=True, timeout=120, check=True, env={**os.environ, "PYTHONHASHSEED": "0"}).stdout)
    a, b = ref["Multiplication"]["fields"]["a"], ref["Multiplication"]["fields"]["b"]
    assert ref["Multiplication"]["fields"]["reference_answer"] == a * b  # the reference itself, by hand
    # RLVE's own scores: right 1, wrong answer 0, no answer its format penalty; Sudoku's invalid grid -0.5
    assert ref["Multiplication"]["scores"] == {"right": 1.0, "wrong": 0.0, "none": -1.0}
    assert ref["Sudoku"]["scores"] == {"right": 1.0, "invalid": ref["Sudoku"]["rewards"]["invalid_solution"],
                                       "none": -1.0} and ref["Sudoku"]["scores"]["invalid"] == -0.5

    sandbox = RLVESandbox(workers)
    for answer, environment, seed in ((mult, "Multiplication", 11), (sudoku, "Sudoku", 12)):
        spec = spec_of(answer, environment, seed)
        expected = ref[environment]
        for key, text in {**expected["answers"], "none": None}.items():
            response = "I have it." if text is None else f"Working...\n\\boxed{{{text}}}"
            instance = run(sandbox.open(spec.to_source()))
            first = run(instance.reset(seed=123))
            assert first.observation == f"{expected['prompt']}\n\n{ANSWER_INSTRUCTION}"
            step = run(instance.step(parse_action(response)))
            assert (step.reward, step.terminated, step.truncated) == (expected["scores"][key], True, False), key
            assert step.info["accuracy"] == float(expected["scores"][key] >= 1.0)
            with pytest.raises(EnvFault):  # single-turn
                run(instance.step("\\boxed{1}"))
        # one problem per group: the reset seed changes nothing
        instance = run(sandbox.open(spec.to_source()))
        assert run(instance.reset(seed=1)).observation == run(instance.reset(seed=2)).observation
    assert str(a) in ref["Multiplication"]["prompt"] and str(b) in ref["Multiplication"]["prompt"]


def reference(problems: list) -> dict:
    """rlve-gym's own answers and verifier scores for ``[[name, seed, parameter], ...]``, computed
    in a separate process (REFERENCE)."""
    return json.loads(subprocess.run([sys.executable, "-c", REFERENCE, json.dumps(problems)], capture_output=True,
                                     text=True, timeout=120, check=True,
                                     env={**os.environ, "PYTHONHASHSEED": "0"}).stdout)


class CutOff:
    """A policy whose reply hits its token limit (what EnginePolicy raises on finish reason length)."""

    def __init__(self, response: str | None):
        self.response = response

    async def __call__(self, messages):
        from spade.envs.runner import StopEpisode

        raise StopEpisode("the reply ended without end-of-turn (length)", response=self.response)


def test_a_cut_off_reply_scores_as_rlves_verifier_scores_it(workers):
    """RLVE verifies a truncated response like any other: a box closed before the cut is scored,
    a reply without one gets the no-answer score (-1 for Multiplication), never the 0 of an
    unterminated episode."""
    from spade.envs.runner import EndReason, play_episode

    mult = sample(workers, "Multiplication", max_difficulty=0, choice_seed=3, problem_seed=13)
    ref = reference([["Multiplication", 13, mult["parameter"]]])["Multiplication"]
    right, wrong = ref["answers"]["right"], ref["answers"]["wrong"]
    assert ref["scores"] == {"right": 1.0, "wrong": 0.0, "none": -1.0}
    spec = spec_of(mult, "Multiplication", 13)
    sandbox = RLVESandbox(workers)
    cases = [(f"The product is \\boxed{{{right}}}. Let me double-check the carr", ref["scores"]["right"]),
             (f"First \\boxed{{{wrong}}}, no wait, it is \\boxed{{{right}", ref["scores"]["wrong"]),
             (f"So the product is \\boxed{{{right}", ref["scores"]["none"]),  # the box never closed
             ("Let me multiply digit by digit: 3 times", ref["scores"]["none"]),
             (None, ref["scores"]["none"])]  # cut before any token (context budget): an empty reply
    for response, expected in cases:
        instance = run(sandbox.open(spec.to_source()))
        episode = run(play_episode(instance, CutOff(response), seed=1, max_turns=25))
        assert episode.episode_return == expected, response
        assert episode.end_reason is EndReason.TERMINATED and "without end-of-turn" in episode.stop_detail
        assert len(episode.turns) == 1 and episode.turns[0].response == (response or "")
        assert [m.role for m in episode.messages] == ["user"] + (["assistant"] if response is not None else [])
    # reward "accuracy" (the paper's released adapter): 1 when the verifier's reward passes, else 0
    accuracy = RLVESandbox(workers, reward="accuracy")
    for response, expected in [(f"\\boxed{{{right}}}", 1.0), (f"\\boxed{{{wrong}}}", 0.0), ("no box", 0.0)]:
        instance = run(accuracy.open(spec.to_source()))
        run(instance.reset(seed=1))
        assert run(instance.step(parse_action(response))).reward == expected
    with pytest.raises(ValueError, match="reward: 'binary' is not allowed; choose one of: verifier, accuracy"):
        RLVESandbox(workers, reward="binary")


def test_box_to_answer_markers():
    assert to_rlve_output("\\boxed{1 2\n3 4}") == "<answer>1 2\n3 4</answer>"
    assert to_rlve_output("\\boxed{\\frac{1}{2}}") == "<answer>\\frac{1}{2}</answer>"
    assert to_rlve_output("42") == "" and to_rlve_output("") == ""


def test_bad_specs_are_environment_faults(workers):
    sandbox = RLVESandbox(workers)
    with pytest.raises(EnvFault) as err:
        run(sandbox.open("class Env: pass"))
    assert err.value.error.kind is ErrorKind.PROTOCOL_ERROR and not isinstance(err.value, InfrastructureFault)
    unknown = ProblemSpec("NoSuchEnvironment", 1, {}, 0).to_source()
    with pytest.raises(EnvFault) as err:
        run(sandbox.open(unknown))
    assert err.value.error.kind is ErrorKind.INIT_ERROR and "NoSuchEnvironment" in str(err.value)
    answer = sample(workers, "Multiplication", max_difficulty=0, choice_seed=0, problem_seed=5)
    tampered = ProblemSpec("Multiplication", 5, answer["parameter"], 0, 1.0, "0" * 16).to_source()
    with pytest.raises(EnvFault) as err:
        run(sandbox.open(tampered))
    assert err.value.error.kind is ErrorKind.NONDETERMINISTIC_RESET


def test_problems_come_from_the_difficulty_window(workers):
    """Multiplication's controller starts at 2 digits and adds one per update(): level d = d + 2
    digits. At level 5 with a window of 4 the problem is drawn from levels 2..5; at level 1, 0..1."""
    seen = set()
    for i in range(24):
        answer = sample(workers, "Multiplication", max_difficulty=5, choice_seed=i, problem_seed=100 + i)
        assert answer["parameter"]["digit_num"] == answer["difficulty"] + 2
        seen.add(answer["difficulty"])
    assert seen == {2, 3, 4, 5}
    low = {sample(workers, "Multiplication", max_difficulty=1, choice_seed=i, problem_seed=200 + i)["difficulty"]
           for i in range(12)}
    assert low == {0, 1}


def test_source_sets_and_resume_continue_the_same_schedule(workers, tmp_path):
    s = settings(environments=("Multiplication",), accuracy_samples=4, accuracy_threshold=0.75,
                 difficulty_window=1)  # problems only at the current level: a raise shows in every problem
    first = RLVESource(s, run_dir=tmp_path / "a", seed=9, workers=workers)
    set0 = run(first.next_set(0))
    assert len(set0.envs) == 2 and all(e.skill == "Multiplication" and e.hint == "" for e in set0.envs)
    assert [ProblemSpec.from_source(e.source).difficulty for e in set0.envs] == [0, 0]
    assert (tmp_path / "a" / "envs" / "step_000000" / f"{set0.envs[0].env_id}.py").is_file()
    # 2 problems x 2 plays, 3 of them right (return 1.0): 3/4 >= 0.75 raises the level to 1
    first.observe(0, set0.envs, {set0.envs[0].env_id: [1.0, 1.0], set0.envs[1].env_id: [1.0, 0.0]})
    state = json.loads(json.dumps(first.state_dict()))
    assert state["difficulty"] == {"Multiplication": 1} and state["tallies"] == {}
    assert first.metrics() == {"rlve/checked": 1.0, "rlve/raised": 1.0, "rlve/envs_raised_total": 1.0,
                               "rlve/difficulty_max": 1.0, "rlve/problem_difficulty_mean": 0.0,
                               "rlve/problem_difficulty_min": 0.0, "rlve/problem_difficulty_max": 0.0}

    resumed = RLVESource(s, run_dir=tmp_path / "b", seed=9, workers=workers)
    resumed.load_state_dict(state)
    fresh = RLVESource(s, run_dir=tmp_path / "c", seed=9, workers=workers)
    a, b, c = (run(src.next_set(1)).envs for src in (first, resumed, fresh))
    assert [e.to_json() for e in a] == [e.to_json() for e in b]  # the same problems, in the same slots
    assert {ProblemSpec.from_source(e.source).difficulty for e in a} == {1}
    assert {ProblemSpec.from_source(e.source).difficulty for e in c} == {0}  # without the state: level 0
    assert all(ProblemSpec.from_source(e.source).parameter["digit_num"] == 3 for e in a)
    for src in (first, resumed):
        src.observe(1, a, {e.env_id: [0.0, 1.0] for e in a})
    assert first.state_dict() == resumed.state_dict()
    assert run(RLVESource(s, run_dir=tmp_path / "d", seed=9, workers=workers).next_set(0)).envs == set0.envs


def test_an_unknown_configured_environment_names_the_key(workers, tmp_path):
    from spade.config import ConfigError

    source = RLVESource(settings(environments=("Multiplication", "Nope")), run_dir=tmp_path, seed=1, workers=workers)
    with pytest.raises(ConfigError, match=r"selfplay\.rlve\.environments: rlve-gym has no environment 'Nope'"):
        run(source.next_set(0))


# ---------------------------------------------------------------------- worker failures


def fake_worker(body: str) -> list[str]:
    """A stand-in worker process (announces itself ready, then does ``body``): no rlve-gym."""
    return [sys.executable, "-c", "import sys, time\nprint('{\"ready\": true}', flush=True)\n" + body]


def test_a_worker_that_dies_mid_request_is_an_infrastructure_fault():
    pool = RLVEWorkers(1, command=fake_worker("sys.stdin.readline()"))
    try:
        spec = ProblemSpec("Multiplication", 1, {"digit_num": 2}, 0).to_source()
        with pytest.raises(InfrastructureFault) as err:
            run(RLVESandbox(pool).open(spec))
        assert err.value.error.infrastructure and err.value.error.kind is ErrorKind.CRASHED
        with pytest.raises(InfrastructureFault):  # a fresh process is started for the next request
            run(RLVESandbox(pool).open(spec))
        assert pool.workers[0].starts == 2
    finally:
        pool.close()


def test_a_worker_past_its_timeout_is_killed_and_the_problem_blamed():
    pool = RLVEWorkers(1, command=fake_worker("sys.stdin.readline(); time.sleep(600)"))
    try:
        sandbox = RLVESandbox(pool, generation_timeout_s=0.1, request_timeout_s=0.5)
        with pytest.raises(EnvFault) as err:
            run(sandbox.open(ProblemSpec("Multiplication", 1, {"digit_num": 2}, 0).to_source()))
        assert err.value.error.kind is ErrorKind.TIMEOUT and not isinstance(err.value, InfrastructureFault)
        assert pool.pids() == []  # the hung process was killed
    finally:
        pool.close()


def test_closing_stops_every_worker():
    pool = RLVEWorkers(2, command=fake_worker("for line in sys.stdin:\n    print('{\"ok\": true}', flush=True)"))
    run(pool.start())
    procs = [psutil.Process(pid) for pid in pool.pids()]
    assert len(procs) == 2
    pool.close()
    _, alive = psutil.wait_procs(procs, timeout=30)
    assert alive == []
    with pytest.raises(Exception):
        run(pool.call(0, {"op": "list"}, 5.0))


PARENT = r'''
import asyncio, sys
from spade.envs.rlve import RLVEWorkers
pool = RLVEWorkers(1)
asyncio.run(pool.start())
print(pool.pids()[0], flush=True)
sys.stdin.read()
'''


def test_a_sigkilled_parent_takes_its_real_worker_with_it():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        worker = psutil.Process(int(parent.stdout.readline()))
        assert "spade.envs.rlve.worker" in " ".join(worker.cmdline())
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)
        _, alive = psutil.wait_procs([worker], timeout=60)
        assert alive == []
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


# ---------------------------------------------------------------------- spade train


def test_spade_train_two_steps_with_rlve(tmp_path):
    from chat_templates import bpe_tokenizer
    from support.models import save_tiny_qwen3

    hf = tmp_path / "hf"
    tokenizer = bpe_tokenizer()
    save_tiny_qwen3(hf, tokenizer, special_ids=True)
    path = tmp_path / "tiny.yaml"
    write_config(path, {
        "model": {"hf_dir": hf, "dtype": "float32"},
        "optimizer": {"lr": 0.001},
        "selfplay": {
            "env_source": "rlve",
            "k": 1,
            "envs_per_set": 2,
            "g_nohint": 2,
            "g_hint": 0,
            "sampling": {"agent": {"temperature": 1.0, "max_tokens": 24}},
            "use_corpus": False,
            "use_memory": False,
            "train_designer": False,
            "max_context_tokens": 1024,
            "rlve": {"environments": ["Multiplication"], "workers": 1, "accuracy_samples": 2},
        },
        "engine": {"max_batch_size": 4},
        "run": {"steps": 2, "checkpoint_every": 1, "seed": 7, "micro_batch_tokens": 2048},
    })
    run_dir = tmp_path / "run"
    tag = uuid.uuid4().hex
    proc = prewarmed.run(["train", "--config", str(path), "--run-dir", str(run_dir)], cwd=ROOT, timeout=240,
                         env={**os.environ, "SPADE_TEST_RLVE_TAG": tag, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1]
    assert all(r["env/admitted"] == 2.0 and r["agent/episodes"] == 4.0 for r in records)
    assert all(r["rlve/checked"] == 1.0 and r["rlve/problem_difficulty_mean"] >= 0.0 for r in records)  # 4 plays >= 2
    for step in (0, 1):
        sources = sorted((run_dir / "envs" / f"step_{step:06d}").glob("*.py"))
        assert len(sources) == 2
        assert all(ProblemSpec.from_source(p.read_text()).environment == "Multiplication" for p in sources)
    state = json.loads((run_dir / "checkpoints" / "step_2" / "trainer_state.json").read_text())
    source_state = state["orchestrator"]["env_source"]
    assert source_state["version"] == 1 and set(source_state) == {"version", "difficulty", "tallies"}
    episodes = [json.loads(line) for path in sorted((run_dir / "trajectories").glob("*.jsonl"))
                for line in path.read_text().splitlines()]
    episodes = [e for e in episodes if e["kind"] == "episode"]
    assert episodes and all(ANSWER_INSTRUCTION in e["opening"] for e in episodes)
    # a terminated play scored by Multiplication's verifier (-1, 0, 1); a cut one returns 0
    assert all(e["return"] in (-1.0, 0.0, 1.0) for e in episodes)
    assert all(e["return"] == 0.0 for e in episodes if e["end_reason"] != "terminated")
    # every worker ended with the run (they carry the tag in their environment)
    left = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("SPADE_TEST_RLVE_TAG") == tag:
                left.append(p)
        except (psutil.Error, OSError):
            continue
    assert left == []


def test_a_worker_that_cannot_start_says_why():
    pool = RLVEWorkers(1, command=[sys.executable, "-c", "print('{\"ready\": false, \"error\": \"no rlve-gym here\"}')"])
    try:
        with pytest.raises(WorkerDied, match="could not start: no rlve-gym here"):
            run(pool.call(0, {"op": "list"}, 5.0))
    finally:
        pool.close()
