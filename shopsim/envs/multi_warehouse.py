"""multi_warehouse: W warehouses (agents) replenish their own SKUs from one supplier with limited capacity.

# Multi-warehouse replenishment (PettingZoo ParallelEnv, env id `shopsim/MultiWarehouse-v0`)

| | |
|---|---|
| Agents | `warehouse_0` … `warehouse_{W-1}` (default W = 3) |
| Action space (per agent) | `Dict(order=MultiBinary(N), quantity=Box(0, q_max, (N,), float32))`, as replenishment |
| Observation space (per agent) | replenishment's dict plus `supply_fill` (N,): last period's supplier fill ratio |
| Import | `from shopsim.envs.multi_warehouse import parallel_env, env` |

Each warehouse has its own SKU parameters and demand (warehouse w of task t uses `make_scenario(64·t + w)`), and
follows the replenishment env's dynamics (`step_numpy`). The coupling: one supplier ships at most
`capacity_i = supplier_capacity · Σ_w mean_{w,i}` units of SKU i per period; when the warehouses' orders for SKU i
exceed it, every order is scaled by capacity_i / Σ_w q_{w,i} (proportional allocation, `allocate`). The allocation
is piecewise smooth, so HPO's pathwise gradient crosses agents through it (`allocate_torch`).

Rewards: each agent gets minus its own period cost; with `team_reward=True` every agent gets minus the mean cost
over warehouses. Actions outside the space raise `InvalidActionError` (the replenishment env's rule); a missing
agent's action also raises. All agents terminate together after `horizon` periods (never truncated). The final
infos hold `episode_metrics` per warehouse (its reported cost, fill rate and order rate) plus `team_cost` (the sum
over warehouses) and `team_fill_rate` (over all warehouses' demand). Each reset info names the warehouse's
scenario (`scenario`: its task id for `make_scenario` and the config), so that a reference policy can tune itself
on it exactly as on the replenishment env.

Version History: v0 initial version.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.utils import seeding
from pettingzoo import ParallelEnv
from pettingzoo.utils import parallel_to_aec, wrappers

from shopsim.configs import checked_options
from shopsim.envs.records import MULTI_WAREHOUSE
from shopsim.envs.replenishment import (
    PAST_DEMANDS,
    InvalidActionError,
    ReplenishmentConfig,
    demand_means,
    draw_task,
    initial_state,
    make_scenario,
    sample_demand,
    stack_scenarios,
    step_numpy,
    validate_action,
)
from shopsim.errors import ConfigError, ShopsimError

ENV_ID = MULTI_WAREHOUSE.id
MAX_WAREHOUSES = 64


def allocate(order: np.ndarray, quantity: np.ndarray, capacity: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Proportional allocation of a per-SKU supplier capacity over warehouses (axis -2).

    Returns (shipped quantities, fill ratio per SKU). Orders with order=0 request nothing."""
    req = order * quantity
    total = req.sum(-2, keepdims=True)
    fill = np.minimum(1.0, capacity / np.maximum(total, 1e-12))
    return quantity * fill, np.squeeze(fill, -2)


def allocate_torch(order, quantity, capacity):
    """`allocate` in torch, differentiable in `quantity` (a smooth ratio where capacity binds)."""
    import torch

    req = order * quantity
    total = req.sum(-2, keepdim=True)
    fill = torch.clamp(capacity / total.clamp_min(1e-12), max=1.0)
    return quantity * fill, fill.squeeze(-2)


def scenario_ids(task_id: int, n_warehouses: int) -> list[int]:
    return [MAX_WAREHOUSES * int(task_id) + w for w in range(n_warehouses)]


class MultiWarehouseEnv(ParallelEnv):
    """The multi-warehouse replenishment env; see the module docstring for spaces, rewards and episode end.

    Arguments: `n_warehouses` (3), `supplier_capacity` (1.5, in units of the summed mean demand per SKU),
    `team_reward` (False), `render_mode` (None | "ansi"), plus any `ReplenishmentConfig` field (`n_skus`,
    `lead_time`, `demand`, ...). Reset options: `split`, `task_id` (others are ignored).
    """

    metadata = {"name": "multi_warehouse_v0", "render_modes": ["ansi"], "is_parallelizable": True}

    @checked_options(ENV_ID, config=ReplenishmentConfig)
    def __init__(self, n_warehouses: int = 3, supplier_capacity: float = 1.5, team_reward: bool = False,
                 render_mode: str | None = None, **kwargs: Any):
        if not 1 <= int(n_warehouses) <= MAX_WAREHOUSES:
            raise ConfigError(f"n_warehouses must be in 1..{MAX_WAREHOUSES}, got {n_warehouses}")
        if supplier_capacity <= 0:
            raise ConfigError(f"supplier_capacity must be > 0 (units of summed mean demand), got {supplier_capacity}")
        if render_mode not in (None, "ansi"):
            raise ConfigError(f"render_mode={render_mode!r}; only 'ansi' is supported")
        self.config = ReplenishmentConfig.from_dict(kwargs)
        self.n_warehouses, self.supplier_capacity, self.team_reward = (int(n_warehouses), float(supplier_capacity),
                                                                       bool(team_reward))
        self.render_mode = render_mode
        self.possible_agents = [f"warehouse_{w}" for w in range(self.n_warehouses)]
        self.agents: list[str] = []
        cfg = self.config
        n, L, B = cfg.n_skus, cfg.lead_time, cfg.obs_bound
        f32 = np.float32
        box = lambda shape, lo=0.0, hi=B: spaces.Box(lo, hi, shape, f32)  # noqa: E731
        # built once: PettingZoo's checker wants observation_space(a) is observation_space(a)
        self._obs_spaces = {a: spaces.Dict({
            "on_hand": box((n,), -B, B), "pipeline": box((n, L), 0.0, cfg.q_max), "demand_mean": box((n,)),
            "holding": box((n,)), "backlog": box((n,)), "fixed": box((n,)),
            "past_demand": box((n, PAST_DEMANDS)), "period": box((1,), 0.0, 1.0), "supply_fill": box((n,), 0.0, 1.0),
        }) for a in self.possible_agents}
        self._act_spaces = {a: spaces.Dict({"order": spaces.MultiBinary(n),
                                            "quantity": spaces.Box(0.0, cfg.q_max, (n,), f32)})
                            for a in self.possible_agents}
        self._np_random: np.random.Generator | None = None
        self._t = 0

    def observation_space(self, agent: str) -> spaces.Space:
        return self._obs_spaces[agent]

    def action_space(self, agent: str) -> spaces.Space:
        return self._act_spaces[agent]

    # --- episode ---------------------------------------------------------------------------------------------
    def reset(self, seed: int | None = None, options: dict | None = None):
        if seed is not None or self._np_random is None:
            self._np_random, _ = seeding.np_random(seed)
        rng = self._np_random
        options = options or {}
        split = options.get("split", "train")
        task_id = options.get("task_id")
        if task_id is None:
            task_id = draw_task(split, rng, env_name=ENV_ID)
        self.task_id, self.split = int(task_id), split
        cfg = self.config
        self.scenario = stack_scenarios([make_scenario(i, cfg) for i in scenario_ids(self.task_id, self.n_warehouses)])
        self.capacity = self.supplier_capacity * self.scenario.mean.sum(0)  # (N,)
        self._mu = demand_means(self.scenario, cfg)  # (T, W, N)
        self._demand = sample_demand(self.scenario, cfg, rng)
        pad = np.zeros((PAST_DEMANDS,) + self._demand.shape[1:], np.float32)
        self._hist = np.concatenate([pad, np.minimum(self._demand, cfg.obs_bound).astype(np.float32)])
        self._on_hand, self._pipeline = initial_state(self.scenario, cfg, rng)
        self._fill = np.ones(cfg.n_skus)
        self._t = 0
        self._acc = np.zeros(self.n_warehouses)
        self._demand_sum = np.zeros(self.n_warehouses)
        self._short_sum = np.zeros(self.n_warehouses)
        self._orders = np.zeros(self.n_warehouses)
        self.agents = list(self.possible_agents)
        obs = {a: self._obs(w) for w, a in enumerate(self.agents)}
        ids = scenario_ids(self.task_id, self.n_warehouses)
        infos = {a: {"task_id": self.task_id, "split": split, "warehouse": w,
                     "scenario": {"task_id": ids[w], "config": cfg.to_dict()}}
                 for w, a in enumerate(self.agents)}
        return obs, infos

    def _obs(self, w: int) -> dict:
        cfg, t, B = self.config, self._t, self.config.obs_bound
        sc = self.scenario
        f = lambda x: np.asarray(x, dtype=np.float32).copy()  # noqa: E731
        return {
            "on_hand": f(np.clip(self._on_hand[w], -B, B)), "pipeline": f(self._pipeline[w]),
            "demand_mean": f(np.minimum(self._mu[min(t, cfg.horizon - 1), w], B)),
            "holding": f(sc.holding[w]), "backlog": f(sc.backlog[w]), "fixed": f(sc.fixed[w]),
            "past_demand": f(self._hist[t:t + PAST_DEMANDS, w].T), "period": np.array([t / cfg.horizon], np.float32),
            "supply_fill": f(self._fill),
        }

    def step(self, actions: dict):
        if not self.agents:
            raise ShopsimError("the episode is over; call reset()")
        cfg, t = self.config, self._t
        missing = [a for a in self.agents if a not in actions]
        if missing:
            raise InvalidActionError(f"actions missing for {missing}; step needs one action per live agent")
        parsed = [validate_action(actions[a], cfg.n_skus, cfg.q_max) for a in self.agents]
        order = np.stack([p[0] for p in parsed])
        quantity = np.stack([p[1] for p in parsed])
        shipped, fill = allocate(order, quantity, self.capacity)
        self._fill = fill
        sc = self.scenario
        avail = self._on_hand + self._pipeline[..., 0]  # what can serve this period's demand
        out = step_numpy(self._on_hand, self._pipeline, order, shipped, self._demand[t], sc.holding, sc.backlog,
                         sc.fixed, lost_sales=cfg.lost_sales, capacity=cfg.capacity, overflow_cost=cfg.overflow_cost)
        self._on_hand, self._pipeline = out.on_hand, out.pipeline
        costs = out.total  # (W,)
        if t >= cfg.warmup:
            self._acc += costs
            d = self._demand[t]
            self._demand_sum += d.sum(-1)
            # demand not served from stock (as the replenishment env counts it): min(d, (d - available)^+)
            self._short_sum += np.minimum(np.maximum(d - avail, 0.0), d).sum(-1)
            self._orders += (order * (shipped > 0)).sum(-1)
        self._t = t + 1
        done = self._t >= cfg.horizon
        team = float(costs.mean())
        rewards, infos = {}, {}
        for w, a in enumerate(self.agents):
            rewards[a] = -team if self.team_reward else -float(costs[w])
            infos[a] = {"cost": float(costs[w]), "team_cost": team, "period": t,
                        "cost_parts": {"holding": float(out.holding[w].sum()), "backlog": float(out.backlog[w].sum()),
                                       "fixed": float(out.fixed[w].sum()), "overflow": float(out.overflow[w])},
                        "supply_fill_min": float(fill.min())}
            if done:
                n_rep = cfg.horizon - cfg.warmup
                dem = self._demand_sum
                infos[a]["episode_metrics"] = {
                    "cost": float(self._acc[w]), "cost_per_period": float(self._acc[w]) / n_rep,
                    "fill_rate": float(1.0 - self._short_sum[w] / dem[w]) if dem[w] > 0 else 1.0,
                    "order_rate": float(self._orders[w]) / (n_rep * cfg.n_skus),
                    "team_cost": float(self._acc.sum()),
                    "team_fill_rate": float(1.0 - self._short_sum.sum() / dem.sum()) if dem.sum() > 0 else 1.0}
                infos[a]["score"] = -float(self._acc[w])
        obs = {a: self._obs(w) for w, a in enumerate(self.agents)}
        terms = {a: bool(done) for a in self.agents}
        truncs = {a: False for a in self.agents}
        if done:
            self.agents = []
        return obs, rewards, terms, truncs, infos

    def render(self):
        if self.render_mode != "ansi" or not hasattr(self, "scenario"):
            return None
        return "\n".join(f"warehouse_{w}: on_hand {np.round(self._on_hand[w], 1).tolist()}"
                         for w in range(self.n_warehouses))

    def close(self) -> None:
        pass

    def state(self) -> np.ndarray:
        return np.concatenate([self._on_hand.ravel(), self._pipeline.ravel()]).astype(np.float32)


def parallel_env(**kwargs: Any) -> MultiWarehouseEnv:
    """The native ParallelEnv."""
    return MultiWarehouseEnv(**kwargs)


def raw_env(**kwargs: Any):
    """The AEC version without wrappers."""
    return parallel_to_aec(parallel_env(**kwargs))


def env(**kwargs: Any):
    """The AEC version with PettingZoo's default order-enforcing wrapper."""
    return wrappers.OrderEnforcingWrapper(raw_env(**kwargs))


__all__ = ["MultiWarehouseEnv", "allocate", "allocate_torch", "env", "parallel_env", "raw_env", "ENV_ID"]
