"""GiGPO advantages on hand examples, including singleton anchor groups (docs/algorithms/gigpo.md)."""

import pytest
import torch

from baselines.core.gae import discounted_reverse_cumsum
from baselines.gigpo import gigpo_advantages, similarity_clusters


def test_episode_plus_anchor_step_advantages():
    # one task group of 3 rollouts; turn rewards (γ = 0.5 for easy arithmetic)
    r = torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0]])
    R = (r * mask).sum(1)  # [1, 0, 0]
    Rk = discounted_reverse_cumsum(r, 0.5) * mask  # [[0.5, 1], [0, 0], [0, 0]]
    anchors = [["start", "page-a"], ["start", "page-a"], ["start", "pad"]]
    A, m = gigpo_advantages(R, Rk, mask, torch.tensor([0, 0, 0]), anchors, mode="mean_norm", w=1.0)
    AE = torch.tensor([2 / 3, -1 / 3, -1 / 3])
    # anchor "start": step returns [0.5, 0, 0], mean 1/6; anchor "page-a": [1, 0], mean 0.5; "pad" is never valid
    AS = torch.tensor([[0.5 - 1 / 6, 0.5], [-1 / 6, -0.5], [-1 / 6, 0.0]])
    assert torch.allclose(A, (AE[:, None] + AS) * mask, atol=1e-6)
    assert m["anchor_singleton_share"] == 0.0 and m["anchor_group_size"] == pytest.approx(2.5)


def test_singleton_anchor_group_gets_zero_step_advantage():
    r = torch.tensor([[0.0, 1.0], [0.0, 0.0]])
    mask = torch.ones(2, 2)
    Rk = discounted_reverse_cumsum(r, 0.95)
    anchors = [["start", "unique-x"], ["start", "unique-y"]]
    A, m = gigpo_advantages(r.sum(1), Rk, mask, torch.tensor([0, 0]), anchors, w=1.0)
    AE = torch.tensor([0.5, -0.5])
    # second step: singleton anchors -> A^S = 0, only the episode term remains
    assert A[:, 1].tolist() == pytest.approx(AE.tolist())
    assert A[0, 0].item() == pytest.approx(0.5 + (0.95 - 0.475))
    assert m["anchor_singleton_share"] == pytest.approx(2 / 3)


def test_anchor_groups_do_not_cross_task_groups():
    r = torch.tensor([[1.0], [0.0]])
    A, m = gigpo_advantages(r.sum(1), r.clone(), torch.ones(2, 1), torch.tensor([0, 1]), [["s"], ["s"]])
    assert A.tolist() == [[0.0], [0.0]]  # both episode and anchor groups are singletons
    assert m["anchor_singleton_share"] == 1.0


def test_mean_std_mode_and_similarity():
    r = torch.tensor([[2.0], [0.0]])
    A, _ = gigpo_advantages(r.sum(1), r.clone(), torch.ones(2, 1), torch.tensor([0, 0]), [["s"], ["s"]],
                            mode="mean_std_norm")
    s = 2 ** 0.5
    assert A[:, 0].tolist() == pytest.approx([2 / s, -2 / s], rel=1e-5)
    assert similarity_clusters(["search shoes red", "search shoes red!", "cart"], 0.9) == [0, 0, 1]
