"""Learning benchmark of the Shopping LM algorithms (reinforce, ppo, grpo, dapo, gigpo, vapo, mpo and the seed
algorithms) at one budget.

    python -m benchmarks.learning_lm [--algos grpo mpo ...] [--seeds 0 1 2] [--jobs 2] [--init CKPT] [--out DIR]
                                     [--families all] [--teacher CKPT] [--results docs/results]
    python -m benchmarks.learning_lm --quick      # grpo + mpo, 1 seed, 3 iterations: a few CPU minutes

It reproduces no paper table: it measures how much each algorithm raises the test success of an LM agent on
Shopping-v0 when all of them get the same start, rollouts, learning rate and evaluation episodes.

The table of record (``learning_lm.{md,json}``, written by ``--results docs/results``) starts from the shipped
agent and uses the protocol that docs/training.md ("The table of record") chose by pilot runs; its command is
recorded in the table. That protocol is what ``--start sft`` (the default) defaults to, and ``--start weaken``
defaults to the weakened table's (`START_DEFAULTS`); an option given on the command line overrides either.
Regenerate the tables from their recorded runs, with no training, by

    python -m benchmarks.learning_lm --report-only --results docs/results

Protocol:
1. Start checkpoint (``--start``): ``sft`` (default), the SFT checkpoint ``--init`` (default the shipped
   ``data/lm/sft``) as it is; ``weaken``, that checkpoint *weakened* to about ``--target`` dev success by
   interpolating its weights toward a random initialisation of the same architecture,
   θ = (1 − α)·θ_SFT + α·θ_rand, with α found by bisection (its table: ``learning_lm_weaken.{md,json}``). The start
   is saved once in ``OUT/start`` and shared by every run. The default families are all four (``--families``,
   comma-separated, picks some). Episodes are cut at ``--max-turns`` 40: the expert's bundle episodes take 18
   turns on average and 25 at the 95th percentile, the other families' 4-7.
2. Every algorithm gets the same budget: ``--iterations`` × ``--rollouts`` rollouts per iteration (group methods:
   G rollouts × rollouts/G tasks; ppo, mpo, basis and reinforce(batch_mean): one rollout per task), the same
   learning rate, rollout temperature and nucleus, per-turn token limit, env settings (``--reward-scheme``),
   update schedule (``--minibatches`` clipped-surrogate steps per iteration; REINFORCE, strictly on-policy, takes
   one) and advantage options (``--negative-advantage-scale`` and the others of `PROTOCOL_KEYS`); ``--seeds``
   seeds each; ``--jobs`` runs them in parallel processes. Every evaluation (the start, every algorithm and seed)
   runs the same episodes (``EVAL_SEED``), so the comparisons are paired. TrOPD distils from ``--teacher``, by
   default ``--init``.
3. Dev and test success (greedy decoding, fixed task lists of the families) every ``--eval-every`` iterations
   and at the end; the start checkpoint is evaluated once with the same protocol (iteration 0).
4. The gain of a run is its final test success minus the start's on the same episodes; the summary reports the
   mean gain over seeds with its 95% Student-t interval, overall and per family, and whether every seed gained.
   Every pair of algorithms is compared seed by seed (`compare_rows`: the interval of the per-seed difference of
   their gains), which says which algorithms beat GRPO, lose to it or cannot be told from it at this budget; from
   the shipped agent the table also checks its targets (`targets`).
5. Besides the algorithms as published, ``--algos`` takes the seed papers' arms (`VARIANTS`): an algorithm with the
   options its card's claims vary (a style-biased reward, dynamic sampling off, an ablation), trained under the
   same protocol and listed apart; `benchmarks.seed_claims` decides the claims from their rows.

Outputs in OUT: ``<algo>/seed<S>/metrics.csv`` (from the trainer), ``curves.csv`` (algo, seed, iteration,
dev/test success), ``summary.json`` + ``summary.md`` (gains with intervals, rollouts used), ``curves.png``;
with ``--results DIR`` also ``DIR/learning_lm.md``, ``DIR/learning_lm.json`` (command, commit, seeds, wall
time, the sha256 of the start's source weights) and ``DIR/learning_lm_curves.csv`` (every evaluation of every run).
The start and its evaluation are reused when OUT already holds them, and the summary covers every run found under
OUT. With ``--results``, the finished runs recorded there are reused too, when they were measured under the same
protocol from the same source weights and the start (rebuilt deterministically) evaluates the same: a long
benchmark can be run in pieces (``--algos``, ``--seeds``) on machines that do not share ``OUT``.
What to expect: docs/training.md ("Learning benchmark").
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

from shopsim.leaderboard.results import git_commit

ENV = "shopsim/Shopping-v0"
#: the families of the seed algorithms' checks (benchmarks/repro_*), and of start folders that do not record theirs
FAMILIES = ("find_and_buy", "clarify_and_buy")
ALGOS = ("reinforce", "ppo", "grpo", "dapo", "gigpo", "vapo", "mpo", "wapo", "bipace", "basis", "arc", "tropd",
         "delta", "midtrain")
SINGLE_ROLLOUT = {"ppo", "mpo", "reinforce", "basis", "tropd"}
#: ARC's n rollouts per (task, strategy) and its M strategies (the card's defaults): n·M rollouts per task
ARC_N, ARC_M = 4, 3
#: what an algorithm's rollouts before its first iteration are for (`row_notes`)
PRE_STAGE = {"midtrain": "stage 1, the generation of mid-training data", "basis": "the offline reference table",
             "vapo": "value pre-training", "mpo": "value pre-training"}
EVAL_SEED = 10_000  # every evaluation (start, every algorithm and seed) runs the same episodes
#: the seed papers' arms beyond the algorithms as published (each card's "what a faithful reproduction shows"):
#: name -> (algorithm, config options, env options). They train under the same protocol as the table's rows, so a
#: claim compares an arm with a row of the same runs (`benchmarks.seed_claims`); their rows are listed apart
VARIANTS: dict[str, tuple[str, dict, dict]] = {
    # ARC (card §8): a deliberate style bias in the reward, a small bonus for direct recommendations; GRPO drifts to
    # the favoured strategy, ARC keeps success; without the entropy bonus entropy collapses
    "grpo-bias": ("grpo", {}, {"style_bias": 0.1}),
    "arc-bias": ("arc", {}, {"style_bias": 0.1}),
    "arc-bias-free": ("arc", {"free_group": True}, {"style_bias": 0.1}),
    "arc-bias-noent": ("arc", {"entropy_coef": 0.0}, {"style_bias": 0.1}),
    # DelTA (card §12): against DAPO with dynamic sampling off in both
    "dapo-nods": ("dapo", {"dynamic_sampling": False, "overlong_buffer_frac": 0.2}, {}),
    # TrOPD (card §13): plain on-policy distillation, and the three outlier treatments, without prefix guidance
    "opd": ("tropd", {"objective": "opd", "prefix_guidance": False}, {}),
    "tropd-noprefix": ("tropd", {"prefix_guidance": False}, {}),
    "tropd-clip": ("tropd", {"outlier": "clip", "prefix_guidance": False}, {}),
    "tropd-mask": ("tropd", {"outlier": "mask", "prefix_guidance": False}, {}),
    # mid-training (card §14): STaR data, diverse but incorrect data, more tasks × one strategy at the same size
    "midtrain-star": ("midtrain", {"data": "star"}, {}),
    "midtrain-incorrect": ("midtrain", {"data": "incorrect"}, {}),
    "midtrain-more-tasks": ("midtrain", {"strategies_per_task": 1, "num_tasks": 192}, {}),
    # BiPACE (card §9): the ablations' pairing and baseline
    "bipace-distinct": ("bipace", {"eps_pairs": "distinct"}, {}),
    "bipace-state": ("bipace", {"baseline": "state"}, {}),
    # WAPO (card §11): where GRPO destabilises (3 × the learning rate, negative advantages as published) WAPO stays
    # stable and ends at or above it
    "grpo-lr3x": ("grpo", {"lr": 3e-4, "negative_advantage_scale": 1.0}, {}),
    "wapo-lr3x": ("wapo", {"lr": 3e-4, "negative_advantage_scale": 1.0}, {}),
    # MPO (card §7): one time scale (λ_intra = λ_turn) and β = 0 should cost success
    "mpo-one-lambda": ("mpo", {"lam_intra": 0.8}, {}),
    "mpo-beta0": ("mpo", {"beta": 0.0}, {}),
}
#: every row the benchmark can train: the algorithms as published, then the seed papers' arms
ARMS = ALGOS + tuple(VARIANTS)


def base_algo(name: str) -> str:
    """The algorithm an arm trains (itself for a row of `ALGOS`)."""
    return VARIANTS[name][0] if name in VARIANTS else name


#: algorithms whose card has no KL term (their config refuses one): ``--kl-coef`` leaves them as they are
NO_KL = frozenset({"wapo"})


def _config_fields(name: str) -> set[str]:
    import baselines
    from shopsim.configs import config_fields

    return {f.name for f in config_fields(baselines.resolve(name, env_id=ENV).Config)}


def _algo(arm: str, args, env_kwargs: dict, **over):
    """The algorithm of `arm` (a row of `ALGOS` or a `VARIANTS` arm) with the benchmark's common settings (same
    budget, lr, limits, eval protocol); an arm's own options come on top."""
    import baselines

    name, arm_config, arm_env = VARIANTS.get(arm, (arm, {}, {}))
    env_kwargs = {**env_kwargs, **arm_env}
    G = 1 if name in SINGLE_ROLLOUT else args.group_size
    per = dict(group_size=G, tasks_per_iter=max(1, args.rollouts // G))
    if name == "arc":  # every rollout of every strategy counts in the budget: fewer tasks per iteration
        per = dict(group_size=ARC_N, tasks_per_iter=max(1, args.rollouts // (ARC_N * ARC_M)))
    if name != "reinforce":  # REINFORCE is strictly on-policy: one step per batch
        per["minibatches"] = args.minibatches
    agg = getattr(args, "loss_agg", None)
    if agg is not None:
        per["loss_agg"] = agg
    kl = getattr(args, "kl_coef", None)
    if kl is not None and name not in NO_KL and "kl_coef" in _config_fields(name):
        per["kl_coef"] = kl
    if name == "vapo":
        per["value_pretrain_steps"] = args.value_pretrain_steps
    if name == "dapo":
        per["max_gen_batches"] = args.max_gen_batches
    if name == "tropd":
        # from the weakened start the teacher is the checkpoint it was weakened from (not TrOPD's default, a larger
        # model), so the row measures recovery toward what the start lost; from the shipped agent, TrOPD's own
        # default (a larger model: the start distilled from itself learns nothing); --teacher picks another
        teacher = getattr(args, "teacher", None)
        if teacher is None and getattr(args, "start", "weaken") == "weaken":
            teacher = str(args.init or "data/lm/sft")
        if teacher is not None:
            per["teacher"] = teacher
    if name == "midtrain":
        # from the weakened start the card's strategy prompt (and exemplar) keeps nothing (0 of 768 candidates
        # succeed), which would make the row plain GRPO: sample unprompted at the rollout temperature and let the
        # adherence check assign the correct samples to strategies (midtrain's [derived] fallback). The shipped
        # agent follows the card's strategy line (43% of 768 candidates succeed, 44 kept), but an exemplar
        # prepended to its first observation breaks it (2 of 768): the card's prompt without the exemplar
        if getattr(args, "start", "weaken") == "sft":
            per.update(exemplar=False, gen_temperature=args.temperature)
        else:
            per.update(strategy_prompt=False, exemplar=False, gen_temperature=args.temperature)
    neg = getattr(args, "negative_advantage_scale", 1.0)
    if neg != 1.0:
        per["negative_advantage_scale"] = neg
    am = getattr(args, "argmax_negative_scale", 1.0)
    if am != 1.0:
        per["argmax_negative_scale"] = am
    anchor = getattr(args, "success_anchor_coef", 0.0)
    if anchor:
        per["success_anchor_coef"] = anchor
    share = getattr(args, "greedy_failed_share", 0.0)
    if share:
        per["greedy_failed_share"] = share
    pool = tuple(getattr(args, "pool_ids", ()) or ())
    if pool:
        per["train_task_ids"] = pool
    common = dict(lr=args.lr, critic_lr=args.critic_lr, max_new_tokens=args.max_new_tokens, env_kwargs=env_kwargs,
                  lr_warmup_iters=getattr(args, "lr_warmup", 0), lr_decay=getattr(args, "lr_decay", "constant"),
                  temperature=args.temperature, top_p=getattr(args, "top_p", 1.0),
                  task_families=tuple(getattr(args, "families", FAMILIES)), eval_split="dev,test",
                  eval_episodes=args.eval_episodes,
                  eval_every=args.eval_every, eval_seed=EVAL_SEED, num_envs=num_envs(args),
                  eval_sampled=getattr(args, "eval_sampled", False),
                  # state after every iteration: a run the session stops (TrOPD, VAPO: long) resumes where it was
                  checkpoint_every=1)
    return baselines.make(name, env_id=ENV, **{**common, **per, **arm_config, **over})


def num_envs(args) -> int:
    """Env copies of every run's rollouts and evaluations: ``--num-envs``, else 64 from the shipped agent (one slot
    decoder batch per iteration's rollouts) and 8 from the weakened start (the setting its recorded runs were
    trained under; the rollouts are the same for any number: each episode samples from its own stream)."""
    given = getattr(args, "num_envs", None)
    if given:
        return int(given)
    return 64 if getattr(args, "start", "weaken") == "sft" else 8


def default_init() -> Path:
    """The shipped agent, `data/lm/sft`: the default ``--init``."""
    from agents.lm.agent import default_checkpoint_dir

    return default_checkpoint_dir()


def evaluate_metrics(agent, split: str, n: int, env_kwargs: dict, args) -> dict:
    """The trainers' own greedy evaluation on the first `n` tasks of `split` (same seeds): ``{split}_success`` and
    ``{split}_success/<family>``."""
    algo = _algo("grpo", args, env_kwargs, eval_split=split, eval_episodes=n)
    return algo.evaluate(ENV, agent, seed=EVAL_SEED, env_kwargs=env_kwargs)


def evaluate(agent, split: str, n: int, env_kwargs: dict, args) -> float:
    """Greedy success on the first `n` tasks of `split` (the trainers' own evaluation, same seeds)."""
    return evaluate_metrics(agent, split, n, env_kwargs, args)[f"{split}_success"]


def weaken(init: Path, out: Path, target: float, n_calib: int, env_kwargs: dict, steps: int, args,
           seed: int = 0) -> dict:
    """Interpolate toward a random init until dev success ≈ target (bisection on α); save to `out`."""
    from transformers import AutoModelForCausalLM

    from agents.lm.agent import LMAgent

    if (out / "weaken.json").is_file():
        return json.loads((out / "weaken.json").read_text())
    agent = LMAgent(env_id=ENV, checkpoint=init)
    if getattr(args, "start", "weaken") == "sft":  # the checkpoint as shipped: its weights, untouched
        agent.save(out, env_kwargs={k: v for k, v in env_kwargs.items() if k != "max_turns"})
        info = {"alpha": 0.0, "calib_success": None, "sft_success": None, "trace": [], "calib_tasks": 0,
                "families": list(getattr(args, "families", FAMILIES)), "start": "sft"}
        (out / "weaken.json").write_text(json.dumps(info, indent=2))
        return info
    sft = {k: v.detach().clone() for k, v in agent.model.state_dict().items()}
    torch.manual_seed(seed)
    rand = AutoModelForCausalLM.from_config(agent.model.config).state_dict()

    def at(alpha: float) -> float:
        agent.model.load_state_dict({k: (1 - alpha) * sft[k] + alpha * rand[k] if sft[k].is_floating_point() else sft[k]
                                     for k in sft})
        return evaluate(agent, "dev", n_calib, env_kwargs, args)

    s0 = at(0.0)
    trace = [(0.0, s0)]
    lo, hi = 0.0, 1.0
    best = (0.0, s0)
    if s0 > target:
        for _ in range(steps):
            mid = (lo + hi) / 2
            s = at(mid)
            trace.append((mid, s))
            if abs(s - target) < abs(best[1] - target):
                best = (mid, s)
            lo, hi = (mid, hi) if s > target else (lo, mid)
    at(best[0])
    agent.save(out, env_kwargs={k: v for k, v in env_kwargs.items() if k != "max_turns"})
    info = {"alpha": best[0], "calib_success": best[1], "sft_success": s0, "trace": trace, "calib_tasks": n_calib,
            "families": list(getattr(args, "families", FAMILIES)), "start": getattr(args, "start", "weaken")}
    (out / "weaken.json").write_text(json.dumps(info, indent=2))
    return info


SCREEN_SEED = 20_000  # the screened tasks and their rollouts (one draw, shared by every run of the protocol)


def screen_pool(start_dir: Path, args, env_kwargs: dict) -> dict:
    """The training task pool of ``--task-pool screened``: for each family, ``--screen-tasks`` train tasks (drawn with
    `SCREEN_SEED`), each rolled out ``--screen-samples`` times by the start at the rollout temperature; a task is kept
    when some of its rollouts succeed and some fail. Every group of rollouts on such a task can disagree, so a
    group-relative update gets a signal from it, while the tasks the start always solves or always fails (most of
    them, see `zero_var_groups` in the runs' metrics) would give none. Saved in ``OUT/start/pool-*.json`` and shared
    by every run; the test tasks are untouched.

    Each screened task is also run once greedily (what the table evaluates), and the file records per family the
    greedy success, the sampled success on the tasks the greedy path solves (``sampled_on_greedy_solved``: below 1,
    the draws slip where arg-max does not) and on those it fails (``sampled_on_greedy_failed``), and how many of the
    greedy failures some sample solves (``greedy_failed_solved_by_a_sample``): the only tasks where a sampled
    update can change what greedy decoding does."""
    from agents.lm.agent import LMAgent
    from baselines.core.tasks import sample_tasks
    from baselines.core.trainer import sampling_as
    from shopsim.paths import write_text_atomic
    from shopsim.rollout import collect

    top_p = getattr(args, "top_p", 1.0)
    key = (f"pool-{args.screen_tasks}x{args.screen_samples}-t{args.temperature}"
           f"{'' if top_p == 1.0 else f'-p{top_p}'}-m{args.max_turns}.json")
    path = start_dir / key
    if path.is_file():
        return json.loads(path.read_text())
    agent = LMAgent(env_id=ENV, checkpoint=start_dir, temperature=args.temperature, top_p=top_p,
                    max_new_tokens=args.max_new_tokens)
    k = args.screen_samples
    info: dict = {"tasks_per_family": args.screen_tasks, "samples": k, "temperature": args.temperature,
                  "top_p": top_p, "families": {}, "pool": []}
    for fam in args.families:
        tasks = sample_tasks(ENV, "train", np.random.default_rng(SCREEN_SEED), args.screen_tasks, families=(fam,))
        trajs = collect(ENV, agent, tasks=tasks, seeds=[SCREEN_SEED + i for i in range(len(tasks))], group_size=k,
                        split="train", num_envs=num_envs(args), env_kwargs=env_kwargs, progress=False,
                        agent_seed=SCREEN_SEED)
        wins = [sum(bool(t.success) for t in trajs[i * k:(i + 1) * k]) for i in range(len(tasks))]
        with sampling_as(agent, greedy=True):
            greedy = [bool(t.success) for t in collect(
                ENV, agent, tasks=tasks, seeds=[SCREEN_SEED + i for i in range(len(tasks))], split="train",
                num_envs=num_envs(args), env_kwargs=env_kwargs, progress=False, agent_seed=SCREEN_SEED)]
        kept = sorted({int(t) for t, w in zip(tasks, wins, strict=True) if 0 < w < k})
        solved = [w / k for w, g in zip(wins, greedy, strict=True) if g]
        failed = [w / k for w, g in zip(wins, greedy, strict=True) if not g]
        st = info["families"][fam] = {
            "screened": len(tasks), "kept": len(kept), "success": float(np.mean(wins)) / k,
            "always": sum(w == k for w in wins), "never": sum(w == 0 for w in wins),
            "greedy_success": float(np.mean(greedy)),
            "sampled_on_greedy_solved": float(np.mean(solved)) if solved else None,
            "sampled_on_greedy_failed": float(np.mean(failed)) if failed else None,
            "greedy_failed": len(failed), "greedy_failed_solved_by_a_sample": sum(f > 0 for f in failed)}
        info["pool"] += kept
        print(f"screen {fam}: kept {len(kept)} of {len(tasks)} (success {st['success']:.2f}, always "
              f"{st['always']}, never {st['never']}; greedy {st['greedy_success']:.2f}, a sample solves "
              f"{st['greedy_failed_solved_by_a_sample']} of its {len(failed)} failures)", flush=True)
    if not info["pool"]:
        raise SystemExit("no screened task is solved sometimes and failed sometimes; use --task-pool all")
    write_text_atomic(path, json.dumps(info, indent=2))
    return info


def pool_by_family(info: dict) -> dict[str, list[int]]:
    """The screened pool's task ids per family (`screen_pool` keeps them in family order)."""
    out, i = {}, 0
    for fam, st in info["families"].items():
        out[fam] = list(info["pool"][i:i + st["kept"]])
        i += st["kept"]
    return out


def balanced_pool(info: dict) -> list[int]:
    """The screened pool with each family's tasks repeated ``round(largest family / its size)`` times, so that a
    uniform draw (the trainers' `train_task_ids`) picks every family about equally often however unequally the
    screening kept them (``--pool-balance family``)."""
    fams = {f: ids for f, ids in pool_by_family(info).items() if ids}
    most = max(len(ids) for ids in fams.values())
    return [t for ids in fams.values() for t in ids * max(1, round(most / len(ids)))]


def _exit_with_parent(parent: int) -> None:
    """A pool worker keeps running its job when the parent is killed; stop it instead (checked every 5 s)."""
    import os
    import threading

    def watch():
        while True:
            time.sleep(5)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def _train_one(job: tuple) -> tuple[str, int, list[dict], float]:
    """One (algorithm, seed) run from the shared start (a process-pool worker: one torch thread each)."""
    name, seed, args, env_kwargs, out, parent = job
    if parent is not None:
        _exit_with_parent(parent)
    torch.set_num_threads(args.threads)
    t1 = time.perf_counter()
    res = _algo(name, args, env_kwargs).train(ENV, iterations=args.iterations, seed=seed,
                                              out_dir=out / name / f"seed{seed}", init=out / "start",
                                              progress=not args.no_progress)
    return name, seed, res.history, time.perf_counter() - t1


def run(args, argv=None) -> None:
    from agents.lm.agent import LMAgent, default_checkpoint_dir

    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    init = Path(args.init) if args.init else default_checkpoint_dir()
    if not (init / "config.json").is_file():
        raise SystemExit(f"no SFT checkpoint at {init}; train one with `shopsim sft` and pass --init DIR")
    # the rendering the checkpoint was fine-tuned on (e.g. numbered results), the benchmark's turn limit
    env_kwargs = protocol_env_kwargs(init, args)
    t0 = time.perf_counter()
    info = weaken(init, out / "start", args.target, args.calib, env_kwargs, args.bisect_steps, args)
    made = {"families": info.get("families", list(FAMILIES)), "start": info.get("start", "weaken")}
    if made != {"families": list(args.families), "start": args.start}:
        raise SystemExit(f"{out / 'start'} was made for {made}, not for families={args.families} start={args.start};"
                         " use another --out")
    if args.start == "sft":
        print(f"start checkpoint: {init} as shipped [{time.perf_counter() - t0:.0f}s]")
    else:
        print(f"start checkpoint: alpha={info['alpha']:.3f}, dev success {info['calib_success']:.2f} "
              f"(SFT {info['sft_success']:.2f}) [{time.perf_counter() - t0:.0f}s]")
    if args.start == "weaken" and info["sft_success"] < args.target:
        print(f"WARNING: the SFT checkpoint's dev success {info['sft_success']:.2f} is below the target "
              f"{args.target:.2f}; it is used unweakened and the comparison starts from there")
    if args.task_pool == "screened":
        screened = screen_pool(out / "start", args, env_kwargs)
        args.pool_ids = balanced_pool(screened) if getattr(args, "pool_balance", "none") == "family" \
            else screened["pool"]
        print(f"training task pool: {len(screened['pool'])} screened tasks"
              + (f" ({len(args.pool_ids)} draws with each family's tasks repeated to equal weight)"
                 if len(args.pool_ids) != len(screened["pool"]) else ""))
    start_file = out / "start" / f"eval-{args.eval_episodes}.json"
    if start_file.is_file():
        start = json.loads(start_file.read_text())
    else:
        start_agent = LMAgent(env_id=ENV, checkpoint=out / "start")
        start = {}
        for split in ("dev", "test"):
            m = evaluate_metrics(start_agent, split, args.eval_episodes, env_kwargs, args)
            start[split] = m[f"{split}_success"]
            start.update({f"{split}/{f}": m[f"{split}_success/{f}"] for f in args.families
                          if f"{split}_success/{f}" in m})
        start_file.write_text(json.dumps(start))
    print(f"start: dev {start['dev']:.2f}, test {start['test']:.2f} ({args.eval_episodes} episodes each)")
    digest = init_digest(init)
    configs = expected_digests(args, env_kwargs)
    recorded, why = recorded_curves(Path(args.results), args, start, digest, configs) if args.results else ([], "")
    if args.results:
        print(f"reuse: {why}")
    found = _curves(out, start, args.families)
    stale = _stale_runs(found, configs)
    if stale:
        asked = [(a, sd) for a, sd in stale if a in args.algos and sd in args.seeds and not args.report_only]
        where = ", ".join(f"{out / a / f'seed{sd}'}" for a, sd in (asked or stale))
        if asked:
            raise SystemExit(f"{where}: trained under other settings of the algorithm than this benchmark now uses; "
                             "delete those folders to train them again, or use another --out")
        print(f"not summarised (trained under other settings of the algorithm): {where}")
    here = {(c["algo"], c["seed"]) for c in found} - set(stale)
    recorded = [c for c in recorded if (c["algo"], c["seed"]) not in here]  # a run in OUT is the newer copy
    finished = {(c["algo"], c["seed"]) for c in recorded if c["iteration"] == args.iterations}
    parent = os.getpid() if args.jobs > 1 else None
    jobs = [] if args.report_only else [(name, seed, args, env_kwargs, out, parent)
                                        for seed in args.seeds for name in args.algos if (name, seed) not in finished]
    if args.jobs > 1:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(args.jobs, mp_context=mp.get_context("spawn")) as pool:
            done = list(pool.map(_train_one, jobs))
    else:
        done = [_train_one(j) for j in jobs]
    for name, seed, history, secs in done:
        print(f"{name} seed {seed}: test {start['test']:.2f} -> {history[-1].get('test_success', float('nan')):.2f}"
              f", dev {start['dev']:.2f} -> {history[-1].get('dev_success', float('nan')):.2f}"
              f" ({sum(int(r.get('rollouts', 0)) for r in history)} rollouts, {secs:.0f}s)")
    curves = [c for c in _curves(out, start, args.families) if (c["algo"], c["seed"]) not in stale] + recorded
    rows = _write(out, curves, start, args)
    import shlex

    command = "python -m benchmarks.learning_lm " + shlex.join(sys.argv[1:] if argv is None else argv)
    if args.results and rows:
        write_results(Path(args.results), rows, start, args, time.perf_counter() - t0, command, out, curves=curves,
                      digest=digest)
        md_path, json_path, _ = result_paths(Path(args.results), args.start)
        print(f"wrote {md_path} and {json_path.name}")
    if getattr(args, "standard_results", None):
        standard_rows(out, args, Path(args.standard_results), command, digest)


#: the entries whose first seed's checkpoint ships beside its standard results file (the main job re-checks it live)
LIVE_CHECKPOINTS = ("grpo",)


def standard_rows(out: Path, args, results_dir: Path, command: str, digest: str) -> list[dict]:
    """The standard tier's Shopping rows from this benchmark's runs (`shopsim.app.bench.import_trained`): every
    algorithm whose runs of all ``--seeds`` finished in `out` gets ``results_dir/Shopping-v0/<algo>.json``, its
    final checkpoints evaluated on the leaderboard's protocol. The rows are trained once, here, and rendered both in
    this table and on the leaderboard (``shopsim bench --tier standard`` does not train them)."""
    from shopsim.app.bench import import_trained

    written = []
    for name in [a for a in args.algos if a in ALGOS]:  # the seed papers' arms are not leaderboard rows
        dirs = [out / name / f"seed{sd}" for sd in args.seeds]
        if not all(_finished(d, args.iterations) for d in dirs):
            print(f"standard row {name}: not every seed has finished {args.iterations} iterations; not written")
            continue
        budget = {"mode": "standard", "source": "benchmarks.learning_lm", "iterations": args.iterations,
                  "train_seeds": list(args.seeds), "init_sha256": digest, "protocol": protocol_of(args)}
        rec = import_trained(ENV, name, dirs, results_dir, budget=budget, command=command, algorithm=name,
                             keep_checkpoint=name in LIVE_CHECKPOINTS, progress=not args.no_progress)
        print(f"standard row {name}: success {rec['metrics']['success_rate']['mean']:.3f}")
        written.append(rec)
    return written


def _finished(run_dir: Path, iterations: int) -> bool:
    """Whether a run folder holds a final checkpoint after `iterations` iterations (its metrics.csv's last row)."""
    path = run_dir / "metrics.csv"
    if not (run_dir / "checkpoint").is_dir() or not path.is_file():
        return False
    with path.open() as f:
        last = list(csv.DictReader(f))[-1:]
    return bool(last) and int(float(last[0]["iteration"])) >= iterations


def expected_digests(args, env_kwargs: dict, algos=ARMS) -> dict[str, str]:
    """The config digest (`baselines.core.loop.config_digest`) of each algorithm's run under this protocol."""
    from baselines.core.loop import config_digest

    return {name: config_digest(_algo(name, args, env_kwargs).run_identity(ENV, 0)["config"]) for name in algos}


def _pretrain_rollouts(pre: dict, config: dict) -> int:
    """Episodes a run sampled before its first iteration (value pre-training, mid-training's generation), from its
    ``pretrain.json``; files written before that key existed are read from the stage's own counts."""
    if "pretrain_rollouts" in pre:
        return int(pre["pretrain_rollouts"])
    for key in ("gen_candidates", "offline_rollouts"):  # mid-training's generation, BASIS's offline table
        if key in pre:
            return int(pre[key])
    if pre.get("pretrain_steps"):  # value pre-training: value_pretrain_batches + 1 held-out batch
        return (int(config.get("value_pretrain_batches", 2)) + 1) * int(config["group_size"]) * int(
            config["tasks_per_iter"])
    return 0


def _run_info(run_dir: Path) -> dict:
    """A run's config digest, the rollouts it sampled before RL and (mid-training) the examples stage 1 kept."""
    from baselines.core.loop import config_digest

    config = json.loads((run_dir / "run.json").read_text())["config"] if (run_dir / "run.json").is_file() else None
    pre = json.loads((run_dir / "pretrain.json").read_text()) if (run_dir / "pretrain.json").is_file() else {}
    return {"config": config_digest(config) if config is not None else None,
            "pre_rollouts": _pretrain_rollouts(pre, config or {}),
            "gen_kept": pre.get("gen_kept")}


def _stale_runs(curves: list[dict], configs: dict[str, str]) -> list[tuple[str, int]]:
    """(algorithm, seed) of the runs in `curves` whose config digest is not the one the benchmark now builds (or
    that record none)."""
    return sorted({(c["algo"], c["seed"]) for c in curves
                   if c["algo"] != "start" and c.get("config") != configs.get(c["algo"])})


def _curves(out: Path, start: dict, families=FAMILIES) -> list[dict]:
    """Every finished evaluation of every run under `out` (runs of earlier invocations included). ``rollouts``
    counts every episode the run sampled up to that evaluation, those before RL (``pre_rollouts``) included."""
    per_family = [f"test_success/{f}" for f in families]
    asked = ["test_asked", *(f"test_asked/{f}" for f in families)]  # ARC's asked share, where the env reports it
    curves = [{"algo": "start", "seed": -1, "iteration": 0, "dev_success": start["dev"], "test_success": start["test"],
               **{k: start.get(k.replace("_success", "")) for k in per_family}, "rollouts": 0,
               "train_s": 0.0}]
    for name in ARMS:
        for path in sorted((out / name).glob("seed*/metrics.csv")):
            info = _run_info(path.parent)
            used, secs = info["pre_rollouts"], 0.0
            with path.open() as f:
                for row in csv.DictReader(f):
                    used += int(float(row.get("rollouts") or 0))
                    secs += sum(float(row.get(k) or 0) for k in ("rollout_s", "update_s"))
                    if row.get("dev_success") not in (None, ""):
                        curves.append({"algo": name, "seed": int(path.parent.name[4:]),
                                       "iteration": int(row["iteration"]),
                                       "dev_success": float(row["dev_success"]),
                                       "test_success": float(row["test_success"]),
                                       **{k: float(row[k]) if row.get(k) not in (None, "") else None
                                          for k in per_family},
                                       **{k: float(row[k]) for k in asked if row.get(k) not in (None, "")},
                                       "rollouts": used, "train_s": round(secs, 1), **info})
    return curves


def _fmt_stat(st: dict) -> str:
    """``+0.12 [+0.05, +0.19]`` (mean gain and its 95% t-interval over seeds)."""
    if st["ci95"] is None:
        return f"{st['mean']:+.2f}"
    return f"{st['mean']:+.2f} [{st['ci95'][0]:+.2f}, {st['ci95'][1]:+.2f}]"


def summarise(curves: list[dict], start: dict, iterations: int, families=FAMILIES) -> list[dict]:
    """One row per algorithm with finished runs: the test-success gain over the start, final − start per seed,
    its mean and 95% Student-t interval over seeds (`shopsim.leaderboard.metrics.stat`), overall and per family,
    and whether every seed gained. The start is one checkpoint evaluated once on the same episodes, so each seed's
    gain is a paired difference. Also, where every seed has them: ``late_gain_test``, the final test success less
    the evaluation before it (does a run still climb at the end?), and ``asked_test`` / ``asked_test_family``, the
    share of final test episodes that asked the customer a question."""
    from shopsim.leaderboard.metrics import stat

    rows = []
    algos = [a for a in dict.fromkeys(c["algo"] for c in curves) if a != "start"]
    for algo in algos:
        finals = sorted((c for c in curves if c["algo"] == algo and c["iteration"] == iterations),
                        key=lambda c: c["seed"])
        if not finals:
            continue
        gain = stat([c["test_success"] - start["test"] for c in finals])
        fam = {}
        for f in families:
            vals = [c[f"test_success/{f}"] - start[f"test/{f}"] for c in finals
                    if c.get(f"test_success/{f}") is not None and start.get(f"test/{f}") is not None]
            fam[f] = stat(vals) if vals else None
        rows.append({"algo": algo, "seeds": [c["seed"] for c in finals], "rollouts": finals[0]["rollouts"],
                     "start_test": start["test"], "start_dev": start["dev"],
                     "final_test": stat([c["test_success"] for c in finals]),
                     "final_dev": stat([c["dev_success"] for c in finals]),
                     "gain_test": gain, "all_seeds_gain": all(g > 0 for g in gain["per_seed"]),
                     "gain_test_family": fam, "pre_rollouts": finals[0].get("pre_rollouts") or 0,
                     **({"gen_kept": [c["gen_kept"] for c in finals]}
                        if any(c.get("gen_kept") is not None for c in finals) else {}),
                     **_late_and_asked(curves, finals, iterations, families)})
    return rows


def _late_and_asked(curves: list[dict], finals: list[dict], iterations: int, families) -> dict:
    """`summarise`'s optional figures of one algorithm's final evaluations (see there)."""
    from shopsim.leaderboard.metrics import stat

    out: dict = {}
    late = []
    for c in finals:
        before = [e for e in curves
                  if e["algo"] == c["algo"] and e["seed"] == c["seed"] and e["iteration"] < iterations]
        if before:
            late.append(c["test_success"] - max(before, key=lambda e: e["iteration"])["test_success"])
    if finals and len(late) == len(finals):
        out["late_gain_test"] = stat(late)
    if finals and all(c.get("test_asked") is not None for c in finals):
        out["asked_test"] = stat([c["test_asked"] for c in finals])
        out["asked_test_family"] = {f: stat([c[f"test_asked/{f}"] for c in finals]) for f in families
                                    if all(c.get(f"test_asked/{f}") is not None for c in finals)}
    return out


def row_notes(rows: list[dict]) -> list[str]:
    """One line per algorithm whose runs sampled episodes before RL, or whose mid-training kept nothing (that seed
    is then plain GRPO from the start), so a reader does not take such a row for what it is not."""
    notes = []
    for r in rows:
        parts = []
        if r.get("pre_rollouts"):
            parts.append(f"{r['pre_rollouts']} of its {r['rollouts']} rollouts were sampled before RL "
                         f"({PRE_STAGE.get(base_algo(r['algo']), 'a stage before training')})")
        if "gen_kept" in r:
            kept = r["gen_kept"]
            parts.append(f"stage 1 kept {' / '.join(str(k) for k in kept)} examples (seeds "
                         f"{' '.join(map(str, r['seeds']))})")
            empty = [sd for sd, k in zip(r["seeds"], kept, strict=True) if not k]
            if empty:
                parts.append(f"**kept nothing on seed {', '.join(map(str, empty))}: that run is plain GRPO**")
        if parts:
            notes.append(f"- {r['algo']}: " + "; ".join(parts) + ".")
    return notes


def summary_table(rows: list[dict], families=FAMILIES) -> list[str]:
    """The markdown table of `summarise`'s rows."""
    fams = " | ".join(f"gain {f}" for f in families)
    lines = [f"| algo | seeds | rollouts | test start | test final | test gain [95% CI] | gain per seed | every seed "
             f"gains | dev start → final | {fams} |",
             "|---|---|---|---|---|---|---|---|---|" + "---|" * len(families)]
    for r in rows:
        per = " | ".join(_fmt_stat(r["gain_test_family"][f]) if r["gain_test_family"].get(f) else "–"
                         for f in families)
        lines.append(
            f"| {r['algo']} | {len(r['seeds'])} | {r['rollouts']} | {r['start_test']:.2f} | "
            f"{r['final_test']['mean']:.2f} | {_fmt_stat(r['gain_test'])} | "
            f"{' '.join(f'{g:+.2f}' for g in r['gain_test']['per_seed'])} | "
            f"{'yes' if r['all_seeds_gain'] else 'no'} | {r['start_dev']:.2f} → {r['final_dev']['mean']:.2f} | {per} |")
    return lines



#: the reference algorithm of the table of record's comparisons (`versus_reference`)
REFERENCE_ALGO = "grpo"
#: the table of record's targets (start ``sft``): GRPO's overall and bundle test gain, and seeds per algorithm
TARGET_GAIN, TARGET_BUNDLE_GAIN, TARGET_SEEDS = 0.05, 0.08, 3


def compare_rows(rows: list[dict]) -> list[dict]:
    """Every pair of algorithms (in row order) with at least two seeds in common: the per-seed difference of their
    test gains, seed by seed (each pair of runs shares its seed index and was evaluated on the same episodes), its
    mean and 95% Student-t interval (`stat`), and which algorithm the interval favours (None when it contains 0).
    Two gains from the same start differ exactly as their final successes do, so the start cancels."""
    from shopsim.leaderboard.metrics import stat

    out = []
    for i, a in enumerate(rows):
        ga = dict(zip(a["seeds"], a["gain_test"]["per_seed"], strict=True))
        for b in rows[i + 1:]:
            gb = dict(zip(b["seeds"], b["gain_test"]["per_seed"], strict=True))
            common = sorted(set(ga) & set(gb))
            if len(common) < 2:
                continue
            d = stat([ga[s] - gb[s] for s in common])
            lo, hi = d["ci95"]
            better = a["algo"] if lo > 0 else b["algo"] if hi < 0 else None
            out.append({"a": a["algo"], "b": b["algo"], "seeds": common, "diff": d, "separated": better is not None,
                        "better": better})
    return out


def versus_reference(pairs: list[dict], reference: str = REFERENCE_ALGO) -> dict[str, list[str]]:
    """Which algorithms beat `reference`, lose to it, or cannot be told from it (`compare_rows`' intervals)."""
    out: dict[str, list[str]] = {"beat": [], "lose": [], "indistinguishable": []}
    for p in pairs:
        if reference not in (p["a"], p["b"]):
            continue
        other = p["b"] if p["a"] == reference else p["a"]
        key = "indistinguishable" if p["better"] is None else "beat" if p["better"] == other else "lose"
        out[key].append(other)
    return out


def targets(rows: list[dict], reference: str = REFERENCE_ALGO) -> list[dict]:
    """The table of record's targets, each with its measured value and whether it holds: the reference's mean test
    gain ≥ `TARGET_GAIN`, every seed positive, its 95% interval above 0, its bundle gain ≥ `TARGET_BUNDLE_GAIN`, and
    `TARGET_SEEDS` seeds for every algorithm."""
    ref = next((r for r in rows if r["algo"] == reference), None)
    g = ref["gain_test"] if ref else None
    bundle = (ref["gain_test_family"].get("bundle") if ref else None) or None
    missing = [a for a in ALGOS if a not in {r["algo"] for r in rows}]
    few = [f"{r['algo']} ({len(r['seeds'])})" for r in rows if r["algo"] in ALGOS and len(r["seeds"]) < TARGET_SEEDS]
    few += [f"{a} (0)" for a in missing]
    return [
        {"target": f"{reference} test gain ≥ +{TARGET_GAIN:.2f}", "value": g["mean"] if g else None,
         "met": bool(g and g["mean"] >= TARGET_GAIN)},
        {"target": f"every {reference} seed gains", "value": g["per_seed"] if g else None,
         "met": bool(g and all(v > 0 for v in g["per_seed"]))},
        {"target": f"{reference}'s 95% interval above 0", "value": g["ci95"] if g else None,
         "met": bool(g and g["ci95"] is not None and g["ci95"][0] > 0)},
        {"target": f"{reference} bundle gain ≥ +{TARGET_BUNDLE_GAIN:.2f}", "value": bundle["mean"] if bundle else None,
         "met": bool(bundle and bundle["mean"] >= TARGET_BUNDLE_GAIN)},
        {"target": f"every algorithm has {TARGET_SEEDS} seeds", "value": few or "all",
         "met": not few},
    ]


def comparison_lines(rows: list[dict], pairs: list[dict], checks: list[dict] | None) -> list[str]:
    """The markdown of `compare_rows`, `versus_reference` and (table of record) `targets`."""
    lines = []
    if checks is not None:
        lines += ["## Targets", "", "| target | measured | met |", "|---|---|---|"]
        for t in checks:
            v = t["value"]
            shown = (f"{v:+.3f}" if isinstance(v, float) else
                     f"[{v[0]:+.3f}, {v[1]:+.3f}]" if isinstance(v, list) and len(v) == 2 and "interval" in t["target"]
                     else " ".join(f"{x:+.3f}" for x in v) if isinstance(v, list) and v and isinstance(v[0], float)
                     else ", ".join(v) if isinstance(v, list) else "–" if v is None else str(v))
            lines.append(f"| {t['target']} | {shown} | {'**yes**' if t['met'] else 'no'} |")
        lines.append("")
    if pairs:
        vs = versus_reference(pairs)
        sep = sum(p["separated"] for p in pairs)
        lines += ["## Algorithms compared", "",
                  f"Difference of two algorithms' test gains, seed by seed (the same seed index, the same evaluation "
                  f"episodes), with its 95% Student-t interval; a pair is separated when the interval excludes 0. "
                  f"**{sep} of {len(pairs)} pairs are separated** at this budget.", ""]
        if any(REFERENCE_ALGO in (p["a"], p["b"]) for p in pairs):
            lines += [f"- beat {REFERENCE_ALGO}: {', '.join(vs['beat']) or 'none'}",
                      f"- lose to {REFERENCE_ALGO}: {', '.join(vs['lose']) or 'none'}",
                      f"- indistinguishable from {REFERENCE_ALGO}: {', '.join(vs['indistinguishable']) or 'none'}", ""]
        lines += ["| a | b | seeds | gain a − gain b [95% CI] | separated |", "|---|---|---|---|---|"]
        for p in pairs:
            lines.append(f"| {p['a']} | {p['b']} | {len(p['seeds'])} | {_fmt_stat(p['diff'])} | "
                         f"{'**' + p['better'] + '**' if p['better'] else 'no'} |")
        lines.append("")
    return lines


#: the results files of each start: the table of record starts from the shipped agent
RESULT_STEMS = {"sft": "learning_lm", "weaken": "learning_lm_weaken"}
#: each start's protocol, the default of every option not given on the command line: from the shipped agent the
#: table of record's setting (docs/training.md, "The table of record"), from the weakened start the one its table
#: was measured under
START_DEFAULTS = {
    "sft": {"iterations": 16, "rollouts": 256, "group_size": 8, "eval_episodes": 400, "eval_every": 8,
            "temperature": 1.0, "top_p": 0.8, "minibatches": 1, "lr": 1e-4, "reward_scheme": "strict",
            "negative_advantage_scale": 0.25},
    "weaken": {"iterations": 20, "rollouts": 32, "group_size": 8, "eval_episodes": 200, "eval_every": 10,
               "temperature": 0.5, "top_p": 1.0, "minibatches": 4, "lr": 1e-4, "reward_scheme": "loose",
               "negative_advantage_scale": 1.0},
}


def result_paths(directory: Path, start: str) -> tuple[Path, Path, Path]:
    """``(table .md, figures .json, curves .csv)`` of `start`'s table in `directory`."""
    stem = RESULT_STEMS[start]
    return directory / f"{stem}.md", directory / f"{stem}.json", directory / f"{stem}_curves.csv"


#: the options that define a run of the protocol; runs recorded under other values are never reused
PROTOCOL_KEYS = ("families", "start", "target", "iterations", "rollouts", "group_size", "minibatches", "lr",
                 "temperature", "max_new_tokens", "max_turns", "eval_episodes", "task_pool", "screen_tasks",
                 "screen_samples", "top_p", "pool_balance", "kl_coef", "lr_warmup", "lr_decay",
                 "loss_agg", "reward_scheme", "greedy_failed_share", "negative_advantage_scale",
                 "argmax_negative_scale", "success_anchor_coef")
#: protocol options added after tables were recorded, at the value those tables were measured under
PROTOCOL_DEFAULTS = {"task_pool": "all", "screen_tasks": None, "screen_samples": None, "top_p": 1.0,
                     "pool_balance": "none", "kl_coef": None, "lr_warmup": 0, "lr_decay": "constant",
                     "loss_agg": None, "reward_scheme": "loose", "greedy_failed_share": 0.0,
                     "negative_advantage_scale": 1.0, "argmax_negative_scale": 1.0,
                     "success_anchor_coef": 0.0}


def protocol_of(args) -> dict:
    out = {k: getattr(args, k, PROTOCOL_DEFAULTS.get(k)) for k in PROTOCOL_KEYS}
    if out["task_pool"] != "screened":  # the screening options mean nothing without a screened pool
        out["screen_tasks"] = out["screen_samples"] = None
        out["pool_balance"] = "none"
    return out


def init_digest(init: Path) -> str:
    """sha256 (16 hex digits) of the start's source weights: recorded runs are reused only from the same ones."""
    from agents.lm.model import weights_digest

    return weights_digest(init)


def read_curves(path: Path) -> list[dict]:
    """The rows of a recorded ``learning_lm*_curves.csv`` with their types back (empty cells as None)."""
    ints = ("seed", "iteration", "rollouts", "pre_rollouts", "gen_kept")
    with path.open() as f:
        return [{k: (None if v == "" else v if k in ("algo", "config") else int(float(v)) if k in ints else float(v))
                 for k, v in row.items()} for row in csv.DictReader(f)]


def recorded_curves(directory: Path, args, start: dict, digest: str,
                    configs: dict[str, str] | None = None) -> tuple[list[dict], str]:
    """The curve rows of the runs recorded in ``directory/learning_lm_curves.csv`` by an earlier invocation with
    ``--results directory`` (its runs' folders may be gone: another machine, a cleaned ``runs/``), and why none are
    reused when the protocol, the start's source weights or the start's evaluation differ. With `configs`
    (algorithm → `expected_digests`), a run is reused only when it was recorded under its algorithm's config
    digest now: changing an algorithm's benchmark settings retrains it instead of reporting the old runs."""
    _, meta_path, curves_path = result_paths(directory, args.start)
    if not (meta_path.is_file() and curves_path.is_file()):
        return [], "no recorded runs"
    meta = json.loads(meta_path.read_text())
    recorded = {k: meta.get("protocol", {}).get(k, PROTOCOL_DEFAULTS.get(k)) for k in PROTOCOL_KEYS}
    if recorded != json.loads(json.dumps(protocol_of(args))):
        return [], f"{meta_path} was measured under another protocol"
    if meta.get("init_sha256") != digest:
        return [], f"{meta_path} was measured from other start weights"
    if meta.get("start") != start:
        return [], f"the start evaluates differently from {meta_path}'s ({meta.get('start')} vs {start})"
    rows = [r for r in read_curves(curves_path) if r["algo"] != "start"]
    stale = _stale_runs(rows, configs) if configs is not None else []
    rows = [r for r in rows if (r["algo"], r["seed"]) not in stale]
    why = f"{len({(r['algo'], r['seed']) for r in rows})} runs recorded in {curves_path}"
    if stale:
        why += (f"; not reused, recorded under other algorithm settings: "
                f"{', '.join(f'{a} seed {sd}' for a, sd in stale)}")
    return rows, why


def _train_seconds(out: Path) -> float:
    """Rollout + update seconds of every run under `out`, summed from their metrics.csv (evaluations excluded)."""
    total = 0.0
    for path in out.glob("*/seed*/metrics.csv"):
        with path.open() as f:
            for row in csv.DictReader(f):
                total += sum(float(row.get(k) or 0) for k in ("rollout_s", "update_s"))
    return total


def write_results(directory: Path, rows: list[dict], start: dict, args, wall_s: float, command: str,
                  directory_runs: Path | None = None, curves: list[dict] | None = None,
                  digest: str | None = None, recorded: dict | None = None) -> None:
    """``learning_lm.md`` and ``learning_lm.json`` in `directory` (atomic writes): the gains table, the pairwise
    comparisons (`compare_rows`), the targets of the table of record (start ``sft``), the protocol, the command,
    commit, seeds and wall time; with `curves`, also ``learning_lm_curves.csv`` (every evaluation of every run),
    from which a later invocation with the same protocol and start reuses the finished runs. `recorded` (the JSON
    of an earlier write) keeps that measurement's command, commit, wall time and weights digest: the tables are
    re-rendered, not re-measured (`report_recorded`)."""
    from shopsim.paths import write_text_atomic

    directory.mkdir(parents=True, exist_ok=True)
    md_path, json_path, curves_path = result_paths(directory, args.start)
    protocol = {**protocol_of(args), "seeds": args.seeds}
    seeds = sorted({sd for r in rows for sd in r["seeds"]})
    train_s = sum(float(c.get("train_s") or 0) for c in curves or [] if c["algo"] != "start"
                  and c["iteration"] == args.iterations)
    meta = {"command": command, "commit": git_commit(), "seeds": seeds, "wall_s": round(wall_s, 1),
            "train_s_total": round(train_s or (_train_seconds(directory_runs) if directory_runs else 0), 1) or None,
            "init": str(args.init or "data/lm/sft"), "init_sha256": digest, "protocol": protocol, "start": start,
            "cpu_count": os.cpu_count()}
    if recorded is not None:
        meta.update({k: recorded.get(k) for k in ("command", "commit", "wall_s", "train_s_total", "init",
                                                    "init_sha256")},
                    cpu_count=recorded.get("cpu_count") or os.cpu_count())
        command, wall_s = meta["command"], float(meta["wall_s"] or 0)
    main = [r for r in rows if r["algo"] in ALGOS]
    arms = [r for r in rows if r["algo"] not in ALGOS]
    pairs = compare_rows(main)  # the arms are compared with their own references (benchmarks.seed_claims)
    checks = targets(rows) if args.start == "sft" else None
    meta.update({"pairs": pairs, "pairs_separated": sum(p["separated"] for p in pairs),
                 "versus_" + REFERENCE_ALGO: versus_reference(pairs), **({"targets": checks} if checks else {})})
    if curves:
        import io

        buf = io.StringIO()
        fields = list(dict.fromkeys(k for c in curves for k in c))
        w = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
        w.writeheader()
        w.writerows(curves)
        write_text_atomic(curves_path, buf.getvalue())
    write_text_atomic(json_path, json.dumps({**meta, "rows": rows}, indent=2, default=float))
    fam = ", ".join(args.families)
    md = ["# Learning benchmark: Shopping LM algorithms", "",
          "Generated by `benchmarks/learning_lm.py`; do not edit by hand.", "",
          f"- command: `{command}`", f"- commit: `{meta['commit']}`", f"- seeds: {', '.join(map(str, seeds))}",
          f"- wall time: {wall_s / 60:.1f} min (this invocation; finished runs found in the output folder or "
          "recorded in learning_lm_curves.csv are reused)"
          + (f"; rollout + update time of all runs: {meta['train_s_total'] / 60:.0f} min"
             if meta["train_s_total"] else ""),
          f"- machine: {meta['cpu_count']} CPU cores, shared by the runs that ran at the same time (times are "
          "indicative); the seeds of each algorithm are in its row",
          f"- families: {fam}; start: `{args.start}`"
          + (f" (weakened to ≈{args.target:.2f} dev success)" if args.start == "weaken" else ""),
          f"- budget per run: {args.iterations} iterations × {args.rollouts} rollouts, lr {args.lr}, rollout "
          f"temperature {args.temperature}; evaluation: greedy, the first {args.eval_episodes} test (and dev) tasks "
          "of the families, the same episodes for the start and every run",
          "- protocol (`--` options): " + ", ".join(f"{k.replace('_', '-')} {v}" for k, v in protocol.items()
                                                  if k not in ("families", "start", "seeds")), "",
          "Gain = final test success − the start's, per seed; the interval is the 95% Student-t interval of the "
          "mean over seeds.", "", *summary_table(main, args.families), ""]
    if arms:
        md += ["The seed papers' arms (`VARIANTS`), under the same protocol; their claims are decided in "
               "`seed_claims.md`:", "", *summary_table(arms, args.families), ""]
    notes = row_notes(rows)
    if notes:
        md += ["Rollouts count every episode a run sampled, those before its first RL iteration included:", "",
               *notes, ""]
    md += comparison_lines(rows, pairs, checks)
    write_text_atomic(md_path, "\n".join(md))


def report_recorded(directory: Path, starts=None) -> list[Path]:
    """Re-render the tables recorded in `directory` (``--report-only --results DIR``) from their own files: each
    start's ``learning_lm*.json`` (protocol, start evaluation, command, commit) and ``learning_lm*_curves.csv``
    (every evaluation of every run). Nothing is trained or evaluated; the figures are those measured. Returns the
    tables written; a start with no recorded files is skipped (an error when none is found)."""
    from types import SimpleNamespace

    written = []
    for start_kind in starts or RESULT_STEMS:
        md_path, json_path, curves_path = result_paths(directory, start_kind)
        if not (json_path.is_file() and curves_path.is_file()):
            continue
        meta = json.loads(json_path.read_text())
        protocol = {k: meta.get("protocol", {}).get(k, PROTOCOL_DEFAULTS.get(k)) for k in PROTOCOL_KEYS}
        args = SimpleNamespace(**protocol, seeds=meta.get("protocol", {}).get("seeds", meta.get("seeds")),
                               init=meta.get("init"))
        args.start = start_kind
        curves = read_curves(curves_path)
        rows = summarise([c for c in curves if c["algo"] != "start"], meta["start"], args.iterations, args.families)
        write_results(directory, rows, meta["start"], args, 0.0, "", curves=curves, recorded=meta)
        written.append(md_path)
    if not written:
        raise SystemExit(f"no recorded tables in {directory} (learning_lm.json with learning_lm_curves.csv); "
                         "run the benchmark with --results first")
    return written


def _write(out: Path, curves: list[dict], start: dict, args) -> list[dict]:
    with (out / "curves.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for c in curves for k in c)))
        w.writeheader()
        w.writerows(curves)
    rows = summarise(curves, start, args.iterations, args.families)
    if rows:
        (out / "summary.json").write_text(json.dumps(rows, indent=2, default=float))
        lines = summary_table(rows, args.families) + ["", *row_notes(rows)]
        (out / "summary.md").write_text("\n".join(lines) + "\n")
        print("\n".join(lines))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
        for ax, split in zip(axes, ("dev", "test"), strict=False):
            for algo in ARMS:
                its = sorted({c["iteration"] for c in curves if c["algo"] == algo})
                if not its:
                    continue
                ys = [np.mean([c[f"{split}_success"] for c in curves if c["algo"] == algo and c["iteration"] == i])
                      for i in its]
                ax.plot([0, *its], [start[split], *ys], marker="o", label=algo)
            ax.set_title(f"{split} success ({' + '.join(args.families)})")
            ax.set_xlabel("iteration")
        axes[0].set_ylabel("success rate (mean over seeds)")
        axes[1].legend()
        fig.tight_layout()
        fig.savefig(out / "curves.png", dpi=120)
    except Exception as exc:  # plotting must not lose the numbers
        print(f"plot skipped: {exc}")
    return rows


def protocol_env_kwargs(init: Path, args) -> dict:
    """The env options of every run of the protocol: the rendering the checkpoint at `init` was fine-tuned on (e.g.
    numbered results), the turn limit, and the reward scheme (`--reward-scheme`)."""
    from agents.registry import manifest_env_kwargs

    out = {**manifest_env_kwargs(init), "max_turns": args.max_turns}
    scheme = getattr(args, "reward_scheme", "loose")
    if scheme != "loose":
        out["reward_scheme"] = scheme
    return out


def add_protocol_arguments(p) -> None:
    """The options of the shared protocol (start, budget, rollouts, limits) that `learning_lm` and the seed
    methods' checks (`benchmarks/repro_*.py`) all take, with the same defaults, so their runs stay comparable."""
    p.add_argument("--minibatches", type=int, default=4,
                   help="optimizer steps per iteration for the clipped-surrogate methods (PPO: 4)")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--temperature", type=float, default=0.5,
                   help="rollout sampling temperature (the weakened start succeeds on ~5%% of dev tasks at 1.0, "
                        "21%% at 0.7, 27%% at 0.5; greedy 32%%)")
    p.add_argument("--top-p", type=float, default=1.0,
                   help="nucleus mass of the rollouts' draws (1.0: off); log-probs stay those of the whole "
                        "distribution")
    p.add_argument("--kl-coef", type=float, default=None,
                   help="β of the KL penalty to the start for every algorithm with one (None: each algorithm's own "
                        "default; WAPO has none)")
    p.add_argument("--lr-warmup", type=int, default=0,
                   help="iterations of linear learning-rate warm-up at the start of every run (0: none)")
    p.add_argument("--lr-decay", choices=("constant", "linear", "cosine"), default="constant",
                   help="learning rate after the warm-up: held, or decayed to zero by the end of the run")
    p.add_argument("--loss-agg", default=None,
                   choices=("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"),
                   help="how every algorithm averages its per-token policy loss (None: each algorithm's own; GRPO's "
                        "is seq-mean-token-mean, which weighs a token of a short episode more than one of a long one)")
    p.add_argument("--reward-scheme", choices=("loose", "strict"), default="loose",
                   help="the Shopping env's reward: 'loose', WebShop's partial credit for a purchase that misses "
                        "some constraints; 'strict', 1 only when every constraint holds, i.e. the success the "
                        "table counts")
    p.add_argument("--greedy-failed-share", type=float, default=0.0,
                   help="share of every iteration's tasks drawn among those the current policy fails greedily (each "
                        "candidate played once with greedy decoding first; 0: tasks as drawn)")
    p.add_argument("--negative-advantage-scale", type=float, default=1.0,
                   help="factor on every negative advantage of every algorithm (1: as published; 0: only rollouts "
                        "better than their baseline are reinforced; `negative_advantage_scale` in the core config)")
    p.add_argument("--argmax-negative-scale", type=float, default=1.0,
                   help="factor on the negative advantage of every token that was the arg-max of its distribution "
                        "(1: as published; 0: a failed rollout is blamed on its sampled deviations from the arg-max "
                        "only; `argmax_negative_scale` in the core config)")
    p.add_argument("--success-anchor-coef", type=float, default=0.0,
                   help="λ of a log-likelihood term on the arg-max tokens of every successful rollout, all-success "
                        "groups included (0: off; `success_anchor_coef` in the core config)")
    p.add_argument("--eval-sampled", action="store_true",
                   help="at every evaluation also play the same episodes once at the rollout sampling setting "
                        "(metrics.csv: dev_sampled_success, test_sampled_success and per family); not a protocol "
                        "option, it changes no run")
    p.add_argument("--critic-lr", type=float, default=1e-4)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--max-turns", type=int, default=15)
    p.add_argument("--target", type=float, default=0.30, help="dev success the start is weakened to")
    p.add_argument("--calib", type=int, default=40, help="dev tasks used to calibrate the weakening")
    p.add_argument("--bisect-steps", type=int, default=6)
    p.add_argument("--value-pretrain-steps", type=int, default=20)
    p.add_argument("--max-gen-batches", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="torch threads per run")


def parse_args(argv=None) -> argparse.Namespace:
    """The command line, with every protocol option not given set to the ``--start``'s own (`START_DEFAULTS`) and
    ``--quick``'s sizes applied."""
    p = argparse.ArgumentParser(description="Shopping LM learning benchmark (see module docstring)")
    p.add_argument("--init", default=None, help="SFT checkpoint folder (default data/lm/sft)")
    p.add_argument("--out", default="runs/learning_lm")
    p.add_argument("--teacher", default=None,
                   help="TrOPD's teacher (default --init, the unweakened checkpoint; e.g. data/lm/sft-small)")
    p.add_argument("--algos", nargs="+", default=list(ALGOS), choices=ARMS, metavar="ARM",
                   help=f"rows to train: algorithms ({', '.join(ALGOS)}) or the seed papers' arms "
                        f"({', '.join(VARIANTS)}); default every algorithm")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--iterations", type=int)
    p.add_argument("--rollouts", type=int, help="rollouts per iteration (the budget unit)")
    p.add_argument("--group-size", type=int)
    add_protocol_arguments(p)
    p.add_argument("--eval-episodes", type=int,
                   help="test (and dev) tasks per evaluation, the families interleaved")
    p.add_argument("--eval-every", type=int)
    p.add_argument("--jobs", type=int, default=1, help="(algorithm, seed) runs in parallel processes")
    p.add_argument("--families", default="all",
                   help="task families trained and evaluated, comma-separated, or 'all' (default %(default)s)")
    p.add_argument("--start", choices=tuple(RESULT_STEMS), default="sft",
                   help="sft: --init as shipped, untouched (the table of record, learning_lm.{md,json}); weaken: "
                        "interpolate --init toward a random model until dev success ≈ --target "
                        "(learning_lm_weaken.{md,json})")
    p.add_argument("--task-pool", choices=("screened", "all"), default="all",
                   help="training tasks: 'screened' draws them from train tasks the start both solves and fails "
                        "(`screen_pool`), 'all' from the whole train split of the families")
    p.add_argument("--screen-tasks", type=int, default=64, help="train tasks screened per family")
    p.add_argument("--screen-samples", type=int, default=4, help="rollouts per screened task")
    p.add_argument("--pool-balance", choices=("none", "family"), default="none",
                   help="'family': draw each family's screened tasks equally often (`balanced_pool`); 'none': "
                        "every screened task equally often")
    p.add_argument("--num-envs", type=int, default=None,
                   help="env copies of rollouts and evaluations (default: 64 from sft, 8 from weaken)")
    p.add_argument("--results", default=None,
                   help="also write learning_lm.md and learning_lm.json (gains with 95%% intervals, command, commit, "
                        "seeds, wall time) into this folder, e.g. docs/results")
    p.add_argument("--standard-results", default=None,
                   help="also write the standard tier's Shopping rows from these runs, e.g. data/results/standard "
                        "(every algorithm whose --seeds all finished; their checkpoints evaluated on the "
                        "leaderboard's protocol)")
    p.add_argument("--report-only", action="store_true",
                   help="train nothing. With --results DIR: re-render the tables recorded in DIR from their own "
                        "files (both starts, or --start's), whatever the other options; without: summarise the "
                        "finished runs found in --out")
    p.add_argument("--quick", action="store_true", help="grpo + mpo, 1 seed, 3 iterations, 8 rollouts, 12 eval tasks")
    p.add_argument("--no-progress", action="store_true")
    # bundle episodes need up to ~25 turns (the shared default of 15 suits the find/clarify checks of repro_*)
    p.set_defaults(max_turns=40, **{k: None for k in START_DEFAULTS["sft"]})
    p.epilog = "Options of the protocol not given take the --start's own: " + "; ".join(
        f"{start}: " + ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in d.items())
        for start, d in START_DEFAULTS.items())
    a = p.parse_args(argv)
    for k, v in START_DEFAULTS[a.start].items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    if a.quick:
        a.algos, a.seeds, a.iterations, a.rollouts, a.group_size = ["grpo", "mpo"], [0], 3, 8, 4
        a.eval_episodes, a.eval_every, a.calib, a.bisect_steps, a.max_turns = 12, 1, 12, 4, 10
    from benchmarks import shopping_families

    a.families = shopping_families(p, a.families)
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.report_only and a.results:
        given = {x.split("=")[0] for x in (argv if argv is not None else sys.argv[1:])}
        for path in report_recorded(Path(a.results), [a.start] if "--start" in given else None):
            print(f"wrote {path} (from its recorded runs)")
        return 0
    run(a, argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
