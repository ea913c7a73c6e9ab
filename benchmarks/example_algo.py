"""A worked example of benchmarking your own algorithm: ``shopsim bench --algo benchmarks.example_algo:CoverSearch``.

Any `baselines.Algorithm` subclass can be put on the leaderboard next to the shipped baselines. It needs

* ``families`` — which env families it trains (here ``("inventory",)``: the benchmark runs it on Replenishment-v0);
* ``Config`` — a dataclass of its options, validated in ``__post_init__``;
* ``train(env_id, *, iterations, seed, out_dir, init, progress)`` returning a `baselines.TrainResult` whose
  ``agent`` is an `agents.Agent`; write ``out_dir/metrics.csv`` (one row per iteration) to get a learning curve.

The algorithm here is a small derivative-free policy search. The policy orders, per SKU, up to ``cover`` periods of
mean demand when the inventory position (on hand + pipeline) falls below ``reorder`` periods of it (an (s, S) rule
whose two levels are shared by all SKUs and scale with demand). Each iteration evaluates the current point and
its four neighbours on fixed training scenarios with `shopsim.rollout.collect` (train split only: the test split
stays unseen), moves to the cheapest, and halves the step when none is cheaper (compass search, Kolda, Lewis and
Torczon 2003, §3). It uses only public shopsim APIs.

Try it::

    shopsim bench --quick --envs Replenishment-v0 --algo benchmarks.example_algo:CoverSearch --out runs/mine

and the leaderboard in ``runs/mine/leaderboard.md`` gets a ``cover_search`` row with its cost and gap to (s, S).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from agents.base import ScriptedAgent
from baselines.base import Algorithm, TrainResult
from shopsim.errors import ConfigError


class CoverPolicy(ScriptedAgent):
    """Order up to `cover` x mean demand when the inventory position is below `reorder` x mean demand."""

    name = "cover"

    def __init__(self, *, env_id: str = "shopsim/Replenishment-v0", reorder: float = 2.0, cover: float = 4.0):
        self.env_id, self.reorder, self.cover = env_id, float(reorder), float(cover)

    def act_one(self, slot, observation, info):
        mu = np.asarray(observation["demand_mean"], np.float64)
        position = np.asarray(observation["on_hand"], np.float64) + np.asarray(observation["pipeline"]).sum(-1)
        order = position < self.reorder * mu
        quantity = np.clip(self.cover * mu - position, 0.0, None) * order
        return {"order": order.astype(np.int8), "quantity": quantity.astype(np.float32)}


@dataclass
class CoverSearchConfig:
    reorder: float = 2.0
    """Starting reorder point, in periods of mean demand."""
    cover: float = 4.0
    """Starting order-up-to level, in periods of mean demand."""
    step: float = 1.0
    """Starting step of the compass search (halved when no neighbour improves)."""
    episodes: int = 16
    """Training scenarios (train split) every candidate is evaluated on; the same ones every iteration."""

    def __post_init__(self) -> None:
        if self.step <= 0 or self.episodes < 1:
            raise ConfigError("step must be > 0 and episodes >= 1")
        if not 0 <= self.reorder <= self.cover:
            raise ConfigError(f"need 0 <= reorder <= cover, got reorder={self.reorder}, cover={self.cover}")


class CoverSearch(Algorithm):
    """Compass search over the two levels of a demand-scaled (s, S) rule (see the module docstring)."""

    name = "cover_search"
    families = ("inventory",)
    Config = CoverSearchConfig

    def _cost(self, env_id: str, reorder: float, cover: float, seed: int) -> float:
        from shopsim.rollout import collect

        agent = CoverPolicy(env_id=env_id, reorder=reorder, cover=cover)
        trajs = collect(env_id, agent, episodes=self.config.episodes, seed=seed, split="train", progress=False)
        return float(np.mean([t.final_info["episode_metrics"]["cost"] for t in trajs]))

    def train(self, env_id, *, iterations, seed=0, out_dir="runs/cover_search", init=None, progress=True, **kw):
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        c = self.config
        point, step = (c.reorder, c.cover), c.step
        best = self._cost(env_id, *point, seed)
        history = []
        for it in range(iterations):
            r, s = point
            candidates = [(r + dr, s + ds) for dr, ds in ((step, 0), (-step, 0), (0, step), (0, -step))]
            candidates = [(a, b) for a, b in candidates if 0 <= a <= b]
            costs = [self._cost(env_id, a, b, seed) for a, b in candidates]
            if costs and min(costs) < best:
                best, point = min(costs), candidates[int(np.argmin(costs))]
            else:
                step /= 2
            history.append({"iteration": it, "cost": best, "reorder": point[0], "cover": point[1], "step": step})
        if history:
            with open(out / "metrics.csv", "w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=list(history[0]))
                writer.writeheader()
                writer.writerows(history)
        agent = CoverPolicy(env_id=env_id, reorder=point[0], cover=point[1])
        return TrainResult(out_dir=out, history=history, agent=agent)
