"""GRPO advantages on hand examples (docs/algorithms/grpo.md)."""

import pytest
import torch

from baselines.grpo import GRPOConfig, grpo_advantages, zero_variance_share
from shopsim.errors import ConfigError


def test_group_scale_hand_example():
    R = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.5])
    g = torch.tensor([0, 0, 0, 0, 1, 1, 2])
    A = grpo_advantages(R, g, scale="group", eps=1e-9)
    std0 = 0.5  # unbiased std of (1, 0, 0, 0) = sqrt(0.25*... ) -> var = (0.5625 + 3*0.0625)/3 = 0.25
    assert A[:4].tolist() == pytest.approx([0.75 / std0, -0.25 / std0, -0.25 / std0, -0.25 / std0])
    assert A[4:6].tolist() == [0.0, 0.0]  # zero-variance group
    assert A[6].item() == 0.0  # singleton
    assert zero_variance_share(R, g) == pytest.approx(2 / 3)  # groups 1 (all equal) and 2 (singleton)


def test_no_std_and_batch_scale():
    R = torch.tensor([1.0, 0.0, 3.0, 1.0])
    g = torch.tensor([0, 0, 1, 1])
    assert grpo_advantages(R, g, scale="none").tolist() == [0.5, -0.5, 1.0, -1.0]
    A = grpo_advantages(R, g, scale="batch", eps=0.0)
    assert A.tolist() == pytest.approx((torch.tensor([0.5, -0.5, 1.0, -1.0]) / R.std()).tolist())


def test_rows_statistics_weigh_long_trajectories():
    R = torch.tensor([1.0, 0.0])
    g = torch.tensor([0, 0])
    # trajectory 0 has 3 turns, trajectory 1 has 1: row mean = 0.75
    A = grpo_advantages(R, g, scale="none", weights=torch.tensor([3, 1]))
    assert A.tolist() == pytest.approx([0.25, -0.75])


def test_config_validation():
    with pytest.raises(ConfigError, match="scale_rewards"):
        GRPOConfig(scale_rewards="x")
    with pytest.raises(ConfigError, match="loss_agg"):
        GRPOConfig(loss_agg="sum")
