"""GiGPO for the Shopping LM agent (docs/algorithms/gigpo.md).

Feng, Xue, Liu, An, "Group-in-Group Policy Optimization for LLM Agent Training", arXiv 2505.10978 (NeurIPS 2025),
§3 (episode-level and step-level relative advantages); reference code langfengQ/verl-agent ``core_gigpo.py``.

    episode:  A^E_i = R_i − mean_g R                       (mode mean_norm; mean_std_norm divides by std + 1e-6)
    step:     R_{i,k} = r_{i,k} + γ R_{i,k+1}  (γ = 0.95)
              anchor group = rows of one task group whose anchor state is identical (``info["anchor"]``);
              A^S_{i,k} = R_{i,k} − mean_{anchor group} R  (singleton anchor group → 0)
    joint:    A_{i,k} = A^E_i + w·A^S_{i,k}  broadcast to the tokens of action k
    loss:     clipped surrogate (ε = 0.2) + β_KL·k3 (0.01), token-mean

Option ``enable_similarity``: anchor groups by greedy clustering of anchor texts with difflib ratio ≥ threshold.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from baselines.core.advantages import GROUP_MODES, Reward, trajectory_reward, turn_returns_to_go
from baselines.core.batch import Batch
from baselines.core.config import AggMode
from baselines.core.stats import group_index, group_normalize, group_stats
from baselines.core.trainer import Advantages, Ctx, LMAlgorithm, LMConfig
from shopsim.configs import bounded

MODES = GROUP_MODES  # the mode names of `mode` (shared with BiPACE through baselines.core.advantages)


@dataclass
class GiGPOConfig(LMConfig):
    """GiGPO's options; the defaults are verl-agent's WebShop recipe (arXiv 2505.10978, §3)."""

    gamma: float = bounded(0.95, min=0, max=1)
    """Discount of the step-level returns R_{i,k} = r_{i,k} + γ R_{i,k+1}."""
    step_advantage_w: float = bounded(1.0, min=0)
    """w: weight of the step-level advantage in A = A^E + w·A^S."""
    mode: Literal["mean_norm", "mean_std_norm"] = "mean_norm"
    """Episode-level advantage: R − group mean ('mean_norm') or also divided by the group std ('mean_std_norm')."""
    enable_similarity: bool = False
    """Group anchor states by text similarity (difflib ratio >= `similarity_thresh`) instead of identity."""
    similarity_thresh: float = bounded(0.95, gt=0, max=1)
    """Similarity threshold of `enable_similarity`."""
    group_size: int = 8
    tasks_per_iter: int = 16
    kl_coef: float = 0.01
    kl_kind: Literal["k1", "k3"] = "k3"
    lr: float = 1e-6
    clip_low: float = 0.2
    clip_high: float = 0.2
    loss_agg: AggMode = "token-mean"
    reward: Reward = "return"
    """Trajectory reward R_i of the episode-level advantage: the sum of env rewards ('return'), the final score,
    or the success flag."""
    env_kwargs: dict = field(default_factory=lambda: {"invalid_penalty": 0.1})
    """verl-agent's WebShop invalid-action penalty 0.1 (the env's ``invalid_penalty``); set {} for the env default."""


def anchor_key(turn) -> Any:
    """GiGPO's anchor-state key of a turn (the pre-action state without history): ``turn.extra["anchor"]``, else
    ``turn.info["anchor"]``, else the observation (its repr when it is not a string)."""
    a = turn.extra.get("anchor") if turn.extra else None
    if a is None:
        a = turn.info.get("anchor") if turn.info else None
    if a is None:
        a = turn.observation if isinstance(turn.observation, str) else repr(turn.observation)
    return a if isinstance(a, (str, int, float, tuple)) else repr(a)


def batch_anchors(batch: Batch) -> list[list[Any]]:
    """The anchor key of every turn of every trajectory of `batch` (``[i][k]``)."""
    return [[anchor_key(t) for t in tr.turns] for tr in batch.trajectories]


def similarity_clusters(texts: list[str], thresh: float) -> list[int]:
    """Greedy clustering: join the first cluster whose representative has difflib ratio ≥ thresh."""
    reps: list[str] = []
    out = []
    for s in texts:
        for j, r in enumerate(reps):
            if difflib.SequenceMatcher(None, s, r).ratio() >= thresh:
                out.append(j)
                break
        else:
            reps.append(s)
            out.append(len(reps) - 1)
    return out


def gigpo_advantages(R: torch.Tensor, step_returns: torch.Tensor, turn_mask: torch.Tensor, group_ids: torch.Tensor,
                     anchors: list[list], *, mode: str = "mean_norm", w: float = 1.0,
                     similarity: float | None = None) -> tuple[torch.Tensor, dict]:
    """Joint advantages [N, K] from episode returns R [N] and step returns [N, K] (see module docstring)."""
    norm = MODES[mode]
    AE = group_normalize(R, group_ids, norm)
    idx = turn_mask.nonzero(as_tuple=False)  # [M, 2] (i, k) of valid steps
    if idx.numel() == 0:
        return torch.zeros_like(step_returns), {"anchor_group_size": 0.0, "anchor_singleton_share": 0.0}
    g = group_ids[idx[:, 0]].tolist()
    keys = [anchors[i][k] for i, k in idx.tolist()]
    if similarity is not None:
        by_group: dict = {}
        for n, gg in enumerate(g):  # g and keys both have one entry per valid step
            by_group.setdefault(gg, []).append(n)
        clus = [0] * len(keys)
        for members in by_group.values():
            labels = similarity_clusters([str(keys[n]) for n in members], similarity)
            for n, lab in zip(members, labels, strict=False):
                clus[n] = lab
        full = list(zip(g, clus, strict=False))
    else:
        full = list(zip(g, keys, strict=False))
    aid, _ = group_index(full)
    vals = step_returns[idx[:, 0], idx[:, 1]]
    AS = group_normalize(vals, aid, norm, singleton="zero")
    _, _, cnt = group_stats(vals, aid)
    A = torch.zeros_like(step_returns)
    A[idx[:, 0], idx[:, 1]] = AS
    A = (AE[:, None] + w * A) * turn_mask
    n_groups = int(aid.max()) + 1
    sizes = torch.bincount(aid, minlength=n_groups).float()
    return A, {"anchor_group_size": float(sizes.mean()), "anchor_singleton_share": float((sizes == 1).float().mean()),
               "anchor_steps_in_singletons": float((cnt == 1).float().mean())}


class GiGPO(LMAlgorithm):
    """Group-in-Group Policy Optimization: episode-level + anchor-state step-level relative advantages."""

    name = "gigpo"
    Config = GiGPOConfig

    def compute_advantages(self, batch: Batch, ctx: Ctx) -> Advantages:
        c = self.config
        R = trajectory_reward(batch, c.reward)
        Rk = turn_returns_to_go(batch, c.gamma)
        A, m = gigpo_advantages(R, Rk, batch.turn_mask.float(), batch.group_ids, batch_anchors(batch), mode=c.mode,
                                w=c.step_advantage_w, similarity=c.similarity_thresh if c.enable_similarity else None)
        return Advantages(adv=batch.turn_to_tokens(A), metrics=m)
