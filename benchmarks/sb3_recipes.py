"""The Stable-Baselines3 recipes of docs/clients.md, measured beside shopsim's own reference agents.

    python -m benchmarks.sb3_recipes [--steps 30000] [--seeds 0 1 2] [--tasks 256] [--actions s_S quantity]
                                     [--threads 1] [--results DIR] [--json PATH]
    python -m benchmarks.sb3_recipes --results docs/results    # the committed table

**Replenishment-v0.** For each action form of ``make_sb3_env(..., repl_action=FORM)`` and each seed: SB3 PPO
exactly as docs/clients.md prints it (``VecNormalize`` over a ``DummyVecEnv``, ``learning_rate=1e-3``,
``log_std_init=-1``, SB3's other defaults, ``--steps`` environment steps), the ``VecNormalize`` statistics saved
with the model and loaded back with ``training=False, norm_reward=False``; then evaluated deterministically on the
env's test protocol (`shopsim eval`'s: the first ``--tasks`` test tasks, one try, eval seed 0), the same episodes as
shopsim's ``random`` and ``s_S`` agents and the neutral rule alone (action 0 throughout, no learning). Per row: the
mean reported cost per episode with its 95% bootstrap interval over tasks, the ratio to ``s_S``, and where the cost
goes (holding, backlog, fixed, fill rate, order rate, mean order size).

**ProactiveRec-v0** (analytic simulator, the docs' recipe): on the first ``--tasks`` test tasks (at most 64), the
return of a policy that stops at the first step, of uniformly random actions of the SB3 action space and of shopsim's
``random`` agent, for both action forms (``action_mode="item"``, the SB3 default now, and ``"semantic_id"``).

With ``--results DIR`` writes ``DIR/sb3_recipes.md`` and ``sb3_recipes.json`` (command, commit, seeds, wall time);
without it no table is written.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPL = "shopsim/Replenishment-v0"
REC = "shopsim/ProactiveRec-v0"
REC_KWARGS = {"simulator": "analytic"}
#: the docs' PPO settings (everything else is SB3's default). log_std_init=-1: exploration noise of std 0.37
#: around the neutral order instead of SB3's 1.0, whose clipped samples order q_max in one period of six
PPO_KWARGS = {"learning_rate": 1e-3, "policy_kwargs": {"log_std_init": -1.0}}
REC_TASKS_MAX = 64


def repl_protocol(tasks: int):
    from shopsim.leaderboard.protocols import load_protocol

    return load_protocol(REPL, "test").limited(tasks=tasks, seeds=[0], tries=1)


class SB3Agent:
    """A trained SB3 model acting through `make_sb3_env`'s Replenishment form, as a shopsim agent: the raw `Dict`
    observation flattened as ``FlattenObservation`` does, normalised with the saved ``VecNormalize`` statistics,
    ``model.predict(deterministic=True)``, then the wrapper's own action map. ``model=None`` acts 0 throughout
    (the neutral rule alone)."""

    name = "sb3"
    learns = False
    env_kwargs: dict = {}

    def __init__(self, model, vecnorm, repl_action: str, env_kwargs: dict | None = None):
        import gymnasium as gym

        from shopsim.wrappers import make_sb3_env

        self.model, self.vecnorm, self.repl_action = model, vecnorm, repl_action
        self.env = make_sb3_env(REPL, repl_action=repl_action, **(env_kwargs or {}))
        self.inner = self.env.unwrapped
        self.raw_space = gym.make(REPL, **(env_kwargs or {})).observation_space

    # the agent protocol (agents.base.Agent), without importing agents here
    def reset(self, num_slots: int, seed: int | None = None) -> None:
        self.num_slots = num_slots

    def seed_episode(self, slot: int, seed: int) -> None:
        pass

    def begin_episode(self, slot: int, observation: Any, info: dict) -> None:
        pass

    def observe(self, slot, reward, terminated, truncated, info) -> None:
        pass

    def close(self) -> None:
        pass

    def hybrid(self, obs: dict, action: np.ndarray) -> dict:
        """The hybrid action the wrapped env passes on for `action` in the state `obs` (the wrappers' own maps)."""
        from shopsim.wrappers import neutral_action_to_quantity, neutral_order

        q_max = float(self.inner.config.q_max)
        a = np.clip(np.asarray(action, np.float64), -1.0, 1.0)  # SB3 clips its actions to the bounds
        if self.repl_action == "quantity":  # RescaleAction: [-1, 1] -> [0, q_max]
            q = (a + 1.0) / 2.0 * q_max
        else:
            q = neutral_action_to_quantity(a, neutral_order(obs, q_max, self.repl_action), q_max)
        return {"order": (q > 0).astype(np.int8), "quantity": q.astype(np.float32)}

    def act(self, observations, infos, slots):
        import gymnasium as gym

        from agents.base import Decision

        n = self.env.action_space.shape
        if self.model is None:
            acts = [np.zeros(n, np.float32) for _ in observations]
        else:
            flat = np.stack([gym.spaces.flatten(self.raw_space, o) for o in observations])
            acts = list(self.model.predict(self.vecnorm.normalize_obs(flat), deterministic=True)[0])
        return [Decision(self.hybrid(o, np.asarray(a, np.float32))) for o, a in zip(observations, acts, strict=True)]


def train_ppo(repl_action: str, steps: int, seed: int, folder: Path):
    """The docs' recipe: train, save model and VecNormalize statistics, load both back for evaluation."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    from shopsim.wrappers import make_sb3_env

    def make():
        return make_sb3_env(REPL, repl_action=repl_action)

    env = VecNormalize(DummyVecEnv([make]))
    t0 = time.perf_counter()
    PPO("MlpPolicy", env, seed=seed, device="cpu", **PPO_KWARGS).learn(steps).save(folder / "ppo")
    env.save(str(folder / "vecnormalize.pkl"))
    train_s = time.perf_counter() - t0
    stats = VecNormalize.load(str(folder / "vecnormalize.pkl"), DummyVecEnv([make]))
    stats.training, stats.norm_reward = False, False
    return PPO.load(folder / "ppo", device="cpu"), stats, train_s


def _mean(m: dict, key: str) -> float | None:
    v = m.get(key)
    return None if v is None else float(v["mean"] if isinstance(v, dict) else v)


def repl_row(agent, protocol, orders: bool = True) -> dict:
    from shopsim.leaderboard.evaluate import evaluate

    ev = evaluate(agent, protocol, reference=None, progress=False, keep_trajectories=orders)
    m = ev.metrics
    row = {"cost": m["cost"]["mean"], "ci95": m["cost"]["ci95"], "episodes": len(ev.records),
           "eval_s": round(ev.wall_s, 1)}
    for k in ("holding_cost", "backlog_cost", "fixed_cost", "fill_rate", "order_rate"):
        row[k] = _mean(m, k)
    if orders and ev.trajectories:
        q = [np.asarray(t.action["quantity"], float)[np.asarray(t.action["order"]) > 0]
             for tr in ev.trajectories for t in tr.turns]
        placed = np.concatenate(q) if q else np.zeros(0)
        row["mean_order"] = float(placed.mean()) if placed.size else 0.0
    return row


def rec_rows(tasks: int) -> dict:
    import gymnasium as gym

    import agents
    from shopsim.leaderboard.protocols import load_protocol
    from shopsim.wrappers import make_sb3_env

    task_ids = list(load_protocol(REC, "test").task_ids[:min(tasks, REC_TASKS_MAX)])
    out: dict[str, dict] = {}
    for mode in ("item", "semantic_id"):
        env = make_sb3_env(REC, action_mode=mode, **REC_KWARGS)
        inner = env.unwrapped
        stop = inner.n if mode == "item" else np.array([inner.eos_code, 0, 0, 0])
        env.action_space.seed(0)
        ref = agents.make("random", REC, action_mode=mode, **REC_KWARGS)
        ref.reset(1, 0)
        policies = {"stop at once": lambda o, i, stop=stop: stop,
                    "uniform random action": lambda o, i, env=env: env.action_space.sample(),
                    "shopsim random agent": lambda o, i, ref=ref: ref.act_one(0, o, i)}
        raw = gym.make(REC, action_mode=mode, **REC_KWARGS)
        cells = {}
        for name, pol in policies.items():
            rets, lens = [], []
            for k, task in enumerate(task_ids):
                use = raw if name == "shopsim random agent" else env
                obs, info = use.reset(seed=k, options={"split": "test", "task_id": task})
                ret, n, done = 0.0, 0, False
                while not done:
                    obs, r, term, trunc, info = use.step(pol(obs, info))
                    ret, n, done = ret + r, n + 1, term or trunc
                rets.append(ret)
                lens.append(n)
            cells[name] = {"return": float(np.mean(rets)), "length": float(np.mean(lens))}
        out[mode] = {"action_space": str(env.action_space), "episodes": len(task_ids), "policies": cells}
    return out


def run(args, argv=None) -> dict:
    import torch

    import agents
    from shopsim.leaderboard.results import git_commit
    from shopsim.paths import write_text_atomic

    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    protocol = repl_protocol(args.tasks)
    rows: dict[str, dict] = {}
    for name in ("random", "s_S"):
        rows[name] = {"kind": "shopsim reference agent", **repl_row(agents.make(name, REPL), protocol)}
        print(f"{name}: {rows[name]['cost']:.0f}", flush=True)
    s_S = rows["s_S"]["cost"]
    for form in args.actions:
        if form != "quantity":
            row = repl_row(SB3Agent(None, None, form), protocol)
            rows[f"neutral rule `{form}` alone (action 0)"] = {"kind": "no learning", "repl_action": form, **row}
        per_seed = []
        for seed in args.seeds:
            with tempfile.TemporaryDirectory() as tmp:
                model, stats, train_s = train_ppo(form, args.steps, seed, Path(tmp))
                row = repl_row(SB3Agent(model, stats, form), protocol)
            row.update(seed=seed, train_s=round(train_s, 1))
            per_seed.append(row)
            print(f"PPO {form} seed {seed}: {row['cost']:.0f} ({row['cost'] / s_S:.2f}x s_S, train {train_s:.0f}s)",
                  flush=True)
        costs = [r["cost"] for r in per_seed]
        rows[f"SB3 PPO, repl_action=\"{form}\""] = {
            "kind": f"PPO {args.steps:,} steps", "repl_action": form, "cost": float(np.mean(costs)),
            "cost_min": float(min(costs)), "cost_max": float(max(costs)), "per_seed": per_seed,
            **{k: float(np.mean([r[k] for r in per_seed])) for k in
               ("holding_cost", "backlog_cost", "fixed_cost", "fill_rate", "order_rate", "mean_order")}}
    for r in rows.values():
        r["ratio_to_s_S"] = r["cost"] / s_S
    rec = rec_rows(args.tasks)
    meta = {"command": "python -m benchmarks.sb3_recipes " + shlex.join(sys.argv[1:] if argv is None else argv),
            "commit": git_commit(), "wall_s": round(time.perf_counter() - t0, 1), "steps": args.steps,
            "seeds": list(args.seeds), "threads": args.threads, "ppo_kwargs": PPO_KWARGS,
            "protocol": {"env_id": REPL, "split": "test", "tasks": len(protocol.task_ids), "tries": 1,
                         "eval_seeds": list(protocol.seeds), "hash": protocol.hash},
            "replenishment": rows, "proactive_rec": rec}
    if args.json:
        write_text_atomic(Path(args.json), json.dumps(meta, indent=2))
    if args.results:
        write_results(Path(args.results), meta)
        print(f"wrote {Path(args.results) / 'sb3_recipes.md'} and sb3_recipes.json")
    return meta


def _f(x: float | None, fmt: str = ",.0f") -> str:
    return "–" if x is None else format(x, fmt)


def write_results(directory: Path, meta: dict) -> None:
    from shopsim.paths import write_text_atomic

    directory.mkdir(parents=True, exist_ok=True)
    write_text_atomic(directory / "sb3_recipes.json", json.dumps(meta, indent=2))
    p = meta["protocol"]
    lines = ["# SB3 recipes of docs/clients.md beside shopsim's reference agents", "",
             "Generated by `benchmarks/sb3_recipes.py`; do not edit by hand.", "",
             f"- command: `{meta['command']}`", f"- commit: `{meta['commit']}`",
             f"- wall time: {meta['wall_s'] / 60:.1f} min on {meta['threads']} CPU thread(s)",
             f"- PPO: {meta['steps']:,} environment steps, seeds {meta['seeds']}, `VecNormalize` statistics saved and "
             "loaded back with `training=False, norm_reward=False`, deterministic actions",
             f"- Replenishment-v0 protocol: the first {p['tasks']} test tasks, {p['tries']} try, eval seed(s) "
             f"{p['eval_seeds']} (protocol {p['hash']}); every row runs the same episodes. Cost: mean reported cost "
             "per episode (periods after the warm-up), 95% bootstrap interval over tasks (PPO: mean over seeds, "
             "range of the per-seed means)", "",
             "## Replenishment-v0", "",
             "| row | kind | cost per episode | × s_S | holding | backlog | fixed | fill rate | order rate | "
             "mean order |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in meta["replenishment"].items():
        ci = (f" [{_f(r['ci95'][0])}, {_f(r['ci95'][1])}]" if "ci95" in r
              else f" (seeds {_f(r['cost_min'])} – {_f(r['cost_max'])})")
        lines.append(f"| {name} | {r['kind']} | {_f(r['cost'])}{ci} | {r['ratio_to_s_S']:.2f} | "
                     f"{_f(r['holding_cost'])} | {_f(r['backlog_cost'])} | {_f(r['fixed_cost'])} | "
                     f"{_f(r['fill_rate'], '.3f')} | {_f(r['order_rate'], '.2f')} | {_f(r.get('mean_order'), '.1f')} |")
    lines += ["", "## ProactiveRec-v0 (analytic simulator): stopping at once against random", "",
              "| action form | policy | return | length |", "|---|---|---|---|"]
    for mode, m in meta["proactive_rec"].items():
        for name, c in m["policies"].items():
            lines.append(f"| `{mode}` ({m['action_space']}) | {name} | {c['return']:.2f} | {c['length']:.1f} |")
    n = next(iter(meta["proactive_rec"].values()))["episodes"]
    lines += ["", f"{n} test tasks, one episode each (reset seed = task index)."]
    write_text_atomic(directory / "sb3_recipes.md", "\n".join(lines) + "\n")


def main(argv=None) -> int:
    from shopsim.wrappers import REPL_ACTIONS

    p = argparse.ArgumentParser(description="The SB3 recipes of docs/clients.md, measured (module docstring)")
    p.add_argument("--steps", type=int, default=30_000, help="PPO environment steps (the documented budget)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--tasks", type=int, default=256, help="test tasks (default: the protocol's 256)")
    p.add_argument("--actions", nargs="+", default=["s_S"], choices=REPL_ACTIONS,
                   help="make_sb3_env repl_action forms to train (default %(default)s)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--results", default=None, metavar="DIR",
                   help="write the table DIR/sb3_recipes.md and .json (the committed one: docs/results; default: none)")
    p.add_argument("--json", default=None, help="also write the measurements to this JSON file")
    a = p.parse_args(argv)
    if a.steps < 1 or a.tasks < 1:
        p.error("--steps and --tasks must be at least 1")
    run(a, argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
