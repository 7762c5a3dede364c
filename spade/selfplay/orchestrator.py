"""The self-play step orchestrator: SPEC section 1, steps 1-4 and 6 (the caller does step 5).

``Orchestrator.run_step(step)``:

1. **Regenerate** when ``step % k == 0`` (:mod:`.designer_round`): active skills of regeneration
   ``step // k``, up to ``max_attempts`` designer attempts per slot (all slots concurrently), admission
   in the sandbox, one hint per admitted environment; rejected candidates and the new set are
   written under ``run_dir``. The new set replaces the old one. The baselines take the set from
   another :class:`~.env_source.EnvSource` instead (``env_source: fixed_pool`` or ``rlve``), which
   also hears every step's no-hint returns (RLVE's difficulty controller reads them).
2. **Play** (:mod:`.plays`): every environment ``g_nohint`` times without hint, and at the
   regeneration step also ``g_hint`` times with the hint (measured, never trained).
3. **Agent samples**: per environment, advantages are the z-scores of its no-hint returns of this
   step; one sample per no-hint play that generated anything. Stabilisers (off by default):
   ``drop_equal_return_groups`` leaves out environments whose returns are all equal, after up to
   ``refill_equal_groups`` extra rounds of ``g_nohint`` plays of just those environments;
   ``mask_truncated`` leaves out samples of episodes cut by a budget (the returns still count in
   the group's mean and std).
4. **Designer samples**: the designer call of each admitted environment (prompt + whole response,
   loss on the response) waits in a :class:`DesignerBuffer` with the returns of step ``s``; later
   steps of the window add their no-hint returns; at step ``s + k`` the buffer releases it with its
   reward and the released set gets ``designer_advantages`` (centred per skill, weighted by
   ``designer_advantage_weight``: the released global batch 192 / n_released * k, capped). Emitted only if
   ``train_designer``.
6. **Memory**: after the plays of a regeneration step, one record per environment (win rate = share
   of no-hint plays with return > 0, raw regret = mean hinted return - mean no-hint return, step s).

Every step's returns, and a bounded sample of its episodes, go to ``RUN/trajectories/``
(:mod:`.trajectory_log`, read by ``spade analyze`` and ``spade explore``).

Resume. ``state_dict()`` is JSON-serialisable: the current set (sources, hints, ids, skills,
generation step), the delay buffer, and the pending designer trajectories (``Trajectory.to_json``). There is no mutable rng: every random choice (corpus document, memory
examples, sampling seeds, reset seeds) comes from a seed derived from ``(seed, step, slot/env,
attempt/play)``, so ``load_state_dict`` plus the same ``seed`` continues exactly. The memory
database is not in the state: the caller rolls it back with ``memory.rollback(checkpoint_step)``
when resuming, before the next ``run_step``.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..designer.corpus import Corpus
from ..designer.memory import Memory, MemoryRecord, win_rate
from ..envs.protocol import Sandbox
from ..rl.samples import Role, Trajectory
from ..rollout.conversation import ChatFormat
from ..rollout.engine import RolloutEngine
from .delay_buffer import DesignerBuffer, ReleasedDesignerSample
from .designer_round import DesignerRound, EnvSpec, RegenerationResult
from .env_source import EnvSource
from .plays import Play, Player, PlayRequest
from .rewards import agent_advantages, designer_advantage_weight, designer_advantages, hint_regret
from .samples import role_logprob_temperature
from .settings import SelfPlaySettings
from .trajectory_log import TrajectoryLog

STATE_VERSION = 1
LEARNABLE_BAND = (0.2, 0.8)
# How an episode cut by a budget ends (``mask_truncated``): the environment truncated it, the turn
# budget ran out, or the policy stopped (context or reply token budget spent).
TRUNCATED_ENDS = frozenset({"truncated", "turn_budget", "policy_stopped"})


@dataclass
class StepOutput:
    """What one step hands to the trainer.

    ``samples``: the trajectories to train on this step, agent ones (this step's no-hint plays)
    then designer ones (released by the delay buffer), each with its role, environment, skill,
    reward and advantage. ``metrics``: ``agent/*``, ``designer/*``, ``env/*``, ``time/*`` floats;
    per-regeneration keys (``env/admitted``, ``env/rejected*``, ``designer/attempts``,
    ``agent/hint_*``) appear only at regeneration steps, the designer reward means only when
    something was released.
    """

    step: int
    samples: list[Trajectory] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def agent_samples(self) -> list[Trajectory]:
        return [t for t in self.samples if t.role is Role.AGENT]

    @property
    def designer_samples(self) -> list[Trajectory]:
        return [t for t in self.samples if t.role is Role.DESIGNER]


class Orchestrator:
    def __init__(self, settings: SelfPlaySettings, *, sandbox: Sandbox, engine: RolloutEngine, tokenizer: Any,
                 corpus: Corpus | None, memory: Memory | None, run_dir: Path, seed: int,
                 stop_token_ids: tuple[int, ...] | None = None, chat_template_kwargs: dict[str, Any] | None = None):
        self.settings = settings
        self.memory = memory
        self.run_dir = Path(run_dir)
        self.seed = int(seed)
        self.chat_format = ChatFormat(tokenizer, chat_template_kwargs)  # every role's prompts (model.thinking)
        if stop_token_ids is None:  # the template's end-of-turn token, when it is a special token
            first = self.chat_format.closing[0]
            stop_token_ids = (first,) if first in set(getattr(tokenizer, "all_special_ids", ())) else ()
        common = dict(sandbox=sandbox, engine=engine, tokenizer=tokenizer, chat_format=self.chat_format,
                      seed=self.seed, stop_token_ids=tuple(stop_token_ids))
        self.designer = DesignerRound(settings, corpus=corpus, memory=memory, run_dir=self.run_dir, **common)
        self.source = self._env_source(settings, sandbox)
        play_sandbox = self.source.play_sandbox()
        if play_sandbox is not None:
            common["sandbox"] = play_sandbox
        self.player = Player(settings, **common)
        self.envs: list[EnvSpec] = []
        self.buffer = DesignerBuffer(settings.k, settings.rewards)
        self.pending_samples: dict[str, Trajectory] = {}  # sample_ref (env_id) -> the designer's trajectory
        self.last_step: int | None = None
        self.trajectory_log = TrajectoryLog(self.run_dir, settings.keep_trajectories)

    # ------------------------------------------------------------------ the step

    async def run_step(self, step: int) -> StepOutput:
        s = self.settings
        out = StepOutput(step)
        metrics = out.metrics
        regenerate = step % s.k == 0
        started = time.perf_counter()
        new_designs: dict[str, Trajectory] = {}
        if regenerate:
            regen = await self.source.next_set(step)
            self.envs = regen.envs
            new_designs = regen.designer_fields
            self._regeneration_metrics(regen, metrics)
        designed = time.perf_counter()

        plays = await self.player.play_all(step, self.player.requests(self.envs, with_hint=regenerate))
        plays += await self._refill_plays(step, plays)
        played = time.perf_counter()
        self.trajectory_log.write_step(step, self.envs, plays)
        nohint: dict[str, list[Play]] = {env.env_id: [] for env in self.envs}
        hinted: dict[str, list[Play]] = {env.env_id: [] for env in self.envs}
        for play in plays:
            (hinted if play.hinted else nohint)[play.env_id].append(play)
        self.source.observe(step, self.envs, {env_id: [p.episode_return for p in env_plays]
                                              for env_id, env_plays in nohint.items()})
        source_metrics = getattr(self.source, "metrics", None)  # optional: what the source itself tracks
        if source_metrics is not None:
            metrics.update(source_metrics())

        self._agent_samples(out, nohint)
        pending_ids = {entry.env_id for entry in self.buffer.pending}
        if not regenerate:
            for env in self.envs:
                if env.env_id in pending_ids:
                    self.buffer.record_window_returns(step, env.env_id, [p.episode_return for p in nohint[env.env_id]])
        released = self.buffer.release(step)
        self._designer_samples(out, released)
        if regenerate and s.designer_enabled:
            for env in self.envs:
                h = [p.episode_return for p in hinted[env.env_id]]
                n = [p.episode_return for p in nohint[env.env_id]]
                design = new_designs.get(env.env_id)
                if h and n:  # an external designer has no trajectory: its rewards are still measured
                    self.buffer.add(step, env.env_id, env.skill, env.env_id, h, n)
                    if design is not None:
                        self.pending_samples[env.env_id] = design.scored(role=Role.DESIGNER, env_id=env.env_id,
                                                                         skill=env.skill, generated_step=step)
            if s.use_memory and self.memory is not None:
                self._remember(step, nohint, hinted)

        self._play_metrics(out, nohint, hinted, regenerate)
        metrics["designer/pending"] = float(len(self.buffer))
        metrics["time/designer_s"] = designed - started
        metrics["time/play_s"] = played - designed
        self.last_step = step
        return out

    def _env_source(self, settings: SelfPlaySettings, sandbox: Sandbox) -> EnvSource:
        if settings.env_source == "fixed_pool":
            from .pool import FixedPool
            return FixedPool(settings, sandbox=sandbox, run_dir=self.run_dir, seed=self.seed,
                             screen=self.designer.model_screen)
        if settings.env_source == "rlve":
            from .rlve_source import RLVESource
            return RLVESource(settings, run_dir=self.run_dir, seed=self.seed)
        return self.designer

    async def close(self) -> None:
        """Release what the set's source holds (RLVE's worker processes); the others hold nothing."""
        close = getattr(self.source, "close", None)
        if close is not None:
            await close()

    async def _refill_plays(self, step: int, plays: list[Play]) -> list[Play]:
        """Extra no-hint rounds for the environments whose returns are all equal (stabiliser)."""
        s = self.settings
        if not s.drop_equal_return_groups or s.refill_equal_groups == 0:
            return []
        by_env: dict[str, list[float]] = {env.env_id: [] for env in self.envs}
        for play in plays:
            if not play.hinted:
                by_env[play.env_id].append(play.episode_return)
        extra: list[Play] = []
        for round_ in range(1, s.refill_equal_groups + 1):
            flat = [env for env in self.envs if _all_equal(by_env[env.env_id])]
            if not flat:
                break
            requests = [PlayRequest(env, False, round_ * s.g_nohint + i) for env in flat for i in range(s.g_nohint)]
            new = await self.player.play_all(step, requests)
            for play in new:
                by_env[play.env_id].append(play.episode_return)
            extra += new
        return extra

    def _agent_samples(self, out: StepOutput, nohint: dict[str, list[Play]]) -> None:
        s = self.settings
        skills = {env.env_id: env.skill for env in self.envs}
        dropped_groups = masked = 0
        for env_id, env_plays in nohint.items():
            returns = [p.episode_return for p in env_plays]
            if s.drop_equal_return_groups and env_plays and _all_equal(returns):
                dropped_groups += 1
                continue
            advantages = agent_advantages(returns)
            for play, advantage in zip(env_plays, advantages):
                if play.trajectory is None or not play.trajectory.trainable:
                    continue
                if s.mask_truncated and play.end_reason in TRUNCATED_ENDS:
                    masked += 1
                    continue
                out.samples.append(play.trajectory.scored(
                    role=Role.AGENT, env_id=env_id, skill=skills[env_id], index=play.index,
                    generated_step=out.step, reward=play.episode_return, advantage=advantage))
        if s.drop_equal_return_groups:
            out.metrics["agent/dropped_equal_groups"] = float(dropped_groups)
        if s.mask_truncated:
            out.metrics["agent/masked_truncated"] = float(masked)

    def _designer_samples(self, out: StepOutput, released: list[ReleasedDesignerSample]) -> None:
        metrics = out.metrics
        metrics["designer/released"] = float(len(released))
        if not released:
            return
        metrics["designer/reward_mean"] = _mean([r.reward for r in released])
        metrics["designer/regret_mean"] = _mean([r.regret for r in released])
        metrics["designer/win_mean"] = _mean([r.win for r in released])
        scale = designer_advantage_weight(self.settings.rewards, len(out.agent_samples), len(released),
                                          self.settings.k)
        advantages = designer_advantages([r.reward for r in released], [r.skill for r in released], scale)
        metrics["designer/advantage_scale"] = scale
        for average, per_skill in sorted(self.buffer.reward_state.items()):  # learning potential: per-skill EMAs
            if isinstance(per_skill, dict):
                for skill, value in sorted(per_skill.items()):
                    metrics[f"designer/lp_{average}/{skill}"] = float(value)
        potential = getattr(self.buffer.reward, "potential", None)  # the released code's monitored gap
        if potential is not None:
            for skill in sorted(self.buffer.reward_state.get("slow", {})):
                metrics[f"designer/lp_potential/{skill}"] = potential(skill)
        for entry, advantage in zip(released, advantages):
            design = self.pending_samples.pop(entry.sample_ref, None)
            if not self.settings.train_designer or design is None or not design.trainable:
                continue
            out.samples.append(design.scored(role=Role.DESIGNER, env_id=entry.env_id, skill=entry.skill,
                                             generated_step=entry.generated_step, reward=entry.reward,
                                             advantage=advantage))
        metrics["designer/samples"] = float(len(out.designer_samples))

    def _remember(self, step: int, nohint: dict[str, list[Play]], hinted: dict[str, list[Play]]) -> None:
        assert self.memory is not None
        records = []
        for env in self.envs:
            n = [p.episode_return for p in nohint[env.env_id]]
            if not n:
                continue
            h = [p.episode_return for p in hinted[env.env_id]]
            regret = hint_regret(h, n) if h else 0.0
            records.append(MemoryRecord(env_id=env.env_id, skill=env.skill, step=step, win_rate=win_rate(n),
                                        regret=regret, source=env.source, hint=env.hint, class_name=env.class_name,
                                        metadata={"document": env.document, "attempts": env.attempts,
                                                  "nohint_plays": len(n), "hint_plays": len(h)}))
        self.memory.add_many(records)

    # ------------------------------------------------------------------ metrics

    def _regeneration_metrics(self, regen: RegenerationResult, metrics: dict[str, float]) -> None:
        metrics["designer/attempts"] = float(regen.attempts)
        metrics["env/admitted"] = float(len(regen.envs))
        metrics["env/rejected"] = float(len(regen.rejections))
        for kind, count in sorted(Counter(r.kind.value for r in regen.rejections).items()):
            metrics[f"env/rejected_{kind}"] = float(count)
        reports = [env.tool_report for env in regen.envs if env.tool_report is not None]
        if self.settings.domain == "tool_use":
            # admitted environments with a criterion true at reset / unchangeable by the probes /
            # met by any first call (reported, rejected only when switched on), and model screens
            # that gave no verdict
            for key in ("true_at_reset", "unchangeable", "trivial"):
                metrics[f"env/tool_{key}"] = float(sum(1 for r in reports if r.get(key)))
            metrics["env/tool_screen_no_verdict"] = float(sum(1 for r in reports if r.get("screen") is None))

    def _play_metrics(self, out: StepOutput, nohint: dict[str, list[Play]], hinted: dict[str, list[Play]],
                      regenerate: bool) -> None:
        metrics = out.metrics
        plays = [p for env_plays in nohint.values() for p in env_plays]
        returns = [p.episode_return for p in plays]
        metrics["agent/episodes"] = float(len(plays))
        metrics["agent/samples"] = float(len(out.agent_samples))
        metrics["agent/infra_dropped"] = float(self.player.infrastructure_failures)
        if plays:
            mean = _mean(returns)
            metrics["agent/return_mean"] = mean
            metrics["agent/return_std"] = math.sqrt(_mean([(r - mean) ** 2 for r in returns]))
            metrics["agent/win_rate"] = win_rate(returns)
            metrics["agent/turns_mean"] = _mean([float(p.turns) for p in plays])
        if regenerate:
            hint_returns = [p.episode_return for env_plays in hinted.values() for p in env_plays]
            metrics["agent/hint_episodes"] = float(len(hint_returns))
            if hint_returns:
                metrics["agent/hint_return_mean"] = _mean(hint_returns)
        metrics["env/set_size"] = float(len(self.envs))
        rates = [win_rate([p.episode_return for p in env_plays]) for env_plays in nohint.values() if env_plays]
        if rates:
            lo, hi = LEARNABLE_BAND
            metrics["env/learnable_share"] = sum(lo <= r <= hi for r in rates) / len(rates)

    # ------------------------------------------------------------------ resume

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state (see the module docstring); the memory DB is not included."""
        return {
            "version": STATE_VERSION,
            "seed": self.seed,
            "last_step": self.last_step,
            "envs": [env.to_json() for env in self.envs],
            "designer_buffer": self.buffer.to_json(),
            "pending_samples": {key: value.to_json() for key, value in self.pending_samples.items()},
            "infrastructure_failures": self.player.infrastructure_failures,
            "env_source": self.source.state_dict(),
            "rng": {"kind": "derived", "seed": self.seed},  # all draws come from derived seeds: no mutable rng
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"orchestrator state version {state.get('version')!r}, expected {STATE_VERSION}")
        if int(state["seed"]) != self.seed:
            raise ValueError(f"orchestrator state was written with seed {state['seed']}, this run uses {self.seed}: "
                             "resuming would not continue the same run")
        buffer = DesignerBuffer.from_json(state["designer_buffer"], self.settings.rewards)  # this run's band
        if buffer.k != self.settings.k:
            raise ValueError(f"orchestrator state has k={buffer.k}, the settings say k={self.settings.k}")
        self.buffer = buffer
        self.last_step = state.get("last_step")
        self.trajectory_log.drop_after(self.last_step)
        self.envs = [EnvSpec.from_json(env) for env in state["envs"]]
        designer_t = role_logprob_temperature(self.settings, Role.DESIGNER)  # records older than the field
        self.pending_samples = {key: Trajectory.from_json(value, default_logprob_temperature=designer_t)
                                for key, value in state["pending_samples"].items()}
        self.player.infrastructure_failures = int(state.get("infrastructure_failures", 0))
        self.source.load_state_dict(state.get("env_source", {}))


def _all_equal(values: list[float]) -> bool:
    return all(v == values[0] for v in values)


def _mean(values: list[float]) -> float:
    return math.fsum(values) / len(values)
