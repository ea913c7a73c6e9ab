"""Throughput of Replenishment-v0 in SKU-steps/s, side by side with or-gym's InvManagement-v0.

    .venv/bin/python -m benchmarks.bench_replenishment [--quick] [--skus 1000] [--orgym-python PATH]

Measured in this one run, one process each, one core (torch/numpy threads pinned to 1):
* `env.step` of Replenishment-v0 at N SKUs (Gymnasium API, action validation and observation dict included);
* the raw `step_numpy` dynamics batched over scenarios (B × N SKUs per call);
* `step_torch` batched (CPU, no grad), the simulator HPO and PPO train on;
* or-gym `InvManagement-v0` (one product, 30 periods) in its own virtual environment (it pins gym <= 0.19), run as a
  subprocess; NumPy 2 removed `np.Inf`, which or-gym uses, so the subprocess restores that alias first.
or-gym has one product per env, so one or-gym step is one SKU-step; the ratio compares SKU-steps/s.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time

import numpy as np

ORGYM_SNIPPET = r"""
import json, sys, time
import numpy as np
if not hasattr(np, "Inf"):
    np.Inf = np.inf  # or-gym 0.5 uses the alias NumPy 2 removed
import or_gym
env = or_gym.make("InvManagement-v0")
env.reset()
action = np.array([20, 20, 20])
dur = float(sys.argv[1])
n, t0 = 0, time.perf_counter()
while time.perf_counter() - t0 < dur:
    _, _, done, _ = env.step(action)
    n += 1
    if done:
        env.reset()
print(json.dumps({"steps_per_s": n / (time.perf_counter() - t0), "periods": env.num_periods}))
"""


def _timeit(fn, dur: float) -> tuple[int, float]:
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < dur:
        n += fn()
    return n, time.perf_counter() - t0


def bench_env(n_skus: int, dur: float) -> float:
    import gymnasium as gym

    import shopsim  # noqa: F401

    env = gym.make("shopsim/Replenishment-v0", n_skus=n_skus).unwrapped
    rng = np.random.default_rng(0)
    actions = [{"order": rng.integers(0, 2, n_skus).astype(np.int8),
                "quantity": rng.uniform(0, 30, n_skus).astype(np.float32)} for _ in range(16)]
    env.reset(seed=0)
    state = {"i": 0}

    def run() -> int:
        for _ in range(50):
            _, _, done, _, _ = env.step(actions[state["i"] % 16])
            state["i"] += 1
            if done:
                env.reset()
        return 50

    n, dt = _timeit(run, dur)
    return n / dt


def bench_step_numpy(n_skus: int, batch: int, dur: float) -> float:
    from shopsim.envs.replenishment import step_numpy

    rng = np.random.default_rng(0)
    shape = (batch, n_skus)
    on, pipe = rng.uniform(0, 30, shape), rng.uniform(0, 10, shape + (2,))
    h, b, k = rng.uniform(0.7, 1.3, shape), rng.uniform(6, 12, shape), np.full(shape, 64.0)
    order, q = rng.integers(0, 2, shape).astype(np.float64), rng.uniform(0, 30, shape)
    d = rng.poisson(10, (16,) + shape).astype(np.float64)
    state = {"on": on, "pipe": pipe, "i": 0}

    def run() -> int:
        for _ in range(20):
            out = step_numpy(state["on"], state["pipe"], order, q, d[state["i"] % 16], h, b, k)
            state["on"], state["pipe"] = out.on_hand, out.pipeline
            state["i"] += 1
        return 20

    n, dt = _timeit(run, dur)
    return n * batch / dt


def bench_step_torch(n_skus: int, batch: int, dur: float) -> float:
    import torch

    from shopsim.envs.replenishment import step_torch

    g = torch.Generator().manual_seed(0)
    shape = (batch, n_skus)
    on, pipe = torch.rand(shape, generator=g) * 30, torch.rand(shape + (2,), generator=g) * 10
    h, b, k = torch.full(shape, 1.0), torch.full(shape, 9.0), torch.full(shape, 64.0)
    order, q = (torch.rand(shape, generator=g) > 0.5).float(), torch.rand(shape, generator=g) * 30
    d = torch.poisson(torch.full((16,) + shape, 10.0), generator=g)
    state = {"on": on, "pipe": pipe, "i": 0}

    def run() -> int:
        with torch.no_grad():
            for _ in range(20):
                out = step_torch(state["on"], state["pipe"], order, q, d[state["i"] % 16], h, b, k)
                state["on"], state["pipe"] = out.on_hand, out.pipeline
                state["i"] += 1
        return 20

    n, dt = _timeit(run, dur)
    return n * batch / dt


def bench_orgym(python: str, dur: float) -> dict:
    if not os.path.exists(python):
        return {"error": f"{python} not found; create it with: python3.11 -m venv /tmp/orgym-venv && "
                         "/tmp/orgym-venv/bin/pip install 'setuptools==65.5.0' 'wheel<0.40' && "
                         "/tmp/orgym-venv/bin/pip install --no-build-isolation gym==0.19.0 && "
                         "/tmp/orgym-venv/bin/pip install or-gym"}
    proc = subprocess.run([python, "-c", ORGYM_SNIPPET, str(dur)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1 s per measurement instead of 5 s")
    ap.add_argument("--skus", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=64, help="scenarios per batched step call")
    ap.add_argument("--orgym-python", default=os.environ.get("ORGYM_PYTHON", "/tmp/orgym-venv/bin/python"))
    ap.add_argument("--json", "--out", dest="out", default=None, help="also write the results as JSON here")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    dur = 1.0 if args.quick else 5.0
    N = args.skus
    res: dict = {"n_skus": N, "batch": args.batch}
    env_sps = bench_env(N, dur)
    res["env_steps_per_s"] = env_sps
    res["env_sku_steps_per_s"] = env_sps * N
    res["env_n5_sku_steps_per_s"] = bench_env(5, dur) * 5
    res["step_numpy_batched_sku_steps_per_s"] = bench_step_numpy(N, args.batch, dur) * N
    res["step_torch_batched_sku_steps_per_s"] = bench_step_torch(N, args.batch, dur) * N
    og = bench_orgym(args.orgym_python, dur)
    res["orgym"] = og
    print(f"Replenishment-v0, one process, one core ({'quick' if args.quick else 'full'} run)")
    print(f"  env.step, N={N:>5}          : {env_sps:>12,.0f} steps/s  = {env_sps * N:>14,.0f} SKU-steps/s"
          f"  (target >= 2,000,000: {'met' if env_sps * N >= 2e6 else 'NOT met'})")
    print(f"  env.step, N=    5          : {res['env_n5_sku_steps_per_s'] / 5:>12,.0f} steps/s  = "
          f"{res['env_n5_sku_steps_per_s']:>14,.0f} SKU-steps/s")
    print(f"  step_numpy, B={args.batch} x N={N} : {res['step_numpy_batched_sku_steps_per_s']:>44,.0f} SKU-steps/s")
    print(f"  step_torch, B={args.batch} x N={N} : {res['step_torch_batched_sku_steps_per_s']:>44,.0f} SKU-steps/s")
    if "error" in og:
        print(f"  or-gym InvManagement-v0    : not measured ({og['error']})")
    else:
        o = og["steps_per_s"]
        print(f"  or-gym InvManagement-v0    : {o:>12,.0f} steps/s  = {o:>14,.0f} SKU-steps/s (1 product)")
        res["ratio_env_vs_orgym_sku_steps"] = env_sps * N / o
        res["ratio_env_vs_orgym_steps"] = env_sps / o
        print(f"  ratio (ours / or-gym)      : {env_sps * N / o:,.0f}x in SKU-steps/s; "
              f"{env_sps / o:.2f}x in env steps/s (ours at N={N})")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
