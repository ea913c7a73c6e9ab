"""Where an LM agent's copies fail: teacher-forced accuracy of each kind of action on scripted-expert episodes.

For each task family, the expert that writes the SFT data plays ``--episodes`` dev episodes (its options and the
env rendering are the ones the checkpoint's manifest records, without noise injection). Each episode is scored in
one forward pass as the concat-mode row SFT trains on (`agents.lm.prompts.concat_layout`), and every expert action is
classed by kind: ``search1``, ``search2``, ... (the k-th search of the episode: in a bundle, the k-th item's),
``click#`` (a result by position), ``click-opt`` (an option value), ``click-btn`` (buy now, add to cart, paging),
or the tool name (``ask``, ``get_order``, ``answer``, ...). For each kind it reports the token-mean loss and the
share of actions whose every token has probability above 0.5 under the model (such an action is what greedy
decoding writes, given the same context).

This is a diagnosis, not a success rate: it says which copies a checkpoint has not learnt. Run:
``python -m benchmarks.diagnose_sft --checkpoint DIR [--families bundle after_sales] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections import defaultdict
from pathlib import Path

ENV_ID = "shopsim/Shopping-v0"
ROOT = Path(__file__).resolve().parents[1]
FAMILIES = ("find_and_buy", "clarify_and_buy", "bundle", "after_sales")
BUTTONS = ("buy now", "add to cart", "checkout", "< prev", "next >", "back to search")
CONFIDENT = 0.5  # an action counts as learnt when every token's probability is above this


def action_kind(action: str, searches_before: int) -> str:
    """The class of an expert action (see the module docstring)."""
    name = action.split("[", 1)[0].strip()
    if name == "search":
        return f"search{searches_before + 1}"
    if name == "click":
        arg = action[len("click["):-1].strip()
        return "click#" if arg.startswith("#") else ("click-btn" if arg in BUTTONS else "click-opt")
    return name


def sft_config_of(checkpoint: Path, families):
    """The checkpoint's SFT options (its manifest), with the families to diagnose and no expert noise: the
    diagnosis scores the expert's own actions only."""
    from agents.lm.sft import SFTConfig

    manifest = json.loads((checkpoint / "shopsim_agent.json").read_text())
    known = {k: v for k, v in manifest.get("sft", {}).items() if k in SFTConfig.__dataclass_fields__}
    known["families"] = tuple(families)
    known["expert_noise"] = 0.0
    # a manifest from before the option existed was trained on searches without the price clause
    known.setdefault("expert_price_clause", False)
    return SFTConfig(**known)


def diagnose(checkpoint: Path, families, episodes: int, seed: int) -> dict:
    """``{family: {kind: {"n", "loss_per_token", "confident"}}}`` for `checkpoint` on dev expert episodes."""
    import torch

    from agents.lm.agent import LMAgent
    from agents.lm.prompts import EpisodeContext, concat_layout
    from agents.lm.sft import encode_turns, expert_trajectories

    agent = LMAgent(env_id=ENV_ID, checkpoint=checkpoint)
    model, fmt = agent.model.eval(), agent.fmt
    stop = agent.tokenizer.eos_token_id
    config = sft_config_of(checkpoint, families)
    out = {}
    for family in families:
        trajs = expert_trajectories(ENV_ID, episodes, seed=seed, split="dev", families=(family,), progress=False,
                                    env_kwargs=config.env_options(), expert_kwargs=config.expert_options())
        per_kind = defaultdict(lambda: {"n": 0, "tokens": 0, "loss": 0.0, "confident": 0})
        for traj in trajs:
            turns = encode_turns(traj, EpisodeContext(fmt, mode="concat", max_prompt_tokens=1 << 30), fmt, stop)
            ids, _, turn_of = concat_layout(turns)
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].float()
            nll = -torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
            owner = torch.tensor(turn_of[1:])
            searches = 0
            for k, turn in enumerate(traj.turns):
                kind = action_kind(str(turn.action), searches)
                searches += kind.startswith("search")
                seg = nll[owner == k]
                row = per_kind[kind]
                row["n"] += 1
                row["tokens"] += len(seg)
                row["loss"] += float(seg.sum())
                row["confident"] += bool(float(seg.max()) < -math.log(CONFIDENT))
        out[family] = {kind: {"n": r["n"], "loss_per_token": r["loss"] / max(r["tokens"], 1),
                              "confident": r["confident"] / r["n"]}
                       for kind, r in sorted(per_kind.items())}
    return out


def table(result: dict) -> str:
    lines = ["| family | action | actions | loss per token | share learnt |", "|---|---|---|---|---|"]
    for family, kinds in result.items():
        for kind, r in kinds.items():
            lines.append(f"| {family} | {kind} | {r['n']} | {r['loss_per_token']:.3f} | {r['confident']:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    import torch

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", default=str(ROOT / "data" / "lm" / "sft"))
    p.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    p.add_argument("--episodes", type=int, default=24, help="dev expert episodes per family")
    p.add_argument("--seed", type=int, default=777)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", default=None, help="also write the result as JSON to this path")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    result = diagnose(Path(args.checkpoint), args.families, args.episodes, args.seed)
    print(table(result))
    print(f"({args.episodes} dev expert episodes per family, seed {args.seed}, {time.perf_counter() - t0:.0f} s)")
    if args.json:
        from shopsim.paths import write_text_atomic

        write_text_atomic(args.json, json.dumps({"checkpoint": args.checkpoint, "episodes": args.episodes,
                                                        "seed": args.seed, "result": result}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
