"""BASIS for the Shopping LM agent (docs/algorithms/basis.md).

Gong, Xu, Ye, Quinzan, Livieri, Shi, "BASIS: Batchwise Advantage Estimation from Single-Rollout Information Sharing
for LLM Reasoning", arXiv 2605.27293 (no released code). One rollout per task per step; each task's baseline is a
reference value from an offline table, calibrated online on the *other* tasks of the batch:

    offline (once, `before_training`): for each task x of a fixed training pool, N_ref rollouts of π_ref (the start
        checkpoint) → r_ref(x, 1..N_ref) ∈ [0, 1]
    V̂_β(x)  = β · log( (1/N_ref) Σ_n exp(r_ref(x, n)/β) )           (β → ∞: mean reference reward; β → 0: the max)
    w_i(β)   = 1 / max(V̂_β(x_i)(1 − V̂_β(x_i)), v_min)                (inverse Bernoulli variance)
    Active   = { i : v_lo ≤ V̂_β(x_i) ≤ v_hi }
    β*_{−i}  = argmin_{β ∈ grid} Σ_{j ∈ Active, j ≠ i} w_j(β)·(r_j − V̂_β(x_j))²      (leave-one-out)
    b_i      = V̂_{β*_{−i}}(x_i) if i ∈ Active else 0;   A_i = r_i − b_i
    L        = −token-mean min(ρ·A_i, clip(ρ, 1−ε, 1+ε)·A_i)

A task is a task id plus its reset seed. The Shopping train split is large, so the run trains on a fixed pool of
`task_pool` (task id, seed) pairs drawn once from the run seed ([derived]); the offline table covers that pool and
each iteration draws `tasks_per_iter` of them. The table is written to ``OUT/basis_table.json`` and kept in the
resume state, so a resumed run never collects it again. Every [derived] choice of the design is an option
(`BASISConfig`); the alternative reading of the paper, a literal cross-prompt weighted average of the other
rewards, is ``baseline="kernel"``.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from baselines.core.batch import Batch
from baselines.core.config import AggMode
from baselines.core.trainer import Advantages, Ctx, LMAlgorithm, LMConfig
from shopsim.configs import bounded
from shopsim.errors import ConfigError
from shopsim.paths import write_text_atomic

TABLE_FILE = "basis_table.json"
TABLE_FORMAT = 1


@dataclass
class BASISConfig(LMConfig):
    """BASIS's options; the defaults are the card's design (arXiv 2605.27293, with [derived] readings)."""

    group_size: int = bounded(1, min=1)
    """Rollouts per task and step: 1 is BASIS. With G > 1 each rollout counts as its own single-rollout sample
    (its baseline still leaves out only its own reward; the other rollouts of the task enter the calibration)."""
    n_ref: int = bounded(8, min=1)
    """N_ref: rollouts of the start policy π_ref per pool task for the offline value table."""
    task_pool: int = bounded(16, min=1)
    """Training tasks (task id, seed) drawn once from the run seed; the offline table covers them and every
    iteration draws its tasks from them ([derived]: the train split is too large to tabulate)."""
    reward: Literal["success", "score"] = "success"
    """Trajectory reward r ∈ [0, 1] of both the table and the online rollouts: the success flag or the env's
    partial-credit score."""
    baseline: Literal["calibrated", "kernel"] = "calibrated"
    """'calibrated': b_i = V̂ at the leave-one-out calibrated temperature (the card's design). 'kernel': the
    alternative reading, b_i = Σ_{j≠i} k_ij r_j / Σ_{j≠i} k_ij with a Gaussian kernel on the offline mean values."""
    beta_min: float = bounded(0.01, gt=0)
    """Smallest temperature β of the calibration grid."""
    beta_max: float = bounded(10.0, gt=0)
    """Largest temperature β of the calibration grid."""
    beta_grid: int = bounded(32, min=1)
    """Points of the log-spaced β grid in [beta_min, beta_max]."""
    v_lo: float = bounded(0.02, min=0, max=1)
    """Lower edge of the active set: a task with V̂ below it gets the zero baseline."""
    v_hi: float = bounded(0.98, min=0, max=1)
    """Upper edge of the active set: a task with V̂ above it gets the zero baseline (see `fallback_high`)."""
    v_min: float = bounded(0.01, gt=0)
    """Floor of the Bernoulli variance V̂(1 − V̂) in the calibration weights (keeps them finite)."""
    fallback_high: bool = True
    """Apply the zero fallback near 1 as well as near 0 (the digest's "near 0 or 1"); False drops the v_hi edge."""
    active_set: Literal["per_beta", "offline_mean"] = "per_beta"
    """Where V̂ is read for the active set: at each β of the grid (the card's formula, the set changes with β and
    a task's own membership is read at β*_{−i}) or once per task at the offline mean reward (V̂ at β → ∞)."""
    weighting: Literal["inverse_variance", "uniform"] = "inverse_variance"
    """Calibration loss weights: w = 1/max(V̂(1−V̂), v_min) (weighted least squares) or 1 (ordinary)."""
    leave_one_out: bool = True
    """Calibrate task i's β without r_i (keeps b_i independent of r_i, so the gradient stays unbiased)."""
    no_calibration: Literal["beta_max", "zero"] = "beta_max"
    """Baseline of an active task when no other sample of the batch can calibrate β: V̂ at beta_max (nearest to
    the offline mean) or 0 ([derived])."""
    missing: Literal["zero", "batch_mean"] = "zero"
    """Baseline of a task absent from the offline table: 0 (the card) or the mean reward of the other rollouts."""
    kernel_bandwidth: float = bounded(0.1, gt=0)
    """h of the 'kernel' baseline: k_ij = exp(−(m_i − m_j)²/(2h²)), m = offline mean reward."""
    policy_loss: Literal["clipped", "reinforce"] = "clipped"
    """'clipped': PPO's clipped surrogate on token ratios; 'reinforce': −A·log π (no ratio)."""
    clip_low: float = 0.2
    clip_high: float = 0.2
    loss_agg: AggMode = "token-mean"
    lr: float = 1e-6
    normalize_advantage: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.beta_min > self.beta_max:
            raise ConfigError(f"beta_min ({self.beta_min}) must not exceed beta_max ({self.beta_max}); swap them")
        if self.v_lo > self.v_hi:
            raise ConfigError(f"v_lo ({self.v_lo}) must not exceed v_hi ({self.v_hi}); the active set would be empty")

    @property
    def betas(self) -> torch.Tensor:
        """The calibration grid: `beta_grid` log-spaced temperatures in [beta_min, beta_max] (float64)."""
        return torch.logspace(math.log10(self.beta_min), math.log10(self.beta_max), self.beta_grid,
                              dtype=torch.float64)


# ---------------------------------------------------------------------------------------------------- the math
def reference_values(r_ref: torch.Tensor, betas: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """V̂_β(x) = β·log mean_n exp(r_ref(x, n)/β) for every task and β: [B, N] rewards × [G] temperatures → [B, G].

    Computed with logsumexp, so β = 0.01 (exponents up to 100) is exact in float64. `mask` [B, N] marks the
    recorded rewards of a row (rows may hold different counts); a row without any gives 0."""
    r = r_ref.to(torch.float64)
    b = betas.to(torch.float64)
    m = torch.ones_like(r, dtype=torch.bool) if mask is None else mask.bool()
    z = r[:, None, :] / b[None, :, None]  # [B, G, N]
    z = torch.where(m[:, None, :], z, torch.full_like(z, -math.inf))
    n = m.sum(1).clamp_min(1).to(torch.float64)  # [B]
    v = b[None, :] * (torch.logsumexp(z, dim=-1) - torch.log(n)[:, None])
    return torch.where(m.any(1)[:, None], v, torch.zeros_like(v))


def inverse_variance_weights(v: torch.Tensor, v_min: float) -> torch.Tensor:
    """w = 1 / max(V̂(1 − V̂), v_min): the inverse Bernoulli variance, floored so near-0/1 values stay finite."""
    return 1.0 / (v * (1.0 - v)).clamp_min(v_min)


def active_mask(v: torch.Tensor, v_lo: float, v_hi: float | None) -> torch.Tensor:
    """v_lo ≤ V̂ ≤ v_hi (no upper edge when `v_hi` is None)."""
    ok = v >= v_lo
    return ok if v_hi is None else ok & (v <= v_hi)


def calibrate(r: torch.Tensor, v: torch.Tensor, w: torch.Tensor, active: torch.Tensor,
              leave_one_out: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample calibrated grid index β*_{−i} = argmin_g Σ_{j ∈ Active_g, j ≠ i} w_jg (r_j − V̂_jg)².

    r [B], v / w / active [B, G]. Returns (index [B], found [B]): `found` is False where no other active sample
    exists at any β, so there is nothing to calibrate on. A β under which no other sample is active carries no
    evidence and is never chosen (its empty sum would otherwise be a spurious minimum of 0). Ties go to the smaller
    β. Without `leave_one_out` every sample gets the β fitted on the whole active batch, r_i included."""
    err = w * (r.to(v.dtype)[:, None] - v) ** 2 * active  # [B, G]
    total, count = err.sum(0), active.sum(0)  # [G]
    if leave_one_out:
        obj = total[None, :] - err
        cnt = count[None, :] - active.long()
    else:
        obj = total[None, :].expand_as(err)
        cnt = count[None, :].expand_as(err)
    obj = torch.where(cnt > 0, obj, torch.full_like(obj, math.inf))
    best, idx = obj.min(dim=1)
    return idx, torch.isfinite(best)


@dataclass
class BaselineResult:
    """The per-sample outputs of `basis_baselines` (all [B])."""

    b: torch.Tensor
    beta: torch.Tensor
    """β*_{−i} (NaN where the sample was not calibrated: missing from the table, or no calibration data)."""
    active: torch.Tensor
    in_table: torch.Tensor
    offline_mean: torch.Tensor
    """Mean reference reward of each task (NaN where missing from the table)."""
    calibrated: torch.Tensor
    """Whether some other sample of the batch could calibrate β*_{−i} (False: the `no_calibration` rule)."""


def basis_baselines(r: torch.Tensor, r_ref: torch.Tensor, ref_mask: torch.Tensor, cfg: BASISConfig) -> BaselineResult:
    """BASIS baselines b_i for a batch: r [B] online rewards, r_ref [B, N] reference rewards of each sample's task
    with `ref_mask` [B, N] (a row with no reward = task missing from the table).

    Implements the card's design (module docstring) with the options of `cfg`: active set per β or at the offline
    mean, inverse-variance or uniform weights, leave-one-out, the zero fallback, the missing-task rule and the
    'kernel' alternative."""
    r = r.to(torch.float64)
    B = r.shape[0]
    in_table = ref_mask.bool().any(1)
    n = ref_mask.sum(1).clamp_min(1).to(torch.float64)
    mean = torch.where(in_table, (r_ref.to(torch.float64) * ref_mask).sum(1) / n,
                       torch.full((B,), math.nan, dtype=torch.float64))
    v_hi = cfg.v_hi if cfg.fallback_high else None
    nan = torch.full((B,), math.nan, dtype=torch.float64)
    if cfg.baseline == "kernel":
        act = active_mask(torch.nan_to_num(mean, nan=-1.0), cfg.v_lo, v_hi) & in_table
        m = torch.nan_to_num(mean, nan=0.0)
        k = torch.exp(-((m[:, None] - m[None, :]) ** 2) / (2 * cfg.kernel_bandwidth ** 2))
        # only other samples with a table entry inform b_i; the diagonal is r_i itself
        k = k * in_table[None, :] * (1 - torch.eye(B, dtype=k.dtype))
        den = k.sum(1)
        b = torch.where(den > 0, (k @ r) / den.clamp_min(1e-300), torch.zeros_like(r))
        b = torch.where(act, b, torch.zeros_like(b))
        beta = nan
        found = in_table.clone()
    else:
        betas = cfg.betas
        v = reference_values(r_ref, betas, ref_mask)  # [B, G]
        if cfg.active_set == "per_beta":
            act_g = active_mask(v, cfg.v_lo, v_hi)
        else:
            act_g = active_mask(torch.nan_to_num(mean, nan=-1.0), cfg.v_lo, v_hi)[:, None].expand_as(v)
        act_g = act_g & in_table[:, None]
        w = inverse_variance_weights(v, cfg.v_min) if cfg.weighting == "inverse_variance" else torch.ones_like(v)
        idx, found = calibrate(r, v, w, act_g, cfg.leave_one_out)
        if cfg.no_calibration == "beta_max":
            idx = torch.where(found, idx, torch.full_like(idx, len(betas) - 1))
        ar = torch.arange(B)
        b = v[ar, idx]
        act = act_g[ar, idx]  # the sample's own membership, read at its β*_{−i}
        if cfg.no_calibration == "zero":
            act = act & found
        b = torch.where(act, b, torch.zeros_like(b))
        beta = torch.where(in_table & act, betas[idx], nan)
    if cfg.missing == "batch_mean" and B > 1:
        loo = (r.sum() - r) / (B - 1)
        b = torch.where(in_table, b, loo)
    return BaselineResult(b=b, beta=beta, active=act & in_table, in_table=in_table, offline_mean=mean,
                          calibrated=found & in_table)


def task_key(task_id, seed) -> str:
    """The offline table's key of a task: its task id and reset seed."""
    return f"{task_id}|{int(seed)}"


def _reward_of(traj, kind: str) -> float:
    return float(traj.success) if kind == "success" else float(traj.score)


# ---------------------------------------------------------------------------------------------------- the trainer
class BASIS(LMAlgorithm):
    """Single-rollout policy gradient with BASIS's batchwise baseline: offline π_ref value table, leave-one-out
    online temperature calibration, active-set zero fallback."""

    name = "basis"
    Config = BASISConfig

    def __init__(self, **overrides) -> None:
        super().__init__(**overrides)
        self._table: dict | None = None

    # ------------------------------------------------------------------ state that survives a resume
    def algo_state(self) -> dict:
        return {"basis_table": self._table}

    def load_algo_state(self, state: dict) -> None:
        self._table = state.get("basis_table")

    @property
    def table(self) -> dict:
        if self._table is None:
            raise ConfigError("basis: the offline value table is missing; train() builds it before the first "
                              "iteration (or assign one with set_table for direct use)")
        return self._table

    def set_table(self, pool: list, rewards: dict[str, dict[str, list[float]]], **info) -> None:
        """Install an offline table: `pool` of [task_id, seed] pairs and, per `task_key`, the reference rewards
        of each kind ({"success": [...], "score": [...]})."""
        self._table = {"format": TABLE_FORMAT, "pool": [list(p) for p in pool], "rewards": rewards, **info}

    # ------------------------------------------------------------------ offline stage
    def draw_pool(self, env_id: str, seed: int) -> list[list]:
        """`task_pool` (task id, seed) pairs of the train split, from a generator of its own seeded by the run
        seed (the rollout stream is untouched, so a reused table gives the same run)."""
        c = self.config
        g = np.random.default_rng([int(seed), 0xBA515])
        tasks = self.train_tasks(env_id, g, c.task_pool)
        if tasks is None:
            raise ConfigError(f"basis needs an env with a train task split to tabulate; {env_id} has none")
        seeds = [int(s) for s in g.integers(0, 2**31 - 1, size=len(tasks))]
        return [[t, s] for t, s in zip(tasks, seeds, strict=True)]

    def before_training(self, env_id: str, agent, rng: np.random.Generator, out_dir: Path) -> dict:
        """Build (or reuse) the offline table: N_ref rollouts of the start policy per pool task."""
        collect = self.rollout_collect()

        c = self.config
        seed = self.run.seed if hasattr(self, "run") else 0
        init = str(getattr(getattr(self, "run", None), "init", None))
        pool = self.draw_pool(env_id, seed)
        path = Path(out_dir) / TABLE_FILE
        if path.is_file():  # a run that died before its first saved state: its table is still valid
            old = json.loads(path.read_text())
            if (old.get("format") == TABLE_FORMAT and old.get("pool") == pool and old.get("n_ref") == c.n_ref
                    and old.get("init") == init):
                self._table = old
                return {"basis_table": "reused", "offline_rollouts": old.get("rollouts", 0),
                        "pretrain_rollouts": old.get("rollouts", 0)}
        t0 = time.perf_counter()
        trajs = collect(env_id, agent, tasks=[p[0] for p in pool], seeds=[p[1] for p in pool], episodes=len(pool),
                        split="train", group_size=c.n_ref, num_envs=c.num_envs, env_kwargs=self._env_kwargs,
                        reset_options=dict(c.reset_options) or None, progress=False, env_fns=self._env_fns,
                        agent_seed=int(np.random.default_rng([int(seed), 0xBA515, 1]).integers(0, 2**31 - 1)))
        rewards: dict[str, dict[str, list[float]]] = {}
        for tr in trajs:
            e = rewards.setdefault(task_key(tr.task_id, tr.seed), {"success": [], "score": []})
            e["success"].append(_reward_of(tr, "success"))
            e["score"].append(_reward_of(tr, "score"))
        secs = time.perf_counter() - t0
        self.set_table(pool, rewards, n_ref=c.n_ref, init=init, rollouts=len(trajs), seconds=secs)
        write_text_atomic(path, json.dumps(self._table))
        means = [float(np.mean(e[c.reward])) for e in rewards.values()]
        return {"basis_table": "collected", "offline_rollouts": len(trajs), "pretrain_rollouts": len(trajs),
                "offline_seconds": secs,
                "offline_mean_reward": float(np.mean(means)) if means else float("nan"),
                "offline_all_zero_share": float(np.mean([m == 0 for m in means])) if means else float("nan")}

    # ------------------------------------------------------------------ online stage
    def collect_batch(self, env_id: str, agent, iteration: int, rng: np.random.Generator,
                      env_kwargs: dict | None = None, env_fns=None, progress: bool = False):
        """`tasks_per_iter` pool tasks (without replacement while the pool allows), `group_size` rollouts each."""
        collect = self.rollout_collect()

        c = self.config
        pool = self.table["pool"]

        def draw(r: np.random.Generator) -> tuple[list, list[int]]:
            idx = r.choice(len(pool), size=c.tasks_per_iter, replace=c.tasks_per_iter > len(pool))
            return [pool[int(i)][0] for i in idx], [int(pool[int(i)][1]) for i in idx]

        tasks, seeds, screen = self.iteration_tasks(env_id, agent, rng, env_kwargs=env_kwargs, env_fns=env_fns,
                                                    draw=draw)
        trajs = collect(env_id, agent, tasks=tasks, seeds=seeds, episodes=len(seeds), split="train",
                        group_size=c.group_size, num_envs=c.num_envs, env_kwargs=env_kwargs,
                        reset_options=dict(c.reset_options) or None, progress=progress, env_fns=env_fns,
                        agent_seed=int(rng.integers(0, 2**31 - 1)))
        return trajs, {"rollouts": len(trajs), **screen}

    def reference_rewards(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """[N, n_ref] reference rewards of each trajectory's task and their mask (all False: not in the table)."""
        c = self.config
        rows = [self.table["rewards"].get(task_key(tr.task_id, tr.seed)) if tr.seed is not None else None
                for tr in batch.trajectories]
        n = max([len(e[c.reward]) for e in rows if e] or [1])
        r = torch.zeros(len(rows), n, dtype=torch.float64)
        m = torch.zeros(len(rows), n, dtype=torch.bool)
        for i, e in enumerate(rows):
            if e:
                vals = torch.tensor(e[c.reward], dtype=torch.float64)
                r[i, : len(vals)] = vals
                m[i, : len(vals)] = True
        return r, m

    def compute_advantages(self, batch: Batch, ctx: Ctx) -> Advantages:
        c = self.config
        r = (batch.success if c.reward == "success" else batch.score).to(torch.float64).cpu()
        if bool(((r < 0) | (r > 1)).any()):
            raise ConfigError(f"basis needs rewards in [0, 1]; reward={c.reward!r} gave {r.min():.3g}..{r.max():.3g}")
        r_ref, mask = self.reference_rewards(batch)
        res = basis_baselines(r, r_ref, mask, c)
        A = r - res.b
        metrics = basis_metrics(r, res)
        return Advantages(adv=batch.traj_to_tokens(A.to(batch.old_logp.dtype).to(batch.gen_mask.device)),
                          metrics=metrics)

    def policy_loss_tok(self, mb, logp, adv, mask):
        if self.config.policy_loss == "reinforce":
            return -adv * logp, {}
        return super().policy_loss_tok(mb, logp, adv, mask)


def basis_metrics(r: torch.Tensor, res: BaselineResult) -> dict[str, float]:
    """Baseline accuracy against the realised rewards and calibration statistics of one batch.

    ``basis_baseline_mse`` (BASIS's b), ``batch_mean_baseline_mse`` (the batch's mean reward, a REINFORCE++-style
    baseline), ``offline_mean_baseline_mse`` (the task's mean reference reward, over tasks in the table),
    ``basis_active_share``, ``basis_table_hit_share``, ``basis_calibrated_share`` and the calibrated β* (mean, min,
    max over active samples)."""
    r = r.to(torch.float64)
    out = {"basis_baseline_mse": float(((r - res.b) ** 2).mean()),
           "batch_mean_baseline_mse": float(((r - r.mean()) ** 2).mean()),
           "basis_active_share": float(res.active.double().mean()),
           "basis_table_hit_share": float(res.in_table.double().mean()),
           "basis_calibrated_share": float(res.calibrated.double().mean()),
           "basis_baseline_mean": float(res.b.mean())}
    if bool(res.in_table.any()):
        t = res.in_table
        out["offline_mean_baseline_mse"] = float(((r[t] - res.offline_mean[t]) ** 2).mean())
    beta = res.beta[torch.isfinite(res.beta)]
    if beta.numel():
        out.update({"beta_star_mean": float(beta.mean()), "beta_star_min": float(beta.min()),
                    "beta_star_max": float(beta.max()), "beta_star_log10_mean": float(beta.log10().mean())})
    return out
