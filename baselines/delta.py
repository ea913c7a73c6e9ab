"""DelTA for the Shopping LM agent (docs/algorithms/delta.md).

Zhang, Wu, Lin, "DelTA: Discriminative Token Credit Assignment for RLVR", arXiv 2605.21467; reference code
RUCBM/DelTA (a verl fork on the DAPO recipe), whose equations this module follows. A sequence-level update acts like
a linear discriminator over per-token gradient vectors; DelTA reweights each token by how much nearer it lies to its
own side's centroid than to the opposite side's, so that patterns shared by good and bad answers count less.

Once per step, under no_grad, over the whole rollout batch, before the update:

    h_{i,t} = final hidden state fed to the LM head, at the position that predicts y_t (p − 1 for the token at p)
    p_{i,t} = π_old(y_t | prefix)
    v_{i,t} = (1 − p_{i,t})·h_{i,t}          (the gradient of log p_y w.r.t. the LM-head row of y; option v = h)
    A_i     = DAPO's GRPO sequence advantage; P = tokens with A > 0, N = tokens with A < 0
    μ+ = Σ_P A·v / Σ_P A ;  μ− = Σ_N |A|·v / Σ_N |A|
    d± = ||v − μ±||² ;  m = λ_w·d− − d+ on P,  λ_w·d+ − d− on N ;  γ± = γ_time·std(m) per side
    K passes: s = σ(m/γ); μ±* = Σ s·|A|·v / Σ s·|A| per side; d±, m, γ± recomputed from μ±*
    λ = λ_min + (λ_max − λ_min)·σ(m/γ)   (λ_min where A = 0);  λ ← λ·(#valid tokens)/Σλ;  Ã = A·λ

then DAPO's loss with Ã (clip 0.2 / 0.28, dual clip 10, token-mean, no KL), dynamic sampling off.

Multi-turn [derived]: A_i is the trajectory's advantage on every generated token of every turn.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from baselines.core.batch import Batch
from baselines.core.trainer import Advantages, Ctx, forward_policy
from baselines.dapo import DAPO, DAPOConfig
from shopsim.configs import bounded
from shopsim.errors import ConfigError

__all__ = ["DelTA", "DelTAConfig", "delta_weights"]


@dataclass
class DelTAConfig(DAPOConfig):
    """DelTA's options; the defaults are the reference code's DAPO recipe (arXiv 2605.21467)."""

    group_size: int = 16
    dynamic_sampling: bool = False
    """Drop groups whose rewards are all equal and sample again (DAPO's filter); off in the DelTA recipe."""
    overlong_buffer_frac: float = bounded(0.2, gt=0, max=1)
    """L_cache as a share of L_max: the recipe's overlong buffer 4096 of a 20480-token response limit."""
    refine_passes: int = bounded(1, min=0)
    """K: refinement passes that recompute the centroids weighted by σ(m/γ) before the final margins."""
    lambda_min: float = bounded(0.8, min=0)
    """λ_min: the smallest token coefficient before normalisation (and the coefficient of A = 0 tokens)."""
    lambda_max: float = bounded(1.2, min=0)
    """λ_max: the largest token coefficient before normalisation."""
    lambda_w: float = bounded(1.0, min=0)
    """λ_w: weight of the opposite-side distance in the margin m = λ_w·d_opposite − d_own."""
    gamma_time: float = bounded(1.0, gt=0)
    """γ_time: the margin temperature per side is γ± = γ_time·std(m) over that side's tokens."""
    delta_eps: float = bounded(1e-8, gt=0)
    """eps added to the centroid denominators and to γ before dividing."""
    token_vector: Literal["grad", "hidden"] = "grad"
    """Token vector v: (1 − p)·h, the LM-head gradient direction ('grad', the reference code), or the raw last
    hidden state h ('hidden', the variant the paper also mentions)."""
    contrast: Literal["opposite", "own"] = "opposite"
    """'opposite': the margin contrasts the distance to the opposite side's centroid with the distance to one's
    own (the method). 'own': the ablation with own-side centrality only — the opposite centroid is replaced by the
    token's own side's, so m = (λ_w − 1)·d_own; at λ_w = 1 every token with A ≠ 0 gets the same coefficient and
    the update is the plain DAPO one."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.lambda_min > self.lambda_max:
            raise ConfigError(f"lambda_min ({self.lambda_min}) must not exceed lambda_max ({self.lambda_max}); "
                              "set --set lambda_min=... below lambda_max")


def _std(x: torch.Tensor) -> torch.Tensor:
    """Sample std (torch's default, Bessel-corrected); 0 for fewer than two values instead of NaN."""
    return x.std() if x.numel() > 1 else x.new_zeros(())


def delta_weights(v: torch.Tensor, A: torch.Tensor, *, lambda_min: float = 0.8, lambda_max: float = 1.2,
                  lambda_w: float = 1.0, gamma_time: float = 1.0, refine_passes: int = 1, eps: float = 1e-8,
                  contrast: str = "opposite", normalize: bool = True) -> tuple[torch.Tensor, dict]:
    """DelTA's token coefficients λ [T] for token vectors `v` [T, H] with advantages `A` [T] (every valid token
    of the step), and their statistics (module docstring, steps 1–4).

    When one side (P or N) has no token the contrast is undefined; every λ is then 1 (the plain update) and
    ``delta_fallback`` is 1 [derived]. `normalize=False` returns λ before the global normalisation to mean 1.
    """
    if contrast not in ("opposite", "own"):
        raise ConfigError(f"contrast must be 'opposite' or 'own', got {contrast!r}")
    v = v.double()
    A = A.double()
    T = A.numel()
    pos, neg = A > 0, A < 0
    absA = A.abs()
    stats: dict[str, float] = {"delta_tokens_pos": float(pos.sum()), "delta_tokens_neg": float(neg.sum()),
                               "delta_tokens_zero": float(T - pos.sum() - neg.sum())}
    if T == 0 or not bool(pos.any()) or not bool(neg.any()):
        stats["delta_fallback"] = 1.0
        return torch.ones(T, dtype=torch.float32, device=v.device), stats

    def centroid(side: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        w = w * side
        return (w[:, None] * v).sum(0) / (w.sum() + eps)

    def margins(mu_p: torch.Tensor, mu_n: torch.Tensor):
        d_p = ((v - mu_p) ** 2).sum(-1)
        d_n = ((v - mu_n) ** 2).sum(-1)
        d_own = torch.where(pos, d_p, d_n)
        # 'own': the opposite centroid is one's own side's, so only own-side centrality enters the margin
        d_opp = torch.where(pos, d_n, d_p) if contrast == "opposite" else d_own
        m = torch.where(pos | neg, lambda_w * d_opp - d_own, torch.zeros_like(d_own))
        g_p, g_n = gamma_time * _std(m[pos]), gamma_time * _std(m[neg])
        gamma = torch.where(pos, g_p, g_n)
        return m, gamma, g_p, g_n

    mu_p, mu_n = centroid(pos, absA), centroid(neg, absA)
    m, gamma, g_p, g_n = margins(mu_p, mu_n)
    for _ in range(refine_passes):
        s = torch.sigmoid(m / (gamma + eps))
        mu_p, mu_n = centroid(pos, s * absA), centroid(neg, s * absA)
        m, gamma, g_p, g_n = margins(mu_p, mu_n)
    lam = lambda_min + (lambda_max - lambda_min) * torch.sigmoid(m / (gamma + eps))
    lam = torch.where(pos | neg, lam, torch.full_like(lam, lambda_min))
    if normalize:
        lam = lam * T / (lam.sum() + eps)
    # the discriminator W = μ+* − μ−* and its top-20% score tokens are logged only (they do not enter the loss)
    W = mu_p - mu_n
    score = v @ W
    nz = pos | neg
    k = max(1, int(0.2 * int(nz.sum())))
    top = torch.zeros_like(nz)
    top[torch.nonzero(nz).squeeze(1)[torch.topk(score[nz], k).indices]] = True

    def side(name: str, mask: torch.Tensor) -> None:
        x = lam[mask]
        stats.update({f"delta_lambda_{name}_mean": float(x.mean()), f"delta_lambda_{name}_std": float(_std(x)),
                      f"delta_lambda_{name}_min": float(x.min()), f"delta_lambda_{name}_max": float(x.max()),
                      f"delta_lambda_{name}_above1": float((x > 1).double().mean())})

    side("pos", pos)
    side("neg", neg)
    stats.update({"delta_fallback": 0.0, "delta_lambda_above1": float((lam[nz] > 1).double().mean()),
                  "delta_gamma_pos": float(g_p), "delta_gamma_neg": float(g_n),
                  "delta_disc_norm": float(W.norm()), "delta_top20_lambda_mean": float(lam[top].mean())})
    return lam.float(), stats


class DelTA(DAPO):
    """DAPO with DelTA's discriminative token coefficients on the sequence advantage (module docstring)."""

    name = "delta"
    Config = DelTAConfig

    @torch.no_grad()
    def token_vectors(self, batch: Batch, ctx: Ctx) -> tuple[torch.Tensor, torch.Tensor]:
        """(flat index into R·S [T], v [T, H]) for every generated token, from one no-grad forward of the current
        (π_old) model. h is the last hidden state at p − 1, the one the LM head turns into the log-prob of the
        token at p; p_{i,t} = exp(ctx.old_logp)."""
        c = self.config
        R, S = batch.input_ids.shape
        idx, vecs = [], []
        for r in self.micro_batches(batch, torch.arange(R, device=batch.input_ids.device)):
            w = max(1, int(batch.attention_mask[r].sum(1).max()))
            gen = batch.gen_mask[r, :w]
            _, _, hidden = forward_policy(self.model, batch.input_ids[r, :w], batch.attention_mask[r, :w],
                                          temperature=self.temperature, need_hidden=True, positions=gen)
            sel = gen[:, 1:].bool()
            h = hidden[:, :-1][sel].float()  # row-major: the same order as nonzero(sel)
            b, q = torch.nonzero(sel, as_tuple=True)
            idx.append(r[b] * S + q + 1)
            vecs.append(h)
        idx_t = torch.cat(idx)
        h = torch.cat(vecs)
        if c.token_vector == "hidden":
            return idx_t, h
        p = ctx.old_logp.reshape(-1)[idx_t].float().exp()
        return idx_t, (1.0 - p)[:, None] * h

    def compute_advantages(self, batch: Batch, ctx: Ctx) -> Advantages:
        c = self.config
        base = super().compute_advantages(batch, ctx)
        adv = base.adv * batch.gen_mask
        idx, v = self.token_vectors(batch, ctx)
        A = adv.reshape(-1)[idx]
        lam, stats = delta_weights(v, A, lambda_min=c.lambda_min, lambda_max=c.lambda_max, lambda_w=c.lambda_w,
                                   gamma_time=c.gamma_time, refine_passes=c.refine_passes, eps=c.delta_eps,
                                   contrast=c.contrast)
        weights = torch.zeros(adv.numel(), dtype=adv.dtype, device=adv.device)
        weights[idx] = lam.to(adv.dtype)
        weights = weights.reshape(adv.shape)
        #: λ of the last step's tokens [R, S] (0 off generated tokens), for inspection (benchmarks/repro_delta.py)
        self.last_token_weights = weights
        return Advantages(adv=adv * weights, token_mask=base.token_mask, metrics={**base.metrics, **stats})
