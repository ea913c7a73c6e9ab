"""One GRPO iteration of the Shopping LM agent, through the previous path and the current default, in one run.

    .venv/bin/python -m benchmarks.bench_lm_rl [--quick] [--json PATH] [--threads N] [--repeats N] [--results DIR]
    .venv/bin/python -m benchmarks.bench_lm_rl --results docs/results    # the committed table

An iteration is 16 find_and_buy rollouts (2 training tasks x a group of 8, fixed task ids and seeds, the same for
both paths) followed by GRPO's update on them; the two paths take turns, one iteration each. The two paths:

* **baseline** (the path before the per-episode KV cache): the window-mode checkpoint ``data/lm/sft-window`` on
  its compact rendering, every turn re-encoding its whole prompt (``kv_cache=False``), rows that have finished
  their action decoding pad tokens until every row has (``keep_finished``), drawn with ``torch.multinomial``
  (``multinomial``), the prompts encoded in one padded forward (``prefill="batch"``), the KV cache a plain
  ``DynamicCache``, π_old recomputed by a second forward
  pass, every update row padded to the batch's longest (``micro_batch_tokens=0``) under an explicit padding mask
  (``padding_mask=True``) and every row in the update (``skip_zero_advantage_rows=False``);
* **current** (the defaults): the shipped checkpoint ``data/lm/sft`` (concat mode, ``obs_mode="terse"``), each
  episode's keys/values kept across turns (a turn encodes only what the env added; each prompt's new tokens in its
  own forward, `prefill="rows"`), one row per episode,
  length-bucketed micro-batches that run without a padding mask on the causal attention kernel, the recorded
  log-probs used as π_old, rows whose advantage is zero everywhere left out of the forward/backward passes (GRPO
  groups whose rollouts all got the same reward; the update is the same).

Printed per path, and written as JSON (current path at the top level, baseline under ``"baseline"``):

* ``rollout_s``: wall time of the 16 rollouts;
* ``update_s``: wall time of the update as GRPO runs it (π_old/advantages/optimizer step; on the current path the
  rows whose advantage is zero everywhere are skipped, so an iteration whose groups all succeeded or all failed
  runs no forward/backward at all);
* ``update_s_every_row``: the same update on the same batch and weights with every row through the
  forward/backward passes (``skip_zero_advantage_rows=False``), the path's other defaults unchanged, the fastest
  of ``--repeats`` (an as-run update that skipped nothing, such as the baseline's, is the first of them);
* ``tokens_encoded_per_turn``: tokens the model ran over per agent turn while acting (uncached prompt tokens plus
  one decoding step per generated token but the last);
* ``update_tokens_processed`` / ``update_tokens_processed_padded``: the real tokens the as-run update's
  forward/backward passes ran over, and the same with the padding of their micro-batches;
* ``update_efficiency``: the every-row update's tokens/s (the batch's real tokens over ``update_s_every_row``)
  divided by the tokens/s of a plain forward+backward of the same model over one packed batch (the same tokens in
  rows of equal length, no padding, the output layer on the same share of positions), measured in the same run,
  interleaved with the every-row updates, the fastest of ``--repeats`` + 1;
  ``update_efficiency_as_run``: the same from the as-run update (None when it skipped every row);
* ``attention_work_vs_reference``: causal attention costs a token the length of its row so far, so rows of
  length S_i carry Σ S_i² / Σ S_i of it per token against the reference's (its equal rows' width): above 1 when
  long looping concat episodes are in the batch, and the efficiency is lower for it
  (``update_row_tokens_max``: the longest row);
* ``logprob_max_abs_diff``: largest |recorded − recomputed| log-prob of a generated token, recomputing the batch
  with the trainer's forward pass;
* ``iteration_speedup`` (top level): baseline (rollout + update) / current (rollout + update), as run;
  ``iteration_speedup_every_row``: the same with ``update_s_every_row`` on both paths (conservative: it gives the
  current path no credit for skipping rows); ``*_cpu_s`` and ``iteration_speedup*_cpu``: the same in CPU time of
  the process (all its threads), which other jobs on a shared machine disturb less than the wall clock;
  ``iteration_speedup_total_every_row``: the ratio of the paths' total every-row iteration time over all their
  iterations (the medians take rollout and update from different iterations when episode lengths vary);
* ``update_s[<variant>]`` (current path): the every-row update with the defaults and with one of them turned off
  or an alternative on (``ABLATIONS``: the padding mask back on, no padding limit in the length bucketing),
  interleaved with the defaults, the fastest of ``--repeats``; so each choice is measured against the other in
  the same run;
* ``rollout_s[prefill=batch]`` (current path): the same rollouts collected again with the prompts' new tokens in
  one padded forward instead of row by row (``SamplingConfig.prefill``); ``prefill_batch_same_actions`` says
  whether they ended with the same actions (they should: each episode samples from its own stream).

With ``--results DIR`` the table goes to ``DIR/bench_lm_rl.md`` and the figures to ``DIR/bench_lm_rl.json`` beside
it (``--results docs/results``: the committed table; generated, the command, commit and wall time are in both);
without it no table is written. ``--json PATH`` writes the figures to a further file.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import time
from collections.abc import Iterator
from pathlib import Path

from shopsim.errors import ConfigError

ENV_ID = "shopsim/Shopping-v0"
ROOT = Path(__file__).resolve().parents[1]
#: the table's file name in the ``--results`` folder (its figures: the same stem, .json)
TABLE = "bench_lm_rl.md"


def _commit() -> str:
    from shopsim.leaderboard.results import git_commit

    return git_commit(ROOT)


def _grpo(fast: bool, seed: int):
    import baselines

    kw = dict(group_size=8, tasks_per_iter=2, num_envs=16, lr=1e-4, temperature=0.7, eval_episodes=0,
              task_families=("find_and_buy",))
    if not fast:  # the previous path: padded, masked full-batch updates, π_old recomputed, every row in the update
        kw.update(micro_batch_tokens=0, padding_mask=True, recompute_old_logp=True, skip_zero_advantage_rows=False)
    return baselines.make("grpo", env_id=ENV_ID, **kw)


#: the current path's update run again on the same batch and weights with every row through the passes: with its
#: defaults, and with one of them turned off
ABLATIONS = {"defaults": {}, "padding_mask=True": {"padding_mask": True},
             "micro_batch_padding=None": {"micro_batch_padding": None}}


def packed_reference(model, batch, temperature: float, repeats: int = 3, max_tokens: int = 16384,
                     warmup: bool = True) -> float:
    """Tokens/s of a plain forward+backward over the batch's real tokens packed into equal-length rows (at most
    `max_tokens` of them: a rate needs no more, and a batch of long looping episodes would take minutes), the
    fastest of `repeats` passes (after one untimed pass with `warmup`)."""
    import torch

    from baselines.core.trainer import forward_policy

    lengths = batch.attention_mask.sum(1)
    ids = torch.cat([batch.input_ids[r, : int(n)] for r, n in enumerate(lengths)])
    gen = torch.cat([batch.gen_mask[r, : int(n)] for r, n in enumerate(lengths)])
    width = max(2, int(lengths.float().mean()))
    rows = max(1, min(ids.numel(), max_tokens) // width)
    ids, gen = ids[: rows * width].view(rows, width), gen[: rows * width].view(rows, width)
    attn = torch.ones_like(ids)
    model.train(False)
    best = float("inf")
    for r in range(repeats + int(warmup)):
        t0 = time.perf_counter()
        lp, _, _ = forward_policy(model, ids, attn, temperature=temperature, positions=gen)
        lp.sum().backward()
        dt = time.perf_counter() - t0
        if r or not warmup:  # the first pass warms up the allocator
            best = min(best, dt)
    model.zero_grad(set_to_none=True)
    return ids.numel() / best


def run_path(label: str, checkpoint: Path, *, fast: bool, seed: int, iterations: int,
             repeats: int = 2) -> Iterator[None]:
    """The benchmark's iterations through one path, a generator that pauses after each iteration (so that `main`
    can alternate the two paths: the shared machine's load drifts, and running one path after the other would put
    the drift into the speedup). Its return value (``StopIteration.value``) is the path's summary dict."""
    import numpy as np
    import torch

    from baselines.core.batch import build_batch
    from baselines.core.trainer import forward_policy

    algo = _grpo(fast, seed)
    agent = algo.make_agent(ENV_ID, checkpoint, seed)
    if not fast:
        agent.kv_cache = None
        agent.sampling.keep_finished = True
        agent.sampling.multinomial = True
        agent.sampling.prefill = "batch"
    algo.setup(agent)
    env_kwargs = {**(getattr(agent, "env_kwargs", None) or {})} or None
    shown = checkpoint.relative_to(ROOT) if checkpoint.is_relative_to(ROOT) else checkpoint
    out: dict = {"checkpoint": str(shown),
                 "context_mode": agent.options["context_mode"], "env_kwargs": env_kwargs or {},
                 "kv_cache": agent.kv_cache is not None,
                 "micro_batch_tokens": algo.config.micro_batch_tokens,
                 "padding_mask": algo.config.padding_mask,
                 "recompute_old_logp": algo.config.recomputes_old_logp}
    per_it = []
    for it in range(iterations):
        rng = np.random.default_rng(seed + it)
        agent.stats.update(turns=0, encoded_tokens=0, prompt_tokens=0, new_tokens=0)
        t0, c0 = time.perf_counter(), time.process_time()
        trajs, _ = algo.collect_batch(ENV_ID, agent, it, rng, env_kwargs=env_kwargs)
        t1, c1 = time.perf_counter(), time.process_time()
        rollout_ablations = {}
        if fast:  # the same rollouts (same tasks, seeds and sampling streams) with the prompts in one padded forward
            saved_prefill, agent.sampling.prefill = agent.sampling.prefill, "batch"
            saved_stats = dict(agent.stats)
            try:
                t5 = time.perf_counter()
                again, _ = algo.collect_batch(ENV_ID, agent, it, np.random.default_rng(seed + it),
                                              env_kwargs=env_kwargs)
                rollout_ablations["rollout_s[prefill=batch]"] = time.perf_counter() - t5
            finally:
                agent.sampling.prefill = saved_prefill
                agent.stats.update(saved_stats)
            same = [t.turns[-1].action for t in again] == [t.turns[-1].action for t in trajs]
            rollout_ablations["prefill_batch_same_actions"] = float(same)
        batch = build_batch(trajs, pad_id=algo.pad_id)
        with torch.no_grad():
            lp, _, _ = forward_policy(agent.model, batch.input_ids, batch.attention_mask,
                                      temperature=algo.temperature, positions=batch.gen_mask)
        diff = float(((lp - batch.old_logp) * batch.gen_mask).abs().max())
        state = {k: v.detach().clone() for k, v in agent.model.state_dict().items()}
        opt_state = copy.deepcopy(algo.optimizer.state_dict())  # (its tensors are updated in place)

        def restore(state=state, opt_state=opt_state) -> None:  # every update here starts from the same point
            agent.model.load_state_dict(state)
            algo.optimizer.load_state_dict(opt_state)

        t2, c2 = time.perf_counter(), time.process_time()
        um = algo.update(batch, it, generator=torch.Generator().manual_seed(seed))
        t3, c3 = time.perf_counter(), time.process_time()
        tokens = float(batch.attention_mask.sum())
        lengths = batch.attention_mask.sum(1)
        # tokens the update's forward/backward passes ran over (rows with zero advantage everywhere are left out)
        steps = algo.config.minibatches * algo.config.update_epochs
        processed = um.get("tokens_processed", tokens) * steps
        processed_padded = um.get("tokens_processed_padded", float(batch.input_ids.numel())) * steps
        ref_tps = packed_reference(agent.model, batch, algo.temperature, repeats=1)
        restore()
        # the same update with every row through the passes: the path's defaults and (current path) the ablations,
        # interleaved with each other and with the reference (the shared machine's load changes within a run, so
        # the efficiency's two rates are measured under the same load), the fastest of `repeats` each. An as-run
        # update that already put every row through (the baseline skips nothing) is the first repeat of its
        # defaults.
        variants = ABLATIONS if fast else {"defaults": {}}
        timed: dict[str, float] = {}
        every_cpu = float("inf")
        every_row_tokens = None
        if not um.get("rows_skipped_zero_adv", 0.0):
            timed["defaults"], every_cpu = t3 - t2, c3 - c2
            every_row_tokens = processed
        for rep in range(repeats):
            ref_tps = max(ref_tps, packed_reference(agent.model, batch, algo.temperature, repeats=1, warmup=False))
            for name, options in variants.items():
                if name == "defaults" and rep == 0 and "defaults" in timed:
                    continue
                options = {"skip_zero_advantage_rows": False, **options}
                saved = {k: getattr(algo.config, k) for k in options}
                for k, v in options.items():
                    setattr(algo.config, k, v)
                try:
                    t4, c4 = time.perf_counter(), time.process_time()
                    m = algo.update(batch, it, generator=torch.Generator().manual_seed(seed))
                    timed[name] = min(timed.get(name, float("inf")), time.perf_counter() - t4)
                    if name == "defaults":
                        every_cpu = min(every_cpu, time.process_time() - c4)
                finally:
                    for k, v in saved.items():
                        setattr(algo.config, k, v)
                    restore()
                if name == "defaults":
                    every_row_tokens = m.get("tokens_processed", tokens) * steps
        st = agent.stats
        every_s = timed["defaults"]
        per_it.append({
            "rollout_s": t1 - t0, "update_s": t3 - t2, "update_s_every_row": every_s, "turns": st["turns"],
            # CPU time of this process (all its threads): less sensitive than wall time to the other jobs on a
            # shared machine, which slow the wall clock without adding to this process's CPU time
            "rollout_cpu_s": c1 - c0, "update_cpu_s": c3 - c2, "update_cpu_s_every_row": every_cpu,
            "tokens_encoded_per_turn": st["encoded_tokens"] / max(st["turns"], 1),
            "prompt_tokens_per_turn": st["prompt_tokens"] / max(st["turns"], 1),
            "generated_tokens_per_turn": st["new_tokens"] / max(st["turns"], 1),
            "update_tokens": tokens, "update_rows": batch.num_rows, "update_padded_tokens": batch.input_ids.numel(),
            "update_row_tokens_max": float(lengths.max()),
            # causal attention costs each token the length of the row before it: the rows' attention work per
            # token over that of the reference's equal rows (long looping concat episodes make it > 1)
            "attention_work_vs_reference": float((lengths.float() ** 2).sum() / lengths.sum())
            / max(2, int(lengths.float().mean())),
            "update_rows_skipped": um.get("rows_skipped_zero_adv", 0.0),
            "update_tokens_per_s": tokens / (t3 - t2), "reference_tokens_per_s": ref_tps,
            # the headline: every row through the passes, so the rate is a measurement of the update's passes
            "update_efficiency": every_row_tokens / every_s / ref_tps,
            # as GRPO ran it; an update that skipped every row ran no passes: no rate to measure
            "update_efficiency_as_run": processed / (t3 - t2) / ref_tps if processed else None,
            "update_tokens_processed": processed, "update_tokens_processed_padded": processed_padded,
            "update_tokens_processed_every_row": every_row_tokens,
            "logprob_max_abs_diff": diff,
            "train_success": float(np.mean([t.success for t in trajs])),
            **({f"update_s[{k}]": v for k, v in timed.items()} if fast else {}),
            **rollout_ablations,
        })
        yield
    for k in per_it[0]:
        vals = [p[k] for p in per_it if p.get(k) is not None]
        out[k] = (max(vals) if k == "logprob_max_abs_diff" else float(np.median(vals))) if vals else None
    out["iterations"] = iterations
    out["per_iteration"] = per_it
    print(f"[{label}] {out['checkpoint']} ({out['context_mode']}, kv_cache={out['kv_cache']}): "
          f"rollout {out['rollout_s']:.1f}s, update {out['update_s']:.1f}s as run "
          f"({out['update_rows_skipped']:.0f} of {out['update_rows']:.0f} rows skipped), "
          f"{out['update_s_every_row']:.1f}s with every row, "
          f"{out['tokens_encoded_per_turn']:.0f} tokens encoded/turn ({out['prompt_tokens_per_turn']:.0f}-token "
          f"prompts), update efficiency (every row) {_f(out['update_efficiency'])} x packed "
          f"fwd+bwd ({out['reference_tokens_per_s']:.0f} tok/s), |Δlogp| max {out['logprob_max_abs_diff']:.1e}, "
          f"train success {out['train_success']:.2f}", flush=True)
    return out


def _f(x) -> str:
    return "—" if x is None else f"{x:.2f}"


def _total(path: dict) -> float:
    """Rollout + every-row update time summed over a path's iterations."""
    return sum(p["rollout_s"] + p["update_s_every_row"] for p in path["per_iteration"])


def write_table(res: dict, path: Path, command: str) -> None:
    from shopsim.paths import write_text_atomic

    b = res["baseline"]
    rows = [("checkpoint", "checkpoint", "{}"), ("context mode", "context_mode", "{}"),
            ("env options", "env_kwargs", "{}"), ("rollout (s)", "rollout_s", "{:.1f}"),
            ("update (s), as run (GRPO's zero-advantage rows skipped where the path does)", "update_s", "{:.1f}"),
            (f"update (s), every row through the passes (fastest of {res['repeats']})", "update_s_every_row",
             "{:.1f}"),
            ("rollout / update as run / update every row, CPU time of the process (s)", "cpu_times", "{}"),
            ("iteration (s), as run", "iteration_s", "{:.1f}"),
            ("iteration (s), every row", "iteration_s_every_row", "{:.1f}"),
            ("prompt tokens per turn", "prompt_tokens_per_turn", "{:.0f}"),
            ("tokens encoded per turn", "tokens_encoded_per_turn", "{:.0f}"),
            ("update rows / real tokens / padded batch", "update_shape", "{}"),
            ("rows skipped (zero advantage), mean per step", "update_rows_skipped", "{:.1f}"),
            ("tokens through the update's passes as run: real / with padding", "update_passes", "{}"),
            ("packed fwd+bwd tokens/s (reference)", "reference_tokens_per_s", "{:.0f}"),
            ("longest update row (tokens)", "update_row_tokens_max", "{:.0f}"),
            ("attention work per token, update rows ÷ reference rows", "attention_work_vs_reference", "{:.2f}"),
            ("**update efficiency** (every row: real tokens/s ÷ reference)", "update_efficiency", "{:.2f}"),
            ("update efficiency as run (— when every row was skipped)", "update_efficiency_as_run", "{:.2f}"),
            ("max abs log-prob difference", "logprob_max_abs_diff", "{:.1e}"),
            ("rollout success (T = 0.7)", "train_success", "{:.2f}")]
    rows += [(f"update (s), every row through the passes, {'the defaults' if k == 'defaults' else f'`{k}`'} "
              f"(fastest of {res['repeats']})", f"update_s[{k}]", "{:.2f}") for k in ABLATIONS]
    rows += [("rollout (s), the same rollouts with `prefill=\"batch\"`", "rollout_s[prefill=batch]", "{:.2f}")]
    for d in (res, b):
        d["iteration_s"] = d["rollout_s"] + d["update_s"]
        d["iteration_s_every_row"] = d["rollout_s"] + d["update_s_every_row"]
        d["cpu_times"] = f"{d['rollout_cpu_s']:.1f} / {d['update_cpu_s']:.1f} / {d['update_cpu_s_every_row']:.1f}"
        d["update_shape"] = f"{d['update_rows']:.0f} / {d['update_tokens']:.0f} / {d['update_padded_tokens']:.0f}"
        d["update_passes"] = f"{d['update_tokens_processed']:.0f} / {d['update_tokens_processed_padded']:.0f}"
    lines = ["# One GRPO iteration of the Shopping LM agent: previous path vs current default", "",
             "Generated by `benchmarks/bench_lm_rl.py`; do not edit by hand.", "",
             f"- command: `{command}`", f"- commit: `{res['commit']}`",
             f"- machine: {res['machine']}, torch threads {res['threads']}",
             f"- iteration: 16 find_and_buy rollouts (2 train tasks x 8; iteration k draws tasks and seeds from seed "
             f"{res['seed']} + k), GRPO lr 1e-4, "
             f"temperature 0.7; median of {res['iterations']} iteration(s) per path, the paths alternating",
             f"- wall time of the benchmark: {res['wall_s']:.0f} s", "",
             "| | baseline (previous path) | current default |", "|---|---|---|"]
    for name, key, fmt in rows:
        cells = ["—" if d.get(key) is None else fmt.format(d[key]) for d in (b, res)]
        lines.append(f"| {name} | {cells[0]} | {cells[1]} |")
    lines += ["", f"**Iteration speedup: {res['iteration_speedup']:.1f}x as run** "
              f"(rollout {b['rollout_s'] / res['rollout_s']:.1f}x, update {b['update_s'] / res['update_s']:.1f}x); "
              f"**{res['iteration_speedup_every_row']:.1f}x with every row through both updates** (update "
              f"{b['update_s_every_row'] / res['update_s_every_row']:.1f}x). In CPU time of the process (less "
              f"sensitive to other jobs on the machine): {res['iteration_speedup_cpu']:.1f}x as run, "
              f"{res['iteration_speedup_every_row_cpu']:.1f}x with every row. Over the iterations' total time "
              f"(every row): {res['iteration_speedup_total_every_row']:.1f}x.", ""]
    write_text_atomic(path, "\n".join(lines))


def main(argv=None) -> int:
    import torch

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="one iteration per path")
    p.add_argument("--iterations", type=int, default=None, help="iterations per path (default: 1 quick, 3 full)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=2,
                   help="every-row updates per variant and iteration; the fastest is reported (default: 2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--baseline-checkpoint", default=str(ROOT / "data" / "lm" / "sft-window"))
    p.add_argument("--checkpoint", default=str(ROOT / "data" / "lm" / "sft"))
    p.add_argument("--json", default=None, help="also write the figures to this JSON file")
    p.add_argument("--results", default=None, metavar="DIR",
                   help=f"write the table DIR/{TABLE} and its .json (the committed one: docs/results; default: none)")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    iterations = a.iterations or (1 if a.quick else 3)
    t0 = time.perf_counter()
    if a.repeats < 1:
        raise ConfigError(f"--repeats {a.repeats}: pass at least 1")
    paths = [run_path("baseline", Path(a.baseline_checkpoint), fast=False, seed=a.seed, iterations=iterations,
                      repeats=a.repeats),
             run_path("current", Path(a.checkpoint), fast=True, seed=a.seed, iterations=iterations,
                      repeats=a.repeats)]
    done: list[dict | None] = [None, None]
    while None in done:  # iteration k of the baseline, then iteration k of the current path, then k + 1
        for i, gen in enumerate(paths):
            if done[i] is None:
                try:
                    next(gen)
                except StopIteration as stop:
                    done[i] = stop.value
    base, cur = done
    res = {**cur, "baseline": base,
           "iteration_speedup": (base["rollout_s"] + base["update_s"]) / (cur["rollout_s"] + cur["update_s"]),
           # conservative: both updates put every row through their passes (no skipped zero-advantage rows)
           "iteration_speedup_every_row": (base["rollout_s"] + base["update_s_every_row"])
           / (cur["rollout_s"] + cur["update_s_every_row"]),
           "iteration_speedup_cpu": (base["rollout_cpu_s"] + base["update_cpu_s"])
           / (cur["rollout_cpu_s"] + cur["update_cpu_s"]),
           "iteration_speedup_every_row_cpu": (base["rollout_cpu_s"] + base["update_cpu_s_every_row"])
           / (cur["rollout_cpu_s"] + cur["update_cpu_s_every_row"]),
           # the iterations' total time: the medians above take rollout and update from different iterations
           # when their episodes differ in length
           "iteration_speedup_total_every_row": _total(base) / _total(cur),
           "commit": _commit(), "seed": a.seed, "threads": a.threads, "repeats": a.repeats,
           "machine": f"{platform.machine()}, torch {torch.__version__}",
           "wall_s": time.perf_counter() - t0}
    res["command"] = "python -m benchmarks.bench_lm_rl" + (" --quick" if a.quick else "") + \
        (f" --iterations {a.iterations}" if a.iterations else "") + \
        (f" --repeats {a.repeats}" if a.repeats != 2 else "") + \
        (f" --threads {a.threads}" if a.threads != 2 else "") + (f" --results {a.results}" if a.results else "")
    print(f"iteration speedup {res['iteration_speedup']:.1f}x as run, {res['iteration_speedup_every_row']:.1f}x "
          f"with every row (CPU time: {res['iteration_speedup_cpu']:.1f}x, "
          f"{res['iteration_speedup_every_row_cpu']:.1f}x) (baseline {base['rollout_s'] + base['update_s']:.1f}s, "
          f"current {cur['rollout_s'] + cur['update_s']:.1f}s); tokens encoded per turn "
          f"{base['tokens_encoded_per_turn']:.0f} -> {cur['tokens_encoded_per_turn']:.0f}; update efficiency "
          f"{_f(base['update_efficiency'])} -> {_f(cur['update_efficiency'])}; wall {res['wall_s']:.0f}s")
    from shopsim.paths import write_text_atomic

    figures = json.dumps(res, indent=2, default=str)
    if a.results:
        # the table and its figures are one result: write both, so the JSON never lags the table
        table = Path(a.results) / TABLE
        write_table(res, table, res["command"])
        write_text_atomic(table.with_suffix(".json"), figures)
        print(f"wrote {table} and {table.with_suffix('.json').name}")
    if a.json:
        write_text_atomic(a.json, figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
