"""TwoStageRetrieval-v0: an early-stage retriever picks K candidates, a fixed later-stage ranker shows L of them.

The synthetic setting of Kiyohara et al., "Credit-assigned Policy Gradient for Early Stage Retrieval in Two-stage
Ranking" (arXiv 2605.26385, §5 and the released simulator; docs/algorithms/capg.md):

* contexts (users) x and items e_a are unit vectors in R^dim (dim 10), drawn from U[-1, 1]^dim and normalised;
* reactiveness η(x, a) = sqrt(σ(w_x·x + 3) · σ(w_a·e_a + 3));
* expected score q(x, a) = 10 · xᵀ((1 − η) M_0 + η M_z) e_a with random unit-row dim×dim matrices, where z is the
  user's latent type (``n_user_types`` matrices M_1..M_Z, one by default — the paper names a single M_z);
* observed reward r ~ Normal(softplus(q) + 1, σ(xᵀ W e_a + 1)), so rewards are (almost surely) positive; the mean
  μ(x, a) = softplus(q) + 1 is the "policy value" of showing a;
* the later-stage ranker (LSR) shows L of the K candidates: ``optimal`` (top-L by q), ``noisy`` (L draws without
  replacement from softmax(q / lsr_temperature)), ``uniform`` (L at random) or ``anti`` (bottom-L by q);
* the episode reward is the mean observed reward over the L shown items.

`TwoStageRetrievalSim` is the public vectorised API (one numpy call evaluates a whole batch of contexts); the trainers
of the CA-PG family (`baselines.capg`) use it directly. `TwoStageRetrievalEnv` is the Gymnasium view: one context per
episode, one step.

Task ids: a task id is a context (user) seed; the context is a pure function of (base_seed, task id), computed with a
vectorised counter-based hash so that a batch of ids maps to contexts in one call. Splits live in the record's split
file (``data/splits/<Name-vN>.json``).

Invalid actions (documented rule): in the Gymnasium env an action with the wrong length, an out-of-range id or a
repeated id is an *invalid step*: reward 0.0, the episode ends, ``info["invalid_action"]`` says why. The batch API
(`TwoStageRetrievalSim.step_batch`/`evaluate_batch`) raises a `ShopsimError` (a ValueError) naming the first bad row.
"""

from __future__ import annotations

import zlib
from dataclasses import asdict, dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from shopsim.configs import checked_options
from shopsim.envs.records import TWO_STAGE_RETRIEVAL
from shopsim.errors import ConfigError, ShopsimError
from shopsim.splits import load_splits as _load_manifest
from shopsim.splits import read_manifest

ENV_ID = TWO_STAGE_RETRIEVAL.id
LSR_KINDS = ("optimal", "noisy", "uniform", "anti")
ITEM_SOURCES = ("synthetic", "catalog")

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def _splitmix64(z: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser on a uint64 array (wrap-around arithmetic is intended)."""
    z = z + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


def hash_uniform(seed: int, ids: np.ndarray, n_cols: int, stream: int = 0) -> np.ndarray:
    """Uniform [0, 1) numbers, shape (len(ids), n_cols), a pure function of (seed, stream, id, column).

    Counter-based, so contexts for a batch of task ids come from one vectorised call (no per-id Generator).
    """
    ids = np.asarray(ids, dtype=np.int64).astype(np.uint64)
    key = _splitmix64(np.array([seed * 1_000_003 + stream], dtype=np.uint64))
    ctr = ids[:, None] * np.uint64(n_cols) + np.arange(n_cols, dtype=np.uint64)[None, :]
    z = _splitmix64(_splitmix64(ctr ^ key) + key)
    return (z >> np.uint64(11)).astype(np.float64) * (1.0 / 9007199254740992.0)


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.maximum(np.linalg.norm(v, axis=-1, keepdims=True), 1e-12)


def _sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


@dataclass
class TwoStageRetrievalConfig:
    """Parameters of the two-stage retrieval simulator (defaults: the paper's synthetic preset, §5)."""

    n_items: int = 1000
    """Catalog size (items the retriever chooses from)."""
    k: int = 10
    """Candidate-set size K chosen by the early-stage retriever."""
    l: int = 1  # noqa: E741 (the paper's L; a public env keyword)
    """Number of candidates the later-stage ranker shows (L <= K)."""
    lsr: str = "optimal"
    """Later-stage ranker: optimal | noisy | uniform | anti."""
    lsr_temperature: float = 1.0
    """Softmax temperature of the noisy LSR (on q)."""
    dim: int = 10
    """Embedding dimension of contexts and items."""
    n_user_types: int = 1
    """Number of reactive matrices M_z; a user's type z is a pure function of its task id [derived]."""
    base_seed: int = 12345
    """Seed of the world (items, matrices); contexts are hashed from (base_seed, task id)."""
    item_source: str = "synthetic"
    """synthetic (the paper's preset) | catalog (item vectors from shopsim.catalog category/type/attributes)."""
    catalog_seed: int = 0
    """Seed of the shared catalog when item_source == 'catalog'."""

    def __post_init__(self) -> None:
        if self.n_items < 2:
            raise ConfigError(f"n_items must be >= 2, got {self.n_items}")
        if not 1 <= self.k <= self.n_items:
            raise ConfigError(f"k must be in [1, n_items={self.n_items}], got {self.k}")
        if not 1 <= self.l <= self.k:
            raise ConfigError(f"l (items shown) must be in [1, k={self.k}], got {self.l}")
        if self.lsr not in LSR_KINDS:
            raise ConfigError(f"lsr={self.lsr!r}; choose one of {', '.join(LSR_KINDS)}")
        if self.lsr_temperature <= 0:
            raise ConfigError(f"lsr_temperature must be > 0, got {self.lsr_temperature}")
        if self.dim < 2 or self.n_user_types < 1:
            raise ConfigError("dim must be >= 2 and n_user_types >= 1")
        if self.item_source not in ITEM_SOURCES:
            raise ConfigError(f"item_source={self.item_source!r}; choose one of {', '.join(ITEM_SOURCES)}")


@dataclass
class BatchOutcome:
    """What one batched step returns: per-context reward and what a CA-PG trainer needs."""

    reward: np.ndarray
    """(B,) mean observed reward over the shown items."""
    value: np.ndarray
    """(B,) mean expected reward μ = softplus(q) + 1 over the shown items (the policy value)."""
    shown_pos: np.ndarray
    """(B, L) positions (into the candidate set) of the shown items, in LSR order."""
    shown: np.ndarray
    """(B, L) item ids shown."""
    position_rewards: np.ndarray
    """(B, L) observed reward per shown position."""


class TwoStageRetrievalSim:
    """Vectorised simulator: contexts from task ids, expected rewards, the LSR and noisy rewards, all batched."""

    def __init__(self, config: TwoStageRetrievalConfig | None = None, **overrides) -> None:
        self.config = config if config is not None else TwoStageRetrievalConfig(**overrides)
        c = self.config
        rng = np.random.default_rng(c.base_seed)
        d = c.dim
        self.m0 = _unit(rng.uniform(-1, 1, (d, d)))
        self.mz = _unit(rng.uniform(-1, 1, (c.n_user_types, d, d)))
        self.w_x = rng.uniform(-1, 1, d)
        self.w_a = rng.uniform(-1, 1, d)
        self.w_noise = rng.uniform(-1, 1, (d, d)) / np.sqrt(d)
        if c.item_source == "synthetic":
            self.items = _unit(rng.uniform(-1, 1, (c.n_items, d)))
            self._centroids = None
        else:
            self.items, self._centroids = self._catalog_items()
        # Item-side projections, so a (context, item) pair costs three dim-length dot products:
        # xᵀM e = x · (M e); table[a] = [M0 e_a, Mz_1 e_a, ..., W e_a] (float32: halves the gather traffic).
        proj = [self.items @ self.m0.T] + [self.items @ m.T for m in self.mz] + [self.items @ self.w_noise.T]
        self._table = np.stack(proj, axis=1).astype(np.float32)  # (n, 2 + Z, d)
        self._sig_a = _sigmoid(self.items @ self.w_a + 3.0).astype(np.float32)

    # ------------------------------------------------------------------ contexts
    def _catalog_items(self):
        """Item vectors from the shared catalog: category + type + attribute directions (so genres exist)."""
        from shopsim.catalog import load_catalog

        c = self.config
        cat = load_catalog(size=c.n_items, seed=c.catalog_seed)
        if len(cat) != c.n_items:
            raise ConfigError(f"catalog has {len(cat)} products but n_items={c.n_items}; set n_items to the size")

        def vec(name: str, salt: int) -> np.ndarray:
            h = zlib.crc32(name.encode()) ^ (salt * 0x5BD1E995)
            return _unit(np.random.default_rng([c.base_seed, h & 0xFFFFFFFF]).uniform(-1, 1, c.dim))

        cat_vecs = np.stack([vec(n, 1) for n in cat.categories])
        type_vecs = np.stack([vec(n, 2) for n in cat.product_types])
        attrs = cat.table.column("attributes").to_pylist()
        attr_cache: dict[str, np.ndarray] = {}
        attr_part = np.zeros((c.n_items, c.dim))
        for i, lst in enumerate(attrs):
            if lst:
                attr_part[i] = np.mean([attr_cache.setdefault(a, vec(a, 3)) for a in lst], axis=0)
        items = cat_vecs[cat.category_ids] + 0.6 * type_vecs[cat.type_ids] + 0.3 * attr_part
        return _unit(items), cat_vecs

    def contexts(self, task_ids) -> np.ndarray:
        """(B, dim) float32 unit context vectors for task ids: a pure function of (base_seed, id)."""
        ids = np.atleast_1d(np.asarray(task_ids, dtype=np.int64))
        c = self.config
        if self._centroids is None:
            u = hash_uniform(c.base_seed, ids, c.dim, stream=1)
            return _unit(2.0 * u - 1.0).astype(np.float32)
        # catalog variant: a seeded mixture, one component per category
        u = hash_uniform(c.base_seed, ids, c.dim + 1, stream=2)
        comp = np.minimum((u[:, 0] * len(self._centroids)).astype(np.int64), len(self._centroids) - 1)
        return _unit(self._centroids[comp] + 0.7 * (2.0 * u[:, 1:] - 1.0)).astype(np.float32)

    def user_types(self, task_ids) -> np.ndarray:
        ids = np.atleast_1d(np.asarray(task_ids, dtype=np.int64))
        if self.config.n_user_types == 1:
            return np.zeros(len(ids), dtype=np.int64)
        u = hash_uniform(self.config.base_seed, ids, 1, stream=3)[:, 0]
        return np.minimum((u * self.config.n_user_types).astype(np.int64), self.config.n_user_types - 1)

    # ------------------------------------------------------------------ rewards
    def _q_and_std(self, x: np.ndarray, items: np.ndarray, z: np.ndarray | None):
        """q(x, a) and the reward std for items (B, K) of contexts x (B, dim); gathers item projections."""
        x = np.asarray(x, dtype=np.float32)
        zz = np.zeros(len(x), dtype=np.int64) if z is None else np.asarray(z, dtype=np.int64)
        g = self._table[items]  # (B, K, 2 + Z, d)
        base = np.einsum("bkd,bd->bk", g[:, :, 0], x)
        if self.config.n_user_types == 1:
            reac = np.einsum("bkd,bd->bk", g[:, :, 1], x)
        else:
            reac = np.einsum("bkd,bd->bk", np.take_along_axis(g, (1 + zz)[:, None, None, None], 2)[:, :, 0], x)
        noise_logit = np.einsum("bkd,bd->bk", g[:, :, -1], x)
        eta = np.sqrt(_sigmoid(x @ self.w_x.astype(np.float32) + 3.0)[:, None] * self._sig_a[items])
        q = 10.0 * ((1.0 - eta) * base + eta * reac)
        return q, _sigmoid(noise_logit + 1.0)

    @staticmethod
    def mean_reward(q: np.ndarray) -> np.ndarray:
        """μ = softplus(q) + 1, the expected observed reward."""
        return np.logaddexp(0.0, q) + 1.0

    def expected_reward(self, contexts, items, user_types=None) -> np.ndarray:
        """μ(x, a) for items (B, K) (or all items when `items` is None)."""
        x = np.asarray(contexts, dtype=np.float32)
        if items is None:
            return self.mean_reward(self._q_all(x, user_types))
        return self.mean_reward(self._q_and_std(x, np.asarray(items), user_types)[0])

    def _q_all(self, x: np.ndarray, z) -> np.ndarray:
        """q(x, a) for every item, (B, n_items): dense matmuls instead of gathers."""
        base = x @ self._table[:, 0].T
        if self.config.n_user_types == 1:
            reac = x @ self._table[:, 1].T
        else:
            zz = np.zeros(len(x), dtype=np.int64) if z is None else np.asarray(z, dtype=np.int64)
            reac = np.einsum("bd,bnd->bn", x, self._table[:, 1:-1].transpose(1, 0, 2)[zz])
        eta = np.sqrt(_sigmoid(x @ self.w_x.astype(np.float32) + 3.0)[:, None] * self._sig_a[None, :])
        return 10.0 * ((1.0 - eta) * base + eta * reac)

    def oracle_candidates(self, contexts, user_types=None, k: int | None = None) -> np.ndarray:
        """(B, k) the top-k items by true expected reward, best first (the expert's action; optimal for every LSR
        variant because each LSR's value is monotone in the candidates' scores)."""
        k = self.config.k if k is None else k
        mu = self.expected_reward(contexts, None, user_types)
        top = np.argpartition(-mu, k - 1, axis=1)[:, :k]
        order = np.argsort(-np.take_along_axis(mu, top, 1), axis=1, kind="stable")
        return np.take_along_axis(top, order, 1)

    # ------------------------------------------------------------------ validation + LSR
    def validate(self, candidate_sets) -> np.ndarray:
        """Return candidate sets as int64 (B, K); raise a ShopsimError naming the first bad row otherwise."""
        s = np.asarray(candidate_sets)
        c = self.config
        if s.ndim != 2 or s.shape[1] != c.k:
            raise ShopsimError(f"candidate_sets must have shape (batch, k={c.k}), got {s.shape}")
        if not np.issubdtype(s.dtype, np.integer):
            raise ShopsimError(f"candidate ids must be integers, got dtype {s.dtype}")
        bad = (s < 0) | (s >= c.n_items)
        if bad.any():
            row = int(np.argmax(bad.any(1)))
            raise ShopsimError(f"row {row}: item ids must be in [0, {c.n_items}), got {s[row].tolist()}")
        srt = np.sort(s, axis=1)
        dup = (srt[:, 1:] == srt[:, :-1]).any(1)
        if dup.any():
            row = int(np.argmax(dup))
            raise ShopsimError(f"row {row}: a candidate set must not repeat ids, got {s[row].tolist()}")
        return s.astype(np.int64, copy=False)

    def lsr_select(self, q: np.ndarray, rng: np.random.Generator, deterministic: bool = False) -> np.ndarray:
        """(B, L) positions the later-stage ranker shows, in its order.

        deterministic=True is the paper's evaluation mode: the noisy LSR acts greedily (top-L by q); the uniform LSR
        stays random (it has no deterministic version)."""
        c = self.config
        kind = "optimal" if (deterministic and c.lsr == "noisy") else c.lsr
        if kind == "optimal":
            key = q
        elif kind == "anti":
            key = -q
        elif kind == "uniform":
            key = rng.random(q.shape)
        else:  # Gumbel-top-L = L draws without replacement from softmax(q / T)
            key = q / c.lsr_temperature + rng.gumbel(size=q.shape)
        if c.l == 1:
            return np.argmax(key, axis=1)[:, None]
        part = np.argpartition(-key, c.l - 1, axis=1)[:, : c.l]
        order = np.argsort(-np.take_along_axis(key, part, 1), axis=1, kind="stable")
        return np.take_along_axis(part, order, 1)

    # ------------------------------------------------------------------ the batched step
    def evaluate_batch(self, contexts, candidate_sets, rng: np.random.Generator | None = None, *,
                       user_types=None, deterministic: bool = False, validate: bool = True) -> BatchOutcome:
        """One step for a batch of contexts (B, dim) and candidate sets (B, K): LSR + noisy rewards."""
        rng = np.random.default_rng() if rng is None else rng
        s = self.validate(candidate_sets) if validate else np.asarray(candidate_sets)
        x = np.asarray(contexts, dtype=np.float32)
        if x.shape != (len(s), self.config.dim):
            raise ShopsimError(f"contexts must have shape ({len(s)}, {self.config.dim}), got {x.shape}")
        q, std = self._q_and_std(x, s, user_types)
        pos = self.lsr_select(q, rng, deterministic)
        q_shown = np.take_along_axis(q, pos, 1)
        mu = self.mean_reward(q_shown)
        r = mu + np.take_along_axis(std, pos, 1) * rng.standard_normal(mu.shape)
        return BatchOutcome(reward=r.mean(1), value=mu.mean(1), shown_pos=pos,
                            shown=np.take_along_axis(s, pos, 1), position_rewards=r)

    def step_batch(self, contexts, candidate_sets, rng: np.random.Generator | None = None, **kw) -> np.ndarray:
        """(B,) rewards for a batch of contexts and candidate sets (see `evaluate_batch`)."""
        return self.evaluate_batch(contexts, candidate_sets, rng, **kw).reward


# ---------------------------------------------------------------------- splits
def load_splits(path: Path | None = None) -> dict:
    """The env's split manifest (its record's split file), or the one at `path` (`shopsim.splits`)."""
    return read_manifest(path) if path is not None else _load_manifest(ENV_ID)


def split_ids(split: str, n: int, rng: np.random.Generator, splits: dict | None = None) -> np.ndarray:
    """Draw n task ids of a split (train: uniform in its range; dev/test: from their lists)."""
    splits = splits or load_splits()
    if split == "train":
        lo, hi = splits["train"]["range"]
        return rng.integers(lo, hi, size=n)
    if split not in ("dev", "test"):
        raise ShopsimError(f"split={split!r}; choose train, dev or test")
    return rng.choice(np.asarray(splits[split], dtype=np.int64), size=n)


class TwoStageRetrievalEnv(gym.Env):
    """
    ## Description
    Two-stage recommendation as a contextual bandit (CA-PG, arXiv 2605.26385). Each episode is one user
    (context). The agent is the early-stage retriever: it picks an ordered candidate set of K distinct items out of
    `n_items`; a fixed later-stage ranker (LSR) shows L of them; the user rewards the shown items. For batched training
    use `TwoStageRetrievalSim` (``env.unwrapped.sim``), which evaluates a whole batch of contexts in one call.

    ## Action Space
    `MultiDiscrete([n_items] * k)`: the candidate ids. Wrong length, out-of-range or repeated ids are an invalid step.

    ## Observation Space
    `Box(-1, 1, (dim,), float32)`: the user's unit context vector x.

    ## Rewards
    Mean observed reward over the L shown items, r ~ Normal(softplus(q) + 1, σ(xᵀWe + 1)). `info` holds
    `position_rewards`, `shown`, `candidates`, `value` (mean softplus(q) + 1 of the shown items, i.e. the reward without
    noise) and `oracle_value` (value of the best candidate set). An invalid action gives reward 0.0 and
    `info["invalid_action"]` (the reason).

    ## Starting State
    `reset(options={"split": s, "task_id": t})` sets the context to the pure function of task id t; without a task id
    one is drawn from the split with `np_random`. The reset seed drives only the LSR and reward noise.
    `info["oracle"] = {"top_k": [...], "value": v}` is privileged (for the scripted expert only).

    ## Episode End
    After one step (terminated=True). `info["episode_metrics"] = {reward, value, oracle_value, regret, recall,
    invalid}`; `info["success"]` = the best catalog item is among the candidates; `info["score"]` = value.

    ## Arguments
    The fields of `TwoStageRetrievalConfig`: n_items=1000, k=10, l=1, lsr="optimal", lsr_temperature=1.0, dim=10,
    n_user_types=1, base_seed=12345, item_source="synthetic"|"catalog", catalog_seed=0.

    ## Version History
    * v0: initial version.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 1}

    @checked_options(ENV_ID, config=TwoStageRetrievalConfig)
    def __init__(self, render_mode: str | None = None, **config) -> None:
        self.config = TwoStageRetrievalConfig(**config)
        self.sim = TwoStageRetrievalSim(self.config)
        c = self.config
        self.observation_space = spaces.Box(-1.0, 1.0, (c.dim,), np.float32)
        self.action_space = spaces.MultiDiscrete(np.full(c.k, c.n_items, dtype=np.int64))
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ConfigError(f"render_mode={render_mode!r}; choose one of {self.metadata['render_modes']} or None")
        self.render_mode = render_mode
        self._splits = load_splits()
        self._x: np.ndarray | None = None
        self._last = ""

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        options = options or {}
        split = options.get("split", "train")
        task_id = options.get("task_id")
        if task_id is None:
            task_id = int(split_ids(split, 1, self.np_random, self._splits)[0])
        self.task_id, self.split = int(task_id), split
        self._x = self.sim.contexts([self.task_id])
        self._z = self.sim.user_types([self.task_id])
        top = self.sim.oracle_candidates(self._x, self._z)
        mu_top = self.sim.expected_reward(self._x, top, self._z)
        self._oracle_top = top[0]
        self._oracle_value = float(self._lsr_value(mu_top)[0])
        info = {"task_id": self.task_id, "split": split,
                "oracle": {"top_k": top[0].tolist(), "value": self._oracle_value}}
        return self._x[0].copy(), info

    def _lsr_value(self, mu_sorted_desc: np.ndarray) -> np.ndarray:
        """Deterministic-LSR value of candidate sets whose μ are given best first (uniform: the mean)."""
        c = self.config
        if c.lsr == "uniform":
            return mu_sorted_desc.mean(1)
        if c.lsr == "anti":
            return mu_sorted_desc[:, -c.l:].mean(1)
        return mu_sorted_desc[:, : c.l].mean(1)

    def _invalid_reason(self, action) -> str | None:
        c = self.config
        try:
            a = np.asarray(action)
        except Exception:  # noqa: BLE001 - anything unconvertible is an invalid action
            return "action is not an array of item ids"
        if a.ndim != 1 or a.shape[0] != c.k:
            return f"expected {c.k} candidate ids, got shape {a.shape}"
        if not np.issubdtype(a.dtype, np.integer):
            return f"candidate ids must be integers, got dtype {a.dtype}"
        if ((a < 0) | (a >= c.n_items)).any():
            return f"item ids must be in [0, {c.n_items})"
        if len(np.unique(a)) != c.k:
            return "a candidate set must not repeat ids"
        return None

    def step(self, action):
        if self._x is None:
            raise ShopsimError("call reset() before step(); each episode is a single step")
        reason = self._invalid_reason(action)
        info: dict = {"task_id": self.task_id, "split": self.split, "oracle_value": self._oracle_value}
        if reason is not None:
            reward, value, recall, success = 0.0, 0.0, 0.0, False
            info["invalid_action"] = reason
            self._last = f"task {self.task_id}: invalid action ({reason})"
        else:
            s = np.asarray(action, dtype=np.int64)[None, :]
            out = self.sim.evaluate_batch(self._x, s, self.np_random, user_types=self._z, validate=False)
            reward, value = float(out.reward[0]), float(out.value[0])
            recall = float(np.isin(s[0], self._oracle_top).mean())
            success = bool(self._oracle_top[0] in s[0])
            info.update(candidates=s[0].tolist(), shown=out.shown[0].tolist(),
                        position_rewards=[float(v) for v in out.position_rewards[0]], value=value)
            self._last = f"task {self.task_id}: shown {out.shown[0].tolist()} reward {reward:.3f} value {value:.3f}"
        info["success"], info["score"] = success, value
        info["episode_metrics"] = {"reward": reward, "value": value, "oracle_value": self._oracle_value,
                                   "regret": self._oracle_value - value, "recall": recall,
                                   "invalid": float(reason is not None)}
        self._x = None
        return np.zeros(self.config.dim, np.float32), reward, True, False, info

    def render(self):
        if self.render_mode == "ansi":
            return self._last
        return None

    def close(self) -> None:
        pass

    def config_dict(self) -> dict:
        return asdict(self.config)
