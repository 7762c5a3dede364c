"""The delayed designer buffer (SPEC 1.4, 1.5).

A designer sample written at regeneration step ``s`` cannot be scored at once: its reward needs the
no-hint returns of every step of the environment's window ``s .. s+k-1``. :class:`DesignerBuffer`
holds the sample from ``s`` and releases it, with its reward, at step ``s + k``, to be trained on
together with that step's agent samples.

Lifecycle of one environment ``e`` generated at step ``s``::

    buffer.add(s, e, skill, sample_ref, hint_returns, nohint_returns)     # plays of step s
    buffer.record_window_returns(s + 1, e, returns)                        # ... each later step
    buffer.record_window_returns(s + k - 1, e, returns)
    released = buffer.release(s + k)                                       # reward computed here

Stale samples and log-probs: the buffer stores only an opaque ``sample_ref`` (a JSON value naming
where the designer's token ids and rollout log-probs are kept). Whoever keeps that sample must leave
its rollout log-probs exactly as they were at generation time, never recomputed under the newer
policy: the sample is ``k`` policy updates stale, and the trainer's truncated importance sampling
(``w = clamp(exp(logp_train - logp_rollout), 0, 2)``) corrects for exactly that staleness only if
``logp_rollout`` is the original.

The buffer also owns the state of a designer reward that lasts across regenerations (the
per-skill averages of the paper's learning potential, :class:`~spade.selfplay.rewards.designer_rewards.SetDesignerReward`).
It round-trips through JSON (:meth:`DesignerBuffer.to_json`, :meth:`DesignerBuffer.from_json`)
so that a resumed run releases exactly what the interrupted one would have, with the same rewards.

Format versions: 2 adds ``reward_state``. Version 1 (before issue 15) is read back: its settings
keys ``lp_fast_alpha``, ``lp_slow_alpha``, ``lp_scale`` and its reward name ``learning_potential``
meant today's ``window_progress`` (``wp_*``), and it had no reward state. Settings of either
version written before issue 20 carry ``lp_fast_decay`` / ``lp_slow_decay``, read back as
``lp_gamma_slow`` / ``lp_gamma_fast`` (:func:`~spade.selfplay.rewards.reward_settings.upgrade_reward_settings`).
Standard library only.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .designer_rewards import DesignerEvidence, designer_reward_for, score_released
from .reward_checks import require_finite
from .reward_settings import RewardSettings, upgrade_reward_settings
from ..step import Step

__all__ = [
    "DesignerBuffer",
    "PendingDesignerSample",
    "ReleasedDesignerSample",
]

_FORMAT_VERSION = 2


@dataclass(frozen=True)
class PendingDesignerSample:
    """One designer sample waiting for its window to close.

    ``nohint_returns`` are the no-hint plays of the generation step itself; ``later_returns`` holds
    ``(step, returns)`` for the later steps of the window, in step order.
    """

    env_id: str
    skill: str
    generated_step: int
    sample_ref: Any
    hint_returns: tuple[float, ...]
    nohint_returns: tuple[float, ...]
    later_returns: tuple[tuple[int, tuple[float, ...]], ...] = ()
    step_timeout: bool = False  # a play of the generation step timed out in load, reset or step
    penalty: float | None = None  # a fixed reward instead of the designer reward (SPICE's invalid question)

    def evidence(self) -> DesignerEvidence:
        """The window so far, as the designer reward reads it."""
        return DesignerEvidence(self.hint_returns, self.nohint_returns,
                                tuple(returns for _step, returns in self.later_returns),
                                hint_failed=not self.hint_returns, step_timeout=self.step_timeout)

    def to_json(self) -> dict[str, Any]:
        return {
            "env_id": self.env_id,
            "skill": self.skill,
            "generated_step": self.generated_step,
            "sample_ref": self.sample_ref,
            "hint_returns": list(self.hint_returns),
            "nohint_returns": list(self.nohint_returns),
            "later_returns": [[step, list(returns)] for step, returns in self.later_returns],
            "step_timeout": self.step_timeout,
            **({} if self.penalty is None else {"penalty": self.penalty}),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "PendingDesignerSample":
        return cls(
            env_id=data["env_id"],
            skill=data["skill"],
            generated_step=int(data["generated_step"]),
            sample_ref=data["sample_ref"],
            hint_returns=tuple(float(r) for r in data["hint_returns"]),
            nohint_returns=tuple(float(r) for r in data["nohint_returns"]),
            later_returns=tuple(
                (int(step), tuple(float(r) for r in returns)) for step, returns in data["later_returns"]
            ),
            step_timeout=bool(data.get("step_timeout", False)),  # absent before issue 39's penalty
            penalty=None if data.get("penalty") is None else float(data["penalty"]),  # issue 44
        )


@dataclass(frozen=True)
class ReleasedDesignerSample:
    """A designer sample whose window has closed, with its reward.

    ``win`` is the mean no-hint return over all plays of the window (the plateau's input);
    ``regret`` is the raw hint regret at the generation step (not floored, not normalised);
    ``reward`` is the selected designer reward. ``n_window_plays`` counts the window's no-hint plays
    and ``window_steps`` lists the steps that contributed any (a short list flags a gap).
    """

    env_id: str
    skill: str
    generated_step: int
    reward: float
    win: float
    regret: float
    sample_ref: Any
    n_window_plays: int
    window_steps: tuple[int, ...]


class DesignerBuffer:
    """Designer samples held back ``k`` steps until their window's no-hint returns are in.

    The reward is the designer reward that ``settings.designer_reward`` names
    (:func:`~spade.selfplay.rewards.designer_rewards.designer_reward_for`); the samples of one generation step are
    scored together (:func:`~spade.selfplay.rewards.designer_rewards.score_released`), generation steps in order.
    Advantages are not computed here: pass the ``reward`` and ``skill`` of one :meth:`release` to
    :func:`~spade.selfplay.rewards.advantages.designer_advantages`.
    """

    def __init__(self, k: int, settings: RewardSettings | None = None) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k: must be an integer >= 1, got {k!r}")
        self.k = k
        self.settings = settings if settings is not None else RewardSettings()
        self.reward = designer_reward_for(self.settings)
        self._pending: list[PendingDesignerSample] = []

    def __len__(self) -> int:
        return len(self._pending)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DesignerBuffer):
            return NotImplemented
        return (self.k, self.settings, self._pending, self.reward_state) == \
            (other.k, other.settings, other._pending, other.reward_state)

    @property
    def reward_state(self) -> dict[str, Any]:
        """The designer reward's state across regenerations ({} for a reward without state)."""
        state_dict = getattr(self.reward, "state_dict", None)
        return {} if state_dict is None else state_dict()

    @property
    def pending(self) -> tuple[PendingDesignerSample, ...]:
        """The samples not yet released, in the order they were added."""
        return tuple(self._pending)

    def add(
        self,
        step: int,
        env_id: str,
        skill: str,
        sample_ref: Any,
        hint_returns: Sequence[float],
        nohint_returns: Sequence[float],
        step_timeout: bool = False,
        penalty: float | None = None,
    ) -> None:
        """Hold the designer sample of environment ``env_id`` generated at ``step``.

        ``penalty``: the sample's reward is this number, whatever the designer reward would say
        (a rejected candidate that still trains: SPICE's invalid question); its returns may be
        empty and it is left out of the set the designer reward scores.

        ``hint_returns`` and ``nohint_returns`` are the plays of ``step`` itself (both non-empty;
        ``hint_returns`` may be empty with ``failed_hint: hint_return_zero``: a failed hint; both
        may be empty for an environment that timed out, ``step_timeout``, under
        ``step_timeout_penalty``: :meth:`takes`).
        ``sample_ref`` must be a JSON value that survives a round trip unchanged (str, number, list,
        dict of those). An ``env_id`` may not have two pending samples whose windows overlap.
        """
        Step(step)  # validates
        if not isinstance(env_id, str) or not isinstance(skill, str):
            raise ValueError("env_id and skill: must be strings")
        for other in self._pending:
            if other.env_id == env_id and Step(other.generated_step).window_overlaps(step, self.k):
                raise ValueError(
                    f"env_id {env_id!r}: already pending from step {other.generated_step}; "
                    f"windows of k={self.k} steps would overlap"
                )
        try:
            same = json.loads(json.dumps(sample_ref)) == sample_ref
        except (TypeError, ValueError):
            same = False
        if not same:
            raise ValueError(f"sample_ref: must be a JSON value that round-trips unchanged: {sample_ref!r}")
        if penalty is not None:
            require_finite(penalty, "penalty")
        penalised = (bool(step_timeout) and self.settings.step_timeout_penalty is not None) or penalty is not None
        self._pending.append(
            PendingDesignerSample(
                env_id=env_id,
                skill=skill,
                generated_step=step,
                sample_ref=sample_ref,
                hint_returns=_returns(hint_returns, "hint_returns",
                                      allow_empty=self.settings.failed_hint != "drop" or penalised),
                nohint_returns=_returns(nohint_returns, "nohint_returns", allow_empty=penalised),
                step_timeout=bool(step_timeout),
                penalty=None if penalty is None else float(penalty),
            )
        )

    def takes(self, hint_returns: Sequence[float], nohint_returns: Sequence[float], *,
              step_timeout: bool = False) -> bool:
        """Whether an environment with these plays of its generation step gets a designer sample:
        no-hint plays, and hinted ones unless ``failed_hint`` keeps a hintless environment; or, under
        ``step_timeout_penalty``, an environment that timed out, whatever was played of it (the
        released code penalises a hung game whose plays were all dropped)."""
        if step_timeout and self.settings.step_timeout_penalty is not None:
            return True
        return bool(nohint_returns) and (bool(hint_returns) or self.settings.failed_hint != "drop")

    def record_window_returns(self, step: int, env_id: str, returns: Sequence[float]) -> None:
        """Add no-hint returns of ``env_id`` played at ``step``, a later step of its window.

        ``step`` must satisfy ``s < step < s + k`` for the pending sample of ``env_id`` generated
        at ``s`` (KeyError otherwise). Repeated calls for one step accumulate.
        """
        Step(step)  # validates
        values = _returns(returns, "returns", allow_empty=True)
        for index, entry in enumerate(self._pending):
            if entry.env_id == env_id and Step(entry.generated_step).in_window(step, self.k):
                later = dict(entry.later_returns)
                later[step] = later.get(step, ()) + values
                later_returns = tuple(sorted(later.items()))
                self._pending[index] = dataclasses.replace(entry, later_returns=later_returns)
                return
        raise KeyError(f"no pending designer sample for env_id {env_id!r} whose window holds step {step}")

    def release(self, step: int) -> list[ReleasedDesignerSample]:
        """Remove and score every sample with ``generated_step + k <= step``.

        Ordered by generation step, then by order of :meth:`add`; the samples of one generation
        step are scored as one set (a stateful reward is updated once per set). A window missing
        some steps is scored on the plays recorded.
        """
        Step(step)  # validates
        return self._score([entry for entry in self._pending
                            if Step(entry.generated_step).release_step(self.k) <= step])

    def release_all(self) -> list[ReleasedDesignerSample]:
        """Remove and score every pending sample, windows closed or not (the run's last step under
        ``selfplay.batch.release_at_final_step``): each scored on the plays recorded so far."""
        return self._score(list(self._pending))

    def _score(self, due: list[PendingDesignerSample]) -> list[ReleasedDesignerSample]:
        if not due:
            return []
        self._pending = [entry for entry in self._pending if entry not in due]
        due.sort(key=lambda entry: entry.generated_step)  # stable: keeps add order within a step
        released: list[ReleasedDesignerSample] = []
        for generated in sorted({entry.generated_step for entry in due}):
            group = [entry for entry in due if entry.generated_step == generated]
            evidence = [entry.evidence() for entry in group]
            scored = [i for i, entry in enumerate(group) if entry.penalty is None]  # penalised: a fixed reward
            rewards: list[float] = [entry.penalty if entry.penalty is not None else 0.0 for entry in group]
            if scored:
                found = score_released(self.reward, [group[i].skill for i in scored], [evidence[i] for i in scored])
                for i, reward in zip(scored, found):
                    rewards[i] = reward
            released += [self._released(entry, e, r) for entry, e, r in zip(group, evidence, rewards)]
        return released

    def _released(self, entry: PendingDesignerSample, evidence: DesignerEvidence,
                  reward: float) -> ReleasedDesignerSample:
        steps = [entry.generated_step] + [step for step, returns in entry.later_returns if returns]
        return ReleasedDesignerSample(
            env_id=entry.env_id,
            skill=entry.skill,
            generated_step=entry.generated_step,
            reward=reward,
            win=evidence.win if evidence.window_returns else 0.0,  # none: a penalised timeout
            regret=evidence.regret if evidence.nohint_returns else 0.0,
            sample_ref=entry.sample_ref,
            n_window_plays=len(evidence.window_returns),
            window_steps=tuple(steps),
        )

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable snapshot: ``k``, the reward settings, the reward's state and every
        pending sample."""
        return {
            "version": _FORMAT_VERSION,
            "k": self.k,
            "settings": dataclasses.asdict(self.settings),
            "reward_state": self.reward_state,
            "pending": [entry.to_json() for entry in self._pending],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], settings: RewardSettings | None = None) -> "DesignerBuffer":
        """Rebuild a buffer from :meth:`to_json` (format 2, or 1 read back compatibly).

        Without ``settings`` the stored ``k`` and settings are restored. With ``settings`` (the
        resumed run's config) those are used from now on, pending samples included, so that a
        resume that changes the plateau band (a later training phase) scores with the new band;
        the reward they name must be the stored one (ValueError naming
        ``selfplay.rewards.designer_reward`` otherwise), because its state belongs to it.
        """
        version = data.get("version")
        stored = upgrade_reward_settings(data["settings"])  # older spades' key names in today's
        if version not in (1, _FORMAT_VERSION):
            raise ValueError(f"designer buffer version: expected 1 or {_FORMAT_VERSION}, got {version!r} "
                             "(written by a newer or unknown spade)")
        stored_settings = RewardSettings(**stored)
        if settings is not None and settings.designer_reward != stored_settings.designer_reward:
            raise ValueError(
                f"selfplay.rewards.designer_reward: the run was checkpointed with "
                f"{stored_settings.designer_reward!r}, the config says {settings.designer_reward!r}; "
                "a resumed run keeps its designer reward")
        buffer = cls(int(data["k"]), settings if settings is not None else stored_settings)
        buffer._pending = [PendingDesignerSample.from_json(entry) for entry in data["pending"]]
        reward_state = data.get("reward_state") or {}
        load_state_dict = getattr(buffer.reward, "load_state_dict", None)
        if load_state_dict is not None:
            load_state_dict(reward_state)
        elif reward_state:
            raise ValueError(f"reward_state: {stored_settings.designer_reward!r} keeps no state, got {reward_state!r}")
        return buffer


def _returns(values: Sequence[float], name: str, *, allow_empty: bool) -> tuple[float, ...]:
    if not allow_empty and len(values) == 0:
        raise ValueError(f"{name}: empty; at least one return is needed")
    return tuple(require_finite(v, name) for v in values)

