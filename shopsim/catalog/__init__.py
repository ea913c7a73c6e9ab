"""Seeded product catalog generated from `data/taxonomy.json` (+ a seeded Faker for small vocabularies).

    from shopsim.catalog import load_catalog
    cat = load_catalog(size=10_000, seed=0)   # cached on disk, memoised per process
    cat.product(3).title; cat.index().search("waterproof hiking boots", k=5)

See `shopsim.catalog.core` for the cache layout and `shopsim.catalog.generate` for how products are drawn.
"""

from shopsim.catalog.core import (
    CATALOG_VERSION,
    Catalog,
    Product,
    build_catalog,
    catalog_path,
    clear_memo,
    load_catalog,
    read_catalog,
)
from shopsim.catalog.taxonomy import load_taxonomy

__all__ = ["CATALOG_VERSION", "Catalog", "Product", "build_catalog", "catalog_path", "clear_memo", "load_catalog",
           "load_taxonomy", "read_catalog"]
