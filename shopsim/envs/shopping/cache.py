"""Process-wide read caches of the shopping env, shared by every env copy in a process.

Keyed by the shared, read-only catalog / index objects. GRPO-style groups replay the same task several times, so
the same products and queries recur across copies; `clear` empties them (the benchmark measures cold searches).
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shopsim.catalog import Product


@lru_cache(maxsize=16_384)
def row(catalog, pid: int) -> tuple[str, str]:
    return catalog.column("sku")[pid].as_py(), catalog.column("title")[pid].as_py()


@lru_cache(maxsize=4096)
def product(catalog, pid: int) -> Product:
    return catalog.product(pid)


@lru_cache(maxsize=4096)
def search(index, query: str, k: int) -> tuple[int, ...]:
    return tuple(pid for pid, _ in index.search(query, k=k))


_NUM = r"(\d+(?:\.\d+)?)"
#: a price clause in a query: "price lower than 20.00 dollars", "price under $20", "under 20 dollars", "below $20";
#: a bare "under 5" is left as keywords ("toys for kids under 5")
PRICE_CLAUSE = re.compile(
    rf"[,;]?\s*(?:\band\s+)?(?:\bprice\s+(?:lower than|less than|under|below|at most)\s+\$?{_NUM}(?:\s*dollars?\b)?"
    rf"|\b(?:under|below|less than)\s+(?:\${_NUM}|{_NUM}\s*dollars?\b))", re.IGNORECASE)


@lru_cache(maxsize=4096)  # called per search and per rendered results page
def split_price(query: str) -> tuple[str, float | None]:
    """(the query's keywords, its price ceiling or None). The last price clause wins; every clause is removed, so
    its words do not count as keywords."""
    ceiling = None
    for m in PRICE_CLAUSE.finditer(query):
        ceiling = float(next(g for g in m.groups() if g is not None))
    return (" ".join(PRICE_CLAUSE.sub(" ", query).split()).strip(" ,;") if ceiling is not None else query), ceiling


@lru_cache(maxsize=4096)
def search_priced(index, catalog, keywords: str, ceiling: float, k: int) -> tuple[int, ...]:
    """The first `k` hits of `keywords`, in rank order, whose price is at most `ceiling` (a price equal to the
    ceiling counts as within, as in grading). The ranked list is read in growing windows until `k` pass or the
    matches run out, so a filter that keeps few products still scans the whole match list."""
    prices, want = catalog.prices, min(max(4 * k, 64), len(index))
    while True:
        hits = index.search(keywords, k=want)
        kept = tuple(pid for pid, _ in hits if prices[pid] <= ceiling + 1e-9)
        if len(kept) >= k or len(hits) < want or want >= len(index):
            return kept[:k]
        want = min(want * 4, len(index))


def clear() -> None:
    """Forget the process-wide product/search caches (benchmarks measure cold searches with it)."""
    for f in (row, product, search, search_priced):
        f.cache_clear()


