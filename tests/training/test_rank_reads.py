"""Each rank reads only its part of an HF checkpoint (issue 21, fault 5).

For tiny saved checkpoints and TP / PP / EP layouts, computed on CPU without a process group
(ranks are just ``RankCoords``): every rank's state read through ``read_rank_state`` equals the
shards the full-read path (``read_hf_tensors`` of everything, then ``hf_to_megatron``) gives that
rank, and the bytes that came off the safetensors files are exactly that rank's shard bytes
(vocabulary padding rows excluded: they are zeros made in memory), never the whole checkpoint.
The learner builds its model through this path (``Learner.build`` under torchrun is in
``tests/test_rank_reads_distributed.py``).
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

from support.hf_fixtures import save_tiny_hf
from spade.models import ParallelLayout, RankCoords, read_model_spec
from spade.models.weight_map import Split, bindings, hf_to_megatron
from spade.training import rank_weights
from spade.training.hf_directory import read_hf_tensors


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("rank_reads")
    return {name: save_tiny_hf(name, root / name, max_shard_size="20KB" if name == "qwen3" else None)
            for name in ("qwen3", "qwen3-moe", "llama-tied")}


class CountingSlices(rank_weights.SafetensorsSlices):
    """Counts the bytes of every tensor (part) read from the files."""

    bytes_read = 0
    names_read: set = set()

    def read(self, name, dim=None, start=0, stop=None):
        tensor = super().read(name, dim, start, stop)
        type(self).bytes_read += tensor.numel() * tensor.element_size()
        type(self).names_read.add(name)
        return tensor


@pytest.fixture
def counting(monkeypatch):
    monkeypatch.setattr(rank_weights, "SafetensorsSlices", CountingSlices)

    def reset():
        CountingSlices.bytes_read, CountingSlices.names_read = 0, set()

    reset()
    return reset


def all_coords(layout: ParallelLayout, moe: bool) -> list[RankCoords]:
    ep_ranks = range(layout.ep) if moe else [0]
    return [RankCoords(tp=t, pp=p, ep=e, etp=t % layout.expert_tp)
            for t, p, e in itertools.product(range(layout.tp), range(layout.pp), ep_ranks)]


def padding_bytes(spec, layout, coords) -> int:
    """Bytes of zero rows the rank's vocabulary shards hold past the real vocabulary."""
    total = 0
    for binding in bindings(spec, layout, coords):
        if binding.rule.split is not Split.VOCAB:
            continue
        step = layout.padded_vocab_size(spec.vocab_size) // layout.tp
        start = coords.tp * step
        pad_rows = step - max(0, min(start + step, spec.vocab_size) - start)
        total += pad_rows * spec.hidden_size * 4  # the fixtures are fp32
    return total


CASES = [
    ("qwen3", ParallelLayout(tp=2)),
    ("qwen3", ParallelLayout(tp=4)),  # fewer query groups (2) than ranks: one group split in two
    ("qwen3", ParallelLayout(tp=2, pp=2)),
    ("llama-tied", ParallelLayout(pp=2)),  # tied output layer copy on the last stage
    ("llama-tied", ParallelLayout(tp=2, pp=2)),
    ("qwen3-moe", ParallelLayout(ep=2)),
    ("qwen3-moe", ParallelLayout(tp=2, ep=2)),
    ("qwen3-moe", ParallelLayout(tp=2, pp=2, ep=2, etp=1)),
]


@pytest.mark.parametrize("name,layout", CASES, ids=[f"{n}-tp{l.tp}pp{l.pp}ep{l.ep}" for n, l in CASES])
def test_each_rank_reads_only_its_shard_and_gets_the_full_read_result(checkpoints, counting, name, layout):
    hf_dir = checkpoints[name]
    spec = read_model_spec(hf_dir)
    full = read_hf_tensors(hf_dir, spec)
    checkpoint_bytes = sum(t.numel() * t.element_size() for t in full.values())
    for coords in all_coords(layout, spec.moe is not None):
        reference = hf_to_megatron(full, spec, layout, coords)
        counting()
        state = rank_weights.read_rank_state(hf_dir, spec, layout, coords)
        assert state.keys() == reference.keys()
        for key, tensor in reference.items():
            assert torch.equal(state[key], tensor), f"{coords} {key}"
        shard_bytes = sum(t.numel() * t.element_size() for t in reference.values())
        assert CountingSlices.bytes_read == shard_bytes - padding_bytes(spec, layout, coords), coords
        assert CountingSlices.bytes_read < checkpoint_bytes, coords
        other_stages = {f"model.layers.{i}." for i in range(spec.num_layers)
                        if not layout.layer_offset(spec.num_layers, coords.pp) <= i
                        < layout.layer_offset(spec.num_layers, coords.pp) + layout.layers_per_stage(spec.num_layers)}
        assert not any(n.startswith(tuple(other_stages)) for n in CountingSlices.names_read if other_stages)


def test_single_rank_reads_the_whole_model_once(checkpoints, counting):
    hf_dir = checkpoints["qwen3"]
    spec = read_model_spec(hf_dir)
    full = read_hf_tensors(hf_dir, spec)
    state = rank_weights.read_rank_state(hf_dir, spec, ParallelLayout(), RankCoords())
    reference = hf_to_megatron(full, spec)
    assert all(torch.equal(state[k], v) for k, v in reference.items()) and state.keys() == reference.keys()
    assert CountingSlices.bytes_read == sum(t.numel() * t.element_size() for t in full.values())


def test_fused_expert_checkpoint_falls_back_to_a_whole_read(tmp_path):
    """A directory with transformers-5 fused expert tensors has no per-expert names to slice."""
    from safetensors.torch import save_file

    from support.hf_fixtures import tiny_model

    model = tiny_model("qwen3-moe")
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    # the pinned transformers (5.x) fuses experts in memory; an unfused layout would test nothing here
    assert any(k.endswith("mlp.experts.gate_up_proj") for k in state), "experts unfused: check the transformers pin"
    save_file(state, str(tmp_path / "model.safetensors"))
    model.config.save_pretrained(tmp_path)
    spec = read_model_spec(tmp_path)
    layout, coords = ParallelLayout(tp=2, ep=2), RankCoords(tp=1, ep=1, etp=1)
    expected = hf_to_megatron(read_hf_tensors(tmp_path, spec), spec, layout, coords)
    state = rank_weights.read_rank_state(tmp_path, spec, layout, coords)
    assert state.keys() == expected.keys() and all(torch.equal(state[k], v) for k, v in expected.items())
