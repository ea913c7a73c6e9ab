"""Catalog: schema/contract, byte-identical determinism, disk cache + memo, corrupted cache, CLI bad input."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shopsim.app.cli import main as cli_main
from shopsim.catalog import (
    CATALOG_VERSION,
    Catalog,
    Product,
    build_catalog,
    catalog_path,
    clear_memo,
    core,
    load_catalog,
    load_taxonomy,
)
from shopsim.catalog.generate import SCHEMA
from shopsim.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cat() -> Catalog:
    return build_catalog(3000, seed=0)


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SHOPSIM_CACHE_DIR", str(tmp_path / "cache"))
    clear_memo()
    yield tmp_path / "cache"
    clear_memo()


def test_taxonomy_shape():
    tax = load_taxonomy()
    cats = tax["categories"]
    assert {"fashion", "beauty", "grocery", "home", "electronics"} <= set(cats)
    n_types = sum(len(c["types"]) for c in cats.values())
    assert 40 <= n_types <= 60
    for c in cats.values():
        assert len(c["brands"]) >= 5
        for t in c["types"].values():
            assert 6 <= len(t["attributes"]) <= 12
            assert t["options"] and all(isinstance(v, list) and len(v) >= 1 for v in t["options"].values())
            assert 0 < t["price"][0] <= t["price"][1]


def test_schema_and_row_contract(cat):
    t = cat.table
    assert t.schema.equals(SCHEMA)
    assert len(cat) == cat.size == 3000 and cat.seed == 0
    assert t.column("product_id").to_pylist() == list(range(3000))
    assert len(set(t.column("sku").to_pylist())) == 3000
    tax = cat.taxonomy["categories"]
    type_cat = {ty: c for c, cd in tax.items() for ty in cd["types"]}
    rating = t.column("rating").to_numpy()
    assert rating.min() >= 1.0 and rating.max() <= 5.0
    assert (t.column("num_reviews").to_numpy() >= 0).all() and (t.column("stock").to_numpy() >= 0).all()
    for row in t.slice(0, 500).to_pylist():
        spec = tax[row["category"]]["types"][row["product_type"]]
        assert type_cat[row["product_type"]] == row["category"]
        assert spec["price"][0] - 1 <= row["price"] <= spec["price"][1]
        assert 1 <= len(row["attributes"]) <= 4 and len(set(row["attributes"])) == len(row["attributes"])
        assert set(row["attributes"]) <= set(spec["attributes"])
        assert 1 <= len(row["option_names"]) <= 3 and len(row["option_names"]) == len(row["option_values"])
        for name, values in zip(row["option_names"], row["option_values"], strict=False):
            allowed = spec["options"][name]
            assert min(2, len(allowed)) <= len(values) <= 6 and set(values) <= set(allowed)
            assert values == sorted(values, key=allowed.index)  # taxonomy order (sizes small -> large)
        assert row["brand"] in row["title"] and row["attributes"][0].split()[0] in row["title"].lower()
        assert row["product_type"] in row["description"]


def test_brands_mix_taxonomy_and_seeded_names(cat):
    brands = cat.brands
    assert brands == sorted(set(cat.table.column("brand").to_pylist()))
    base = {b for c in cat.taxonomy["categories"].values() for b in c["brands"]}
    assert base & set(brands) and set(brands) - base  # both sources appear
    assert set(build_catalog(3000, seed=1).brands) - base != set(brands) - base  # Faker brands follow the seed


def test_arrays_and_codes(cat):
    assert cat.type_ids.dtype == np.int32 and cat.category_ids.dtype == np.int32
    types = cat.table.column("product_type").to_pylist()
    cats = cat.table.column("category").to_pylist()
    assert [cat.product_types[i] for i in cat.type_ids[:200]] == types[:200]
    assert [cat.categories[i] for i in cat.category_ids[:200]] == cats[:200]
    np.testing.assert_array_equal(cat.prices, cat.table.column("price").to_numpy())
    with pytest.raises(ValueError):
        cat.prices[0] = 1.0  # shared between env copies: read-only


def test_product_matches_row_and_pickles_by_reference(tmp_cache):
    cat = load_catalog(900, seed=1)
    for i in (0, 17, 899):
        assert dataclasses.asdict(cat.product(i)) == cat.table.slice(i, 1).to_pylist()[0]
    assert cat.taxonomy is cat.taxonomy  # shared, not re-parsed per call
    assert pickle.loads(pickle.dumps(cat)) is cat  # env copies pickled to the same process share it


def test_product_and_sku_lookup(cat):
    p = cat.product(17)
    assert isinstance(p, Product) and p.product_id == 17
    assert p.title == cat.table.column("title")[17].as_py()
    assert p.options == dict(zip(p.option_names, p.option_values, strict=False))
    skus = cat.table.column("sku").to_pylist()
    assert all(cat.sku_to_id(s) == i for i, s in enumerate(skus))
    bigger = build_catalog(3100, seed=0)
    outside = bigger.table.column("sku")[3050].as_py()
    assert cat.sku_to_id(outside) is None  # a valid-looking SKU beyond this catalog
    for bad in ["", "B0", "B0!!!!!!!!", "X0ABCDEFGH", "b0abcdefgh1", None, 42]:
        assert cat.sku_to_id(bad) is None
    with pytest.raises(IndexError):
        cat.product(3000)


def _sha(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_parquet_byte_identical_and_no_timestamps(cat, tmp_path):
    a = cat.write_parquet(tmp_path / "a.parquet")
    b = build_catalog(3000, seed=0).write_parquet(tmp_path / "b.parquet")
    assert a.read_bytes() == b.read_bytes()
    meta = pq.read_metadata(a)
    keys = set((meta.metadata or {}).keys())
    assert b"shopsim.catalog" in keys and not any(b"time" in k or b"date" in k for k in keys)


@pytest.mark.slow
def test_parquet_byte_identical_across_processes(cat, tmp_path):
    a = cat.write_parquet(tmp_path / "a.parquet")
    # a fresh interpreter with another hash seed writes the same bytes
    code = ("import sys; from shopsim.catalog import build_catalog; "
            "build_catalog(3000, seed=0).write_parquet(sys.argv[1])")
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "c.parquet")], check=True, cwd=ROOT, env=env)
    assert _sha(tmp_path / "c.parquet") == _sha(a)


def test_seed_and_size(cat):
    other = build_catalog(3000, seed=1)
    assert other.table.column("title").to_pylist() != cat.table.column("title").to_pylist()
    assert other.table.column("sku").to_pylist() != cat.table.column("sku").to_pylist()
    small = build_catalog(1000, seed=0)
    assert small.table.equals(cat.table.slice(0, 1000))  # a smaller catalog is a prefix of a larger one


@pytest.mark.parametrize("size, seed", [(0, 0), (-3, 0), (1.5, 0), (True, 0), ("10", 0), (10, -1), (5_000_000, 0)])
def test_bad_arguments(size, seed):
    with pytest.raises(ConfigError, match="catalog s"):
        build_catalog(size, seed)


def test_load_catalog_caches_and_memoises(tmp_cache, monkeypatch):
    cat = load_catalog(1500, seed=2)
    path = catalog_path(1500, 2)
    assert cat.path == path and path.exists() and path.parent == tmp_cache / "catalog"
    assert load_catalog(1500, seed=2) is cat  # memoised: env copies share one object
    assert not [p for p in path.parent.iterdir() if ".tmp" in p.name]  # no temp files left behind
    clear_memo()

    def no_build(*a, **k):
        raise AssertionError("should have been read from the cache")

    monkeypatch.setattr(core, "build_catalog", no_build)
    t0 = time.perf_counter()
    again = load_catalog(1500, seed=2)
    assert time.perf_counter() - t0 < 5
    assert again is not cat and again.table.equals(cat.table)


@pytest.mark.parametrize("damage", ["truncate", "garbage", "other_seed", "empty"])
def test_damaged_cache_is_rebuilt(tmp_cache, damage):
    good = build_catalog(1200, seed=4)
    path = catalog_path(1200, 4)
    reference = good.write_parquet(tmp_cache / "ref.parquet").read_bytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    if damage == "truncate":
        path.write_bytes(reference[: len(reference) // 2])
    elif damage == "garbage":
        path.write_bytes(b"PAR1" + os.urandom(2000))
    elif damage == "other_seed":
        build_catalog(1200, seed=5).write_parquet(path)
    else:
        path.write_bytes(b"")
    cat = load_catalog(1200, seed=4)
    assert cat.table.equals(good.table)
    assert path.read_bytes() == reference  # the cache was rewritten with the right catalog


def test_interrupted_write_leaves_no_file(tmp_path, cat, monkeypatch):
    def boom(table, where, **kw):
        Path(where).write_bytes(b"PAR1 partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(core.pq, "write_table", boom)
    with pytest.raises(KeyboardInterrupt):
        cat.write_parquet(tmp_path / "x.parquet")
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------------------------------ CLI
@pytest.mark.parametrize("argv, msg", [
    (["catalog", "build", "--size", "0"], "at least 1"),
    (["catalog", "build", "--size", "-4"], "at least 1"),
    (["catalog", "build", "--size", "ten"], "whole number"),
    (["catalog", "build", "--seed", "-1"], "0 or more"),
])
def test_cli_bad_argparse_input(argv, msg, capsys):
    with pytest.raises(SystemExit) as exc:
        cli_main(argv)
    assert exc.value.code == 2
    assert msg in capsys.readouterr().err


def test_cli_unwritable_out_and_bad_file(tmp_path, capsys):
    blocker = tmp_path / "file.txt"
    blocker.write_text("x")
    assert cli_main(["catalog", "build", "--size", "50", "--out", str(blocker / "sub")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("shopsim catalog: error:") and "writable" in err and "\n" not in err
    assert cli_main(["catalog", "build", "--size", "9000000"]) == 2
    assert "1..4,000,000" in capsys.readouterr().err
    assert cli_main(["catalog", "info", "--file", str(blocker)]) == 2
    assert "not a readable shopsim catalog" in capsys.readouterr().err
    assert cli_main(["catalog", "build", "--size", "50", "--backend", "lucene"]) == 2
    assert "tantivy" in capsys.readouterr().err


def test_cli_build_and_info(tmp_cache, tmp_path, capsys):
    out = tmp_path / "out"
    assert cli_main(["catalog", "build", "--size", "800", "--seed", "3", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "800 products" in text and "search index (tantivy): 800 documents" in text
    written = out / f"size800_seed3_v{CATALOG_VERSION}.parquet"
    assert pq.read_table(written).num_rows == 800
    assert written.read_bytes() == build_catalog(800, 3).write_parquet(tmp_path / "r.parquet").read_bytes()
    assert cli_main(["catalog", "info", "--file", str(written)]) == 0
    info = capsys.readouterr().out
    assert "6 categories, 52 product types" in info and "fashion" in info and "price: min" in info


@pytest.mark.slow
def test_100k_build_within_budget(tmp_path):
    t0 = time.perf_counter()
    cat = build_catalog(100_000, seed=0)
    assert time.perf_counter() - t0 < 60
    assert len(cat) == 100_000 and pa.compute.count_distinct(cat.table.column("sku")).as_py() == 100_000


def test_unwritable_cache_still_gives_a_catalog(tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    monkeypatch.setenv("SHOPSIM_CACHE_DIR", str(blocker / "cache"))
    clear_memo()
    cat = load_catalog(300, seed=0)
    assert len(cat) == 300 and cat.path is None and "SHOPSIM_CACHE_DIR" in caplog.text
    assert cat.table.equals(build_catalog(300, seed=0).table)
    clear_memo()


def test_cache_from_other_library_versions_is_rebuilt(tmp_cache, monkeypatch):
    cat = load_catalog(400, seed=6)
    clear_memo()
    monkeypatch.setattr(core, "_generator_versions", lambda: {"numpy": "0.0", "faker": "0.0"})
    with pytest.raises(ValueError, match="mismatch"):
        core.read_catalog(cat.path, 400, 6)
    again = load_catalog(400, seed=6)  # rebuilt and rewritten with the current versions' metadata
    assert again.table.equals(cat.table) and core.read_catalog(again.path, 400, 6).size == 400
