"""LM evaluation speed: the shipped agent, greedy, on fixed Shopping test episodes of the four families, decoded by
the reference path and by the slot decoder in the same run (docs/lm-agent.md, docs/benchmarks.md).

    python -m benchmarks.bench_lm_eval [--quick] [--tasks N] [--threads 2] [--json PATH] [--results DIR]

Paths (each runs `shopsim.leaderboard.evaluate.run_seeds`, the evaluation every entry point uses, over the same
episodes: the first ``--tasks`` test tasks, whose families take turns, eval seed 0, one try):

* ``reference``: ``LMAgent(decoder="hf")`` at `REFERENCE_SLOTS` env copies, the evaluation path before the slot
  decoder (`agents.lm.generation.sample` with the per-episode `PrefixCache`);
* ``slots``: the default, `agents.lm.decoder.SlotDecoder` at the LM agent's evaluation batch
  (`agents.lm.agent.LMAgent.eval_slots` env copies).

Figures: ``episodes_per_s`` and ``tokens_per_s`` per path (tokens = prompt tokens the model encoded plus tokens it
generated), ``eval_speedup`` (slots over reference, wall time), ``actions_identical`` (every episode's actions and
rewards equal), ``inference_efficiency`` (the time plain forward-only passes of the same model over the episodes'
final contexts, batched 8 rows at a time, take for the tokens the slot path ran over, divided by the path's time:
the same tokens and attention spans as the evaluation, at the rate of one big batched forward; timed right after
each chunk so that both see the same machine load; 1.0 is evaluation at the model's compute rate);
``inference_efficiency_short_rows``, the same against the tokens concatenated and cut into 512-token rows (a cheaper
pass per token than the episodes' long contexts: the model's best case).
The sampled path is measured the same way at temperature 0.7 with each episode's own stream
(`shopsim.rollout.episode_seed`): ``sample_speedup`` and ``sample_identical`` (the same tokens for the same seeds).
The tasks run in chunks, the paths alternating chunk by chunk so both see the same machine load.

Writes ``--json PATH`` when given, and the committed table ``DIR/bench_lm_eval.{md,json}`` only with
``--results DIR``.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from dataclasses import replace
from pathlib import Path

ENV = "shopsim/Shopping-v0"
FAMILIES = ("find_and_buy", "clarify_and_buy", "bundle", "after_sales")
ROOT = Path(__file__).resolve().parents[1]
#: env copies of the reference path: `evaluate`'s batch before the slot decoder
REFERENCE_SLOTS = 8
SAMPLE_TEMPERATURE = 0.7


def chunk_protocol(first: int, count: int):
    """The test protocol's tasks ``first .. first + count - 1`` (the default mix: task id t is family
    ``FAMILIES[t % 4]``), eval seed 0, one try, greedy."""
    from shopsim.leaderboard.protocols import load_protocol

    whole = load_protocol(ENV, "test", sized=False)
    return replace(whole, task_ids=tuple(whole.task_ids[first: first + count]), seeds=(0,), tries=1,
                   decoding="greedy")


def make_agent(checkpoint: Path, decoder: str):
    import agents

    return agents.load_checkpoint(checkpoint, env_id=ENV, decoder=decoder)


def run_chunk(agent, protocol, slots: int, *, sampled: bool) -> dict:
    """Evaluate (greedy) or sample (temperature 0.7, per-episode streams) the protocol's episodes; time, tokens,
    actions."""
    from shopsim.leaderboard.evaluate import agent_env_kwargs, run_seeds
    from shopsim.rollout import collect

    before = dict(agent.stats)
    dec = agent.slots
    counts0 = (dec.decode_passes, dec.drafted_tokens, dec.accepted_tokens) if dec is not None else (0, 0, 0)
    t0 = time.perf_counter()
    if sampled:
        t, s = protocol.episodes(0)
        saved = agent.sampling.greedy, agent.sampling.temperature
        agent.sampling.greedy, agent.sampling.temperature = False, SAMPLE_TEMPERATURE
        try:
            trajs = collect(ENV, agent, tasks=t, seeds=s, split="test", num_envs=slots, progress=False,
                            env_kwargs=agent_env_kwargs(agent, protocol), agent_seed=0)
        finally:
            agent.sampling.greedy, agent.sampling.temperature = saved
    else:
        _, trajs = run_seeds(agent, protocol, num_envs=slots, keep=True)
    wall = time.perf_counter() - t0
    st = agent.stats
    counts = (dec.decode_passes, dec.drafted_tokens, dec.accepted_tokens) if dec is not None else (0, 0, 0)
    passes, drafted, accepted = (b - a for a, b in zip(counts0, counts, strict=True))
    return {"wall_s": wall, "episodes": len(trajs), "decode_passes": passes, "drafted": drafted,
            "accepted": accepted,
            "generated": st["new_tokens"] - before.get("new_tokens", 0),
            "encoded": st.get("encoded_tokens", 0) - before.get("encoded_tokens", 0),
            "turns": st.get("turns", 0) - before.get("turns", 0),
            "success": sum(bool(tr.success) for tr in trajs),
            "actions": [[(tu.action, tu.reward) for tu in tr.turns] for tr in trajs],
            "tokens": [[list(tu.action_ids or []) for tu in tr.turns] for tr in trajs],
            "contexts": [list(tr.turns[-1].prompt_ids) + list(tr.turns[-1].action_ids) for tr in trajs]}


#: rows per forward of the packed reference
PACKED_ROWS = 8
#: the second reference: the same tokens concatenated and cut into rows of this many tokens (sequence packing)
SHORT_ROW = 512


def packed_rate(model, contexts: list[list[int]], pad_id: int, repeats: int = 2, short: bool = False) -> float:
    """Tokens per second of forward-only passes (no cache, no gradient) over the episodes' final contexts: every
    token the episodes fed the model, each attending to its own episode's prefix, i.e. the work the evaluation did,
    done as plain batched forwards (the contexts sorted by length, `PACKED_ROWS` per forward, so that padding stays
    small; padding is not counted as tokens). The fastest of `repeats`. With `short`, the same tokens concatenated and
    cut into `SHORT_ROW`-token rows instead: short sequences, the model's best case."""
    import torch

    from agents.lm.generation import pack

    order = sorted(contexts, key=len)
    if short:  # sequence packing: every token attends within its 512-token row only, a cheaper pass per token
        flat = [t for c in order for t in c]
        order = [flat[i: i + SHORT_ROW] for i in range(0, len(flat) - SHORT_ROW + 1, SHORT_ROW)] or [flat]
        contexts = order
    batches = [order[i: i + PACKED_ROWS] for i in range(0, len(order), PACKED_ROWS)]
    packed = [pack(b, [[] for _ in b], pad_id)[:2] for b in batches]
    real = sum(len(c) for c in contexts)
    best = float("inf")
    with torch.no_grad():
        model(input_ids=packed[0][0][:1, :8], attention_mask=packed[0][1][:1, :8])  # warm-up
        for _ in range(repeats):
            t0 = time.perf_counter()
            for ids, mask in packed:
                model(input_ids=ids, attention_mask=mask, logits_to_keep=1)
            best = min(best, time.perf_counter() - t0)
    return real / best


def _totals(cells: list[dict]) -> dict:
    wall = sum(c["wall_s"] for c in cells)
    eps = sum(c["episodes"] for c in cells)
    tokens = sum(c["generated"] + c["encoded"] for c in cells)
    return {"wall_s": round(wall, 3), "episodes": eps, "episodes_per_s": eps / wall, "tokens_per_s": tokens / wall,
            "generated_tokens": sum(c["generated"] for c in cells), "encoded_tokens": sum(c["encoded"] for c in cells),
            "turns": sum(c["turns"] for c in cells), "success": sum(c["success"] for c in cells) / eps,
            "decode_passes": sum(c["decode_passes"] for c in cells), "drafted_tokens": sum(c["drafted"] for c in cells),
            "accepted_tokens": sum(c["accepted"] for c in cells)}


def run(args) -> dict:
    import torch

    from agents.lm.agent import LMAgent

    torch.set_num_threads(args.threads)
    checkpoint = Path(args.checkpoint)
    ref, fast = make_agent(checkpoint, "hf"), make_agent(checkpoint, "slots")
    slots = args.slots or LMAgent.eval_slots
    for agent, n in ((ref, REFERENCE_SLOTS), (fast, slots)):  # warm-up: first-call costs are not evaluation
        run_chunk(agent, chunk_protocol(0, 2), n, sampled=False)
    cells: dict[str, list[dict]] = {"reference": [], "slots": [], "reference_sampled": [], "slots_sampled": []}
    size = -(-args.tasks // args.chunks)
    for c, first in enumerate(range(0, args.tasks, size)):  # alternate the paths so both see the same load
        protocol = chunk_protocol(first, min(size, args.tasks - first))
        cells["reference"].append(run_chunk(ref, protocol, REFERENCE_SLOTS, sampled=False))
        cells["slots"].append(run_chunk(fast, protocol, slots, sampled=False))
        # the packed reference right after the chunk it is compared with, under the same machine load
        ctx = cells["slots"][-1]["contexts"]
        cells["slots"][-1]["packed_tokens_per_s"] = packed_rate(fast.model, ctx, fast.policy.pad_id)
        cells["slots"][-1]["short_tokens_per_s"] = packed_rate(fast.model, ctx, fast.policy.pad_id, short=True)
        print(f"chunk {c}: reference {cells['reference'][-1]['wall_s']:.1f}s, "
              f"slots {cells['slots'][-1]['wall_s']:.1f}s", flush=True)
        if not args.no_sample and c < args.sample_chunks:
            cells["reference_sampled"].append(run_chunk(ref, protocol, REFERENCE_SLOTS, sampled=True))
            cells["slots_sampled"].append(run_chunk(fast, protocol, slots, sampled=True))
    out: dict = {name: _totals(c) for name, c in cells.items() if c}
    out["eval_speedup"] = out["reference"]["wall_s"] / out["slots"]["wall_s"]
    out["actions_identical"] = all(a["actions"] == b["actions"]
                                   for a, b in zip(cells["reference"], cells["slots"], strict=True))
    out["tokens_identical"] = all(a["tokens"] == b["tokens"]
                                  for a, b in zip(cells["reference"], cells["slots"], strict=True))
    # efficiency: the time one packed forward pass would take for the tokens a path ran over, over the path's time
    packed_s = [(c["generated"] + c["encoded"]) / c["packed_tokens_per_s"] for c in cells["slots"]]
    ref_packed_s = [(r["generated"] + r["encoded"]) / c["packed_tokens_per_s"]
                    for r, c in zip(cells["reference"], cells["slots"], strict=True)]
    out["packed_tokens_per_s"] = [round(c["packed_tokens_per_s"]) for c in cells["slots"]]
    out["short_rows_tokens_per_s"] = [round(c["short_tokens_per_s"]) for c in cells["slots"]]
    out["inference_efficiency_short_rows"] = sum((c["generated"] + c["encoded"]) / c["short_tokens_per_s"]
                                                 for c in cells["slots"]) / out["slots"]["wall_s"]
    out["inference_efficiency"] = sum(packed_s) / out["slots"]["wall_s"]
    out["reference_inference_efficiency"] = sum(ref_packed_s) / out["reference"]["wall_s"]
    if cells["slots_sampled"]:
        out["sample_speedup"] = out["reference_sampled"]["wall_s"] / out["slots_sampled"]["wall_s"]
        out["sample_identical"] = all(a["tokens"] == b["tokens"] for a, b in
                                      zip(cells["reference_sampled"], cells["slots_sampled"], strict=True))
        out["sample_temperature"] = SAMPLE_TEMPERATURE
    out.update({"tasks": args.tasks, "chunks": args.chunks, "families": list(FAMILIES),
                "reference_slots": REFERENCE_SLOTS, "slots_env_copies": slots, "threads": args.threads,
                "checkpoint": str(args.checkpoint),
                "machine": f"{platform.machine()}, {_cores()} CPU cores, torch {torch.__version__}"})
    return out


def _cores() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def write_table(res: dict, directory: Path) -> None:
    from shopsim.paths import write_text_atomic

    r, s = res["reference"], res["slots"]
    lines = ["# LM evaluation speed", "", "Generated by `benchmarks/bench_lm_eval.py`; do not edit by hand.", "",
             f"- command: `{res['command']}`", f"- commit: `{res['commit']}`", f"- machine: {res['machine']}, "
             f"{res['threads']} torch threads",
             f"- episodes: the first {res['tasks']} test tasks ({', '.join(res['families'])} in turn), "
             f"eval seed 0, one try, greedy; in {res['chunks']} chunks, the paths alternating chunk by chunk",
             f"- wall time of the benchmark: {res['wall_s']:.0f} s", "",
             f"| | reference (`decoder=\"hf\"`, {res['reference_slots']} envs) | slot decoder "
             f"({res['slots_env_copies']} envs) |", "|---|---|---|"]
    rows = [("episodes / s", "episodes_per_s", "{:.2f}"), ("tokens / s (encoded + generated)", "tokens_per_s",
                                                               "{:.0f}"),
            ("wall (s)", "wall_s", "{:.1f}"), ("episodes", "episodes", "{}"), ("turns", "turns", "{}"),
            ("encoded tokens", "encoded_tokens", "{}"), ("generated tokens", "generated_tokens", "{}"),
            ("success", "success", "{:.3f}")]
    for name, key, fmt in rows:
        lines.append(f"| {name} | {fmt.format(r[key])} | {fmt.format(s[key])} |")
    lines += ["", f"- **eval_speedup {res['eval_speedup']:.2f}x**, actions identical: "
              f"**{res['actions_identical']}** (generated tokens identical: {res['tokens_identical']})",
              f"- **inference_efficiency {res['inference_efficiency']:.2f}**: {s['tokens_per_s']:.0f} tokens/s against "
              f"{', '.join(map(str, res['packed_tokens_per_s']))} tokens/s of "
              f"forward-only passes over the chunk's episodes' final contexts ({PACKED_ROWS} rows per batch, sorted "
              f"by length), timed after the chunk "
              f"(reference path: {res['reference_inference_efficiency']:.2f})",
              f"- against the same tokens cut into {SHORT_ROW}-token rows (sequence packing, the model's best case: "
              f"{', '.join(map(str, res['short_rows_tokens_per_s']))} tokens/s): "
              f"{res['inference_efficiency_short_rows']:.2f}"]
    lines.append(f"- prompt-lookup drafting (slot decoder): {s['decode_passes']} decoding passes after the prefills "
                 f"for {s['generated_tokens']} generated tokens in {s['turns']} turns; {s['drafted_tokens']} drafted "
                 f"tokens checked, {s['accepted_tokens']} taken")
    if "sample_speedup" in res:
        rs, ss = res["reference_sampled"], res["slots_sampled"]
        lines.append(f"- sampled (temperature {res['sample_temperature']}, per-episode streams, {ss['episodes']} "
                     f"episodes): **sample_speedup {res['sample_speedup']:.2f}x** ({rs['episodes_per_s']:.2f} -> "
                     f"{ss['episodes_per_s']:.2f} episodes/s), same tokens for the same seeds: "
                     f"**{res['sample_identical']}**")
    lines.append("")
    directory.mkdir(parents=True, exist_ok=True)
    write_text_atomic(directory / "bench_lm_eval.md", "\n".join(lines))
    write_text_atomic(directory / "bench_lm_eval.json", json.dumps(res, indent=2))


def main(argv=None) -> int:
    from shopsim.errors import ConfigError
    from shopsim.leaderboard.results import git_commit
    from shopsim.paths import write_text_atomic

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="96 test tasks, the sampled path on the first half")
    p.add_argument("--tasks", type=int, default=None, help="test tasks, the four families in turn (default 96 "
                   "quick, 400 full)")
    p.add_argument("--chunks", type=int, default=2, help="the tasks run in this many chunks, the paths alternating")
    p.add_argument("--slots", type=int, default=None, help="env copies of the slot path (default: the agent's)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--checkpoint", default=str(ROOT / "data" / "lm" / "sft"))
    p.add_argument("--no-sample", action="store_true", help="skip the sampled path")
    p.add_argument("--json", default=None, help="also write the figures to this JSON file")
    p.add_argument("--results", default=None, help="write the committed table DIR/bench_lm_eval.{md,json}")
    a = p.parse_args(argv)
    default_tasks = 96 if a.quick else 400
    a.tasks = a.tasks or default_tasks
    a.sample_chunks = 1 if a.quick else a.chunks
    if min(a.tasks, a.threads, a.chunks) < 1:
        raise ConfigError("--tasks, --threads and --chunks must be >= 1")
    t0 = time.perf_counter()
    res = run(a)
    res["wall_s"] = time.perf_counter() - t0
    res["commit"] = git_commit()
    res["command"] = "python -m benchmarks.bench_lm_eval" + (" --quick" if a.quick else "") + \
        (f" --tasks {a.tasks}" if a.tasks != default_tasks else "") + \
        (f" --chunks {a.chunks}" if a.chunks != 2 else "") + \
        (f" --threads {a.threads}" if a.threads != 2 else "")
    print(f"eval: reference {res['reference']['episodes_per_s']:.2f} ep/s, slots {res['slots']['episodes_per_s']:.2f}"
          f" ep/s, speedup {res['eval_speedup']:.2f}x, actions identical {res['actions_identical']}, "
          f"inference efficiency {res['inference_efficiency']:.2f} ({res['slots']['tokens_per_s']:.0f} tokens/s; "
          f"packed {res['packed_tokens_per_s']})"
          + (f"; sampled speedup {res['sample_speedup']:.2f}x, identical {res['sample_identical']}"
             if "sample_speedup" in res else "") + f"; wall {res['wall_s']:.0f}s")
    if a.json:
        write_text_atomic(a.json, json.dumps(res, indent=2))
    if a.results:
        write_table(res, Path(a.results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
