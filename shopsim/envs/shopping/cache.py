"""Process-wide read caches of Shopping-v0, shared by every env copy in a process.

Keyed by the shared, read-only catalog / index objects. GRPO-style groups replay the same task several times, so
the same products and queries recur across copies; `clear` empties them (the benchmark measures cold searches).
"""

from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=16_384)
def row(catalog, pid: int) -> tuple[str, str]:
    return catalog.column("sku")[pid].as_py(), catalog.column("title")[pid].as_py()


@lru_cache(maxsize=4096)
def product(catalog, pid: int):
    return catalog.product(pid)


@lru_cache(maxsize=4096)
def search(index, query: str, k: int) -> tuple[int, ...]:
    return tuple(pid for pid, _ in index.search(query, k=k))


def clear() -> None:
    """Forget the process-wide product/search caches (benchmarks measure cold searches with it)."""
    for f in (row, product, search):
        f.cache_clear()


