"""Batched KV-cache sampling records exactly what the model computed (agents.lm.generation)."""

from __future__ import annotations

import pytest
import torch

from agents.lm.generation import SamplingConfig, _top_p_filter, action_logprobs, left_pad, sample
from agents.lm.model import build_model
from shopsim.errors import ConfigError


def _prompts(tok):
    texts = ["search[yoga mat]", "Instruction: buy a red lamp under $30.00, size M", "click", "x " * 40]
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_recomputed_logprobs_match_sampled(tok, arch, temperature, top_p):
    model = build_model(tok, arch=arch, size="tiny", seed=1).eval()
    prompts = _prompts(tok)  # very different lengths -> heavy left padding
    cfg = SamplingConfig(temperature=temperature, top_p=top_p, max_new_tokens=16)
    out = sample(model, prompts, stop_ids={tok.eos_token_id}, pad_id=tok.pad_token_id, config=cfg,
                 generator=torch.Generator().manual_seed(0))
    assert all(len(i) == len(lp) > 0 for i, lp in zip(out.ids, out.logprobs, strict=False))
    lp, mask = action_logprobs(model, prompts, out.ids, pad_id=tok.pad_token_id, temperature=temperature)
    for i, ids in enumerate(out.ids):
        assert mask[i].sum() == len(ids)
        torch.testing.assert_close(lp[i, : len(ids)], torch.tensor(out.logprobs[i]), atol=1e-4, rtol=0)
    # each row alone (no padding at all) gives the same records: padding does not leak into the computation
    single = sample(model, prompts[1:2], stop_ids={tok.eos_token_id}, pad_id=tok.pad_token_id,
                    config=SamplingConfig(greedy=True, max_new_tokens=8))
    batched = sample(model, prompts, stop_ids={tok.eos_token_id}, pad_id=tok.pad_token_id,
                     config=SamplingConfig(greedy=True, max_new_tokens=8))
    assert single.ids[0] == batched.ids[1]
    torch.testing.assert_close(torch.tensor(single.logprobs[0]), torch.tensor(batched.logprobs[1]), atol=1e-4, rtol=0)


def test_stops_at_stop_token_and_records_it(tok):
    model = build_model(tok, size="tiny", seed=0).eval()
    stop = tok.eos_token_id

    def force_stop(module, args, output):  # make the stop token overwhelmingly likely
        output.logits[..., stop] += 50.0
        return output

    handle = model.register_forward_hook(force_stop)
    try:
        out = sample(model, _prompts(tok), stop_ids={stop}, pad_id=tok.pad_token_id,
                     config=SamplingConfig(max_new_tokens=10), generator=torch.Generator().manual_seed(0))
    finally:
        handle.remove()
    assert all(ids == [stop] for ids in out.ids)
    assert all(out.stopped)


def test_hidden_summary_shapes_and_values(tok):
    model = build_model(tok, size="tiny", seed=0).eval()
    prompts = _prompts(tok)
    out = sample(model, prompts, stop_ids={tok.eos_token_id}, pad_id=tok.pad_token_id,
                 config=SamplingConfig(max_new_tokens=2, record_hidden=True))
    ids, mask = left_pad(prompts[:1], tok.pad_token_id)
    with torch.no_grad():
        h = model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states[-1][0]
    assert len(out.hidden) == len(prompts) and len(out.hidden[0]["mean"]) == model.config.hidden_size
    torch.testing.assert_close(torch.tensor(out.hidden[0]["last"]), h[-1], atol=1e-4, rtol=0)
    torch.testing.assert_close(torch.tensor(out.hidden[0]["mean"]), h.mean(0), atol=1e-4, rtol=0)


def test_same_seed_same_samples(tok):
    model = build_model(tok, size="tiny", seed=0).eval()
    runs = [sample(model, _prompts(tok), stop_ids={tok.eos_token_id}, pad_id=tok.pad_token_id,
                   config=SamplingConfig(max_new_tokens=6), generator=torch.Generator().manual_seed(7)).ids
            for _ in range(2)]
    assert runs[0] == runs[1]


def test_top_p_keeps_the_nucleus():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = torch.isfinite(_top_p_filter(logits, 0.7))[0].tolist()
    assert kept == [True, True, False, False]
    assert torch.isfinite(_top_p_filter(logits, 0.01))[0].tolist() == [True, False, False, False]


@pytest.mark.parametrize("kw", [{"temperature": 0}, {"top_p": 0}, {"top_p": 1.5}, {"max_new_tokens": 0}])
def test_bad_sampling_config(kw):
    with pytest.raises(ConfigError):
        SamplingConfig(**kw)


def test_categorical_draws_follow_the_distribution_and_never_pick_zero_mass():
    from agents.lm.generation import categorical

    probs = torch.tensor([[0.0, 0.2, 0.0, 0.5, 0.3, 0.0]]).repeat(20000, 1)
    g = torch.Generator().manual_seed(0)
    draws = categorical(probs, g)
    freq = torch.bincount(draws, minlength=6).float() / len(draws)
    assert freq[[0, 2, 5]].sum() == 0
    torch.testing.assert_close(freq, probs[0], atol=0.015, rtol=0)
    again = categorical(probs, torch.Generator().manual_seed(0))
    assert torch.equal(draws, again)
