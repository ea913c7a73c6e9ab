"""How many rollouts one GRPO update from the shipped agent needs before its direction is mostly signal.

The gradient noise scale of McCandlish et al., "An Empirical Model of Large-Batch Training" (arXiv 1812.06162,
§2.2 and appendix A), with one group of G rollouts of a task as the unit (GRPO's advantage is computed within a
group, so groups, not rollouts, are the independent draws):

    G_i     the gradient of the GRPO loss of group i alone, all at the same parameters (the start)
    |G|²    ≈ |mean_i G_i|² − tr(Σ)/n        (unbiased estimate of the squared true gradient)
    tr(Σ)   = Σ_i |G_i − mean G|² / (n − 1)
    B_simple = tr(Σ) / |G|²                  (groups per update at which signal and noise are equal)
    SNR(b)  = |G|² / (tr(Σ)/b)               (of one update over b groups)

An update over b ≪ B_simple groups moves the policy mostly at random; from a competent start that is drift, and a
long-horizon family (bundle, 18 decisions) pays for it most. Each arm is a setting of the learning benchmark's
protocol (`benchmarks.learning_lm`: the shipped agent, the screened and family-balanced training pool, the
protocol's group size and lr) with one option changed; every arm draws the same tasks with the same seeds. The
interval of B_simple comes from a delete-one jackknife of its inverse over the groups (`inverse_b_interval`); the
Gram matrix of the G_i is saved in the JSON, so the table can be recomputed from it.

Two breakdowns of the same gradients say where the noise and the signal sit: B_simple per parameter class
(`MODULE_CLASSES`: embedding with the tied head, attention, MLP, norms), and per pair of task families the inner
product and cosine of their mean gradients (`family_alignment`; a negative cosine would mean one family's update
undoes another's). The pool covers every family unless ``--families`` picks some.

With ``--results DIR`` writes ``DIR/grad_noise_lm.md`` and ``.json`` (command, commit, seeds, wall time; a pool of
some families only: ``DIR/grad_noise_lm_<families>.{md,json}``, `result_stem`);
``--json PATH`` writes the figures to a further file; without either, nothing is written.
Run: ``python -m benchmarks.grad_noise_lm [--quick] [--arms ...] [--json PATH] [--results DIR]``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

TABLE = "grad_noise_lm.md"


def result_stem(families) -> str:
    """File stem of the table of a pool: ``grad_noise_lm`` for every Shopping family, else the families joined
    (``grad_noise_lm_find_and_buy-clarify_and_buy``; tables from before ``--families`` have no "families" and are
    that pool)."""
    from shopsim.envs.shopping import FAMILIES

    fams = list(families or ("find_and_buy", "clarify_and_buy"))
    return "grad_noise_lm" if sorted(fams) == sorted(FAMILIES) else "grad_noise_lm_" + "-".join(fams)
#: arm name -> the options it changes (rollout temperature and nucleus, advantage scaling, and the trajectory reward
#: of `baselines.grpo.GRPOConfig`: the env's return, which gives partial credit, or the success flag the table counts)
ARMS: dict[str, dict] = {
    "t0.7": {"temperature": 0.7},
    "t1.0": {"temperature": 1.0},
    "t0.5": {"temperature": 0.5},
    "t0.7-dr": {"temperature": 0.7, "scale_rewards": "none"},
    "t1.0-top0.9": {"temperature": 1.0, "top_p": 0.9},
    "t1.0-success": {"temperature": 1.0, "reward": "success"},
    "t0.7-top0.9": {"temperature": 0.7, "top_p": 0.9},
    "t1.0-top0.8": {"temperature": 1.0, "top_p": 0.8},
    "t1.0-top0.7": {"temperature": 1.0, "top_p": 0.7},
    "t1.0-top0.6": {"temperature": 1.0, "top_p": 0.6},
    "t1.0-top0.8-nucleus": {"temperature": 1.0, "top_p": 0.8, "logprob_nucleus": True},
    "t1.0-top0.8-success": {"temperature": 1.0, "top_p": 0.8, "reward": "success"},
}
ENV = "shopsim/Shopping-v0"
#: parameter classes of the per-module breakdown (a parameter joins the first class whose marker is in its name; the
#: tied output head is the embedding)
MODULE_CLASSES = {"embedding": ("embed_tokens", "lm_head"), "attention": ("self_attn",), "mlp": ("mlp",),
                  "norm": ("norm",)}


def module_classes(model) -> dict[str, list[int]]:
    """Class -> positions in the flattened gradient (the order of `model.parameters()` with `requires_grad`)."""
    out: dict[str, list[int]] = {k: [] for k in MODULE_CLASSES}
    at, seen = 0, set()
    for name, p in model.named_parameters(remove_duplicate=False):
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        cls = next((k for k, marks in MODULE_CLASSES.items() if any(m in name for m in marks)), "other")
        out.setdefault(cls, []).extend(range(at, at + p.numel()))
        at += p.numel()
    return {k: v for k, v in out.items() if v}


def noise_stats(K: np.ndarray) -> dict:
    """The noise-scale figures from the Gram matrix ``K[i, j] = G_i · G_j`` of n per-group gradients."""
    n = K.shape[0]
    mean_sq = float(K.sum()) / n**2
    tr = (float(np.trace(K)) - n * mean_sq) / (n - 1)
    g2 = mean_sq - tr / n
    return {"groups": n, "tr_sigma": tr, "grad_sq_biased": mean_sq, "grad_sq": g2,
            "b_simple": tr / g2 if g2 > 0 else float("inf")}


def inverse_b_interval(K: np.ndarray) -> list[float]:
    """95% interval of B_simple from a delete-one jackknife of its inverse, |G|²/tr(Σ) (the signal-to-noise ratio
    of one group; nearly linear in the groups, unlike B_simple, and defined when |G|² ≤ 0). Inverted back, an
    interval of the inverse that reaches 0 gives an upper bound of ∞: no evidence of any signal at that end.
    (A bootstrap over groups does not fit here: a resampled duplicate is a perfectly correlated pair, which
    shrinks tr(Σ) and biases B_simple low.)"""
    n = K.shape[0]

    def inv(k: np.ndarray) -> float:
        st = noise_stats(k)
        return st["grad_sq"] / st["tr_sigma"]

    full = inv(K)
    keep = np.ones(n, dtype=bool)
    loo = []
    for i in range(n):
        keep[i] = False
        loo.append(inv(K[np.ix_(keep, keep)]))
        keep[i] = True
    loo_a = np.array(loo)
    se = float(np.sqrt((n - 1) / n * ((loo_a - loo_a.mean()) ** 2).sum()))
    lo, hi = full - 1.96 * se, full + 1.96 * se
    return [1 / hi if hi > 0 else float("inf"), 1 / lo if lo > 0 else float("inf")]


def group_gradients(over: dict, args, pool: tuple[int, ...], env_kwargs: dict) -> tuple[np.ndarray, dict]:
    """The Gram matrix of the per-group gradients of one arm, and what its rollouts looked like."""
    import torch

    import benchmarks.learning_lm as lm
    from baselines.core.batch import build_batch

    algo = lm._algo("grpo", args, env_kwargs, tasks_per_iter=args.groups_per_batch, minibatches=args.groups_per_batch,
                    max_grad_norm=1e12, log_kl_start=False, train_task_ids=pool, **over)
    agent = algo.make_agent(ENV, str(Path(args.out) / "start"), 0)
    algo.setup(agent)
    grads: list[torch.Tensor] = []

    def capture() -> None:  # the update's optimizer step: keep the gradient, leave the weights at the start
        grads.append(torch.cat([p.grad.flatten() for g in algo.optimizer.param_groups for p in g["params"]]))

    algo.optimizer.step = capture
    families: list[str] = []  # the task family of each captured gradient, in capture order
    cur: list = []
    minibatch_rows = algo.minibatch_rows

    def rows_in_order(batch, generator=None):  # one minibatch per group: note each one's family as it is stepped
        parts = minibatch_rows(batch, generator)
        for r in parts:
            t = int(batch.row_traj[r[0]])
            families.append(str((cur[t].meta or {}).get("family", "?")))
        return parts

    algo.minibatch_rows = rows_in_order
    rng = np.random.default_rng(args.seed)  # the same tasks and seeds for every arm
    succ, zero_var = [], []
    for b in range(args.batches):
        trajs, _ = algo.collect_batch(ENV, agent, 0, rng, env_kwargs=env_kwargs)
        cur[:] = trajs
        succ += [t.success for t in trajs]
        batch = build_batch(trajs, pad_id=algo.pad_id)
        metrics = algo.update(batch, 0, generator=torch.Generator().manual_seed(args.seed * 1000 + b))
        zero_var.append(metrics.get("zero_variance_groups", float("nan")))
    G = torch.stack(grads).double()
    K = (G @ G.T).numpy()
    by_module = {}
    for cls, idx in module_classes(algo.model).items():
        Gc = G[:, torch.tensor(idx)]
        Kc = (Gc @ Gc.T).numpy()
        by_module[cls] = {"params": len(idx), **noise_stats(Kc), "b_simple_ci95": inverse_b_interval(Kc)}
    info = {"rollouts": len(succ), "train_success": float(np.mean(succ)),
            "zero_variance_groups": float(np.nanmean(zero_var)),
            "zero_gradient_groups": int((np.diag(K) == 0).sum()), "by_module": by_module,
            "group_families": families if len(families) == len(grads) else [],
            "by_family": family_alignment(K, families) if len(families) == len(grads) else {}}
    return K, info


def family_alignment(K: np.ndarray, families: list[str]) -> dict:
    """Per pair of task families (a, b): the inner product of their mean per-group gradients, estimated without bias
    from distinct groups only (for a = b, the mean of K[i, j] over i ≠ j), and its cosine against the two families'
    own squared norms. A negative cosine means one family's update undoes the other's."""
    fam = sorted(set(families))
    idx = {f: [i for i, x in enumerate(families) if x == f] for f in fam}
    dot: dict[tuple[str, str], float] = {}
    for a in fam:
        for b in fam:
            ia, ib = idx[a], idx[b]
            vals = [K[i, j] for i in ia for j in ib if i != j]
            dot[a, b] = float(np.mean(vals)) if vals else float("nan")
    out = {}
    for a in fam:
        for b in fam:
            if a > b:
                continue
            den = dot[a, a] * dot[b, b]
            cos = dot[a, b] / np.sqrt(den) if a != b and den > 0 else (1.0 if a == b else float("nan"))
            out[f"{a}|{b}"] = {"dot": dot[a, b], "cos": float(cos), "groups": [len(idx[a]), len(idx[b])],
                               "nonzero_groups": [int((np.diag(K)[idx[a]] > 0).sum()),
                                                  int((np.diag(K)[idx[b]] > 0).sum())]}
    return out


def _fmt(x: float) -> str:
    return "∞" if not np.isfinite(x) else f"{x:.0f}"


def write_table(res: dict, path: Path) -> None:
    from shopsim.paths import write_text_atomic

    g = res["group_size"]
    lines = ["# Gradient noise of GRPO from the shipped agent", "",
             "Generated by `benchmarks/grad_noise_lm.py`; do not edit by hand.", "",
             f"- command: `{res['command']}`", f"- commit: `{res['commit']}`", f"- machine: {res['machine']}",
             *[f"- earlier run kept (its arms): `{e['command']}` at `{e['commit']}`"
               for e in res.get("earlier_runs", [])],
             f"- seed: {res['seed']}; {res['groups']} groups of {g} rollouts per arm, all at the start's weights, "
             f"on the learning benchmark's screened, family-balanced pool ({res['pool_size']} draws) of "
             f"{', '.join(res.get('families') or PROTOCOL_DEFAULTS['families'])}",
             f"- wall time: {res['wall_s']:.0f} s", "",
             "B_simple = tr(Σ)/|G|² is the number of groups per update at which the update's expected signal equals "
             "its noise (McCandlish et al. 2018); SNR(b) is that ratio for an update over b groups. An update far "
             "below B_simple moves the policy mostly at random.", "",
             "| arm | sampled success | zero-variance groups | B_simple (groups) [95% CI] | B_simple (rollouts) | "
             "SNR at 8 groups | SNR at 16 groups |", "|---|---|---|---|---|---|---|"]
    for name, a in res["arms"].items():
        b = a["b_simple"]
        ci = a["b_simple_ci95"]
        lines.append(f"| {name} | {a['train_success']:.2f} | {a['zero_variance_groups']:.2f} | {_fmt(b)} "
                     f"[{_fmt(ci[0])}, {_fmt(ci[1])}] | {_fmt(b * g)} | {a['snr']['8']:.2f} | {a['snr']['16']:.2f} |")
    lines += ["", "Arms: " + "; ".join(f"`{k}` = {json.dumps(v)}" for k, v in res["arm_options"].items()), ""]
    fams = {k: a["by_family"] for k, a in res["arms"].items() if a.get("by_family")}
    if fams:
        lines += ["Task families: the inner product of two families' mean per-group gradients, from distinct groups "
                  "only, and its cosine (a negative cosine: one family's update undoes the other's); groups with a "
                  "gradient per family in brackets.", "",
                  "| arm | families | mean-gradient dot | cosine | groups with a gradient |", "|---|---|---|---|---|"]
        for name, pairs in fams.items():
            for pair, m in pairs.items():
                a, b = pair.split("|")
                if a == b:
                    continue
                lines.append(f"| {name} | {a} · {b} | {m['dot']:.3g} | {m['cos']:+.2f} | "
                             f"{m['nonzero_groups'][0]}, {m['nonzero_groups'][1]} |")
        lines.append("")
    split = {k: a["by_module"] for k, a in res["arms"].items() if a.get("by_module")}
    if split:
        lines += ["By parameter class (the same per-group gradients cut to one class of parameters; the tied output "
                  "head counts as the embedding). A class whose B_simple is far above the whole model's moves mostly "
                  "at random in every update.", "",
                  "| arm | class | parameters | tr(Σ) | \\|G\\|² | B_simple (groups) [95% CI] |",
                  "|---|---|---|---|---|---|"]
        for name, mods in split.items():
            for cls, m in mods.items():
                ci = m["b_simple_ci95"]
                lines.append(f"| {name} | {cls} | {m['params']} | {m['tr_sigma']:.3g} | {m['grad_sq']:.3g} | "
                             f"{_fmt(m['b_simple'])} [{_fmt(ci[0])}, {_fmt(ci[1])}] |")
        lines.append("")
    write_text_atomic(path, "\n".join(lines))


#: what must match for a recorded arm to sit in the same table as a new one
PROTOCOL = ("seed", "group_size", "groups", "pool_size", "lr", "families")
#: protocol fields added later, at the value the records without them were measured under
PROTOCOL_DEFAULTS = {"families": ["find_and_buy", "clarify_and_buy"]}


def same_protocol(a: dict, b: dict) -> list[str]:
    """The `PROTOCOL` fields in which two records differ (none: their arms can share a table)."""
    return [k for k in PROTOCOL if a.get(k, PROTOCOL_DEFAULTS.get(k)) != b.get(k, PROTOCOL_DEFAULTS.get(k))]


def merged_with_recorded(res: dict, path: Path) -> dict:
    """`res` plus the arms of the table recorded at `path` that this run did not measure, when both were measured
    under the same protocol (`PROTOCOL`); each arm keeps the command and commit that measured it."""
    for a in res["arms"].values():
        a.setdefault("command", res["command"])
        a.setdefault("commit", res["commit"])
    if not path.is_file():
        return res
    return merged_arms(res, json.loads(path.read_text()), path)


def merged_arms(res: dict, old: dict, path: Path | str) -> dict:
    """`res` plus the arms of the record `old` (read from `path`) that `res` did not measure, under the same
    protocol; otherwise `res` alone."""
    if same_protocol(old, res):
        print(f"{path}: recorded under another protocol; its arms are not kept")
        return res
    kept = {k: {"command": old["command"], "commit": old["commit"], **v} for k, v in old["arms"].items()
            if k not in res["arms"]}
    return {**res, "arms": {**kept, **res["arms"]},
            "arm_options": {**old.get("arm_options", {}), **res["arm_options"]},
            "earlier_runs": [
                *old.get("earlier_runs", []), {"command": old["command"], "commit": old["commit"],
                                               "wall_s": old.get("wall_s")}]}


def table_from_json(paths: list[Path], directory: Path) -> int:
    """Write ``directory/grad_noise_lm.{md,json}`` from the ``--json`` records of earlier runs, in order: each later
    record adds its arms to the first one's (`merged_with_recorded`), so every arm keeps its own command and commit;
    a record under another protocol stops with the differing fields."""
    from shopsim.paths import write_text_atomic

    res = json.loads(paths[0].read_text())
    for a in res["arms"].values():
        a.setdefault("command", res["command"])
        a.setdefault("commit", res["commit"])
    for path in paths[1:]:
        new = json.loads(path.read_text())
        bad = same_protocol(new, res)
        if bad:
            raise SystemExit(f"{path}: measured under another protocol ({', '.join(bad)}); not merged")
        for a in new["arms"].values():
            a.setdefault("command", new["command"])
            a.setdefault("commit", new["commit"])
        res = merged_arms(new, res, paths[0])
    directory.mkdir(parents=True, exist_ok=True)
    stem = result_stem(res.get("families"))
    write_table(res, directory / f"{stem}.md")
    write_text_atomic(directory / f"{stem}.json", json.dumps(res, indent=2))
    print(f"wrote {directory / stem}.md ({len(res['arms'])} arms)")
    return 0


def main(argv=None) -> int:
    import torch

    import benchmarks.learning_lm as lm
    from benchmarks import shopping_families
    from benchmarks.bench_lm_rl import _commit
    from shopsim.paths import write_text_atomic

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    lm.add_protocol_arguments(p)
    p.set_defaults(temperature=0.7, max_turns=40)
    p.add_argument("--arms", nargs="+", default=["t0.7", "t1.0", "t0.7-dr"], choices=list(ARMS))
    p.add_argument("--families", default="all",
                   help="task families of the pool, comma-separated, or 'all' (the learning benchmark's default); "
                        "tables before this option screened find_and_buy and clarify_and_buy only")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--rollouts", type=int, default=128, help="rollouts per collected batch")
    p.add_argument("--batches", type=int, default=4, help="batches per arm (groups = batches × rollouts / G)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--init", default=None, help="checkpoint (default: the shipped agent, data/lm/sft)")
    p.add_argument("--screen-tasks", type=int, default=48)
    p.add_argument("--screen-samples", type=int, default=8)
    p.add_argument("--out", default="runs/grad_noise_lm", help="the start copy and its screened pool")
    p.add_argument("--quick", action="store_true", help="one arm, 2 batches of 16 rollouts, 4 tasks screened")
    p.add_argument("--json", default=None, help="also write the figures to this JSON file")
    p.add_argument("--results", default=None, metavar="DIR",
                   help=f"write the table DIR/{TABLE} and its .json (the committed one: docs/results; default: none; "
                        "a pool of some families: DIR/grad_noise_lm_<families>.md)")
    p.add_argument("--from-json", nargs="+", default=None, metavar="PATH",
                   help="measure nothing: write the --results table from the --json files of earlier runs (runs "
                        "under another protocol than the first are refused)")
    args = p.parse_args(argv)
    if args.from_json:
        if not args.results:
            p.error("--from-json writes a table: pass --results DIR")
        return table_from_json([Path(x) for x in args.from_json], Path(args.results))
    if args.quick:
        args.arms, args.rollouts, args.batches, args.screen_tasks, args.screen_samples = ["t0.7"], 16, 2, 4, 4
    args.start, args.task_pool, args.pool_balance, args.num_envs = "sft", "screened", "family", None
    args.eval_episodes, args.eval_every = 0, 0  # no evaluation: every gradient is taken at the start
    args.families = shopping_families(p, args.families)
    args.groups_per_batch = max(1, args.rollouts // args.group_size)
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    init = Path(args.init) if args.init else lm.default_init()
    out = Path(args.out)
    env_kwargs = lm.protocol_env_kwargs(init, args)
    lm.weaken(init, out / "start", args.target, args.calib, env_kwargs, args.bisect_steps, args)
    pool = tuple(lm.balanced_pool(lm.screen_pool(out / "start", args, env_kwargs)))
    arms = {}
    for name in args.arms:
        K, info = group_gradients(ARMS[name], args, pool, env_kwargs)
        st = noise_stats(K)
        g2, tr = st["grad_sq"], st["tr_sigma"]
        arms[name] = {**info, **st, "b_simple_ci95": inverse_b_interval(K), "gram": K.tolist(),
                      "snr": {str(b): (g2 / (tr / b) if g2 > 0 else 0.0) for b in (8, 16, 32, 64)}}
        print(f"{name}: B_simple {st['b_simple']:.0f} groups [{arms[name]['b_simple_ci95'][0]:.0f}, "
              f"{arms[name]['b_simple_ci95'][1]:.0f}], SNR at 8 groups {arms[name]['snr']['8']:.2f} "
              f"(sampled success {info['train_success']:.2f})", flush=True)
        for pair, m in info["by_family"].items():
            print(f"  {pair}: mean-gradient dot {m['dot']:.3g}, cos {m['cos']:.2f} (groups {m['groups']}, "
                  f"with a gradient {m['nonzero_groups']})", flush=True)
        for cls, m in info["by_module"].items():
            print(f"  {cls} ({m['params']} params): B_simple {_fmt(m['b_simple'])} [{_fmt(m['b_simple_ci95'][0])}, "
                  f"{_fmt(m['b_simple_ci95'][1])}], tr(Σ) {m['tr_sigma']:.3g}, |G|² {m['grad_sq']:.3g}", flush=True)
    res = {"command": "python -m benchmarks.grad_noise_lm " + " ".join(sys.argv[1:] if argv is None else argv),
           "commit": _commit(), "machine": f"{platform.machine()}, torch {torch.__version__}, threads {args.threads}",
           "seed": args.seed, "families": args.families, "group_size": args.group_size,
           "groups": args.batches * args.groups_per_batch,
           "pool_size": len(pool), "lr": args.lr, "arm_options": {k: ARMS[k] for k in args.arms}, "arms": arms,
           "wall_s": time.perf_counter() - t0}
    if args.json:
        write_text_atomic(args.json, json.dumps(res, indent=2))
    if args.results:
        d = Path(args.results)
        stem = result_stem(args.families)
        res = merged_with_recorded(res, d / f"{stem}.json")
        write_table(res, d / f"{stem}.md")
        write_text_atomic(d / f"{stem}.json", json.dumps(res, indent=2))
        print(f"wrote {d / stem}.md")
    if not (args.json or args.results):
        print("no table written (pass --results DIR, e.g. --results docs/results, or --json PATH)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
