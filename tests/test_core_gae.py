"""GAE against hand-computed values, the reference loop, and turn-level == token-level (docs/algorithms/core.md)."""

import pytest
import torch

from baselines.core.gae import (
    discounted_reverse_cumsum,
    gae,
    gae_reference_loop,
    place_at_turn_ends,
    token_gae,
    turn_gae,
)


def test_gae_hand_computed_terminal():
    r = torch.tensor([[0.0, 0.0, 1.0]])
    v = torch.tensor([[0.5, 0.6, 0.7]])
    m = torch.ones(1, 3)
    adv, ret = gae(r, v, m, gamma=0.9, lam=0.8)
    # δ = [0.9*0.6-0.5, 0.9*0.7-0.6, 1-0.7] = [0.04, 0.03, 0.3]; γλ = 0.72
    expected = torch.tensor([[0.04 + 0.72 * (0.03 + 0.72 * 0.3), 0.03 + 0.72 * 0.3, 0.3]])
    assert torch.allclose(adv, expected, atol=1e-6)
    assert torch.allclose(ret, expected + v, atol=1e-6)


def test_gae_truncation_bootstrap():
    r = torch.tensor([[0.0, 0.0, 1.0]])
    v = torch.tensor([[0.5, 0.6, 0.7]])
    adv, _ = gae(r, v, torch.ones(1, 3), gamma=0.9, lam=0.8, last_value=torch.tensor([2.0]))
    # δ2 = 1 + 0.9*2 - 0.7 = 2.1
    assert torch.allclose(adv, torch.tensor([[0.04 + 0.72 * (0.03 + 0.72 * 2.1), 0.03 + 0.72 * 2.1, 2.1]]), atol=1e-6)


def test_gae_skips_env_tokens():
    # generated, env, env, generated: env tokens carry next value and running advantage unchanged
    r = torch.tensor([[0.0, 5.0, 5.0, 1.0]])
    v = torch.tensor([[0.5, 9.0, 9.0, 0.7]])
    m = torch.tensor([[1, 0, 0, 1]])
    adv, ret = token_gae(r, v, m, gamma=0.9, lam=0.8)
    assert torch.allclose(adv, torch.tensor([[0.13 + 0.72 * 0.3, 0.0, 0.0, 0.3]]), atol=1e-6)
    assert ret[0, 1] == 0 and ret[0, 2] == 0


def test_gae_trailing_padding_and_empty_row():
    r = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    v = torch.tensor([[0.25, 3.0, 3.0], [1.0, 1.0, 1.0]])
    m = torch.tensor([[1, 0, 0], [0, 0, 0]])
    adv, _ = gae(r, v, m, gamma=1.0, lam=1.0, last_value=torch.tensor([0.5, 7.0]))
    assert torch.allclose(adv, torch.tensor([[1.25, 0.0, 0.0], [0.0, 0.0, 0.0]]))


@pytest.mark.parametrize("T,block", [(1, 4), (7, 4), (64, 16), (130, 32), (257, 64)])
def test_gae_matches_reference_loop(T, block):
    g = torch.Generator().manual_seed(T)
    B = 5
    r = torch.randn(B, T, generator=g, dtype=torch.float64)
    v = torch.randn(B, T, generator=g, dtype=torch.float64)
    m = torch.rand(B, T, generator=g) > 0.3
    lv = torch.randn(B, generator=g, dtype=torch.float64)
    a, ret = gae(r, v, m, gamma=0.97, lam=0.9, last_value=lv, block=block)
    a2, ret2 = gae_reference_loop(r, v, m, gamma=0.97, lam=0.9, last_value=lv)
    assert torch.allclose(a, a2, atol=1e-10)
    assert torch.allclose(ret, ret2, atol=1e-10)


def test_discounted_cumsum_per_row_decay():
    x = torch.tensor([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]])
    y = discounted_reverse_cumsum(x, torch.tensor([0.5, 0.0]), block=2)
    assert torch.allclose(y, torch.tensor([[1 + 0.5 * 2 + 0.25 * 3, 2 + 0.5 * 3, 3.0], [1.0, 2.0, 3.0]]))
    # long sequences with small decay must not overflow (no c^-t trick)
    z = discounted_reverse_cumsum(torch.ones(1, 5000), 0.5)
    assert torch.isfinite(z).all() and torch.allclose(z[0, :10], torch.full((10,), 2.0))


def test_turn_gae_equals_token_gae_one_token_turns():
    g = torch.Generator().manual_seed(1)
    r = torch.randn(3, 6, generator=g)
    v = torch.randn(3, 6, generator=g)
    m = torch.ones(3, 6)
    lv = torch.tensor([0.0, 1.0, -2.0])
    a_turn, _ = turn_gae(r, v, m, gamma=1.0, lam=0.8, last_value=lv)
    # token layout: each turn's single generated token followed by two env tokens
    rt = torch.zeros(3, 18)
    vt = torch.zeros(3, 18)
    mt = torch.zeros(3, 18)
    rt[:, ::3], vt[:, ::3], mt[:, ::3] = r, v, 1
    vt[:, 1::3] = 42.0  # env tokens' values must be ignored
    a_tok, _ = token_gae(rt, vt, mt, gamma=1.0, lam=0.8, last_value=lv)
    assert torch.allclose(a_tok[:, ::3], a_turn, atol=1e-6)


def test_place_at_turn_ends():
    gen = torch.tensor([[0, 1, 1, 0, 0, 1, 1, 1, 0]])
    ti = torch.tensor([[0, 0, 0, 0, 0, 1, 1, 1, 0]])
    tr = torch.tensor([[0.5, 2.0]])
    out = place_at_turn_ends(tr, ti, gen)
    assert out.tolist() == [[0, 0, 0.5, 0, 0, 0, 0, 2.0, 0]]
