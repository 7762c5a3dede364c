"""``spade score``: per-token log-probs of texts, chats or token ids under a model checkpoint.

``--model`` is an HF directory (config.json, safetensors, tokenizer), ``embedded``, a spade Megatron
checkpoint (recognised by its ``spade_checkpoint.json``; tokenizer and config come from its ``hf/``)
or a run directory (its newest intact checkpoint), as for every command (``spade.run.engines``). The
Megatron model scores, never transformers: its final hidden states go through
``spade.rl.logprobs.token_logprobs`` against this rank's (vocab-parallel) output-layer shard. The
rows Megatron adds to pad the vocabulary are kept out of the softmax (``vocab_size``), so the
result is the log-softmax over the real vocabulary only, as in transformers.

Input: JSON lines, each an object with exactly one of ``text`` (tokenised with the tokenizer's
defaults), ``messages`` (a chat, through ``tokenizer.apply_chat_template``) or ``token_ids``.
Blank lines are skipped. Output: one JSON line per input, in input order:
``{"token_ids": [...], "logprobs": [...]}`` where ``logprobs[i]`` is log p(token i | tokens
before it) and ``logprobs[0]`` is null, as the first token has no context.

Tensor parallelism: ``torchrun --nproc_per_node N -m spade score --tp N ...``; every rank scores
the same batches, rank 0 writes. The distributed world and Megatron's parallel state (one process
or a torchrun world) come from ``spade.training.parallel.parallel_session``, as in the conversion
tools.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence, TextIO

from .common import UsageError

DEFAULT_BATCH_TOKENS = 4096
INPUT_KEYS = ("text", "messages", "token_ids")


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    score = subparsers.add_parser(
        "score",
        help="per-token log-probs of texts, chats or token ids under a checkpoint",
        description=(
            "Score JSON lines ({\"text\"}, {\"messages\"} or {\"token_ids\"}) with the Megatron "
            "model of an HF directory or a spade checkpoint. Writes one JSON line per input: "
            "{\"token_ids\": [...], \"logprobs\": [...]}, logprobs[i] = log p(token i | tokens "
            "before it); logprobs[0] is null (the first token has no context). For --tp N run "
            "under 'torchrun --nproc_per_node N -m spade score ...'."
        ),
    )
    score.add_argument("--model", required=True, metavar="PATH",
                       help="HF model directory, 'embedded', a spade checkpoint (RUN/checkpoints/step_N) or a "
                            "run directory (its newest intact checkpoint)")
    score.add_argument("--input", required=True, metavar="FILE", help="JSON lines to score ('-': stdin)")
    score.add_argument("--output", metavar="FILE", help="where to write the JSON lines (default: stdout)")
    score.add_argument("--tp", type=int, default=1, metavar="N", help="tensor-parallel size (= torchrun ranks)")
    score.add_argument("--batch-tokens", type=int, default=DEFAULT_BATCH_TOKENS, metavar="N",
                       help=f"at most N padded tokens per forward pass (default {DEFAULT_BATCH_TOKENS}); "
                            "a longer sequence runs alone")
    score.set_defaults(handler=run_score)


# ---------------------------------------------------------------------------- model sources


@dataclass(frozen=True)
class ModelSource:
    """Where the weights, the config and the tokenizer of ``--model`` are."""

    kind: str  # "hf" or "megatron"
    path: Path
    hf_dir: Path  # config.json and tokenizer files
    hf_config: dict


def resolve_model(path: str) -> ModelSource:
    """``--model`` as every command reads it (``spade.run.engines.resolve_model``): an HF directory,
    ``embedded``, a spade checkpoint, or a run directory (its newest intact checkpoint)."""
    from ..run.engines import ModelRefError
    from ..run.engines import resolve_model as resolve_reference

    try:
        ref = resolve_reference(path)
        hf_config = ref.hf_config
    except ModelRefError as exc:
        raise UsageError(str(exc)) from None
    except (OSError, json.JSONDecodeError) as exc:
        raise UsageError(f"--model {path}: cannot read config.json: {exc}") from None
    for note in ref.notes:
        print(f"spade score: {note}", file=sys.stderr)
    if ref.checkpoint is not None:
        return ModelSource("megatron", ref.checkpoint, ref.hf_dir, hf_config)
    return ModelSource("hf", ref.hf_dir, ref.hf_dir, hf_config)


# ---------------------------------------------------------------------------- input


class _LazyTokenizer:
    def __init__(self, hf_dir: Path):
        self.hf_dir, self._tokenizer = hf_dir, None

    def get(self, lineno: int, what: str):
        if self._tokenizer is None:
            try:
                from transformers import AutoTokenizer

                self._tokenizer = AutoTokenizer.from_pretrained(str(self.hf_dir))
            except Exception as exc:  # noqa: BLE001  (any loading failure is the same usage error)
                raise UsageError(f"line {lineno}: {what} input needs a tokenizer, and none loads "
                                 f"from {self.hf_dir}: {exc}") from None
        return self._tokenizer


def read_requests(lines: Sequence[str], hf_dir: Path, vocab_size: int, source: str = "input"
                  ) -> list[list[int]]:
    """Token ids of each non-blank JSON line; UsageError naming the line for anything wrong."""
    tokenizer = _LazyTokenizer(hf_dir)
    requests = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        ids = _line_ids(line, lineno, tokenizer, source)
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise UsageError(f"{source}: line {lineno}: token id {bad[0]} is outside the "
                             f"vocabulary [0, {vocab_size})")
        if not ids:
            raise UsageError(f"{source}: line {lineno}: no tokens to score")
        requests.append(ids)
    return requests


def _line_ids(line: str, lineno: int, tokenizer: _LazyTokenizer, source: str) -> list[int]:
    where = f"{source}: line {lineno}"
    try:
        item = json.loads(line)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{where}: not valid JSON ({exc.msg})") from None
    if not isinstance(item, dict):
        raise UsageError(f"{where}: expected a JSON object with one of {', '.join(INPUT_KEYS)}")
    given = [key for key in INPUT_KEYS if key in item]
    if len(given) != 1:
        raise UsageError(f"{where}: needs exactly one of {', '.join(INPUT_KEYS)}, got "
                         f"{given or sorted(item)}")
    key, value = given[0], item[given[0]]
    if key == "token_ids":
        if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
            raise UsageError(f"{where}: token_ids must be a list of integers")
        return list(value)
    if key == "text":
        if not isinstance(value, str):
            raise UsageError(f"{where}: text must be a string")
        return list(tokenizer.get(lineno, "text")(value)["input_ids"])
    if not isinstance(value, list) or not value or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in value):
        raise UsageError(f"{where}: messages must be a non-empty list of {{role, content}} strings")
    chat = tokenizer.get(lineno, "messages")
    if not getattr(chat, "chat_template", None):
        raise UsageError(f"{where}: the tokenizer in {tokenizer.hf_dir} has no chat template")
    ids = chat.apply_chat_template(value, tokenize=True, return_dict=False)
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return [int(t) for t in ids]


def make_batches(lengths: Sequence[int], batch_tokens: int) -> list[list[int]]:
    """Indices grouped (longest first) so that count x longest <= batch_tokens, at least one each."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    for index in order:
        if batches and (len(batches[-1]) + 1) * lengths[batches[-1][0]] <= batch_tokens:
            batches[-1].append(index)
        else:
            batches.append([index])
    return batches


def load_model(source: ModelSource, layout: Any):
    """This rank's Megatron GPTModel (eval mode) with the weights of ``source``."""
    import torch

    from ..models import RankCoords, read_model_spec
    from ..models.builder import BuildOptions, build_gpt_model, naming_for
    from ..models.loading import load_hf_state
    from ..models.weight_map import bindings
    from ..training.hf_directory import read_hf_tensors

    import megatron_patches

    spec = read_model_spec(source.hf_config)
    # random init is kept (the builder needs it to tag TP shards); the load overwrites it
    options = BuildOptions(params_dtype=None if torch.cuda.is_available() else torch.float32)
    with megatron_patches.cpu_device_mode():
        model = build_gpt_model(spec, layout, options)
        if source.kind == "megatron":
            from ..training.checkpoint import load_checkpoint

            load_checkpoint(source.path, [model], load_rng=False)
        else:
            coords = RankCoords.current()
            naming = naming_for(options)
            needed = {h for b in bindings(spec, layout, coords, naming) for h in b.hf}
            state = read_hf_tensors(source.path, spec, needed)
            load_hf_state(model, state, spec, layout, coords, naming)
    return model.eval(), spec


# ---------------------------------------------------------------------------- scoring


@contextlib.contextmanager
def _hidden_states_only(model) -> Iterator[None]:
    """Make GPTModel.forward stop before the output layer (final-normed hidden states out)."""
    saved = model.post_process
    model.post_process = False
    try:
        yield
    finally:
        model.post_process = saved


def _output_weight(model):
    if model.share_embeddings_and_output_weights:
        return model.shared_embedding_or_output_weight()
    return model.output_layer.weight


def score_batch(model, sequences: Sequence[Sequence[int]], vocab_size: int) -> list[list[Optional[float]]]:
    """Log-probs of each sequence's tokens (first one None) under this rank's Megatron model."""
    import torch
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import gather_from_sequence_parallel_region

    from ..rl.logprobs import token_logprobs

    import megatron_patches

    tp = ps.get_tensor_model_parallel_world_size()
    sequence_parallel = bool(model.config.sequence_parallel)
    longest = max(len(s) for s in sequences)
    length = -(-longest // tp) * tp if sequence_parallel else longest
    device = _output_weight(model).device
    ids = torch.zeros(len(sequences), length, dtype=torch.long, device=device)
    for row, sequence in enumerate(sequences):
        ids[row, : len(sequence)] = torch.tensor(sequence, dtype=torch.long)
    positions = torch.arange(length, device=device).expand_as(ids)
    targets = torch.zeros_like(ids)
    targets[:, :-1] = ids[:, 1:]  # hidden state t predicts token t + 1
    with torch.no_grad(), megatron_patches.cpu_device_mode(), _hidden_states_only(model):
        hidden = model(ids, positions, None)  # [T(/tp with SP), B, H]
        if sequence_parallel and tp > 1:
            hidden = gather_from_sequence_parallel_region(hidden, tensor_parallel_output_grad=False)
        group = ps.get_tensor_model_parallel_group() if tp > 1 else None
        logprobs = token_logprobs(hidden, _output_weight(model), targets, tp_group=group,
                                  vocab_size=vocab_size).float().cpu()
    return [[None] + logprobs[row, : len(s) - 1].tolist() for row, s in enumerate(sequences)]


# ---------------------------------------------------------------------------- the command


def _read_lines(path: str) -> list[str]:
    if path == "-":
        return sys.stdin.read().splitlines()
    try:
        return Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read --input {path}: {exc}") from None


def run_score(args: argparse.Namespace) -> int:
    if args.tp < 1 or args.batch_tokens < 1:
        raise UsageError("--tp and --batch-tokens must be positive")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world != args.tp:
        raise UsageError(f"--tp {args.tp} needs exactly {args.tp} processes, got WORLD_SIZE={world} "
                         f"(run under 'torchrun --nproc_per_node {args.tp} -m spade score ...')")
    source = resolve_model(args.model)
    try:
        from ..models import read_model_spec

        spec = read_model_spec(source.hf_config)
    except (ValueError, KeyError) as exc:
        raise UsageError(f"--model {args.model}: {exc}") from None
    requests = read_requests(_read_lines(args.input), source.hf_dir, spec.vocab_size, args.input)

    from ..models import ParallelLayout
    from ..training.parallel import parallel_session

    started = time.perf_counter()
    layout = ParallelLayout(tp=args.tp)
    with parallel_session(layout):
        import torch.distributed as dist

        model, _ = load_model(source, layout)
        results: list[Optional[list[Optional[float]]]] = [None] * len(requests)
        for batch in make_batches([len(r) for r in requests], args.batch_tokens):
            for index, scores in zip(batch, score_batch(model, [requests[i] for i in batch], spec.vocab_size)):
                results[index] = scores
        if dist.get_rank() == 0:
            _write_results(args.output, requests, results)
            tokens = sum(len(r) for r in requests)
            print(f"spade score: {len(requests)} sequences, {tokens} tokens, "
                  f"{time.perf_counter() - started:.1f} s", file=sys.stderr)
    return 0


def _write_results(path: Optional[str], requests: list[list[int]],
                   results: Sequence[Optional[list[Optional[float]]]]) -> None:
    handle: TextIO
    with (open(path, "w", encoding="utf-8") if path else contextlib.nullcontext(sys.stdout)) as handle:
        for ids, logprobs in zip(requests, results):
            handle.write(json.dumps({"token_ids": ids, "logprobs": logprobs}) + "\n")
