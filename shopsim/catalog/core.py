"""`Catalog`: one seeded, read-only product table shared by every env copy in a process.

`build_catalog(size, seed)` generates it in memory (see `shopsim.catalog.generate`); `load_catalog(size, seed)`
returns the process-wide copy: memoised in-process (same (size, seed) -> same object), else read from the Parquet
cache ``cache_dir()/catalog/size{N}_seed{S}_v{VERSION}.parquet``, else built and written there atomically (temp
name + `os.replace`). A cache file that cannot be read, is truncated, or was made by another version or taxonomy is
rebuilt, never trusted. The Parquet bytes depend only on (size, seed, taxonomy, `CATALOG_VERSION`): no timestamps.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from shopsim.catalog import generate
from shopsim.catalog.search import SearchIndex, open_index, resolve_backend
from shopsim.catalog.taxonomy import load_taxonomy, tables, taxonomy_hash
from shopsim.errors import ConfigError
from shopsim.paths import atomic_write, cache_dir, interprocess_lock

log = logging.getLogger(__name__)

#: bump when generation changes the bytes of a catalog for the same (size, seed, taxonomy)
CATALOG_VERSION = 2
MAX_SIZE = 4_000_000  # SKU arithmetic stays inside uint64 up to 2**22 products
_META_KEY = b"shopsim.catalog"
_DICT_COLUMNS = ["category", "product_type", "brand", "attributes", "option_names", "option_values"]


@dataclass(frozen=True)
class Product:
    """One catalog row as Python values (`Catalog.product(i)`)."""

    product_id: int
    sku: str
    category: str
    product_type: str
    brand: str
    title: str
    description: str
    price: float
    rating: float
    num_reviews: int
    stock: int
    attributes: list[str]
    option_names: list[str]
    option_values: list[list[str]]

    @property
    def options(self) -> dict[str, list[str]]:
        return dict(zip(self.option_names, self.option_values, strict=False))


def _check_args(size, seed) -> tuple[int, int]:
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or not 1 <= size <= MAX_SIZE:
        raise ConfigError(f"catalog size must be a whole number in 1..{MAX_SIZE:,}, got {size!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ConfigError(f"catalog seed must be a non-negative whole number, got {seed!r}")
    return int(size), int(seed)


class Catalog:
    """A read-only product table (`table`, a `pyarrow.Table`) plus array views and the search index.

    Columns: product_id int64 (0..n-1), sku, category, product_type, brand, title, description (str), price
    float64, rating float32 (1..5), num_reviews int32, stock int32, attributes list<str>, option_names list<str>,
    option_values list<list<str>> (one value list per option name).
    """

    def __init__(self, table: pa.Table, size: int, seed: int, path: Path | None = None):
        # Columns stay chunked (one chunk per Parquet batch): combining would copy ~400 MB at 1M products for
        # nothing, since ChunkedArray scalar access is a binary search over a handful of chunks.
        self.table = table
        self.size, self.seed, self.path = size, seed, path
        tt = tables()
        self.categories: list[str] = list(tt.categories)
        self.product_types: list[str] = list(tt.types)
        self.type_ids = self._codes("product_type", self.product_types)
        self.category_ids = tt.type_category[self.type_ids]
        self._cols = {name: self.table.column(name) for name in self.table.column_names}
        self.prices: np.ndarray = self._cols["price"].to_numpy()
        self._rating = self._cols["rating"].to_numpy()
        self._num_reviews = self._cols["num_reviews"].to_numpy()
        self._stock = self._cols["stock"].to_numpy()
        for arr in (self.type_ids, self.category_ids, self.prices, self._rating, self._num_reviews, self._stock):
            arr.flags.writeable = False  # shared by every env copy in the process
        self._sku_ab = generate.sku_params(seed)
        self._sku_a_inv = pow(self._sku_ab[0], -1, generate.SKU_MOD)
        self._indexes: dict[str, SearchIndex] = {}
        self._taxonomy: dict | None = None
        self._brands: list[str] | None = None
        self._lock = threading.Lock()

    def _codes(self, column: str, values: list[str]) -> np.ndarray:
        codes = pc.index_in(self.table.column(column), value_set=pa.array(values))
        if codes.null_count:
            raise ConfigError(f"catalog column {column!r} has values outside the taxonomy; rebuild the catalog")
        return codes.to_numpy().astype(np.int32)

    def __len__(self) -> int:
        return self.table.num_rows

    def __repr__(self) -> str:
        return f"Catalog(size={self.size}, seed={self.seed}, path={str(self.path) if self.path else None!r})"

    @property
    def taxonomy(self) -> dict:
        """The parsed `data/taxonomy.json` (option sets expanded): categories -> types -> price, attributes,
        options; plus brands/blurbs per category. One dict shared by everyone using this catalog: do not mutate."""
        if self._taxonomy is None:
            self._taxonomy = load_taxonomy()
        return self._taxonomy

    @property
    def brands(self) -> list[str]:
        """Sorted brand names present in this catalog (the taxonomy's plus the seeded Faker ones)."""
        if self._brands is None:
            self._brands = sorted(pc.unique(self.table.column("brand")).to_pylist())
        return self._brands

    def product(self, i: int) -> Product:
        """Row `i` as Python values (about 40 us: column-wise scalar reads, numbers from the numpy views)."""
        i = int(i)
        if not 0 <= i < len(self):
            raise IndexError(f"product id {i} out of range 0..{len(self) - 1}")
        c = self._cols
        return Product(
            product_id=i, sku=c["sku"][i].as_py(), category=self.categories[self.category_ids[i]],
            product_type=self.product_types[self.type_ids[i]], brand=c["brand"][i].as_py(),
            title=c["title"][i].as_py(), description=c["description"][i].as_py(), price=float(self.prices[i]),
            rating=float(self._rating[i]), num_reviews=int(self._num_reviews[i]), stock=int(self._stock[i]),
            attributes=c["attributes"][i].as_py(), option_names=c["option_names"][i].as_py(),
            option_values=c["option_values"][i].as_py(),
        )

    def column(self, name: str) -> pa.ChunkedArray:
        return self._cols[name]

    def sku_to_id(self, sku: str) -> int | None:
        """Product id of `sku`, or None: inverts the SKU bijection arithmetically (no 1M-entry dict)."""
        num = generate.sku_to_number(sku) if isinstance(sku, str) else None
        if num is None:
            return None
        pid = ((num - self._sku_ab[1]) * self._sku_a_inv) % generate.SKU_MOD
        return pid if pid < len(self) else None

    def index(self, backend: str | None = None) -> SearchIndex:
        """The BM25 search index over this catalog (built once, cached on disk, shared in-process)."""
        name = resolve_backend(backend)
        with self._lock:
            if name not in self._indexes:
                self._indexes[name] = open_index(self, name)
            return self._indexes[name]

    def __reduce__(self):
        # pickled by reference: the other process loads (or memo-hits) the same deterministic catalog
        return (_load_for_pickle, (self.size, self.seed))

    def cache_key(self) -> str:
        return f"size{self.size}_seed{self.seed}_v{CATALOG_VERSION}_{taxonomy_hash()}"

    def write_parquet(self, path: str | os.PathLike) -> Path:
        """Write the catalog atomically (temp name + rename); same (size, seed) -> byte-identical file."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        meta = json.dumps({"size": self.size, "seed": self.seed, "version": CATALOG_VERSION,
                           "taxonomy": taxonomy_hash(), "generator": _generator_versions()},
                          sort_keys=True).encode()
        table = self.table.replace_schema_metadata({_META_KEY: meta})
        with atomic_write(path) as tmp:
            # dictionary pages only where values repeat (titles/descriptions/SKUs are ~unique: plain reads faster)
            pq.write_table(table, tmp, compression="zstd", row_group_size=generate.ROW_GROUP,
                           use_dictionary=_DICT_COLUMNS, write_statistics=False)
        return path


def _generator_versions() -> dict:
    """Libraries whose output streams shape the bytes: a cache made under other versions is rebuilt."""
    import faker

    return {"numpy": np.__version__, "faker": faker.VERSION}


def build_catalog(size: int, seed: int = 0) -> Catalog:
    """Generate a catalog in memory (no cache): 1 to 4M products, deterministic in (size, seed)."""
    size, seed = _check_args(size, seed)
    return Catalog(generate.generate_table(tables(), size, seed), size, seed)


def catalog_path(size: int, seed: int) -> Path:
    return cache_dir() / "catalog" / f"size{size}_seed{seed}_v{CATALOG_VERSION}.parquet"


def read_catalog(path: str | os.PathLike, size: int | None = None, seed: int | None = None) -> Catalog:
    """Read a catalog Parquet file, checking its metadata; raises on anything unexpected."""
    path = Path(path)
    table = pq.read_table(path)
    meta = json.loads((table.schema.metadata or {}).get(_META_KEY, b"{}"))
    expect = {"version": CATALOG_VERSION, "taxonomy": taxonomy_hash(), "generator": _generator_versions()}
    if size is not None:
        expect["size"] = size
    if seed is not None:
        expect["seed"] = seed
    bad = {k: (meta.get(k), v) for k, v in expect.items() if meta.get(k) != v}
    if bad or table.num_rows != meta.get("size") or not table.schema.remove_metadata().equals(generate.SCHEMA):
        raise ValueError(f"{path}: not a catalog for {expect} (mismatch: {bad or 'rows/schema'})")
    return Catalog(table.replace_schema_metadata(None), meta["size"], meta["seed"], path=path)


_MEMO: dict[tuple, Catalog] = {}
_MEMO_LOCK = threading.Lock()


def load_catalog(size: int = 10_000, seed: int = 0, *, cache: bool = True) -> Catalog:
    """The process-wide catalog for (size, seed): memoised, else read from the Parquet cache, else built+cached.

    A cached file that fails to read or validate (truncated, corrupted, other version/taxonomy) is rebuilt.
    `cache=False` skips the disk cache (still memoised).
    """
    size, seed = _check_args(size, seed)
    path = None
    if cache:
        try:
            path = catalog_path(size, seed)
        except OSError as exc:  # e.g. SHOPSIM_CACHE_DIR not writable: still usable, just not cached
            log.warning("catalog cache unusable (%s); building in memory. Set SHOPSIM_CACHE_DIR to a writable "
                        "folder to cache it", exc)
    key = (size, seed, str(path) if path else None)
    with _MEMO_LOCK:
        if key in _MEMO:
            return _MEMO[key]
        _MEMO[key] = cat = _load_or_build(size, seed, path)
        return cat


def _load_or_build(size: int, seed: int, path: Path | None) -> Catalog:
    if path is None:
        return build_catalog(size, seed)
    cat = None
    try:
        with interprocess_lock(path.with_name(path.name + ".lock")):
            if path.exists():
                try:
                    cat = read_catalog(path, size, seed)
                except Exception as exc:  # noqa: BLE001 - any unreadable cache is rebuilt
                    log.warning("rebuilding catalog cache %s: %s", path, exc)
            if cat is None:
                cat = build_catalog(size, seed)
                cat.path = cat.write_parquet(path)
    except OSError as exc:
        log.warning("could not cache catalog at %s (%s); using it from memory", path, exc)
        cat = cat or build_catalog(size, seed)
    return cat


def _load_for_pickle(size: int, seed: int) -> Catalog:
    return load_catalog(size, seed)


def clear_memo() -> None:
    """Forget the in-process catalogs (tests; the disk cache is kept)."""
    with _MEMO_LOCK:
        _MEMO.clear()
