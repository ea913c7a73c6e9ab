"""ProRL and its two controls on the proactive-recommendation env (docs/algorithms/prorl.md).

Hou et al., "ProRL: Effective Reinforcement Learning for Proactive Recommendation via Rectified Policy Gradient
Estimation", arXiv 2605.28293 (code: hongruhou89/ProRL). Three registered algorithms share one on-policy iteration
(`_RecPG.iteration`, run by the shared loop `baselines.core.loop`): sample `group_size` (16) paths per prompt from
the semantic-ID policy (`agents.rec_model`, one pass of constrained decoding per path, as in the paper), score every
path with the env's batched `PathScorer` (identical to stepping the env, see tests), compute advantages, take one
gradient step. They differ only where the papers differ:

* `RecReinforce` ("reinforce"): reward = the raw fused step rewards summed over the path; credit
  A_i = R_i − batch mean on every item and EOS; item log-prob = sum of its tokens; no KL.
* `RecGRPO` ("grpo"): the same R_i; A_i = (R_i − mean_g)/(std_g + 1e-6) on every generated token;
  seq-mean-token-mean; k3 KL, β = 0.
* `ProRL` ("prorl"): per-component centred + normalised step rewards (running statistics frozen after RL epoch 1);
  position-specific credit A_{i,k} = G_{i,k} − b_k over the group's rollouts active at k; item log-prob = mean of
  its 4 tokens; K1 KL, β = 0.01.

Raw fused reward (env reward): w_ctr·CTR + w_ioi·IoI + w_ior·IoR/n_items; invalid items use the env's fixed
penalties for the raw arms and ProRL's batch-min rule for ProRL. One RL *epoch* is a pass over
`num_train_prompts` fixed train scenarios. The sampled policy runs with dropout off, so the update is exactly
on-policy (no importance ratio; GRPO's clip is then inactive and kept only for form).

ProRL details as implemented: Welford statistics over real (valid, non-duplicate) items, updated during RL
epoch 1 only, then frozen; r_k fused as w_ctr·r̃_CTR/L_max + w_ioi·r̃_IoI + w_ior·r̃_IoR with σ floored at
`min_std`; G with γ = 1, G = 0 at the EOS position; b_k over the same prompt's rollouts active at k (an item at k,
or the first EOS at k); A = 0 when inactive; ℓ_k = mean of the 4 token log-probs, ℓ_eos = the first EOS's log-prob
(0 when forced after L_max items, so it carries no gradient); K1 KL on sampled items + EOS, β = 0.01; AdamW wd 0.05,
5 % warm-up then constant, grad clip 1.0; invalid item CTR −1 and IoI/IoR = batch min of valid − 1, duplicate
CTR 0. The loss is divided by the number of rollouts B where the paper divides by N_valid (rollouts with a valid
structure): decoding here is structurally constrained (4 code tokens per item, EOS only at item boundaries), so
every rollout parses and N_valid = B.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from agents.rec_model import beam_search, item_logprobs, token_logprobs
from agents.rec_policies import RecPolicyAgent, policy_paths, pretrained_policy
from baselines.core.loop import LoopAlgorithm, Run
from baselines.core.losses import aggregate, clipped_surrogate, kl_term
from baselines.core.stats import group_normalize
from shopsim.configs import bounded, validate
from shopsim.envs.proactive_rec import L_MAX, PathScorer, RewardWeights
from shopsim.envs.proactive_rec.env import load_split
from shopsim.envs.proactive_rec.scoring import PathScores, path_metrics
from shopsim.envs.records import PROACTIVE_REC
from shopsim.errors import ConfigError

ENV_ID = PROACTIVE_REC.id
COMPONENTS = ("IoI", "IoR", "CTR")


@dataclass
class RecPGConfig:
    """Options shared by the three ProactiveRec algorithms; the defaults are ProRL's (ML-1M,
    docs/algorithms/prorl.md)."""

    catalog_size: int = bounded(5000, min=1)
    """Catalog size of the env world (the policy and simulator are built for it)."""
    catalog_seed: int = 0
    """Seed of the env world's catalog."""
    simulator: Literal["sasrec", "analytic"] = "sasrec"
    """'sasrec' or 'analytic' (see shopsim.envs.proactive_rec.simulator)."""
    group_size: int = bounded(16, min=2)
    """Rollouts per prompt (ProRL: 16); group baselines need at least 2."""
    prompts_per_iter: int = bounded(8, min=1)
    """Prompts (train scenarios) per iteration, each with `group_size` rollouts."""
    num_train_prompts: int = bounded(512, min=1)
    """One RL epoch = one pass over this many fixed train scenarios."""
    lr: float = bounded(1e-4, gt=0)
    """ProRL: 1e-4 (ML-1M)."""
    weight_decay: float = bounded(0.05, min=0)
    """AdamW weight decay."""
    warmup_frac: float = bounded(0.05, min=0, max=1)
    """Linear learning-rate warm-up over this share of the iterations, then constant."""
    max_grad_norm: float = bounded(1.0, gt=0)
    """Gradient-norm clip per step."""
    temperature: float = bounded(1.0, gt=0)
    """Sampling temperature of the rollouts."""
    beta: float = bounded(0.01, min=0)
    """KL coefficient to the frozen pre-trained policy."""
    w_ctr: float = 1.0
    """Weight of the click-through reward (CTR) in the fused reward."""
    w_ioi: float = 1.0
    """Weight of the interest-of-item reward (IoI) in the fused reward."""
    w_ior: float = 1.0
    """Weight of the interest-of-recommendation reward (IoR) in the fused reward."""
    eval_every: int = bounded(10, min=1)
    """Evaluate every this many iterations (and after the last)."""
    eval_tasks: int = bounded(64, min=1)
    """Held-out users (dev split) decoded greedily for evaluation."""
    sft_users: int = bounded(1500, min=1)
    """Train users of the supervised pre-training that gives the starting policy
    (`agents.rec_policies.pretrained_policy`, cached)."""
    sft_steps: int = bounded(400, min=0)
    """Steps of that supervised pre-training."""
    early_stop_valid_share: float = bounded(0.3, min=0, max=1)
    """Stop when the share of rollouts with only real items stays below this for `early_stop_patience` epochs."""
    early_stop_patience: int = bounded(3, min=1)
    """RL epochs below `early_stop_valid_share` before the run stops."""
    valid_only: bool = False
    """Constrain decoding to real semantic IDs (prefix trie). False = ProRL's setting (hallucinations possible)."""
    no_repeat: bool = False
    """Exclude history and earlier path items while decoding (rollouts and evaluation). False = ProRL's setting
    (duplicates possible, charged CTR := 0)."""
    grad_var: bool = False
    """Log the per-iteration gradient variance (`grad_var`, `grad_var_rel` columns): the policy-gradient loss is
    back-propagated once per prompt group and the step takes the mean of the group gradients (the same gradient up to
    float rounding). Off by default: one backward pass per iteration."""

    def __post_init__(self) -> None:
        validate(self)
        if self.num_train_prompts < self.prompts_per_iter:
            raise ConfigError(f"num_train_prompts={self.num_train_prompts} is below prompts_per_iter="
                              f"{self.prompts_per_iter}; raise it or lower prompts_per_iter")



class RunningStats:
    """Per-component running mean/std over real items (batched Welford / Chan et al.); `frozen` stops updates."""

    def __init__(self, k: int):
        self.count = np.zeros(k)
        self.mean = np.zeros(k)
        self.m2 = np.zeros(k)
        self.frozen = False

    def update(self, values: np.ndarray) -> None:
        """values [N, k] (rows = real items)."""
        if self.frozen or not len(values):
            return
        self.count, self.mean, self.m2 = _chan_update(self.count, self.mean, self.m2, values)

    @property
    def std(self) -> np.ndarray:
        return np.sqrt(self.m2 / np.maximum(self.count, 1))


def _chan_update(count, mean, m2, values: np.ndarray):
    """Merge a batch values [N, k] into running (count, mean, m2) (Chan et al.'s parallel Welford step)."""
    n_b = len(values)
    mean_b = values.mean(0)
    m2_b = ((values - mean_b) ** 2).sum(0)
    tot = count + n_b
    delta = mean_b - mean
    return tot, mean + delta * n_b / tot, m2 + m2_b + delta ** 2 * count * n_b / tot


class PositionStats(RunningStats):
    """Running mean/std per path position: row 0 pools every position, row k + 1 holds position k (0-based);
    `frozen` stops updates. Used by ProRL's centering='position' ([derived], docs/algorithms/prorl.md)."""

    def __init__(self, length: int, k: int, min_count: int = 2):
        self.count = np.zeros((length + 1, k))
        self.mean = np.zeros((length + 1, k))
        self.m2 = np.zeros((length + 1, k))
        self.frozen = False
        self.min_count = min_count

    def update(self, values: np.ndarray, positions: np.ndarray | None = None) -> None:
        """values [N, k] (rows = real items) at path positions [N] (0-based)."""
        if self.frozen or not len(values):
            return
        assert positions is not None, "PositionStats.update needs the positions"
        rows = [(0, np.ones(len(values), dtype=bool))]
        rows += [(j + 1, positions == j) for j in range(len(self.count) - 1)]
        for row, sel in rows:
            if sel.any():
                self.count[row], self.mean[row], self.m2[row] = _chan_update(self.count[row], self.mean[row],
                                                                             self.m2[row], values[sel])

    def per_position(self) -> tuple[np.ndarray, np.ndarray]:
        """(mean, std) [L, k] per position; a position with fewer than `min_count` items takes the pooled row."""
        few = self.count[1:] < self.min_count
        std = self.std
        return np.where(few, self.mean[:1], self.mean[1:]), np.where(few, std[:1], std[1:])


def position_advantages(step_r: np.ndarray, lengths: np.ndarray, group_ids: np.ndarray, gamma: float = 1.0):
    """ProRL's position-specific advantages (docs/algorithms/prorl.md).

    step_r [B, L] (zero past the path), lengths [B] -> (A [B, L+1], active [B, L+1]): G_{i,k} = Σ_{j≥k} γ^{j−k} r_{i,j}
    (G = 0 at the EOS position k = n_i), active(i,k) = k ≤ n_i, b_k = mean of G over the group's active rollouts,
    A = (G − b_k)·active.
    """
    b, length = step_r.shape
    g = np.zeros((b, length + 1))
    for k in range(length - 1, -1, -1):
        g[:, k] = step_r[:, k] + gamma * g[:, k + 1]
    active = np.arange(length + 1)[None] <= lengths[:, None]
    g = g * active
    adv = np.zeros_like(g)
    for gid in np.unique(group_ids):
        rows = group_ids == gid
        cnt = active[rows].sum(0)
        base = np.where(cnt > 0, (g[rows] * active[rows]).sum(0) / np.maximum(cnt, 1), 0.0)
        adv[rows] = (g[rows] - base) * active[rows]
    return adv, active


class _RecPG(LoopAlgorithm):
    """Shared on-policy loop (module docstring); subclasses define `advantages` and `objective`."""

    families = ("rec",)
    Config = RecPGConfig
    invalid_rule = "fixed"
    default_env_id = ENV_ID
    train_options = ("agent",)

    @property
    def item_reduce(self) -> str:
        """How an item's token log-probs make its log-prob (`item_logprobs`: "mean" or "sum"); a subclass overrides
        it with a class attribute or a property."""
        return "mean"

    # ------------------------------------------------------------------ per-algorithm pieces
    def advantages(self, scores: PathScores, lengths: np.ndarray, group_ids: np.ndarray, epoch: int):
        """-> (item advantages [B, 10], EOS advantage [B], stats dict)."""
        raise NotImplementedError

    def _new_stats(self) -> RunningStats:
        return RunningStats(3)

    def raw_return(self, scores: PathScores) -> np.ndarray:
        c = self.config
        w = RewardWeights(c.w_ctr, c.w_ioi, c.w_ior, float(self._n_items))
        return (w.fuse(scores.ioi, scores.ior, scores.ctr) * scores.step_mask).sum(1)

    def objective(self, tok_lp, ref_tok_lp, lengths, item_adv, eos_adv):
        """Per-item policy-gradient loss (+ K1 KL per item when beta > 0), averaged over rollouts."""
        item_lp, eos_lp = item_logprobs(tok_lp, lengths, reduce=self.item_reduce)
        pg = (item_adv * item_lp).sum(1) + eos_adv * eos_lp
        loss = -pg.mean()
        kl = torch.zeros(())
        if ref_tok_lp is not None:
            ref_item, ref_eos = item_logprobs(ref_tok_lp, lengths, reduce=self.item_reduce)
            kl = (kl_term(item_lp, ref_item, "k1").sum(1) + kl_term(eos_lp, ref_eos, "k1")).mean()
            loss = loss + self.config.beta * kl
        return loss, {"kl": float(kl.detach())}

    # ------------------------------------------------------------------ steps of the shared loop
    def setup_run(self, run: Run) -> None:
        """Policy (a copy of `run.options["agent"]`, the checkpoint `run.init`, or the pre-trained policy), the frozen
        reference, AdamW with linear warm-up, the fixed train prompts, dev users and both generators."""
        c = self.config
        wk = dict(catalog_size=c.catalog_size, catalog_seed=c.catalog_seed, simulator=c.simulator)
        dec = dict(valid_only=c.valid_only, no_repeat=c.no_repeat)
        agent = run.options.get("agent")
        if agent is not None:
            agent = RecPolicyAgent(model=copy.deepcopy(agent.model), **dec, **wk)
        elif run.init is not None:
            agent = RecPolicyAgent.from_checkpoint(run.init, **dec, **wk)
        else:
            agent = pretrained_policy(**wk, n_users=c.sft_users, sft_steps=c.sft_steps, seed=0)
            agent = RecPolicyAgent(model=copy.deepcopy(agent.model), **dec, **wk)
        self.agent, self.world = agent, agent.world
        self._n_items = self.world.n_items
        self.policy = agent.model.eval()  # dropout off: sampling and update use the same distribution
        # the reference is the starting policy, rebuilt the same way on resume (it is never trained)
        self.ref = copy.deepcopy(self.policy).eval() if c.beta > 0 else None
        if self.ref is not None:
            for p in self.ref.parameters():
                p.requires_grad_(False)
        self.opt = torch.optim.AdamW(self.policy.parameters(), lr=c.lr, weight_decay=c.weight_decay)
        warm = max(1, int(c.warmup_frac * run.iterations))
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda s: min(1.0, (s + 1) / warm))
        self.scorer = PathScorer(self.world)
        self.rng = np.random.default_rng(run.seed)
        self.train_ids = self.rng.choice(900_000, size=c.num_train_prompts, replace=False)
        self.dev_ids = np.array(load_split()["dev"][: c.eval_tasks])
        self.iters_per_epoch = math.ceil(c.num_train_prompts / c.prompts_per_iter)
        self.gen = torch.Generator().manual_seed(run.seed)
        self.stats = self._new_stats()
        self.low_valid_epochs, self.order = 0, self.train_ids
        self.epoch_valid: list[float] = []

    def rng_streams(self) -> dict:
        return {"prompts": self.rng, "sampling": self.gen}

    def iteration(self, it: int) -> dict:
        """One gradient step on `prompts_per_iter` prompts × `group_size` sampled paths."""
        c = self.config
        epoch, pos = divmod(it, self.iters_per_epoch)
        if pos == 0:
            if epoch > 0:
                self.stats.frozen = True  # ProRL: statistics of RL epoch 1 only
                low = np.mean(self.epoch_valid) < c.early_stop_valid_share
                self.low_valid_epochs = self.low_valid_epochs + 1 if low else 0
                self.epoch_valid = []
            self.order = self.rng.permutation(self.train_ids)
        ids = self.order[pos * c.prompts_per_iter:(pos + 1) * c.prompts_per_iter]
        hist, tgt = self.world.tasks(ids)
        hist, tgt = np.repeat(hist, c.group_size, 0), np.repeat(tgt, c.group_size)
        group_ids = np.repeat(np.arange(len(ids)), c.group_size)
        prompts, gen_ids, _, items, lengths = policy_paths(self.agent, hist, tgt, greedy=False,
                                                           temperature=c.temperature, generator=self.gen)
        scores = self.scorer.score(hist, tgt, items, invalid=self.invalid_rule)
        item_adv, eos_adv, astats = self.advantages(scores, lengths, group_ids, epoch)
        len_t = torch.as_tensor(lengths)
        item_adv_t = torch.as_tensor(item_adv, dtype=torch.float32)
        eos_adv_t = torch.as_tensor(eos_adv, dtype=torch.float32)
        if c.grad_var:
            loss, lstats = self._grouped_backward(prompts, gen_ids, len_t, item_adv_t, eos_adv_t, group_ids)
        else:
            loss, lstats = self._loss(prompts, gen_ids, len_t, item_adv_t, eos_adv_t)
            self.opt.zero_grad()
            loss.backward()
        gnorm = float(torch.nn.utils.clip_grad_norm_(self.policy.parameters(), c.max_grad_norm))
        self.opt.step()
        self.sched.step()
        pm = path_metrics(scores)
        real_rollout = (scores.valid | ~scores.step_mask).all(1)
        self.epoch_valid.append(float(real_rollout.mean()))
        return {"iteration": it, "epoch": epoch, "loss": float(loss.detach()), "grad_norm": gnorm,
                "return_raw": float(self.raw_return(scores).mean()),
                **{f"sample_{k}": v for k, v in pm.items()},
                "sample_distinct": len({tuple(r) for r in items}) / len(items),
                # why lengths move: the share of sampled items that repeat one, and the credit of stopping
                "sample_dup_share": float((scores.duplicate & scores.step_mask).sum()
                                          / max(1, scores.step_mask.sum())),
                "eos_adv_mean": float(eos_adv[lengths < L_MAX].mean()) if (lengths < L_MAX).any() else 0.0,
                "valid_rollouts": float(real_rollout.mean()), **lstats, **astats}

    def _loss(self, prompts, gen_ids, lengths, item_adv, eos_adv):
        """The objective on these rollouts (teacher-forced log-probs of the policy and, with a KL, the reference)."""
        tok_lp = token_logprobs(self.policy, self.agent.vocab, prompts, gen_ids)
        ref_lp = None
        if self.ref is not None:
            with torch.no_grad():
                ref_lp = token_logprobs(self.ref, self.agent.vocab, prompts, gen_ids)
        return self.objective(tok_lp, ref_lp, lengths, item_adv, eos_adv)

    def _grouped_backward(self, prompts, gen_ids, lengths, item_adv, eos_adv, group_ids):
        """`grad_var`: the loss's gradient per prompt group g_p; sets .grad to their mean (= the batch gradient, the
        groups being equal in size) and logs grad_var = Σ_p ‖g_p − ḡ‖² / (P − 1), the trace of the per-prompt
        gradient covariance, and grad_var_rel = grad_var / ‖ḡ‖²."""
        params = [p for p in self.policy.parameters() if p.requires_grad]
        flats, losses, stats = [], [], []
        for g in np.unique(group_ids):
            rows = torch.as_tensor(np.flatnonzero(group_ids == g))
            loss_g, st = self._loss(prompts[rows], gen_ids[rows], lengths[rows], item_adv[rows], eos_adv[rows])
            grads = torch.autograd.grad(loss_g, params, allow_unused=True)
            flats.append(torch.cat([(torch.zeros_like(p) if gr is None else gr).reshape(-1)
                                    for p, gr in zip(params, grads, strict=True)]))
            losses.append(loss_g.detach())
            stats.append(st)
        flat = torch.stack(flats)
        mean = flat.mean(0)
        var = float(((flat - mean) ** 2).sum() / max(1, len(flats) - 1))
        self.opt.zero_grad()
        offset = 0
        for p in params:
            p.grad = mean[offset:offset + p.numel()].view_as(p).clone()
            offset += p.numel()
        out = {k: float(np.mean([st[k] for st in stats])) for k in stats[0]}
        out.update(grad_var=var, grad_var_rel=var / max(float(mean.pow(2).sum()), 1e-30))
        return torch.stack(losses).mean(), out

    def eval_due(self, it: int, last: bool) -> bool:
        return last or it % self.config.eval_every == 0

    def evaluation(self, it: int) -> dict:
        return {f"eval_{k}": v for k, v in evaluate(self.agent, self.scorer, self.dev_ids).items()}

    def stop_after(self, it: int, row: dict) -> bool:
        """Early stop once `early_stop_patience` epochs in a row had too few rollouts with only real items."""
        if self.low_valid_epochs >= self.config.early_stop_patience:
            row["early_stop"] = 1.0
            return True
        return False

    def state_dict(self) -> dict:
        st = self.stats
        return {"policy": self.policy.state_dict(), "optimizer": self.opt.state_dict(),
                "scheduler": self.sched.state_dict(),
                "stats": {"count": st.count, "mean": st.mean, "m2": st.m2, "frozen": st.frozen},
                "low_valid_epochs": self.low_valid_epochs, "epoch_valid": list(self.epoch_valid),
                "order": self.order}

    def load_state_dict(self, state: dict) -> None:
        self.policy.load_state_dict(state["policy"])
        self.opt.load_state_dict(state["optimizer"])
        self.sched.load_state_dict(state["scheduler"])
        st = state["stats"]
        self.stats.count, self.stats.mean, self.stats.m2 = st["count"].copy(), st["mean"].copy(), st["m2"].copy()
        self.stats.frozen = bool(st["frozen"])
        self.low_valid_epochs, self.epoch_valid = int(state["low_valid_epochs"]), list(state["epoch_valid"])
        self.order = np.asarray(state["order"])

    def save_checkpoint(self, directory: Path) -> Path:
        return self.agent.save(directory)


def evaluate(agent: RecPolicyAgent, scorer: PathScorer, task_ids, greedy: bool = True) -> dict[str, float]:
    """Greedy decoding on held-out users: env episode metrics + the share of distinct paths across users."""
    hist, tgt = agent.world.tasks(task_ids)
    _, _, _, items, _ = policy_paths(agent, hist, tgt, greedy=greedy, generator=torch.Generator().manual_seed(0))
    out = path_metrics(scorer.score(hist, tgt, items))
    out["distinct"] = len({tuple(r) for r in items}) / len(items)
    return out


def evaluate_beam(agent: RecPolicyAgent, scorer: PathScorer, task_ids, *, beams: int = 10,
                  ks=(1, 5, 10)) -> dict[str, float]:
    """ProRL's evaluation (docs/algorithms/prorl.md): beam search with `beams` beams; Metric@K = per user the max of
    the metric over the top-K beams, averaged over users, for IoI and IoR (path sums), CTR (mean per item, invalid =
    0) and length (of the beam with the best IoI among the top K)."""
    world = agent.world
    hist, tgt = world.tasks(task_ids)
    prompts = agent.vocab.prompts(world.sids.codes[tgt], world.sids.codes[hist])
    gen, _ = beam_search(agent.model, agent.vocab, prompts, beams=beams)
    b = len(tgt)
    codes, lengths = agent.vocab.decode(gen.reshape(b * beams, -1).numpy())
    s = scorer.score_codes(np.repeat(hist, beams, 0), np.repeat(tgt, beams), codes, lengths)
    n = s.step_mask.sum(1)
    per = {"IoI": s.ioi.sum(1), "IoR": s.ior.sum(1),
           "CTR": np.where(n > 0, (np.clip(s.ctr, 0, None) * s.step_mask).sum(1) / np.maximum(n, 1), 0.0)}
    out = {}
    for k in ks:
        k = min(k, beams)
        for name, v in per.items():
            out[f"{name}@{k}"] = float(v.reshape(b, beams)[:, :k].max(1).mean())
        best = per["IoI"].reshape(b, beams)[:, :k].argmax(1)
        out[f"length@{k}"] = float(n.reshape(b, beams)[np.arange(b), best].mean())
    return out



# ====================================================================== the three algorithms
@dataclass
class RecReinforceConfig(RecPGConfig):
    """REINFORCE's options on ProactiveRec (docs/algorithms/reinforce.md): no KL, the raw path return."""

    beta: float = 0.0
    lr: float = 1e-4
    baseline: Literal["none", "batch_mean"] = "batch_mean"
    """'none' or 'batch_mean' (REINFORCE's default, docs/algorithms/reinforce.md)."""


class RecReinforce(_RecPG):
    """REINFORCE on the raw fused reward summed over the path (ProRL's vanilla arm; docs/algorithms/reinforce.md)."""

    name = "reinforce"
    Config = RecReinforceConfig
    item_reduce = "sum"  # log π(item) = Σ of its token log-probs (textbook)

    def advantages(self, scores, lengths, group_ids, epoch):
        r = self.raw_return(scores)
        a = r - (r.mean() if self.config.baseline == "batch_mean" else 0.0)
        item_adv = a[:, None] * (np.arange(L_MAX)[None] < lengths[:, None])
        return item_adv, a, {"adv_std": float(a.std())}


@dataclass
class RecGRPOConfig(RecPGConfig):
    """GRPO's options on ProactiveRec (docs/algorithms/grpo.md): group-normalised path returns, no KL by default."""

    beta: float = 0.0
    eps_clip: float = bounded(0.2, gt=0, lt=1)
    """ε of the clipped surrogate (inactive here: the update is exactly on-policy; kept for form)."""
    eps_std: float = bounded(1e-6, min=0)
    """ε added to the group std before dividing."""


class RecGRPO(_RecPG):
    """GRPO on the raw path return (docs/algorithms/grpo.md): group-normalised A_i on every generated token,
    seq-mean-token-mean."""

    name = "grpo"
    Config = RecGRPOConfig

    def advantages(self, scores, lengths, group_ids, epoch):
        r = torch.as_tensor(self.raw_return(scores))
        a = group_normalize(r, torch.as_tensor(group_ids), mode="mean_std", eps=self.config.eps_std).numpy()
        return np.repeat(a[:, None], L_MAX, 1), a, {"adv_std": float(a.std())}

    def objective(self, tok_lp, ref_tok_lp, lengths, item_adv, eos_adv):
        mask = torch.arange(tok_lp.shape[1])[None] <= 4 * lengths[:, None]  # items + EOS
        adv = eos_adv[:, None].expand_as(tok_lp)
        loss_tok, _ = clipped_surrogate(tok_lp, tok_lp.detach(), adv, mask, self.config.eps_clip, self.config.eps_clip)
        loss = aggregate(loss_tok, mask, "seq-mean-token-mean")
        kl = torch.zeros(())
        if ref_tok_lp is not None:
            kl = aggregate(kl_term(tok_lp, ref_tok_lp, "k3"), mask, "seq-mean-token-mean")
            loss = loss + self.config.beta * kl
        return loss, {"kl": float(kl.detach())}


@dataclass
class ProRLConfig(RecPGConfig):
    """ProRL's options (docs/algorithms/prorl.md): rectified, position-specific credit with per-component reward
    centring."""

    gamma: float = bounded(1.0, min=0, max=1)
    """Discount of the position-wise returns G_{i,k}."""
    min_std: float = bounded(0.1, gt=0)
    """mo_min_std: floor of the running std in the normalisation."""
    credit: Literal["position", "path"] = "position"
    """'position' (ProRL) or 'path' (ablation: every item gets the whole centred path return minus the group mean)."""
    centering: Literal["component", "fused", "position", "none"] = "component"
    """'component' (ProRL's code: each of IoI, IoR, CTR centred and scaled by its own running statistics, then
    fused with w_ctr/L_max, w_ioi, w_ior); 'fused' ([derived] reading of the paper's "subtract the expected step
    reward": the env's raw fused step reward w_ctr·CTR + w_ioi·IoI + w_ior·IoR/n_items is centred and scaled
    by one running mean/std, same Welford/freeze/min_std rules); 'position' ([derived]: as 'component' but with
    running statistics per path position k, so that E[r_k] ≈ 0 holds at every position and not only on average
    over positions when the step rewards depend on k, see docs/algorithms/prorl.md; a position with fewer than 2
    real items in the statistics uses the pooled ones); 'none' (ablation, the ladder's first rung: the env's raw
    fused step reward, uncentred, as `reinforce` uses)."""
    item_logprob: Literal["mean", "sum"] = "mean"
    """'mean' (docs/algorithms/prorl.md: ℓ_k = mean of the item's 4 token log-probs) or 'sum' (ablation: the item's
    full log-prob, so item tokens get 4x the gradient relative to the EOS token)."""


class ProRL(_RecPG):
    """ProRL: per-component step-reward centring (frozen after epoch 1) + position-specific advantages
    (docs/algorithms/prorl.md)."""

    name = "prorl"
    Config = ProRLConfig
    invalid_rule = "batch_min"

    @property
    def item_reduce(self) -> str:
        return self.config.item_logprob

    def centred_rewards(self, scores: PathScores, update: bool) -> np.ndarray:
        """r_k = w_ctr·r̃_CTR/L_max + w_ioi·r̃_IoI + w_ior·r̃_IoR with r̃ = (r − μ)/max(σ, min_std)."""
        c = self.config
        real = scores.valid & ~scores.duplicate
        if c.centering == "none":  # the ladder's first rung: the raw fused reward, nothing subtracted
            return self.raw_fused(scores)
        if c.centering == "position":  # [derived] statistics per path position k
            comps = np.stack([scores.ioi, scores.ior, scores.ctr], -1)  # [B, L, 3]
            stats = self.stats
            assert isinstance(stats, PositionStats)  # what _new_stats makes for centering="position"
            if update:
                stats.update(comps[real], np.nonzero(real)[1])
            mean, std = (x[: comps.shape[1]] for x in stats.per_position())  # [L, 3]
            z = (comps - mean[None]) / np.maximum(std, c.min_std)[None]
            r = c.w_ioi * z[..., 0] + c.w_ior * z[..., 1] + c.w_ctr * z[..., 2] / L_MAX
            return r * scores.step_mask
        if c.centering == "fused":  # one statistic of the env's raw fused step reward (a derived reading)
            f = self.raw_fused(scores)[..., None]  # [B, L, 1]
            if update:
                self.stats.update(f[real])
            return ((f[..., 0] - self.stats.mean[0]) / max(float(self.stats.std[0]), c.min_std)) * scores.step_mask
        comps = np.stack([scores.ioi, scores.ior, scores.ctr], -1)  # [B, L, 3]
        if update:
            self.stats.update(comps[real])
        z = (comps - self.stats.mean) / np.maximum(self.stats.std, c.min_std)
        r = c.w_ioi * z[..., 0] + c.w_ior * z[..., 1] + c.w_ctr * z[..., 2] / L_MAX
        return r * scores.step_mask

    def raw_fused(self, scores: PathScores) -> np.ndarray:
        """The env's raw fused step reward [B, L] (zero past the path)."""
        c = self.config
        w = RewardWeights(c.w_ctr, c.w_ioi, c.w_ior, float(self._n_items))  # = the env reward
        return w.fuse(scores.ioi, scores.ior, scores.ctr) * scores.step_mask

    def _new_stats(self) -> RunningStats:
        if self.config.centering == "position":
            return PositionStats(L_MAX, 3)
        return RunningStats(1 if self.config.centering in ("fused", "none") else 3)

    def advantages(self, scores, lengths, group_ids, epoch):
        if not hasattr(self, "stats"):
            self.stats = self._new_stats()
        r = self.centred_rewards(scores, update=not self.stats.frozen)
        if self.config.credit == "position":
            adv, _ = position_advantages(r, lengths, group_ids, self.config.gamma)
            item_adv = adv[:, :L_MAX] * (np.arange(L_MAX)[None] < lengths[:, None])
            eos_adv = adv[np.arange(len(adv)), lengths]
        else:
            ret = torch.as_tensor(r.sum(1))
            a = group_normalize(ret, torch.as_tensor(group_ids), mode="mean").numpy()
            item_adv, eos_adv = a[:, None] * (np.arange(L_MAX)[None] < lengths[:, None]), a
        names = {"none": (), "fused": ("fused",)}.get(self.config.centering, COMPONENTS)
        pooled = self.config.centering == "position"  # row 0: the statistics over every position
        mean, std = (self.stats.mean[0], self.stats.std[0]) if pooled else (self.stats.mean, self.stats.std)
        st = {f"mu_{k}": float(m) for k, m in zip(names, mean, strict=False)}
        st.update({f"sigma_{k}": float(s) for k, s in zip(names, std, strict=False)})
        st["stats_frozen"] = float(self.stats.frozen)
        st["step_reward_mean"] = float(r.sum() / max(1, scores.step_mask.sum()))
        return item_adv, eos_adv, st


def position_profile(algo: ProRL, scores: PathScores) -> list[dict[str, float]]:
    """Mean raw components and centred step reward r_k (under `algo`'s current, e.g. frozen, statistics) at each
    path position over the real items of `scores`: shows whether items at position k earn more than the per-item
    charge μ that ProRL's centring subtracts (r_k > 0) or less."""
    r = algo.centred_rewards(scores, update=False)
    real = scores.valid & ~scores.duplicate & scores.step_mask
    out = []
    for k in range(r.shape[1]):
        if not scores.step_mask[:, k].any():  # no path is this long
            break
        sel = real[:, k]
        if sel.sum() == 0:  # only duplicates / invalid items here: nothing to average
            continue
        out.append({"position": k + 1, "n": int(sel.sum()), "IoI": float(scores.ioi[sel, k].mean()),
                    "IoR": float(scores.ior[sel, k].mean()), "CTR": float(scores.ctr[sel, k].mean()),
                    "r_centred": float(r[sel, k].mean())})
    return out


def gradient_variance(algo: ProRL, agent: RecPolicyAgent, task_ids, *, n_batches: int = 8, prompts: int = 4,
                      seed: int = 0) -> dict[str, float]:
    """Variance of the policy-gradient estimate at fixed parameters: position-specific advantages vs whole-path
    centred return (same samples, same centred rewards, no KL). Returns trace variance across `n_batches`
    independent mini-batches, absolute and relative to the squared norm of the mean gradient."""
    c = algo.config
    world, scorer = agent.world, PathScorer(agent.world)
    algo._n_items = world.n_items
    gen = torch.Generator().manual_seed(seed)
    params = [p for p in agent.model.parameters() if p.requires_grad]
    grads: dict[str, list] = {"position": [], "path": []}
    task_ids = np.asarray(task_ids)
    if not hasattr(algo, "stats"):
        algo.stats = algo._new_stats()
    was_frozen = algo.stats.frozen
    for bidx in range(n_batches):
        ids = task_ids[bidx * prompts:(bidx + 1) * prompts]
        hist, tgt = world.tasks(ids)
        hist, tgt = np.repeat(hist, c.group_size, 0), np.repeat(tgt, c.group_size)
        gids = np.repeat(np.arange(len(ids)), c.group_size)
        prompts_t, gen_ids, _, items, lengths = policy_paths(agent, hist, tgt, greedy=False, generator=gen)
        scores = scorer.score(hist, tgt, items, invalid="batch_min")
        for credit in grads:
            algo.config.credit = credit
            ia, ea, _ = algo.advantages(scores, lengths, gids, epoch=1)
            algo.stats.frozen = True  # a fresh algo takes its statistics from the first batch only
            tok_lp = token_logprobs(agent.model, agent.vocab, prompts_t, gen_ids)
            loss, _ = _RecPG.objective(algo, tok_lp, None, torch.as_tensor(lengths),
                                       torch.as_tensor(ia, dtype=torch.float32),
                                       torch.as_tensor(ea, dtype=torch.float32))
            g = torch.autograd.grad(loss, params)
            grads[credit].append(torch.cat([x.reshape(-1) for x in g]))
    algo.config.credit = "position"
    algo.stats.frozen = was_frozen
    out = {}
    for credit, gs in grads.items():
        gmat = torch.stack(gs)
        mean = gmat.mean(0)
        var = ((gmat - mean) ** 2).sum(1).mean().item()
        out[f"gradvar_{credit}"] = var
        out[f"gradvar_rel_{credit}"] = var / max(mean.pow(2).sum().item(), 1e-30)
    return out


__all__ = ["ProRL", "RecGRPO", "RecReinforce", "RunningStats", "evaluate", "evaluate_beam", "gradient_variance",
           "position_advantages", "position_profile"]
