"""Catalog and search benchmark: build time, cached reload, peak memory, index build, query latency.

    .venv/bin/python -m benchmarks.bench_catalog --quick     # 10k and 100k products
    .venv/bin/python -m benchmarks.bench_catalog             # adds 1M

Each catalog size runs in a fresh subprocess so that peak RSS (``ru_maxrss``) is that size's own. Targets:
100k build < 60 s, 1M < 10 min, cached reload of 1M < 10 s, 1M in memory < 2 GB, p50 query < 1 ms on
100k. Ratios are against references measured in the same run (the build time for the reload, tantivy for bm25s).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time

TARGETS = {100_000: 60.0, 1_000_000: 600.0}


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _queries(cat, n: int, seed: int = 0) -> list[str]:
    """Half full product titles, half short 'attribute + type' queries like an agent would type."""
    rng = random.Random(seed)
    ids = rng.sample(range(len(cat)), n)
    out = []
    for j, i in enumerate(ids):
        p = cat.product(i)
        out.append(p.title if j % 2 == 0 else f"{rng.choice(p.attributes)} {p.product_type}")
    return out


def _latency(index, queries: list[str]) -> dict:
    import numpy as np

    for q in queries[:50]:  # warm caches / mmaps
        index.search(q, k=10)
    lat = []
    for q in queries:
        t = time.perf_counter()
        index.search(q, k=10)
        lat.append(time.perf_counter() - t)
    lat = np.asarray(lat) * 1e3
    return {"p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99)),
            "mean_ms": float(lat.mean())}


def worker(size: int, seed: int, queries: int, backends: list[str]) -> dict:
    """One size in this (fresh) process: build, write, reload, index, query."""
    from shopsim.catalog import build_catalog, catalog_path, read_catalog
    from shopsim.catalog.search import open_index

    res: dict = {"size": size}
    t = time.perf_counter()
    cat = build_catalog(size, seed)
    res["build_s"] = time.perf_counter() - t
    res["rss_after_build_mb"] = _rss_mb()
    res["table_mb"] = cat.table.nbytes / 2**20
    t = time.perf_counter()
    path = cat.write_parquet(catalog_path(size, seed))
    res["write_s"] = time.perf_counter() - t
    res["file_mb"] = os.path.getsize(path) / 2**20
    del cat
    t = time.perf_counter()
    cat = read_catalog(path, size, seed)
    res["reload_s"] = time.perf_counter() - t
    res["peak_rss_catalog_mb"] = _rss_mb()
    qs = _queries(cat, min(queries, size)) if queries else []
    for b in backends:
        t = time.perf_counter()
        idx = open_index(cat, b, rebuild=True)
        res[f"{b}_index_s"] = time.perf_counter() - t
        if qs:
            res[f"{b}_query"] = _latency(idx, qs)
            res[f"{b}_hit10"] = _hit_rate(cat, idx)
        del idx
    res["peak_rss_mb"] = _rss_mb()
    return res


def _hit_rate(cat, index, n: int = 200) -> float:
    ids = random.Random(1).sample(range(len(cat)), n)
    return sum(i in [p for p, _ in index.search(cat.product(i).title, k=10)] for i in ids) / n


def _run_child(size: int, args, backends: list[str], cache: str) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.bench_catalog", "--worker", str(size), "--seed", str(args.seed),
           "--queries", str(args.queries), "--backends", ",".join(backends)]
    env = {**os.environ, "SHOPSIM_CACHE_DIR": cache}
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    from shopsim.catalog.search import backend_available

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="10k and 100k only")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--backends", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.seed, args.queries, [b for b in args.backends.split(",") if b])))
        return 0

    sizes = [10_000, 100_000] if args.quick else [10_000, 100_000, 1_000_000]
    backends = ["tantivy"] + (["bm25s"] if backend_available("bm25s") else [])
    print(f"shopsim catalog benchmark: sizes {sizes}, backends {backends}, CPUs {os.cpu_count()} "
          f"(load avg {os.getloadavg()[0]:.1f}: numbers include any contention)")
    results = []
    with tempfile.TemporaryDirectory(prefix="shopsim-bench-") as cache:
        for size in sizes:
            # bm25s at 1M is slow and memory hungry; compare backends at <= 100k, the size of the latency target
            r = _run_child(size, args, backends if size <= 100_000 else ["tantivy"], cache)
            results.append(r)
            target = TARGETS.get(size)
            print(f"\n{size:>9,} products: build {r['build_s']:.2f} s"
                  + (f" (target < {target:.0f} s: {'ok' if r['build_s'] < target else 'MISSED'})" if target else "")
                  + f", write {r['write_s']:.2f} s ({r['file_mb']:.0f} MB Parquet), "
                  f"cached reload {r['reload_s']:.2f} s ({r['build_s'] / max(r['reload_s'], 1e-9):.1f}x faster "
                  f"than building)")
            print(f"{'':>19}arrow table {r['table_mb']:.0f} MB; peak RSS {r['peak_rss_catalog_mb']:.0f} MB "
                  f"(build + reload), {r['peak_rss_mb']:.0f} MB with index")
            for b in backends:
                if f"{b}_index_s" not in r:
                    continue
                line = f"{'':>19}{b:<8} index build {r[f'{b}_index_s']:.2f} s"
                if f"{b}_query" in r:
                    q = r[f"{b}_query"]
                    line += (f"; query p50 {q['p50_ms']:.3f} ms, p99 {q['p99_ms']:.3f} ms "
                             f"({args.queries} queries); title hit@10 {r[f'{b}_hit10']:.0%}")
                print(line)
            if "bm25s_query" in r:
                t, s = r["tantivy_query"], r["bm25s_query"]
                print(f"{'':>19}bm25s / tantivy: index build {r['bm25s_index_s'] / r['tantivy_index_s']:.1f}x, "
                      f"p50 {s['p50_ms'] / t['p50_ms']:.2f}x, p99 {s['p99_ms'] / t['p99_ms']:.2f}x")
    big = next((r for r in results if r["size"] == 1_000_000), None)
    if big:
        ok = big["reload_s"] < 10 and big["peak_rss_catalog_mb"] < 2048
        print(f"\n1M: reload {big['reload_s']:.2f} s (target < 10 s), peak RSS {big['peak_rss_catalog_mb']:.0f} MB "
              f"(target < 2048 MB): {'ok' if ok else 'MISSED'}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
