"""The self-play step orchestrator: SPEC section 1, steps 1-4 and 6 (the caller does step 5).

``Orchestrator.run_step(step)`` runs one stage per method, in Algorithm 1's order (``step`` is a
:class:`~.step.Step`: the updates done before it, ``s``):

1. :meth:`~Orchestrator.regenerate_and_admit`, when ``step.regenerates(k)`` (:mod:`spade.selfplay.sources.designer_source`):
   active skills of regeneration ``step.regeneration(k)``, up to ``max_attempts`` designer attempts
   per slot (all slots concurrently), admission in the sandbox, one hint per admitted environment;
   rejected candidates and the new set are written under ``run_dir``. The new set replaces the old
   one. The baselines take the set from another :class:`~spade.selfplay.sources.env_source.EnvSource` instead
   (``env_source: fixed_pool`` or ``rlve``), which also hears every step's no-hint returns (RLVE's
   difficulty controller reads them).
2. :meth:`~Orchestrator.play` (:mod:`spade.selfplay.plays.step_plays`, :mod:`spade.selfplay.plays.player`): every environment ``g_nohint``
   times without hint, and at the regeneration step also ``g_hint`` times with the hint (measured,
   never trained). The plays come as groups (environment, the step it began in, its no-hint plays).
   With ``partial_rollouts`` on (:mod:`spade.selfplay.plays.partial_plays`, docs/partial_rollouts.md) a step that does
   not regenerate ends once enough no-hint groups are complete and carries the rest; a
   regeneration step first finishes the carried groups, then plays everything to the end.
3. :meth:`~Orchestrator.score_agent_plays`: per environment, advantages are the z-scores of its
   no-hint returns of this step; one sample per no-hint play that generated anything. Stabilisers
   (off by default, ``selfplay.plays``): ``drop_equal_return_groups`` leaves out environments whose returns are all
   equal, after up to ``refill_equal_groups`` extra rounds of ``g_nohint`` plays of just those
   environments; ``mask_truncated`` leaves out samples of episodes cut by a budget (the returns
   still count in the group's mean and std).
4. :meth:`~Orchestrator.release_designer_rewards`, then :meth:`~Orchestrator.enqueue_designs`: the
   designer call of each admitted environment (prompt + whole response, loss on the response)
   waits in a :class:`DesignerBuffer` with the returns of step ``s``; later steps of the window add
   their no-hint returns; at step ``s + k`` the buffer releases it with its reward (before that
   step's own designs join) and the released set gets ``designer_advantages`` (centred per skill,
   weighted by ``designer_advantage_weight``: the released global batch 192 / n_released * k,
   capped). Emitted only if ``train_designer``.
6. :meth:`~Orchestrator.update_memory`: after the plays of a regeneration step, one record per
   environment (win rate = share of no-hint plays with return > 0, raw regret = mean hinted return
   - mean no-hint return, step s).

Every step's returns, and a bounded sample of its episodes, go to ``RUN/trajectories/``
(:mod:`spade.selfplay.plays.trajectory_log`, read by ``spade analyze`` and ``spade explore``). The step's figures are
``StepOutput.metrics``; the trainer adds its own to make the ``metrics.jsonl`` line.

Resume. ``state_dict()`` is JSON-serialisable: the current set (sources, hints, ids, skills,
generation step), the delay buffer, the pending designer trajectories (``Trajectory.to_json``) and,
with partial rollouts on, the carried groups (:mod:`spade.selfplay.plays.partial_plays`).
There is no mutable rng: every random choice (corpus document, memory examples, sampling seeds,
reset seeds) comes from a seed derived from ``(seed, s, slot/env, attempt/play)``, so
``load_state_dict`` plus the same ``seed`` continues exactly. The memory database is not in the
state: when resuming at step ``s`` the caller rolls it back with ``memory.rollback(s.last_run)``
before the next ``run_step``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from ..designer.corpus import Corpus
from ..designer.memory import Memory, MemoryRecord, win_rate
from ..envs.protocol import Sandbox
from ..peak_memory import no_phase
from ..rl.samples import Role, Trajectory
from ..rollout.conversation import ChatFormat
from ..rollout.engine import RolloutEngine
from .plays.partial_plays import step_player
from .plays.partial_rollout_settings import refuse_unsupported
from .plays.play_rules import fill_round_robin
from .plays.player import Player, end_of_turn_stop_ids
from .plays.rollout_shards import ShardChannel, ShardedPlayer
from .plays.step_plays import StepPlays, all_equal
from .plays.trajectory_log import TrajectoryLog
from .plays.turn_samples import episode_weights, episodes
from .rewards.advantages import agent_advantages, designer_advantage_weight, designer_advantages
from .rewards.delay_buffer import DesignerBuffer, ReleasedDesignerSample
from .rewards.designer_rewards import hint_regret
from .settings import SelfPlaySettings
from .sources.designer_source import DesignerRound, EnvSpec, PenalisedDesign
from .sources.env_source import EnvSource
from .sources.fixed_pool import ReleasedLoaderSandbox
from .sources.slot_stages import SET_STAGE, no_stage
from .step import Step
from .step_figures import mean, regeneration_figures, step_figures
from .trajectories import role_logprob_temperature

STATE_VERSION = 1
# How an episode cut by a budget ends (``plays.mask_truncated``): the environment truncated it, the turn
# budget ran out, or the policy stopped (context or reply token budget spent).
TRUNCATED_ENDS = frozenset({"truncated", "turn_budget", "policy_stopped"})


@dataclass
class StepOutput:
    """What one step hands to the trainer.

    ``samples``: the trajectories to train on this step, agent ones (this step's no-hint plays)
    then designer ones (released by the delay buffer), each with its role, environment, skill,
    reward and advantage. ``metrics``: ``agent/*``, ``designer/*``, ``env/*``, ``time/*`` floats;
    ``agent/samples``, ``designer/samples`` and ``designer/pending`` in every step; per-regeneration keys (``env/admitted``, ``env/rejected*``, ``designer/attempts``,
    ``agent/hint_*``) appear only at regeneration steps, the designer reward means only when
    something was released.
    """

    step: Step
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
                 stop_token_ids: tuple[int, ...] | None = None, chat_template_kwargs: dict[str, Any] | None = None,
                 shards: ShardChannel | None = None, play_engine: RolloutEngine | None = None,
                 device: torch.device | None = None, final_step: int | None = None):
        refuse_unsupported(settings.partial_rollouts, domain=settings.domain,
                           refill_equal_groups=settings.plays.refill_equal_groups)  # before anything is built
        self.settings = settings
        self.final_step = final_step  # the run's last step (batch.release_at_final_step); None: unknown
        self.memory = memory
        self.run_dir = Path(run_dir)
        self.seed = int(seed)
        self.chat_format = ChatFormat(tokenizer, chat_template_kwargs)  # every role's prompts (model.thinking)
        if stop_token_ids is None:
            stop_token_ids = end_of_turn_stop_ids(self.chat_format, tokenizer)
        if settings.plays.released_loader_names and settings.env_source == "designer":
            sandbox = ReleasedLoaderSandbox(sandbox)  # designed games admitted and played under the released names
        common = dict(sandbox=sandbox, engine=engine, tokenizer=tokenizer, chat_format=self.chat_format,
                      seed=self.seed, stop_token_ids=tuple(stop_token_ids))
        self.designer = DesignerRound(settings, corpus=corpus, memory=memory, run_dir=self.run_dir, **common)
        self.source = self._env_source(settings, sandbox)
        play_sandbox = self.source.play_sandbox()
        if play_sandbox is not None:
            common["sandbox"] = play_sandbox
        if play_engine is not None:  # rollout shards: rank 0 plays its block on its own servers
            common["engine"] = play_engine
        if shards is not None and shards.shards > 1:  # settings refuse shards where they cannot work
            self.player: Player = ShardedPlayer(settings, channel=shards, device=device or torch.device("cpu"),
                                                **common)
        else:
            self.player = Player(settings, **common)
        own_plays = getattr(self.source, "step_player", None)  # a source that plays its own way (SPIRAL's two seats)
        # a step's groups: whole, or partial rollouts, or the source's own
        self.step_player = own_plays(self.player) if own_plays is not None else step_player(settings, self.player)
        self.envs: list[EnvSpec] = []
        self.penalised: list[PenalisedDesign] = []  # this regeneration's rejected calls that train (SPICE)
        self.buffer = DesignerBuffer(settings.k, settings.rewards)
        self.pending_samples: dict[str, Trajectory] = {}  # sample_ref (env_id) -> the designer's trajectory
        self.last_step: int | None = None
        self.trajectory_log = TrajectoryLog(self.run_dir, settings.plays.keep_trajectories)
        self.on_phase: Callable[[str], None] = no_phase  # told when the designer batch ends (peak RSS)
        self.on_stage: Callable[..., None] = no_stage  # the step's phase by name (the trainer's progress line)
        self.designer.stages.report = lambda name, detail: self.on_stage(name, detail=detail)
        self.set_stage = SET_STAGE[settings.env_source]

    # ------------------------------------------------------------------ the step

    async def run_step(self, step: Step) -> StepOutput:
        """Algorithm 1's steps 1-4 and 6 for ``step``, one stage per line, in the paper's order."""
        out = StepOutput(step)
        regenerate = step.regenerates(self.settings.k)
        started = time.perf_counter()
        if regenerate:  # partial rollouts: the ending set's carried plays end first
            self.on_stage("playing" if self.settings.partial_rollouts.enabled else self.set_stage)
            await self.step_player.end_set()
            self.on_stage(self.set_stage)  # designing, drawing or generating; the designer's slots refine it
        designs = await self.regenerate_and_admit(step, out) if regenerate else {}   # 1
        designed = time.perf_counter()
        if regenerate:
            self.on_phase("designer")
        self.on_stage("playing")
        plays = await self.play(step, with_hint=regenerate)                            # 2
        played = time.perf_counter()
        self.score_agent_plays(out, plays)                                             # 3
        self.release_designer_rewards(out, plays, regenerate)                          # 4, for step - k
        if regenerate:
            self.enqueue_designs(step, designs, plays)                                 # 4, for this step's set
            self.update_memory(step, plays)                                            # 6
        if self._flushes(step):  # batch.release_at_final_step: every waiting design, this step's too
            self._designer_samples(out, self.buffer.release_all())
        # whole episodes: the turn samples of a play are cut together and count once (released)
        batch = self.settings.batch.assemble(episodes(out.agent_samples), episodes(out.designer_samples))
        out.samples[:] = [sample for episode in batch for sample in episode]
        out.metrics.update(step_figures(self.settings, out, plays, regenerate, source=self.source, player=self.player,
                                        step_player=self.step_player, envs=self.envs, pending=len(self.buffer)))
        out.metrics["time/designer_s"] = designed - started
        out.metrics["time/play_s"] = played - designed
        self.last_step = step.updates_done
        return out

    async def regenerate_and_admit(self, step: Step, out: StepOutput) -> dict[str, Trajectory]:
        """1. A new set from the source (designed, admitted in the sandbox and hinted, or drawn);
        returns the designer call of each admitted environment, by env id."""
        regen = await self.source.next_set(step.updates_done)
        self.envs = regen.envs
        self.penalised = regen.penalised
        out.metrics.update(regeneration_figures(self.settings, regen))
        return regen.designer_fields

    async def play(self, step: Step, *, with_hint: bool) -> StepPlays:
        """2. The step's groups (every environment ``g_nohint`` times without the hint, plus refills
        of flat groups, or partial rollouts' complete groups) and, at a regeneration, every
        environment ``g_hint`` times with it; the returns go to the trajectory log and the source."""
        n = step.updates_done
        plays = await self.step_player.play(n, self.envs, with_hint=with_hint)
        self.trajectory_log.write_step(n, self.envs, list(plays.played))
        self.source.observe(n, self.envs, {env_id: plays.nohint_returns(env_id) for env_id in plays.nohint})
        return plays

    def score_agent_plays(self, out: StepOutput, plays: StepPlays) -> None:
        """3. One agent sample per trainable no-hint play, its advantage the z-score of its
        environment's returns of this step (stabilisers: drop flat groups, mask truncated episodes)."""
        s = self.settings
        dropped_groups = masked = 0
        groups = plays.groups
        for env, origin, env_plays in groups:
            env_id = env.env_id
            returns = [p.episode_return for p in env_plays]
            if s.plays.drop_equal_return_groups and env_plays and all_equal(returns):
                dropped_groups += 1
                continue
            own_advantages = getattr(self.source, "advantages", None)  # SPIRAL's role-conditioned baselines
            advantages = own_advantages(env, env_plays) if own_advantages is not None else agent_advantages(returns)
            for play, advantage in zip(env_plays, advantages):
                # one sequence per play, or one per turn (plays.sample_form per_turn), each with the play's
                # advantage, the turns weighted to be one episode in the loss and the batch
                trainable = episode_weights([t for t in play.training_trajectories if t.trainable])
                if not trainable or advantage is None:  # None: the source leaves the play out (SPIRAL's filter)
                    continue
                if s.plays.mask_truncated and play.end_reason in TRUNCATED_ENDS:
                    masked += 1
                    continue
                out.samples += [trajectory.replace(
                    role=Role.AGENT, env_id=env_id, skill=env.skill, index=play.index,
                    generated_step=origin, reward=play.episode_return, advantage=advantage) for trajectory in trainable]
        if s.plays.drops_faults:  # env_faults retry_then_drop: copies fill in for the dropped plays (released)
            agents = episodes([t for t in out.samples if t.role is Role.AGENT])  # copied whole
            others = [t for t in out.samples if t.role is not Role.AGENT]
            filled = fill_round_robin(agents, len(groups) * s.nohint_plays(len(groups)))  # the plays asked for
            out.metrics["agent/fault_fill"] = float(len(filled) - len(agents))
            out.samples[:] = [t for episode in filled for t in episode] + others
        if s.plays.drop_equal_return_groups:
            out.metrics["agent/dropped_equal_groups"] = float(dropped_groups)
        if s.plays.mask_truncated:
            out.metrics["agent/masked_truncated"] = float(masked)

    def release_designer_rewards(self, out: StepOutput, plays: StepPlays, regenerate: bool) -> None:
        """4 (delayed). Between regenerations the window's no-hint returns join the waiting designs;
        the designs of step ``s - k`` are released with their rewards and get designer advantages."""
        n = out.step.updates_done
        waiting = {entry.env_id for entry in self.buffer.pending}
        for env, origin, env_plays in plays.groups:  # a group's returns count at the step it began in
            if env.env_id in waiting and not (regenerate and origin == n):  # a set's own step: enqueue_designs
                self.buffer.record_window_returns(origin, env.env_id, [p.episode_return for p in env_plays])
        if not self._flushes(out.step):  # else released with the rest after this step's designs join
            self._designer_samples(out, self.buffer.release(n))

    def _flushes(self, step: Step) -> bool:
        """Whether ``step`` is the run's last and releases every waiting designer sample (released code)."""
        return self.settings.batch.release_at_final_step and step.updates_done == self.final_step

    def enqueue_designs(self, step: Step, designs: dict[str, Trajectory], plays: StepPlays) -> None:
        """4 (this step's set). Each environment's designer call waits in the buffer with this
        step's hinted and no-hint returns until step ``s + k`` scores it."""
        if not self.settings.designer_enabled:
            return
        n = step.updates_done
        for env in self.envs:
            h, nohint = plays.hint_returns(env.env_id), plays.nohint_returns(env.env_id)
            timed_out = env.env_id in self.player.timed_out_envs  # rewards.step_timeout_penalty
            if not self.buffer.takes(h, nohint, step_timeout=timed_out):
                continue  # hint_return_zero keeps a hintless environment (its regret reads the hinted mean as 0)
            self.buffer.add(n, env.env_id, env.skill, env.env_id, h, nohint, step_timeout=timed_out)
            design = designs.get(env.env_id)
            if design is not None:  # an external designer has no trajectory: its rewards are still measured
                self.pending_samples[env.env_id] = design.replace(role=Role.DESIGNER, env_id=env.env_id,
                                                                  skill=env.skill, generated_step=n)
        for penalised in self.penalised:  # rejected candidates that train on a fixed reward (SPICE's penalty)
            self.buffer.add(n, penalised.ref, penalised.skill, penalised.ref, (), (), penalty=penalised.reward)
            self.pending_samples[penalised.ref] = penalised.trajectory.replace(
                role=Role.DESIGNER, env_id=penalised.ref, skill=penalised.skill, generated_step=n)
        self.penalised = []

    def update_memory(self, step: Step, plays: StepPlays) -> None:
        """6. One memory record per environment played: win rate and hint regret at this step."""
        s = self.settings
        if not (s.designer_enabled and s.use_memory and self.memory is not None):
            return
        records = []
        for env in self.envs:
            n = plays.nohint_returns(env.env_id)
            if not n:
                continue
            h = plays.hint_returns(env.env_id)
            regret = hint_regret(h, n) if h else 0.0
            records.append(MemoryRecord(env_id=env.env_id, skill=env.skill, step=step.updates_done,
                                        win_rate=win_rate(n), regret=regret, source=env.source, hint=env.hint,
                                        class_name=env.class_name,
                                        metadata={"document": env.document, "attempts": env.attempts,
                                                  "nohint_plays": len(n), "hint_plays": len(h)}))
        self.memory.add_many(records)

    def _env_source(self, settings: SelfPlaySettings, sandbox: Sandbox) -> EnvSource:
        if settings.env_source == "fixed_pool":
            from .sources.fixed_pool import FixedPool
            return FixedPool(settings, sandbox=sandbox, run_dir=self.run_dir, seed=self.seed,
                             screen=self.designer.model_screen)
        if settings.env_source == "rlve":
            from .sources.rlve_source import RLVESource
            return RLVESource(settings, run_dir=self.run_dir, seed=self.seed)
        if settings.env_source == "spice":
            from .sources.spice_source import SpiceSource
            return SpiceSource(settings, corpus=self.designer.corpus, generator=self.designer.designer_generator,
                               run_dir=self.run_dir, seed=self.seed)
        if settings.env_source == "spiral":
            from .sources.spiral_source import SpiralSource
            return SpiralSource(settings, run_dir=self.run_dir, seed=self.seed, sandbox=sandbox,
                                generator=self.designer.designer_generator)
        return self.designer

    async def close(self) -> None:
        """Release what the set's source holds (RLVE's worker processes); the others hold nothing."""
        close = getattr(self.source, "close", None)
        if close is not None:
            await close()

    def _designer_samples(self, out: StepOutput, released: list[ReleasedDesignerSample]) -> None:
        metrics = out.metrics
        metrics["designer/released"] = float(len(released))
        if not released:
            return
        metrics["designer/reward_mean"] = mean([r.reward for r in released])
        metrics["designer/regret_mean"] = mean([r.regret for r in released])
        metrics["designer/win_mean"] = mean([r.win for r in released])
        scale = designer_advantage_weight(
            self.settings.rewards, _agent_episodes(out.agent_samples),
            len(released), self.settings.k)
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
            out.samples.append(design.replace(role=Role.DESIGNER, env_id=entry.env_id, skill=entry.skill,
                                              generated_step=entry.generated_step, reward=entry.reward,
                                              advantage=advantage))

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
            # env_faults retry_then_drop: drops so far and the hung environments (absent when off)
            **({"fault_drops": self.player.fault_drops, "hung_envs": sorted(self.player.hung_envs)}
               if self.settings.plays.drops_faults else {}),
            "env_source": self.source.state_dict(),
            "rng": {"kind": "derived", "seed": self.seed},  # all draws come from derived seeds: no mutable rng
            # partial rollouts: the unfinished groups (absent when off, so that state is unchanged)
            **self.step_player.state_dict(),
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
        self.player.fault_drops = int(state.get("fault_drops", 0))
        self.player.hung_envs = set(state.get("hung_envs", []))
        self.source.load_state_dict(state.get("env_source", {}))
        self.step_player.load_state_dict(state, role_logprob_temperature(self.settings, Role.AGENT))


def _agent_episodes(samples: list[Trajectory]) -> int:
    """The agent count of the designer weight: the samples, or with ``plays.sample_form: per_turn``
    the episodes they come from (copies of the fault fill included), as the released weight counts
    episodes before the thinking fan-out into turn samples (``slime/spade_rollout.py:597-603``;
    fan-out at ``:879-895``)."""
    return sum(t.count_weight for t in samples)
