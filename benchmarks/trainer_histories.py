"""Short-run learning histories of every algorithm, recorded before and after a change of the shared trainer.

    python -m benchmarks.trainer_histories record runs/house_before            # every case
    python -m benchmarks.trainer_histories record runs/house_after [--cases grpo ppo ...]
    python -m benchmarks.trainer_histories record OUT --cases grpo tropd --iterations 1
    python -m benchmarks.trainer_histories compare runs/house_before runs/house_after
    python -m benchmarks.trainer_histories --list

A refactor of `baselines.core` (the LM trainer, the batch, the advantage estimators, the loop) must not change
what any algorithm computes. Each case here trains one algorithm for a few iterations with tiny budgets, a fixed
seed and one torch thread, on CPU, and writes to ``OUT/<case>/``:

* ``history.json``: the run's per-iteration history (`TrainResult.history`), every float written with ``repr``,
  timing columns left out (`TIMING`: wall-clock seconds and throughputs differ between any two runs);
* ``pretrain.json``: what `before_training` wrote (VAPO's and MPO's value pre-training, BASIS's table, midtrain's
  stages), timing columns left out, when the run wrote one;
* ``params.sha256``: the sha256 of the trained parameters (the policy, and the critic where there is one), in
  state-dict order.

``compare A B`` checks that both folders hold the same cases and that each case's three files are byte-identical,
and prints one line per case; it exits 1 on a difference. The cases cover every registered LM algorithm on
Shopping-v0 (the GRPO family in concat and window mode, with and without KL, entropy, several micro-batches and
epochs, a shared critic for PPO), starting from the shipped SFT checkpoint ``data/lm/sft`` (its rollouts succeed
on some tasks and fail on others, so advantages are not all zero), and the numeric algorithms on their own envs
(CA-PG, hybrid PPO, HPO, ProRL), which share `baselines.core.loop`, `losses`, `stats` and `gae`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from shopsim.paths import write_text_atomic

LM_ENV = "shopsim/Shopping-v0"
LM_INIT = "data/lm/sft"
#: history columns that hold wall-clock time or a throughput: they differ between any two runs of the same code
TIMING = {"rollout_s", "update_s", "train_tokens_per_s", "bipace_adv_s", "seconds", "train_seconds",
          "sft_seconds", "generate_seconds", "pretrain_seconds"}
FILES = ("history.json", "pretrain.json", "params.sha256")

#: options every LM case shares: a few short episodes of two families, one evaluation at the end
LM_SMALL: dict[str, Any] = dict(group_size=4, tasks_per_iter=2, eval_episodes=2, eval_every=0, num_envs=2,
                                max_new_tokens=32, lr=1e-4, temperature=1.0, env_kwargs={"max_turns": 8},
                                task_families=("find_and_buy", "clarify_and_buy"), checkpoint_every=0)


def _is_timing(key: str) -> bool:
    return key in TIMING or key.endswith("_seconds") or key.endswith("_per_s")


def _lm_agent(mode: str = "window"):
    import agents

    return agents.load_checkpoint(LM_INIT, env_id=LM_ENV, context_mode=mode)


def _lm(name: str, mode: str = "window", **over: Any) -> Callable[[], tuple[Any, str, dict]]:
    def make():
        import baselines

        algo = baselines.make(name, env_id=LM_ENV, **{**LM_SMALL, **over})
        return algo, LM_ENV, {"agent": _lm_agent(mode)}

    return make


def _tropd(**over: Any) -> Callable[[], tuple[Any, str, dict]]:
    return _lm("tropd", teacher="data/lm/sft-small", group_size=1, tasks_per_iter=3, **over)


def _numeric(case: str) -> Callable[[], tuple[Any, str, dict]]:
    def make():
        from baselines.capg import CAPG
        from baselines.hpo import HPO
        from baselines.hybrid_ppo import HybridPPO
        from baselines.prorl import ProRL

        if case == "capg":
            return (CAPG(batch_size=32, steps_per_iteration=3, eval_every=1, eval_contexts=200,
                         env_kwargs={"n_items": 100, "k": 5}), "shopsim/TwoStageRetrieval-v0", {})
        hpo_cfg = dict(batch_scenarios=4, eval_scenarios=2, hidden=(16, 16), value_hidden=(16, 16))
        opts = {"env_kwargs": {"horizon": 30, "warmup": 5}}
        if case == "hpo":
            return HPO(**hpo_cfg), "shopsim/Replenishment-v0", opts
        if case == "hybrid_ppo":
            return HybridPPO(**hpo_cfg), "shopsim/Replenishment-v0", opts
        from agents.rec_model import build_model
        from agents.rec_policies import RecPolicyAgent

        world = dict(catalog_size=100, simulator="analytic")
        agent = RecPolicyAgent(valid_only=True, **world)
        agent.model = build_model(agent.vocab, d=16, layers=1, heads=2, seed=0).eval()
        algo = ProRL(**world, group_size=4, prompts_per_iter=8, num_train_prompts=24, eval_every=1, eval_tasks=8,
                     valid_only=True, lr=3e-3)
        return algo, "shopsim/ProactiveRec-v0", {"agent": agent}

    return make


#: case -> (make: () -> (algorithm, env id, train() options), iterations)
CASES: dict[str, tuple[Callable[[], tuple[Any, str, dict]], int]] = {
    "reinforce_rloo": (_lm("reinforce", baseline="rloo"), 2),
    "reinforce_batch_mean": (_lm("reinforce", group_size=1, tasks_per_iter=4), 2),
    "ppo": (_lm("ppo"), 2),
    "ppo_shared_concat": (_lm("ppo", "concat", critic_shared=True, value_clip=0.2, update_epochs=2), 2),
    "grpo": (_lm("grpo"), 2),
    "grpo_concat": (_lm("grpo", "concat"), 2),
    "grpo_kl_entropy": (_lm("grpo", kl_coef=0.05, entropy_coef=0.01, kl_kind="k1"), 2),
    "grpo_epochs_micro": (_lm("grpo", update_epochs=2, minibatches=2, minibatch_unit="row", micro_batch_tokens=64,
                              micro_batch_rows=2, normalize_advantage=True, dual_clip=3.0), 2),
    "grpo_padding_mask": (_lm("grpo", padding_mask=True, micro_batch_tokens=0, loss_agg="token-mean"), 2),
    "dapo": (_lm("dapo", max_gen_batches=1), 2),
    "gigpo": (_lm("gigpo"), 2),
    "vapo": (_lm("vapo", value_pretrain_steps=1, value_pretrain_batches=1), 2),
    "mpo": (_lm("mpo", "concat"), 2),
    "wapo": (_lm("wapo", minibatches=2), 2),
    "bipace": (_lm("bipace", "concat", tasks_per_iter=2), 2),
    "basis": (_lm("basis", tasks_per_iter=2, task_pool=2, n_ref=2, checkpoint_every=0), 2),
    "arc_grpo": (_lm("arc", group_size=1, tasks_per_iter=1, num_envs=3), 2),
    "arc_ppo": (_lm("arc", group_size=1, tasks_per_iter=1, num_envs=3, base="ppo"), 2),
    "tropd": (_tropd(), 2),
    "tropd_clip_quantile": (_tropd(outlier="clip", tau_mode="quantile", prefix_guidance=False), 2),
    "opd": (_tropd(objective="opd", prefix_guidance=False, entropy_coef=0.01), 2),
    "delta": (_lm("delta"), 2),
    "midtrain": (_lm("midtrain", "concat", data="incorrect", strategies=("recommend_directly",), num_tasks=2,
                     candidates=1, exemplar=False, group_size=2, tasks_per_iter=1), 2),
    "capg": (_numeric("capg"), 2),
    "hybrid_ppo": (_numeric("hybrid_ppo"), 2),
    "hpo": (_numeric("hpo"), 2),
    "prorl": (_numeric("prorl"), 2),
}


def _canon(x: Any) -> Any:
    """JSON-ready copy with every float written by ``repr`` (bit-exact), NaN and infinities included."""
    if isinstance(x, dict):
        return {str(k): _canon(v) for k, v in x.items() if not _is_timing(str(k))}
    if isinstance(x, (list, tuple)):
        return [_canon(v) for v in x]
    if isinstance(x, bool) or x is None or isinstance(x, (int, str)):
        return x
    if isinstance(x, torch.Tensor) and x.numel() == 1:
        x = x.item()
    if isinstance(x, float) or hasattr(x, "__float__"):
        f = float(x)
        return repr(f) if not math.isfinite(f) else f"float:{f!r}"
    return repr(x)


def _dump(x: Any) -> str:
    return json.dumps(_canon(x), indent=1, sort_keys=True) + "\n"


def params_digest(algo: Any, result: Any) -> str:
    """sha256 over the trained tensors: the LM policy and critic, else the result agent's torch modules."""
    h = hashlib.sha256()
    mods: list[tuple[str, Any]] = []
    for name in ("model", "critic"):
        m = getattr(algo, name, None)
        if isinstance(m, torch.nn.Module):
            mods.append((name, m))
    if not mods:
        agent = result.agent
        for name in ("model", "scorer", "policy", "net"):
            m = getattr(agent, name, None)
            if isinstance(m, torch.nn.Module):
                mods.append((name, m))
    if not mods:
        raise RuntimeError(f"{type(algo).__name__}: no trained module found to digest")
    for name, m in mods:
        for k, v in m.state_dict().items():
            h.update(f"{name}.{k}".encode())
            h.update(v.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def record_case(case: str, out: Path, iterations: int | None = None) -> None:
    """Train `case` in a scratch folder (for `iterations`, default the case's own) and write its three files to
    ``out/case``."""
    make, default_iterations = CASES[case]
    iterations = iterations or default_iterations
    torch.set_num_threads(1)
    dest = out / case
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"hist-{case}-") as tmp:
        algo, env_id, opts = make()
        res = algo.train(env_id, iterations=iterations, seed=0, out_dir=Path(tmp) / "run", progress=False, **opts)
        write_text_atomic(dest / "history.json", _dump(res.history))
        pre = Path(tmp) / "run" / "pretrain.json"
        write_text_atomic(dest / "pretrain.json", _dump(json.loads(pre.read_text())) if pre.is_file() else "{}\n")
        write_text_atomic(dest / "params.sha256", params_digest(algo, res) + "\n")


def compare(a: Path, b: Path) -> list[str]:
    """One line per case of `a` or `b`: "same", or what differs. The last line sums up."""
    lines, bad = [], 0
    cases = sorted({p.name for p in a.iterdir() if p.is_dir()} | {p.name for p in b.iterdir() if p.is_dir()})
    for case in cases:
        diff = []
        for f in FILES:
            pa, pb = a / case / f, b / case / f
            if not pa.is_file() or not pb.is_file():
                diff.append(f"{f} missing in {a if not pa.is_file() else b}")
            elif pa.read_bytes() != pb.read_bytes():
                diff.append(f + _first_difference(pa, pb))
        bad += bool(diff)
        lines.append(f"{case:24s} " + ("identical" if not diff else "DIFFERS: " + "; ".join(diff)))
    lines.append(f"{len(cases) - bad}/{len(cases)} cases identical")
    return lines


def _first_difference(pa: Path, pb: Path) -> str:
    la, lb = pa.read_text().splitlines(), pb.read_text().splitlines()
    for i, (x, y) in enumerate(zip(la, lb, strict=False)):
        if x != y:
            return f" (line {i + 1}: {x.strip()} vs {y.strip()})"
    return f" ({len(la)} vs {len(lb)} lines)"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--list", action="store_true", help="list the cases and exit")
    sub = p.add_subparsers(dest="cmd")
    rec = sub.add_parser("record", help="train the cases and write their histories to OUT")
    rec.add_argument("out", type=Path)
    rec.add_argument("--cases", nargs="+", choices=sorted(CASES), default=sorted(CASES))
    rec.add_argument("--iterations", type=int, default=None, help="iterations of every case (default: its own)")
    cmp_ = sub.add_parser("compare", help="byte-compare two recorded folders")
    cmp_.add_argument("a", type=Path)
    cmp_.add_argument("b", type=Path)
    args = p.parse_args(argv)
    if args.list or args.cmd is None:
        print("\n".join(sorted(CASES)))
        return 0
    if args.cmd == "record":
        for case in args.cases:
            print(f"{case} ...", flush=True)
            record_case(case, args.out, args.iterations)
        return 0
    lines = compare(args.a, args.b)
    print("\n".join(lines))
    return 0 if lines[-1].startswith(f"{len(lines) - 1}/") else 1


if __name__ == "__main__":
    sys.exit(main())
