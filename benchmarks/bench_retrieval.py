"""TwoStageRetrieval-v0 throughput: contexts per second of the vectorised simulator.

    python -m benchmarks.bench_retrieval [--quick] [--n-items 1000] [--k 20]

Measures `TwoStageRetrievalSim.step_batch` (contexts from task ids, validation, LSR, noisy rewards) on batches of
contexts, and three references in the same run: the same model evaluated one context at a time in a Python loop
(naive per-context numpy), the Gymnasium env's reset+step loop, and the PL retriever's Gumbel-top-K sampling
(torch) on the same batch. Target: at least 100k contexts/s for catalog 1000 and K = 20.
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def best_of(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def naive_step(sim, x: np.ndarray, cand: np.ndarray, rng: np.random.Generator) -> float:
    """One context, written the obvious way (the reference the vectorised path is compared with)."""
    c = sim.config
    if len(set(cand.tolist())) != c.k or cand.min() < 0 or cand.max() >= c.n_items:
        raise ValueError("bad candidate set")
    e = sim.items[cand]

    def sig(v):
        return 1.0 / (1.0 + np.exp(-v))

    eta = np.sqrt(sig(x @ sim.w_x + 3.0) * sig(e @ sim.w_a + 3.0))
    q = 10.0 * ((1.0 - eta) * (e @ sim.m0.T @ x) + eta * (e @ sim.mz[0].T @ x))
    std = sig(e @ sim.w_noise.T @ x + 1.0)
    shown = np.argsort(-q)[: c.l]
    mu = np.logaddexp(0.0, q[shown]) + 1.0
    return float(np.mean(mu + std[shown] * rng.standard_normal(c.l)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller batches, fewer repeats")
    ap.add_argument("--n-items", type=int, default=1000)
    ap.add_argument("--k", type=int, default=20)
    ap.add_argument("--l", type=int, default=1)
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(1)
    import gymnasium as gym

    import shopsim  # noqa: F401
    from agents.retrieval_policies import PLRetriever
    from shopsim.envs.two_stage_retrieval import TwoStageRetrievalSim

    env_kwargs = {"n_items": args.n_items, "k": args.k, "l": args.l}
    sim = TwoStageRetrievalSim(**env_kwargs)
    batch = 20_000 if args.quick else 100_000
    repeat = 2 if args.quick else 3
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 1_000_000, batch)
    cand = np.argpartition(rng.random((batch, args.n_items)), args.k - 1, axis=1)[:, : args.k]

    def vec_step():
        sim.step_batch(sim.contexts(ids), cand, rng)

    t_vec = best_of(vec_step, repeat)
    vec_rate = batch / t_vec

    n_naive = 2_000 if args.quick else 10_000
    x = sim.contexts(ids[:n_naive]).astype(np.float64)

    def loop():
        for i in range(n_naive):
            naive_step(sim, x[i], cand[i], rng)

    naive_rate = n_naive / best_of(loop, 1)

    env = gym.make("shopsim/TwoStageRetrieval-v0", **env_kwargs)
    n_env = 1_000 if args.quick else 5_000
    env.reset(seed=0)

    def env_loop():
        for i in range(n_env):
            env.reset(seed=i, options={"task_id": int(ids[i])})
            env.step(cand[i])

    env_rate = n_env / best_of(env_loop, 1)

    agent = PLRetriever(env_kwargs=env_kwargs, seed=0)
    n_pol = 8_192
    xs = sim.contexts(ids[:n_pol])
    pol_rate = n_pol / best_of(lambda: agent.sample(xs, rng), repeat)

    print(f"TwoStageRetrieval-v0  n_items={args.n_items} K={args.k} L={args.l}  (CPU, torch threads=1)")
    print(f"  vectorised step_batch  : {vec_rate:12,.0f} contexts/s  (batch {batch:,}, best of {repeat})")
    print(f"  naive per-context loop : {naive_rate:12,.0f} contexts/s  -> speed-up x{vec_rate / naive_rate:,.1f}")
    print(f"  gym env reset+step     : {env_rate:12,.0f} episodes/s  -> speed-up x{vec_rate / env_rate:,.1f}")
    print(f"  PL retriever sampling  : {pol_rate:12,.0f} contexts/s  (Gumbel-top-K + log-prob, torch)")
    target = 100_000
    print(f"  target >= {target:,} contexts/s: {'met' if vec_rate >= target else 'NOT met'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
