"""WAPO for the Shopping LM agent (docs/algorithms/wapo.md).

YSS, Ren, Hosseinzadeh, Gofman, Chen, Liu, Yu, Cresswell, Gorti, "A Gradient Perspective on RLVR Stability and
Winner Advantage Policy Optimization", arXiv 2606.16154; reference code layer6ai-labs/wapo (a fork of
PrimeIntellect `verifiers`). Winner Advantage Policy Optimization trains on positive-advantage sequences only:

    A_i   = R_i − mean_g R                                     (no std division; all-equal group: A = 0)
    keep trajectory i only if A_i > 0 ("winners"); the others are masked out entirely
    ρ_t   = exp(log π_θ(y_t) − log π_behav(y_t))              (behaviour = the generator's recorded log-probs)
    ℓ_t   = −min(ρ_t·A_i, min(ρ_t, 1+ε)·A_i) = −min(ρ_t, 1+ε)·A_i    (one-sided upper clip, ε = 9)
    L     = 1/#{groups with ≥ 1 winner} · Σ_g 1/(G·max_seq_len_g) · Σ_{winners i of g} Σ_t ℓ_t

``use_importance_sampling=False`` replaces ℓ_t by −log π_θ(y_t)·A_i (REINFORCE on winners);
``normalize_by_kept_tokens`` replaces 1/(G·max_seq_len_g) by 1/(#winner tokens of g in the step).

Multi-turn reading [derived]: a sequence is a whole trajectory (its generated tokens over every turn), and
max_seq_len_g is the longest trajectory of group g counted in generated tokens (the paper's constant padded length
is the option ``max_seq_len``).

Token bins (logging, the paper's gradient analysis): a generated token is a *peak* when π_θ(y_t) ≥ Σ_v π_θ(v)² (the
collision probability of the full next-token distribution), else a *valley*; crossed with the sign of A_i this gives
the shares pos_peak, pos_valley, neg_peak and neg_valley over ALL generated tokens of the step (losers included;
tokens with A_i = 0 fall in none of them and are counted in ``zero_adv_tokens``). Computed in the update's own forward,
so they describe the policy being trained.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from baselines.core.advantages import Reward, trajectory_reward
from baselines.core.batch import Batch, MicroBatch
from baselines.core.stats import group_normalize
from baselines.core.trainer import Advantages, Ctx, LMAlgorithm, LMConfig
from shopsim.configs import bounded
from shopsim.errors import ConfigError

__all__ = ["WAPOConfig", "WAPO", "TokenBinLogging", "wapo_advantages", "wapo_weights", "wapo_token_loss",
           "token_bins"]


@dataclass
class WAPOConfig(LMConfig):
    """WAPO's options; the defaults are those of the WAPO reference code (card: arXiv 2606.16154)."""

    group_size: int = bounded(8, min=2)
    """Rollouts per task (G, `rollouts_per_example`); WAPO needs at least 2 to have a group mean."""
    tasks_per_iter: int = bounded(32, min=1)
    """Tasks per iteration: 32 tasks × G = 8 is the reference batch of 256 rollouts."""
    minibatches: int = bounded(4, min=1)
    """Optimizer steps per iteration: the reference mini-batch is 64 of the 256 rollouts."""
    lr: float = bounded(1e-5, gt=0)
    """Learning rate (constant; the reference's 10 warm-up steps are not applied: the shared loop has no warm-up)."""
    max_grad_norm: float = bounded(1.0, gt=0)
    """Gradient-norm clip per optimizer step."""
    clip_eps: float = bounded(9.0, min=0)
    """ε of the one-sided upper clip: the ratio is capped at 1 + clip_eps (10); there is no lower clip."""
    use_importance_sampling: bool = True
    """ℓ = −min(ρ, 1+ε)·A with ρ against the behaviour log-probs (True) or ℓ = −log π·A, REINFORCE on the winners
    (False)."""
    normalize_by_kept_tokens: bool = False
    """Divide each group's summed loss by its number of winner tokens in the step instead of G·max_seq_len."""
    max_seq_len: int | None = bounded(None, min=1)
    """The constant max_seq_len of the normaliser 1/(G·max_seq_len); None [derived]: the longest trajectory of the
    group, counted in generated tokens over all its turns."""
    reward: Reward = "return"
    """Trajectory reward R_i: the sum of env rewards ('return'), the final score, or the success flag."""
    log_token_bins: bool = True
    """Log the four token bins and the entropy over all generated tokens (losers included). This needs every row
    in the update's forward, so rows whose advantage is zero or that are masked out are not skipped; False skips
    them (faster) and logs no bins."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.kl_coef != 0 or self.entropy_coef != 0:
            raise ConfigError("wapo has no KL and no entropy term; leave kl_coef and entropy_coef at 0")


def wapo_advantages(R: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(A [N], winner [N] bool): A_i = R_i − mean_g R, exactly 0 in a group whose rewards are all equal (so that
    rounding in the mean never makes a "winner" of a tie), winner = A_i > 0. A singleton group has A = 0."""
    A = group_normalize(R.float(), group_ids.long(), "mean")  # `group_stats` gives a tied group its exact value
    return A, A > 0


def wapo_weights(mask: torch.Tensor, row_group: torch.Tensor, group_size: torch.Tensor, group_len: torch.Tensor,
                 *, by_kept_tokens: bool = False) -> torch.Tensor:
    """Per-token weights [B, S] of WAPO's loss over one optimizer step.

    `mask` [B, S]: the step's trained (winner) tokens; `row_group` [B]: group of each row; `group_size` [n_groups]:
    G of each group; `group_len` [n_groups]: its max_seq_len. w = mask / (#groups with a winner token in the step ·
    G_g · max_seq_len_g), or mask / (#groups · #winner tokens of g) with `by_kept_tokens`.
    """
    m = mask.float()
    g = row_group.long()
    n = len(group_size)
    kept = torch.zeros(n, device=m.device).index_add_(0, g, m.sum(1))
    n_groups = float((kept > 0).sum())
    if n_groups == 0:
        return torch.zeros_like(m)
    per_group = kept if by_kept_tokens else group_size.float() * group_len.float()
    return m / (n_groups * per_group[g].clamp_min(1.0))[:, None]


def wapo_token_loss(logp: torch.Tensor, behav_logp: torch.Tensor, adv: torch.Tensor, *, clip_eps: float = 9.0,
                    importance_sampling: bool = True) -> torch.Tensor:
    """Per-token loss ℓ_t = −min(ρ·A, min(ρ, 1+ε)·A), ρ = exp(log π_θ − log π_behav) (−log π_θ·A without importance
    sampling). For A > 0 this is −min(ρ, 1+ε)·A: the gradient vanishes above the cap and there is no lower clip."""
    if not importance_sampling:
        return -logp * adv
    ratio = torch.exp((logp - behav_logp).clamp(-20.0, 20.0))
    return -torch.minimum(ratio * adv, ratio.clamp(max=1.0 + clip_eps) * adv)


def token_bins(logp: torch.Tensor, coll: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor) -> dict:
    """Token counts of the four bins over `mask`: peak = π(y_t) ≥ Σ_v π(v)², valley otherwise, × sign of A
    (A = 0 is counted in ``zero_adv_tokens``)."""
    m = mask.bool()
    p = logp.detach().exp()
    # p ≥ ½ implies p ≥ Σp² (the others' Σp_v² ≤ (1−p)² ≤ p(1−p)); saying so keeps near-certain tokens, where p and
    # Σp² differ by less than float rounding, on the peak side
    peak = (p >= coll) | (p >= 0.5)
    pos, neg = m & (adv > 0), m & (adv < 0)
    return {"pos_peak": float((pos & peak).sum()), "pos_valley": float((pos & ~peak).sum()),
            "neg_peak": float((neg & peak).sum()), "neg_valley": float((neg & ~peak).sum()),
            "zero_adv_tokens": float((m & (adv == 0)).sum())}


class TokenBinLogging:
    """Logging-only mixin for an `LMAlgorithm` (before it in the bases): the four token bins and the entropy over
    every generated token of each optimizer step, from the update's own forward (`token_bins`). The loss is
    unchanged; zero-advantage rows are no longer skipped, since the bins need them. Off when the config has
    ``log_token_bins=False``."""

    config: Any  # the LMAlgorithm's, whose class follows this one in the bases

    # LMAlgorithm's switches of the same names are class attributes; here they follow the config instead
    @property
    def needs_entropy(self) -> bool:  # logging only: no entropy term is added
        return bool(getattr(self.config, "log_token_bins", True))

    @property
    def needs_collision(self) -> bool:
        return bool(getattr(self.config, "log_token_bins", True))

    def token_metrics(self, mb: MicroBatch, logp: torch.Tensor, ent: torch.Tensor | None,
                      coll: torch.Tensor | None) -> dict:
        """Shares of the four bins and the mean entropy over all generated tokens of the step (this micro-batch's
        part of them)."""
        if coll is None:
            return {}
        batch = mb.batch
        total = max(float(batch.gen_mask[mb.step_rows].sum()), 1.0)
        gen = mb.gen_mask
        out = {k: v / total for k, v in token_bins(logp, coll, mb.adv, gen).items()}
        if ent is not None:
            out["entropy_gen"] = float((ent.detach() * gen).sum()) / total
        return out


# The trainer only reads its switches, so the mixin's read-only properties may stand in for LMAlgorithm's writable
# class attributes (a benchmark sets them on an instance); mypy cannot be told that a reader needs no setter.
class WAPO(TokenBinLogging, LMAlgorithm):  # type: ignore[override]
    """Winner Advantage Policy Optimization: mean-centred outcome advantage, only the winners trained."""

    name = "wapo"
    Config = WAPOConfig

    def compute_advantages(self, batch: Batch, ctx: Ctx) -> Advantages:
        """A_i on every generated token (losers keep their A ≤ 0 for the bins); the token mask keeps winners."""
        R = trajectory_reward(batch, self.config.reward)
        A, win = wapo_advantages(R, batch.group_ids)
        n_groups = int(batch.group_ids.max()) + 1
        has_win = torch.zeros(n_groups).index_add_(0, batch.group_ids, win.float()) > 0
        keep = batch.traj_to_tokens(win.float()) > 0
        gen = batch.gen_mask
        return Advantages(adv=batch.traj_to_tokens(A), token_mask=keep, metrics={
            "no_winner_groups": float((~has_win).float().mean()),
            "winner_share": float(win.float().mean()),
            "kept_token_share": float(keep.sum()) / max(float(gen.sum()), 1.0),
            "adv_winner_mean": float(A[win].mean()) if bool(win.any()) else 0.0,
        })

    def policy_weights(self, batch: Batch, rows: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """WAPO's per-group normaliser over the step (`wapo_weights`); G and max_seq_len are those of the group's
        whole trajectories."""
        c = self.config
        gid = batch.group_ids.to(mask.device)
        n = int(gid.max()) + 1
        size = torch.zeros(n, device=mask.device).index_add_(0, gid, torch.ones_like(gid, dtype=torch.float))
        if c.max_seq_len is not None:
            length = torch.full((n,), float(c.max_seq_len), device=mask.device)
        else:
            tl = batch.traj_gen_len.to(mask.device).float()
            length = torch.zeros(n, device=mask.device).scatter_reduce(0, gid, tl, "amax")
        return wapo_weights(mask, gid[batch.row_traj[rows]], size, length, by_kept_tokens=c.normalize_by_kept_tokens)

    def policy_loss_tok(self, mb: MicroBatch, logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor):
        c = self.config
        behav = mb.behav_logp
        loss = wapo_token_loss(logp, behav, adv, clip_eps=c.clip_eps, importance_sampling=c.use_importance_sampling)
        with torch.no_grad():
            m = mask.float()
            n = m.sum().clamp_min(1.0)
            log_ratio = (logp.detach() - behav).clamp(-20.0, 20.0)
            ratio = log_ratio.exp()
            stats = {"ratio": (ratio * m).sum() / n, "clipfrac": ((ratio > 1.0 + c.clip_eps).float() * m).sum() / n,
                     "approx_kl": ((torch.exp(-log_ratio) - 1 + log_ratio) * m).sum() / n}
        return loss, stats
