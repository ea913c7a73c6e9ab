"""Loss aggregation modes, clipped surrogate, KL estimators, entropy (docs/algorithms/core.md)."""

import math

import pytest
import torch

from baselines.core.losses import aggregate, clipped_surrogate, entropy_from_logits, kl_term, token_logprobs, value_loss

L = torch.tensor([[1.0, 2.0, 3.0, 9.0], [4.0, 9.0, 9.0, 9.0]])
M = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])


def test_aggregate_modes_hand_computed():
    assert aggregate(L, M, "token-mean").item() == pytest.approx(10 / 4)
    assert aggregate(L, M, "seq-mean-token-mean").item() == pytest.approx((2 + 4) / 2)
    assert aggregate(L, M, "seq-mean-token-sum").item() == pytest.approx((6 + 4) / 2)
    assert aggregate(L, M, "seq-mean-token-sum-norm").item() == pytest.approx(10 / (2 * 4))
    assert aggregate(L, M, "seq-mean-token-sum-norm", const_len=5).item() == pytest.approx(1.0)
    # global normalisers for micro-batching
    assert aggregate(L, M, "token-mean", num_tokens=8).item() == pytest.approx(10 / 8)
    # window mode: rows 0 and 1 are turns of one trajectory
    assert aggregate(L, M, "seq-mean-token-mean", seq_index=torch.tensor([0, 0])).item() == pytest.approx(10 / 4)
    with pytest.raises(ValueError, match="token-mean"):
        aggregate(L, M, "sum")


def test_clipped_surrogate_hand_computed():
    old = torch.zeros(1, 4)
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.1, 0.5]]))
    adv = torch.tensor([[1.0, -1.0, 1.0, 1.0]])
    loss, st = clipped_surrogate(logp, old, adv, torch.ones(1, 4), 0.2, 0.28)
    # ρ=1.5,A>0 -> clip at 1.28; ρ=0.5,A<0 -> min(-0.5, -0.8) = -0.8; ρ=1.1 unclipped; ρ=0.5,A>0 -> 0.5
    assert loss[0].tolist() == pytest.approx([-1.28, 0.8, -1.1, -0.5], abs=1e-6)
    assert st["clipfrac"].item() == pytest.approx(0.5)
    # dual clip bounds the loss of a huge ratio on a negative advantage
    loss, st = clipped_surrogate(torch.log(torch.tensor([[10.0]])), torch.zeros(1, 1), torch.tensor([[-1.0]]),
                                 torch.ones(1, 1), 0.2, 0.2, dual_clip=3.0)
    assert loss.item() == pytest.approx(3.0) and st["clipfrac_dual"].item() == 1.0


def test_kl_estimators():
    logp = torch.tensor([math.log(0.5)])
    ref = torch.tensor([math.log(0.25)])
    assert kl_term(logp, ref, "k1").item() == pytest.approx(math.log(2))
    assert kl_term(logp, ref, "k3").item() == pytest.approx(0.5 - math.log(0.5) - 1)
    assert kl_term(ref, ref, "k3").item() == 0.0


def test_entropy_and_logprobs():
    logits = torch.log(torch.tensor([[[0.5, 0.25, 0.25], [1.0, 1e-30, 1e-30]]]))
    h = entropy_from_logits(logits, chunk=1)
    assert h[0, 0].item() == pytest.approx(-(0.5 * math.log(0.5) + 0.5 * math.log(0.25)), abs=1e-6)
    assert h[0, 1].item() == pytest.approx(0.0, abs=1e-5)
    lp = token_logprobs(logits, torch.tensor([[1, 0]]))
    assert lp[0].tolist() == pytest.approx([math.log(0.25), 0.0], abs=1e-6)


def test_value_loss_clip():
    v = torch.tensor([2.0])
    old = torch.tensor([0.0])
    ret = torch.tensor([0.0])
    loss, c = value_loss(v, old, ret, clip=0.5)
    assert loss.item() == pytest.approx(2.0) and not c.item()
    loss, c = value_loss(torch.tensor([0.0]), torch.tensor([2.0]), torch.tensor([0.0]), clip=0.5)
    assert loss.item() == pytest.approx(0.5 * 1.5 ** 2) and c.item()


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("seq", [None, torch.tensor([0, 0])])
def test_aggregation_weights_match_aggregate(mode, seq):
    from baselines.core.losses import aggregation_weights

    w = aggregation_weights(M, mode, seq_index=seq)
    assert (w * L).sum().item() == pytest.approx(aggregate(L, M, mode, seq_index=seq).item())
