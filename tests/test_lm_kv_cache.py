"""The per-episode KV cache (agents.lm.generation.PrefixCache): each token is encoded once, and nothing changes.

Records made with the cache equal one forward pass over the recorded sequence (both context modes, both
architectures), the same seed gives the same trajectories with and without it, and a concat turn encodes only
what the env added since the last action.
"""

from __future__ import annotations

import pytest
import torch

from agents.lm.agent import LMAgent
from agents.lm.generation import PrefixCache, SamplingConfig, sample, token_logprobs
from agents.lm.model import build_model
from agents.lm.prompts import concat_layout
from shopsim.rollout import collect

ENV = "shopsim/Shopping-v0"
ENV_KW = {"catalog_size": 1000, "family": "find_and_buy", "numbered_results": True, "results_per_page": 5,
          "obs_mode": "terse", "max_turns": 6}


def _agent(tok, arch, mode, kv_cache, **kw):
    model = build_model(tok, arch=arch, size="tiny", seed=2)
    # the reference path, whose prefix cache this file tests (the slot decoder: tests/test_lm_decoder.py)
    return LMAgent(model=model, tokenizer=tok, context_mode=mode, kv_cache=kv_cache, max_new_tokens=12,
                   temperature=1.0, decoder="hf", **kw)


def _run(agent, episodes=4, seed=3):
    return collect(ENV, agent, episodes=episodes, seed=seed, split="dev", num_envs=3, env_kwargs=ENV_KW,
                   progress=False)


def _max_diff_one_pass(agent, trajs):
    """Largest |recorded − recomputed| log-prob, recomputing each turn's prompt+action with one forward pass."""
    worst = 0.0
    for tr in trajs:
        for t in tr.turns:
            ids = torch.tensor([list(t.prompt_ids) + list(t.action_ids)])
            with torch.no_grad():
                lp, _ = token_logprobs(agent.model, ids, torch.ones_like(ids))
            rec = torch.tensor(t.action_logprobs)
            worst = max(worst, float((lp[0, len(t.prompt_ids):] - rec).abs().max()))
    return worst


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("mode", ["concat", "window"])
def test_cached_records_equal_one_forward_pass(tok, arch, mode):
    agent = _agent(tok, arch, mode, kv_cache=True, pin_first_turn=(mode == "window"))
    trajs = _run(agent)
    assert sum(t.num_turns for t in trajs) > 8
    assert agent.kv_cache.reused_tokens > 0  # the cache was actually used
    assert _max_diff_one_pass(agent, trajs) <= 1e-4
    if mode == "concat":  # a concat episode is one row: score it in one pass too
        for tr in trajs:
            ids, gen, _ = concat_layout(tr.turns)
            x = torch.tensor([ids])
            with torch.no_grad():
                lp, _ = token_logprobs(agent.model, x, torch.ones_like(x))
            rec = torch.tensor([v for t in tr.turns for v in t.action_logprobs])
            torch.testing.assert_close(lp[0][torch.tensor(gen)], rec, atol=1e-4, rtol=0)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("mode", ["concat", "window"])
def test_same_seed_same_trajectories_with_and_without_cache(tok, arch, mode):
    runs = [_run(_agent(tok, arch, mode, kv_cache=kv, pin_first_turn=True)) for kv in (True, False)]
    for a, b in zip(*runs, strict=False):
        assert [t.action_ids for t in a.turns] == [t.action_ids for t in b.turns]
        assert [t.prompt_ids for t in a.turns] == [t.prompt_ids for t in b.turns]
        for ta, tb in zip(a.turns, b.turns, strict=False):
            torch.testing.assert_close(torch.tensor(ta.action_logprobs), torch.tensor(tb.action_logprobs),
                                       atol=1e-5, rtol=0)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("mode", ["concat", "window"])
def test_prompts_encoded_row_by_row_sample_what_one_padded_batch_samples(tok, arch, mode):
    runs = []
    for prefill in ("rows", "batch", "auto"):
        agent = _agent(tok, arch, mode, kv_cache=True, pin_first_turn=True, record_hidden=True)
        agent.sampling.prefill = prefill
        runs.append(_run(agent, episodes=6))
    assert sum(t.num_turns for t in runs[0]) > 12
    for a, b in [(x, y) for x, rest in zip(runs[0], zip(*runs[1:], strict=True), strict=True) for y in rest]:
        assert [t.action_ids for t in a.turns] == [t.action_ids for t in b.turns]
        for ta, tb in zip(a.turns, b.turns, strict=True):
            torch.testing.assert_close(torch.tensor(ta.action_logprobs), torch.tensor(tb.action_logprobs),
                                       atol=1e-5, rtol=0)
            torch.testing.assert_close(torch.tensor(ta.hidden["mean"]), torch.tensor(tb.hidden["mean"]),
                                       atol=1e-5, rtol=0)


def test_auto_prefill_picks_rows_only_where_padding_would_cost_more(tok):
    """`prefill_cost`: equal short prompts are one padded forward (one overhead instead of one per row); one long
    concat context among short ones makes the padded batch pay for it in every row, so each row runs alone."""
    from agents.lm.generation import ROW_OVERHEAD_UNITS, prefill_cost
    from agents.lm.model import build_model

    model = build_model(tok, size="mini", seed=0)
    linear = (4 * 128 * 128 + 3 * 128 * 384) / 256
    assert prefill_cost(model, [10, 20], [100, 50], "rows") == \
        10 * (linear + 100) + 20 * (linear + 50) + 2 * ROW_OVERHEAD_UNITS
    assert prefill_cost(model, [10, 20], [100, 50], "batch") == 2 * 20 * (linear + 100) + ROW_OVERHEAD_UNITS
    equal = ([60] * 16, [400] * 16)
    assert prefill_cost(model, *equal, "batch") < prefill_cost(model, *equal, "rows")
    skewed = ([300] + [5] * 15, [3000] + [300] * 15)
    assert prefill_cost(model, *skewed, "rows") < prefill_cost(model, *skewed, "batch")


def test_concat_turn_encodes_only_what_the_env_added(tok):
    agent = _agent(tok, "llama", "concat", kv_cache=True)
    trajs = _run(agent, episodes=2)
    # per turn after the first: the last sampled token of the previous action + close + new observation
    expected = 0
    for tr in trajs:
        expected += len(tr.turns[0].prompt_ids)
        for prev, cur in zip(tr.turns, tr.turns[1:], strict=False):
            expected += len(cur.prompt_ids) - (len(prev.prompt_ids) + len(prev.action_ids)) + 1
    assert agent.kv_cache.encoded_tokens == expected
    prompt_total = sum(len(t.prompt_ids) for tr in trajs for t in tr.turns)
    assert agent.kv_cache.encoded_tokens + agent.kv_cache.reused_tokens == prompt_total


def test_hidden_summary_is_the_same_with_the_cache(tok):
    runs = [_run(_agent(tok, "llama", "concat", kv_cache=kv, record_hidden=True), episodes=2) for kv in (True, False)]
    for a, b in zip(*runs, strict=False):
        for ta, tb in zip(a.turns, b.turns, strict=False):
            for key in ("mean", "last"):
                torch.testing.assert_close(torch.tensor(ta.hidden[key]), torch.tensor(tb.hidden[key]),
                                           atol=1e-4, rtol=0)


@pytest.mark.parametrize("prefill", ["batch", "rows"])
def test_finished_rows_leave_the_batch(tok, prefill):
    """A row that stops early costs no further decoding steps, and its records are what it would get alone."""
    model = build_model(tok, size="tiny", seed=1).eval()
    stop = tok.eos_token_id
    prompts = [tok("search[red lamp]", add_special_tokens=False)["input_ids"],
               tok("click[#2] then more words", add_special_tokens=False)["input_ids"]]
    calls = []

    def stop_row0(module, args, kwargs, output):  # row 0 of the first batch always wants to stop
        calls.append(kwargs["input_ids"].shape[0])
        if len(calls) == 1:
            output.logits[0, -1, stop] += 100.0
        return output

    handle = model.register_forward_hook(stop_row0, with_kwargs=True)
    try:
        out = sample(model, prompts, stop_ids={stop}, pad_id=tok.pad_token_id,
                     config=SamplingConfig(greedy=True, max_new_tokens=5, prefill=prefill), cache=PrefixCache(),
                     keys=[0, 1])
    finally:
        handle.remove()
    assert out.ids[0] == [stop]
    assert len(out.ids[1]) == 5
    # the prompts: one forward over both rows ("batch") or one per row ("rows"); then 4 decoding steps on the one
    # live row only
    assert calls == ([2] if prefill == "batch" else [1, 1]) + [1] * 4
    alone = sample(model, prompts[1:], stop_ids={stop}, pad_id=tok.pad_token_id,
                   config=SamplingConfig(greedy=True, max_new_tokens=5))
    assert alone.ids[0] == out.ids[1]


def test_keep_finished_gives_the_same_records(tok):
    """The previous decoding (finished rows stay in the batch) records the same greedy ids and log-probs."""
    model = build_model(tok, size="tiny", seed=1).eval()
    texts = ["search[red lamp]", "click[#2] then more words", "x " * 30]
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    first = sample(model, prompts, stop_ids={tok.eos_token_id}, pad_id=tok.pad_token_id,
                   config=SamplingConfig(greedy=True, max_new_tokens=1)).ids[0][0]
    stop = {tok.eos_token_id, first}  # row 0 stops at once, the others run on
    outs = [sample(model, prompts, stop_ids=stop, pad_id=tok.pad_token_id,
                   config=SamplingConfig(greedy=True, max_new_tokens=12, keep_finished=keep)) for keep in (False, True)]
    assert len(outs[0].ids[0]) == 1 and max(len(i) for i in outs[0].ids) > 1
    assert outs[0].ids == outs[1].ids
    for a, b in zip(outs[0].logprobs, outs[1].logprobs, strict=False):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=1e-5, rtol=0)
