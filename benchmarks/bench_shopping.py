"""Shopping-v0 benchmark: env steps/s with the expert's action mix, reset time, memory of 16 copies vs one.

    .venv/bin/python -m benchmarks.bench_shopping --quick     # 100k catalog, fewer episodes
    .venv/bin/python -m benchmarks.bench_shopping             # 100k catalog, more episodes

Steps/s counts env time only (wall clock, and per CPU-second of this process, which a busy machine distorts
less): the expert's actions are recorded first, then replayed against fresh resets (same
seeds and tasks, so the same episodes) while only `reset`/`step` are timed. Issue 3 targets: at least 2,000
steps/s on a 100k-product catalog, and 16 vector copies in one process costing close to one catalog, not 16.
References measured in the same run: a bare `SearchIndex.search` call (the floor of a search step) and the memory
of the catalog + index themselves. Memory runs in fresh subprocesses so that each figure is its own.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

FAMILIES = ("find_and_buy", "clarify_and_buy", "bundle", "after_sales")


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def record(env, episodes: int) -> list[tuple[dict, list[str]]]:
    from agents.shopping_expert import ShoppingExpert

    expert = ShoppingExpert(env_id="shopsim/Shopping-v0")
    expert.reset(1, 0)
    out = []
    for i in range(episodes):
        opts = {"family": FAMILIES[i % 4], "task_id": i, "split": "train"}
        obs, info = env.reset(seed=i, options=opts)
        expert.begin_episode(0, obs, info)
        actions = []
        while True:
            a = expert.act_one(0, obs, info)
            actions.append(a)
            obs, _r, term, trunc, info = env.step(a)
            if term or trunc:
                break
        out.append((dict(opts, seed=i), actions))
    return out


def speed(size: int, episodes: int) -> dict:
    from shopsim.envs.shopping import ShoppingEnv

    t0 = time.perf_counter()
    env = ShoppingEnv(catalog_size=size)
    load_s = time.perf_counter() - t0
    plan = record(env, episodes)
    cold = replay(env, plan, clear=True)
    warm = replay(env, plan, clear=False)
    index = env.index
    queries = [a[7:-1] for _, acts in plan for a in acts if a.startswith("search[")]
    t = time.perf_counter()
    for q in queries:
        index.search(q, k=env.max_results)
    search_s = (time.perf_counter() - t) / max(1, len(queries))
    return {"catalog_size": size, "episodes": episodes, "env_construct_s": load_s, "cold": cold, "warm": warm,
            "bare_search_ms": 1e3 * search_s, "search_share_of_steps": len(queries) / cold["steps"]}


def replay(env, plan, clear: bool) -> dict:
    """Time reset/step only, replaying recorded actions. `clear`: empty the shared caches first (cold searches);
    otherwise every query and product is already cached (what GRPO groups replaying one task see)."""
    from shopsim.envs.shopping import cache

    if clear:
        cache.clear()
    reset_t, step_t, step_cpu, steps = 0.0, 0.0, 0.0, 0
    per_family = {f: [0.0, 0] for f in FAMILIES}
    for opts, actions in plan:
        opts = dict(opts)
        seed = opts.pop("seed")
        t = time.perf_counter()
        env.reset(seed=seed, options=opts)
        reset_t += time.perf_counter() - t
        t, c = time.perf_counter(), time.process_time()
        for a in actions:
            env.step(a)
        dt = time.perf_counter() - t
        step_cpu += time.process_time() - c  # CPU time of this process: less distorted by a busy machine
        step_t += dt
        steps += len(actions)
        per_family[opts["family"]][0] += dt
        per_family[opts["family"]][1] += len(actions)
    return {"steps": steps, "steps_per_s": steps / step_t, "reset_ms": 1e3 * reset_t / len(plan),
            "steps_per_cpu_s": steps / max(1e-9, step_cpu),
            "step_ms": 1e3 * step_t / steps,
            "steps_per_s_by_family": {f: n / s for f, (s, n) in per_family.items() if n}}


def memory(size: int, copies: int) -> dict:
    """RSS after imports, after the catalog + index, and after `copies` envs each stepped through an episode."""
    import gymnasium as gym

    import shopsim  # noqa: F401
    from shopsim.catalog import load_catalog

    base = _rss_mb()
    cat = load_catalog(size, 0)
    cat.index().search("warm up", k=10)
    after_catalog = _rss_mb()
    envs = [gym.make("shopsim/Shopping-v0", catalog_size=size).unwrapped for _ in range(copies)]
    for i, env in enumerate(envs):
        env.reset(seed=i, options={"family": FAMILIES[i % 4]})
        for a in ("search[waterproof boots]", "click[next >]", "list_orders", "view_cart"):
            env.step(a)
    shared = all(e.catalog is cat for e in envs)
    return {"copies": copies, "base_mb": base, "catalog_mb": after_catalog - base,
            "envs_mb": _rss_mb() - after_catalog, "total_mb": _rss_mb(), "catalog_shared": shared}


def _sub(fn: str, *args) -> dict:
    code = f"import json, benchmarks.bench_shopping as b; print(json.dumps(b.{fn}{args!r}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer episodes")
    ap.add_argument("--size", type=int, default=100_000, help="catalog size (default 100k)")
    ap.add_argument("--json", default=None, help="also write the figures to this JSON file")
    args = ap.parse_args(argv)
    episodes = 80 if args.quick else 400
    s = _sub("speed", args.size, episodes)
    m1, m16 = _sub("memory", args.size, 1), _sub("memory", args.size, 16)
    c, w = s["cold"], s["warm"]
    print(f"Shopping-v0 on a {args.size:,}-product catalog ({s['episodes']} expert episodes, {c['steps']} steps, "
          f"{100 * s['search_share_of_steps']:.0f}% of them searches)")
    print(f"  env steps/s, cold caches  {c['steps_per_s']:9.0f}   (target >= 2000; {c['step_ms']:.3f} ms/step wall; "
          f"{c['steps_per_cpu_s']:.0f} steps per CPU-second)")
    for f, v in c["steps_per_s_by_family"].items():
        print(f"    {f:22s}  {v:9.0f}")
    print(f"  env steps/s, warm caches  {w['steps_per_s']:9.0f}   ({w['steps_per_cpu_s']:.0f} per CPU-second; "
          f"same episodes again: queries/products cached, as in GRPO groups; "
          f"warm/cold = {w['steps_per_s'] / c['steps_per_s']:.2f}x)")
    print(f"  reset, cold / warm        {c['reset_ms']:9.3f} / {w['reset_ms']:.3f} ms")
    print(f"  bare search (k=50)        {s['bare_search_ms']:9.3f} ms   (reference: one cold env step = "
          f"{c['step_ms'] / s['bare_search_ms']:.2f}x a bare search)")
    print(f"  memory: catalog+index {m1['catalog_mb']:9.1f} MB")
    print(f"          1 env         {m1['envs_mb']:9.1f} MB on top")
    print(f"          16 envs       {m16['envs_mb']:9.1f} MB on top (catalog shared: {m16['catalog_shared']}); "
          f"16 copies total / 1 copy total = "
          f"{(m16['catalog_mb'] + m16['envs_mb']) / (m1['catalog_mb'] + m1['envs_mb']):.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"speed": s, "memory_1": m1, "memory_16": m16}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
