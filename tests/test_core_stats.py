"""Masked and group statistics (docs/algorithms/core.md)."""

import pytest
import torch

from baselines.core.stats import (
    explained_variance,
    group_index,
    group_normalize,
    group_stats,
    leave_one_out_mean,
    masked_mean,
    masked_var,
    masked_whiten,
)


def test_masked_mean_var():
    x = torch.tensor([[1.0, 2.0, 100.0], [3.0, 100.0, 100.0]])
    m = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert masked_mean(x, m).item() == pytest.approx(2.0)
    assert masked_mean(x, m, dim=1).tolist() == pytest.approx([1.5, 3.0])
    assert masked_var(x, m).item() == pytest.approx(1.0)  # unbiased var of 1, 2, 3
    assert masked_var(x, m, unbiased=False).item() == pytest.approx(2 / 3)
    w = masked_whiten(x, m)
    assert w[0, 2] == 0 and w[1, 1] == 0
    assert w[0].tolist()[:2] == pytest.approx([-1.0, 0.0], abs=1e-6)


def test_group_normalize_hand_example():
    R = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 7.0])
    keys = ["a", "a", "b", "b", "b", "c"]
    A = group_normalize(R, keys, mode="mean")
    assert A.tolist() == pytest.approx([0.5, -0.5, -0.5, 0.5, 0.0, 0.0])
    A = group_normalize(R, keys, mode="mean_std", eps=0.0)
    s = 0.5 ** 0.5  # unbiased std of (1, 0) and of (0, 1, 0.5)
    assert A.tolist() == pytest.approx([0.5 / s, -0.5 / s, -1.0, 1.0, 0.0, 0.0], abs=1e-6)
    # singleton group: zero by default, raw reward in verl's convention
    assert group_normalize(R, keys, singleton="raw")[5].item() == pytest.approx(7.0)


def test_group_index_and_stats():
    ids, uniq = group_index([("t1", "ask"), ("t1", "direct"), ("t1", "ask")])
    assert ids.tolist() == [0, 1, 0] and uniq[1] == ("t1", "direct")
    mean, std, cnt = group_stats(torch.tensor([1.0, 5.0, 3.0]), ids)
    assert mean.tolist() == [2.0, 5.0, 2.0] and cnt.tolist() == [2, 1, 2]
    assert std[1].item() == 0.0


def test_leave_one_out():
    b = leave_one_out_mean(torch.tensor([1.0, 2.0, 6.0, 4.0]), torch.tensor([0, 0, 0, 1]))
    assert b.tolist() == pytest.approx([4.0, 3.5, 1.5, 0.0])


def test_explained_variance():
    t = torch.tensor([1.0, 2.0, 3.0])
    assert explained_variance(t, t) == pytest.approx(1.0)
    assert explained_variance(torch.zeros(3), t) == pytest.approx(1.0 - 1.0)  # Var(t-0)/Var(t) = 1


def test_tied_group_gets_exactly_zero_advantage():
    """Six rewards of 0.3: the float mean is not exactly 0.3, and (R − mean)/(std + 1e-6) used to give every member
    the same advantage of about +0.03 (and std > 0 hid the group from the zero-variance count)."""
    from baselines.core.stats import group_normalize, group_stats

    r = torch.tensor([0.3] * 6 + [0.0, 1.0], dtype=torch.float32)
    g = torch.tensor([0] * 6 + [1, 1])
    assert float(r[:6].sum() / 6) != 0.3  # the rounding the fix guards against
    mean, std, _ = group_stats(r, g)
    assert torch.equal(std[:6], torch.zeros(6)) and torch.equal(mean[:6], r[:6])
    a = group_normalize(r, g, "mean_std")
    assert torch.equal(a[:6], torch.zeros(6))
    assert a[6] == pytest.approx(-1 / (2 ** 0.5 + 1e-6)) and a[7] == pytest.approx(1 / (2 ** 0.5 + 1e-6))
