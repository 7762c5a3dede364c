"""Benchmark names and suites: which benchmarks ``--suite`` runs, built with their settings."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from .benchmark import Benchmark
from .protocol import DEFAULT_PROTOCOL, RG_EPISODES, check_protocol, protocol_sampling
from .types import SamplingSettings

GAMES = ("aime25", "aime26", "gpqa_diamond", "lcb_v6", "rg_math", "rg_algorithmic", "rg_cognition", "rg_logic")
TOOL_USE = ("bfcl_multi_turn", "tau2", "acebench_agent")
SUITES: dict[str, tuple[str, ...]] = {
    "games": GAMES,
    "tool": TOOL_USE,
    "reasoning_gym": ("rg_math", "rg_algorithmic", "rg_cognition", "rg_logic"),
    "all": GAMES + TOOL_USE,
}


@dataclass(frozen=True)
class BenchmarkOptions:
    """What every benchmark may read: the evaluation protocol (``spade``, ``in_loop``, ``offline``:
    protocol.py), the data directory, sampling overrides (None: the protocol's setting),
    Reasoning-Gym episodes per task (None: the protocol's), LCB limits and date window."""

    protocol: str = DEFAULT_PROTOCOL

    data_dir: Optional[Path] = None
    n: Optional[int] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    max_new_tokens: Optional[int] = None
    rg_episodes: Optional[int] = None  # None: the protocol's (spade and in_loop 4, offline 8)
    rg_tasks: Optional[Mapping[str, Sequence[str]]] = None
    lcb_start_date: Optional[str] = None
    lcb_end_date: Optional[str] = None
    lcb_time_limit_s: float = 6.0
    lcb_memory_limit_mb: int = 4096
    sandbox: Any = None  # a SandboxConfig whose isolation and limits the LCB judge starts from
    tau2: Any = None  # a tau2_bench.Tau2Settings (None: its defaults)
    acebench: Any = None  # an acebench.AceBenchSettings (None: its defaults)

    def __post_init__(self) -> None:
        check_protocol(self.protocol)
        if self.rg_episodes is not None and self.rg_episodes < 1:
            raise ValueError(f"rg_episodes must be >= 1 or null, got {self.rg_episodes}")

    def sampling(self, default: SamplingSettings) -> SamplingSettings:
        return default.replace(n=self.n, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                               max_new_tokens=self.max_new_tokens)

    def protocol_sampling(self, family: str) -> SamplingSettings:
        """The protocol's sampling for ``family`` with this run's overrides on top."""
        return self.sampling(protocol_sampling(family, self.protocol))

    def episodes(self) -> int:
        return self.rg_episodes if self.rg_episodes is not None else RG_EPISODES[self.protocol]


def _rg(category: str) -> Callable[[BenchmarkOptions], Benchmark]:
    def build(options: BenchmarkOptions) -> Benchmark:
        from .reasoning_gym_bench import ReasoningGymHard

        tasks = (options.rg_tasks or {}).get(category)
        return ReasoningGymHard(category, episodes=options.episodes(), sampling=options.protocol_sampling("rg"),
                                tasks=tasks, protocol=options.protocol)
    return build


def _aime(year: int) -> Callable[[BenchmarkOptions], Benchmark]:
    def build(options: BenchmarkOptions) -> Benchmark:
        from .aime import AIME

        return AIME(year, data_dir=options.data_dir, sampling=options.protocol_sampling("aime"),
                    protocol=options.protocol)
    return build


def _gpqa(options: BenchmarkOptions) -> Benchmark:
    from .gpqa import GPQADiamond

    return GPQADiamond(data_dir=options.data_dir, sampling=options.protocol_sampling("gpqa"),
                       protocol=options.protocol)


def _lcb(options: BenchmarkOptions) -> Benchmark:
    from .livecodebench import LiveCodeBench

    return LiveCodeBench(data_dir=options.data_dir, sampling=options.protocol_sampling("lcb"),
                         protocol=options.protocol,
                         start_date=options.lcb_start_date, end_date=options.lcb_end_date,
                         time_limit_s=options.lcb_time_limit_s, memory_limit_mb=options.lcb_memory_limit_mb,
                         sandbox=options.sandbox)


def _bfcl(options: BenchmarkOptions) -> Benchmark:
    from .bfcl import BFCL_SAMPLING, BFCLMultiTurn

    return BFCLMultiTurn(sampling=options.sampling(BFCL_SAMPLING))


def _tau2(options: BenchmarkOptions) -> Benchmark:
    from .tau2_bench import TAU2_SAMPLING, Tau2Bench

    return Tau2Bench(options.tau2, sampling=options.sampling(TAU2_SAMPLING))


def _acebench(options: BenchmarkOptions) -> Benchmark:
    from .acebench import ACEBENCH_SAMPLING, AceBenchAgent

    return AceBenchAgent(options.acebench, sampling=options.sampling(ACEBENCH_SAMPLING))


BUILDERS: dict[str, Callable[[BenchmarkOptions], Benchmark]] = {
    "aime25": _aime(2025), "aime26": _aime(2026), "gpqa_diamond": _gpqa, "lcb_v6": _lcb,
    "rg_math": _rg("math"), "rg_algorithmic": _rg("algorithmic"), "rg_cognition": _rg("cognition"),
    "rg_logic": _rg("logic"), "bfcl_multi_turn": _bfcl, "tau2": _tau2,
    "acebench_agent": _acebench,
}


def benchmark_names(suite: Optional[str], benchmarks: Optional[Sequence[str]] = None) -> list[str]:
    if benchmarks:
        unknown = [b for b in benchmarks if b not in BUILDERS]
        if unknown:
            raise ValueError(f"unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(BUILDERS)}")
        return list(benchmarks)
    if suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}; known: {', '.join(SUITES)}")
    return list(SUITES[suite])


def build_benchmarks(names: Sequence[str], options: BenchmarkOptions = BenchmarkOptions()) -> list[Benchmark]:
    return [BUILDERS[name](options) for name in names]
