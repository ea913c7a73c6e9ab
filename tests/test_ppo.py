"""LM PPO's token-level GAE on a hand batch (docs/algorithms/ppo.md)."""

import pytest
import torch

from baselines.core.advantages import token_gae_for_batch
from baselines.core.batch import build_batch
from shopsim.trajectory import Trajectory, Turn


def test_token_gae_on_concat_batch_skips_env_tokens():
    t0 = Turn("o", "a", reward=0.5, prompt_ids=[1], action_ids=[5, 6], action_logprobs=[0.0, 0.0])
    t1 = Turn("o", "a", reward=1.0, terminated=True, prompt_ids=[1, 5, 6, 3, 3], action_ids=[7],
              action_logprobs=[0.0])
    b = build_batch([Trajectory("x", turns=[t0, t1])])
    values = torch.tensor([[9.0, 0.2, 0.4, 9.0, 9.0, 0.8]])  # env/prompt values are ignored
    adv, ret = token_gae_for_batch(b, values, gamma=1.0, lam=1.0)
    # rewards on turn ends: token 6 gets 0.5, token 7 gets 1.0; γ = λ = 1 -> A_t = return-to-go − V_t
    assert adv[0].tolist() == pytest.approx([0, 1.5 - 0.2, 1.5 - 0.4, 0, 0, 1.0 - 0.8])
    assert ret[0].tolist() == pytest.approx([0, 1.5, 1.5, 0, 0, 1.0])
    adv, _ = token_gae_for_batch(b, values, gamma=0.5, lam=0.5)
    d7 = 1.0 - 0.8
    d6 = 0.5 + 0.5 * 0.8 - 0.4
    d5 = 0.0 + 0.5 * 0.4 - 0.2
    assert adv[0, 5].item() == pytest.approx(d7)
    assert adv[0, 2].item() == pytest.approx(d6 + 0.25 * d7)
    assert adv[0, 1].item() == pytest.approx(d5 + 0.25 * (d6 + 0.25 * d7))
