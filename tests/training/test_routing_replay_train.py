"""``spade train`` with ``loss.routing_replay: rollout`` end to end on CPU: a tiny random
Qwen3-MoE (2 layers, 4 experts, top-2) plays the fixed pool of test_train_loop on the real hf
engine, which records every play's routing; the Megatron update replays it and reports
``train/router_agreement``. Engine and trainer hold the same weights, so their own routing agrees
up to floating-point near-ties. Run as a subprocess with a hard timeout.
"""

from __future__ import annotations

import json
from pathlib import Path

import prewarmed
import pytest
import torch

from test_train_loop import ROOT, train_config  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory) -> Path:
    """test_train_loop's tokenizer and shape, as a mixture of experts."""
    from chat_templates import bpe_tokenizer
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    directory = tmp_path_factory.mktemp("tiny_qwen3_moe")
    tokenizer = bpe_tokenizer()
    config = Qwen3MoeConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
                            num_experts=4, num_experts_per_tok=2, norm_topk_prob=True, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=2048,
                            rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=False,
                            eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
                            pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).eval().save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def test_a_replayed_update_reports_router_agreement(train_config, tmp_path):  # noqa: F811
    config = tmp_path / "replay.yaml"
    text = train_config.read_text().replace("run: {steps: 2,", "run: {steps: 1,")
    config.write_text(text + "loss: {routing_replay: rollout}\n")
    run = tmp_path / "run"
    proc = prewarmed.run(["train", "--config", str(config), "--run-dir", str(run)], cwd=ROOT, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    [record] = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    print({k: v for k, v in record.items() if k.startswith("train/")})
    assert record["train/samples"] > 0
    assert 0.9 <= record["train/router_agreement"] <= 1.0
    assert record["train/rollout_logprob_abs_diff"] < 1e-3
