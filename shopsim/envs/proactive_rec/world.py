"""The shared, read-only world of the proactive-recommendation env: items, embeddings, semantic IDs, simulator
and scenarios.

One `World` per (catalog size, catalog seed, simulator kind) per process (`get_world` memoises), so vector-env copies,
the batched scorer, agents and trainers share it. Building it for a 5k-item catalog takes a few seconds plus, the first
time only, ~30 s of SASRec training on CPU; the weights are then cached under `shopsim.paths.cache_dir()`.

Scenarios (task ids). A task id t is a pure function of the world (not of the reset seed):
* history: 10 items drawn from the synthetic user process of `simulator.generate_sequences`, seeded by (catalog
  seed, t);
* target: an item "far" from the history — uniform among the items whose cosine to the mean history embedding is in
  the lowest 20 %, preferring categories absent from the history (ProRL picks targets the user would not reach alone).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from shopsim.envs.proactive_rec.semantic_ids import SemanticIDs, build_semantic_ids, item_embeddings
from shopsim.envs.proactive_rec.simulator import Simulator, generate_sequences, load_simulator

HISTORY_LEN = 10
L_MAX = 10
DEFAULT_CATALOG_SIZE = 5_000
FAR_QUANTILE = 0.2


class World:
    """Items (embeddings, semantic IDs, categories), the frozen simulator, and the scenario generator."""

    def __init__(self, emb: np.ndarray, category_ids: np.ndarray, *, key: str, seed: int = 0,
                 simulator: str = "sasrec", sids: SemanticIDs | None = None, log=None):
        self.emb = np.asarray(emb, dtype=np.float32)
        self.category_ids = np.asarray(category_ids, dtype=np.int64)
        self.n_items = len(self.emb)
        self.key, self.seed = key, seed
        self.sids = sids or build_semantic_ids(self.emb, seed=seed)
        self.sim: Simulator = load_simulator(simulator, self.emb, key=key, seed=seed, log=log)
        self._tasks: dict[int, tuple[np.ndarray, int]] = {}

    @classmethod
    def from_catalog(cls, size: int = DEFAULT_CATALOG_SIZE, seed: int = 0, simulator: str = "sasrec", log=None):
        from shopsim.catalog import load_catalog

        cat = load_catalog(size=size, seed=seed)
        ratings = cat.table.column("rating").to_numpy()
        emb = item_embeddings(cat.category_ids, cat.type_ids, cat.prices, ratings, seed=seed)
        return cls(emb, cat.category_ids, key=f"n{size}-s{seed}", seed=seed, simulator=simulator, log=log)

    def task(self, task_id: int) -> tuple[np.ndarray, int]:
        """(history [10] int64, target item) of scenario `task_id` (memoised; pure function of the world)."""
        task_id = int(task_id)
        if task_id not in self._tasks:
            if len(self._tasks) > 200_000:
                self._tasks.clear()
            hist = generate_sequences(self.emb, 1, HISTORY_LEN, seed=[self.seed, task_id, 0x7A5C])[0]
            rng = np.random.default_rng([self.seed, task_id, 0x7A76])
            centre = self.emb[hist].mean(0)
            cos = self.emb @ (centre / (np.linalg.norm(centre) + 1e-9))
            far = cos <= np.quantile(cos, FAR_QUANTILE)
            far[hist] = False
            other = far & ~np.isin(self.category_ids, self.category_ids[hist])
            pool = np.flatnonzero(other if other.any() else far)
            self._tasks[task_id] = (hist, int(pool[rng.integers(len(pool))]))
        return self._tasks[task_id]

    def tasks(self, task_ids) -> tuple[np.ndarray, np.ndarray]:
        """Batched `task`: histories [B, 10], targets [B]."""
        pairs = [self.task(t) for t in task_ids]
        return np.stack([p[0] for p in pairs]), np.array([p[1] for p in pairs], dtype=np.int64)


@lru_cache(maxsize=8)
def get_world(catalog_size: int = DEFAULT_CATALOG_SIZE, catalog_seed: int = 0, simulator: str = "sasrec") -> World:
    """The process-wide shared world for these settings (built once, simulator cached on disk)."""
    return World.from_catalog(catalog_size, catalog_seed, simulator)
