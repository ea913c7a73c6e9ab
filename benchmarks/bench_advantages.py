"""Benchmark: advantage computation and training throughput of the LM baselines core.

Advantages for N trajectories × K turns × T tokens per turn (default 1024 × 16 × 128, concat layout where the first
`env_tokens` positions of every turn are env/prompt tokens that GAE must skip):

* token-level GAE, blocked scan (`baselines.core.gae.gae`) vs the usual loop over time steps vectorised over the batch
  (`gae_reference_loop`, verl's ``compute_gae_advantage_return`` rule), in the same run; max abs difference;
* turn-level GAE on [N, K]; MPO's full credit (turn GAE + within-turn λ_intra sums + projection); GRPO group stats.

Training throughput: tokens/s of one optimizer step (forward + backward, policy loss) of the default LM agent model
on a synthetic batch. Run: ``python -m benchmarks.bench_advantages [--quick]``.
"""

from __future__ import annotations

import argparse
import time

import torch


def _time(fn, repeats: int) -> tuple[float, object]:
    fn()  # warm-up
    best = float("inf")
    out = None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best * 1000.0, out


def bench_advantages(n: int, k: int, t: int, env_tokens: int, repeats: int) -> dict:
    from baselines.core.gae import gae, gae_reference_loop, turn_gae
    from baselines.core.stats import group_normalize
    from baselines.mpo import mpo_advantages

    g = torch.Generator().manual_seed(0)
    T = k * t
    mask = torch.ones(n, k, t, dtype=torch.bool)
    mask[:, :, :env_tokens] = False
    mask = mask.view(n, T)
    values = torch.randn(n, T, generator=g) * mask
    rewards = torch.zeros(n, T)
    turn_r = (torch.rand(n, k, generator=g) < 0.1).float()
    rewards.view(n, k, t)[:, :, -1] = turn_r  # reward on each turn's last (generated) token
    res = {}
    ms_fast, (a_fast, _) = _time(lambda: gae(rewards, values, mask, gamma=1.0, lam=0.95), repeats)
    ms_loop, (a_loop, _) = _time(lambda: gae_reference_loop(rewards, values, mask, gamma=1.0, lam=0.95),
                                 max(1, repeats // 2))
    res["token_gae_ms"] = ms_fast
    res["token_gae_loop_ms"] = ms_loop
    res["speedup"] = ms_loop / ms_fast
    res["max_abs_diff"] = float((a_fast - a_loop).abs().max())
    res["turn_gae_ms"], _ = _time(lambda: turn_gae(turn_r, torch.randn(n, k, generator=g), torch.ones(n, k),
                                                   gamma=1.0, lam=0.8), repeats)
    # MPO on the trajectory-token layout (generated tokens only)
    L = k * (t - env_tokens)
    tok_turn = torch.arange(k).repeat_interleave(t - env_tokens).expand(n, L)
    v_tt = torch.randn(n, L, generator=g)
    m_tt = torch.ones(n, L, dtype=torch.bool)
    res["mpo_ms"], _ = _time(lambda: mpo_advantages(v_tt, m_tt, tok_turn, turn_r), repeats)
    R = turn_r.sum(1)
    gid = torch.arange(n) // 8
    res["grpo_group_norm_ms"], _ = _time(lambda: group_normalize(R, gid), repeats)
    return res


def bench_training(rows: int, length: int, repeats: int) -> dict:
    from agents.lm.model import build_model, num_parameters
    from agents.lm.tokenizer import load_tokenizer
    from baselines.core.losses import aggregate, clipped_surrogate
    from baselines.core.trainer import forward_policy

    tok = load_tokenizer()
    model = build_model(tok).eval()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, len(tok), (rows, length), generator=g)
    attn = torch.ones_like(ids)
    gen = torch.zeros(rows, length, dtype=torch.bool)
    gen[:, length // 2:] = True
    with torch.no_grad():
        old, _, _ = forward_policy(model, ids, attn)
    adv = torch.randn(rows, length, generator=g)

    def step():
        logp, _, _ = forward_policy(model, ids, attn)
        loss_tok, _ = clipped_surrogate(logp, old, adv, gen, 0.2, 0.2)
        loss = aggregate(loss_tok, gen, "token-mean")
        opt.zero_grad()
        loss.backward()
        opt.step()

    ms, _ = _time(step, repeats)
    return {"params": num_parameters(model), "rows": rows, "length": length, "step_ms": ms,
            "tokens_per_s": rows * length / (ms / 1000.0)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smaller sizes (256 trajectories, 2 repeats)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (2 threads on an oversubscribed machine stall every op)")
    p.add_argument("--no-training", action="store_true")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    n, rep = (256, 2) if a.quick else (1024, 5)
    r = bench_advantages(n, 16, 128, env_tokens=16, repeats=rep)
    print(f"advantages for {n} traj x 16 turns x 128 tokens (torch threads={a.threads}):")
    print(f"  token GAE, blocked scan     {r['token_gae_ms']:9.1f} ms")
    print(f"  token GAE, loop over time   {r['token_gae_loop_ms']:9.1f} ms   (verl-style reference, same run)")
    print(f"  speed-up                    {r['speedup']:9.1f} x   max |diff| = {r['max_abs_diff']:.2e}")
    print(f"  turn-level GAE [N, 16]      {r['turn_gae_ms']:9.2f} ms")
    print(f"  MPO credit (turn+intra)     {r['mpo_ms']:9.1f} ms")
    print(f"  GRPO group normalisation    {r['grpo_group_norm_ms']:9.2f} ms")
    if not a.no_training:
        rows, length = (4, 256) if a.quick else (8, 512)
        t = bench_training(rows, length, 2 if a.quick else 3)
        print(f"training step, default LM ({t['params'] / 1e6:.1f}M params), {rows} rows x {length} tokens: "
              f"{t['step_ms']:.0f} ms = {t['tokens_per_s']:.0f} tokens/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
