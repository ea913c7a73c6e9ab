"""Item embeddings and hierarchical semantic IDs for the proactive-recommendation env.

ProRL (arXiv 2605.28293, §3; code hongruhou89/ProRL) names each item with a 4-token *semantic ID*: three codes from a
residual k-means (RQ-style) quantisation of the item embedding, plus a collision digit that separates items whose
three codes coincide. A policy then "speaks" items as token sequences, and can hallucinate IDs that name no item.

Embeddings here are synthetic but structured like real catalog embeddings, so that "genres" exist:

    e_i = normalise( c[category_i] + 0.6 · t[product_type_i] + 0.35 · ε_i + 0.15 · f(price_i, rating_i) )

with random unit category centres `c`, type offsets `t`, item noise ε and a 2-d price/rating feature projected by a
fixed random matrix. Everything is a pure function of (category ids, type ids, prices, ratings, seed).

Residual k-means: level 1 clusters the embeddings, level 2 clusters the residuals, level 3 the residuals of those.
ProRL uses 3 levels of 256 codes; a 5k-item catalog cannot fill 256³ cells, so each level gets
``min(256, max(4, round(1.6 · n^(1/3))))`` codes (27 for 5k items; `codebook_size` overrides it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shopsim.errors import ConfigError

NUM_LEVELS = 3
MAX_CODES = 256


def item_embeddings(category_ids, type_ids, prices, ratings, *, dim: int = 32, seed: int = 0) -> np.ndarray:
    """Unit-norm float32 embeddings [n, dim] clustered by category, then product type (module docstring)."""
    category_ids = np.asarray(category_ids, dtype=np.int64)
    type_ids = np.asarray(type_ids, dtype=np.int64)
    n = len(category_ids)
    rng = np.random.default_rng([seed, 0x5E11])
    cat_c = rng.standard_normal((int(category_ids.max()) + 1, dim))
    cat_c /= np.linalg.norm(cat_c, axis=1, keepdims=True)
    typ_c = rng.standard_normal((int(type_ids.max()) + 1, dim))
    typ_c /= np.linalg.norm(typ_c, axis=1, keepdims=True)
    noise = rng.standard_normal((n, dim)) / np.sqrt(dim)
    logp = np.log1p(np.asarray(prices, dtype=np.float64))
    feat = np.stack([(logp - logp.mean()) / (logp.std() + 1e-9),
                     (np.asarray(ratings, dtype=np.float64) - 3.0) / 2.0], axis=1)
    proj = rng.standard_normal((2, dim)) / np.sqrt(dim)
    emb = cat_c[category_ids] + 0.6 * typ_c[type_ids] + 0.35 * noise * np.sqrt(dim) / 3 + 0.15 * feat @ proj
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    return emb.astype(np.float32)


def kmeans(x: np.ndarray, k: int, *, seed: int, iters: int = 25) -> tuple[np.ndarray, np.ndarray]:
    """Lloyd's k-means with k-means++ seeding (numpy, deterministic for a seed). Returns (centres [k,d], labels [n])."""
    rng = np.random.default_rng(seed)
    n = len(x)
    k = min(k, n)
    centres = np.empty((k, x.shape[1]), dtype=np.float64)
    centres[0] = x[rng.integers(n)]
    d2 = ((x - centres[0]) ** 2).sum(1)
    for j in range(1, k):  # k-means++: pick far points with probability ∝ squared distance
        p = d2 / d2.sum() if d2.sum() > 0 else np.full(n, 1.0 / n)
        centres[j] = x[rng.choice(n, p=p)]
        d2 = np.minimum(d2, ((x - centres[j]) ** 2).sum(1))
    labels = np.zeros(n, dtype=np.int64)
    for _ in range(iters):
        dist = (x * x).sum(1)[:, None] - 2 * x @ centres.T + (centres * centres).sum(1)[None]
        new = dist.argmin(1)
        if _ > 0 and np.array_equal(new, labels):
            break
        labels = new
        for j in range(k):
            members = x[labels == j]
            if len(members):
                centres[j] = members.mean(0)
            else:  # re-seed an empty cluster at the worst-served point
                centres[j] = x[dist.min(1).argmax()]
    return centres, labels


def default_codebook_size(n_items: int) -> int:
    return int(min(MAX_CODES, max(4, round(1.6 * n_items ** (1.0 / 3.0)))))


@dataclass
class SemanticIDs:
    """The semantic-ID table of a catalog: `codes[i] = (c1, c2, c3, collision)`, unique per item.

    `sizes` = (K1, K2, K3, C): the range of each digit (C = 1 + the largest collision digit in use).
    `lookup(codes)` maps code tuples back to item ids, −1 where no item has that ID (a hallucinated item).
    """

    codes: np.ndarray  # [n, 4] int64
    sizes: tuple[int, int, int, int]

    def __post_init__(self) -> None:
        self.codes = np.asarray(self.codes, dtype=np.int64)
        keys = self.encode(self.codes)
        order = np.argsort(keys, kind="stable")
        self._sorted_keys = keys[order]
        self._sorted_items = order
        if len(np.unique(keys)) != len(keys):
            raise ConfigError("semantic IDs are not unique; the collision digit must separate every item")

    @property
    def n_items(self) -> int:
        return len(self.codes)

    def encode(self, codes: np.ndarray) -> np.ndarray:
        """Mixed-radix integer key of code tuples [..., 4] (int64)."""
        c = np.asarray(codes, dtype=np.int64)
        k1, k2, k3, cc = self.sizes
        return ((c[..., 0] * k2 + c[..., 1]) * k3 + c[..., 2]) * cc + c[..., 3]

    def in_range(self, codes: np.ndarray) -> np.ndarray:
        c = np.asarray(codes, dtype=np.int64)
        return np.all((c >= 0) & (c < np.asarray(self.sizes)), axis=-1)

    def lookup(self, codes: np.ndarray) -> np.ndarray:
        """Item id for each code tuple [..., 4]; −1 where the tuple names no item (or a digit is out of range)."""
        c = np.asarray(codes, dtype=np.int64)
        ok = self.in_range(c)
        keys = self.encode(np.where(ok[..., None], c, 0))
        pos = np.clip(np.searchsorted(self._sorted_keys, keys), 0, len(self._sorted_keys) - 1)
        hit = ok & (self._sorted_keys[pos] == keys)
        return np.where(hit, self._sorted_items[pos], -1)


def build_semantic_ids(emb: np.ndarray, *, seed: int = 0, codebook_size: int | None = None,
                       iters: int = 25) -> SemanticIDs:
    """Residual k-means semantic IDs (3 levels) plus a collision digit, as in ProRL's item tokenisation."""
    x = np.asarray(emb, dtype=np.float64)
    n = len(x)
    k = codebook_size or default_codebook_size(n)
    if not 2 <= k <= MAX_CODES:
        raise ConfigError(f"codebook_size={k}; use 2..{MAX_CODES}")
    codes = np.zeros((n, 4), dtype=np.int64)
    resid = x.copy()
    sizes = []
    for level in range(NUM_LEVELS):
        centres, labels = kmeans(resid, k, seed=seed * 1000 + level, iters=iters)
        codes[:, level] = labels
        sizes.append(len(centres))
        resid = resid - centres[labels]
    # collision digit: rank of the item among the items sharing its 3 codes (ordered by item id, so deterministic)
    prefix = (codes[:, 0] * sizes[1] + codes[:, 1]) * sizes[2] + codes[:, 2]
    order = np.lexsort((np.arange(n), prefix))
    sp = prefix[order]
    starts = np.r_[0, np.flatnonzero(sp[1:] != sp[:-1]) + 1]
    run_start = np.repeat(starts, np.diff(np.r_[starts, n]))
    codes[order, 3] = np.arange(n) - run_start
    n_coll = int(codes[:, 3].max()) + 1
    if n_coll > MAX_CODES:
        raise ConfigError(f"{n_coll} items share one semantic-ID prefix (max {MAX_CODES}); raise codebook_size")
    return SemanticIDs(codes, (sizes[0], sizes[1], sizes[2], n_coll))
