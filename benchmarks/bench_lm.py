"""LM-agent throughput: batched KV-cache sampling with exact records, and the env's share of rollout wall time.

    .venv/bin/python -m benchmarks.bench_lm [--quick] [--checkpoint DIR] [--threads N]

Prints
1. generation tokens/s at batch 32 (and batch 1) of `agents.lm.generation.sample` — which records ids, log-probs
   per token — next to `transformers`' own ``model.generate`` on the same prompts (the reference, same run);
2. for rollouts of the LM agent on Shopping-v0 (32 envs): wall time, time inside the agent, and the share of
   rollout wall time spent in the env (everything that is not the agent: env steps, resets, runner overhead).
"""

from __future__ import annotations

import argparse
import time


def _prompts(agent, n: int, env_id: str) -> list[list[int]]:
    import gymnasium as gym

    import shopsim  # noqa: F401  (registers the envs)

    env = gym.make(env_id)
    prompts = []
    for s in range(n):
        obs, _ = env.reset(seed=s, options={"split": "train"})
        prompts.append(agent.fmt.system_ids + agent.fmt.observation_ids(obs))
    env.close()
    return prompts


def bench_generation(agent, prompts, max_new_tokens: int, repeats: int = 1) -> dict:
    import torch

    from agents.lm.generation import SamplingConfig, left_pad, sample

    model = agent.model
    cfg = SamplingConfig(max_new_tokens=max_new_tokens)
    # no stop token (id -1 never occurs): both samplers produce the same number of tokens
    res = {}
    for label, batch in (("b32", prompts[:32]), ("b1", prompts[:1])):
        t0 = time.perf_counter()
        n = 0
        for r in range(repeats):
            out = sample(model, batch, stop_ids={-1}, pad_id=agent.policy.pad_id, config=cfg,
                         generator=torch.Generator().manual_seed(r))
            n += out.new_tokens
        res[f"ours_{label}_tok_s"] = n / (time.perf_counter() - t0)
    ids, mask = left_pad(prompts[:32], agent.policy.pad_id)
    t0 = time.perf_counter()
    n = 0
    with torch.no_grad():
        for _ in range(repeats):
            out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, max_new_tokens=max_new_tokens,
                                 min_new_tokens=max_new_tokens, pad_token_id=agent.policy.pad_id,
                                 eos_token_id=None)
            n += (out.shape[1] - ids.shape[1]) * ids.shape[0]
    res["hf_generate_b32_tok_s"] = n / (time.perf_counter() - t0)
    res["prompt_tokens_mean"] = sum(len(p) for p in prompts[:32]) / len(prompts[:32])
    return res


def bench_rollout(agent, env_id: str, episodes: int, num_envs: int = 32) -> dict:
    from shopsim.rollout import collect, summarize

    agent.stats.update(generate_s=0.0, act_s=0.0, new_tokens=0)
    t0 = time.perf_counter()
    trajs = collect(env_id, agent, episodes=episodes, split="dev", num_envs=num_envs, progress=False)
    wall = time.perf_counter() - t0
    s = summarize(trajs)
    return {"episodes": episodes, "wall_s": wall, "agent_s": agent.stats["act_s"],
            "env_share": (wall - agent.stats["act_s"]) / wall, "turns": s["turns"], "success": s["success"],
            "gen_tok_s_in_rollout": agent.stats["new_tokens"] / max(agent.stats["generate_s"], 1e-9)}


def main(argv=None) -> int:
    import torch

    from agents.lm.agent import LMAgent

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer tokens and episodes")
    p.add_argument("--checkpoint", default=None, help="model folder (default: shipped SFT checkpoint)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--env", default="shopsim/Shopping-v0")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    agent = LMAgent(env_id=a.env, checkpoint=a.checkpoint, temperature=1.0, max_new_tokens=32)
    from agents.lm.model import num_parameters

    print(f"model: {type(agent.model).__name__}, {num_parameters(agent.model) / 1e6:.2f}M params, "
          f"torch threads {a.threads}")
    prompts = _prompts(agent, 32, a.env)
    g = bench_generation(agent, prompts, max_new_tokens=16 if a.quick else 32)
    print(f"generation, prompt {g['prompt_tokens_mean']:.0f} tokens: ours batch 32 {g['ours_b32_tok_s']:.0f} tok/s, "
          f"batch 1 {g['ours_b1_tok_s']:.0f} tok/s (batching x{g['ours_b32_tok_s'] / g['ours_b1_tok_s']:.1f}); "
          f"HF generate batch 32 {g['hf_generate_b32_tok_s']:.0f} tok/s "
          f"(ours / HF = {g['ours_b32_tok_s'] / g['hf_generate_b32_tok_s']:.2f})")
    r = bench_rollout(agent, a.env, episodes=32 if a.quick else 96)
    print(f"rollout {r['episodes']} dev episodes, 32 envs: wall {r['wall_s']:.1f}s, agent {r['agent_s']:.1f}s, "
          f"env share {100 * r['env_share']:.1f}% (target < 10%), mean turns {r['turns']:.1f}, "
          f"success {r['success']:.2f}, in-rollout generation {r['gen_tok_s_in_rollout']:.0f} tok/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
