"""BiPACE for the Shopping LM agent (docs/algorithms/bipace.md).

Wang, Ren, Zhang, Cao, Zeng, Zeng, Zhao, "Bisimulation-Guided Policy Optimization with Action Counterfactual
Estimation for LLM Agents", arXiv 2606.25556. BiPACE keeps GiGPO's episode-level advantage and replaces only its
step-level grouping (exact anchor-state hash → clusters of the actor's hidden states, "BiGPO") and its step baseline
(one mean per state → an action-counterfactual baseline, "PACE", Q-style variant). No critic, no auxiliary loss,
no extra rollouts.

    step returns:  R_{i,k} = r_{i,k} + γ R_{i,k+1}                       (γ = 0.95, as GiGPO)
    state side:    z = normalize(h(s)), h = last-layer state at the last prompt token (the state the action is
                   generated from), d(i, j) = 1 − cos(z_i, z_j)
                   greedy clustering inside each prompt group, steps in trajectory-then-step order: a step joins
                   the first cluster whose first member is within ε, else opens a new cluster (distances up to
                   1e-6 count as 0: float rounding between batched forwards)
                   ε = 10th percentile of the within-group pairwise distances of the first training batch, frozen
    action side:   V_b = mean_{j∈C_b} R_j,  Q_b(a) = mean_{j∈C_b, key(a_j)=key(a)} R_j
                   A^S_i = Q_b(a_i) − V_b                 if ≥ 2 same-action peers (counting i)     (PACE)
                         = R_i − mean_{j∈C_b, j≠i} R_j    otherwise                                 (RLOO)
                         = 0                              if C_b = {i}                              (singleton)
    joint:         A_{i,k} = A^E_i + ω·A^S_{i,k},  A^E_i = R_i − mean_g R  (GiGPO's mean_norm), ω = 1
    loss:          clipped surrogate (ε = 0.2) + β_KL·k3 (0.01), token-mean (GiGPO's)

The action key is the env's parsed action (`shopsim.envs.shopping.actions.parse`): tool name plus its arguments,
lower-cased with blanks collapsed; a string the env cannot parse keys on its own normalised text.
"""

from __future__ import annotations

import math
import re
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch

from baselines.core.advantages import GROUP_MODES, Reward, trajectory_reward, turn_returns_to_go
from baselines.core.batch import Batch
from baselines.core.config import AggMode
from baselines.core.stats import group_normalize
from baselines.core.trainer import Advantages, Ctx, LMAlgorithm, LMConfig
from shopsim.configs import bounded
from shopsim.envs.shopping.actions import ActionError, parse
from shopsim.errors import ConfigError

__all__ = ["BiPACE", "BiPACEConfig", "action_key", "calibrate_epsilon", "cluster_group", "counterfactual_advantages",
           "bipace_advantages"]


@dataclass
class BiPACEConfig(LMConfig):
    """BiPACE's options (arXiv 2606.25556); GiGPO's defaults for what BiPACE leaves unchanged."""

    gamma: float = bounded(0.95, min=0, max=1)
    """Discount of the step returns R_{i,k} = r_{i,k} + γ R_{i,k+1} (GiGPO's)."""
    step_advantage_w: float = bounded(1.0, min=0)
    """ω: weight of the step-level advantage in A = A^E + ω·A^S."""
    mode: Literal["mean_norm", "mean_std_norm"] = "mean_norm"
    """Episode-level advantage A^E: R − group mean ('mean_norm') or also divided by the group std
    ('mean_std_norm')."""
    hidden_pooling: Literal["last", "mean"] = "last"
    """State summary φ(s): the hidden state at the last prompt token ('last', the state the action is generated
    from) or the mean over the prompt's tokens ('mean'; in concat mode the prompt is the whole dialogue)."""
    hidden_layer: int = bounded(-1, min=-64, max=64)
    """Entry of the model's hidden_states the summary reads (-1: last block output; e.g. round(0.75·L) for a layer
    at 3/4 depth)."""
    eps_percentile: float = bounded(10.0, gt=0, lt=100)
    """ε = this percentile of the within-group pairwise distances 1 − cos on the calibration batch."""
    eps_pairs: Literal["all", "distinct"] = "all"
    """Pairs the percentile runs over: every within-group pair ('all'), or only pairs that are not duplicates
    (distance above `DUPLICATE_TOL`; 'distinct'). When more than `eps_percentile` % of the pairs are duplicate states
    (the G rollouts of a task share their first states), 'all' gives ε ≈ 0 and clustering falls back to exact
    duplicates."""
    eps_schedule: Literal["first_batch", "every_batch"] = "first_batch"
    """'first_batch': calibrate ε on the first training batch, then keep it frozen (saved with the run);
    'every_batch': recalibrate on every batch."""
    eps_target_singleton: float | None = bounded(None, min=0, max=1)
    """Calibrate ε to a target singleton rate instead of a percentile ([derived] alternative of the card): the
    smallest ε (bisection on [0, 2]) at which at most this share of the calibration batch's clusters are singletons
    (None: the percentile rule). `eps_schedule` applies as for the percentile."""
    epsilon: float | None = bounded(None, min=0, max=2)
    """A fixed ε (distance 1 − cos, in [0, 2]) instead of the calibrated one (None: calibrate)."""
    cluster_ref: Literal["first", "centroid"] = "first"
    """Distance of a step to a cluster: to the cluster's first member ('first') or to its running centroid
    ('centroid')."""
    action_key: Literal["parsed", "tool", "text"] = "parsed"
    """PACE's action key: the parsed action (tool name + normalised arguments; 'parsed'), the tool name only
    ('tool', the paper's action-tag ablation), or the stripped action text ('text')."""
    baseline: Literal["pace", "state"] = "pace"
    """Step baseline: the Q-style action counterfactual ('pace') or state-only A^S = R − V_b ('state', the paper's
    clustering-only ablation; a singleton cluster still gives 0)."""
    min_peers: int = bounded(2, min=1)
    """Fewest same-action steps in the cluster (counting the step itself) for the PACE branch; fewer → RLOO."""
    step_norm: Literal["none", "std"] = "none"
    """Normalisation of A^S: none, or divided by the std of R in the cluster + 1e-6."""
    giant_cluster_share: float = bounded(0.5, gt=0, max=1)
    """A cluster holding more than this share of its prompt group's steps counts as giant (metric
    ``bipace_giant_clusters`` and a warning): BiPACE then degrades to a GRPO-like baseline."""
    group_size: int = bounded(8, min=1)
    """Rollouts per task (G); BiPACE needs G ≥ 2 for cross-trajectory clusters (G = 1 leaves only a trajectory's
    own steps to cluster)."""
    tasks_per_iter: int = bounded(16, min=1)
    """Tasks drawn per iteration (GiGPO's)."""
    kl_coef: float = bounded(0.01, min=0)
    """β of the KL term (GiGPO's)."""
    kl_kind: Literal["k1", "k3"] = "k3"
    """KL estimator (GiGPO's)."""
    lr: float = bounded(1e-6, gt=0)
    """Learning rate (GiGPO's)."""
    clip_low: float = bounded(0.2, min=0, lt=1)
    """ε_low of the clipped surrogate (GiGPO's)."""
    clip_high: float = bounded(0.2, min=0)
    """ε_high of the clipped surrogate (GiGPO's)."""
    loss_agg: AggMode = "token-mean"
    """Loss aggregation (GiGPO's)."""
    reward: Reward = "return"
    """Trajectory reward R_i of the episode-level advantage: the sum of env rewards ('return'), the final score,
    or the success flag."""
    env_kwargs: dict = field(default_factory=lambda: {"invalid_penalty": 0.1})
    """GiGPO's env options: verl-agent's WebShop invalid-action penalty 0.1; set {} for the env default."""


# ---------------------------------------------------------------------------------------------------- action keys
_BLANKS = re.compile(r"\s+")


def _norm(x) -> str:
    return _BLANKS.sub(" ", str(x).strip().lower())


def action_key(action, kind: str = "parsed") -> tuple[tuple, bool]:
    """(key, parsed) of one action string: see `BiPACEConfig.action_key`. `parsed` says whether the env's parser
    accepted it (unparseable actions key on their normalised text, so two identical invalid actions are peers)."""
    text = action if isinstance(action, str) else repr(action)
    try:
        a = parse(text)
    except ActionError:
        return ("text", _norm(text)), False
    if kind == "parsed":
        return ("action", a.name, tuple(_norm(v) for v in a.args)), True
    if kind == "tool":
        return ("tool", a.name), True
    return ("text", _norm(text)), True


# ---------------------------------------------------------------------------------------------------- clustering
#: distances up to this count as equal: identical prompts in differently padded batched forwards give states that
#: differ by float rounding (cosine distance ~1e-7), which must not split them
DUPLICATE_TOL = 1e-6


def _unit(z: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.normalize(z.double(), dim=-1)


def cluster_group(z: torch.Tensor, eps: float, ref: str = "first") -> list[int]:
    """Greedy clustering of the rows of `z` [M, H] (in the given order): a row joins the first cluster whose
    reference (its first member, or its centroid) is within cosine distance `eps`, else opens a new one."""
    u = _unit(z)
    reps: list[torch.Tensor] = []
    sums: list[torch.Tensor] = []
    labels = []
    for m in range(u.shape[0]):
        lab = -1
        if reps:
            d = 1.0 - torch.stack(reps) @ u[m]
            hit = (d <= max(eps, DUPLICATE_TOL)).nonzero()
            if hit.numel():
                lab = int(hit[0])
        if lab < 0:
            reps.append(u[m])
            sums.append(u[m].clone())
            lab = len(reps) - 1
        elif ref == "centroid":
            sums[lab] = sums[lab] + u[m]
            reps[lab] = _unit(sums[lab])
        labels.append(lab)
    return labels


def calibrate_epsilon(z: torch.Tensor, groups: torch.Tensor, percentile: float,
                      distinct: bool = False) -> float | None:
    """The `percentile`-th percentile (linear interpolation) of 1 − cos over all unordered pairs of rows of `z`
    [M, H] that share a prompt group (`groups` [M]), with `distinct` only over pairs farther apart than
    `DUPLICATE_TOL`; None when there is no such pair."""
    u = _unit(z)
    ds = []
    for g in torch.unique(groups):
        v = u[groups == g]
        if len(v) < 2:
            continue
        iu = torch.triu_indices(len(v), len(v), offset=1)
        ds.append((1.0 - v @ v.T)[iu[0], iu[1]])
    d = torch.cat(ds) if ds else torch.zeros(0, dtype=torch.float64)
    if distinct:
        d = d[d > DUPLICATE_TOL]
    if d.numel() == 0:
        return None
    return float(np.percentile(d.numpy(), percentile))


def singleton_share(z: torch.Tensor, groups: torch.Tensor, eps: float, ref: str = "first") -> float:
    """Share of the clusters (greedy clustering inside each prompt group at `eps`) that hold one step."""
    sizes = []
    for g in torch.unique(groups):
        labels = cluster_group(z[groups == g], eps, ref)
        sizes.extend(np.bincount(labels).tolist())
    return float(np.mean([n == 1 for n in sizes])) if sizes else 0.0


def calibrate_epsilon_singleton(z: torch.Tensor, groups: torch.Tensor, target: float, ref: str = "first",
                                steps: int = 24) -> float:
    """The smallest ε in [0, 2] (bisection, `steps` halvings) whose clustering leaves at most `target` of the
    clusters as singletons. A larger ε merges more, so the singleton share falls with ε (greedy clustering makes
    this near- but not strictly monotone; bisection returns an ε that meets the target)."""
    if singleton_share(z, groups, 0.0, ref) <= target:
        return 0.0
    lo, hi = 0.0, 2.0
    for _ in range(steps):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if singleton_share(z, groups, mid, ref) <= target else (mid, hi)
    return hi


# ---------------------------------------------------------------------------------------------------- PACE
def counterfactual_advantages(R: torch.Tensor, clusters: torch.Tensor, keys: list, *, baseline: str = "pace",
                              min_peers: int = 2, step_norm: str = "none") -> tuple[torch.Tensor, dict]:
    """A^S [M] of steps with returns `R` [M], cluster ids `clusters` [M] (dense) and action keys `keys`.

    Returns (A^S, counts) where counts has per-step int tensors ``branch`` (0 singleton, 1 PACE, 2 RLOO, 3 state)
    and ``peers`` (same-action steps in the cluster, counting the step itself)."""
    R = R.double()
    M = len(R)
    n_c = int(clusters.max()) + 1 if M else 0
    size = torch.bincount(clusters, minlength=n_c).double()
    tot = torch.zeros(n_c, dtype=R.dtype).index_add_(0, clusters, R)
    V = tot / size.clamp_min(1)
    ak: dict[tuple, int] = {}  # (cluster, action key) -> action id
    aid = torch.tensor([ak.setdefault((int(c), k), len(ak)) for c, k in zip(clusters.tolist(), keys, strict=True)],
                       dtype=torch.long)
    a_cnt = torch.bincount(aid, minlength=len(ak)).double()
    a_tot = torch.zeros(len(ak), dtype=R.dtype).index_add_(0, aid, R)
    peers = a_cnt[aid]
    Q = a_tot[aid] / peers
    n = size[clusters]
    if baseline == "state":
        A = R - V[clusters]
        branch = torch.full((M,), 3, dtype=torch.long)
    else:
        rloo = R - (tot[clusters] - R) / (n - 1).clamp_min(1)
        pace = peers >= min_peers
        A = torch.where(pace, Q - V[clusters], rloo)
        branch = torch.where(pace, 1, 2)
    single = n <= 1
    A = torch.where(single, torch.zeros_like(A), A)
    branch = torch.where(single, 0, branch)
    if step_norm == "std":
        dev = torch.zeros(n_c, dtype=R.dtype).index_add_(0, clusters, (R - V[clusters]) ** 2)
        std = torch.sqrt(dev / (size - 1).clamp_min(1))
        A = A / (std[clusters] + 1e-6)
    return A.float(), {"branch": branch, "peers": peers.long(), "size": n.long()}


def bipace_advantages(R: torch.Tensor, step_returns: torch.Tensor, turn_mask: torch.Tensor, group_ids: torch.Tensor,
                      hidden: torch.Tensor, actions: list[list], eps: float, *, mode: str = "mean_norm",
                      w: float = 1.0, ref: str = "first", key_kind: str = "parsed", baseline: str = "pace",
                      min_peers: int = 2, step_norm: str = "none",
                      giant_share: float = 0.5) -> tuple[torch.Tensor, dict]:
    """Joint advantages [N, K] (module docstring) from episode rewards R [N], step returns [N, K], the turn mask,
    prompt-group ids [N], hidden summaries [N, K, H] and action strings ``actions[i][k]``; plus metrics."""
    AE = group_normalize(R, group_ids, GROUP_MODES[mode])
    idx = turn_mask.bool().nonzero(as_tuple=False)  # [M, 2], rows in trajectory-then-step order
    if idx.numel() == 0:
        return torch.zeros_like(step_returns), {}
    g = group_ids[idx[:, 0]]
    z = hidden[idx[:, 0], idx[:, 1]]
    clus = torch.zeros(len(idx), dtype=torch.long)
    n_clusters = 0
    giant = 0
    for gg in torch.unique(g):
        members = (g == gg).nonzero().squeeze(1)
        labels = torch.tensor(cluster_group(z[members], eps, ref), dtype=torch.long)
        clus[members] = labels + n_clusters
        n_clusters += int(labels.max()) + 1
        if len(members) > 1:
            giant += int((torch.bincount(labels).float() / len(members) > giant_share).sum())
    kp = [action_key(actions[i][k], key_kind) for i, k in idx.tolist()]
    vals = step_returns[idx[:, 0], idx[:, 1]]
    AS, cnt = counterfactual_advantages(vals, clus, [k for k, _ in kp], baseline=baseline, min_peers=min_peers,
                                        step_norm=step_norm)
    A = torch.zeros_like(step_returns)
    A[idx[:, 0], idx[:, 1]] = AS.to(A.dtype)
    A = (AE[:, None] + w * A) * turn_mask
    sizes = torch.bincount(clus, minlength=n_clusters).float()
    br = cnt["branch"]
    m = {"bipace_epsilon": float(eps), "bipace_clusters": float(n_clusters),
         "bipace_cluster_size": float(sizes.mean()),
         "bipace_singleton_share": float((sizes == 1).float().mean()),
         "bipace_steps_in_singletons": float((br == 0).float().mean()),
         "bipace_pace_share": float((br == 1).float().mean()),
         "bipace_rloo_share": float((br == 2).float().mean()),
         "bipace_peer_count": float(cnt["peers"].float().mean()),
         "bipace_parse_rate": float(np.mean([p for _, p in kp])),
         "bipace_cluster_p90": float(np.percentile(sizes.numpy(), 90)),
         "bipace_giant_clusters": float(giant)}
    return A, m


# ---------------------------------------------------------------------------------------------------- algorithm
class BiPACE(LMAlgorithm):
    """Bisimulation-guided grouping (hidden-state clusters) + Q-style action-counterfactual step baseline, on top
    of GiGPO's episode-level advantage."""

    name = "bipace"
    Config = BiPACEConfig
    needs_hidden = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.epsilon: float | None = None  # calibrated ε, frozen after the first batch (saved in algo_state)

    def configure_agent(self, agent) -> None:
        """The shared sampling options, plus the layer the recorded hidden summaries read (`hidden_layer`)."""
        super().configure_agent(agent)
        samp = getattr(agent, "sampling", None)
        if samp is not None and hasattr(samp, "hidden_layer"):
            samp.hidden_layer = self.config.hidden_layer

    def evaluate(self, env_id: str, agent, **kw) -> dict:
        """The shared evaluation, without recording hidden states (nothing uses them there)."""
        samp: Any = getattr(agent, "sampling", None)  # duck-typed: the LM agents' SamplingConfig
        old = getattr(samp, "record_hidden", None)
        if old is not None:
            samp.record_hidden = False
        try:
            return super().evaluate(env_id, agent, **kw)
        finally:
            if old is not None:
                samp.record_hidden = old

    def algo_state(self) -> dict:
        return {"epsilon": self.epsilon}

    def load_algo_state(self, state: dict) -> None:
        self.epsilon = state.get("epsilon")

    def current_epsilon(self, z: torch.Tensor, groups: torch.Tensor) -> tuple[float, bool]:
        """(ε for this batch, whether it was calibrated on it) following `epsilon` / `eps_schedule`."""
        c = self.config
        if c.epsilon is not None:
            return float(c.epsilon), False
        if self.epsilon is not None and c.eps_schedule == "first_batch":
            return self.epsilon, False
        eps: float | None
        if c.eps_target_singleton is not None:
            eps = calibrate_epsilon_singleton(z, groups, c.eps_target_singleton, c.cluster_ref)
        else:
            eps = calibrate_epsilon(z, groups, c.eps_percentile, distinct=c.eps_pairs == "distinct")
        if eps is None:  # no group has two steps yet: exact duplicates only, calibrate on a later batch
            return 0.0, False
        self.epsilon = eps
        return eps, True

    def compute_advantages(self, batch: Batch, ctx: Ctx) -> Advantages:
        c = self.config
        t0 = time.perf_counter()
        hid = batch.turn_hidden.get(c.hidden_pooling)
        if hid is None:
            raise ConfigError(f"bipace needs the per-turn hidden summary {c.hidden_pooling!r} (turn.hidden); roll out "
                              "with an LM agent that records it (LMAgent(record_hidden=True), set by the trainer)")
        R = trajectory_reward(batch, c.reward)
        Rk = turn_returns_to_go(batch, c.gamma)
        idx = batch.turn_mask.nonzero(as_tuple=False)
        eps, calibrated = self.current_epsilon(hid[idx[:, 0], idx[:, 1]].cpu(), batch.group_ids[idx[:, 0]].cpu())
        if not math.isfinite(eps):  # non-finite hidden states (a diverged model)
            raise ConfigError(f"bipace: ε is {eps}; the hidden states are not finite, or set `epsilon` in [0, 2]")
        actions = [[t.action for t in tr.turns] for tr in batch.trajectories]
        # clustering loops over steps in Python: do it on the CPU whatever the batch's device
        A, m = bipace_advantages(R.cpu(), Rk.cpu(), batch.turn_mask.float().cpu(), batch.group_ids.cpu(), hid.cpu(),
                                 actions, eps, mode=c.mode, w=c.step_advantage_w, ref=c.cluster_ref,
                                 key_kind=c.action_key, baseline=c.baseline, min_peers=c.min_peers,
                                 step_norm=c.step_norm, giant_share=c.giant_cluster_share)
        if m.get("bipace_giant_clusters", 0) > 0:
            warnings.warn(f"bipace: {int(m['bipace_giant_clusters'])} cluster(s) hold more than "
                          f"{c.giant_cluster_share:.0%} of their prompt group's steps (ε = {eps:.4g}); the step "
                          "baseline degrades toward GRPO's", stacklevel=2)
        m["bipace_epsilon_calibrated"] = float(calibrated)
        m["bipace_adv_s"] = time.perf_counter() - t0
        return Advantages(adv=batch.turn_to_tokens(A.to(batch.turn_mask.device)), metrics=m)
