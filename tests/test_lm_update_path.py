"""The LM update path on real LMAgent rollouts: recorded log-probs are π_old, so skipping the recomputation is exact.

With one epoch of on-policy data the trainer uses the recorded behaviour log-probs as π_old by default
(`LMConfig.recompute_old_logp=None`); a recomputation over the batch must agree with them within 1e-4.
"""

from __future__ import annotations

import pytest
import torch

import baselines
from agents.lm.agent import LMAgent
from agents.lm.model import build_model
from agents.lm.tokenizer import load_tokenizer
from baselines.core.batch import build_batch
from shopsim.rollout import collect

ENV_KW = {"catalog_size": 1000, "family": "find_and_buy", "numbered_results": True, "results_per_page": 5,
          "obs_mode": "terse", "max_turns": 5}


@pytest.mark.parametrize("mode", ["concat", "window"])
def test_recomputed_old_logprobs_agree_with_the_recorded_ones(mode):
    tok = load_tokenizer()
    agent = LMAgent(model=build_model(tok, size="tiny", seed=4), tokenizer=tok, context_mode=mode,
                    max_new_tokens=10, temperature=0.8)
    trajs = collect("shopsim/Shopping-v0", agent, episodes=4, seed=1, split="train", num_envs=4, env_kwargs=ENV_KW,
                    progress=False)
    batch = build_batch(trajs, pad_id=tok.pad_token_id)
    assert batch.mode == mode
    skip = baselines.make("grpo", env_id="shopsim/Shopping-v0", temperature=0.8)
    again = baselines.make("grpo", env_id="shopsim/Shopping-v0", temperature=0.8, recompute_old_logp=True,
                           micro_batch_tokens=256)
    assert not skip.config.recomputes_old_logp and again.config.recomputes_old_logp
    assert baselines.make("grpo", env_id="shopsim/Shopping-v0", update_epochs=2).config.recomputes_old_logp
    for algo in (skip, again):
        algo.setup(agent)
    a, b = skip.prepare(batch), again.prepare(batch)
    assert torch.equal(a.old_logp, batch.old_logp)
    m = batch.gen_mask
    assert m.sum() > 20
    assert float((a.old_logp - b.old_logp)[m].abs().max()) <= 1e-4


def test_cut_concat_episodes_become_exact_segment_rows():
    """Concat episodes whose context was cut: split into segment rows, and a forward pass over every row gives the
    recorded log-probs (each row is what the model saw)."""
    tok = load_tokenizer()
    agent = LMAgent(model=build_model(tok, size="tiny", seed=4), tokenizer=tok, context_mode="concat",
                    max_new_tokens=10, temperature=0.8, max_prompt_tokens=260)
    kw = {**ENV_KW, "max_turns": 8}
    trajs = collect("shopsim/Shopping-v0", agent, episodes=6, seed=2, split="train", num_envs=6, env_kwargs=kw,
                    progress=False)
    batch = build_batch(trajs, pad_id=tok.pad_token_id)
    assert batch.mode == "concat"
    segments = torch.bincount(batch.row_traj, minlength=len(trajs))
    assert segments.max() > 1, "no episode was cut; lower max_prompt_tokens"
    assert batch.num_rows < sum(t.num_turns for t in trajs)  # segments still share their prefixes
    again = baselines.make("grpo", env_id="shopsim/Shopping-v0", temperature=0.8, recompute_old_logp=True,
                           micro_batch_tokens=512)
    again.setup(agent)
    b = again.prepare(batch)
    m = batch.gen_mask
    assert float((batch.old_logp - b.old_logp)[m].abs().max()) <= 1e-4
