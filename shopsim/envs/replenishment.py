"""Replenishment-v0: periodic-review inventory control of N SKUs with a hybrid (order?, how much) action.

The dynamics are written twice, as pure functions that broadcast over any leading batch shape (scenarios,
warehouses, policy candidates):

* `step_numpy` drives the Gymnasium env and the OR reference policies (vectorised over SKUs and scenarios);
* `step_torch` is the same arithmetic in torch, differentiable with respect to the order quantities (and the
  incoming state) for fixed discrete order decisions and fixed pre-sampled demand. HPO's pathwise gradient
  (Alvo, Russo, Kanoria, arXiv 2605.14297, "mixed gradient"; docs/algorithms/hpo.md) runs through it.

A task id is a scenario: `make_scenario(task_id, config)` draws every per-SKU parameter from a generator seeded by
the task id alone, so the same id gives the same SKUs under any reset seed; the reset seed only drives demand and
the starting stock. The default preset is the HPO paper's inventory setting.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from shopsim.configs import bounded, check_options, checked_options, validate
from shopsim.envs.records import REPLENISHMENT
from shopsim.errors import ConfigError, ShopsimError
from shopsim.splits import load_splits

ENV_ID = REPLENISHMENT.id
PAST_DEMANDS = 4  # how many past demands the observation shows
_SALT = 0x5E9A  # separates scenario streams from other uses of the same integer


class InvalidActionError(ShopsimError):
    """An action outside the hybrid action space (wrong shape, NaN/inf, negative or above q_max, order not 0/1)."""


@dataclass(frozen=True)
class ReplenishmentConfig:
    """Every knob of the replenishment env (defaults: the HPO paper preset)."""

    n_skus: int = bounded(5, min=1)
    lead_time: int = bounded(2, min=1)
    """Periods between placing an order and its arrival (>= 1: orders arrive at the start of a later period)."""
    horizon: int = bounded(100, min=1)
    warmup: int = bounded(16, min=0)
    """The first `warmup` periods are left out of the reported cost (the paper's burn-in); < horizon."""
    demand: Literal["poisson", "negbin"] = "poisson"
    """poisson | negbin (negative binomial with the same mean, variance mean + mean²/dispersion)."""
    dispersion: float = bounded(5.0, gt=0)
    seasonality: float = bounded(0.0, min=0, lt=1)
    """Amplitude a of the seasonal factor 1 + a·sin(2π t / season_period + phase_i), 0 <= a < 1."""
    season_period: int = 26
    mean_range: tuple[float, float] = (6.0, 14.0)
    holding_range: tuple[float, float] = (0.7, 1.3)
    backlog_range: tuple[float, float] = (6.3, 11.7)
    fixed_cost: float = bounded(64.0, min=0)
    lost_sales: bool = False
    """False: unmet demand is backlogged; True: it is lost (and charged the backlog/penalty cost once)."""
    capacity: float | None = bounded(None, gt=0)
    """Optional shared warehouse capacity: on-hand units above it cost `overflow_cost` each per period."""
    overflow_cost: float = bounded(5.0, min=0)
    q_max: float = 200.0
    use_catalog: bool = False
    """Take SKU names and prices from `shopsim.catalog` (reported in the reset info)."""
    catalog_size: int = 10_000
    catalog_seed: int = 0

    def __post_init__(self) -> None:
        def bad(msg: str) -> ConfigError:
            return ConfigError(f"Replenishment config: {msg}")

        for f in dataclasses.fields(self):  # numpy scalars count as the Python number they hold (as in check_options)
            value = getattr(self, f.name)
            if isinstance(value, np.generic):
                object.__setattr__(self, f.name, value.item())
        try:
            validate(self)  # types, `demand`'s choices and the `bounded` ranges of the fields above
        except ConfigError as exc:
            raise bad(str(exc)) from None
        # rules across fields
        if self.warmup >= self.horizon:
            raise bad(f"need warmup < horizon, got horizon={self.horizon}, warmup={self.warmup}")
        for name in ("mean_range", "holding_range", "backlog_range"):
            lo, hi = getattr(self, name)
            if not 0 <= lo <= hi:
                raise bad(f"{name} must be (lo, hi) with 0 <= lo <= hi, got {(lo, hi)}")
        if self.mean_range[1] <= 0:
            raise bad("mean_range upper end must be > 0")
        if self.q_max < 2 * self.mean_range[1]:
            raise bad(f"q_max={self.q_max} is too small for mean demand up to {self.mean_range[1]}; raise q_max")

    @property
    def obs_bound(self) -> float:
        """Finite bound of the stock-like observation entries (values are clipped to it)."""
        return float(self.q_max * (self.horizon + self.lead_time + 1))

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        for k in ("mean_range", "holding_range", "backlog_range"):
            d[k] = list(d[k])
        return d

    @classmethod
    def from_dict(cls, d: dict) -> ReplenishmentConfig:
        check_options("ReplenishmentConfig", d, config=cls)
        d = dict(d)
        for k in ("mean_range", "holding_range", "backlog_range"):
            if k in d:
                d[k] = tuple(float(x) for x in d[k])
        return cls(**d)


@dataclass
class Scenario:
    """Per-SKU parameters of one or a batch of scenarios; every array has shape (..., N)."""

    mean: np.ndarray
    holding: np.ndarray
    backlog: np.ndarray
    fixed: np.ndarray
    phase: np.ndarray
    task_id: Any = None

    @property
    def n_skus(self) -> int:
        return self.mean.shape[-1]


def make_scenario(task_id: int, config: ReplenishmentConfig) -> Scenario:
    """The scenario of `task_id`: a pure function of (task id, n_skus, the parameter ranges)."""
    rng = np.random.default_rng(np.random.SeedSequence([int(task_id) & 0xFFFFFFFFFFFF, config.n_skus, _SALT]))
    n = config.n_skus
    mean = rng.uniform(*config.mean_range, size=n)
    holding = rng.uniform(*config.holding_range, size=n)
    backlog = rng.uniform(*config.backlog_range, size=n)
    phase = rng.uniform(0.0, 2 * np.pi, size=n)
    return Scenario(mean, holding, backlog, np.full(n, float(config.fixed_cost)), phase, task_id=int(task_id))


def stack_scenarios(scenarios: list[Scenario]) -> Scenario:
    """Stack scenarios of equal N into one batch Scenario with arrays (B, N)."""
    fields = ("mean", "holding", "backlog", "fixed", "phase")
    arrs = {f: np.stack([getattr(s, f) for s in scenarios]) for f in fields}
    return Scenario(**arrs, task_id=[s.task_id for s in scenarios])


def demand_means(scen: Scenario, config: ReplenishmentConfig, horizon: int | None = None) -> np.ndarray:
    """Expected demand per period, shape (T, ..., N): the base mean times the seasonal factor."""
    T = config.horizon if horizon is None else horizon
    if config.seasonality == 0:
        return np.broadcast_to(scen.mean, (T,) + scen.mean.shape)
    t = np.arange(T, dtype=np.float64).reshape((T,) + (1,) * scen.mean.ndim)
    factor = 1.0 + config.seasonality * np.sin(2 * np.pi * t / config.season_period + scen.phase)
    return scen.mean * factor


def sample_demand(scen: Scenario, config: ReplenishmentConfig, rng: np.random.Generator,
                  horizon: int | None = None) -> np.ndarray:
    """Pre-sample a whole demand path, shape (T, ..., N), float64 integers (the fixed noise ξ of HPO)."""
    mu = demand_means(scen, config, horizon)
    if config.demand == "poisson":
        return rng.poisson(mu).astype(np.float64)
    k = config.dispersion
    return rng.negative_binomial(k, k / (k + mu)).astype(np.float64)


def initial_state(scen: Scenario, config: ReplenishmentConfig, rng: np.random.Generator):
    """Starting stock: on-hand ~ U[1, 3]·mean (floored), each pipeline slot holds floor(mean)."""
    on_hand = np.floor(rng.uniform(1.0, 3.0, size=scen.mean.shape) * scen.mean)
    pipeline = np.repeat(np.floor(scen.mean)[..., None], config.lead_time, axis=-1)
    return on_hand, pipeline


class StepOut(NamedTuple):
    """New state and the period's cost split (arrays (..., N) except `overflow` (...)) and `total` (...))."""

    on_hand: Any
    pipeline: Any
    holding: Any
    backlog: Any
    fixed: Any
    overflow: Any
    total: Any


def step_numpy(on_hand, pipeline, order, quantity, demand, holding, backlog, fixed, *,
               lost_sales: bool = False, capacity: float | None = None, overflow_cost: float = 0.0) -> StepOut:
    """One period of the dynamics, vectorised over SKUs and any leading batch shape.

    Order of events in a period: (1) the oldest pipeline slot arrives, (2) the order ``order·quantity`` joins the
    back of the pipeline (it arrives `lead_time` periods later), (3) demand is served from the available stock,
    (4) costs: holding h·(stock)^+, backlog/penalty b·(shortage), fixed K when ``order`` is 1 and the quantity
    positive, and, with a capacity, overflow_cost per on-hand unit above it (summed over SKUs). With lost sales
    the shortage is lost and stock floors at 0; with backlog it is carried as negative stock.
    """
    q = order * quantity
    avail = on_hand + pipeline[..., 0]
    new_pipeline = np.concatenate([pipeline[..., 1:], q[..., None]], axis=-1)
    raw = avail - demand
    short = np.maximum(-raw, 0.0)
    stock = np.maximum(raw, 0.0)
    new_on_hand = stock if lost_sales else raw
    c_h = holding * stock
    c_b = backlog * short
    c_f = fixed * (order * (quantity > 0))
    total = (c_h + c_b + c_f).sum(-1)
    if capacity is not None:
        over = overflow_cost * np.maximum(stock.sum(-1) - capacity, 0.0)
        total = total + over
    else:
        over = np.zeros_like(total)
    return StepOut(new_on_hand, new_pipeline, c_h, c_b, c_f, over, total)


def step_torch(on_hand, pipeline, order, quantity, demand, holding, backlog, fixed, *,
               lost_sales: bool = False, capacity: float | None = None, overflow_cost: float = 0.0) -> StepOut:
    """`step_numpy` in torch (same arguments, tensors). Differentiable with respect to `quantity`, `on_hand` and
    `pipeline` almost everywhere for fixed `order` (0/1 floats) and fixed `demand`: every cost is piecewise linear
    in them, the fixed-cost indicator is piecewise constant (zero pathwise gradient, as in the paper)."""
    import torch

    q = order * quantity
    avail = on_hand + pipeline[..., 0]
    new_pipeline = torch.cat([pipeline[..., 1:], q.unsqueeze(-1)], dim=-1)
    raw = avail - demand
    short = torch.relu(-raw)
    stock = torch.relu(raw)
    new_on_hand = stock if lost_sales else raw
    c_h = holding * stock
    c_b = backlog * short
    c_f = fixed * (order * (quantity > 0).to(quantity.dtype))
    total = (c_h + c_b + c_f).sum(-1)
    if capacity is not None:
        over = overflow_cost * torch.relu(stock.sum(-1) - capacity)
        total = total + over
    else:
        over = torch.zeros_like(total)
    return StepOut(new_on_hand, new_pipeline, c_h, c_b, c_f, over, total)


def load_split(env_name: str = ENV_ID) -> dict:
    """The split manifest of env `env_name` (its record's split file: train range, dev and test id lists;
    `shopsim.splits`)."""
    return load_splits(env_name)


def draw_task(split: str, rng: np.random.Generator, env_name: str = ENV_ID) -> int:
    """A task id of `split` drawn with `rng` (train: uniform over the range; dev/test: uniform over the list)."""
    manifest = load_split(env_name)
    if split not in ("train", "dev", "test"):
        raise ShopsimError(f"unknown split {split!r}; use 'train', 'dev' or 'test'")
    part = manifest[split]
    if isinstance(part, dict):
        lo, hi = part["range"]
        return int(rng.integers(lo, hi))
    return int(part[int(rng.integers(len(part)))])


def validate_action(action: Any, n: int, q_max: float) -> tuple[np.ndarray, np.ndarray]:
    """Check a hybrid action and return (order float 0/1, quantity float64), each of shape (..., n).

    The documented rule: anything outside the action space raises `InvalidActionError` (a ValueError) naming the
    problem; nothing is clipped or repaired. A float tolerance of 1e-6·q_max is allowed above q_max for float32
    round-off.
    """
    try:
        order = action["order"]
        quantity = action["quantity"]
    except (TypeError, KeyError, IndexError) as exc:
        raise InvalidActionError(
            f"action must be a dict {{'order': (N,) of 0/1, 'quantity': (N,) floats in [0, q_max]}}, "
            f"got {type(action).__name__}"
        ) from exc
    o = np.asarray(order)
    q = np.asarray(quantity, dtype=np.float64)
    if o.shape[-1:] != (n,) or q.shape != o.shape:
        raise InvalidActionError(f"action['order'] and action['quantity'] must have shape ({n},), "
                                 f"got {o.shape} and {q.shape}")
    if not np.isfinite(q).all():
        raise InvalidActionError("action['quantity'] contains NaN or inf")
    if q.min() < 0:
        raise InvalidActionError(f"action['quantity'] must be >= 0, got min {q.min()}")
    if q.max() > q_max * (1 + 1e-6):
        raise InvalidActionError(f"action['quantity'] must be <= q_max={q_max}, got max {q.max()}")
    of = o.astype(np.float64, copy=False)
    if not ((of == 0) | (of == 1)).all():
        raise InvalidActionError("action['order'] must hold only 0 and 1")
    return of, q


class ReplenishmentEnv(gym.Env):
    """
    ## Description
    Periodic review of N SKUs (default 5, tested up to 1,000s) with a lead time, stochastic demand (Poisson or
    negative binomial, optionally seasonal), holding and backlog (or lost-sales) costs and a fixed cost per order.
    Each period the agent decides per SKU whether to order (discrete) and how much (continuous): a hybrid action.
    The default preset is the HPO paper's (Alvo et al., arXiv 2605.14297).

    ## Action Space
    `Dict(order=MultiBinary(N), quantity=Box(0, q_max, (N,), float32))`. `quantity` is ignored where `order` is 0.
    Rule for actions outside the space: `step` raises `InvalidActionError` (a `ValueError`) with the reason
    (wrong shape, NaN/inf, negative or above q_max, order not 0/1); nothing is clipped.

    ## Observation Space
    A `Dict` of float32 arrays (B = q_max·(horizon + lead_time + 1); stock-like values are clipped to ±B):

    | key | shape | meaning | min | max |
    |-----|-------|---------|-----|-----|
    | on_hand | (N,) | stock after last period's demand (negative = backlog) | -B | B |
    | pipeline | (N, L) | orders in transit, column 0 arrives next period | 0 | q_max |
    | demand_mean | (N,) | expected demand of the coming period | 0 | B |
    | holding | (N,) | holding cost per unit and period | 0 | B |
    | backlog | (N,) | backlog (lost-sales penalty) cost per unit | 0 | B |
    | fixed | (N,) | fixed cost of an order | 0 | B |
    | past_demand | (N, 4) | last 4 demands, newest last (0 before the start) | 0 | B |
    | period | (1,) | t / horizon | 0 | 1 |

    ## Rewards
    Minus the period cost, a Python float. `info["cost_parts"]` holds holding, backlog, fixed and overflow costs.

    ## Starting State
    The task id fixes the SKUs' parameters (`make_scenario`). The reset seed draws the demand path and the
    starting stock (on-hand U[1, 3]·mean floored; each pipeline slot floor(mean)).

    ## Episode End
    `terminated` is True after `horizon` periods (a finite-horizon problem: nothing follows); never truncated.
    The final info holds `episode_metrics`: `cost` (periods >= warmup, the reported number), `cost_per_period`,
    `total_cost`, its parts, `fill_rate` and `order_rate`; and `score` = −cost.

    ## Arguments
    Every field of `ReplenishmentConfig` as a keyword (`n_skus`, `lead_time`, `demand`, `seasonality`,
    `lost_sales`, `capacity`, `use_catalog`, ...), or `config=ReplenishmentConfig(...)`; `render_mode="ansi"`.
    Reset options: `split` ("train" | "dev" | "test", default "train") and `task_id`.

    ## Version History
    * v0: initial version.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4}

    @checked_options(ENV_ID, config=ReplenishmentConfig)
    def __init__(self, config: ReplenishmentConfig | None = None, render_mode: str | None = None, **kwargs: Any):
        if config is None:
            config = ReplenishmentConfig.from_dict(kwargs)
        elif kwargs:
            raise ConfigError("pass either config=ReplenishmentConfig(...) or keyword options, not both")
        if render_mode not in (None, "ansi"):
            raise ConfigError(f"render_mode={render_mode!r}; only 'ansi' is supported")
        self.config = config
        self.render_mode = render_mode
        n, L, B = config.n_skus, config.lead_time, config.obs_bound
        self.n_skus = n
        f32 = np.float32
        self.action_space = spaces.Dict({
            "order": spaces.MultiBinary(n),
            "quantity": spaces.Box(0.0, config.q_max, (n,), f32),
        })
        box = lambda shape, lo=0.0, hi=B: spaces.Box(lo, hi, shape, f32)  # noqa: E731
        self.observation_space = spaces.Dict({
            "on_hand": box((n,), -B, B),
            "pipeline": box((n, L), 0.0, config.q_max),
            "demand_mean": box((n,)),
            "holding": box((n,)),
            "backlog": box((n,)),
            "fixed": box((n,)),
            "past_demand": box((n, PAST_DEMANDS)),
            "period": box((1,), 0.0, 1.0),
        })
        self._bound = B
        self.scenario: Scenario | None = None

    # --- episode ---------------------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        options = options or {}
        split = options.get("split", "train")
        task_id = options.get("task_id")
        if task_id is None:
            task_id = draw_task(split, self.np_random)
        cfg = self.config
        scen = make_scenario(int(task_id), cfg)
        self.scenario = scen
        self.task_id, self.split = int(task_id), split
        self._mu = demand_means(scen, cfg)
        self._demand = sample_demand(scen, cfg, self.np_random)
        pad = np.zeros((PAST_DEMANDS, self.n_skus), np.float32)
        self._demand_hist = np.concatenate([pad, np.minimum(self._demand, self._bound).astype(np.float32)])
        self._on_hand, self._pipeline = initial_state(scen, cfg, self.np_random)
        self._t = 0
        self._static = {k: getattr(scen, k).astype(np.float32) for k in ("holding", "backlog", "fixed")}
        self._mu32 = np.minimum(self._mu, self._bound).astype(np.float32)
        self._acc = np.zeros(4)  # reported holding, backlog, fixed, overflow
        self._total = 0.0
        self._demand_sum = self._short_sum = 0.0
        self._orders = 0.0
        info = {"task_id": self.task_id, "split": split, "scenario": self.scenario_info()}
        return self._obs(), info

    def scenario_info(self) -> dict:
        """JSON-serialisable description a reference policy may use: task id and config (not the demand path)."""
        info = {"task_id": self.task_id, "config": self.config.to_dict()}
        if self.config.use_catalog:
            info.update(self._catalog_skus())
        return info

    def _catalog_skus(self) -> dict:
        from shopsim.catalog import load_catalog

        cat = load_catalog(size=self.config.catalog_size, seed=self.config.catalog_seed)
        rng = np.random.default_rng([self.task_id & 0xFFFFFFFFFFFF, _SALT, 1])
        ids = rng.choice(len(cat), size=min(self.n_skus, len(cat)), replace=False)
        skus = cat.table.column("sku").to_pylist()
        titles = cat.table.column("title").to_pylist()
        return {"product_ids": [int(i) for i in ids], "skus": [skus[i] for i in ids],
                "names": [titles[i] for i in ids], "prices": [float(cat.prices[i]) for i in ids]}

    def _obs(self) -> dict:
        t, B = self._t, self._bound
        mu_t = self._mu32[min(t, self.config.horizon - 1)]
        return {
            "on_hand": np.clip(self._on_hand, -B, B).astype(np.float32),
            "pipeline": self._pipeline.astype(np.float32),
            # fresh arrays on every call: users may keep (or mutate) what we return (check_env tests this)
            "demand_mean": mu_t.copy(),
            "holding": self._static["holding"].copy(),
            "backlog": self._static["backlog"].copy(),
            "fixed": self._static["fixed"].copy(),
            "past_demand": self._demand_hist[t:t + PAST_DEMANDS].T.copy(),
            "period": np.array([t / self.config.horizon], np.float32),
        }

    def step(self, action):
        if self.scenario is None:
            raise ShopsimError("call reset() before step()")
        cfg, t = self.config, self._t
        if t >= cfg.horizon:
            raise ShopsimError("the episode is over (horizon reached); call reset()")
        order, quantity = validate_action(action, self.n_skus, cfg.q_max)
        scen, d = self.scenario, self._demand[t]
        avail = self._on_hand + self._pipeline[:, 0]
        out = step_numpy(self._on_hand, self._pipeline, order, quantity, d, scen.holding, scen.backlog,
                         scen.fixed, lost_sales=cfg.lost_sales, capacity=cfg.capacity,
                         overflow_cost=cfg.overflow_cost)
        self._on_hand, self._pipeline = out.on_hand, out.pipeline
        parts = (float(out.holding.sum()), float(out.backlog.sum()), float(out.fixed.sum()), float(out.overflow))
        cost = float(out.total)
        reported = t >= cfg.warmup
        self._total += cost
        if reported:
            self._acc += parts
            dsum = float(d.sum())
            self._demand_sum += dsum
            # demand of this period not served from stock (exact in both modes): min(d, (d - available)^+)
            self._short_sum += float(np.minimum(np.maximum(d - avail, 0.0), d).sum())
            self._orders += float((order * (quantity > 0)).sum())
        self._t = t = t + 1
        terminated = t >= cfg.horizon
        info = {"cost": cost, "period": t - 1, "reported": reported,
                "cost_parts": {"holding": parts[0], "backlog": parts[1], "fixed": parts[2], "overflow": parts[3]}}
        if terminated:
            info["episode_metrics"] = self.episode_metrics()
            info["score"] = -info["episode_metrics"]["cost"]
        return self._obs(), -cost, terminated, False, info

    def episode_metrics(self) -> dict:
        cfg = self.config
        n_rep = cfg.horizon - cfg.warmup
        h, b, f, o = (float(x) for x in self._acc)
        cost = h + b + f + o
        fill = 1.0 - self._short_sum / self._demand_sum if self._demand_sum > 0 else 1.0
        return {"cost": cost, "cost_per_period": cost / n_rep, "cost_per_sku_period": cost / (n_rep * self.n_skus),
                "total_cost": float(self._total), "holding_cost": h, "backlog_cost": b, "fixed_cost": f,
                "overflow_cost": o, "fill_rate": float(fill), "order_rate": self._orders / (n_rep * self.n_skus),
                "n_skus": float(self.n_skus)}

    def render(self):
        if self.render_mode != "ansi" or self.scenario is None:
            return None
        rows = [f"period {self._t}/{self.config.horizon}  task {self.task_id}"]
        rows.append("sku  on_hand  pipeline            mean")
        for i in range(min(self.n_skus, 20)):
            pipe = ",".join(f"{x:.0f}" for x in self._pipeline[i])
            rows.append(f"{i:>3}  {self._on_hand[i]:>7.1f}  [{pipe:<16}]  "
                        f"{self._mu[min(self._t, self.config.horizon - 1), i]:>5.1f}")
        return "\n".join(rows)

    def close(self) -> None:
        pass
