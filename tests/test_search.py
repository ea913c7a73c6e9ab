"""Search index: relevance, never-raising query handling, deterministic ties and paging, cache and sharing."""

from __future__ import annotations

import json
import random

import pytest

from shopsim.catalog import build_catalog, clear_memo, load_catalog, search
from shopsim.catalog.search import SearchIndex, index_path, open_index, tokenize
from shopsim.errors import ConfigError

BACKENDS = ["tantivy", "bm25s"]  # bm25s is in the dev extra that `make test` installs

WEIRD = [
    "", " ", "\n\t", '"', "'", '"unbalanced', "((((", "]]]", "{x}", "a:b", "title:", ":", "AND", "OR NOT AND",
    "shoes AND", "NOT", "+", "-", "-shoes", "+shoes -boots", "shoes^2", "shoes~", "~2", "*", "sh*", "?", "\\",
    "/regex/", "field:[a TO b]", "IN [a b]", "price:>10", "🙂", "👟 running shoes 👟", "Crème brûlée ÜBER",
    "日本語の靴", "عربى", "\x00\x01\x02", "\u200b\u200d", "a" * 500, "x " * 500, "search[hiking boots]",
    "click[B0ABC12345]", '{"name": "search", "arguments": {"query": "shoes"}}', "null", "None", "$(rm -rf /)",
    "'; DROP TABLE products; --", "%s %d {0}", "ǅ ß ﬁ İ", "١٢٣ ۴۵۶", "x²", "½ cup",
]


@pytest.fixture(scope="module")
def cat():
    return load_catalog(3000, seed=0)  # cached under the test cache folder (tests/conftest.py)


@pytest.fixture(scope="module", params=BACKENDS)
def index(request, cat):
    return cat.index(request.param)


def test_protocol_and_sharing(cat, index):
    assert isinstance(index, SearchIndex) and len(index) == len(cat)
    assert cat.index(index.backend) is index  # one index per catalog and backend, shared in-process


def test_index_pickles(index):
    import pickle

    clone = pickle.loads(pickle.dumps(index))
    assert clone.search("organic green tea", k=5) == index.search("organic green tea", k=5)


def test_title_search_finds_the_product(cat, index):
    ids = random.Random(0).sample(range(len(cat)), 200)
    found = sum(i in [p for p, _ in index.search(cat.product(i).title, k=10)] for i in ids)
    assert found >= 0.9 * len(ids), f"{found}/200 titles found in the top 10"


def test_attribute_query_ranks_matching_products(cat, index):
    hits = index.search("waterproof hiking boots", k=10)
    assert len(hits) == 10
    for pid, _ in hits[:5]:
        p = cat.product(pid)
        assert p.product_type == "hiking boots" and "waterproof" in p.attributes


@pytest.mark.parametrize("query", WEIRD, ids=range(len(WEIRD)))
def test_weird_queries_never_raise(index, query, cat):
    hits = index.search(query, k=5)
    assert isinstance(hits, list) and len(hits) <= 5
    for pid, score in hits:
        assert isinstance(pid, int) and 0 <= pid < len(cat) and isinstance(score, float) and score > 0
    if not tokenize(query):
        assert hits == []


def test_random_unicode_fuzz_never_raises(index):
    rng = random.Random(1)
    for _ in range(300):
        q = "".join(chr(rng.choice([rng.randrange(32, 127), rng.randrange(0x80, 0x3000),
                                    rng.randrange(0x1F300, 0x1FAFF)])) for _ in range(rng.randrange(0, 40)))
        assert isinstance(index.search(q, k=3), list)
    assert index.search(None) == [] and index.search(123) == []  # type: ignore[arg-type]


def test_ties_are_broken_by_product_id_and_paging_is_consistent(index):
    hits = index.search("socks", k=40)
    assert len(hits) == 40
    assert hits == sorted(hits, key=lambda h: (-h[1], h[0]))
    assert len({s for _, s in hits}) < 40  # the query does produce ties, so the order above is exercised
    assert index.search("socks", k=40) == hits
    assert index.search("socks", k=10, offset=15) == hits[15:25]
    assert index.search("socks", k=0) == [] and index.search("socks", k=5, offset=10**6) == []
    everything = index.search("socks", k=10**12)  # k beyond the catalog: all matches, no giant allocation
    assert everything[:40] == hits and len(everything) <= len(index)
    with pytest.raises(ConfigError):
        index.search("socks", k=-1)


def test_backends_are_interchangeable(cat):
    assert {"tantivy", "bm25s"} == set(search.BACKENDS)
    with pytest.raises(ConfigError, match="choose one of"):
        cat.index("lucene")


def test_backend_from_env_var(cat, monkeypatch):
    monkeypatch.setenv("SHOPSIM_SEARCH_BACKEND", "tantivy")
    assert cat.index().backend == "tantivy"
    monkeypatch.setenv("SHOPSIM_SEARCH_BACKEND", "nope")
    with pytest.raises(ConfigError, match="SHOPSIM_SEARCH_BACKEND"):
        cat.index()


def test_index_is_cached_and_damaged_cache_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("SHOPSIM_CACHE_DIR", str(tmp_path))
    clear_memo()
    cat = build_catalog(600, seed=7)
    first = open_index(cat, "tantivy")
    expected = first.search("organic coffee beans", k=5)
    path = index_path(cat, "tantivy")
    assert path.is_dir() and not [p for p in path.parent.iterdir() if p.name.startswith(".")]

    def no_build(*a, **k):
        raise AssertionError("index should come from the cache")

    real_build = search.build_index
    monkeypatch.setattr(search, "build_index", no_build)
    assert open_index(cat, "tantivy").search("organic coffee beans", k=5) == expected
    # a manifest for another catalog, or a missing one, is rebuilt
    monkeypatch.setattr(search, "build_index", real_build)
    (path / "shopsim_index.json").write_text(json.dumps({"catalog": "other"}))
    assert open_index(cat, "tantivy").search("organic coffee beans", k=5) == expected
    (path / "shopsim_index.json").unlink()
    assert open_index(cat, "tantivy").search("organic coffee beans", k=5) == expected
    assert json.loads((path / "shopsim_index.json").read_text())["num_docs"] == 600
    clear_memo()


def test_interrupted_build_leaves_no_index(tmp_path, monkeypatch):
    monkeypatch.setenv("SHOPSIM_CACHE_DIR", str(tmp_path))
    cat = build_catalog(300, seed=8)

    def boom(catalog, path, **kw):
        (path / "half-written").write_text("x")
        raise KeyboardInterrupt

    monkeypatch.setattr(search.TantivyIndex, "build", classmethod(lambda cls, c, p, **kw: boom(c, p)))
    with pytest.raises(KeyboardInterrupt):
        open_index(cat, "tantivy")
    assert [p.name for p in (tmp_path / "index").iterdir() if not p.name.endswith(".lock")] == []


def test_document_text_of_slices_matches_rows(cat):
    # slices start mid-chunk: list offsets must be rebased, not reused
    for start in (0, 1234, 2990):
        docs = search.document_text(cat.table.slice(start, 10))
        for j in range(min(10, len(cat) - start)):
            p = cat.product(start + j)
            assert docs["options"][j].as_py() == "; ".join(
                f"{n}: {' '.join(v)}" for n, v in zip(p.option_names, p.option_values, strict=False))
            assert docs["attributes"][j].as_py() == ", ".join(p.attributes)
            assert docs["title"][j].as_py() == p.title


def test_unwritable_cache_gives_a_private_index(tmp_path, monkeypatch, caplog):
    cat = build_catalog(300, seed=9)
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    monkeypatch.setenv("SHOPSIM_CACHE_DIR", str(blocker / "cache"))
    idx = open_index(cat, "tantivy")
    assert len(idx) == 300 and "SHOPSIM_CACHE_DIR" in caplog.text
    assert idx.search(cat.product(5).title, k=10)[0][0] == 5


def test_concurrent_threads_share_one_catalog_and_index(tmp_path, monkeypatch):
    from concurrent.futures import ThreadPoolExecutor

    monkeypatch.setenv("SHOPSIM_CACHE_DIR", str(tmp_path))
    clear_memo()
    with ThreadPoolExecutor(4) as pool:
        cats = list(pool.map(lambda _: load_catalog(700, seed=11), range(4)))
        idxs = list(pool.map(lambda c: c.index(), cats))
    assert all(c is cats[0] for c in cats) and all(i is idxs[0] for i in idxs)
    clear_memo()


_CHILD = """
import json, sys
from shopsim.catalog import load_catalog
cat = load_catalog(700, seed=12)
print(json.dumps(cat.index().search("organic coffee beans", k=5)))
"""


@pytest.mark.slow
def test_concurrent_processes_build_once_and_agree(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "SHOPSIM_CACHE_DIR": str(tmp_path)}
    root = Path(__file__).resolve().parents[1]
    procs = [subprocess.Popen([sys.executable, "-c", _CHILD], cwd=root, env=env, stdout=subprocess.PIPE)
             for _ in range(3)]
    outs = [json.loads(p.communicate()[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs) and outs[0] and outs.count(outs[0]) == 3
    leftovers = [p.name for d in ("catalog", "index") for p in (tmp_path / d).iterdir() if ".tmp" in p.name]
    assert leftovers == [] and len([p for p in (tmp_path / "index").iterdir() if p.is_dir()]) == 1
