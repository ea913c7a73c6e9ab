"""Where a trained LM checkpoint's greedy success is won and lost, episode by episode.

    python -m benchmarks.outcome_split_lm --run CKPT [--start data/lm/sft] [--eval-episodes 400]
                                          [--json PATH] [--results DIR]

Plays the start (``--start``, default the shipped agent) and the run (``--run``) greedily on the learning
benchmark's paired test episodes (`benchmarks.learning_lm`: the first ``--eval-episodes`` test tasks, families in
turn, seeds ``EVAL_SEED + i``) and compares them episode by episode:

* how many episodes the run plays exactly as the start (every action equal), and how many change outcome:
  **gained** (the start failed, the run succeeds) and **lost**, overall and per family;
* for each changed episode, the first turn whose action differs and both actions there, which is where a
  researcher reads what the update learned (a strategy change repeated across tasks) or broke (a copied title
  that lost words);
* how the start's failures end (`end_reason` of the env: checkout, repeated invalid actions, turn limit, ...;
  a checkout split into over budget and wrong item from its `reward_parts`).

The net change, gained − lost, is the run's paired test gain times the number of episodes. Writes ``--json PATH``,
and ``DIR/outcome_split_lm.{md,json}`` only with ``--results DIR``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path

ENV = "shopsim/Shopping-v0"


def failure_kind(traj) -> str | None:
    """How a failed episode ended (None for a success): the env's `end_reason`, a purchase (``checkout``, ``buy``)
    split by its `reward_parts` into ``over_budget`` (the cart's budget or the item's price ceiling broken) and
    ``wrong_item`` (a type, attribute or option that does not match)."""
    if traj.success:
        return None
    info = traj.turns[-1].info if traj.turns else {}
    reason = str(info.get("end_reason") or "unknown")
    parts = info.get("reward_parts") or {}
    if reason in ("checkout", "buy"):  # a purchase that is not a success: over the budget, or not what was asked
        return "over_budget" if parts.get("budget_ok") == 0 or parts.get("price_ok") == 0 else "wrong_item"
    return reason


def compare(start: list, run: list) -> dict:
    """Episode-by-episode comparison of two lists of trajectories of the same episodes (see module docstring)."""
    if len(start) != len(run):
        raise ValueError(f"{len(start)} start episodes against {len(run)} run episodes; pass the same episodes")
    def act(t, k: int | None) -> str | None:
        return str(t.turns[k].action) if k is not None and k < len(t.turns) else None

    episodes = []
    for i, (a, b) in enumerate(zip(start, run, strict=True)):
        pairs = zip(a.turns, b.turns, strict=False)  # (the shorter episode ends first)
        first = next((k for k, (x, y) in enumerate(pairs) if x.action != y.action), None)
        if first is None and len(a.turns) != len(b.turns):
            first = min(len(a.turns), len(b.turns))
        episodes.append({"episode": i, "family": str(a.meta.get("family")), "start": bool(a.success),
                         "run": bool(b.success), "first_diff_turn": first, "start_action": act(a, first),
                         "run_action": act(b, first), "start_turns": len(a.turns), "run_turns": len(b.turns),
                         "start_failure": failure_kind(a), "run_failure": failure_kind(b)})
    fams = sorted({e["family"] for e in episodes})

    def count(es: list[dict]) -> dict:
        return {"episodes": len(es), "identical": sum(e["first_diff_turn"] is None for e in es),
                "start_success": sum(e["start"] for e in es), "run_success": sum(e["run"] for e in es),
                "gained": sum(e["run"] and not e["start"] for e in es),
                "lost": sum(e["start"] and not e["run"] for e in es),
                "start_failures": dict(Counter(e["start_failure"] for e in es if e["start_failure"])),
                "run_failures": dict(Counter(e["run_failure"] for e in es if e["run_failure"]))}

    return {"overall": count(episodes), "per_family": {f: count([e for e in episodes if e["family"] == f])
                                                       for f in fams}, "episodes": episodes}


def run(args) -> dict:
    from agents.lm.agent import LMAgent
    from benchmarks.update_direction_lm import paired_setup, play
    from shopsim.leaderboard.results import git_commit

    start_dir, env_kwargs, tasks = paired_setup(args)
    t0 = time.perf_counter()
    trajs = {}
    for label, ckpt in (("start", start_dir), ("run", Path(args.run))):
        agent = LMAgent(env_id=ENV, checkpoint=ckpt, max_new_tokens=args.max_new_tokens)
        trajs[label] = play(agent, tasks, env_kwargs, args.num_envs)
    out = compare(trajs["start"], trajs["run"])
    out.update(start=_shown(start_dir), run=_shown(Path(args.run)), eval_episodes=args.eval_episodes,
               wall_s=round(time.perf_counter() - t0, 1), commit=git_commit(),
               command="python -m benchmarks.outcome_split_lm " + " ".join(args.argv))
    return out


def _shown(path: Path) -> str:
    """`path` relative to the working directory when it lies under it (the table names no machine's folders)."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def write_table(res: dict, directory: Path) -> None:
    """``outcome_split_lm.{md,json}`` in `directory`, atomically."""
    from shopsim.paths import write_text_atomic

    o = res["overall"]
    lines = ["# Where greedy success is won and lost", "",
             "Generated by `benchmarks/outcome_split_lm.py`; do not edit by hand.", "",
             f"- command: `{res['command']}`", f"- commit: `{res['commit']}`",
             f"- start `{res['start']}`, run `{res['run']}`; {res['eval_episodes']} paired test episodes, greedy",
             f"- wall time: {res['wall_s']:.0f} s", "",
             f"{o['identical']} of {o['episodes']} episodes are played exactly as the start plays them; "
             f"{o['gained']} gained, {o['lost']} lost (net {o['gained'] - o['lost']:+d}).", "",
             "| family | episodes | identical | start | run | gained | lost | start's failures |",
             "|---|---|---|---|---|---|---|---|"]
    for f, c in [*res["per_family"].items(), ("all", o)]:
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(c["start_failures"].items(), key=lambda kv: -kv[1]))
        lines.append(f"| {f} | {c['episodes']} | {c['identical']} | {c['start_success']} | {c['run_success']} | "
                     f"{c['gained']} | {c['lost']} | {kinds} |")
    for title, want in (("Gained", True), ("Lost", False)):
        lines += ["", f"## {title}: the first action that differs", "", "| episode | family | turn | start | run |",
                  "|---|---|---|---|---|"]
        for e in res["episodes"]:
            if e["run"] == want and e["start"] != want:
                lines.append(f"| {e['episode']} | {e['family']} | {e['first_diff_turn']} | "
                             f"`{_cell(e['start_action'])}` | `{_cell(e['run_action'])}` |")
    directory.mkdir(parents=True, exist_ok=True)
    write_text_atomic(directory / "outcome_split_lm.md", "\n".join(lines) + "\n")
    write_text_atomic(directory / "outcome_split_lm.json", json.dumps(res, indent=1) + "\n")


def _cell(text: str | None) -> str:
    return "(episode over)" if text is None else text.replace("|", "\\|").replace("`", "'")


def main(argv=None) -> int:
    import sys

    p = argparse.ArgumentParser(prog="python -m benchmarks.outcome_split_lm", description=__doc__.split("\n")[0])
    p.add_argument("--run", required=True, help="the trained checkpoint folder")
    p.add_argument("--start", default=None, help="the checkpoint it started from (default: the shipped agent)")
    p.add_argument("--eval-episodes", type=int, default=400)
    p.add_argument("--max-turns", type=int, default=40)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--num-envs", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", default=None, help="write the result here")
    p.add_argument("--results", default=None, help="write DIR/outcome_split_lm.{md,json}")
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    res = run(args)
    o = res["overall"]
    print(f"{o['identical']} of {o['episodes']} episodes identical; gained {o['gained']}, lost {o['lost']}")
    for f, c in res["per_family"].items():
        print(f"  {f}: gained {c['gained']}, lost {c['lost']}; start's failures {c['start_failures']}")
    if args.json:
        from shopsim.paths import write_text_atomic

        write_text_atomic(Path(args.json), json.dumps(res, indent=1) + "\n")
    if args.results:
        write_table(res, Path(args.results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
