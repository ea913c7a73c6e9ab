"""The CA-PG family for early-stage retrieval: v-pg, v-pg-swr, ca-pg, ca-pg-swr, top1-pg (docs/algorithms/capg.md).

Kiyohara et al., "Credit-assigned Policy Gradient for Early Stage Retrieval in Two-stage Ranking", arXiv 2605.26385
(ICML 2026), §3-§4; defaults from the released code. One trainer, five estimators that
differ only in the differentiable term w_ℓ of the loss

    loss = −mean_batch mean_ℓ [ w_ℓ · r_ℓ ]           (no baseline; r_ℓ = observed reward at shown position ℓ)

* ``vpg``      w = log π_θ(S | x), the exact Plackett–Luce likelihood of the ordered candidate set
* ``vpg_swr``  w = Σ_k log softmax(s)(a_k), each pick as a with-replacement draw
* ``capg``     w = log P̂_θ(y_ℓ ∈ S | x) with the released approximation (see `capg_log_inclusion`)
* ``top1``     w = log softmax(s)(y_ℓ)   (M = 1)
* ``capg_swr`` w = logsumexp_m (K_m · log softmax(s_m)(y_ℓ))  (the released MoE term; default M = 5 [derived]);
  ``swr_inclusion="literal"`` uses log(1 − Π_m (1 − p_m(y))^{K_m}) instead (an alternative reading of the paper)

Optimiser Adagrad; lr 0.1 (vpg, vpg_swr), 0.01 (capg, top1, capg_swr); batch 128 contexts; 10 steps per iteration
("epoch"); evaluation on fresh contexts with deterministic top-K and deterministic LSR. A NaN/Inf gradient stops the
run and logs "gradient overflow" (``history[-1]["overflow"] == 1``).

``numerics="released"`` (default) computes the v-pg / ca-pg normalisers as the released code does,
A + log1p(−exp(B − A) + 1e-10) in float32 (A = logsumexp of all scores, B = of the removed items); it turns into
±inf/NaN once the removed items hold all but ~1e-7 of the mass, which is where v-pg overflows.
``numerics="stable"`` computes the remaining mass in float64 with an exact fallback instead.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

import numpy as np
import torch

from agents.retrieval_policies import MoERetriever, PLRetriever, gumbel_noise, gumbel_top_k, pl_log_prob
from baselines.core.loop import LoopAlgorithm, Run
from shopsim.configs import bounded, validate
from shopsim.envs.records import TWO_STAGE_RETRIEVAL
from shopsim.envs.two_stage_retrieval import (
    TwoStageRetrievalConfig,
    TwoStageRetrievalSim,
    load_splits,
    split_ids,
)
from shopsim.errors import ConfigError

log = logging.getLogger(__name__)

ESTIMATORS = ("vpg", "vpg_swr", "capg", "capg_swr", "top1")
DEFAULT_LR = {"vpg": 0.1, "vpg_swr": 0.1, "capg": 0.01, "top1": 0.01, "capg_swr": 0.01}


# ---------------------------------------------------------------------------------------------- estimator terms
def capg_log_inclusion(scores: torch.Tensor, y: torch.Tensor, owners: np.ndarray, numerics: str = "released"
                       ) -> torch.Tensor:
    """log P̂(y_ℓ ∈ S | x), (B, L), the released CA-PG inclusion probability (docs/algorithms/capg.md).

    p_k(a) = exp s_{o(k)}(a) / (Σ_all exp s_{o(k)} − Σ_{b ∈ B_{k−1}(a)} exp s_{o(k)}(b)), where B_{k−1}(a) is the
    first k−1 deterministic picks with a excluded (top-(k−1) by score for M = 1), a stand-in for the random earlier
    picks; P̂(a ∈ S) = 1 − Π_k (1 − p_k(a)), in log space with log1p and a 1e-10 guard. Gradients flow through
    numerators and normalisers; the sets B are chosen without gradient. Exact for K = 1 and for equal scores; see
    tests/test_capg.py for the measured error against enumeration.
    """
    b, m, n = scores.shape
    k, n_show = len(owners), y.shape[1]
    own = torch.as_tensor(owners, dtype=torch.long)
    s_y = scores.gather(2, y[:, None, :].expand(b, m, n_show))[:, own, :]  # (B, K, L): s_{o(k)}(y_ℓ)
    if k == 1:
        return torch.log_softmax(scores, -1).gather(2, y[:, None, :])[:, 0]
    with torch.no_grad():  # B_{K−1}(y_ℓ): the first K−1 deterministic picks with y_ℓ excluded
        if m == 1:  # one top-K for all ℓ: drop y_ℓ from it where present (a stable sort moves it last)
            top = torch.topk(scores[:, 0], k, dim=1).indices[:, None, :].expand(b, n_show, k)
            hit = (top == y[:, :, None]).to(torch.int8)
            prev = top.gather(2, torch.sort(hit, dim=2, stable=True).indices)[:, :, : k - 1]
        else:  # greedy MoE picks differ once y_ℓ is masked: one pass per shown item
            prev = torch.stack([gumbel_top_k(scores.scatter(2, y[:, None, j:j + 1].expand(b, m, 1), float("-inf")),
                                             owners, None)[:, : k - 1] for j in range(n_show)], 1)  # (B, L, K−1)
    g = scores[:, None, :, :].expand(b, n_show, m, n).gather(3, prev[:, :, None, :].expand(b, n_show, m, k - 1))
    g = g[:, :, own, :]  # (B, L, K, K−1): s_{o(k)}(b_j)
    earlier = torch.tril(torch.ones(k, k - 1, dtype=torch.bool), diagonal=-1)  # j < k
    lse_all = torch.logsumexp(scores, -1)[:, own][:, None, :]  # (B, 1, K)
    lse_rm = torch.logsumexp(g.masked_fill(~earlier, float("-inf")), -1)  # (B, L, K), −inf for k = 1
    if numerics == "released":  # the released code's normaliser A + log1p(−exp(B − A) + 1e-10)
        log_den = lse_all + torch.log1p(-torch.exp(lse_rm - lse_all) + 1e-10)
    elif numerics == "stable":  # float64 remaining mass; exact logsumexp where even that cancels
        diff = lse_rm.double() - lse_all.double()
        ok = diff < -1e-12
        log_den = lse_all.double() + torch.log(-torch.expm1(torch.where(ok, diff, torch.full_like(diff, -1.0))))
        bad = ~ok.all(-1)  # (B, L)
        if bad.any():
            rb, rl = bad.nonzero(as_tuple=True)
            pos = torch.full((len(rb), n), k, dtype=torch.long).scatter_(
                1, prev[rb, rl], torch.arange(k - 1).expand(len(rb), k - 1))
            mask = pos[:, None, :] < torch.arange(k)[None, :, None]  # item taken by B_{k−1}
            exact = torch.logsumexp(scores[rb][:, own, :].masked_fill(mask, float("-inf")), -1).double()
            log_den = log_den.index_put((rb, rl), exact)
        log_den = log_den.to(scores.dtype)
    else:
        raise ConfigError(f"numerics={numerics!r}; choose released or stable")
    p = torch.exp(s_y.transpose(1, 2) - log_den)
    log_not = torch.log1p(-torch.clamp(p, max=1.0 - 1e-7)).sum(-1)
    return torch.log(torch.clamp(-torch.expm1(log_not), min=1e-10))


def estimator_term(estimator: str, scores: torch.Tensor, cand: torch.Tensor, shown: torch.Tensor,
                   owners: np.ndarray, *, numerics: str = "released", swr_inclusion: str = "released"
                   ) -> torch.Tensor:
    """The differentiable w, (B, L) (or (B, 1) when the same for every shown position)."""
    own = torch.as_tensor(owners, dtype=torch.long)
    if estimator == "vpg":
        return pl_log_prob(scores, cand, owners, numerics)[:, None]
    if estimator == "vpg_swr":
        k = cand.shape[1]
        logp = torch.log_softmax(scores, -1).gather(2, cand[:, None, :].expand(-1, scores.shape[1], -1))
        return logp[:, own, torch.arange(k)].sum(1, keepdim=True)  # slot k scored by its owner expert
    if estimator == "capg":
        return capg_log_inclusion(scores, shown, owners, numerics)
    logp_y = torch.log_softmax(scores, -1).gather(2, shown[:, None, :].expand(-1, scores.shape[1], -1))  # (B,M,L)
    if estimator == "top1":
        if scores.shape[1] != 1:
            raise ConfigError("top1 is the M = 1 estimator; use capg_swr for a mixture of experts")
        return logp_y[:, 0]
    if estimator == "capg_swr":
        k_m = torch.as_tensor(np.bincount(owners), dtype=scores.dtype)[None, :, None]
        if swr_inclusion == "released":
            return torch.logsumexp(k_m * logp_y, dim=1)
        log_not = (k_m * torch.log1p(-torch.clamp(logp_y.exp(), max=1.0 - 1e-7))).sum(1)
        return torch.log(torch.clamp(-torch.expm1(log_not), min=1e-10))
    raise ConfigError(f"estimator={estimator!r}; choose one of {', '.join(ESTIMATORS)}")


# ---------------------------------------------------------------------------------------------- trainer
@dataclass
class CAPGConfig:
    """Options of the CA-PG family; the defaults are the released code's."""

    lr: float | None = bounded(None, gt=0)
    """Adagrad learning rate; None = the released default for the estimator (vpg/vpg_swr 0.1, others 0.01)."""
    optimizer: Literal["adagrad", "adam", "sgd"] = "adagrad"
    """adagrad (the released code) | adam | sgd."""
    batch_size: int = bounded(128, min=1)
    """Contexts per gradient step."""
    steps_per_iteration: int = bounded(10, min=1)
    """Gradient steps per iteration (the released code's 'epoch')."""
    eval_every: int = bounded(100, min=1)
    """Evaluate every this many iterations (the paper: every 1,000 steps); the last iteration is always evaluated."""
    eval_contexts: int = bounded(10_000, min=1)
    """Contexts of `eval_split` used for evaluation (deterministic top-K ESR and deterministic LSR)."""
    eval_split: Literal["dev", "test", "train"] = "dev"
    """Split whose contexts are evaluated (linear user tower)."""
    num_experts: int | None = bounded(None, min=1)
    """Experts M; None = 1, except capg_swr which defaults to 5 [derived]."""
    emb_dim: int = bounded(10, min=1)
    """Dimension of the user and item embeddings."""
    user_tower: Literal["linear", "id"] = "linear"
    """linear (u = W x: generalises to held-out users, evaluated on `eval_split`) | id (one embedding per user of a
    fixed pool of `n_users` task ids 0..n_users−1, the released code's model; trained and evaluated on that pool)."""
    n_users: int = bounded(1000, min=1)
    """Size of the user pool of the id tower (the released code's n_user)."""
    numerics: Literal["released", "stable"] = "released"
    """released (the released code's float32 normaliser) | stable (float64 + exact fallback); vpg and capg."""
    swr_inclusion: Literal["released", "literal"] = "released"
    """capg_swr term: released (logsumexp_m K_m log p_m) | literal (1 − Π_m (1 − p_m)^{K_m})."""
    stop_on_overflow: bool = True
    """Stop at the first NaN/Inf gradient and log 'gradient overflow' (as the released code does)."""
    env_kwargs: dict = field(default_factory=dict)
    """TwoStageRetrievalConfig fields (k, l, lsr, n_items, ...)."""

    def __post_init__(self) -> None:
        validate(self)
        try:
            TwoStageRetrievalConfig(**self.env_kwargs)  # validates the env options early
        except TypeError as exc:  # an unknown option: name the valid ones
            valid = ", ".join(f.name for f in dataclasses.fields(TwoStageRetrievalConfig))
            raise ConfigError(f"env_kwargs: {exc.args[0].split('() ')[-1]}; valid options: {valid}") from None


def evaluate_policy(agent: PLRetriever, sim: TwoStageRetrievalSim, task_ids: np.ndarray, seed: int = 0) -> float:
    """Mean value (softplus(q) + 1 of the shown items) of the deterministic top-K policy with deterministic LSR."""
    rng = np.random.default_rng(seed)
    x, z = sim.contexts(task_ids), sim.user_types(task_ids)
    cand, _ = agent.sample(x, rng, greedy=True, user_ids=task_ids if agent.scorer.n_users is not None else None)
    return float(sim.evaluate_batch(x, cand, rng, user_types=z, deterministic=True, validate=False).value.mean())


class CAPGTrainer(LoopAlgorithm):
    """Shared trainer of the CA-PG family; subclasses fix `estimator` (docs/algorithms/capg.md)."""

    name: ClassVar[str] = "capg_family"
    families: ClassVar[tuple[str, ...]] = ("retrieval",)
    Config: ClassVar[type] = CAPGConfig
    estimator: ClassVar[str] = ""
    default_env_id: ClassVar[str] = TWO_STAGE_RETRIEVAL.id

    @property
    def lr(self) -> float:
        return self.config.lr if self.config.lr is not None else DEFAULT_LR[self.estimator]

    @property
    def num_experts(self) -> int:
        if self.config.num_experts is not None:
            return self.config.num_experts
        return 5 if self.estimator == "capg_swr" else 1

    def make_agent(self, seed: int, env_id: str) -> PLRetriever:
        cls = MoERetriever if self.num_experts > 1 else PLRetriever
        if self.estimator == "top1" and self.num_experts != 1:
            raise ConfigError("top1 is the M = 1 estimator; use capg_swr for a mixture of experts")
        return cls(env_id=env_id, env_kwargs=self.config.env_kwargs, emb_dim=self.config.emb_dim,
                   num_experts=self.num_experts, seed=seed,
                   n_users=self.config.n_users if self.config.user_tower == "id" else None)

    def sample_ids(self, n: int, rng: np.random.Generator, splits: dict | None = None) -> np.ndarray:
        """Training task ids: the train split (linear tower) or the fixed user pool 0..n_users−1 (id tower)."""
        if self.config.user_tower == "id":
            return rng.integers(0, self.config.n_users, size=n)
        return split_ids("train", n, rng, splits)

    def loss(self, agent: PLRetriever, sim: TwoStageRetrievalSim, ids: np.ndarray, rng: np.random.Generator):
        """One on-policy batch: sample S by Gumbel-top-K, run the LSR and rewards, return (loss, mean reward)."""
        x, z = sim.contexts(ids), sim.user_types(ids)
        scores = agent.scores(x, ids if agent.scorer.n_users is not None else None)
        gumbel = gumbel_noise(rng, scores.shape)
        cand = gumbel_top_k(scores.detach(), agent.owners, gumbel)
        out = sim.evaluate_batch(x, cand.numpy(), rng, user_types=z, validate=False)
        w = estimator_term(self.estimator, scores, cand, torch.as_tensor(out.shown), agent.owners,
                           numerics=self.config.numerics, swr_inclusion=self.config.swr_inclusion)
        r = torch.as_tensor(out.position_rewards, dtype=scores.dtype)
        self.last_score_max = float(scores.detach().abs().max())  # logged: exp() overflows past ~88 in float32
        return -(w * r).mean(), float(out.reward.mean())

    # ------------------------------------------------------------------ steps of the shared loop
    def setup_run(self, run: Run) -> None:
        """Simulator, retriever (from `run.init` if given), optimizer, the training generator and eval users."""
        c = self.config
        self.sim = TwoStageRetrievalSim(TwoStageRetrievalConfig(**c.env_kwargs))
        self.agent = self.make_agent(run.seed, run.env_id)
        if run.init is not None:
            self.agent.scorer.load_state_dict(
                PLRetriever.from_checkpoint(run.init, env_id=run.env_id).scorer.state_dict())
        self.params = list(self.agent.scorer.parameters())
        opt_cls = {"adagrad": torch.optim.Adagrad, "adam": torch.optim.Adam, "sgd": torch.optim.SGD}[c.optimizer]
        self.opt = opt_cls(self.params, lr=self.lr)
        self.rng = np.random.default_rng(run.seed)
        self.splits = load_splits()
        if c.user_tower == "id":  # the paper's protocol: fresh draws of the same pool's users
            self.eval_ids = np.random.default_rng(run.seed + 1).integers(0, c.n_users, c.eval_contexts)
        elif c.eval_split == "train":
            self.eval_ids = split_ids("train", c.eval_contexts, np.random.default_rng(run.seed + 1), self.splits)
        else:
            self.eval_ids = np.asarray(self.splits[c.eval_split][: c.eval_contexts])
        self.step, self.train_seconds, self.overflow = 0, 0.0, False
        self.last_score_max = float("nan")

    def rng_streams(self) -> dict:
        return {"train": self.rng}

    def iteration(self, it: int) -> dict:
        """`steps_per_iteration` on-policy gradient steps; stops at a NaN/Inf gradient (`stop_on_overflow`)."""
        c = self.config
        losses, rewards = [], []
        t0 = time.perf_counter()
        for _ in range(c.steps_per_iteration):
            loss, mean_r = self.loss(self.agent, self.sim, self.sample_ids(c.batch_size, self.rng, self.splits),
                                     self.rng)
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            self.step += 1
            finite = bool(torch.isfinite(loss)) and all(
                p.grad is None or bool(torch.isfinite(p.grad).all()) for p in self.params)
            if not finite and c.stop_on_overflow:
                self.overflow = True
                log.warning("gradient overflow at step %d (%s, K=%d)", self.step, self.estimator, self.sim.config.k)
                break
            self.opt.step()
            losses.append(float(loss.detach()))
            rewards.append(mean_r)
        self.train_seconds += time.perf_counter() - t0
        return {"iteration": it, "step": self.step, "loss": float(np.mean(losses)) if losses else float("nan"),
                "reward": float(np.mean(rewards)) if rewards else float("nan"), "overflow": int(self.overflow),
                "score_max": self.last_score_max, "train_seconds": self.train_seconds}

    def eval_due(self, it: int, last: bool) -> bool:
        every = self.config.eval_every
        return self.overflow or last or it % every == every - 1

    def evaluation(self, it: int) -> dict:
        return {"value": evaluate_policy(self.agent, self.sim, self.eval_ids, self.run.seed)}

    def stop_after(self, it: int, row: dict) -> bool:
        return self.overflow

    def state_dict(self) -> dict:
        return {"scorer": self.agent.scorer.state_dict(), "optimizer": self.opt.state_dict(), "step": self.step,
                "train_seconds": self.train_seconds, "overflow": self.overflow,
                "last_score_max": self.last_score_max}

    def load_state_dict(self, state: dict) -> None:
        self.agent.scorer.load_state_dict(state["scorer"])
        self.opt.load_state_dict(state["optimizer"])
        self.step, self.train_seconds = int(state["step"]), float(state["train_seconds"])
        self.overflow, self.last_score_max = bool(state["overflow"]), float(state["last_score_max"])

    def save_checkpoint(self, directory: Path) -> Path:
        """The deterministic top-K retriever the paper evaluates (`greedy=True` only in the saved agent)."""
        training_greedy, self.agent.greedy = self.agent.greedy, True
        try:
            return self.agent.save(directory, algorithm=self.estimator, seed=self.run.seed, steps=self.step,
                                   config=dataclasses.asdict(self.config), overflow=self.overflow)
        finally:
            self.agent.greedy = training_greedy

    def result_agent(self) -> PLRetriever:
        self.agent.greedy = True  # the paper evaluates the deterministic top-K retriever
        return self.agent


def gradient_variance(trainer: CAPGTrainer, agent: PLRetriever, sim: TwoStageRetrievalSim, *, batches: int = 64,
                      batch_size: int = 128, seed: int = 0) -> dict:
    """Variance of the estimator's batch gradient at fixed parameters: tr Cov over `batches` independent batches,
    the squared norm of the mean gradient, and their ratio (scale-free, since estimators differ in scale)."""
    rng = np.random.default_rng(seed)
    params = list(agent.scorer.parameters())
    grads = []
    for _ in range(batches):
        loss, _ = trainer.loss(agent, sim, trainer.sample_ids(batch_size, rng), rng)
        g = torch.autograd.grad(loss, params)
        grads.append(torch.cat([t.reshape(-1) for t in g]).double())
    G = torch.stack(grads)
    if not torch.isfinite(G).all():
        return {"trace_cov": float("inf"), "mean_sq_norm": float("nan"), "relative": float("inf")}
    tr = float(G.var(0).sum())
    mn = float(G.mean(0).pow(2).sum())
    return {"trace_cov": tr, "mean_sq_norm": mn, "relative": tr / max(mn, 1e-30)}


class VPG(CAPGTrainer):
    """v-pg: REINFORCE with the exact PL log-likelihood of the candidate set (docs/algorithms/capg.md)."""

    name = "vpg"
    estimator = "vpg"


class VPGSwR(CAPGTrainer):
    """v-pg-swr: each pick scored as a with-replacement softmax draw (docs/algorithms/capg.md)."""

    name = "vpg_swr"
    estimator = "vpg_swr"


class CAPG(CAPGTrainer):
    """ca-pg: credit assigned to each shown item via its approximate inclusion probability (docs/algorithms/capg.md)."""

    name = "capg"
    estimator = "capg"


class CAPGSwR(CAPGTrainer):
    """ca-pg-swr: the released MoE term logsumexp_m K_m log p_m(y) (docs/algorithms/capg.md)."""

    name = "capg_swr"
    estimator = "capg_swr"


class Top1(CAPGTrainer):
    """top1-pg: log softmax of the shown item (docs/algorithms/capg.md)."""

    name = "top1"
    estimator = "top1"
