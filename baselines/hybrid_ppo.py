"""Gaussian hybrid PPO for the replenishment and multi-warehouse envs (docs/algorithms/hybrid_ppo.md).

PPO (Schulman et al., arXiv 1707.06347) with GAE (arXiv 1506.02438) on the hybrid action: a Bernoulli order head per
SKU and a Gaussian quantity head (fixed σ), both trained by the score function; the joint log-prob of an agent's
action is Σ_i [log π_d(d_i|s) + d_i·log N(u_i; μ_i(s), σ²)] (the Gaussian term only counts where
an order is placed, since u_i has no effect otherwise). Defaults: the HPO repository's Gaussian PPO template
(`gaussian_ppo_main`: lr 3e-4, clip 0.2, γ 0.99, λ 0.95, 5 epochs, vf 0.5, entropy 0, fixed std, [64, 64] tanh).

Rollouts run on the batched simulator of the env module (`InventorySim`: `step_torch` over a batch of scenarios,
demand pre-sampled), the same one HPO differentiates through, so both algorithms are charged the same number of
simulated periods. Multi-warehouse: parameters are shared across warehouses; each warehouse is its own agent for
GAE (per-agent cost rewards, or the team cost with `team_reward`).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch

from agents.inventory_nets import HybridPolicy, SumValue, n_features, sku_features
from baselines.core.gae import gae
from baselines.core.loop import LoopAlgorithm, Run
from shopsim.configs import bounded, validate
from shopsim.envs import check_env_id, is_pettingzoo
from shopsim.envs.replenishment import (
    PAST_DEMANDS,
    ReplenishmentConfig,
    Scenario,
    demand_means,
    draw_task,
    initial_state,
    make_scenario,
    sample_demand,
    stack_scenarios,
    step_torch,
)
from shopsim.trajectory import to_jsonable


@dataclass
class HybridPPOConfig:
    """Gaussian hybrid PPO's options; the defaults are the HPO repository's Gaussian PPO template."""

    lr: float = bounded(3e-4, gt=0)
    """Adam learning rate of the policy and value nets."""
    clip: float = bounded(0.2, gt=0, lt=1)
    """ε of the clipped surrogate."""
    gamma: float = bounded(0.99, gt=0, max=1)
    """Discount γ of GAE (per period)."""
    gae_lambda: float = bounded(0.95, min=0, max=1)
    """λ of GAE."""
    update_epochs: int = bounded(5, min=1)
    """PPO epochs over each batch."""
    minibatches: int = bounded(4, min=1)
    """Minibatches per epoch."""
    vf_coef: float = bounded(0.5, min=0)
    """Weight of the value loss."""
    ent_coef: float = bounded(0.0, min=0)
    """Entropy bonus on the Bernoulli head (the Gaussian σ is fixed)."""
    max_grad_norm: float = bounded(0.5, gt=0)
    """Clipped per network component (order head, quantity head, value)."""
    target_kl: float | None = bounded(None, gt=0)
    """Stop an update's epochs early once the approximate KL to the rollout policy exceeds this (None: never)."""
    normalize_advantage: bool = True
    """Whiten the advantages of each minibatch."""
    reward_scaling: bool = True
    """Divide rewards by their batch std before GAE."""
    hidden: tuple[int, ...] = (64, 64)
    """Hidden layer widths of the (per-SKU, shared-weight) policy net."""
    value_hidden: tuple[int, ...] = (64, 64)
    """Hidden layer widths of the value net."""
    std: float = bounded(0.5, gt=0)
    """Fixed std of the Gaussian quantity head (in pre-softplus units)."""
    continuous_shift: float = 1.0
    """Shift inside the quantity map q = mean·softplus(u + shift) (`agents.inventory_nets.HybridPolicy`)."""
    batch_scenarios: int = bounded(128, min=1)
    """Training scenarios rolled out for the whole horizon per update."""
    team_reward: bool = False
    """Multi-warehouse: every warehouse's GAE uses the team cost instead of its own cost."""
    eval_scenarios: int = bounded(64, min=0)
    """Dev scenarios evaluated after training (0: skip)."""
    env_kwargs: dict = field(default_factory=dict)
    """Options of the env (n_skus, lead_time, n_warehouses, ...)."""

    def __post_init__(self) -> None:
        validate(self)


class InventorySim:
    """Batched torch simulator of the replenishment env (W = 1) or the multi-warehouse env (a PettingZoo env: W
    warehouses, shared supplier).

    Reproduces the envs exactly: for a (task id, seed) pair it draws demand and the starting stock with
    `numpy.random.default_rng(seed)` in the order the env's reset does, so an evaluation here equals an episode of
    the Gymnasium/PettingZoo env with that seed."""

    def __init__(self, env_id: str, env_kwargs: dict | None = None, dtype=torch.float32):
        check_env_id(env_id)
        kw = dict(env_kwargs or {})
        self.multi = is_pettingzoo(env_id)  # the multi-agent form: one agent per warehouse
        self.n_warehouses = int(kw.pop("n_warehouses", 3)) if self.multi else 1
        self.supplier_capacity = float(kw.pop("supplier_capacity", 1.5)) if self.multi else None
        kw.pop("render_mode", None)
        self.cfg = ReplenishmentConfig.from_dict(kw)
        self.env_name = env_id.split("/")[-1]  # the split manifest's name (`load_split`)
        self.dtype = dtype

    @property
    def n_feat(self) -> int:
        return n_features(self.cfg.lead_time, PAST_DEMANDS)

    def scenarios(self, task_ids):
        if self.multi:
            from shopsim.envs.multi_warehouse import scenario_ids

            per = [stack_scenarios([make_scenario(i, self.cfg) for i in scenario_ids(t, self.n_warehouses)])
                   for t in task_ids]
        else:
            per = [stack_scenarios([make_scenario(t, self.cfg)]) for t in task_ids]
        return stack_scenarios(per)  # arrays (B, W, N)

    def batch(self, task_ids, seeds) -> dict:
        """Scenario parameters, demand (T, B, W, N) and starting state of episodes (task_ids[b], seeds[b])."""
        sc = self.scenarios(task_ids)
        dem, on, pipe = [], [], []
        for b, s in enumerate(seeds):
            rng = np.random.default_rng(int(s))
            one = Scenario(sc.mean[b], sc.holding[b], sc.backlog[b], sc.fixed[b], sc.phase[b])
            d = sample_demand(one, self.cfg, rng)
            o, p = initial_state(one, self.cfg, rng)
            dem.append(d)
            on.append(o)
            pipe.append(p)
        t = lambda x: torch.tensor(np.asarray(x), dtype=self.dtype)  # noqa: E731  (copies: inputs may be read-only views)
        out = {"mean_t": t(demand_means(sc, self.cfg)), "holding": t(sc.holding), "backlog": t(sc.backlog),
               "fixed": t(sc.fixed), "demand": t(np.stack(dem, 1)), "on_hand": t(np.stack(on)),
               "pipeline": t(np.stack(pipe))}
        if self.multi:
            assert self.supplier_capacity is not None  # set with multi (__init__)
            out["capacity"] = self.supplier_capacity * out["mean_t"].new_tensor(sc.mean.sum(1))[:, None, :]
        return out

    def sample_train(self, n: int, rng: np.random.Generator) -> dict:
        tasks = [draw_task("train", rng, self.env_name) for _ in range(n)]
        seeds = rng.integers(0, 2**31 - 1, size=n)
        return self.batch(tasks, seeds)

    def rollout(self, policy: HybridPolicy, b: dict, *, mode: str, gen: torch.Generator | None = None,
                graph: bool = False, deterministic: bool = False) -> dict:
        """Run T periods. mode "gaussian" samples u ~ N(x, σ²); "pathwise" uses u = x (HPO). With graph=True the
        features and costs stay attached to the autograd graph through the quantities (HPO epoch 0)."""
        cfg = self.cfg
        T = cfg.horizon
        on, pipe = b["on_hand"], b["pipeline"]
        B, W, N = on.shape
        bound = cfg.obs_bound
        hist = torch.cat([b["demand"].new_zeros((PAST_DEMANDS, B, W, N)), b["demand"].clamp(max=bound)])
        rec: dict[str, list] = {k: [] for k in ("feats", "order", "u", "logp", "cost")}
        ctx = torch.enable_grad() if graph else torch.no_grad()
        with ctx:
            for t in range(T):
                mean = b["mean_t"][t].clamp(max=bound)
                past = hist[t:t + PAST_DEMANDS].permute(1, 2, 3, 0)
                period = on.new_full((B, W), t / T)
                feats = sku_features(on.clamp(-bound, bound), pipe, mean, b["holding"], b["backlog"], b["fixed"],
                                     past, period)
                logits, x = policy(feats)
                with torch.no_grad():
                    if deterministic:
                        order = (logits > 0).to(on.dtype)
                    else:
                        order = torch.bernoulli(torch.sigmoid(logits), generator=gen)
                    logp = -torch.nn.functional.binary_cross_entropy_with_logits(logits, order, reduction="none")
                if mode == "gaussian" and not deterministic:
                    with torch.no_grad():
                        u = x + policy.std * torch.randn(x.shape, generator=gen, dtype=x.dtype)
                        logp = logp + torch.distributions.Normal(x, policy.std).log_prob(u) * order
                else:
                    u = x if graph else x.detach()
                q = policy.quantity(u, mean) * order
                if self.multi:
                    from shopsim.envs.multi_warehouse import allocate_torch

                    q, _ = allocate_torch(order, q, b["capacity"])
                out = step_torch(on, pipe, order, q, b["demand"][t], b["holding"], b["backlog"], b["fixed"],
                                 lost_sales=cfg.lost_sales, capacity=cfg.capacity, overflow_cost=cfg.overflow_cost)
                on, pipe = out.on_hand, out.pipeline
                rec["feats"].append(feats)
                rec["order"].append(order)
                rec["u"].append(u.detach())
                rec["logp"].append(logp.sum(-1))
                rec["cost"].append(out.total)
        return {k: torch.stack(v) for k, v in rec.items()}  # leading dim T


def reported_cost(cost: torch.Tensor, warmup: int) -> torch.Tensor:
    """Reported cost per (scenario, warehouse): the sum over periods >= warmup of cost (T, B, W)."""
    return cost[warmup:].sum(0)


class HybridPPO(LoopAlgorithm):
    """Gaussian hybrid PPO (see the module docstring)."""

    name: ClassVar[str] = "ppo"
    families: ClassVar[tuple[str, ...]] = ("inventory",)
    Config: ClassVar[type] = HybridPPOConfig
    mode: ClassVar[str] = "gaussian"
    train_options: ClassVar[tuple[str, ...]] = ("env_kwargs",)

    # --- pieces reused by HPO ------------------------------------------------------------------------------------
    def build(self, sim: InventorySim, seed: int, init=None):
        torch.manual_seed(seed)
        c = self.config
        policy = HybridPolicy(sim.n_feat, c.hidden, shift=c.continuous_shift, std=c.std, q_max=sim.cfg.q_max)
        if init is not None:
            from agents.inventory_policies import HybridPolicyAgent

            policy.load_state_dict(HybridPolicyAgent.from_checkpoint(init).policy.state_dict())
        value = SumValue(sim.n_feat, c.value_hidden)
        return policy, value

    def advantages(self, ro: dict, value: SumValue):
        """Per-agent GAE on rewards −cost (scaled by their batch std). Returns flat (T·B·W) tensors."""
        c = self.config
        cost = ro["cost"].detach()  # (T, B, W)
        if c.team_reward:
            cost = cost.mean(-1, keepdim=True).expand_as(cost)
        r = -cost
        scale = r.std().clamp_min(1e-8) if c.reward_scaling else torch.ones(())
        T = r.shape[0]
        rr = (r / scale).reshape(T, -1).T
        if not getattr(value, "calibrated", False):
            # start the critic at the mean return per SKU instead of 0 (returns are O(horizon) after scaling)
            disc = c.gamma ** torch.arange(T, dtype=rr.dtype)
            last = value.net[-1]
            assert isinstance(last, torch.nn.Linear)  # mlp ends with its output layer
            with torch.no_grad():
                last.bias.fill_(float((rr * disc).sum(1).mean()) / ro["feats"].shape[-2] / 2)
            value.calibrated = True
        with torch.no_grad():
            v = value(ro["feats"].detach())  # (T, B, W)
        vv = v.reshape(T, -1).T
        adv, ret = gae(rr, vv, torch.ones_like(rr), gamma=c.gamma, lam=c.gae_lambda)
        return adv.T.reshape(-1), ret.T.reshape(-1), scale

    def logp(self, policy: HybridPolicy, feats, order, u, *, with_gaussian: bool):
        logits, x = policy(feats)
        lp = -torch.nn.functional.binary_cross_entropy_with_logits(logits, order, reduction="none")
        if with_gaussian:
            lp = lp + torch.distributions.Normal(x, policy.std).log_prob(u) * order
        ent = torch.distributions.Bernoulli(logits=logits).entropy().sum(-1)
        return lp.sum(-1), ent

    def ppo_loss(self, policy, value, feats, order, u, old_logp, adv, ret, *, with_gaussian: bool, value_feats=None):
        c = self.config
        lp, ent = self.logp(policy, feats, order, u, with_gaussian=with_gaussian)
        if c.normalize_advantage and adv.numel() > 1:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        ratio = torch.exp(lp - old_logp)
        pg = -torch.min(ratio * adv, ratio.clamp(1 - c.clip, 1 + c.clip) * adv).mean()
        v = value(feats.detach() if value_feats is None else value_feats)
        v_loss = 0.5 * ((v - ret) ** 2).mean()
        with torch.no_grad():
            approx_kl = ((ratio - 1) - (lp - old_logp)).mean()
        return pg, v_loss, ent.mean(), approx_kl

    def step_optim(self, opt, loss, policy, value):
        opt.zero_grad(set_to_none=True)
        loss.backward()
        for mod in (policy.disc, policy.cont, value):
            torch.nn.utils.clip_grad_norm_(mod.parameters(), self.config.max_grad_norm)
        opt.step()

    def minibatch_epochs(self, epochs, policy, value, opt, flat: dict, gen, *, with_gaussian: bool) -> dict:
        """Standard PPO epochs over shuffled minibatches of the flat (agent-period) samples."""
        c = self.config
        n = flat["adv"].shape[0]
        mb = max(1, n // c.minibatches)
        stats = {"pg_loss": 0.0, "v_loss": 0.0, "approx_kl": 0.0, "epochs": 0}
        for _ in range(epochs):
            perm = torch.randperm(n, generator=gen)
            kls = []
            for i in range(0, n, mb):
                idx = perm[i:i + mb]
                pg, vl, ent, kl = self.ppo_loss(policy, value, flat["feats"][idx], flat["order"][idx], flat["u"][idx],
                                                flat["logp"][idx], flat["adv"][idx], flat["ret"][idx],
                                                with_gaussian=with_gaussian)
                self.step_optim(opt, pg + c.vf_coef * vl - c.ent_coef * ent, policy, value)
                kls.append(float(kl))
                stats["pg_loss"], stats["v_loss"] = float(pg.detach()), float(vl.detach())
            stats["approx_kl"] = float(np.mean(kls))
            stats["epochs"] += 1
            if c.target_kl is not None and stats["approx_kl"] > c.target_kl:
                break
        return stats

    @staticmethod
    def flatten(ro: dict, adv, ret) -> dict:
        T, B, W, N, F = ro["feats"].shape
        return {"feats": ro["feats"].detach().reshape(-1, N, F), "order": ro["order"].reshape(-1, N),
                "u": ro["u"].reshape(-1, N), "logp": ro["logp"].reshape(-1), "adv": adv, "ret": ret}

    def update(self, ro, policy, value, opt, gen) -> dict:
        adv, ret, _ = self.advantages(ro, value)
        return self.minibatch_epochs(self.config.update_epochs, policy, value, opt, self.flatten(ro, adv, ret), gen,
                                     with_gaussian=True)

    # --- steps of the shared loop (baselines.core.loop) ----------------------------------------------------------
    def setup_run(self, run: Run) -> None:
        """Batched simulator, policy (from `run.init` if given) and value nets, Adam, the scenario generator and the
        sampling generator."""
        c = self.config
        self.env_kwargs = {**c.env_kwargs, **(run.options.get("env_kwargs") or {})}
        self.sim = InventorySim(run.env_id, self.env_kwargs)
        self.policy, self.value = self.build(self.sim, run.seed, run.init)
        self.opt = torch.optim.Adam([*self.policy.parameters(), *self.value.parameters()], lr=c.lr,
                                    weight_decay=getattr(c, "weight_decay", 0.0))
        self.rng = np.random.default_rng(run.seed)
        self.gen = torch.Generator().manual_seed(run.seed)
        self.periods = 0

    def rng_streams(self) -> dict:
        return {"scenarios": self.rng, "sampling": self.gen}

    def iteration(self, it: int) -> dict:
        """One update on `batch_scenarios` fresh training scenarios × horizon periods."""
        c = self.config
        t0 = time.perf_counter()
        b = self.sim.sample_train(c.batch_scenarios, self.rng)
        stats = self.update_iteration(self.sim, b, self.policy, self.value, self.opt, self.gen)
        self.periods += c.batch_scenarios * self.sim.cfg.horizon
        return {"iteration": it, "simulated_periods": self.periods, **stats, "seconds": time.perf_counter() - t0}

    def eval_due(self, it: int, last: bool) -> bool:
        return last and self.config.eval_scenarios > 0

    def evaluation(self, it: int) -> dict:
        return {"dev_cost": evaluate(self.policy, self.sim, split="dev", n=self.config.eval_scenarios,
                                     mode=self.mode)}

    def state_dict(self) -> dict:
        return {"policy": self.policy.state_dict(), "value": self.value.state_dict(),
                # the critic's output bias is set from the first batch's returns once (see `advantages`)
                "value_calibrated": bool(getattr(self.value, "calibrated", False)),
                "optimizer": self.opt.state_dict(), "periods": self.periods}

    def load_state_dict(self, state: dict) -> None:
        self.policy.load_state_dict(state["policy"])
        self.value.load_state_dict(state["value"])
        self.value.calibrated = state["value_calibrated"]
        self.opt.load_state_dict(state["optimizer"])
        self.periods = int(state["periods"])

    def _agent(self):
        from agents.inventory_policies import HybridPolicyAgent

        return HybridPolicyAgent(env_id=self.run.env_id, policy=self.policy, deterministic=True,
                                 gaussian=self.mode == "gaussian")

    def save_checkpoint(self, directory: Path) -> Path:
        return self._agent().save(directory, algorithm=self.name, config=to_jsonable(asdict(self.config)),
                                  env_kwargs=to_jsonable(self.env_kwargs), seed=self.run.seed)

    def result_agent(self):
        self.policy.eval()
        return self._agent()

    def update_iteration(self, sim, b, policy, value, opt, gen) -> dict:
        ro = sim.rollout(policy, b, mode="gaussian", gen=gen)
        train_cost = float(reported_cost(ro["cost"], sim.cfg.warmup).mean())
        return {"train_cost": train_cost, **self.update(ro, policy, value, opt, gen)}


def evaluate(policy: HybridPolicy, sim: InventorySim, *, split: str = "test", n: int | None = None,
             seeds=(0,), mode: str = "gaussian", task_ids=None) -> float:
    """Mean reported cost per episode of the deterministic policy on the first `n` ids of `split` × `seeds`
    (equal to running the env with `HybridPolicyAgent(deterministic=True)` on the same tasks and seeds)."""
    from shopsim.envs.replenishment import load_split

    if task_ids is None:
        task_ids = load_split(sim.env_name)[split][:n]
    tasks = [t for t in task_ids for _ in seeds]
    sds = [s for _ in task_ids for s in seeds]
    b = sim.batch(tasks, sds)
    ro = sim.rollout(policy, b, mode=mode, deterministic=True)
    return float(reported_cost(ro["cost"], sim.cfg.warmup).sum(-1).mean())

