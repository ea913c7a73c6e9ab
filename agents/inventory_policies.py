"""Policies for the replenishment and multi-warehouse envs: OR references, naive baselines, the torch policy.

* `SSPolicyAgent`: (s, S) per SKU — order up to S when the inventory position (on hand + pipeline) is at or below s.
  The classical optimal form for a single item with a fixed ordering cost (Scarf 1960). s and S are tuned per SKU
  by simulation (`tune_policy`: coordinate search over grids in units of mean demand, common random demand paths
  drawn from the scenario's own distribution, never the evaluation path), cached per scenario.
* `BaseStockAgent`: order up to S every period (s = S), S tuned the same way; optimal without fixed costs.
* `ConstantOrderAgent`: orders `factor`·mean demand every period (or a fixed `quantity`): a naive reference.
* `RandomInventoryAgent`: orders with probability `p_order` a uniform quantity in [0, 4·mean].
* `HybridPolicyAgent`: the trained torch policy of HybridPPO / HPO (`agents.inventory_nets.HybridPolicy`).
* `perfect_information_cost`: a lower bound (the best order sequence in hindsight of the demand path), not an agent.

Per-SKU tuning is exact for the replenishment env without a capacity (SKUs do not interact); with a shared capacity
or a supplier limit the tuned values ignore the coupling (documented weakness).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from agents.base import Agent, Decision, ScriptedAgent
from shopsim.envs.records import REPLENISHMENT
from shopsim.envs.replenishment import (
    ReplenishmentConfig,
    Scenario,
    initial_state,
    make_scenario,
    sample_demand,
    step_numpy,
)

_TUNE_CACHE: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}


def scenario_from(obs: dict, info: dict | None) -> tuple[Scenario, ReplenishmentConfig]:
    """The scenario and config behind an episode: from the reset info when it names them (exact, seasonality
    included), else from the observation (cost parameters and current mean demand)."""
    sc = (info or {}).get("scenario") or {}
    if "config" in sc and "task_id" in sc and "scenario_arrays" not in sc:
        cfg = ReplenishmentConfig.from_dict(sc["config"])
        return make_scenario(sc["task_id"], cfg), cfg
    n, L = np.asarray(obs["pipeline"]).shape
    cfg_d = dict(sc.get("config", {}))
    cfg_d.update(n_skus=n, lead_time=L)
    cfg = ReplenishmentConfig.from_dict(cfg_d)
    get = lambda k: np.asarray(obs[k], dtype=np.float64)  # noqa: E731
    return Scenario(get("demand_mean"), get("holding"), get("backlog"), get("fixed"), np.zeros(n)), cfg


def simulate_policy(s: np.ndarray, S: np.ndarray, scen: Scenario, cfg: ReplenishmentConfig, demand: np.ndarray,
                    on_hand0: np.ndarray, pipe0: np.ndarray) -> np.ndarray:
    """Mean reported cost per SKU of (s, S) policies. s, S broadcast against (C, 1, N) candidates; demand is
    (T, P, N) for P common random paths. Returns (C, N) costs averaged over paths."""
    C = np.broadcast_shapes(np.shape(s), np.shape(S))[0]
    P, N = demand.shape[1:]
    on_hand = np.broadcast_to(on_hand0, (C, P, N)).copy()
    pipe = np.broadcast_to(pipe0, (C, P, N, pipe0.shape[-1])).copy()
    acc = np.zeros((C, P, N))
    for t in range(demand.shape[0]):
        ip = on_hand + pipe.sum(-1)
        order = (ip <= s).astype(np.float64)
        q = np.clip(S - ip, 0.0, cfg.q_max) * order
        out = step_numpy(on_hand, pipe, order, q, demand[t], scen.holding, scen.backlog, scen.fixed,
                         lost_sales=cfg.lost_sales)
        on_hand, pipe = out.on_hand, out.pipeline
        if t >= cfg.warmup:
            acc += out.holding + out.backlog + out.fixed
    return acc.mean(1)


def tune_policy(scen: Scenario, cfg: ReplenishmentConfig, kind: str = "sS", *, paths: int = 16, seed: int = 0,
                rounds: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """Tune (s, S) (kind "sS") or base-stock S (kind "base_stock", s = S − ε) per SKU by simulation.

    Coordinate search: S on a grid of mean multiples, then s given S, then S given s, `rounds` times; each grid
    is evaluated for all SKUs at once on the same `paths` demand paths (common random numbers)."""
    key = (kind, paths, seed, rounds, cfg, scen.mean.tobytes(), scen.holding.tobytes(), scen.backlog.tobytes(),
           scen.fixed.tobytes(), scen.phase.tobytes())
    if key in _TUNE_CACHE:
        return _TUNE_CACHE[key]
    rng = np.random.default_rng([seed, 0x7E5])
    demand = _paths(scen, cfg, rng, paths)
    on0, pipe0 = initial_state(scen, cfg, rng)
    mu = scen.mean
    L = cfg.lead_time
    S_grid = np.linspace(0.5, L + 8.0, 4 * (L + 8) - 1)[:, None, None] * mu  # (C,1,N)
    idx = np.arange(mu.size)
    cost = simulate_policy(S_grid - 1e-9, S_grid, scen, cfg, demand, on0, pipe0)
    S = S_grid[cost.argmin(0), 0, idx]
    s = S - 1e-9
    if kind == "sS":
        for _ in range(rounds):
            s_grid = np.linspace(-1.0, L + 6.0, 4 * (L + 7) + 1)[:, None, None] * mu
            s_grid = np.minimum(s_grid, S - 1e-9)
            cost = simulate_policy(s_grid, S, scen, cfg, demand, on0, pipe0)
            s = s_grid[cost.argmin(0), 0, idx]
            S_grid2 = s + np.linspace(0.25, 8.0, 32)[:, None, None] * mu
            cost = simulate_policy(s, S_grid2, scen, cfg, demand, on0, pipe0)
            S = S_grid2[cost.argmin(0), 0, idx]
    _TUNE_CACHE[key] = (s, S)
    return s, S


def perfect_information_cost(scen: Scenario, cfg: ReplenishmentConfig, demand: np.ndarray, on_hand0: np.ndarray,
                             pipe0: np.ndarray) -> np.ndarray:
    """Perfect-information lower bound: the least reported cost any order sequence achieves on a known demand path.

    Per SKU and path (backlog mode; integer demand and starting stock, so integer arrivals suffice), a backward
    DP over the net stock on an integer grid: V_t(x) = min(f_t(x), K·[t−L >= warmup] + min_{y>x} f_t(y)) with
    f_t(y) = c_t(y − d_t) + V_{t+1}(y − d_t); the inner minimum is a suffix minimum, so each period costs O(grid).
    Arrivals before period L are the fixed pipeline; orders placed in the last L periods never arrive.
    Arrays: scen (N,), demand (T, ..., N), on_hand0 (..., N), pipe0 (..., N, L). Returns reported cost (..., N).
    No policy that sees only the past can do better, so it bounds the gap any learner can close. Lost sales: NaN.
    """
    if cfg.lost_sales:
        return np.full(np.shape(on_hand0), np.nan)
    T, L, W = demand.shape[0], cfg.lead_time, cfg.warmup
    shape = np.shape(on_hand0)
    d = demand.reshape(T, -1).astype(np.int64)  # (T, M)
    M = d.shape[1]
    bcast = lambda a: np.broadcast_to(a, shape).reshape(-1)  # noqa: E731
    h, b, K = bcast(scen.holding), bcast(scen.backlog), bcast(scen.fixed)
    x0 = np.rint(np.reshape(on_hand0, -1)).astype(np.int64)
    pipe = np.rint(np.reshape(pipe0, (M, L))).astype(np.int64)
    total = d.sum(0)
    lo = int(min(0, x0.min()) - total.max() - 1)
    hi = int(x0.max() + pipe.sum(1).max() + total.max() + 1)
    grid = np.arange(lo, hi + 1)
    S = grid.size
    V = np.zeros((M, S))
    rows = np.arange(M)[:, None]
    for t in range(T - 1, -1, -1):
        nxt = np.arange(S)[None, :] - d[t][:, None]  # index of y − d_t for every y on the grid
        ok = nxt >= 0
        inv = grid[None, :] - d[t][:, None]
        c = (h[:, None] * np.maximum(inv, 0) + b[:, None] * np.maximum(-inv, 0)) if t >= W else 0.0
        f = np.where(ok, c + V[rows, np.clip(nxt, 0, S - 1)], np.inf)
        if t < L:  # fixed arrival from the starting pipeline: V_t(x) = f(x + p_t)
            j = np.arange(S)[None, :] + pipe[:, t][:, None]
            V = np.where(j < S, f[rows, np.clip(j, 0, S - 1)], np.inf)
        else:
            suffix = np.minimum.accumulate(f[:, ::-1], axis=1)[:, ::-1]  # min_{y >= x} f(y)
            after = np.concatenate([suffix[:, 1:], np.full((M, 1), np.inf)], axis=1)  # min_{y > x}
            V = np.minimum(f, (K[:, None] if t - L >= W else 0.0) + after)
    return V[np.arange(M), x0 - lo].reshape(shape)


def perfect_information_episode_cost(task_id: int, seed: int, cfg: ReplenishmentConfig) -> float:
    """The perfect-information bound for the env episode reset with (seed, task_id): the same demand path and
    starting stock as `ReplenishmentEnv.reset(seed=seed, options={"task_id": task_id})` draws."""
    scen = make_scenario(task_id, cfg)
    rng = np.random.default_rng(seed)
    demand = sample_demand(scen, cfg, rng)
    on0, pipe0 = initial_state(scen, cfg, rng)
    return float(perfect_information_cost(scen, cfg, demand, on0, pipe0).sum())


def _paths(scen: Scenario, cfg: ReplenishmentConfig, rng: np.random.Generator, paths: int) -> np.ndarray:
    batch = Scenario(np.broadcast_to(scen.mean, (paths, scen.n_skus)), scen.holding, scen.backlog, scen.fixed,
                     np.broadcast_to(scen.phase, (paths, scen.n_skus)))
    return sample_demand(batch, cfg, rng)  # (T, P, N)


def _action(order: np.ndarray, quantity: np.ndarray) -> dict:
    return {"order": order.astype(np.int8), "quantity": quantity.astype(np.float32)}


class SSPolicyAgent(ScriptedAgent):
    """(s, S) per SKU, tuned by simulation at the start of each episode (cached per scenario)."""

    name = "s_S"
    kind = "sS"

    def __init__(self, env_id: str = REPLENISHMENT.id, *, paths: int = 16, seed: int = 0, rounds: int = 2):
        self.env_id, self.paths, self.seed, self.rounds = env_id, paths, seed, rounds
        self._levels: dict[int, tuple[np.ndarray, np.ndarray, float]] = {}

    def begin_episode(self, slot: int, observation: Any, info: dict) -> None:
        scen, cfg = scenario_from(observation, info)
        s, S = tune_policy(scen, cfg, self.kind, paths=self.paths, seed=self.seed, rounds=self.rounds)
        self._levels[slot] = (s, S, cfg.q_max)

    def levels(self, slot: int = 0) -> tuple[np.ndarray, np.ndarray]:
        return self._levels[slot][:2]

    def act_one(self, slot: int, observation: Any, info: dict) -> Any:
        if slot not in self._levels:
            self.begin_episode(slot, observation, info)
        s, S, q_max = self._levels[slot]
        ip = np.asarray(observation["on_hand"], np.float64) + np.asarray(observation["pipeline"], np.float64).sum(-1)
        order = ip <= s
        return _action(order, np.clip(S - ip, 0.0, q_max) * order)


class BaseStockAgent(SSPolicyAgent):
    """Order up to S every period (base-stock), S tuned per SKU by simulation with the fixed cost counted."""

    name = "base_stock"
    kind = "base_stock"


class ConstantOrderAgent(ScriptedAgent):
    """Orders the same amount every period: `quantity` if given, else `factor` times the mean demand."""

    name = "constant"

    def __init__(self, env_id: str = REPLENISHMENT.id, *, quantity: float | None = None, factor: float = 1.0):
        self.env_id, self.quantity, self.factor = env_id, quantity, factor

    def act_one(self, slot: int, observation: Any, info: dict) -> Any:
        mu = np.asarray(observation["demand_mean"], np.float64)
        q = np.full_like(mu, self.quantity) if self.quantity is not None else self.factor * mu
        return _action(np.ones_like(mu, dtype=bool), q)


class RandomInventoryAgent(ScriptedAgent):
    """Orders each SKU with probability `p_order`, a quantity uniform in [0, 4·mean] (seeded by `reset`)."""

    name = "random"

    def __init__(self, env_id: str = REPLENISHMENT.id, *, p_order: float = 0.3, seed: int | None = None):
        self.env_id, self.p_order = env_id, p_order
        self.rng = np.random.default_rng(seed)

    def act_one(self, slot: int, observation: Any, info: dict) -> Any:
        mu = np.asarray(observation["demand_mean"], np.float64)
        order = self.rng.random(mu.shape) < self.p_order
        return _action(order, self.rng.uniform(0.0, 4.0, mu.shape) * mu * order)


class HybridPolicyAgent(Agent):
    """The torch hybrid policy of HybridPPO / HPO acting on batches of observations.

    `deterministic=True` (default for evaluation) orders where the order probability exceeds 0.5 and uses the mean
    quantity; otherwise it samples both heads (Gaussian noise of std `policy.std` for PPO policies, `gaussian=True`).
    Decisions carry the log-prob of the sampled action.
    """

    name = "hybrid"
    learns = True

    def __init__(self, env_id: str = REPLENISHMENT.id, *, policy=None, deterministic: bool = True,
                 gaussian: bool = False, seed: int | None = None):
        if policy is None:
            raise ValueError("HybridPolicyAgent needs policy=HybridPolicy(...); load a trained one with "
                             "HybridPolicyAgent.from_checkpoint(dir) or agents.load_checkpoint(dir)")
        import torch

        self.env_id, self.policy, self.deterministic, self.gaussian = env_id, policy, deterministic, gaussian
        self.gen = torch.Generator().manual_seed(seed or 0)

    def reset(self, num_slots: int, seed: int | None = None) -> None:
        super().reset(num_slots, seed)
        if seed is not None:
            self.gen.manual_seed(seed)

    def act(self, observations, infos, slots) -> list[Decision]:
        import torch

        from agents.inventory_nets import obs_to_features

        with torch.no_grad():
            feats = obs_to_features(observations)
            mean = torch.as_tensor(np.stack([np.asarray(o["demand_mean"]) for o in observations]), dtype=torch.float32)
            logits, x = self.policy(feats)
            if self.deterministic:
                order = (logits > 0).float()
                u = x
            else:
                p = torch.sigmoid(logits)
                order = (torch.rand(p.shape, generator=self.gen) < p).float()
                u = x + self.policy.std * torch.randn(x.shape, generator=self.gen) if self.gaussian else x
            q = self.policy.quantity(u, mean) * order
            lp = -torch.nn.functional.binary_cross_entropy_with_logits(logits, order, reduction="none").sum(-1)
            if self.gaussian and not self.deterministic:
                lp = lp + (torch.distributions.Normal(x, self.policy.std).log_prob(u) * order).sum(-1)
        out = []
        for i in range(len(observations)):
            out.append(Decision(_action(order[i].numpy() > 0, q[i].numpy()), logprob=float(lp[i])))
        return out

    def save(self, directory, **info: Any) -> Path:
        import torch

        from agents.registry import save_manifest
        from shopsim.paths import atomic_write, write_text_atomic

        directory = Path(directory)
        with atomic_write(directory / "policy.pt") as tmp:
            torch.save(self.policy.state_dict(), tmp)
        write_text_atomic(directory / "policy_spec.json", json.dumps({**self.policy.spec(), "gaussian": self.gaussian}))
        save_manifest(directory, type(self), self.env_id, **info)
        return directory

    @classmethod
    def from_checkpoint(cls, directory, env_id: str = REPLENISHMENT.id, **kw: Any) -> HybridPolicyAgent:
        from agents.inventory_nets import HybridPolicy
        from shopsim.statefile import load_weights

        directory = Path(directory)
        spec = json.loads((directory / "policy_spec.json").read_text())
        gaussian = spec.pop("gaussian", False)
        spec["hidden"] = tuple(spec["hidden"])
        policy = HybridPolicy(**spec)
        policy.load_state_dict(load_weights(directory / "policy.pt"))
        policy.eval()
        kw.setdefault("gaussian", gaussian)
        return cls(env_id=env_id, policy=policy, **kw)
