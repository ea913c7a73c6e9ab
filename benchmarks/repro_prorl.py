"""Reproduction of ProRL's claims on ProactiveRec-v0: REINFORCE, GRPO and ProRL from one pre-trained policy.

    python -m benchmarks.repro_prorl [--quick] [--iterations N] [--arms prorl reinforce ...] [--valid-only]
        [--no-repeat] [--sft-source logged|expert] [--lr 1e-4] [--out runs/repro_prorl]

The claims (Hou et al., "ProRL: Effective Reinforcement Learning for Proactive Recommendation via Rectified Policy
Gradient Estimation", arXiv 2605.28293; docs/algorithms/prorl.md):

* REINFORCE on the raw fused reward drifts to the maximum path length (10) and paths collapse across users;
* ProRL keeps path lengths useful and raises IoI and CTR over the pre-trained (SFT) policy;
* position-specific advantages have a lower gradient variance than the whole-path reward.

What it does: pre-trains one semantic-ID policy (`agents.rec_policies.pretrained_policy`, on the users' logged
continuations or, with ``--sft-source expert``, on the greedy simulator expert's paths), then trains each arm in
``--arms`` from that same start with the same learning rate, prompts and 16 rollouts per prompt. Arms `reinforce`,
`grpo` and `prorl` are the registered algorithms (`baselines.prorl`); `prorl-fused` (one running statistic of the
fused reward, [derived]), `prorl-path` (whole-path credit) and `prorl-sum` (item log-prob = sum of its 4 tokens)
are ablations. Every policy, and the random, expert and pre-trained references, is evaluated on held-out dev users
with greedy decoding and with the paper's protocol (beam search with 10 beams, Metric@K = max over the top-K
beams). It also measures the gradient variance of position-specific versus whole-path credit at the pre-trained
policy, and, for `prorl`, the centred step reward r_k at each path position under ProRL's frozen statistics (r_k
> 0: items at position k earn more than the per-item charge the centring subtracts).

``--valid-only`` constrains decoding to real semantic IDs; ``--no-repeat`` also excludes history and earlier path
items (`no_repeat=True` on the agent and in `ProRLConfig`), where ProRL's own decoding can repeat an item and charges
it CTR := 0. ``--quick``: a 2k-item catalog and 30 iterations per arm (CPU minutes).

Writes under --out: `table.md` (greedy metrics, beam Metric@K, gradient variance, per-position r_k), `results.json`
(the same numbers and the config), `curves.png` (sampled length, distinct paths, dev IoI and CTR over training) and
`<arm>/metrics.csv` per arm. What to expect at the CPU budget: docs/algorithms/prorl.md.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from agents.rec_policies import expert_paths, policy_paths, pretrained_policy, random_paths
from baselines.prorl import (
    ProRL,
    RecGRPO,
    RecReinforce,
    evaluate,
    evaluate_beam,
    gradient_variance,
    position_profile,
)
from shopsim.envs.proactive_rec import PathScorer
from shopsim.envs.proactive_rec.env import load_split
from shopsim.envs.proactive_rec.scoring import path_metrics

ENV_ID = "shopsim/ProactiveRec-v0"
ARMS = {"reinforce": (RecReinforce, {}), "grpo": (RecGRPO, {}), "prorl": (ProRL, {}),
        # ablations: the [derived] fused-reward centering, and whole-path credit instead of per position
        "prorl-fused": (ProRL, {"centering": "fused"}), "prorl-path": (ProRL, {"credit": "path"}),
        # item log-prob = sum of its 4 token log-probs instead of ProRL's mean
        "prorl-sum": (ProRL, {"item_logprob": "sum"})}
DEFAULT_ARMS = ["reinforce", "grpo", "prorl"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="CPU budget: 2k-item catalog, 30 iterations per arm")
    ap.add_argument("--iterations", type=int, default=None)
    ap.add_argument("--catalog-size", type=int, default=None)
    ap.add_argument("--simulator", default="sasrec", choices=["sasrec", "analytic"])
    ap.add_argument("--lr", type=float, default=1e-4, help="same for every arm (ProRL: 1e-4 on ML-1M)")
    ap.add_argument("--prompts-per-iter", type=int, default=8)
    ap.add_argument("--eval-tasks", type=int, default=64)
    ap.add_argument("--sft-users", type=int, default=None)
    ap.add_argument("--sft-steps", type=int, default=None)
    ap.add_argument("--sft-source", default="logged", choices=["expert", "logged"],
                    help="pre-training paths: the users' own logged continuations (ProRL pre-trains on ground-truth "
                         "paths; default) or the privileged greedy simulator expert")
    ap.add_argument("--valid-only", action="store_true", help="catalog-constrained decoding (no hallucinated IDs)")
    ap.add_argument("--no-repeat", action="store_true",
                    help="no-repeat decoding: history and earlier path items cannot be recommended again")
    ap.add_argument("--arms", nargs="+", default=DEFAULT_ARMS, choices=list(ARMS),
                    help="algorithms to train (prorl-fused / prorl-path: ablations)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="runs/repro_prorl")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    size = args.catalog_size or (2000 if args.quick else 5000)
    iters = args.iterations or (30 if args.quick else 200)
    sft_users = args.sft_users or (1000 if args.quick else 1500)
    sft_steps = args.sft_steps or (600 if args.quick else 1000)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    wk = dict(catalog_size=size, simulator=args.simulator)
    t0 = time.time()
    init = pretrained_policy(**wk, n_users=sft_users, sft_steps=sft_steps, sft_source=args.sft_source, log=print)
    init.valid_only, init.no_repeat = args.valid_only, args.no_repeat
    if args.valid_only:
        init.vocab.restrict_to(init.world.sids.codes)
    init.vocab.forbid_repeats(args.no_repeat)
    world = init.world
    scorer = PathScorer(world)
    dev = np.array(load_split()["dev"][: args.eval_tasks])
    hist, tgt = world.tasks(dev)
    refs = {"random": path_metrics(scorer.score(hist, tgt, random_paths(world, len(dev), np.random.default_rng(0)))),
            "expert": path_metrics(scorer.score(hist, tgt, expert_paths(world, hist, tgt)[0])),
            "pretrained (SFT)": {**evaluate(init, scorer, dev), **evaluate_beam(init, scorer, dev)}}
    refs["random"]["distinct"] = refs["expert"]["distinct"] = float("nan")
    print(f"setup {time.time() - t0:.0f}s; pretrained: {refs['pretrained (SFT)']}")
    common = dict(catalog_size=size, simulator=args.simulator, lr=args.lr, prompts_per_iter=args.prompts_per_iter,
                  num_train_prompts=max(args.prompts_per_iter, iters * args.prompts_per_iter // 3),
                  eval_every=max(1, iters // 6), eval_tasks=args.eval_tasks, valid_only=args.valid_only,
                  no_repeat=args.no_repeat,
                  sft_users=sft_users, sft_steps=sft_steps)
    # gradient variance at the pre-trained parameters: position-specific vs whole-path credit
    gv_algo = ProRL(**common)
    gv = gradient_variance(gv_algo, init, np.arange(500_000, 500_064), n_batches=8, prompts=4, seed=args.seed)
    print("gradient variance:", gv)
    results, hist_all, profiles = {}, {}, {}
    for name in args.arms:
        cls, extra = ARMS[name]
        t1 = time.time()
        algo = cls(**common, **extra)
        res = algo.train(ENV_ID, iterations=iters, seed=args.seed, out_dir=out / name, agent=init, progress=False)
        if name == "prorl":  # what each position earns under the statistics ProRL froze after epoch 1
            init_items = policy_paths(init, hist, tgt, greedy=True, generator=torch.Generator().manual_seed(0))[3]
            profiles = {src: position_profile(algo, scorer.score(hist, tgt, items, invalid="batch_min"))
                        for src, items in (("expert", expert_paths(world, hist, tgt)[0]),
                                           ("pretrained (SFT)", init_items),
                                           ("prorl", policy_paths(res.agent, hist, tgt, greedy=True,
                                                                  generator=torch.Generator().manual_seed(0))[3]))}
        hist_all[name] = res.history
        results[name] = {**evaluate(res.agent, scorer, dev), **evaluate_beam(res.agent, scorer, dev),
                         "seconds": time.time() - t1,
                         "sample_length_first": res.history[0]["sample_length"],
                         "sample_length_last": float(np.mean([h["sample_length"] for h in res.history[-3:]])),
                         "sample_distinct_last": float(np.mean([h["sample_distinct"] for h in res.history[-3:]])),
                         "dup_share_first": res.history[0]["sample_dup_share"],
                         "dup_share_last": float(np.mean([h["sample_dup_share"] for h in res.history[-3:]])),
                         "eos_adv_first": float(np.mean([h["eos_adv_mean"] for h in res.history[:3]])),
                         "eos_adv_last": float(np.mean([h["eos_adv_mean"] for h in res.history[-3:]]))}
        print(name, results[name])
    _table(out, refs, results, gv, args, size, iters, profiles)
    _plot(out, hist_all, refs)
    (out / "results.json").write_text(json.dumps({"refs": refs, "arms": results, "gradvar": gv, "profiles": profiles,
                                                  "config": {**common, "iterations": iters}}, indent=2))
    print(f"wrote {out}/table.md, curves.png, results.json ({time.time() - t0:.0f}s total)")
    return 0


def _table(out, refs, results, gv, args, size, iters, profiles):
    lines = [f"# ProRL reproduction (ProactiveRec-v0, catalog {size}, {args.simulator}, {iters} iterations/arm, "
             f"lr {args.lr}, 16 rollouts x {args.prompts_per_iter} prompts, SFT on {args.sft_source} paths, "
             f"valid_only={args.valid_only}, no_repeat={args.no_repeat})", "",
             "Held-out dev users, greedy decoding. IoI/IoR = sums over the path, CTR = mean per item (invalid = 0), "
             "distinct = share of distinct paths across users; sampled length = mean over the training rollouts "
             "(first iteration -> mean of the last 3); sampled dup = share of sampled items that repeat a history "
             "or earlier path item; EOS adv = mean advantage of the stop token over rollouts that stop (first 3 "
             "-> last 3 iterations; > 0: stopping is reinforced).", "",
             "| policy | IoI | IoR | CTR | length | invalid | distinct | sampled length | sampled distinct "
             "| sampled dup | EOS adv |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, m in refs.items():
        lines.append(f"| {name} | {m['IoI']:.3f} | {m['IoR']:.0f} | {m['CTR']:.3f} | {m['length']:.2f} | "
                     f"{m['invalid']:.2f} | {m.get('distinct', float('nan')):.2f} | | | | |")
    for name, m in results.items():
        lines.append(f"| {name} | {m['IoI']:.3f} | {m['IoR']:.0f} | {m['CTR']:.3f} | {m['length']:.2f} | "
                     f"{m['invalid']:.2f} | {m['distinct']:.2f} | {m['sample_length_first']:.2f} -> "
                     f"{m['sample_length_last']:.2f} | {m['sample_distinct_last']:.2f} | "
                     f"{m['dup_share_first']:.2f} -> {m['dup_share_last']:.2f} | "
                     f"{m['eos_adv_first']:+.2f} -> {m['eos_adv_last']:+.2f} |")
    lines += ["", "ProRL's evaluation protocol: beam search, 10 beams, Metric@K = max over the top-K beams "
              "(mean over users); length@K = length of the best-IoI beam among the top K.", "",
              "| policy | IoI@1 | IoI@10 | IoR@1 | IoR@10 | CTR@1 | CTR@10 | length@1 | length@10 |",
              "|---|---|---|---|---|---|---|---|---|"]
    for name, m in [("pretrained (SFT)", refs["pretrained (SFT)"]), *results.items()]:
        lines.append(f"| {name} | {m['IoI@1']:.3f} | {m['IoI@10']:.3f} | {m['IoR@1']:.0f} | {m['IoR@10']:.0f} | "
                     f"{m['CTR@1']:.3f} | {m['CTR@10']:.3f} | {m['length@1']:.2f} | {m['length@10']:.2f} |")
    lines += ["", "Gradient variance at the pre-trained policy (8 independent batches of 4 prompts x 16 rollouts, "
              "same samples and centred rewards; trace of the covariance, and relative to |mean gradient|^2):", "",
              "| credit | variance | relative |", "|---|---|---|",
              f"| position-specific (ProRL) | {gv['gradvar_position']:.4g} | {gv['gradvar_rel_position']:.3g} |",
              f"| whole path | {gv['gradvar_path']:.4g} | {gv['gradvar_rel_path']:.3g} |"]
    if profiles:
        lines += ["", "Centred step reward r_k by path position under ProRL's frozen epoch-1 statistics (greedy paths, "
                  "dev users; r_k > 0: the item earns more than the per-item charge μ):", "",
                  "| paths | " + " | ".join(f"k={k}" for k in range(1, 11)) + " |", "|---|" + "---|" * 10]
        for src, prof in profiles.items():
            at = {p["position"]: p for p in prof}
            cells = [f"{at[k]['r_centred']:+.2f} (n={at[k]['n']})" if k in at else "" for k in range(1, 11)]
            lines.append(f"| {src} | " + " | ".join(cells) + " |")
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _plot(out, hist_all, refs):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(18, 4))
    for name, h in hist_all.items():
        it = [r["iteration"] for r in h]
        axes[0].plot(it, [r["sample_length"] for r in h], label=name)
        axes[1].plot(it, [r["sample_distinct"] for r in h], label=name)
        ev = [r for r in h if "eval_IoI" in r]
        axes[2].plot([r["iteration"] for r in ev], [r["eval_IoI"] for r in ev], marker="o", label=name)
        axes[3].plot([r["iteration"] for r in ev], [r["eval_CTR"] for r in ev], marker="o", label=name)
    for ax, key in zip(axes[2:], ("IoI", "CTR"), strict=False):
        ax.axhline(refs["pretrained (SFT)"][key], color="gray", ls="--", label="pretrained")
        ax.axhline(refs["random"][key], color="black", ls=":", label="random")
    for ax, title in zip(axes, ("mean sampled path length", "share of distinct sampled paths",
                                "eval IoI (dev, greedy)", "eval CTR (dev, greedy)"), strict=False):
        ax.set_title(title)
        ax.set_xlabel("iteration")
        ax.legend()
    fig.tight_layout()
    fig.savefig(out / "curves.png", dpi=100)


if __name__ == "__main__":
    raise SystemExit(main())
