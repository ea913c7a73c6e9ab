"""Vectorised catalog generation: numpy draws + Arrow string kernels, no per-product Python.

A seeded `Faker` produces only small vocabularies once per catalog (extra brand names per category, product-line
names, filler sentences); every product is then a handful of integer draws that index those vocabularies and the
taxonomy tables. Products are generated in fixed-size chunks, each from its own `SeedSequence([seed, chunk])`
stream drawn at full chunk length, so memory stays bounded for 1M products and row i depends only on (i, seed,
taxonomy, version): a catalog of size N is the first N rows of any larger catalog with the same seed.

SKUs are an affine bijection of the product id modulo 36**8 (``a*id + b``, ``a`` a unit), written in base 36 after a
"B0" prefix like Amazon ASINs: unique by construction, and `sku_id` inverts them without a lookup table.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shopsim.catalog.taxonomy import TaxonomyTables

CHUNK = 8_192  # products per independent RNG stream (a catalog is a prefix of any larger one)
ROW_GROUP = 131_072
SKU_MOD = 36**8
_B36 = np.frombuffer(b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ", dtype=np.uint8)
_B36_POW = 36 ** np.arange(7, -1, -1, dtype=np.uint64)
N_EXTRA_BRANDS = 16  # Faker-made brands per category, on top of the taxonomy's own
N_LINES = 384  # product-line names ("Aurora"): make titles of same brand/type/attributes distinct
N_SENTENCES = 512

SCHEMA = pa.schema([
    ("product_id", pa.int64()), ("sku", pa.string()), ("category", pa.string()), ("product_type", pa.string()),
    ("brand", pa.string()), ("title", pa.string()), ("description", pa.string()), ("price", pa.float64()),
    ("rating", pa.float32()), ("num_reviews", pa.int32()), ("stock", pa.int32()),
    ("attributes", pa.list_(pa.string())), ("option_names", pa.list_(pa.string())),
    ("option_values", pa.list_(pa.list_(pa.string()))),
])


def sku_params(seed: int) -> tuple[int, int]:
    """(a, b) of the SKU bijection for this seed; a is coprime with 36**8 (odd, not a multiple of 3)."""
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0x5C0]))
    a = int(rng.integers(SKU_MOD // 3, SKU_MOD - 1))
    while a % 2 == 0 or a % 3 == 0:
        a += 1
    return a, int(rng.integers(0, SKU_MOD))


def sku_to_number(sku: str) -> int | None:
    if len(sku) != 10 or not sku.startswith("B0"):
        return None
    try:
        return int(sku[2:], 36)
    except ValueError:
        return None


class Vocab:
    """Per-seed vocabularies drawn once from a seeded Faker (a few hundred strings)."""

    def __init__(self, tt: TaxonomyTables, seed: int):
        from faker import Faker

        fake = Faker("en_US")
        fake.seed_instance(int(seed))
        suffixes = ["", " Co", " & Sons", " Works", " Supply", " Studio", " Labs", " Goods"]
        self.brands: list[str] = []  # category c owns brands c*B : (c+1)*B
        for base in tt.base_brands:
            extra = [fake.unique.last_name() + fake.random_element(suffixes) for _ in range(N_EXTRA_BRANDS)]
            self.brands.extend((base + extra)[: self.brands_per_category(tt)])
        self.lines = [fake.unique.first_name() for _ in range(N_LINES)]
        self.sentences = [fake.sentence(nb_words=7) for _ in range(N_SENTENCES)]

    @staticmethod
    def brands_per_category(tt: TaxonomyTables) -> int:
        return min(len(b) for b in tt.base_brands) + N_EXTRA_BRANDS


def _choose(rng: np.random.Generator, counts: np.ndarray, width: int, k: np.ndarray, sort: bool) -> np.ndarray:
    """For each row, k[i] distinct local indices in [0, counts[i]) (k <= counts); -1 pads to `width` columns.

    Random keys + argsort is a vectorised sample without replacement; `sort` keeps taxonomy order (sizes stay
    ordered small -> large)."""
    kmax = int(k.max()) if len(k) else 0
    keys = rng.random((len(counts), width), dtype=np.float32)
    keys[np.arange(width)[None, :] >= counts[:, None]] = 2.0  # never pick past the row's vocabulary
    picked = np.argsort(keys, axis=1, kind="stable")[:, :kmax].astype(np.int32)
    valid = np.arange(kmax)[None, :] < k[:, None]
    if sort:
        picked = np.sort(np.where(valid, picked, np.iinfo(np.int32).max), axis=1)
        valid = np.arange(kmax)[None, :] < k[:, None]
    return np.where(valid, picked, -1)


def _list_array(flat: pa.Array, lengths: np.ndarray) -> pa.ListArray:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), flat)


def generate_chunk(tt: TaxonomyTables, vocab: Vocab, seed: int, chunk: int, start: int, n: int,
                   sku_ab: tuple[int, int]) -> pa.RecordBatch:
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), int(chunk)]))
    T = len(tt.types)
    t = rng.integers(0, T, n).astype(np.int32)
    c = tt.type_category[t]
    B = Vocab.brands_per_category(tt)
    brand = c * B + rng.integers(0, B, n).astype(np.int32)
    line = rng.integers(0, len(vocab.lines), n)

    # attributes: 1-4 distinct per product, random order (the first ones go into the title)
    n_attr = np.minimum(rng.integers(1, 5, n), tt.attr_cnt[t])
    loc = _choose(rng, tt.attr_cnt[t], tt.max_attrs, n_attr, sort=False)
    attr_ids = (tt.attr_off[t][:, None] + loc)[loc >= 0]
    # option dimensions: 1-3 of the type's, in taxonomy order, each with 2-6 of its values in taxonomy order
    n_dim = np.minimum(rng.integers(1, 4, n), tt.dim_cnt[t])
    dloc = _choose(rng, tt.dim_cnt[t], tt.max_dims, n_dim, sort=True)
    dims = (tt.dim_off[t][:, None] + dloc)[dloc >= 0]
    n_val = np.minimum(rng.integers(2, 7, len(dims)), tt.val_cnt[dims])
    vloc = _choose(rng, tt.val_cnt[dims], tt.max_values, n_val, sort=True)
    val_ids = (tt.val_off[dims][:, None] + vloc)[vloc >= 0]

    # log-uniform price inside the type's range, ending in .99
    u = rng.random(n)
    lo, hi = tt.price_lo[t], tt.price_hi[t]
    price = np.round(np.maximum(np.floor(np.exp(np.log(lo) + u * (np.log(hi) - np.log(lo)))), 1.0) - 0.01, 2)
    rating = (np.round(1.0 + 4.0 * rng.beta(5.0, 1.6, n), 1)).astype(np.float32)
    num_reviews = np.minimum(np.floor(np.exp(rng.normal(3.5, 1.6, n))), 250_000).astype(np.int32)
    stock = np.where(rng.random(n) < 0.08, 0, rng.integers(1, 1000, n)).astype(np.int32)
    blurb = tt.blurb_off[c] + (rng.integers(0, 1 << 30, n) % tt.blurb_cnt[c]).astype(np.int32)
    sentence = rng.integers(0, len(vocab.sentences), n)

    pid = np.arange(start, start + n, dtype=np.int64)
    a, b = sku_ab
    num = (pid.astype(np.uint64) * np.uint64(a) + np.uint64(b)) % np.uint64(SKU_MOD)
    chars = np.empty((n, 10), dtype=np.uint8)
    chars[:, 0], chars[:, 1] = ord("B"), ord("0")
    chars[:, 2:] = _B36[((num[:, None] // _B36_POW[None, :]) % np.uint64(36)).astype(np.intp)]
    sku = pa.array(chars.view("S10").ravel(), type=pa.binary()).cast(pa.string())

    def s(words):
        return pa.array(words, type=pa.string())
    brand_s = s(vocab.brands).take(brand)
    type_s = s(tt.types).take(t)
    attrs = _list_array(s(tt.attr_vocab).take(attr_ids), n_attr)
    attr_title = s(tt.titled(tt.attr_vocab)).take(attr_ids)
    # title: "Brand Line Attr1 Attr2 Attr3 Type" (up to three attributes)
    first = np.zeros(n, dtype=np.int64)
    np.cumsum(n_attr[:-1], out=first[1:])
    pieces = [brand_s, s(vocab.lines).take(line)]
    for j in range(3):
        idx = pa.array(np.where(n_attr > j, first + j, -1), mask=n_attr <= j)
        pieces.append(attr_title.take(idx))
    pieces.append(s(tt.titled(tt.types)).take(t))
    title = pc.binary_join_element_wise(*pieces, " ", null_handling="skip")
    # description: "Brand type: attr, attr. Blurb Sentence" — short so 1M products stay small
    description = pc.binary_join_element_wise(
        brand_s, " ", type_s, ": ", pc.binary_join(attrs, ", "), ". ", s(tt.blurbs).take(blurb), " ",
        s(vocab.sentences).take(sentence), "", null_handling="skip")
    option_names = _list_array(s(tt.dim_names).take(dims), n_dim)
    option_values = _list_array(_list_array(s(tt.value_vocab).take(val_ids), n_val), n_dim)
    cols = [pa.array(pid), sku, s(tt.categories).take(c), type_s, brand_s, title, description,
            pa.array(price), pa.array(rating), pa.array(num_reviews), pa.array(stock),
            attrs, option_names, option_values]
    return pa.RecordBatch.from_arrays(cols, schema=SCHEMA)


def generate_table(tt: TaxonomyTables, size: int, seed: int) -> pa.Table:
    vocab = Vocab(tt, seed)
    ab = sku_params(seed)
    # every chunk is drawn at full length and the last one cut, so row i never depends on `size`
    batches = [generate_chunk(tt, vocab, seed, i, start, CHUNK, ab).slice(0, min(CHUNK, size - start))
               for i, start in enumerate(range(0, size, CHUNK))]
    return pa.Table.from_batches(batches, schema=SCHEMA)
