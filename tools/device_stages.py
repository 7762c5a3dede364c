"""The stages of ``tools/device_check.py``: each one measures one thing and returns a verdict with
its figures. Every stage runs in a process of its own (``python tools/device_stages.py run NAME
--device cuda|cpu``), so a crash, a hang or memory left behind cannot spoil the next one; its
last stdout line is ``DEVICE_CHECK_RESULT {json}``.

The same code runs on both devices; only the shapes differ (``Shapes.for_device``): full sizes on
a GPU, tiny ones on the CPU so that the CPU test walks every stage in seconds. Where a figure only
means something on a GPU (CUDA-IPC, time-slicing between two processes' contexts), the CPU run
still goes through the stage's processes and checks, then reports ``skipped`` with the reason.

Two helper processes live here as well: ``_ipc_receiver`` (opens a serialized bucket in another
process) and ``_spinner`` (keeps a one-block kernel resident on the GPU).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ElementTree
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

REPO = Path(__file__).resolve().parent.parent
TOOLS = REPO / "tools"
for _path in (str(REPO), str(TOOLS)):
    if _path not in sys.path:  # run as `python tools/device_stages.py` from a checkout
        sys.path.insert(0, _path)

RESULT_MARKER = "DEVICE_CHECK_RESULT "
PRIOR_ENV = "DEVICE_CHECK_PRIOR"  # a JSON file of the figures of the stages already run
GIB = 2**30
MIB = 2**20

# GPU test files and the tests among them that need SGLang or Transformer Engine (absent there)
GPU_TEST_DESELECT = "not real_sglang and not spade_train and not True and not packed_and_padded and not bf16_te"
QWEN3_1_7B = dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", vocab_size=151936, hidden_size=2048,
                  intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                  head_dim=128, max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1e6,
                  tie_word_embeddings=True, hidden_act="silu", attention_bias=False)
QWEN3_0_6B = dict(QWEN3_1_7B, hidden_size=1024, intermediate_size=3072)
TINY = dict(QWEN3_1_7B, vocab_size=200, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096)


@dataclass(frozen=True)
class Shapes:
    """Sizes of everything a stage builds; ``for_device`` picks the full or the tiny set."""

    matmul_n: int
    copy_bytes: int
    ipc_bucket_bytes: int
    ipc_tensors: int
    slice_matmul_n: int
    slice_iters: int
    parity_config: dict
    parity_lengths: tuple[int, ...]
    offload_config: dict
    offload_seq: int
    engine_config: dict
    engine_prompt: int
    engine_new_tokens: int
    engine_batches: tuple[int, ...]
    prefix_rows: int
    prefix_tokens: int
    prefix_tail: int
    prefix_new_tokens: int
    train_config: Optional[dict]  # None: tools/gpu_mfu.py's Qwen3-4B shape (read by the stage that uses it)
    train_seq: int
    train_seqs: int
    train_micro_batch_tokens: int
    train_timed_steps: int

    @classmethod
    def for_device(cls, device: str) -> "Shapes":
        if device == "cuda":
            return cls(
                matmul_n=8192, copy_bytes=2 * GIB, ipc_bucket_bytes=512 * MIB, ipc_tensors=8,
                slice_matmul_n=8192, slice_iters=60,
                parity_config=dict(QWEN3_0_6B, num_hidden_layers=8), parity_lengths=(512, 1024, 2048),
                offload_config=QWEN3_1_7B, offload_seq=512,
                engine_config=QWEN3_0_6B, engine_prompt=256, engine_new_tokens=128, engine_batches=(8, 32),
                prefix_rows=16, prefix_tokens=1400, prefix_tail=32, prefix_new_tokens=64,
                train_config=None, train_seq=4096, train_seqs=8,
                train_micro_batch_tokens=4096, train_timed_steps=2)
        return cls(
            matmul_n=256, copy_bytes=16 * MIB, ipc_bucket_bytes=4 * MIB, ipc_tensors=4,
            slice_matmul_n=128, slice_iters=5,
            parity_config=TINY, parity_lengths=(9, 17, 30),
            offload_config=TINY, offload_seq=16,
            engine_config=TINY, engine_prompt=8, engine_new_tokens=4, engine_batches=(8, 32),
            prefix_rows=16, prefix_tokens=20, prefix_tail=4, prefix_new_tokens=4,
            train_config=TINY, train_seq=32, train_seqs=4, train_micro_batch_tokens=64, train_timed_steps=1)


@dataclass
class StageResult:
    verdict: str  # "pass", "fail" or "skipped"
    figures: dict[str, Any] = field(default_factory=dict)
    reason: str = ""


# ------------------------------------------------------------------------------------------ helpers


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def _timed(fn: Callable[[], Any], device: str, iters: int, warmup: int = 1) -> float:
    """Mean seconds of one ``fn()`` over ``iters`` calls after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    _sync(device)
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    _sync(device)
    return (time.perf_counter() - start) / iters


def _allocated(device: str) -> Optional[int]:
    import torch

    if device != "cuda":
        return None
    torch.cuda.synchronize()
    return torch.cuda.memory_allocated()


@dataclass(frozen=True)
class DeviceMemory:
    """One reading of the device's memory: what this process's tensors hold (allocated), what its
    caching allocator keeps (reserved), and what the driver has free for any process (a colocated
    server gets only the last)."""

    allocated: int
    reserved: int
    driver_free: int

    @classmethod
    def read(cls, device: str) -> Optional["DeviceMemory"]:
        import torch

        if device != "cuda":
            return None
        torch.cuda.synchronize()
        free, _ = torch.cuda.mem_get_info()
        return cls(torch.cuda.memory_allocated(), torch.cuda.memory_reserved(), free)

    def figures(self, when: str) -> dict[str, Optional[float]]:
        return {f"allocated_gib_{when}": _gib(self.allocated), f"reserved_gib_{when}": _gib(self.reserved),
                f"driver_free_gib_{when}": _gib(self.driver_free)}


def returned_to_driver(before: DeviceMemory, after: DeviceMemory, moved_bytes: int) -> float:
    """The share of ``moved_bytes`` that the driver sees free again (what another process can use)."""
    return round((after.driver_free - before.driver_free) / max(moved_bytes, 1), 4)


def _gib(nbytes: Optional[float]) -> Optional[float]:
    return None if nbytes is None else round(nbytes / GIB, 3)


def _prior(stage: str) -> dict[str, Any]:
    """Figures of an earlier stage of this run (empty if it did not run)."""
    path = os.environ.get(PRIOR_ENV)
    if not path or not Path(path).exists():
        return {}
    return json.loads(Path(path).read_text()).get(stage, {})


def digest(tensor) -> tuple[int, int]:
    """Order-sensitive checksum of a tensor's bytes, computed where it lives: the sum and a
    position-weighted sum of its 32-bit words (int64 arithmetic, wrapping, so exact)."""
    import torch

    flat = tensor.detach().reshape(-1)
    data = flat.view(torch.uint8) if flat.dtype != torch.uint8 else flat
    words = data.view(torch.int32) if data.numel() % 4 == 0 else data
    total = weighted = 0
    chunk = 1 << 26
    for start in range(0, words.numel(), chunk):
        part = words[start:start + chunk].to(torch.int64)
        weights = torch.arange(start, start + part.numel(), device=part.device, dtype=torch.int64) % 65521 + 1
        total += int(part.sum())
        weighted += int((part * weights).sum())
    return total & (2**64 - 1), weighted & (2**64 - 1)


def torch_api_chains() -> list[str]:
    """Every ``torch.a.b`` chain spade and megatron_patches name (code and docstrings alike),
    with ``from torch.x import y`` read as ``torch.x.y``."""
    import re

    chain = re.compile(r"\btorch(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
    from_import = re.compile(r"^\s*from (torch(?:\.\w+)*) import \(?([\w, ]+)", re.MULTILINE)
    found: set[str] = set()
    for folder in ("spade", "megatron_patches"):
        for path in (REPO / folder).rglob("*.py"):
            text = path.read_text()
            found.update(chain.findall(text))
            for module, names in from_import.findall(text):
                found.update(f"{module}.{name.strip()}" for name in names.split(",") if name.strip())
    return sorted(found)


def unresolved_torch_api(chains: list[str]) -> list[str]:
    """The chains this torch does not have (attributes, or submodules that do not import)."""
    import importlib

    missing = []
    for dotted in chains:
        parts = dotted.split(".")
        obj: Any = importlib.import_module("torch")
        for index, part in enumerate(parts[1:], 1):
            if hasattr(obj, part):
                obj = getattr(obj, part)
                continue
            try:
                obj = importlib.import_module(".".join(parts[: index + 1]))
            except ImportError:
                missing.append(dotted)
                break
    return missing


# Imported somewhere on the GPU path or by a GPU test, absent from the machine on purpose: the tests
# that need them skip themselves there, and spade imports them only when a setting asks for them.
ABSENT_BY_DESIGN = {
    "sglang": "SGLang's tests skip without it (sglang-kernel alone is 373 MB)",
    "sgl_kernel": "part of SGLang",
    "transformer_engine": "179 MB, its torch part source-only: the local spec runs instead",
    "flash_attn": "source build", "apex": "source build",
    "multistorageclient": "megatron-core's optional object-store checkpoints, never set by spade",
}
GPU_PATH_SOURCES = ("spade/training", "spade/models", "spade/rollout", "spade/rl", "megatron_patches")


def imported_top_level_names(paths: list[Path]) -> dict[str, list[str]]:
    """Every absolute import in ``paths`` (at any depth: function-level imports too), by top-level
    name, with the files that import it."""
    import ast

    names: dict[str, set[str]] = {}
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                names.setdefault(module.split(".")[0], set()).add(str(path.relative_to(REPO)))
    return {name: sorted(files) for name, files in sorted(names.items())}


def unimportable_names() -> dict[str, list[str]]:
    """Third-party modules the GPU path and the GPU tests import that this Python cannot find
    (a package the machine lacks and nothing carried), less ``ABSENT_BY_DESIGN``."""
    import importlib.util

    files = [path for folder in GPU_PATH_SOURCES for path in sorted((REPO / folder).rglob("*.py"))]
    files += [REPO / name for name in (*gpu_test_files(), *OWN_STAGE_TEST_FILES)]
    search = [str(REPO), str(REPO / "tests")]
    sys.path[:0] = [entry for entry in search if entry not in sys.path]
    from support.paths import add_test_dirs  # tests/support: the test modules also live in tests/<package>/

    add_test_dirs()
    missing = {}
    for name, importers in imported_top_level_names(files).items():
        if name in sys.stdlib_module_names or name in ABSENT_BY_DESIGN or name == "__future__":
            continue
        if importlib.util.find_spec(name) is None:
            missing[name] = importers
    return missing


def _spade_modules() -> tuple[str, ...]:
    return ("spade.training", "spade.training.offload", "spade.models.builder", "spade.rollout.hf.engine",
            "spade.rollout.hf.prefix_attention", "spade.rollout.weight_buckets", "spade.rollout.sglang.weight_transport",
            "spade.rollout.sglang.runtime_versions", "megatron_patches")


# ------------------------------------------------------------------------------------------ stages


def stage_env(device: str, shapes: Shapes) -> StageResult:
    """Versions, the GPU, what is carried and what is absent; spade's GPU-path modules import."""
    import importlib
    import importlib.metadata as metadata
    import importlib.util
    import platform

    import torch

    figures: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                               "torch_cuda": torch.version.cuda, "device": device}
    versions = {}
    for dist in ("megatron-core", "transformers", "tokenizers", "huggingface-hub", "safetensors", "regex",
                 "numpy", "triton"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
    figures["packages"] = versions
    figures["carried_wheels"] = os.environ.get("DEVICE_CHECK_WHEELS", "")
    figures["absent"] = {name: importlib.util.find_spec(name) is None
                         for name in ("transformer_engine", "sglang", "apex", "flash_attn")}
    failures = {}
    for module in _spade_modules():
        try:
            importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001  (each failure is reported, not raised)
            failures[module] = f"{type(exc).__name__}: {exc}"
    if not failures:
        import megatron_patches

        try:
            megatron_patches.apply_all()  # checks the megatron-core version the patches are for
        except Exception as exc:  # noqa: BLE001
            failures["megatron_patches.apply_all"] = f"{type(exc).__name__}: {exc}"
    figures["import_failures"] = dict(failures)
    figures["missing_imports"] = unimportable_names()
    if figures["missing_imports"]:
        failures["missing packages"] = "; ".join(f"{name} (imported by {', '.join(files[:3])})"
                                                 for name, files in figures["missing_imports"].items())
    figures["imported_from"] = {name: getattr(sys.modules.get(name), "__file__", None)
                                for name in ("megatron.core", "transformers")}
    chains = torch_api_chains()
    figures["torch_api_checked"] = len(chains)
    figures["torch_api_missing"] = unresolved_torch_api(chains)
    if figures["torch_api_missing"]:
        failures["torch API"] = "this torch lacks " + ", ".join(figures["torch_api_missing"])
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        figures.update(gpu=props.name, capability=f"{props.major}.{props.minor}",
                       multiprocessors=props.multi_processor_count, memory_gib=_gib(props.total_memory),
                       nccl=".".join(map(str, torch.cuda.nccl.version())))
        try:
            smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.max.sm,power.limit",
                                  "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
            figures["nvidia_smi"] = smi.stdout.strip()
        except (OSError, subprocess.TimeoutExpired) as exc:
            figures["nvidia_smi"] = f"unavailable: {exc}"
    print(json.dumps(figures, indent=1), flush=True)
    if failures:
        return StageResult("fail", figures, "imports failed: " + "; ".join(f"{k}: {v}" for k, v in failures.items()))
    return StageResult("pass", figures)


def stage_matmul(device: str, shapes: Shapes) -> StageResult:
    """The MFU denominators: a measured bf16 matmul rate and copy bandwidths."""
    import torch

    n = shapes.matmul_n
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    seconds = _timed(lambda: torch.mm(a, b), device, iters=10, warmup=3)
    figures: dict[str, Any] = {"matmul_n": n, "bf16_matmul_tflops": round(2 * n**3 / seconds / 1e12, 2)}
    del a, b
    count = shapes.copy_bytes
    src = torch.empty(count, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    seconds = _timed(lambda: dst.copy_(src), device, iters=10, warmup=2)
    figures["copy_bytes"] = count
    figures["device_copy_gb_s"] = round(count / seconds / 1e9, 1)  # bytes copied (each read once, written once)
    if device == "cuda":
        host = torch.empty(count // 2, dtype=torch.uint8, pin_memory=True)
        half = src[: count // 2]
        figures["host_to_device_gb_s"] = round(count / 2 / _timed(lambda: half.copy_(host, non_blocking=True),
                                                                    device, iters=5) / 1e9, 1)
        figures["device_to_host_gb_s"] = round(count / 2 / _timed(lambda: host.copy_(half, non_blocking=True),
                                                                    device, iters=5) / 1e9, 1)
    return StageResult("pass", figures)


def stage_ipc(device: str, shapes: Shapes) -> StageResult:
    """A weight bucket packed by spade's own code, serialized for another process, opened there:
    checksums equal, the receiver's load rate, and the sender's memory back once it lets go."""
    import torch

    from spade.rollout.weight_buckets import pack_buckets, unpack_bucket
    from spade.rollout.sglang.weight_transport import serialize_named_tensors

    baseline = _allocated(device)
    reserved = torch.cuda.memory_reserved() if device == "cuda" else 0
    per_tensor = shapes.ipc_bucket_bytes // shapes.ipc_tensors // 2  # bf16 elements
    generator = torch.Generator(device=device).manual_seed(0)
    named = [(f"layers.{i}.weight", torch.randn(per_tensor, generator=generator, device=device,
                                                 dtype=torch.float32).to(torch.bfloat16))
             for i in range(shapes.ipc_tensors)]
    buckets = list(pack_buckets(iter(named), shapes.ipc_bucket_bytes, device=device))
    del named
    if len(buckets) != 1:
        return StageResult("fail", {"buckets": len(buckets)}, f"expected one bucket, packed {len(buckets)}")
    bucket = buckets.pop()
    views = unpack_bucket(bucket)
    expected = [list(digest(tensor)) for _, tensor in views]
    with tempfile.TemporaryDirectory() as tmp:
        payload, result = Path(tmp) / "payload.txt", Path(tmp) / "result.json"
        started = time.perf_counter()
        payload.write_text(serialize_named_tensors(views))
        serialize_s = time.perf_counter() - started
        _sync(device)
        child = subprocess.run([sys.executable, __file__, "_ipc_receiver", str(payload), str(result)],
                               capture_output=True, text=True, timeout=120)
        if child.returncode != 0:
            return StageResult("fail", {}, f"the receiving process failed: {child.stderr[-2000:]}")
        seen = json.loads(result.read_text())
    figures: dict[str, Any] = {
        "bucket_mib": bucket.nbytes / MIB, "tensors": len(views), "serialize_s": round(serialize_s, 4),
        "receiver_open_s": seen["open_s"], "receiver_copy_gb_s": seen["copy_gb_s"],
        "checksums_equal": seen["digests"] == expected, "transport": "cuda-ipc" if device == "cuda" else "shared-memory",
    }
    del views, bucket
    gc.collect()
    if device == "cuda":
        for _ in range(10):  # the receiver's release reaches the sender's reference counter
            torch.cuda.ipc_collect()
            torch.cuda.empty_cache()
            if _allocated(device) == baseline:
                break
            time.sleep(0.2)
        figures["sender_allocated_over_baseline_mib"] = (_allocated(device) - baseline) / MIB
        figures["sender_reserved_mib_after"] = torch.cuda.memory_reserved() / MIB
        figures["memory_returned"] = _allocated(device) == baseline and torch.cuda.memory_reserved() <= reserved
    if not figures["checksums_equal"]:
        return StageResult("fail", figures, "the receiver read other bytes than were sent")
    if device != "cuda":
        return StageResult("skipped", figures, "CUDA-IPC needs a CUDA GPU; on CPU the same pack / serialize / "
                                               "open-in-another-process path ran over shared-memory files "
                                               "(checksums equal)")
    if not figures["memory_returned"]:
        return StageResult("fail", figures, "the sender's memory did not come back after the receiver let go")
    return StageResult("pass", figures)


def _ipc_receiver(payload: str, result: str) -> None:
    import torch

    from spade.rollout.sglang.weight_transport import deserialize_named_tensors

    started = time.perf_counter()
    named = deserialize_named_tensors(Path(payload).read_text())
    open_s = time.perf_counter() - started
    device = named[0][1].device.type
    digests = [list(digest(tensor)) for _, tensor in named]
    nbytes = sum(t.numel() * t.element_size() for _, t in named)
    copies = [torch.empty_like(t) for _, t in named]
    _sync(device)
    started = time.perf_counter()
    for copy, (_, tensor) in zip(copies, named):
        copy.copy_(tensor)
    _sync(device)
    copy_s = time.perf_counter() - started
    Path(result).write_text(json.dumps({"open_s": round(open_s, 4), "copy_gb_s": round(nbytes / copy_s / 1e9, 1),
                                        "digests": digests}))
    del named, copies


def stage_timeslice(device: str, shapes: Shapes) -> StageResult:
    """Whether the GPU time-slices between processes: matmul time with and without another
    process keeping a one-block kernel resident (as a rank parked in an NCCL broadcast does)."""
    import torch

    n = shapes.slice_matmul_n
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)

    def measure() -> float:
        return statistics.median(_timed(lambda: torch.mm(a, b), device, iters=shapes.slice_iters, warmup=2)
                                 for _ in range(3))

    alone = measure()
    spinner = subprocess.Popen([sys.executable, __file__, "_spinner", device], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    try:
        ready = spinner.stdout.readline().strip()
        if ready != "SPINNING":
            return StageResult("fail", {}, f"the spinning process did not start (said {ready!r})")
        shared = measure()
    finally:
        spinner.stdin.close()  # the spinner stops when its stdin closes
        try:
            spinner.wait(timeout=30)
        except subprocess.TimeoutExpired:
            spinner.kill()
            spinner.wait()
    after = measure()
    figures = {"matmul_n": n, "alone_ms": round(alone * 1e3, 3), "with_spinner_ms": round(shared * 1e3, 3),
               "alone_again_ms": round(after * 1e3, 3), "slowdown": round(shared / alone, 3)}
    if device != "cuda":
        return StageResult("skipped", figures, "time-slicing is between two processes' contexts on one GPU: "
                                               "needs CUDA (the probe's two processes ran on CPU as a dry run)")
    return StageResult("pass", figures)


def _spinner(device: str) -> None:
    """Keep a one-block kernel resident until stdin closes (a busy loop on the CPU dry run)."""
    import threading

    import torch

    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    if device == "cuda":
        torch.cuda._sleep(1000)  # loads the kernel before the parent starts timing
        torch.cuda.synchronize()
    print("SPINNING", flush=True)
    while not stop.is_set():
        if device == "cuda":
            torch.cuda._sleep(50_000_000)  # one thread, one block, ~25 ms of clock spinning
            torch.cuda.synchronize()
        else:
            deadline = time.perf_counter() + 0.01
            while time.perf_counter() < deadline:
                pass


def _random_hf(config: dict, device: str, dtype, *, std_scale: float = 1.0):
    """A transformers Qwen3 with random weights far from flat (peaked next-token distributions)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    fields = {k: v for k, v in config.items() if k not in ("architectures", "model_type")}
    torch.manual_seed(0)
    with torch.device(device):  # initialised where it will run: seconds saved on a 0.6B model
        model = Qwen3ForCausalLM(Qwen3Config(attn_implementation="sdpa", **fields)).eval()
    std = std_scale * 1.5 / config["hidden_size"] ** 0.5
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 1:
                param.uniform_(0.5, 1.5)
            else:
                param.normal_(0.0, std)
    return model.to(device=device, dtype=dtype)


def _samples(lengths, vocab: int, *, seed: int = 0, logprobs: bool = False):
    import torch

    from spade.training import TrainSample

    generator = torch.Generator().manual_seed(seed)
    samples = []
    for length in lengths:
        ids = torch.randint(0, vocab, (length,), generator=generator)
        mask = torch.ones(length - 1)
        mask[: length // 4] = 0  # a prompt
        extra = {"old_logprobs": -torch.rand(length - 1, generator=generator) * 4} if logprobs else {}
        samples.append(TrainSample(ids, mask, float(torch.randn((), generator=generator)), **extra))
    return samples


# The core attention a user's run gets without Transformer Engine (the trainer's default,
# spade.train_config's model.core_attention), not megatron-core's unfused one.
CORE_ATTENTION = "sdpa"


def _megatron(config: dict, dtype, *, hf_state=None, recompute: str = "none", distributed: bool = False):
    """A one-process Megatron model (local spec, ``CORE_ATTENTION``) and its optimizer."""
    from spade.models import ParallelLayout, read_model_spec
    from spade.models.builder import BuildOptions
    from spade.training import build_model, init_parallel

    spec = read_model_spec(config)
    init_parallel(ParallelLayout(), seed=0)
    options = BuildOptions(params_dtype=dtype, use_transformer_engine=False, recompute=recompute,
                           core_attention=CORE_ATTENTION)
    model = build_model(spec, ParallelLayout(), options=options, hf_state=hf_state,
                        use_distributed_optimizer=distributed)
    return model, spec


def _optimizer(model, distributed: bool):
    import torch

    from spade.training import OptimizerSettings, build_optimizer

    bf16 = next(model.chunks[0].parameters()).dtype == torch.bfloat16
    return build_optimizer(model.chunks, OptimizerSettings(lr=1e-6, use_distributed_optimizer=distributed, bf16=bf16))


def stage_parity(device: str, shapes: Shapes) -> StageResult:
    """Megatron bf16 (local spec) log-probs against transformers fp32, beside transformers' own
    bf16 error on the same tokens."""
    import torch

    from spade.models.transformers_state import from_transformers_state
    from spade.rl.logprobs import logprobs_from_logits
    from spade.training import compute_logprobs, make_micro_batches

    torch.backends.cuda.matmul.allow_tf32 = False
    config = shapes.parity_config
    samples = _samples(shapes.parity_lengths, config["vocab_size"], seed=1)
    reference = _random_hf(config, device, torch.float32)

    def hf_logprobs(model) -> list:
        out = []
        with torch.no_grad():
            for sample in samples:
                ids = sample.token_ids.to(device).unsqueeze(0)
                out.append(logprobs_from_logits(model(ids).logits[0, :-1].float(), ids[0, 1:]).cpu())
        return out

    fp32 = hf_logprobs(reference)
    state = {k: v.detach().cpu().clone() for k, v in reference.state_dict().items()}
    bf16 = hf_logprobs(reference.to(torch.bfloat16))
    del reference
    gc.collect()
    from spade.models import read_model_spec

    hf_state = from_transformers_state(state, read_model_spec(config))
    model, _ = _megatron(config, torch.bfloat16, hf_state=hf_state)
    ours = compute_logprobs(model.chunks, make_micro_batches(samples, max(shapes.parity_lengths), packed=False))

    def errors(got: list) -> tuple[float, float]:
        diffs = torch.cat([(g.float() - r).abs() for g, r in zip(got, fp32)])
        return float(diffs.mean()), float(diffs.max())

    megatron_mean, megatron_max = errors(ours)
    hf_mean, hf_max = errors(bf16)
    figures = {"layers": config["num_hidden_layers"], "hidden": config["hidden_size"],
               "tokens": sum(shapes.parity_lengths), "mean_logprob_fp32": float(torch.cat(fp32).mean()),
               "megatron_bf16_mean_abs": round(megatron_mean, 5), "megatron_bf16_max_abs": round(megatron_max, 4),
               "transformers_bf16_mean_abs": round(hf_mean, 5), "transformers_bf16_max_abs": round(hf_max, 4),
               "ratio_mean": round(megatron_mean / max(hf_mean, 1e-9), 3)}
    if megatron_mean > 3 * hf_mean + 1e-3:
        return StageResult("fail", figures, "Megatron bf16 is more than 3x further from fp32 than transformers bf16")
    return StageResult("pass", figures)


def training_tensors(chunks, optimizer) -> Iterator:
    """Every tensor of the training state (an enumeration independent of the offloader's)."""
    from torch import Tensor

    for chunk in chunks:
        for name in ("buffers", "expert_parallel_buffers"):
            for buffer in vars(chunk).get(name) or []:
                yield getattr(buffer, "param_data", None)
                yield getattr(buffer, "grad_data", None)
        for param in chunk.parameters():
            yield param
            yield getattr(param, "main_grad", None)
    for inner in getattr(optimizer, "chained_optimizers", None) or [optimizer]:
        torch_optimizer = getattr(inner, "optimizer", None)
        if torch_optimizer is None:
            continue
        for group in torch_optimizer.param_groups:
            yield from group["params"]
        for state in torch_optimizer.state.values():
            yield from (value for value in state.values() if isinstance(value, Tensor))


def storage_digests(chunks, optimizer, device: str) -> list[tuple[int, int, int]]:
    """(bytes, checksum) of each distinct device storage of the training state, in the order they
    are first met (an onload gives storages new addresses, so the order is the key)."""
    import torch

    seen: set[int] = set()
    out = []
    for tensor in training_tensors(chunks, optimizer):
        if tensor is None or tensor.device.type != device:
            continue
        storage = tensor.untyped_storage()
        if storage.nbytes() and storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            whole = torch.empty(0, dtype=torch.uint8, device=tensor.device).set_(storage, 0, (storage.nbytes(),), (1,))
            out.append((storage.nbytes(), *digest(whole)))
    return out


def stage_offload(device: str, shapes: Shapes) -> StageResult:
    """Training-state offload and onload of a 1.7B-shaped model after a real step: bytes moved,
    seconds, device memory returned as the driver sees it (``mem_get_info``: what a colocated
    server can take) beside this process's allocated and reserved bytes, and an exact restore
    (checksums of every storage)."""
    import torch

    from spade.training import make_micro_batches, train_step
    from spade.training.offload import TrainingOffloader

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    config = shapes.offload_config
    model, _ = _megatron(config, dtype, distributed=True)
    optimizer, scheduler = _optimizer(model, distributed=True)
    batches = make_micro_batches(_samples([shapes.offload_seq] * 2, config["vocab_size"], logprobs=True),
                                 2 * shapes.offload_seq, packed=False)
    train_step(model.chunks, optimizer, scheduler, batches)  # creates the Adam state
    _sync(device)
    before = storage_digests(model.chunks, optimizer, device)
    offloader = TrainingOffloader(model.chunks, optimizer, move_on_host=device == "cpu")
    figures: dict[str, Any] = {"layers": config["num_hidden_layers"], "hidden": config["hidden_size"],
                               "storages": len(before)}
    memory_before = DeviceMemory.read(device)
    for cycle in (1, 2):  # the first cycle pins the host memory, the second reuses it
        out = offloader.offload()
        memory_offloaded = DeviceMemory.read(device)
        back = offloader.onload()
        figures[f"offload_s_{cycle}"] = round(out.seconds, 3)
        figures[f"onload_s_{cycle}"] = round(back.seconds, 3)
        if cycle == 1:
            figures["moved_gib"] = _gib(out.moved_bytes)
            figures["by_kind_gib"] = {kind: _gib(n) for kind, n in out.bytes_by_kind.items()}
            if memory_before is not None and memory_offloaded is not None:
                figures.update(memory_before.figures("before"), **memory_offloaded.figures("offloaded"))
                figures["allocated_returned_fraction"] = round(
                    (memory_before.allocated - memory_offloaded.allocated) / max(out.moved_bytes, 1), 4)
                figures["returned_fraction"] = returned_to_driver(memory_before, memory_offloaded, out.moved_bytes)
    figures["offload_gb_s"] = round(out.moved_bytes / max(out.seconds, 1e-9) / 1e9, 1)
    figures["onload_gb_s"] = round(back.moved_bytes / max(back.seconds, 1e-9) / 1e9, 1)
    after = storage_digests(model.chunks, optimizer, device)
    figures["exact_restore"] = after == before
    memory_onloaded = DeviceMemory.read(device)
    if memory_onloaded is not None:
        figures.update(memory_onloaded.figures("onloaded"))
    metrics = train_step(model.chunks, optimizer, scheduler, batches)
    figures["step_after_onload_loss"] = metrics.loss
    if not figures["exact_restore"]:
        return StageResult("fail", figures, "some storage holds other bytes after offload + onload")
    if out.moved_bytes == 0:
        return StageResult("fail", figures, "nothing was moved")
    if device == "cuda" and figures["returned_fraction"] < 0.9:
        return StageResult("fail", figures, "the driver saw less than 90% of the moved bytes come free "
                                            "(what a colocated server could take)")
    return StageResult("pass", figures)


def stage_hf_engine(device: str, shapes: Shapes) -> StageResult:
    """spade's transformers engine: tokens/s at two batch sizes, and a batch whose rows share a
    long prompt prefix against the same shapes without one."""
    import torch

    from spade.rollout import GenerationRequest, HFEngine, SamplingParams

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    config = shapes.engine_config
    vocab = config["vocab_size"]
    generator = torch.Generator().manual_seed(0)
    engine = HFEngine(_random_hf(config, device, dtype, std_scale=0.3), device=device, dtype=dtype,
                      max_batch_size=max(max(shapes.engine_batches), shapes.prefix_rows), eos_token_ids=())

    def run(prompts: list[list[int]], new_tokens: int) -> tuple[float, int]:
        requests = [GenerationRequest(p, SamplingParams(temperature=1.0, max_new_tokens=new_tokens, seed=i))
                    for i, p in enumerate(prompts)]

        async def main():
            return await asyncio.gather(*(engine.generate(r) for r in requests))

        _sync(device)
        started = time.perf_counter()
        results = asyncio.run(main())
        _sync(device)
        return time.perf_counter() - started, sum(len(r.token_ids) for r in results)

    def prompts(rows: int, length: int) -> list[list[int]]:
        return torch.randint(0, vocab, (rows, length), generator=generator).tolist()

    figures: dict[str, Any] = {"layers": config["num_hidden_layers"], "hidden": config["hidden_size"],
                               "prefix_attention": engine.prefix_attention}
    try:
        run(prompts(2, shapes.engine_prompt), 2)  # warm-up
        for batch in shapes.engine_batches:
            seconds, tokens = run(prompts(batch, shapes.engine_prompt), shapes.engine_new_tokens)
            figures[f"batch{batch}_tokens_per_s"] = round(tokens / seconds, 1)
            figures[f"batch{batch}_s"] = round(seconds, 3)
        prefix = prompts(1, shapes.prefix_tokens)[0]
        shared = [prefix + tail for tail in prompts(shapes.prefix_rows, shapes.prefix_tail)]
        before = engine.stats.shared_prefix_tokens
        seconds, tokens = run(shared, shapes.prefix_new_tokens)
        figures["shared_prefix_tokens_per_s"] = round(tokens / seconds, 1)
        figures["shared_prefix_s"] = round(seconds, 3)
        figures["shared_prefix_tokens_saved"] = engine.stats.shared_prefix_tokens - before
        seconds, tokens = run(prompts(shapes.prefix_rows, shapes.prefix_tokens + shapes.prefix_tail),
                              shapes.prefix_new_tokens)
        figures["unshared_same_shape_tokens_per_s"] = round(tokens / seconds, 1)
        figures["unshared_same_shape_s"] = round(seconds, 3)
        figures["shared_prefix_speedup"] = round(figures["unshared_same_shape_s"] / figures["shared_prefix_s"], 3)
        figures["largest_batch_rows"] = max(engine.stats.batch_sizes)
    finally:
        engine.close()
    if figures["shared_prefix_tokens_saved"] <= 0:
        return StageResult("fail", figures, "the rows' common prefix was not shared")
    return StageResult("pass", figures)


def stage_train_step(device: str, shapes: Shapes) -> StageResult:
    """A full GRPO train step (forward, chunked log-probs, policy loss, backward, Adam) of a
    Qwen3-4B-shaped random-weight model, local spec, selective recompute. FLOPs are counted as
    tools/gpu_mfu.py counts them (recompute not credited)."""
    import torch

    import gpu_mfu
    from spade.training import make_micro_batches, train_step

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    config = shapes.train_config
    sizing: dict[str, Any] = {}
    if config is None:  # the GPU: as many Qwen3-4B layers as the device's memory holds
        config, sizing = train_config_for(torch.cuda.get_device_properties(0).total_memory, shapes)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    built = time.perf_counter()
    model, _ = _megatron(config, dtype, recompute="selective", distributed=True)
    optimizer, scheduler = _optimizer(model, distributed=True)
    samples = _samples([shapes.train_seq] * shapes.train_seqs, config["vocab_size"], logprobs=True)
    batches = make_micro_batches(samples, shapes.train_micro_batch_tokens, packed=False)
    figures: dict[str, Any] = {"layers": config["num_hidden_layers"], "hidden": config["hidden_size"],
                               "seq": shapes.train_seq, "seqs": shapes.train_seqs, "micro_batches": len(batches),
                               "recompute": "selective", "spec": "local", "core_attention": CORE_ATTENTION,
                               "dtype": str(dtype).split(".")[-1], "build_s": round(time.perf_counter() - built, 1),
                               **sizing}
    figures.update(_memory_estimate(config, shapes))
    times = []
    for step in range(1 + shapes.train_timed_steps):
        _sync(device)
        started = time.perf_counter()
        metrics = train_step(model.chunks, optimizer, scheduler, batches)
        _sync(device)
        seconds = time.perf_counter() - started
        print(f"step {step} ({'warm-up' if step == 0 else 'timed'}): {seconds:.3f} s, loss {metrics.loss:.4f}",
              flush=True)
        if step:
            times.append(seconds)
    tokens = shapes.train_seq * shapes.train_seqs
    step_s = statistics.median(times)
    achieved = gpu_mfu.flops_per_token(config, shapes.train_seq) * tokens / step_s / 1e12
    figures.update(step_s=round(step_s, 3), tokens_per_s=round(tokens / step_s), achieved_tflops=round(achieved, 2),
                   loss=metrics.loss, skipped_update=metrics.skipped)
    if device == "cuda":
        name = torch.cuda.get_device_name()
        peak = gpu_mfu.peak_tflops(name)
        measured = _prior("matmul").get("bf16_matmul_tflops")
        figures.update(gpu=name, datasheet_tflops=peak, mfu_datasheet=None if peak is None else round(achieved / peak, 4),
                       measured_matmul_tflops=measured,
                       mfu_measured_matmul=None if not measured else round(achieved / measured, 4),
                       peak_memory_gib=_gib(torch.cuda.max_memory_allocated()))
    if metrics.skipped or not metrics.loss == metrics.loss:
        return StageResult("fail", figures, "the optimizer skipped the update or the loss is NaN")
    return StageResult("pass", figures)


def _step_estimate(config: dict, shapes: Shapes):
    from spade.models import ParallelLayout, read_model_spec
    from spade.training.memory_plan import MicroBatchShape, RecomputeSettings, estimate_step_memory

    rows = max(1, shapes.train_micro_batch_tokens // shapes.train_seq)
    return estimate_step_memory(read_model_spec(config), ParallelLayout(), MicroBatchShape(rows, shapes.train_seq),
                                RecomputeSettings("selective"), distributed_optimizer=True,
                                local_attention=CORE_ATTENTION == "unfused")


def _memory_estimate(config: dict, shapes: Shapes) -> dict[str, Any]:
    """spade.training.memory_plan's step estimate for this shape, to set beside the measured
    peak (the estimate is what refuses settings before a run; the GPU run checks it)."""
    try:
        return _step_estimate(config, shapes).to_dict()
    except Exception as exc:  # noqa: BLE001  (a figure missing, not a failed stage)
        return {"estimate_gib": f"unavailable: {type(exc).__name__}: {exc}"}


TRAIN_MEMORY_FRACTION = 0.8  # of the device's memory the sized train step may plan to use


def train_config_for(device_bytes: int, shapes: Shapes) -> tuple[dict, dict[str, Any]]:
    """The Qwen3-4B shape (tools/gpu_mfu.py) with as many of its 36 layers as fit in
    ``TRAIN_MEMORY_FRACTION`` of ``device_bytes`` by spade's own estimate: all of them on a
    141 GB H200; on an 80 GB H100, whose memory one unsharded 4B model's weights, gradients and
    Adam state (67 GiB) nearly fill, fewer. Per-layer figures (tokens/s per layer, MFU) keep their
    meaning; the figures say how many layers ran and why."""
    import gpu_mfu

    full = dict(gpu_mfu.QWEN3_4B)
    budget = TRAIN_MEMORY_FRACTION * device_bytes
    for layers in range(full["num_hidden_layers"], 0, -2):
        config = dict(full, num_hidden_layers=layers)
        if _step_estimate(config, shapes).total <= budget:
            break
    return config, {"full_depth_layers": full["num_hidden_layers"], "device_memory_gib": _gib(device_bytes),
                    "sized_to_gib": _gib(budget)}


OWN_STAGE_TEST_FILES = ("tests/test_gpu_routing_replay.py",)  # run by the routing_replay stage


def gpu_test_files() -> list[str]:
    """The test files with GPU-marked tests, less those a stage of their own runs."""
    return sorted(str(p.relative_to(REPO)) for p in (REPO / "tests").rglob("test_*.py")
                  if "mark.gpu" in p.read_text() and str(p.relative_to(REPO)) not in OWN_STAGE_TEST_FILES)


def stage_gpu_tests(device: str, shapes: Shapes) -> StageResult:
    """The project's GPU-marked tests that need neither SGLang nor Transformer Engine."""
    files = gpu_test_files()
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "junit.xml"
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", "-k",
                   GPU_TEST_DESELECT, "-rfEs", f"--junitxml={report}", *files]
        print(" ".join(command), flush=True)
        child = subprocess.run(command, cwd=REPO, text=True)
        if not report.exists():
            return StageResult("fail", {"exit_status": child.returncode}, "pytest wrote no report (see its output)")
        suite = ElementTree.parse(report).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        counts = {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}
        failed = [case.get("classname", "") + "::" + case.get("name", "") for case in suite.iter("testcase")
                  if case.find("failure") is not None or case.find("error") is not None]
    figures = {"files": files, **counts, "passed": counts["tests"] - counts["failures"] - counts["errors"]
               - counts["skipped"], "failed": failed, "deselect": GPU_TEST_DESELECT}
    if counts["failures"] or counts["errors"] or child.returncode not in (0, 5):
        return StageResult("fail", figures, f"{len(failed)} failed: {', '.join(failed)[:1500]}")
    if counts["tests"] == 0:
        return StageResult("fail", figures, "no GPU test was selected")
    if device != "cuda":
        return StageResult("skipped", figures, f"the {counts['tests']} selected GPU tests need CUDA "
                                               "(collected and skipped on CPU)")
    return StageResult("pass", figures)


def stage_routing_replay(device: str, shapes: Shapes) -> StageResult:
    """Rollout routing replay (R3, issue 27) on the device: tests/test_gpu_routing_replay.py with the
    local spec (no Transformer Engine here): Megatron's routers replay the experts transformers'
    routers chose, and the log-prob mismatch with perturbed trainer weights drops."""
    with tempfile.TemporaryDirectory() as tmp:
        report, figures_path = Path(tmp) / "junit.xml", Path(tmp) / "figures.jsonl"
        command = [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "-m", "gpu", "-k", "not True",
                   "-rfEs", f"--junitxml={report}", "tests/test_gpu_routing_replay.py"]
        print(" ".join(command), flush=True)
        child = subprocess.run(command, cwd=REPO, text=True, env={**os.environ, "ROUTING_REPLAY_FIGURES": str(figures_path)})
        if not report.exists():
            return StageResult("fail", {"exit_status": child.returncode}, "pytest wrote no report (see its output)")
        suite = ElementTree.parse(report).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        figures: dict[str, Any] = {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}
        if figures_path.exists():
            for line in figures_path.read_text().splitlines():
                figures.update(json.loads(line))
    if figures["failures"] or figures["errors"] or child.returncode not in (0, 5):
        return StageResult("fail", figures, "the routing replay test failed (see its output)")
    if device != "cuda":
        return StageResult("skipped", figures, "the routing replay GPU test needs CUDA (collected and skipped on CPU)")
    if figures["tests"] == 0 or figures["skipped"]:
        return StageResult("fail", figures, "the routing replay test did not run")
    return StageResult("pass", figures)


STAGES: dict[str, Callable[[str, Shapes], StageResult]] = {
    "env": stage_env, "matmul": stage_matmul, "timeslice": stage_timeslice, "ipc": stage_ipc,
    "parity": stage_parity, "offload": stage_offload, "hf_engine": stage_hf_engine,
    "train_step": stage_train_step, "routing_replay": stage_routing_replay, "gpu_tests": stage_gpu_tests,
}


def run_stage(name: str, device: str) -> StageResult:
    try:
        return STAGES[name](device, Shapes.for_device(device))
    except Exception as exc:  # noqa: BLE001  (a stage's failure is its verdict)
        traceback.print_exc()
        return StageResult("fail", {}, f"{type(exc).__name__}: {exc}"[:2000])


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run")
    run.add_argument("stage", choices=sorted(STAGES))
    run.add_argument("--device", choices=("cuda", "cpu"), required=True)
    receiver = sub.add_parser("_ipc_receiver")
    receiver.add_argument("payload")
    receiver.add_argument("result")
    spinner = sub.add_parser("_spinner")
    spinner.add_argument("device")
    args = parser.parse_args(argv)
    if args.command == "_ipc_receiver":
        _ipc_receiver(args.payload, args.result)
    elif args.command == "_spinner":
        _spinner(args.device)
    else:
        result = run_stage(args.stage, args.device)
        print(RESULT_MARKER + json.dumps(asdict(result), default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
