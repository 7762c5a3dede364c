"""``spade engine check``: does a rollout server work with spade on this machine?

    spade engine check --model-path models/Qwen3-4B-Instruct-2507 [--tp 1] [--device cuda]
    spade engine check --model-path DIR --url http://host:30000          # a server already running

Before a long run, this launches one SGLang server the way ``spade train`` does (same command
line, ``$SPADE_SGLANG_PYTHON`` or ``--server-command`` for the interpreter) and walks through what
training will ask of it, printing one line per check with its time:

1. start: the server becomes healthy (on failure: the last lines of its log);
2. generate: greedy completion of a fixed prompt, one log-prob per token, EOS ignored;
3. seeds: the same seeded request twice gives the same tokens (a warning only: SGLang honours
   seeds with ``--enable-deterministic-inference``);
4. weight update: the model's own tensors, read from ``--model-path`` onto ``--device`` and sent
   as IPC handles in buckets inside an update session (``update_weights_by_ipc``, the function
   training's weight sync runs), come back as the same greedy tokens under the new weight version
   (the seconds and GB/s of the transfer are printed);
5. release and resume: generation paused, weights and KV cache released (the GPU memory given
   back is printed), then resumed with a weight update: the same greedy tokens again.

Exit status 0 when every check passes, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

from .common import UsageError

PROMPT_LENGTH = 8
NEW_TOKENS = 16


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    engine = subparsers.add_parser("engine", help="rollout engine tools (SGLang)")
    commands = engine.add_subparsers(dest="engine_command", metavar="COMMAND", required=True)
    check = commands.add_parser(
        "check", help="launch an SGLang server as spade train does and exercise what training needs",
        description=__doc__.split("\n\n")[2].strip() if __doc__ else None)
    check.add_argument("--model-path", required=True, help="HF model directory (served, and sent as weights)")
    check.add_argument("--url", help="check a running server instead of launching one")
    check.add_argument("--tp", type=int, default=1, help="--tp-size of the launched server")
    check.add_argument("--ep", type=int, default=1, help="--ep-size of the launched server")
    check.add_argument("--mem-fraction", type=float, default=0.5, help="--mem-fraction-static")
    check.add_argument("--server-command", help='replaces "python -m sglang.launch_server" (a quoted command)')
    check.add_argument("--server-arg", action="append", default=[], metavar="FLAG=VALUE",
                       help="another SGLang flag (repeatable), e.g. --server-arg chunked_prefill_size=4096")
    check.add_argument("--device", choices=("cuda", "cpu"), default=None,
                       help="where the weights are sent from (default: cuda when available)")
    check.add_argument("--bucket-mb", type=int, default=512)
    check.add_argument("--start-timeout", type=float, default=900.0)
    check.set_defaults(handler=run_check)


class Report:
    """One line per check; remembers whether any failed."""

    def __init__(self) -> None:
        self.failed = False

    def line(self, name: str, ok: bool, detail: str, seconds: Optional[float] = None) -> None:
        status = "ok" if ok else "FAILED"
        timing = f" ({seconds:.2f} s)" if seconds is not None else ""
        print(f"{name:<15} {status:<7} {detail}{timing}", flush=True)
        self.failed |= not ok

    def warn(self, name: str, detail: str) -> None:
        print(f"{name:<15} {'warning':<7} {detail}", flush=True)


def _server_args(pairs: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not key or not sep:
            raise UsageError(f"--server-arg {pair!r}: expected FLAG=VALUE (true for a bare flag)")
        out[key.lstrip("-")] = True if value.lower() == "true" else value
    return out


def run_check(args: argparse.Namespace) -> int:
    model = Path(args.model_path)
    if not (model / "config.json").is_file():
        raise UsageError(f"--model-path {model}: not a Hugging Face model directory (no config.json)")
    return asyncio.run(_check(args, model))


async def _check(args: argparse.Namespace, model: Path) -> int:
    import torch

    from ..rollout.sglang.launcher import ServerLauncher, ServerStartError, free_port, sglang_argv
    from ..rollout.sglang.deployment import PYTHON_VARIABLE, SERVER_ENV_DEFAULTS

    report = Report()
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    launcher = None
    url = args.url
    if url is None:
        port = free_port()
        python = os.environ.get(PYTHON_VARIABLE) or sys.executable
        argv = sglang_argv(model, tp=args.tp, ep=args.ep, mem_fraction=args.mem_fraction, port=port, python=python,
                           extra_args=_server_args(args.server_arg),
                           command=shlex.split(args.server_command) if args.server_command else None)
        log_path = Path(tempfile.mkdtemp(prefix="spade-engine-check-")) / "server.log"
        print(f"server: {shlex.join(argv)}\nlog:    {log_path}", flush=True)
        launcher = ServerLauncher(argv, port=port, log_path=log_path, start_timeout_s=args.start_timeout,
                                  env=SERVER_ENV_DEFAULTS)
        started = time.perf_counter()
        try:
            await launcher.start()
        except ServerStartError as exc:
            report.line("start", False, str(exc))
            return 1
        report.line("start", True, f"healthy at {launcher.url}", time.perf_counter() - started)
        url = launcher.url
    try:
        await _exercise(url, model, device, args, report)
    finally:
        if launcher is not None:
            await launcher.close()
    print("all checks passed" if not report.failed else "some checks FAILED", flush=True)
    return 1 if report.failed else 0


async def _exercise(url: str, model: Path, device: Any, args: argparse.Namespace, report: Report) -> None:
    import json

    from ..rollout.engine import GenerationRequest, SamplingParams
    from ..rollout.sglang.engine import SGLangEngine
    from ..rollout.sglang.weight_transport import push_weights_by_ipc

    vocab = int(json.loads((model / "config.json").read_text()).get("vocab_size", 1000))
    prompt = tuple(range(3, 3 + PROMPT_LENGTH)) if vocab > 3 + PROMPT_LENGTH else (1,)
    greedy = GenerationRequest(prompt, SamplingParams(temperature=0.0, max_new_tokens=NEW_TOKENS, ignore_eos=True))
    seeded = GenerationRequest(prompt, SamplingParams(temperature=1.0, max_new_tokens=NEW_TOKENS, seed=1234,
                                                      ignore_eos=True))
    weights = _load_weights(model, device)
    nbytes = sum(t.numel() * t.element_size() for _, t in weights)
    timing: dict[str, float] = {}

    async def updater(engine: SGLangEngine, named: Any, version: int) -> None:
        started = time.perf_counter()
        # the one IPC path training takes too (update_weights_by_ipc); a running server says its TP size
        await push_weights_by_ipc(engine, named, version, tp=None if args.url else args.tp,
                                  max_bucket_bytes=args.bucket_mb << 20, device=device)
        timing["update"] = time.perf_counter() - started

    engine = SGLangEngine([url], weight_updater=updater, control_timeout_s=args.start_timeout)
    try:
        started = time.perf_counter()
        first = await engine.generate(greedy)
        ok = (len(first.token_ids) == NEW_TOKENS == len(first.logprobs)
              and all(math.isfinite(x) and x <= 1e-6 for x in first.logprobs))
        report.line("generate", ok, f"{len(first.token_ids)} tokens, finish {first.finish_reason}, "
                    f"mean log-prob {sum(first.logprobs) / max(len(first.logprobs), 1):.3f}",
                    time.perf_counter() - started)

        a, b = await engine.generate(seeded), await engine.generate(seeded)
        if a.token_ids == b.token_ids:
            report.line("seeds", True, "the same seed gave the same tokens")
        else:
            report.warn("seeds", "the same seed gave other tokens: start SGLang with "
                        "--enable-deterministic-inference for reproducible sampling")

        await engine.update_weights(weights, version=1)
        after = await engine.generate(greedy)
        report.line("weight update", after.token_ids == first.token_ids and after.weight_version == 1,
                    f"{len(weights)} tensors, {nbytes / 2**20:,.1f} MiB by IPC from {device}, "
                    f"{nbytes / timing['update'] / 2**30:.2f} GiB/s; same greedy tokens: "
                    f"{after.token_ids == first.token_ids}; weight version {after.weight_version}",
                    timing["update"])

        free_before = _free_gpu_bytes(device)
        started = time.perf_counter()
        await engine.release_memory()
        freed = _free_gpu_bytes(device) - free_before
        await engine.resume_and_update(weights, version=2)
        resumed = await engine.generate(greedy)
        memory = f"{freed / 2**30:.2f} GiB given back while released; " if device.type == "cuda" else ""
        report.line("release/resume", resumed.token_ids == first.token_ids and resumed.weight_version == 2,
                    f"{memory}same greedy tokens after resume + update: {resumed.token_ids == first.token_ids}",
                    time.perf_counter() - started)
    except Exception as exc:  # noqa: BLE001 - every failure is reported, none is fatal to the report
        report.line("error", False, f"{type(exc).__name__}: {exc}")
    finally:
        with contextlib.suppress(Exception):
            await engine.aclose()


def _load_weights(model: Path, device: Any) -> list:
    """The model's tensors under the names the trainer sends them by, on ``device``."""
    from ..models import read_model_spec
    from ..training.hf_directory import read_hf_tensors

    return [(name, tensor.to(device)) for name, tensor in read_hf_tensors(model, read_model_spec(model)).items()]


def _free_gpu_bytes(device: Any) -> int:
    import torch

    if device.type != "cuda":
        return 0
    return int(torch.cuda.mem_get_info(device)[0])
