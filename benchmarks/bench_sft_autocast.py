"""SFT step time in float32 against bfloat16 autocast (`SFTConfig.autocast`), per model size, on the same batches.

    .venv/bin/python -m benchmarks.bench_sft_autocast [--quick] [--sizes mini small] [--threads N] [--json PATH]

Builds the recipe's training rows (concat mode, expert episodes of every task family), then times optimizer steps
(forward, backward, clip, AdamW) of a fresh model of each size on the same fixed batches, first in float32 (the
reference, same run), then under ``torch.autocast("cpu", dtype=torch.bfloat16)``. Prints seconds per step, agent
tokens per second and the speed-up, and the first step's loss in both precisions (their gap is bfloat16 rounding).
The speed-up depends on the CPU: bfloat16 matrix units (AMX, AVX512-BF16) make it large, without them it can be
below 1.
"""

from __future__ import annotations

import argparse
import json
import time

ENV = "shopsim/Shopping-v0"


def _rows(episodes: int):
    from agents.lm.prompts import ChatFormat
    from agents.lm.sft import SFTConfig, build_examples, sft_expert_data
    from agents.lm.tokenizer import load_tokenizer

    cfg = SFTConfig(families=())
    trajs = sft_expert_data(ENV, episodes, cfg, progress=False)
    tok = load_tokenizer()
    return tok, build_examples(trajs, ChatFormat(tok), mode="concat", only_success=True)


def time_steps(tok, batches, size: str, autocast: bool, warmup: int = 1) -> dict:
    import torch

    from agents.lm.model import build_model, num_parameters
    from agents.lm.sft import sft_loss

    model = build_model(tok, size=size, seed=0)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    times, losses, tokens = [], [], 0
    for i, batch in enumerate(batches):
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss, n_tok, agent_loss = sft_loss(model, batch, tok.pad_token_id)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(agent_loss)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
            tokens += n_tok
    return {"params_m": num_parameters(model) / 1e6, "s_per_step": sum(times) / len(times),
            "agent_tok_s": tokens / sum(times), "first_loss": losses[0]}


def main(argv=None) -> int:
    import numpy as np
    import torch

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer steps and episodes")
    p.add_argument("--sizes", nargs="+", default=["mini", "small"])
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", default=None, help="write the measurements to this JSON file")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    tok, rows = _rows(40 if a.quick else 120)
    steps = 4 if a.quick else 12
    rng = np.random.default_rng(0)
    batches = [[rows[j] for j in rng.choice(len(rows), a.batch_size, replace=False)] for _ in range(steps + 1)]
    mean_len = float(np.mean([len(r[0]) for b in batches for r in b]))
    print(f"{len(rows)} concat rows, batch {a.batch_size}, mean row {mean_len:.0f} tokens, {steps} timed steps, "
          f"torch threads {a.threads}")
    out = {"batch_size": a.batch_size, "steps": steps, "mean_row_tokens": mean_len, "threads": a.threads, "sizes": {}}
    for size in a.sizes:
        ref = time_steps(tok, batches, size, autocast=False)
        bf = time_steps(tok, batches, size, autocast=True)
        speedup = ref["s_per_step"] / bf["s_per_step"]
        out["sizes"][size] = {"fp32": ref, "bf16": bf, "speedup": speedup}
        print(f"{size:6s} {ref['params_m']:.2f}M params: fp32 {ref['s_per_step']:.2f} s/step "
              f"({ref['agent_tok_s']:.0f} agent tok/s), bf16 autocast {bf['s_per_step']:.2f} s/step "
              f"({bf['agent_tok_s']:.0f} agent tok/s), speed-up x{speedup:.2f}; first loss fp32 "
              f"{ref['first_loss']:.4f} bf16 {bf['first_loss']:.4f}")
    if a.json:
        from shopsim.paths import write_text_atomic

        write_text_atomic(a.json, json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
