"""A catalog variant with clusters of near-duplicate products (``ShoppingEnv(near_duplicates=k)``).

ShopSimulator (ACL 2026) uses a fine-grained catalog with many highly similar items per sub-category, so that an
agent must tell close products apart rather than take the first plausible hit. `near_duplicate_catalog(base, k)`
keeps every product of `base` (same ids, SKUs and rows) and appends, for one product in `HEAD_SHARE` (the cluster
*heads*, chosen by a hash of the id), ``k - 1`` siblings that each differ from the head in exactly one thing, in
this order:

1. ``attribute``: the head's first attribute replaced by another of its type (the title shows it);
2. ``price``: the price raised by three price steps, above any ceiling a task puts on the head (same title);
3. ``option``: one value of the first option dimension withdrawn (replaced by another of the taxonomy when the head
   offers only two), so the sibling cannot be bought with it (same title and price);
4. ``attribute_last``: the head's last attribute replaced (not in the title when the head has four attributes).

``clusters[target] = {"members": ids, "attributes": [...], "option": [dim, value]}`` says which constraints tell the
cluster apart; `shopsim.envs.shopping.tasks` draws targets among the cluster targets only and puts those constraints
in every goal, so buying a sibling always misses one. Siblings get new ids after the base rows (SKUs from the same
bijection); because search ties rank lower ids first, the head's content is then moved to a random member id (its
row swapped with that sibling's), so the target is not always the first of its cluster in the results. Every other
base row is unchanged. Deterministic in (size, seed, k).
"""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa

from shopsim.catalog import generate
from shopsim.catalog.core import Catalog, load_catalog
from shopsim.catalog.taxonomy import _title_case
from shopsim.errors import ConfigError

HEAD_SHARE = 5  # one product in HEAD_SHARE heads a cluster
VARIANTS = ("attribute", "price", "option", "attribute_last")
MAX_CLUSTER = len(VARIANTS) + 1


def _price_step(price: float) -> float:
    return 5.0 if price < 50 else 10.0 if price < 200 else 50.0


def _sku(pid: int, ab: tuple[int, int]) -> str:
    num = (pid * ab[0] + ab[1]) % generate.SKU_MOD
    digits = []
    for _ in range(8):
        num, r = divmod(num, 36)
        digits.append("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"[r])
    return "B0" + "".join(reversed(digits))


class NearDuplicateCatalog(Catalog):
    """A `Catalog` whose rows past ``size`` are near-duplicate siblings of cluster heads (module docstring)."""

    def __init__(self, table: pa.Table, size: int, seed: int, k: int, clusters: dict[int, dict]):
        super().__init__(table, size, seed)
        self.near_duplicates = k
        self.clusters = clusters
        self.cluster_heads = np.array(sorted(clusters), dtype=np.int64)
        self.cluster_heads.flags.writeable = False

    def cache_key(self) -> str:
        # the search index is cached per catalog key: this catalog's documents differ from the base's
        return f"{super().cache_key()}_nd{self.near_duplicates}"

    def __reduce__(self):
        return (load_near_duplicates, (self.size, self.seed, self.near_duplicates))


def _mix(ids: np.ndarray, seed: int) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = ids.astype(np.uint64) + np.uint64(0xD1B54A32D192ED03) * np.uint64(seed + 7)
        z = (z ^ (z >> np.uint64(33))) * np.uint64(0xFF51AFD7ED558CCD)
        z = (z ^ (z >> np.uint64(33))) * np.uint64(0xC4CEB9FE1A85EC53)
    return z ^ (z >> np.uint64(33))


def near_duplicate_catalog(base: Catalog, k: int) -> NearDuplicateCatalog:
    """`base` plus ``k - 1`` near-duplicate siblings per cluster head (module docstring)."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 2 <= k <= MAX_CLUSTER:
        raise ConfigError(f"near_duplicates={k!r}: the cluster size (head + siblings) must be 2..{MAX_CLUSTER}, "
                          "or 0 for the plain catalog")
    rng = np.random.default_rng(np.random.SeedSequence([base.seed, int(k), 0xD0D]))
    ids = np.arange(base.size, dtype=np.int64)
    heads = ids[(_mix(ids, base.seed) % np.uint64(HEAD_SHARE)) == 0]
    types = {t: spec for cat in base.taxonomy["categories"].values() for t, spec in cat["types"].items()}
    ab = generate.sku_params(base.seed)
    rows, clusters, next_id = [], {}, base.size
    order = np.arange(base.size + len(heads) * (k - 1), dtype=np.int64)  # row i shows the content of row order[i]
    for h in heads.tolist():
        p = base.product(h)
        spec = types[p.product_type]
        members, need_attrs, need_opt = [h], [], None
        for variant in VARIANTS[: k - 1]:
            attrs, title, desc = list(p.attributes), p.title, p.description
            price, values = p.price, [list(v) for v in p.option_values]
            if variant in ("attribute", "attribute_last"):
                i = 0 if variant == "attribute" else len(attrs) - 1
                spare = [a for a in spec["attributes"] if a not in attrs]
                if (variant == "attribute_last" and len(attrs) < 2) or not spare:
                    continue
                new = spare[int(rng.integers(len(spare)))]
                desc = desc.replace(", ".join(attrs), ", ".join([*attrs[:i], new, *attrs[i + 1:]]), 1)
                if i < 3:  # the title shows the first three attributes
                    title = title.replace(_title_case(attrs[i]), _title_case(new), 1)
                need_attrs.append(attrs[i])
                attrs[i] = new
            elif variant == "price":
                price = round(p.price + 3 * _price_step(p.price), 2)
            else:
                dim = p.option_names[0]
                keep = values[0]
                gone = keep[int(rng.integers(len(keep)))]
                rest = [v for v in keep if v != gone]
                if len(rest) < 2:
                    extra = [v for v in spec["options"][dim] if v not in keep]
                    rest += extra[:1]
                if not rest:
                    continue
                values[0] = rest
                need_opt = [dim, gone]
            rows.append({"product_id": next_id, "sku": _sku(next_id, ab), "category": p.category,
                         "product_type": p.product_type, "brand": p.brand, "title": title, "description": desc,
                         "price": float(price), "rating": p.rating, "num_reviews": p.num_reviews, "stock": p.stock,
                         "attributes": attrs, "option_names": list(p.option_names), "option_values": values})
            members.append(next_id)
            next_id += 1
        # search ties rank lower ids first: the target's content goes to a random member id, so it is not always
        # the cluster's first hit (its row swaps with the sibling drawn for that id)
        slot = int(rng.integers(len(members)))
        target = members[slot]
        if slot:
            order[h], order[target] = target, h
        clusters[target] = {"members": members, "attributes": need_attrs, "option": need_opt}
    extra = pa.Table.from_pylist(rows, schema=generate.SCHEMA)
    table = pa.concat_tables([base.table, extra])
    # move row contents, keep each position's product id and SKU
    moved = table.take(pa.array(order[:table.num_rows]))
    for col in ("product_id", "sku"):
        i = moved.schema.get_field_index(col)
        moved = moved.set_column(i, col, table.column(col))
    return NearDuplicateCatalog(moved, base.size, base.seed, int(k), clusters)


_MEMO: dict[tuple, NearDuplicateCatalog] = {}
_LOCK = threading.Lock()


def load_near_duplicates(size: int = 10_000, seed: int = 0, k: int = 4) -> NearDuplicateCatalog:
    """The process-wide near-duplicate catalog for (size, seed, k), built from `load_catalog(size, seed)` once."""
    key = (int(size), int(seed), int(k))
    with _LOCK:
        if key not in _MEMO:
            _MEMO[key] = near_duplicate_catalog(load_catalog(size, seed), k)
        return _MEMO[key]
