"""VAPO pieces (docs/algorithms/vapo.md): length-adaptive λ and decoupled GAE."""

import pytest
import torch

from baselines.core.gae import gae, gae_reference_loop
from baselines.vapo import length_adaptive_lambda


def test_length_adaptive_lambda():
    lam = length_adaptive_lambda(torch.tensor([10, 20, 40, 200]), 0.05)
    assert lam.tolist() == pytest.approx([0.0, 0.0, 0.5, 0.9])


def test_per_row_and_per_step_lambda_match_loop():
    g = torch.Generator().manual_seed(0)
    r = torch.randn(3, 40, generator=g, dtype=torch.float64)
    v = torch.randn(3, 40, generator=g, dtype=torch.float64)
    m = torch.rand(3, 40, generator=g) > 0.2
    lam_row = torch.tensor([0.0, 0.5, 0.9], dtype=torch.float64)
    a, _ = gae(r, v, m, gamma=0.99, lam=lam_row)
    for i in range(3):
        a_i, _ = gae_reference_loop(r[i : i + 1], v[i : i + 1], m[i : i + 1], gamma=0.99, lam=float(lam_row[i]))
        assert torch.allclose(a[i], a_i[0], atol=1e-10)
    # per-step λ: a loop with λ_t
    lam_step = torch.rand(3, 40, generator=g, dtype=torch.float64)
    a, _ = gae(r, v, m, gamma=0.99, lam=lam_step)
    ref = torch.zeros_like(r)
    for i in range(3):
        nv, run = 0.0, 0.0
        for t in reversed(range(40)):
            if not m[i, t]:
                continue
            run = r[i, t] + 0.99 * nv - v[i, t] + 0.99 * lam_step[i, t] * run
            nv = v[i, t]
            ref[i, t] = run
    assert torch.allclose(a, ref, atol=1e-10)
