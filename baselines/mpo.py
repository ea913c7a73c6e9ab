"""MPO — multi-scale policy optimisation for long-horizon LLM agents (docs/algorithms/mpo.md, a [derived] design).

Source: "Multi-scale policy optimization for long-horizon LLM agents" (Peking University, IQuest Research,
Tsinghua, Renmin, HKU), known here only from a short summary: no arXiv id, paper text or code was available. Every
step below beyond that summary is our reading ([derived]), and the choices the summary leaves open are config
options.

Per trajectory, turns k (one env action each) with generated tokens t = 0..T_k−1, critic value V_{k,t} before
token y_{k,t}, turn value V_k := V_{k,0} (``turn_value="first"``), V_K = 0 (terminated) or the bootstrap:

1. turn GAE (λ = 0.8, γ = 1):  δ_k = r_k + γ V_{k+1} − V_k,  A^turn_k = Σ_j (γλ)^j δ_{k+j},  R^turn_k = A^turn_k + V_k
2. within-turn token GAE (λ_intra = 0.95, no discount inside a turn):
   δ_{k,t} = V_{k,t+1} − V_{k,t} (t < T_k−1);  δ_{k,T_k−1} = r_k + γ V_{k+1} − V_{k,T_k−1};
   a_{k,t} = Σ_u λ_intra^{u−t} δ_{k,u}
3. mean-preserving projection (β = 1):  A_{k,t} = A^turn_k + β (a_{k,t} − ā_k)   ⇒ mean_t A_{k,t} = A^turn_k exactly
4. complete-turn ratio with per-token gradient routing:
   ℓ_{k,t} = log π_θ − log π_old,  L_k = Σ_t ℓ_{k,t} (clamped ±20),  ρ̂_{k,t} = exp(sg(L_k − ℓ_{k,t}) + ℓ_{k,t})
   value exp(L_k) = ρ_turn for every token; gradient ρ_turn · ∇ log π_θ(y_{k,t}) (only the token's own score)
   then the clipped surrogate on ρ̂ with A_{k,t}, token-mean
5. critic: R^turn at turn starts, G_{k,t} = a_{k,t} + V_{k,t} inside turns (``critic_targets="split"``);
   loss ½·[mean over turn starts + mean over the other tokens] (`critic_groups`)

Diagnostic: the between-turn share of critic value variance, Σ_k T_k (V̄_k − V̄)² / Σ_{k,t} (V_{k,t} − V̄)²
(the summary quotes 89.5%).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from baselines.core.advantages import bootstrap_values
from baselines.core.batch import Batch
from baselines.core.config import AggMode, Truncation
from baselines.core.gae import discounted_reverse_cumsum, gae
from baselines.core.losses import clipped_surrogate
from baselines.core.trainer import Advantages, Ctx, LMAlgorithm, LMConfig
from shopsim.configs import bounded

__all__ = ["MPO", "MPOConfig", "mpo_advantages", "turn_ratio", "between_turn_variance_share"]


@dataclass
class MPOConfig(LMConfig):
    """MPO's options; the defaults are docs/algorithms/mpo.md's; the choices the paper summary leaves open are
    options."""

    lam_turn: float = bounded(0.8, min=0, max=1)
    """λ of the turn-level GAE."""
    lam_intra: float = bounded(0.95, min=0, max=1)
    """λ_intra of the within-turn token GAE (no discount inside a turn)."""
    beta: float = bounded(1.0, min=0)
    """β of the mean-preserving projection A = A^turn + β(a − ā)."""
    gamma: float = bounded(1.0, min=0, max=1)
    """Discount γ between turns."""
    clip_low: float = 0.2
    clip_high: float = 0.2
    log_ratio_clamp: float = bounded(20.0, gt=0)
    """Clamp ±c of the turn's summed log-ratio L_k before exponentiating."""
    normalize_advantage: bool = True
    loss_agg: AggMode = "token-mean"
    vf_coef: float = 0.5
    lr: float = 1e-6
    critic_lr: float = 1e-5
    group_size: int = 1
    value_pretrain_steps: int = bounded(0, min=0)
    """VAPO-style value pre-training steps before RL (0 = off, the default)."""
    value_pretrain_batches: int = bounded(2, min=1)
    """Rollout batches collected once for value pre-training (each `tasks_per_iter` × `group_size` episodes)."""
    # choices the paper summary leaves open
    projection: Literal["additive", "multiplicative"] = "additive"
    """1. 'additive' (default) or 'multiplicative' (a·A^turn/ā; undefined when ā ≈ 0)."""
    beta_role: Literal["correction", "mix"] = "correction"
    """2. 'correction' (A^turn + β(a − ā)) or 'mix' ((1−β)A^turn + β a; not mean-preserving)."""
    turn_value: Literal["first", "mean"] = "first"
    """3. turn value = value at the turn's first generated position ('first') or the turn's mean token value."""
    critic_targets: Literal["split", "turn"] = "split"
    """4. 'split' (R^turn at turn starts, intra-turn λ-returns elsewhere) or 'turn' (every token → R^turn)."""
    turn_ratio: Literal["product", "geometric"] = "product"
    """5. 'product' (complete-turn ratio) or 'geometric' (length-normalised, GSPO-like)."""
    clip_token_ratio: bool = False
    """6. also clip each token's own ratio (pessimistic of the two surrogates)."""
    bootstrap_last_token: bool = True
    """8. last token of a turn bootstraps from the next turn's value (else sees only r_k)."""
    truncation: Truncation = "terminal"
    """'terminal' or 'last_value' (proxy bootstrap, see baselines.core.advantages)."""


def _turn_scatter_mean(x: torch.Tensor, key: torch.Tensor, mask: torch.Tensor, n_keys: int,
                       counts: torch.Tensor | None = None):
    m = mask.to(x.dtype)
    s = torch.zeros(n_keys, dtype=x.dtype).index_add_(0, key.reshape(-1), (x * m).reshape(-1))
    c = torch.zeros(n_keys, dtype=x.dtype).index_add_(0, key.reshape(-1), m.reshape(-1)) if counts is None else counts
    return s / c.clamp_min(1.0), c


def mpo_advantages(values: torch.Tensor, tok_mask: torch.Tensor, tok_turn: torch.Tensor, turn_rewards: torch.Tensor,
                   *, gamma: float = 1.0, lam_turn: float = 0.8, lam_intra: float = 0.95, beta: float = 1.0,
                   last_value: torch.Tensor | None = None, projection: str = "additive",
                   beta_role: str = "correction", turn_value: str = "first", critic_targets: str = "split",
                   bootstrap_last_token: bool = True) -> dict[str, torch.Tensor]:
    """MPO credit in the trajectory-token layout.

    values, tok_mask, tok_turn: [N, L] (each trajectory's generated tokens in order, turns contiguous);
    turn_rewards: [N, K]. Returns dict with adv [N, L], returns [N, L], turn_adv [N, K], turn_returns [N, K],
    intra [N, L] (a_{k,t}) and turn_values [N, K].
    """
    N, L = values.shape
    K = turn_rewards.shape[1]
    m = tok_mask.bool()
    turn = tok_turn.clamp_min(0)
    key = torch.arange(N)[:, None] * K + turn  # (trajectory, turn) id
    prev = torch.nn.functional.pad(tok_turn[:, :-1], (1, 0), value=-1)
    nxt = torch.nn.functional.pad(tok_turn[:, 1:], (0, 1), value=-1)
    is_start = m & (tok_turn != prev)
    is_end = m & (tok_turn != nxt)
    v = values * m
    mean_v, counts = _turn_scatter_mean(v, key, m, N * K)
    if turn_value == "first":
        Vt = torch.zeros(N * K, dtype=v.dtype).index_put_((key[is_start],), v[is_start])
    else:
        Vt = mean_v
    Vt = Vt.view(N, K)
    turn_valid = (counts.view(N, K) > 0)
    rew = turn_rewards * turn_valid
    # 1) turn-level GAE; λ = 0 gives δ_k, so r_k + γV_{k+1} = δ_k + V_k (handles skipped turns and the bootstrap)
    A_turn, R_turn = gae(rew, Vt, turn_valid, gamma=gamma, lam=lam_turn, last_value=last_value)
    delta_k, _ = gae(rew, Vt, turn_valid, gamma=gamma, lam=0.0, last_value=last_value)
    target_k = (delta_k + Vt) * turn_valid if bootstrap_last_token else rew
    # 2) within-turn token TD errors and the segmented λ_intra sum (restarts at every turn end)
    v_next = torch.nn.functional.pad(v[:, 1:], (0, 1))
    end_target = torch.gather(target_k, 1, turn)
    delta = torch.where(is_end, end_target, v_next) - v
    delta = delta * m
    S = discounted_reverse_cumsum(delta, lam_intra)
    pos = torch.arange(L).expand(N, L)
    end_pos = torch.where(is_end, pos, torch.full_like(pos, L))
    e = torch.flip(torch.cummin(torch.flip(end_pos, [1]), dim=1).values, [1]).clamp_max(L - 1)
    S_pad = torch.nn.functional.pad(S, (0, 1))
    after = torch.gather(S_pad, 1, (e + 1).clamp_max(L))
    a = (S - torch.pow(torch.as_tensor(lam_intra, dtype=S.dtype), (e - pos + 1).to(S.dtype)) * after) * m
    # 3) projection onto {mean over the turn = A^turn}
    abar, _ = _turn_scatter_mean(a, key, m, N * K, counts)
    abar_tok = abar[key]
    At_tok = torch.gather(A_turn, 1, turn)
    if beta_role == "mix":
        adv = (1 - beta) * At_tok + beta * a
    elif projection == "additive":
        adv = At_tok + beta * (a - abar_tok)
    else:
        safe = torch.where(abar_tok.abs() > 1e-8, abar_tok, torch.ones_like(abar_tok))
        adv = torch.where(abar_tok.abs() > 1e-8, a * At_tok / safe, At_tok)
    adv = adv * m
    # 5) critic targets
    Rt_tok = torch.gather(R_turn, 1, turn)
    if critic_targets == "turn":
        ret = Rt_tok
    else:
        ret = torch.where(is_start, Rt_tok, a + v)
    return {"adv": adv, "returns": ret * m, "turn_adv": A_turn, "turn_returns": R_turn, "intra": a,
            "turn_values": Vt, "turn_valid": turn_valid}


def critic_groups(batch: Batch) -> torch.Tensor:
    """[R, S] critic-loss groups: 0 at each turn's first generated token, 1 at the other generated tokens, −1
    elsewhere, so that the critic loss is ½·[mean over turn starts + mean over the rest] (§5 of the method)."""
    groups = torch.where(batch.gen_mask, torch.ones_like(batch.input_ids), torch.full_like(batch.input_ids, -1))
    starts = batch.turn_starts()
    flat = groups.view(-1)
    flat[starts[starts >= 0]] = 0
    return groups


def between_turn_variance_share(values: torch.Tensor, tok_mask: torch.Tensor, tok_turn: torch.Tensor) -> float:
    """Σ_k T_k (V̄_k − V̄)² / Σ_{k,t} (V_{k,t} − V̄)² over generated tokens (trajectory-token layout)."""
    m = tok_mask.bool()
    if m.sum() < 2:
        return float("nan")
    N, L = values.shape
    K = int(tok_turn.max().item()) + 1
    key = torch.arange(N)[:, None] * K + tok_turn.clamp_min(0)
    mean_k, cnt = _turn_scatter_mean(values, key, m, N * K)
    vbar = values[m].mean()
    total = ((values[m] - vbar) ** 2).sum()
    between = (cnt * (mean_k - vbar) ** 2).sum()
    return float(between / total) if total > 0 else float("nan")


def turn_ratio(logp: torch.Tensor, old_logp: torch.Tensor, turn_index: torch.Tensor, mask: torch.Tensor, *,
               clamp: float = 20.0, geometric: bool = False) -> torch.Tensor:
    """ρ̂_{k,t} = exp(sg(M_k − ℓ_{k,t}) + ℓ_{k,t}) for rows [B, S]: value exp(M_k), gradient exp(M_k)·∇ℓ_{k,t}.

    M_k = clamp(Σ_t ℓ_{k,t}, ±clamp) (complete turn) or its mean over the turn (``geometric``); turns are
    identified per row by `turn_index`.
    """
    B, S = logp.shape
    m = mask.bool()
    ell = (logp - old_logp) * m
    K = int(turn_index.max().item()) + 2 if turn_index.numel() else 1
    key = (torch.arange(B, device=logp.device)[:, None] * K + turn_index.clamp_min(0)).reshape(-1)
    tot = torch.zeros(B * K, dtype=ell.dtype, device=logp.device).index_add(0, key, ell.reshape(-1))
    if geometric:
        cnt = torch.zeros(B * K, dtype=ell.dtype, device=logp.device).index_add(0, key, m.reshape(-1).to(ell.dtype))
        tot = tot / cnt.clamp_min(1.0)
    Mk = tot.clamp(-clamp, clamp)[key].view(B, S)
    return torch.exp((Mk - ell).detach() + ell) * m + (~m).to(ell.dtype)


class MPO(LMAlgorithm):
    """Turn-level GAE + mean-preserving within-turn token credit + complete-turn importance ratio."""

    name = "mpo"
    Config = MPOConfig
    uses_critic = True

    def before_training(self, env_id, agent, rng, out_dir):
        if self.config.value_pretrain_steps > 0:
            return self.pretrain_critic(env_id, agent, rng, self.config.value_pretrain_steps,
                                        self.config.value_pretrain_batches)
        return {}

    def compute_advantages(self, batch: Batch, ctx: Ctx) -> Advantages:
        c = self.config
        assert ctx.values is not None  # uses_critic: prepare() computed them
        v_tt = batch.to_traj_tokens(ctx.values)
        last = bootstrap_values(batch, v_tt, c.truncation)
        out = mpo_advantages(v_tt, batch.traj_tok_mask, batch.traj_tok_turn, batch.turn_rewards, gamma=c.gamma,
                             lam_turn=c.lam_turn, lam_intra=c.lam_intra, beta=c.beta, last_value=last,
                             projection=c.projection, beta_role=c.beta_role, turn_value=c.turn_value,
                             critic_targets=c.critic_targets, bootstrap_last_token=c.bootstrap_last_token)
        share = between_turn_variance_share(v_tt, batch.traj_tok_mask, batch.traj_tok_turn)
        tv = out["turn_valid"].float()
        return Advantages(adv=batch.from_traj_tokens(out["adv"]), returns=batch.from_traj_tokens(out["returns"]),
                          value_groups=critic_groups(batch),
                          metrics={"between_turn_value_var_share": share,
                                   "turn_adv_abs": float((out["turn_adv"].abs() * tv).sum() / tv.sum().clamp_min(1)),
                                   "intra_adv_abs": float(out["intra"].abs().sum()
                                                          / batch.traj_tok_mask.sum().clamp_min(1))})

    def policy_loss_tok(self, mb, logp, adv, mask):
        c = self.config
        ratio = turn_ratio(logp, mb.old_logp, mb.turn_index, mask, clamp=c.log_ratio_clamp,
                           geometric=c.turn_ratio == "geometric")
        loss, st = clipped_surrogate(logp, mb.old_logp, adv, mask, c.clip_low, c.clip_high, c.dual_clip,
                                     ratio=ratio)
        if c.clip_token_ratio:
            tok_loss, _ = clipped_surrogate(logp, mb.old_logp, adv, mask, c.clip_low, c.clip_high, c.dual_clip)
            loss = torch.maximum(loss, tok_loss)
        return loss, st
