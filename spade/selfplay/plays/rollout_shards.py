"""Rollout shards (``selfplay.rollout_shards``, issue 26): a step's plays spread over several
processes, each with its own sandbox service and engine, so rollouts scale with the nodes.

Which processes. With ``S`` shards in a world of ``W`` ranks, shard ``s`` is global rank
``s * W / S``: with torchrun's node-major ranks and one shard per node that is every node's local
rank 0. Global rank 0 is shard 0 and keeps everything with state: the orchestrator, the designer,
the memory, the delay buffer and the set's source. The other shards hold only a :class:`Player`
(stateless between plays: every seed derives from ``(run seed, step, env, index)``).

One round per :meth:`ShardedPlayer.play_all` call. Rank 0 splits the requests into ``S``
contiguous blocks of near-equal size (a group's plays stay next to each other), broadcasts the
round over the shards' gloo group, plays block 0 itself while the others play theirs, gathers every
shard's plays and merges them back in request order. Because a play's seeds do not depend on where
or beside what it runs, the merged plays equal the one-shard run's for an engine whose output
depends only on the request (a real engine's batching can change the last bits of its numbers).
After the step's last round rank 0 sends the end of the step (:meth:`ShardChannel.end_step`) and
the shards go back to waiting for the step's samples like every other rank.

What is not sharded: designer, hint and admission calls and evaluation stay on rank 0 and its
engine; partial rollouts and ``run.overlap`` are refused with shards (their stop signal and their
concurrent step would have to cross processes).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

import torch
import torch.distributed as dist

from ...collectives import CONTROL_TIMEOUT, in_thread
from ...config import ConfigError
from ...envs.protocol import Sandbox
from ...rollout.conversation import ChatFormat
from ...rollout.engine import RolloutEngine
from ..sources.fixed_pool import pool_load_sandbox
from .play_record import Play
from .player import Player, PlayRequest, end_of_turn_stop_ids
from ..settings import SelfPlaySettings

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

SETTING = "selfplay.rollout_shards"


@dataclass(frozen=True)
class ShardLayout:
    """Which ranks are shards in a world of ``world`` ranks."""

    shards: int
    world: int

    @classmethod
    def of(cls, shards: int, world: int) -> "ShardLayout":
        if shards < 1 or shards > world or world % shards:
            raise ConfigError(f"{SETTING}: {shards} shards in a world of {world} ranks; allowed: a divisor of "
                              f"the world size ({', '.join(str(d) for d in range(1, world + 1) if world % d == 0)})"
                              ", one shard per node being the usual choice")
        return cls(shards, world)

    @property
    def ranks(self) -> tuple[int, ...]:
        stride = self.world // self.shards
        return tuple(s * stride for s in range(self.shards))

    def shard_of(self, rank: int) -> Optional[int]:
        """The shard ``rank`` plays as, or None."""
        ranks = self.ranks
        return ranks.index(rank) if rank in ranks else None


def split_requests(requests: list[PlayRequest], shards: int) -> list[list[PlayRequest]]:
    """``shards`` contiguous blocks, sizes differing by at most one, the larger ones first."""
    size, extra = divmod(len(requests), shards)
    blocks, start = [], 0
    for s in range(shards):
        end = start + size + (1 if s < extra else 0)
        blocks.append(requests[start:end])
        start = end
    return blocks


@dataclass
class ShardRound:
    """What rank 0 sends the shards: the step and every shard's block of requests."""

    step: int
    blocks: list[list[PlayRequest]]


@dataclass
class ShardResult:
    """What a shard sends back for one round: its plays, in its block's order (dropped plays left
    out), the plays it dropped after every retry, its wall and CPU seconds, its engine's tokens
    for the block and the environments that timed out in it."""

    plays: list[Play]
    dropped: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    generated_tokens: int = 0  # by the shard's engine for the block
    timed_out: tuple[str, ...] = ()  # environments whose load, reset or step timed out in the block


class ShardChannel:
    """The shards' gloo group and the blocking messages over it (call them in a worker thread)."""

    def __init__(self, layout: ShardLayout, rank: int, group: Optional["ProcessGroup"]):
        self.layout = layout
        self.rank = rank
        self.group = group
        self.shard = layout.shard_of(rank)

    @classmethod
    def create(cls, layout: ShardLayout, rank: int) -> "ShardChannel":
        """Every rank of the world, at the same point (torch makes groups collectively)."""
        group = dist.new_group(ranks=list(layout.ranks), backend="gloo", timeout=CONTROL_TIMEOUT) \
            if layout.shards > 1 else None
        return cls(layout, rank, group)

    @property
    def shards(self) -> int:
        return self.layout.shards

    def send_round(self, round_: Optional[ShardRound]) -> None:
        """Rank 0: a round, or None for the end of the step."""
        dist.broadcast_object_list([round_], src=0, group=self.group)

    def receive_round(self) -> Optional[ShardRound]:
        box: list[Any] = [None]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def gather(self, result: ShardResult) -> Optional[list[ShardResult]]:
        """Every shard's result, in shard order, on rank 0 (None elsewhere)."""
        out: Optional[list[Any]] = [None] * self.shards if self.rank == 0 else None
        dist.gather_object(result, out, dst=0, group=self.group)
        return out

    def end_step(self) -> None:
        self.send_round(None)


@dataclass
class ShardMetrics:
    """Rank 0's account of the step's rounds (reset by :meth:`ShardedPlayer.step_metrics`)."""

    rounds: int = 0
    wait_seconds: float = 0.0  # rank 0 waiting for the other shards after its own block
    plays: list[int] = field(default_factory=list)  # per shard
    seconds: list[float] = field(default_factory=list)  # per shard, summed over the rounds
    cpu_seconds: list[float] = field(default_factory=list)
    remote_tokens: int = 0  # generated by the shards other than rank 0


class ShardedPlayer(Player):
    """Rank 0's player with shards: :meth:`play_all` plays its block and the other shards theirs."""

    def __init__(self, *args: Any, channel: ShardChannel, device: torch.device = torch.device("cpu"), **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.channel = channel
        self.device = device
        self._metrics = self._fresh_metrics()

    def _fresh_metrics(self) -> ShardMetrics:
        n = self.channel.shards
        return ShardMetrics(plays=[0] * n, seconds=[0.0] * n, cpu_seconds=[0.0] * n)

    async def play_all(self, step: int, requests: list[PlayRequest]) -> list[Play]:
        if not requests:
            return []
        blocks = split_requests(requests, self.channel.shards)
        await in_thread(self.device, self.channel.send_round, ShardRound(step, blocks))
        own = await timed_block(super().play_all, step, blocks[0], self)
        waited = time.perf_counter()
        results = await in_thread(self.device, self.channel.gather, own)
        metrics = self._metrics
        metrics.rounds += 1
        metrics.wait_seconds += time.perf_counter() - waited
        plays: list[Play] = []
        for s, result in enumerate(results):
            plays += result.plays
            metrics.plays[s] += len(result.plays)
            metrics.seconds[s] += result.seconds
            metrics.cpu_seconds[s] += result.cpu_seconds
            if s:
                self.infrastructure_failures += result.dropped
                metrics.remote_tokens += result.generated_tokens
                self.timed_out_envs.update(result.timed_out)
        return plays

    def step_metrics(self) -> dict[str, float]:
        """``rollout/shard_*`` figures of the rounds since the last call."""
        m, self._metrics = self._metrics, self._fresh_metrics()
        out = {"rollout/shards": float(self.channel.shards), "rollout/shard_rounds": float(m.rounds),
               "time/shard_wait_s": m.wait_seconds, "engine/remote_generated_tokens": float(m.remote_tokens)}
        if m.rounds:
            out["rollout/shard_plays_max"] = float(max(m.plays))
            out["rollout/shard_plays_min"] = float(min(m.plays))
            out["time/shard_play_max_s"] = max(m.seconds)
            out["time/shard_play_min_s"] = min(m.seconds)
        return out


async def timed_block(play_all: Any, step: int, block: list[PlayRequest], player: Player) -> ShardResult:
    """``play_all(step, block)`` with its wall and CPU seconds and the plays it dropped."""
    dropped, tokens = player.infrastructure_failures, generated_tokens(player.engine)
    timed_out = set(player.timed_out_envs)
    started, cpu = time.perf_counter(), time.process_time()
    plays = await play_all(step, block) if block else []
    return ShardResult(plays, player.infrastructure_failures - dropped, time.perf_counter() - started,
                       time.process_time() - cpu, generated_tokens(player.engine) - tokens,
                       tuple(sorted(player.timed_out_envs - timed_out)))


def generated_tokens(engine: RolloutEngine) -> int:
    stats = engine.generation_stats()
    return 0 if stats is None else stats.generated_tokens


def shard_player(settings: SelfPlaySettings, *, sandbox: Sandbox, engine: RolloutEngine, tokenizer: Any, seed: int,
                 chat_template_kwargs: Optional[dict[str, Any]] = None) -> Player:
    """A shard's player, made as the orchestrator makes rank 0's: the same chat format, stop tokens,
    seed and play sandbox (a pool's view with the released loader's names)."""
    chat_format = ChatFormat(tokenizer, chat_template_kwargs)
    if settings.env_source == "fixed_pool":
        sandbox = pool_load_sandbox(settings, sandbox)
    return Player(settings, sandbox=sandbox, engine=engine, tokenizer=tokenizer, chat_format=chat_format, seed=seed,
                  stop_token_ids=end_of_turn_stop_ids(chat_format, tokenizer))


class ShardServer:
    """A shard other than rank 0: plays its block of every round until the end of the step."""

    def __init__(self, player: Player, channel: ShardChannel, device: torch.device = torch.device("cpu")):
        if not channel.shard:
            raise ValueError(f"rank {channel.rank} is not a shard other than rank 0 ({channel.layout.ranks})")
        self.player = player
        self.channel = channel
        self.device = device

    async def serve_step(self) -> int:
        """Serve the rounds of one step; returns how many."""
        rounds = 0
        while True:
            round_ = await in_thread(self.device, self.channel.receive_round)
            if round_ is None:
                return rounds
            result = await timed_block(self.player.play_all, round_.step, round_.blocks[self.channel.shard],
                                       self.player)
            await in_thread(self.device, self.channel.gather, result)
            rounds += 1
