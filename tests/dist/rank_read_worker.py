"""Worker for tests/test_rank_reads_distributed.py: ``Learner.build`` under two ranks reads only
each rank's part of the checkpoint.

Run with ``torchrun --nproc_per_node 2 tests/dist/rank_read_worker.py --hf-dir DIR --layout tp2``.
``safetensors.safe_open`` is wrapped so that every tensor (part) a rank takes from the files is
counted; the learner's parameters are compared with the shards the full-read path gives this
rank. Each rank writes its result to ``OUT_DIR/rank<r>.json`` (two ranks printing at once can
interleave their lines on the shared stdout).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import safetensors  # noqa: E402

BYTES = {"read": 0}


class _CountingSlice:
    def __init__(self, inner):
        self.inner = inner

    def get_shape(self):
        return self.inner.get_shape()

    def __getitem__(self, index):
        tensor = self.inner[index]
        BYTES["read"] += tensor.numel() * tensor.element_size()
        return tensor


class _CountingHandle:
    def __init__(self, inner):
        self.inner = inner

    def __enter__(self):
        self.inner.__enter__()
        return self

    def __exit__(self, *exc):
        return self.inner.__exit__(*exc)

    def keys(self):
        return self.inner.keys()

    def metadata(self):
        return self.inner.metadata()

    def get_tensor(self, name):
        tensor = self.inner.get_tensor(name)
        BYTES["read"] += tensor.numel() * tensor.element_size()
        return tensor

    def get_slice(self, name):
        return _CountingSlice(self.inner.get_slice(name))


_original = safetensors.safe_open
safetensors.safe_open = lambda *args, **kwargs: _CountingHandle(_original(*args, **kwargs))

LAYOUTS = {"tp2": dict(tp=2), "pp2": dict(pp=2)}


def main() -> None:
    from megatron.core.utils import unwrap_model

    from spade.models import ParallelLayout, RankCoords, read_model_spec
    from spade.models.weight_map import hf_to_megatron
    from spade.training import LossSettings, OptimizerSettings
    from spade.training.hf_directory import read_hf_tensors
    from spade.training.learner import Learner, LearnerOptions
    from spade.training.parallel import init_parallel

    parser = argparse.ArgumentParser()
    parser.add_argument("--hf-dir", required=True)
    parser.add_argument("--layout", choices=sorted(LAYOUTS), required=True)
    parser.add_argument("--out-dir", required=True)
    args = parser.parse_args()
    layout = ParallelLayout(**LAYOUTS[args.layout])
    ctx = init_parallel(layout, seed=0, backend="gloo")
    hf_dir = Path(args.hf_dir)
    hf_config = json.loads((hf_dir / "config.json").read_text())
    options = LearnerOptions(optimizer=OptimizerSettings(), loss=LossSettings(), micro_batch_tokens=64,
                             dtype=torch.float32)
    learner = Learner.build(hf_dir, hf_config, layout, ctx, options)
    read = BYTES["read"]

    spec = read_model_spec(hf_config)
    full = read_hf_tensors(hf_dir, spec)
    expected = hf_to_megatron(full, spec, layout, RankCoords.current())
    params = {name: p.detach() for name, p in unwrap_model(learner.chunks[0]).named_parameters()}
    mismatched = sorted(name for name in expected if not torch.equal(params[name].cpu(), expected[name]))
    (Path(args.out_dir) / f"rank{ctx.rank}.json").write_text(json.dumps({
        "rank": ctx.rank, "bytes_read": read,
        "checkpoint_bytes": sum(t.numel() * t.element_size() for t in full.values()),
        "shard_bytes": sum(t.numel() * t.element_size() for t in expected.values()),
        "same_names": sorted(params) == sorted(expected), "mismatched": mismatched[:5],
    }))


if __name__ == "__main__":
    main()
