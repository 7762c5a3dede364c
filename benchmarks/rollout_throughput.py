"""Rollout tokens/s through spade's SGLang engine against the server's own speed, side by side.

    # GPU: launch an SGLang server here, measure, and also run SGLang's own benchmark
    python benchmarks/rollout_throughput.py --model-path models/Qwen3-4B-Instruct-2507 \
        --concurrency 64 --num-prompts 512 --input-len 2048 --output-len 2048 --sglang-bench
    # an already running server (any host)
    python benchmarks/rollout_throughput.py --url http://127.0.0.1:30000 --model-path DIR ...
    # CPU: the tests' protocol stand-in serving a tiny model (client overhead only)
    python benchmarks/rollout_throughput.py --model-path DIR --server-command \
        "python tests/sglang_standin/server.py" --concurrency 8 --num-prompts 32 --input-len 64 --output-len 32

The same workload runs through three clients, one after the other, against the same server:

* ``spade``: ``SGLangEngine.generate`` (what the orchestrator uses: our HTTP/1.1 client, request
  placement, response parsing into token ids and log-probs), ``--concurrency`` requests in flight;
* ``direct``: a bare asyncio client posting the identical ``/generate`` bodies over keep-alive
  connections and only counting ``output_ids``: the server's speed without our client;
* ``bench_serving`` (``--sglang-bench``, needs SGLang installed): ``python -m
  sglang.bench_serving --backend sglang`` with random prompts of exactly ``--input-len`` tokens and
  outputs of exactly ``--output-len`` (``--random-range-ratio 1``) at ``--max-concurrency``.

Every request has a random prompt of ``--input-len`` token ids (seeded, below the vocabulary size
of ``--model-path``), samples at temperature 1 and ignores EOS, so every completion has exactly
``--output-len`` tokens. Output tokens/s = completed output tokens / wall time of the pass. The
printed ratios (``spade / direct``, ``spade / bench_serving``) are the figures; the target is
0.95 or more. ``--json`` prints them as one JSON object as well.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from spade.rollout.sglang import protocol as proto  # noqa: E402
from spade.rollout.engine import GenerationRequest, SamplingParams  # noqa: E402
from spade.rollout.sglang.engine import SGLangEngine  # noqa: E402

from bench_server import add_server_args, served  # noqa: E402


@dataclass
class Pass:
    client: str
    requests: int
    output_tokens: int
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds if self.seconds > 0 else 0.0


def make_requests(args: argparse.Namespace, vocab_size: int) -> list[GenerationRequest]:
    rng = random.Random(args.seed)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=args.output_len, ignore_eos=True)
    high = min(vocab_size, args.max_token_id or vocab_size) - 1
    return [GenerationRequest(tuple(rng.randint(10, high) for _ in range(args.input_len)), sampling)
            for _ in range(args.num_prompts)]


async def spade_pass(url: str, requests: list[GenerationRequest], concurrency: int) -> Pass:
    engine = SGLangEngine([url], request_timeout_s=3600)
    gate = asyncio.Semaphore(concurrency)
    tokens = 0

    async def one(request: GenerationRequest) -> None:
        nonlocal tokens
        async with gate:
            result = await engine.generate(request)
        tokens += len(result.token_ids)

    started = time.perf_counter()
    await asyncio.gather(*(one(r) for r in requests))
    seconds = time.perf_counter() - started
    await engine.aclose()
    return Pass("spade", len(requests), tokens, seconds)


async def _post_json(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str, body: bytes) -> Any:
    writer.write(f"POST /generate HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    await writer.drain()
    status = await reader.readline()
    length = 0
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            break
        key, _, value = line.decode("latin-1").partition(":")
        if key.strip().lower() == "content-length":
            length = int(value)
    data = await reader.readexactly(length)
    if b" 200 " not in status:
        raise RuntimeError(f"/generate answered {status!r}: {data[:200]!r}")
    return json.loads(data)


async def direct_pass(url: str, requests: list[GenerationRequest], concurrency: int) -> Pass:
    host_port = url.removeprefix("http://").rstrip("/")
    host, _, port = host_port.rpartition(":")
    queue: asyncio.Queue = asyncio.Queue()
    for index, request in enumerate(requests):
        queue.put_nowait(json.dumps(proto.generate_payload(request, f"direct-{index}")).encode())
    tokens = 0

    async def worker() -> None:
        nonlocal tokens
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            while not queue.empty():
                body = queue.get_nowait()
                data = await _post_json(reader, writer, host_port, body)
                tokens += len(data["output_ids"])
        finally:
            writer.close()

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(requests)))))
    return Pass("direct", len(requests), tokens, time.perf_counter() - started)


def bench_serving_pass(args: argparse.Namespace, url: str) -> Optional[Pass]:
    """SGLang's own benchmark at the same concurrency and lengths; None when SGLang is missing."""
    python = args.sglang_python
    if subprocess.run([python, "-c", "import sglang"], capture_output=True).returncode != 0:
        print(f"bench_serving: {python} cannot import sglang; skipped", file=sys.stderr)
        return None
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.jsonl"
        cmd = [python, "-m", "sglang.bench_serving", "--backend", "sglang", "--base-url", url,
               "--tokenizer", args.model_path, "--dataset-name", "random",
               "--random-input-len", str(args.input_len), "--random-output-len", str(args.output_len),
               "--random-range-ratio", "1", "--num-prompts", str(args.num_prompts),
               "--max-concurrency", str(args.concurrency), "--seed", str(args.seed), "--output-file", str(out)]
        print("running:", shlex.join(cmd), file=sys.stderr)
        subprocess.run(cmd, check=True)
        record = json.loads(out.read_text().strip().splitlines()[-1])
    tokens = int(record.get("total_output_tokens", args.num_prompts * args.output_len))
    return Pass("bench_serving", int(record.get("completed", args.num_prompts)), tokens,
                tokens / float(record["output_throughput"]))


async def measure(args: argparse.Namespace, url: str, vocab_size: int) -> dict[str, Any]:
    requests = make_requests(args, vocab_size)
    warmup = requests[: min(len(requests), args.concurrency)]
    await direct_pass(url, warmup, args.concurrency)  # compile / cache warm-up, not measured
    passes: list[Pass] = []
    for _ in range(args.rounds):  # alternate, so a drift in server speed hits both clients
        passes.append(await direct_pass(url, requests, args.concurrency))
        passes.append(await spade_pass(url, requests, args.concurrency))
    expected = args.num_prompts * args.output_len
    short = [p for p in passes if p.output_tokens != expected]
    if short:
        raise SystemExit(f"{short[0].client}: {short[0].output_tokens} output tokens instead of {expected}: the "
                         "completions were cut short (the model's context limit?); lower --input-len/--output-len")
    best = {name: max((p for p in passes if p.client == name), key=lambda p: p.tokens_per_s)
            for name in ("direct", "spade")}
    if args.sglang_bench:
        bench = bench_serving_pass(args, url)
        if bench is not None:
            best["bench_serving"] = bench
    figures: dict[str, Any] = {name: {"tokens_per_s": round(p.tokens_per_s, 2), "output_tokens": p.output_tokens,
                                      "seconds": round(p.seconds, 3)} for name, p in best.items()}
    figures["spade_over_direct"] = round(best["spade"].tokens_per_s / best["direct"].tokens_per_s, 4)
    if "bench_serving" in best:
        figures["spade_over_bench_serving"] = round(best["spade"].tokens_per_s / best["bench_serving"].tokens_per_s, 4)
    figures["workload"] = {"concurrency": args.concurrency, "num_prompts": args.num_prompts,
                           "input_len": args.input_len, "output_len": args.output_len, "rounds": args.rounds}
    return figures


async def run(args: argparse.Namespace) -> dict[str, Any]:
    config = json.loads((Path(args.model_path) / "config.json").read_text())
    vocab_size = int(config.get("vocab_size") or config.get("text_config", {}).get("vocab_size"))
    async with served(args) as url:
        return await measure(args, url, vocab_size)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_server_args(parser)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--num-prompts", type=int, default=512)
    parser.add_argument("--input-len", type=int, default=2048)
    parser.add_argument("--output-len", type=int, default=2048)
    parser.add_argument("--max-token-id", type=int, default=0, help="draw prompt ids below this (default: vocab)")
    parser.add_argument("--rounds", type=int, default=1, help="direct/spade pass pairs; the best of each counts")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--sglang-bench", action="store_true", help="also run python -m sglang.bench_serving")
    parser.add_argument("--sglang-python", default=os.environ.get("SPADE_SGLANG_PYTHON") or sys.executable,
                        help="the interpreter that has SGLang (default: $SPADE_SGLANG_PYTHON or this one)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    figures = asyncio.run(run(args))
    print(f"workload: {figures['workload']}")
    for name in ("direct", "spade", "bench_serving"):
        if name in figures:
            f = figures[name]
            print(f"{name:>14}: {f['tokens_per_s']:10.1f} output tokens/s  ({f['output_tokens']} tokens in {f['seconds']} s)")
    print(f"spade / direct        = {figures['spade_over_direct']:.3f}")
    if "spade_over_bench_serving" in figures:
        print(f"spade / bench_serving = {figures['spade_over_bench_serving']:.3f}  (target >= 0.95)")
    if args.json:
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
