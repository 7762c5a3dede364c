"""SPICE through ``spade train`` end to end on CPU (issue 44): two steps with ``env_source: spice`` on
the demo corpus, the real HF engine, real ``math-verify`` and the real Megatron update; the same
run stopped after one step and resumed; then ``spade analyze`` on the run.

The tiny random Qwen3 of the train-loop tests cannot write a question, so its copy here is made
into a bigram model by hand: four replies are added to the tokenizer as single tokens, attention
and MLP outputs are zeroed (each position's logits depend on its own token only), and the output
layer gives, after the generation prompt, a Challenger reply with an answer (``<question>What is
2+2?</question><answer>4</answer>``) or one without (invalid), followed by ``\\boxed{4}`` or
``\\boxed{5}`` (after the invalid one ``\\boxed{4}`` only). As the Challenger it then writes valid
and invalid questions; as the Reasoner the same reply's last box answers "What is 2+2?" right or
wrong. Both roles get rewards that differ within a group: a real gradient, and the invalid
question's penalty among the Challenger's rewards.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from test_train_loop import tiny_hf  # noqa: F401  (a fixture: the train-loop tests' tiny Qwen3)
from test_train_loop import assert_same_run, checkpoint_tensors, metrics, run_spade

from spade.cli import main
from spade.envs.spice import QuestionSpec

ROOT = Path(__file__).resolve().parents[2]
WITH_ANSWER = "<question>What is 2+2?</question><answer>4</answer>"
NO_ANSWER = "<question>What is 2+2?</question>"
RIGHT, WRONG = "\\boxed{4}", "\\boxed{5}"
LOGIT = 20.0


@pytest.fixture(scope="module")
def spice_hf(tiny_hf, tmp_path_factory) -> Path:  # noqa: F811
    from tokenizers import AddedToken
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_hf)
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False)
                          for t in (WITH_ANSWER, NO_ANSWER, RIGHT, WRONG)])
    model = AutoModelForCausalLM.from_pretrained(tiny_hf)
    model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    ids = {text: tokenizer.convert_tokens_to_ids(text) for text in (WITH_ANSWER, NO_ANSWER, RIGHT, WRONG)}
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "x"}], add_generation_prompt=True,
                                           tokenize=False)
    after_prompt = tokenizer(prompt, add_special_tokens=False)["input_ids"][-1]
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    # (the token, {the next token: its logit}): a question with an answer a little more often than one without
    bigrams = [(after_prompt, {ids[WITH_ANSWER]: LOGIT + 0.4, ids[NO_ANSWER]: LOGIT}),
               (ids[WITH_ANSWER], {ids[RIGHT]: LOGIT, ids[WRONG]: LOGIT}), (ids[NO_ANSWER], {ids[RIGHT]: LOGIT}),
               (ids[RIGHT], {end: LOGIT}), (ids[WRONG], {end: LOGIT})]
    hidden = model.config.hidden_size
    with torch.no_grad():
        for layer in model.model.layers:  # the residual stream is the token's embedding alone
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embedding, output = model.model.embed_tokens.weight, model.lm_head.weight
        output.zero_()
        for axis, (token, following) in enumerate(bigrams):
            embedding[token] = 0.0
            embedding[token, axis] = 1.0  # the final RMSNorm makes it sqrt(hidden) along that axis
            for target, logit in following.items():
                output[target, axis] = logit / hidden ** 0.5
    directory = tmp_path_factory.mktemp("spice_hf")
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def spice_config(spice_hf, tmp_path_factory) -> Path:
    config = tmp_path_factory.mktemp("spice_config") / "spice.yaml"
    config.write_text(f"""
model: {{hf_dir: {spice_hf}, dtype: float32}}
optimizer: {{lr: 1.0e-3}}
selfplay:
  env_source: spice
  k: 1
  envs_per_set: 4
  g_nohint: 4
  g_hint: 0
  use_corpus: true
  use_memory: false
  sampling: {{designer: {{max_tokens: 40}}, agent: {{max_tokens: 40}}}}
  max_context_tokens: 2048
  rewards: {{designer_reward: solver_variance, failed_hint: hint_return_zero, advantage_agent_samples: null,
             advantage_cap: 1.0}}
  spice: {{mcq_share: 0.0, grounding: none}}
corpus: {{paths: [{ROOT / "examples" / "corpus" / "demo.jsonl.gz"}], max_words: 20}}
engine: {{max_batch_size: 1}}   # batch-invariant rollout log-probs: exact resume down to the last bit
run: {{steps: 2, checkpoint_every: 1, seed: 1, micro_batch_tokens: 4096}}
""")
    return config


@pytest.fixture(scope="module")
def spice_run(spice_config, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("spice_run") / "run"
    run_spade("--config", str(spice_config), "--run-dir", str(run))
    return run


def test_spice_trains_both_roles_through_spade_train(spice_run):
    records = metrics(spice_run)
    assert [r["step"] for r in records] == [0, 1]
    for record in records:  # every step: a Challenger round and the Reasoner's plays of its valid questions
        assert record["spice/challenger_questions"] == 4.0
        assert 1.0 <= record["spice/challenger_valid"] == record["env/admitted"]
        assert record["spice/challenger_valid"] + record["spice/challenger_penalised"] == 4.0
        assert 0.0 < record["spice/reasoner_accuracy"] < 1.0  # math-verify said right and wrong
        assert record["spice/reasoner_variance_mean"] > 0.0 and 0.0 < record["spice/challenger_reward_now"] <= 1.0
        assert record["agent/samples"] == 4.0 * record["env/admitted"]
        assert record["train/grad_norm"] > 0.0
    # step 0's Challenger calls, the valid ones and the penalised, train at step 1 (k 1)
    first, second = records
    assert first["spice/challenger_penalised"] >= 1  # (with this seed: 3 valid, 1 invalid)
    assert first["designer/samples"] == 0.0 and second["designer/samples"] == second["designer/released"] == 4.0
    sources = sorted((spice_run / "envs" / "step_000000").glob("*.py"))
    assert len(sources) == first["env/admitted"]
    assert all(QuestionSpec.from_source(p.read_text()).answer == "4" for p in sources)
    rejected = sorted(spice_run.glob("rejected/step_*/*.json"))
    assert len(rejected) == first["spice/challenger_penalised"] + second["spice/challenger_penalised"]
    assert all(json.loads(p.read_text())["reason"]["kind"] == "invalid_question" for p in rejected)
    # the released rewards, by hand: each valid question's Gaussian of its plays' variance, -0.1 each invalid one
    plays = [json.loads(line) for path in sorted(spice_run.glob("trajectories/step_*.jsonl"))
             for line in path.read_text().splitlines()]
    groups = [entry["nohint_returns"] for entry in plays if entry["kind"] == "env_returns" and entry["step"] == 0]
    assert len(groups) == first["env/admitted"]

    def gaussian(returns):
        mean = sum(returns) / len(returns)
        variance = sum((r - mean) ** 2 for r in returns) / len(returns)
        return math.exp(-((variance - 0.25) ** 2) / (2 * 0.1 ** 2))

    expected = (sum(gaussian(g) for g in groups) - 0.1 * first["spice/challenger_penalised"]) / 4
    assert second["designer/reward_mean"] == pytest.approx(expected)
    # the trained weights changed at each update
    step1, step2 = (checkpoint_tensors(spice_run / "checkpoints" / f"step_{n}") for n in (1, 2))
    keys = [k for k in step1 if k.startswith(("embedding.", "decoder.", "output_layer."))]
    assert keys and any(not torch.equal(step1[k], step2[k]) for k in keys)


def test_a_resumed_spice_run_equals_the_straight_one(spice_run, spice_config, tmp_path):
    """One step, stop, ``--resume`` to two: the same metrics and bit-identical weights, the step-0
    Challenger samples (the penalised one among them) carried through the checkpoint."""
    run = tmp_path / "run"
    run_spade("--config", str(spice_config), "--run-dir", str(run), "run.steps=1")
    state = json.loads((run / "checkpoints" / "step_1" / "trainer_state.json").read_text())
    pending = state["orchestrator"]["designer_buffer"]["pending"]
    assert any(entry.get("penalty") == -0.1 for entry in pending)
    run_spade("--resume", str(run), "run.steps=2")
    assert_same_run(spice_run, run)


def test_spade_analyze_reads_a_spice_run(spice_run, tmp_path, capsys):
    out = tmp_path / "analysis"
    assert main(["analyze", str(spice_run), "--out", str(out), "--embedding", "hashing"]) == 0
    data = json.loads((out / "analysis.json").read_text())
    (only,) = data["runs"]
    assert [s["step"] for s in only["steps"]] == [0, 1]
    assert {e["class_name"] for e in data["envs"]} == {"spice_free_form"}
