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


def test_nucleus_log_probs_renormalise_over_the_sampler_nucleus():
    """`nucleus_token_logprobs` is the log-prob of the distribution `agents.lm.generation` draws from at that top-p:
    the kept tokens' probabilities renormalised; a token that is its whole nucleus has log-prob 0 and no gradient;
    at top_p = 1 it is the whole softmax."""
    from agents.lm.generation import _top_p_filter
    from baselines.core.losses import nucleus_token_logprobs, token_logprobs

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 50, generator=g) * 2
    logits[0, 7] = 20.0  # row 0: one token holds nearly all the mass, its own nucleus
    labels = torch.tensor([7, 3, 11, 0, 49, 25])
    for top_p in (0.5, 0.8, 0.95):
        ref = torch.log_softmax(_top_p_filter(logits, top_p), -1)
        inside = torch.isfinite(ref.gather(-1, labels[:, None]).squeeze(-1))
        got = nucleus_token_logprobs(logits, labels, top_p)
        assert torch.allclose(got[inside], ref.gather(-1, labels[:, None]).squeeze(-1)[inside], atol=1e-5)
        assert torch.isfinite(got).all()  # a label outside the nucleus is counted in, never −∞
        assert got[0].item() == 0.0
    assert torch.allclose(nucleus_token_logprobs(logits, labels, 1.0), token_logprobs(logits, labels))
    x = logits.clone().requires_grad_(True)
    nucleus_token_logprobs(x, labels, 0.8)[0].backward()
    assert x.grad is not None and float(x.grad[0].abs().max()) == 0.0
    y = logits.clone().requires_grad_(True)
    token_logprobs(y, labels)[0].backward()  # the whole softmax still pushes the sure token (by 1 − p, tiny here)
    assert y.grad is not None and float(y.grad[0].abs().sum()) > 0


def test_nucleus_log_probs_make_the_trainer_recompute_pi_old():
    import baselines

    kw = dict(env_id="shopsim/Shopping-v0", temperature=1.0)
    assert baselines.make("grpo", **kw, top_p=0.8, logprob_nucleus=True).config.recomputes_old_logp
    assert not baselines.make("grpo", **kw, top_p=0.8).config.recomputes_old_logp
    assert not baselines.make("grpo", **kw, top_p=1.0, logprob_nucleus=True).config.recomputes_old_logp
