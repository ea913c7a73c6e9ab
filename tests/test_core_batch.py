"""The training batch in both context modes (docs/design.md): masks, layouts, slots for later algorithms."""

import pytest
import torch

from baselines.core.advantages import token_gae_for_batch, token_rewards_tt, turn_returns_to_go
from baselines.core.batch import build_batch, detect_mode
from baselines.gigpo import batch_anchors
from shopsim.errors import ConfigError
from shopsim.rollout import collect
from shopsim.trajectory import Trajectory, Turn
from tests.fixtures.toy_lm import ToyLMAgent, env_fns


def _hand_concat():
    # turn 0: prompt [1,2], action [5,6]; turn 1: prompt [1,2,5,6,3] (+ env token 3), action [7]
    t0 = Turn("o0", "a0", reward=0.0, prompt_ids=[1, 2], action_ids=[5, 6], action_logprobs=[-0.1, -0.2],
              hidden={"last": [1.0, 2.0]}, extra={"anchor": "A"})
    t1 = Turn("o1", "a1", reward=1.0, terminated=True, info={"success": True}, prompt_ids=[1, 2, 5, 6, 3],
              action_ids=[7], action_logprobs=[-0.3], hidden={"last": [3.0, 4.0]}, extra={"anchor": "B"})
    return Trajectory("x", task_id=4, group_id=9, strategy="ask", turns=[t0, t1])


def test_concat_hand_example():
    b = build_batch([_hand_concat()], pad_id=0)
    assert b.mode == "concat"
    assert b.input_ids.tolist() == [[1, 2, 5, 6, 3, 7]]
    assert b.gen_mask.tolist() == [[False, False, True, True, False, True]]
    assert b.turn_index.tolist() == [[-1, -1, 0, 0, -1, 1]]
    assert b.old_logp[0].tolist() == pytest.approx([0, 0, -0.1, -0.2, 0, -0.3])
    assert b.turn_rewards.tolist() == [[0.0, 1.0]] and b.success.tolist() == [1.0]
    assert batch_anchors(b) == [["A", "B"]]
    assert b.turn_hidden["last"].tolist() == [[[1.0, 2.0], [3.0, 4.0]]]
    assert b.strategy_keys == ["ask"] and b.task_keys == [4]
    # trajectory-token layout: generated tokens in order
    assert b.to_traj_tokens(b.input_ids).tolist() == [[5, 6, 7]]
    assert token_rewards_tt(b).tolist() == [[0.0, 0.0, 1.0]]
    assert b.turn_starts().tolist() == [[2, 5]]


def test_window_hand_example_and_mode_detection():
    tr = _hand_concat()
    tr.turns[1].prompt_ids = [9, 3]  # rebuilt prompt: not a prefix extension
    assert detect_mode([tr]) == "window"
    b = build_batch([tr])
    assert b.mode == "window" and b.input_ids.tolist() == [[1, 2, 5, 6], [9, 3, 7, 0]]
    assert b.row_traj.tolist() == [0, 0] and b.row_turn.tolist() == [0, 1]
    assert b.to_traj_tokens(b.input_ids).tolist() == [[5, 6, 7]]
    # forced concat: the episode is split where its context was cut, each row exactly what the model saw
    bc = build_batch([tr], mode="concat")
    assert bc.input_ids.tolist() == [[1, 2, 5, 6], [9, 3, 7, 0]] and bc.row_turn.tolist() == [0, 1]


def test_concat_splits_only_the_cut_episode():
    """A concat batch with one truncated episode: that episode becomes two segment rows, the others stay one."""
    cut = _hand_concat()
    cut.turns.append(Turn("o2", "a2", reward=0.5, prompt_ids=[1, 2, 8], action_ids=[4, 4],
                          action_logprobs=[-0.4, -0.5]))  # system prompt + a cut history
    b = build_batch([_hand_concat(), cut])
    assert b.mode == "concat"
    assert b.input_ids.tolist() == [[1, 2, 5, 6, 3, 7], [1, 2, 5, 6, 3, 7], [1, 2, 8, 4, 4, 0]]
    assert b.row_traj.tolist() == [0, 1, 1] and b.row_turn.tolist() == [0, 0, 2]
    assert b.to_traj_tokens(b.input_ids).tolist() == [[5, 6, 7, 0, 0], [5, 6, 7, 4, 4]]
    want = torch.tensor([[-0.1, -0.2, -0.3, 0, 0], [-0.1, -0.2, -0.3, -0.4, -0.5]])
    assert torch.allclose(b.to_traj_tokens(b.old_logp), want)
    assert b.turn_index[2].tolist() == [-1, -1, -1, 2, 2, -1]


def test_layout_roundtrip_and_broadcasts():
    b = build_batch([_hand_concat(), _hand_concat()])
    x = torch.randn(b.input_ids.shape) * b.gen_mask
    assert torch.equal(b.from_traj_tokens(b.to_traj_tokens(x)), x)
    tv = b.turn_to_tokens(torch.tensor([[10.0, 20.0], [30.0, 40.0]]))
    assert tv[0].tolist() == [0, 0, 10, 10, 0, 20] and tv[1].tolist() == [0, 0, 30, 30, 0, 40]
    assert turn_returns_to_go(b, 0.5).tolist() == [[0.5, 1.0], [0.5, 1.0]]


def test_concat_and_window_give_the_same_advantages():
    """The same episodes recorded in both modes: identical generated tokens, rewards and token GAE."""
    import copy

    kw = dict(seeds=[1, 2, 3], group_size=2, env_fns=env_fns(), progress=False, num_envs=2)
    tc = collect("toy", ToyLMAgent(context_mode="concat"), **kw)
    tw = copy.deepcopy(tc)
    for tr in tw:  # the same episodes with rebuilt (windowed) prompts
        for t in tr.turns:
            t.prompt_ids = [11] + t.prompt_ids[-2:]
    bc, bw = build_batch(tc), build_batch(tw)
    assert bc.mode == "concat" and bw.mode == "window"
    assert torch.equal(bc.to_traj_tokens(bc.input_ids), bw.to_traj_tokens(bw.input_ids))
    assert torch.equal(bc.turn_rewards, bw.turn_rewards)
    g = torch.Generator().manual_seed(0)
    v_tt = torch.randn(bc.traj_tok_index.shape, generator=g) * bc.traj_tok_mask
    ac, _ = token_gae_for_batch(bc, bc.from_traj_tokens(v_tt), gamma=0.99, lam=0.9)
    aw, _ = token_gae_for_batch(bw, bw.from_traj_tokens(v_tt), gamma=0.99, lam=0.9)
    assert torch.allclose(bc.to_traj_tokens(ac), bw.to_traj_tokens(aw), atol=1e-6)


def test_missing_ids_is_a_clear_error():
    with pytest.raises(ConfigError, match="LM agent"):
        build_batch([Trajectory("x", turns=[Turn("o", "a")])])
