"""Early-stage retrievers for the two-stage retrieval env (CA-PG, arXiv 2605.26385 §3; docs/algorithms/capg.md).

* `PLRetriever`: Plackett–Luce two-tower retriever, scores s_θ(x, a) = u_x · e_a with u_x = W x (no bias) and a
  learned item table e (dimension 10, as in the released code); sampling is Gumbel-top-K (exactly a PL draw without
  replacement), evaluation is deterministic top-K.
* `MoERetriever`: M such towers ("experts"); expert m fills K_m = ⌊K/M⌋ slots (the first K mod M experts one more),
  experts pick in turn (expert 0 first) and items taken earlier are masked.
* `OracleRetriever`: the registered "expert": top-K by true expected reward (reads the env's privileged
  ``info["oracle"]``, or computes it from its own simulator).
* `RandomRetriever`: a uniformly random K-subset.

Every agent returns `Decision(action=np.ndarray[int64] of K item ids)`; learners add ``logprob`` (the PL
log-likelihood of the ordered set under the policy that acted).

The math shared with the trainers (`baselines.capg`) lives here: `gumbel_noise`, `gumbel_top_k`, `slot_owners`,
`pl_log_prob`.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from torch import nn

from agents.base import Agent, Decision, ScriptedAgent
from agents.registry import save_manifest
from shopsim.envs.records import TWO_STAGE_RETRIEVAL
from shopsim.errors import ConfigError
from shopsim.paths import atomic_write, write_text_atomic
from shopsim.statefile import load_weights

ENV_ID = TWO_STAGE_RETRIEVAL.id


def _env_config(env_kwargs: dict | None):
    from shopsim.envs.two_stage_retrieval import TwoStageRetrievalConfig

    return TwoStageRetrievalConfig(**(env_kwargs or {}))


def slot_owners(k: int, m: int) -> np.ndarray:
    """(K,) expert owning each candidate slot: K_m = ⌊K/M⌋, the first K mod M experts one more; in turn."""
    if not 1 <= m <= k:
        raise ConfigError(f"num_experts must be in [1, k={k}], got {m}")
    sizes = [k // m + (1 if i < k % m else 0) for i in range(m)]
    return np.repeat(np.arange(m), sizes)


class TwoTowerScorer(nn.Module):
    """M two-tower scorers s_m(x, a) = u_m(x) · e_{m,a} (no bias); returns scores (B, M, n_items).

    User tower: ``n_users=None`` → u_m(x) = W_m x, a linear map of the context features (generalises to unseen
    users); ``n_users=N`` → u_m = a learned embedding per user id 0..N−1, N(0, 1) initialised like nn.Embedding (the
    released code's model, whose contexts are ids of a fixed pool of users)."""

    def __init__(self, n_items: int, in_dim: int = 10, emb_dim: int = 10, num_experts: int = 1, seed: int = 0,
                 n_users: int | None = None):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.n_items, self.in_dim, self.emb_dim, self.num_experts = n_items, in_dim, emb_dim, num_experts
        self.n_users = n_users
        if n_users is None:
            bound = 1.0 / np.sqrt(in_dim)  # nn.Linear's default init, drawn from our generator for determinism
            self.user = nn.Parameter((torch.rand(num_experts, emb_dim, in_dim, generator=g) * 2 - 1) * bound)
        else:
            self.user = nn.Parameter(torch.randn(num_experts, n_users, emb_dim, generator=g))
        self.item = nn.Parameter(torch.randn(num_experts, n_items, emb_dim, generator=g))  # nn.Embedding default

    def forward(self, x: torch.Tensor, user_ids: torch.Tensor | None = None) -> torch.Tensor:
        if self.n_users is None:
            u = torch.einsum("med,bd->bme", self.user, x)
        else:
            if user_ids is None:
                raise ConfigError("this retriever has an id user tower: pass user_ids (task ids < n_users)")
            if int(user_ids.max()) >= self.n_users or int(user_ids.min()) < 0:
                raise ConfigError(f"user ids must be in [0, {self.n_users}) for an id user tower; use "
                                  "user_tower='linear' to act on users outside the training pool")
            u = self.user[:, user_ids].transpose(0, 1)
        return torch.einsum("bme,mne->bmn", u, self.item)


def gumbel_noise(rng: np.random.Generator, shape) -> torch.Tensor:
    """Standard Gumbel noise drawn from a numpy Generator (uniforms in float32, transformed in torch: ~3x faster
    than ``rng.gumbel`` in float64)."""
    u = torch.as_tensor(rng.random(size=tuple(shape), dtype=np.float32)).clamp_min_(1e-30)
    return -torch.log(-torch.log(u))


def gumbel_top_k(scores: torch.Tensor, owners: np.ndarray, gumbel: torch.Tensor | None) -> torch.Tensor:
    """Ordered candidate ids (B, K) from scores (B, M, n): each expert's block is a Gumbel-top-K_m over its scores
    with earlier picks masked (one PL draw without replacement per block); gumbel=None gives deterministic top-K."""
    with torch.no_grad():
        b, m, n = scores.shape
        key = scores if gumbel is None else scores + gumbel
        if m == 1:
            return torch.topk(key[:, 0], len(owners), dim=1).indices
        taken = torch.zeros(b, n, dtype=torch.bool)
        out = []
        for e in range(m):
            k_e = int((owners == e).sum())
            sel = torch.topk(key[:, e].masked_fill(taken, float("-inf")), k_e, dim=1).indices
            taken.scatter_(1, sel, True)
            out.append(sel)
        return torch.cat(out, dim=1)


def pl_log_prob(scores: torch.Tensor, ids: torch.Tensor, owners: np.ndarray, numerics: str = "stable"
                ) -> torch.Tensor:
    """log π(S | x) = Σ_k [ s_{o(k)}(a_k) − log Σ_{a ∉ {a_1..a_{k−1}}} exp s_{o(k)}(a) ]  (the v-pg term).

    numerics="stable": log of the remaining mass computed in float64, falling back to an exact logsumexp over the
    items still available where even that cancels (finite whenever the scores are).
    numerics="released": the released code's normaliser A + log1p(−exp(B − A) + 1e-10), A = logsumexp of all
    scores, B = logsumexp of the earlier picks, in the scores' dtype; once the earlier picks hold all but ~1e-7 of the
    mass (float32), B rounds to A and the term becomes ±inf/NaN ("gradient overflow").
    """
    own = torch.as_tensor(owners, dtype=torch.long)
    b, m, n = scores.shape
    k = ids.shape[1]
    # [b, slot, j] = s_{o(slot)}(a_j): gather per expert first, so nothing of size (B, K, n) is built here
    picked = scores.gather(2, ids[:, None, :].expand(b, m, k))[:, own, :]
    own_pick = picked.diagonal(dim1=1, dim2=2)  # s_{o(k)}(a_k)
    earlier = torch.tril(torch.ones(k, k, dtype=torch.bool), diagonal=-1)
    if numerics == "released":
        a_all = torch.logsumexp(scores, -1)[:, own]
        b_rm = torch.logsumexp(picked.masked_fill(~earlier, float("-inf")), -1)
        return (own_pick - (a_all + torch.log1p(-torch.exp(b_rm - a_all) + 1e-10))).sum(-1)
    if numerics != "stable":
        raise ConfigError(f"numerics={numerics!r}; choose stable or released")
    # log Σ_{remaining} exp s = lse_all + log(1 − exp(lse_removed − lse_all)), in float64 so the subtraction keeps
    # ~16 digits; rows where even that cancels fall back to an exact logsumexp over the remaining items.
    lse_all = torch.logsumexp(scores, -1)[:, own].double()
    diff = torch.logsumexp(picked.double().masked_fill(~earlier, float("-inf")), -1) - lse_all
    ok = diff < -1e-12
    # where() keeps the cancelled entries out of the graph (a NaN gradient would leak through otherwise)
    lse = lse_all + torch.log(-torch.expm1(torch.where(ok, diff, torch.full_like(diff, -1.0))))
    bad = ~ok.all(1)
    if bad.any():
        rows = bad.nonzero()[:, 0]
        sb, ib = scores[rows], ids[rows]
        pos = torch.full((len(ib), n), k, dtype=torch.long).scatter_(1, ib, torch.arange(k).expand(len(ib), k))
        mask = pos[:, None, :] < torch.arange(k)[None, :, None]
        exact = torch.logsumexp(sb[:, own, :].masked_fill(mask, float("-inf")), dim=-1).double()
        lse = lse.index_put((rows,), exact)
    return (own_pick.double() - lse).sum(-1).to(scores.dtype)


class PLRetriever(Agent):
    """Plackett–Luce two-tower retriever. Samples with Gumbel-top-K, or acts greedily (`greedy=True`)."""

    name = "pl_retriever"
    learns = True
    default_experts = 1

    def __init__(self, *, env_id: str = ENV_ID, env_kwargs: dict | None = None, emb_dim: int = 10,
                 num_experts: int | None = None, greedy: bool = False, seed: int = 0, n_users: int | None = None,
                 scorer: TwoTowerScorer | None = None) -> None:
        cfg = _env_config(env_kwargs)
        self.env_id, self.env_kwargs, self.greedy = env_id, dict(env_kwargs or {}), greedy
        self.k, self.n_items, self.in_dim = cfg.k, cfg.n_items, cfg.dim
        m = self.default_experts if num_experts is None else num_experts
        self.owners = slot_owners(self.k, m)
        self.scorer = scorer or TwoTowerScorer(cfg.n_items, cfg.dim, emb_dim, m, seed, n_users)
        if self.scorer.num_experts != m or self.scorer.n_items != cfg.n_items:
            raise ConfigError("scorer shape does not match env_kwargs/num_experts")
        self.rng = np.random.default_rng(seed)

    @property
    def num_experts(self) -> int:
        return self.scorer.num_experts

    def scores(self, contexts, user_ids=None) -> torch.Tensor:
        """(B, M, n_items) scores; `user_ids` (task ids) are needed by an id user tower only."""
        x = torch.as_tensor(np.asarray(contexts, dtype=np.float32))
        uid = None if user_ids is None else torch.as_tensor(np.asarray(user_ids, dtype=np.int64))
        return self.scorer(x, uid)

    def sample(self, contexts: np.ndarray, rng: np.random.Generator | None = None, greedy: bool | None = None,
               user_ids=None) -> tuple[np.ndarray, np.ndarray]:
        """Candidate sets (B, K) int64 and their PL log-probs (B,) for a batch of contexts."""
        greedy = self.greedy if greedy is None else greedy
        rng = self.rng if rng is None else rng
        with torch.no_grad():
            s = self.scores(contexts, user_ids)
            g = None if greedy else gumbel_noise(rng, s.shape)
            ids = gumbel_top_k(s, self.owners, g)
            lp = pl_log_prob(s, ids, self.owners)
        return ids.numpy().astype(np.int64), lp.numpy().astype(np.float64)

    def act(self, observations, infos, slots) -> list[Decision]:
        uid = [i.get("task_id") for i in infos] if self.scorer.n_users is not None else None
        ids, lp = self.sample(np.stack([np.asarray(o, dtype=np.float32) for o in observations]), user_ids=uid)
        return [Decision(action=ids[i], logprob=float(lp[i])) for i in range(len(ids))]

    # ------------------------------------------------------------------ checkpoints
    def save(self, directory, **info) -> Path:
        directory = Path(directory)
        with atomic_write(directory / "retriever.pt") as tmp:
            torch.save(self.scorer.state_dict(), tmp)
        write_text_atomic(directory / "retriever.json", json.dumps({
            "env_kwargs": self.env_kwargs, "emb_dim": self.scorer.emb_dim, "num_experts": self.num_experts,
            "n_users": self.scorer.n_users, "greedy": self.greedy}))
        save_manifest(directory, type(self), self.env_id, **info)
        return directory

    @classmethod
    def from_checkpoint(cls, directory, env_id: str = ENV_ID, **kw):
        directory = Path(directory)
        meta = json.loads((directory / "retriever.json").read_text())
        kw.setdefault("greedy", meta.get("greedy", False))
        agent = cls(env_id=env_id, env_kwargs=meta["env_kwargs"], emb_dim=meta["emb_dim"],
                    num_experts=meta["num_experts"], n_users=meta.get("n_users"), **kw)
        agent.scorer.load_state_dict(load_weights(directory / "retriever.pt"))
        return agent


class MoERetriever(PLRetriever):
    """Mixture-of-experts PL retriever: M two-tower experts fill the K slots in turn (default M = 5)."""

    name = "moe_retriever"
    default_experts = 5


class OracleRetriever(ScriptedAgent):
    """Top-K by the true expected reward (μ = softplus(q) + 1), which maximises the value under every LSR variant.

    Uses the env's privileged ``info["oracle"]["top_k"]`` when present, else its own simulator built from
    `env_kwargs` (which must then match the env's)."""

    name = "oracle_retriever"

    def __init__(self, *, env_id: str = ENV_ID, env_kwargs: dict | None = None) -> None:
        self.env_id, self.env_kwargs = env_id, dict(env_kwargs or {})
        self._sim = None

    @property
    def sim(self):
        if self._sim is None:
            from shopsim.envs.two_stage_retrieval import TwoStageRetrievalSim

            self._sim = TwoStageRetrievalSim(_env_config(self.env_kwargs))
        return self._sim

    def act_one(self, slot, observation, info):
        if "oracle" in info:
            return np.asarray(info["oracle"]["top_k"], dtype=np.int64)
        return self.sim.oracle_candidates(np.asarray(observation, dtype=np.float32)[None, :])[0]


class RandomRetriever(ScriptedAgent):
    """A uniformly random K-subset of the catalog (in random order)."""

    name = "random_retriever"

    def __init__(self, *, env_id: str = ENV_ID, env_kwargs: dict | None = None, seed: int | None = None) -> None:
        cfg = _env_config(env_kwargs)
        self.env_id, self.k, self.n_items = env_id, cfg.k, cfg.n_items
        self.rng = np.random.default_rng(seed)

    def sample(self, n: int, rng: np.random.Generator | None = None) -> np.ndarray:
        """(n, K) uniform K-subsets, vectorised (argpartition of uniform keys)."""
        rng = self.rng if rng is None else rng
        return np.argpartition(rng.random((n, self.n_items)), self.k - 1, axis=1)[:, : self.k].astype(np.int64)

    def act_one(self, slot, observation, info):
        return self.rng.choice(self.n_items, size=self.k, replace=False).astype(np.int64)
