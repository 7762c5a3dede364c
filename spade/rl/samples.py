"""The records that carry a rollout to the trainer: ``Trajectory`` and ``TrainSample``.

A **Trajectory** is what one rollout produced, in plain Python values (JSON round-trip exact, so
the delay buffer's designer samples survive a checkpoint): the token ids of the whole sequence,
the target-aligned loss mask (1 where the policy wrote the token), the engine's log-probs of
those tokens and the temperature they are taken at (``logprob_temperature``: the sampling
temperature, 1 for a greedy call, see ``spade.rollout.engine.SamplingParams.logprob_temperature``),
the engine weight version that generated them, for MoE models the engine's routed experts
(``routed_experts``, routing replay: ``spade.rl.routing_record``), and who and what it was: the role (agent or
designer), the environment, its skill, the reward and, once computed, the advantage.
Self-play builds trajectories; the trainer turns each into a ``TrainSample`` with
:meth:`Trajectory.to_train_sample`.

A **TrainSample** is one token sequence as tensors. Everything per token in it is aligned with the
*targets*: entry ``i`` of ``loss_mask``, of a per-token ``advantages`` array and of the log-prob
arrays describes ``token_ids[i + 1]`` (the token predicted at position ``i``), so those arrays are
one shorter than ``token_ids``. ``TrainSample.from_token_mask`` converts a mask over the tokens
themselves (1 = the policy produced this token) to that convention. Its ``temperature`` is the one
the trainer computes every log-prob of the sample at (old, new and reference), so that they
describe the distribution the tokens were drawn from, like the rollout log-probs they are compared
with.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence, Union

import torch
from torch import Tensor

from .routing_record import RoutedExperts


class Role(str, enum.Enum):
    """Which of the two roles of the shared policy wrote a trajectory."""

    AGENT = "agent"
    DESIGNER = "designer"


@dataclass(frozen=True)
class Trajectory:
    """One rollout's sequence and what it means (see the module docstring).

    ``reward``: the episode return (agent) or the designer reward released by the delay buffer
    (designer); None until known. ``advantage``: one value for the whole sequence, None until the
    step computes it. ``generated_step``: the step whose policy wrote it (designer samples are
    trained ``k`` steps later). ``index``: the play's number among its environment's plays.
    ``logprob_temperature``: the ``T`` of the distribution the tokens were drawn from and the
    rollout log-probs describe; None only for a record written before the field existed (read
    it with ``from_json(..., default_logprob_temperature=...)``).
    """

    token_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    rollout_logprobs: Optional[tuple[float, ...]] = None
    weight_version: Optional[int] = None
    logprob_temperature: Optional[float] = None
    role: Role = Role.AGENT
    env_id: str = ""
    skill: str = ""
    index: int = 0
    generated_step: Optional[int] = None
    reward: Optional[float] = None
    advantage: Optional[float] = None
    # Target-aligned weight version of each generated token (None entries: not generated), kept
    # only when the sample's generated tokens come from more than one version (a play carried
    # across steps by partial rollouts); None: every generated token is from ``weight_version``.
    token_weight_versions: Optional[tuple[Optional[int], ...]] = None
    # The rollout engine's routed experts (MoE models, asked for by ``loss.routing_replay:
    # rollout``): row i is the routing of token_ids[i], a prefix of the targets' length; None: not
    # recorded (``spade.rl.routing_record``).
    routed_experts: Optional[RoutedExperts] = None
    # How the sample enters a ``sample_mean`` loss (TrainSample.loss_weight / count_weight): 1 and
    # 1 but for the turn samples of one episode (spade.selfplay.plays.turn_samples.episode_weights).
    loss_weight: float = 1.0
    count_weight: int = 1

    def __post_init__(self) -> None:
        _check_weights(self.loss_weight, self.count_weight)
        object.__setattr__(self, "loss_weight", float(self.loss_weight))
        object.__setattr__(self, "token_ids", tuple(int(t) for t in self.token_ids))
        object.__setattr__(self, "loss_mask", tuple(int(m) for m in self.loss_mask))
        if self.rollout_logprobs is not None:
            object.__setattr__(self, "rollout_logprobs", tuple(float(x) for x in self.rollout_logprobs))
        object.__setattr__(self, "role", Role(self.role))
        if self.logprob_temperature is not None:
            if not float(self.logprob_temperature) > 0:
                raise ValueError(f"logprob_temperature must be > 0, got {self.logprob_temperature}")
            object.__setattr__(self, "logprob_temperature", float(self.logprob_temperature))
        if len(self.token_ids) and len(self.loss_mask) != len(self.token_ids) - 1:
            raise ValueError(f"loss_mask has {len(self.loss_mask)} entries, expected one per target "
                             f"({len(self.token_ids) - 1})")
        if self.token_weight_versions is not None:
            versions = tuple(None if v is None else int(v) for v in self.token_weight_versions)
            object.__setattr__(self, "token_weight_versions", versions)
            if len(versions) != len(self.loss_mask):
                raise ValueError(f"token_weight_versions has {len(versions)} entries, expected {len(self.loss_mask)}")
        if self.rollout_logprobs is not None and len(self.rollout_logprobs) != len(self.loss_mask):
            raise ValueError(f"rollout_logprobs has {len(self.rollout_logprobs)} entries, expected "
                             f"{len(self.loss_mask)}")
        if self.routed_experts is not None and self.routed_experts.num_tokens > len(self.loss_mask):
            raise ValueError(f"routed_experts covers {self.routed_experts.num_tokens} tokens, more than the "
                             f"{len(self.loss_mask)} the model runs on")

    @property
    def trainable(self) -> bool:
        """At least one target token and one loss token: something to learn from."""
        return len(self.token_ids) >= 2 and any(self.loss_mask)

    def replace(self, **changes: Any) -> "Trajectory":
        """A copy with ``changes`` (``reward``, ``advantage``, ``env_id`` ...) applied."""
        return dataclasses.replace(self, **changes)

    def to_train_sample(self) -> "TrainSample":
        if self.advantage is None:
            raise ValueError(f"trajectory of {self.env_id or 'an environment'} has no advantage yet")
        if self.logprob_temperature is None:
            raise ValueError(f"{self.role.value} trajectory of {self.env_id or 'an environment'} has no "
                             "logprob_temperature: the trainer would not know which distribution its tokens came "
                             "from (a record of an older version: load it with Trajectory.from_json(..., "
                             "default_logprob_temperature=<the role's sampling temperature>))")
        return TrainSample(token_ids=list(self.token_ids), loss_mask=list(self.loss_mask),
                           advantages=float(self.advantage),
                           rollout_logprobs=None if self.rollout_logprobs is None else list(self.rollout_logprobs),
                           weight_version=self.weight_version, temperature=self.logprob_temperature,
                           routed_experts=self.routed_experts, loss_weight=self.loss_weight,
                           count_weight=self.count_weight)

    def to_json(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["role"] = self.role.value
        for name in ("token_ids", "loss_mask", "rollout_logprobs"):
            if data[name] is not None:
                data[name] = list(data[name])
        if data["token_weight_versions"] is None:  # one version: the record is as before the field
            del data["token_weight_versions"]
        else:
            data["token_weight_versions"] = list(data["token_weight_versions"])
        for name in ("loss_weight", "count_weight"):  # the defaults: the record is as before the fields
            if data[name] == 1:
                del data[name]
        if self.routed_experts is None:  # not recorded: the record is as before the field
            del data["routed_experts"]
        else:
            data["routed_experts"] = self.routed_experts.to_json()
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any], *,
                  default_logprob_temperature: Optional[float] = None) -> "Trajectory":
        """The trajectory of ``to_json``. A record written before ``logprob_temperature`` existed
        lacks it: it gets ``default_logprob_temperature`` (the caller passes the configured
        sampling temperature of the record's role, which is what those versions sampled with)."""
        known = {f.name for f in dataclasses.fields(cls)}
        fields = {key: value for key, value in data.items() if key in known}
        if fields.get("logprob_temperature") is None:
            fields["logprob_temperature"] = default_logprob_temperature
        if fields.get("routed_experts") is not None:
            fields["routed_experts"] = RoutedExperts.from_json(fields["routed_experts"])
        return cls(**fields)


ArrayLike = Union[Sequence[float], Sequence[int], Tensor]


def _check_weights(loss_weight: float, count_weight: int) -> None:
    if not (isinstance(loss_weight, (int, float)) and 0.0 <= float(loss_weight) < float("inf")):
        raise ValueError(f"loss_weight must be a finite number >= 0, got {loss_weight!r}")
    if isinstance(count_weight, bool) or not isinstance(count_weight, int) or count_weight < 0:
        raise ValueError(f"count_weight must be an integer >= 0, got {count_weight!r}")


def _as_1d(value: ArrayLike, dtype: torch.dtype, name: str) -> Tensor:
    tensor = torch.as_tensor(value, dtype=dtype).detach().cpu()
    if tensor.dim() != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {tuple(tensor.shape)}")
    return tensor


@dataclass(frozen=True)
class TrainSample:
    """One sequence to train on (see the module docstring for the target alignment).

    ``advantages`` is a float (one value for the whole sequence) or a per-target array.
    ``old_logprobs`` (the policy before this update; computed by ``compute_logprobs`` when
    absent, or taken as the current log-probs, ratio 1), ``rollout_logprobs`` (the engine's, for
    truncated importance sampling) and ``ref_logprobs`` (reference policy, for the KL term) are
    optional per-target arrays. Arrays are stored as CPU tensors. ``weight_version`` is the
    oldest rollout-engine weight version that generated any of its tokens (None: unknown); the
    trainer reports how far behind the updated policy the samples are. ``temperature`` (> 0) is
    the ``T`` of ``softmax(logits / T)`` every trainer log-prob of the sample is computed at: the
    temperature its tokens were sampled with (1 for greedy), as in its ``rollout_logprobs``.

    ``loss_weight`` and ``count_weight`` (defaults 1.0 and 1) say how the sample enters a
    ``sample_mean`` loss (``spade.rl.loss.policy_loss``): its token mean times ``loss_weight`` is
    summed, and the step divides by the sum of ``count_weight`` over its samples. The turn samples
    of one episode (``selfplay.plays.sample_form: per_turn``) share one count and weigh their
    token means by their loss tokens, so the episode is one token mean over all its turns
    (``spade.selfplay.plays.turn_samples.episode_weights``). Other aggregations ignore both.
    """

    token_ids: ArrayLike
    loss_mask: ArrayLike
    advantages: Union[float, ArrayLike]
    old_logprobs: Optional[ArrayLike] = None
    rollout_logprobs: Optional[ArrayLike] = None
    ref_logprobs: Optional[ArrayLike] = None
    weight_version: Optional[int] = None
    temperature: float = 1.0
    routed_experts: Optional[Union[RoutedExperts, Tensor]] = None  # stored as int64 [n, layers, top_k]
    loss_weight: float = 1.0
    count_weight: int = 1

    def __post_init__(self) -> None:
        _check_weights(self.loss_weight, self.count_weight)
        object.__setattr__(self, "loss_weight", float(self.loss_weight))
        if not float(self.temperature) > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        object.__setattr__(self, "temperature", float(self.temperature))
        tokens = _as_1d(self.token_ids, torch.long, "token_ids")
        if tokens.numel() < 2:
            raise ValueError(f"a sample needs at least 2 tokens (one target), got {tokens.numel()}")
        if int(tokens.min()) < 0:
            raise ValueError("token_ids must be non-negative vocabulary ids")
        n = tokens.numel() - 1
        mask = _as_1d(self.loss_mask, torch.float32, "loss_mask")
        if mask.numel() != n:
            raise ValueError(
                f"loss_mask must have one entry per target (len(token_ids) - 1 = {n}), got "
                f"{mask.numel()}; use TrainSample.from_token_mask for a mask over the tokens"
            )
        if not torch.all((mask == 0) | (mask == 1)):
            raise ValueError("loss_mask entries must be 0 or 1")
        object.__setattr__(self, "token_ids", tokens)
        object.__setattr__(self, "loss_mask", mask)
        advantages = self.advantages
        if isinstance(advantages, Tensor) and advantages.dim() == 0:
            advantages = float(advantages)
        if isinstance(advantages, (int, float)):
            object.__setattr__(self, "advantages", float(advantages))
        else:
            adv = _as_1d(advantages, torch.float32, "advantages")
            if adv.numel() != n:
                raise ValueError(f"per-token advantages must have {n} entries (one per target), got {adv.numel()}")
            object.__setattr__(self, "advantages", adv)
        for name in ("old_logprobs", "rollout_logprobs", "ref_logprobs"):
            value = getattr(self, name)
            if value is None:
                continue
            array = _as_1d(value, torch.float32, name)
            if array.numel() != n:
                raise ValueError(f"{name} must have {n} entries (one per target), got {array.numel()}")
            object.__setattr__(self, name, array)
        routed = self.routed_experts
        if routed is not None:
            routed = routed.to_tensor() if isinstance(routed, RoutedExperts) else routed.detach().cpu().long()
            if routed.dim() != 3 or routed.shape[0] > n:
                raise ValueError(f"routed_experts must be [tokens <= {n}, layers, top_k], got {tuple(routed.shape)}")
            object.__setattr__(self, "routed_experts", routed)

    @classmethod
    def from_token_mask(
        cls,
        token_ids: ArrayLike,
        token_mask: ArrayLike,
        advantages: Union[float, ArrayLike],
        **logprobs: Optional[ArrayLike],
    ) -> "TrainSample":
        """Build from a mask over the tokens (1 = produced by the policy); the first token can
        never be a target, so its entry is dropped. Other arrays are already target-aligned."""
        mask = _as_1d(token_mask, torch.float32, "token_mask")
        return cls(token_ids=token_ids, loss_mask=mask[1:], advantages=advantages, **logprobs)

    @property
    def length(self) -> int:
        return int(self.token_ids.numel())  # type: ignore[union-attr]

    @property
    def num_targets(self) -> int:
        return self.length - 1

    @property
    def num_loss_tokens(self) -> int:
        return int(self.loss_mask.sum())  # type: ignore[union-attr]
