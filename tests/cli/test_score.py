"""``spade score`` as a user runs it (subprocesses), against transformers as the independent
reference: the HF model's logits -> log_softmax -> the log-prob of each next token, fp32 on CPU.

The HF directory case scores a tied Llama; the Megatron checkpoint case a Qwen3-MoE converted with
``save_checkpoint``. Inputs mix ``text``, ``messages`` and ``token_ids`` lines, and the batch
budget is small so that several batches (with right padding) run.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

import support.hf_fixtures as hx
import prewarmed
from megatron_fixtures import ensure_megatron_world

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 120
TOL = 1e-4

CHAT = [{"role": "user", "content": "hello world what is the score"},
        {"role": "assistant", "content": "two and three"}]
INPUTS = [
    {"text": "the cat sat on the mat and the dog ran fast"},
    {"messages": CHAT},
    {"token_ids": [5, 199, 3, 100, 42, 7, 8, 9, 10, 11, 12, 150, 0, 64]},
    {"token_ids": [17]},
    {"text": "hello"},
]


def spade(*args: str) -> subprocess.CompletedProcess[str]:
    return prewarmed.run(list(args), cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=TIMEOUT)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    from spade.models import ParallelLayout
    from spade.training.checkpoint import save_checkpoint

    root = tmp_path_factory.mktemp("score")
    llama = hx.save_tiny_hf("llama-tied", root / "llama-tied", seed=1)
    moe = hx.save_tiny_hf("qwen3-moe", root / "qwen3-moe", seed=2)
    ensure_megatron_world()
    model, _ = hx.megatron_model(moe, ParallelLayout())
    save_checkpoint(root / "moe-ckpt", [model], hf_config=json.loads((moe / "config.json").read_text()),
                    layout=ParallelLayout(), step=3, tokenizer_dir=moe)
    (root / "in.jsonl").write_text("\n".join(json.dumps(x) for x in INPUTS[:2]) + "\n\n"
                                   + "\n".join(json.dumps(x) for x in INPUTS[2:]) + "\n")
    return {"llama": llama, "moe": moe, "moe-ckpt": root / "moe-ckpt", "input": root / "in.jsonl"}


def expected_ids(hf_dir: Path) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    ids = []
    for item in INPUTS:
        if "text" in item:
            ids.append(tokenizer(item["text"])["input_ids"])
        elif "messages" in item:
            ids.append(list(tokenizer.apply_chat_template(item["messages"], tokenize=True, return_dict=False)))
        else:
            ids.append(item["token_ids"])
    return ids


def check_against_transformers(lines: list[str], hf_dir: Path) -> None:
    results = [json.loads(line) for line in lines]
    assert len(results) == len(INPUTS)
    assert [r["token_ids"] for r in results] == expected_ids(hf_dir)
    reference = hx.load_hf(hf_dir)
    for result in results:
        assert set(result) == {"token_ids", "logprobs"}
        expected = hx.hf_logprobs(reference, result["token_ids"])
        assert len(result["logprobs"]) == len(result["token_ids"])
        assert result["logprobs"][0] is None  # the first token has no context
        worst = max((abs(a - b) for a, b in zip(result["logprobs"][1:], expected[1:])), default=0.0)
        assert worst < TOL, worst


def test_score_hf_directory_matches_transformers(models, tmp_path):
    out = tmp_path / "out.jsonl"
    done = spade("score", "--model", str(models["llama"]), "--input", str(models["input"]),
                 "--output", str(out), "--batch-tokens", "24")
    assert done.returncode == 0, done.stderr[-4000:]
    check_against_transformers(out.read_text().splitlines(), models["llama"])


def test_score_megatron_checkpoint_matches_transformers(models):
    done = spade("score", "--model", str(models["moe-ckpt"]), "--input", str(models["input"]))
    assert done.returncode == 0, done.stderr[-4000:]
    check_against_transformers(done.stdout.splitlines(), models["moe"])


def test_bad_input_line_exits_2_naming_the_line(models, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "fine"}) + "\n\n" + json.dumps({"token_ids": [1, 2, 999]}) + "\n")
    done = spade("score", "--model", str(models["llama"]), "--input", str(bad))
    assert done.returncode == 2
    assert "line 3" in done.stderr and "999" in done.stderr
    assert done.stdout == ""


@pytest.mark.parametrize("line, message", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
    ('{"text": "a", "token_ids": [1]}', "exactly one of"),
    ('{"prompt": "a"}', "exactly one of"),
    ('{"token_ids": [1, "2"]}', "list of integers"),
    ('{"token_ids": []}', "no tokens"),
    ('{"token_ids": [-1]}', "outside the vocabulary"),
    ('{"messages": [{"role": "user"}]}', "messages must be"),
    ('{"text": 5}', "text must be a string"),
])
def test_input_errors_name_the_line(models, line, message):
    from spade.cli.common import UsageError
    from spade.cli.score import read_requests

    with pytest.raises(UsageError, match=message) as raised:
        read_requests(['{"token_ids": [1, 2]}', "", line], models["llama"], hx.VOCAB, "in.jsonl")
    assert "in.jsonl: line 3" in str(raised.value)


def test_missing_model_is_a_usage_error(tmp_path):
    from spade.cli.common import UsageError
    from spade.cli.score import resolve_model

    with pytest.raises(UsageError, match="no such directory"):
        resolve_model(str(tmp_path / "nothing"))
    with pytest.raises(UsageError, match=r"not an HF model directory \(no config.json\), a spade checkpoint"):
        resolve_model(str(tmp_path))


def test_batches_respect_the_token_budget():
    from spade.cli.score import make_batches

    lengths = [5, 30, 7, 7, 2, 40]
    batches = make_batches(lengths, 21)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    assert [5] in batches and [1] in batches  # longer than the budget: alone
    for batch in batches:
        assert len(batch) == 1 or len(batch) * max(lengths[i] for i in batch) <= 21
