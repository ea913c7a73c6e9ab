"""The LM update's forward without a padding mask (`LMConfig.padding_mask=False`) and its length bucketing.

Right-padded rows run on plain causal attention: every real token's log-prob must equal the forward over that row
alone (no padding at all) within 1e-5, for Llama and GPT-2, window and concat rows; the update's loss and gradient
must equal those of the previous path (one micro-batch of every row padded to the longest, explicit mask).
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

import baselines
from agents.lm.agent import LMAgent
from agents.lm.model import build_model
from agents.lm.tokenizer import load_tokenizer
from baselines.core.batch import build_batch
from baselines.core.trainer import body_inputs, forward_policy
from shopsim.errors import ConfigError
from shopsim.rollout import collect

ENV = "shopsim/Shopping-v0"
ENV_KW = {"catalog_size": 1000, "family": "find_and_buy", "numbered_results": True, "results_per_page": 5,
          "obs_mode": "terse", "max_turns": 4}


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


def _batch(tok, arch, mode):
    agent = LMAgent(model=build_model(tok, arch=arch, size="tiny", seed=3), tokenizer=tok, context_mode=mode,
                    max_new_tokens=8, temperature=1.0)
    trajs = collect(ENV, agent, episodes=2, group_size=2, seed=5, split="train", num_envs=4, env_kwargs=ENV_KW,
                    progress=False)
    batch = build_batch(trajs, pad_id=tok.pad_token_id)
    lengths = batch.attention_mask.sum(1)
    assert batch.mode == mode and int(lengths.min()) < int(lengths.max()), "no padding to test"
    return agent, trajs, batch


@pytest.mark.parametrize("mode", ["concat", "window"])
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_unmasked_forward_equals_each_row_alone(tok, arch, mode):
    agent, _, b = _batch(tok, arch, mode)
    model = agent.model.eval()
    lengths = b.attention_mask.sum(1)
    g = b.gen_mask.bool()
    with torch.no_grad():
        alone = torch.zeros_like(b.old_logp)
        for r, n in enumerate(lengths.tolist()):  # each row at its own length: no padding, no mask needed
            alone[r, :n] = forward_policy(model, b.input_ids[r:r + 1, :n], b.attention_mask[r:r + 1, :n],
                                          positions=b.gen_mask[r:r + 1, :n])[0][0]
        fast, _, hid = forward_policy(model, b.input_ids, b.attention_mask, positions=b.gen_mask,
                                      causal_only=True, need_hidden=True)
        full, _, _ = forward_policy(model, b.input_ids, b.attention_mask, causal_only=True)
        # the trainer's path: length-bucketed micro-batches, each trimmed to its longest row
        algo = baselines.make("grpo", env_id=ENV, micro_batch_tokens=2 * int(lengths.max()))
        algo.setup(agent)
        chunks = algo.micro_batches(b, torch.arange(b.num_rows))
        assert len(chunks) > 1
        bucketed = torch.zeros_like(b.old_logp)
        for ch in chunks:
            bucketed[ch] = algo.trimmed(lambda i, a, p: algo._rows_forward(model, i, a, positions=p), b, ch,
                                        b.gen_mask[ch])[0]
    assert g.sum() > 20
    assert float((fast - alone)[g].abs().max()) <= 1e-5
    assert float((full - alone)[g].abs().max()) <= 1e-5
    assert float((bucketed - alone)[g].abs().max()) <= 1e-5
    # and the recorded log-probs are these (the sampler's temperature is 1)
    assert float((fast - b.old_logp)[g].abs().max()) <= 1e-4
    pad = ~b.attention_mask.bool()
    assert (hid[pad] == 0).all() and hid[~pad].abs().sum() > 0


@pytest.mark.parametrize("mode", ["concat", "window"])
def test_update_loss_and_gradient_equal_the_padded_masked_path(tok, mode):
    agent, trajs, b = _batch(tok, "llama", mode)
    for i, t in enumerate(trajs):  # rewards that differ inside each group: every row has a non-zero advantage
        t.turns[-1].reward = float(i % 2)
    b = build_batch(trajs, pad_id=tok.pad_token_id)
    out = {}
    for name, kw in {"previous": dict(padding_mask=True, micro_batch_tokens=0),
                     "default": dict(micro_batch_tokens=2 * int(b.attention_mask.sum(1).max()))}.items():
        a = copy.deepcopy(agent)
        algo = baselines.make("grpo", env_id=ENV, group_size=2, lr=1e-3, loss_agg="seq-mean-token-mean", **kw)
        algo.setup(a)
        m = algo.update(b, generator=torch.Generator().manual_seed(0))
        # update() leaves the step's (clipped) gradient on the parameters
        out[name] = (m, [p.grad.clone() for p in a.model.parameters()])
    (m0, g0), (m1, g1) = out["previous"], out["default"]
    assert m0["tokens_processed_padded"] == b.input_ids.numel()
    assert m1["tokens_processed_padded"] < m0["tokens_processed_padded"]
    # at ratio 1 GRPO's loss is −mean(advantage) ≈ 0 by construction; the gradient is not
    assert m0["grad_norm"] > 1e-3
    assert m1["loss_policy"] == pytest.approx(m0["loss_policy"], abs=1e-6)
    assert m1["grad_norm"] == pytest.approx(m0["grad_norm"], rel=1e-4)
    for p, q in zip(g0, g1, strict=True):
        torch.testing.assert_close(q, p, atol=1e-6, rtol=1e-4)


def test_causal_only_needs_right_padding():
    left = torch.tensor([[0, 1, 1], [1, 1, 1]])
    with pytest.raises(ConfigError, match="right-padded"):
        body_inputs(left, causal_only=True)
    mask, pos = body_inputs(torch.tensor([[1, 1, 0], [1, 1, 1]]), causal_only=True)
    assert mask is None and pos.tolist() == [[0, 1, 2], [0, 1, 2]]


def test_micro_batches_keep_rows_of_very_different_lengths_apart():
    lengths = torch.tensor([100, 400, 105, 98, 390, 1000, 410, 102])
    fake = SimpleNamespace(attention_mask=(torch.arange(1000) < lengths[:, None]).long())
    algo = baselines.make("grpo", env_id=ENV, micro_batch_tokens=8192, micro_batch_padding=0.125)
    chunks = algo.micro_batches(fake, torch.arange(len(lengths)))
    assert sorted(torch.cat(chunks).tolist()) == list(range(len(lengths)))
    assert sorted(sorted(lengths[ch].tolist()) for ch in chunks) == [[98, 100, 102, 105], [390, 400, 410], [1000]]
    for ch in chunks:
        real = int(lengths[ch].sum())
        assert int(lengths[ch].max()) * len(ch) - real <= 0.125 * real
    # with no padding limit the token budget alone decides: short and long rows share a micro-batch
    loose = baselines.make("grpo", env_id=ENV, micro_batch_tokens=8192, micro_batch_padding=None)
    assert len(loose.micro_batches(fake, torch.arange(len(lengths)))) == 1
