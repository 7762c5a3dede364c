"""Per-token weight versions (issue 26): a play finished under newer weights records which version
generated each target token; a one-version play's record is unchanged (no new key)."""

from __future__ import annotations

from chat_templates import CHATML, bpe_tokenizer
from spade.rl.samples import Trajectory
from spade.rollout.conversation import Conversation
from spade.selfplay.trajectories import trajectory_of

OPENING = [{"role": "system", "content": "Play the game."}, {"role": "user", "content": "You see a cat."}]


def _ids(tok, text):
    return list(tok(text, add_special_tokens=False)["input_ids"])


def _two_turns(tok, first_version, second_version):
    conv = Conversation(tok, OPENING, max_context_tokens=4096)
    conv.append_generated(_ids(tok, "one<|im_end|>"), weight_version=first_version)
    conv.append_message("user", "two")
    conv.append_generated(_ids(tok, "three<|im_end|>"), weight_version=second_version)
    return conv


def test_mixed_versions_are_kept_per_token_and_round_trip():
    tok = bpe_tokenizer(CHATML)
    conv = _two_turns(tok, 3, 4)
    traj = trajectory_of(conv, logprob_temperature=1.0)
    mask = conv.loss_mask
    tokens = conv.token_ids
    first_len, second_len = len(_ids(tok, "one<|im_end|>")), len(_ids(tok, "three<|im_end|>"))
    # by hand from the layout: prompt..., reply one, observation..., reply three (target-aligned: drop id 0)
    first_start = mask.index(1)
    second_start = len(tokens) - second_len
    expected = [None] * len(tokens)
    expected[first_start:first_start + first_len] = [3] * first_len
    expected[second_start:] = [4] * second_len
    assert traj.token_weight_versions == tuple(expected[1:])
    assert traj.weight_version == 3
    assert Trajectory.from_json(traj.to_json()) == traj


def test_one_version_leaves_the_record_as_before():
    tok = bpe_tokenizer(CHATML)
    traj = trajectory_of(_two_turns(tok, 5, 5), logprob_temperature=1.0)
    assert traj.token_weight_versions is None
    assert "token_weight_versions" not in traj.to_json()
    assert Trajectory.from_json(traj.to_json()) == traj
