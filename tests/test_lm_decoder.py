"""The slot decoder (agents.lm.decoder.SlotDecoder): the LM agent's default decoding path computes what the
reference path (`generation.sample` over the `PrefixCache`, ``decoder="hf"``) computes.

Greedy: the shipped agent's actions, rewards and generated ids are identical on 3 families x 20 test episodes, at
different batch sizes. Sampling: the same tokens for the same per-episode streams, log-probs within float rounding of
the reference and of one forward pass over the recorded sequence. Cached keys/values are never reused across a change
of weights, and a slot's next episode reuses the common head of its prompt.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import agents
from agents.lm.agent import LMAgent
from agents.lm.decoder import SlotDecoder, supports
from agents.lm.generation import SamplingConfig, sample, token_logprobs
from agents.lm.model import build_model
from shopsim.errors import ConfigError
from shopsim.rollout import collect

ENV = "shopsim/Shopping-v0"
ROOT = Path(__file__).resolve().parents[1]
ENV_KW = {"catalog_size": 1000, "family": "find_and_buy", "numbered_results": True, "results_per_page": 5,
          "obs_mode": "terse", "max_turns": 6}


def _records(trajs):
    return [[(t.action, t.reward, list(t.action_ids)) for t in tr.turns] for tr in trajs]


@pytest.mark.parametrize("family", ["find_and_buy", "bundle", "after_sales"])
def test_shipped_agent_greedy_actions_identical_to_the_reference_path(family):
    from dataclasses import replace

    from shopsim.leaderboard.evaluate import run_seeds
    from shopsim.leaderboard.protocols import load_protocol

    whole = load_protocol(ENV, "test", sized=False)
    protocol = replace(whole.limited(tasks=20, seeds=[0], tries=1), decoding="greedy")
    protocol = replace(protocol, env_kwargs={**protocol.env_kwargs, "family": family})
    ckpt = ROOT / "data" / "lm" / "sft"
    ref = agents.load_checkpoint(ckpt, env_id=ENV, decoder="hf")
    fast = agents.load_checkpoint(ckpt, env_id=ENV)  # the default
    assert fast.slots is not None and ref.slots is None
    _, a = run_seeds(ref, protocol, num_envs=8, keep=True)
    _, b = run_seeds(fast, protocol, num_envs=20, keep=True)  # another batch composition too
    assert len(a) == len(b) == 20
    assert sum(t.num_turns for t in a) > 60
    assert _records(a) == _records(b)
    assert fast.slots.reused_tokens > 0


def _agent(tok, mode, decoder, model=None, **kw):
    model = model if model is not None else build_model(tok, size="tiny", seed=2)
    return LMAgent(model=model, tokenizer=tok, context_mode=mode, max_new_tokens=12, temperature=1.0,
                   decoder=decoder, **kw)


@pytest.mark.parametrize("mode", ["concat", "window"])
def test_sampled_tokens_and_logprobs_match_the_reference(tok, mode):
    runs = {}
    for decoder in ("hf", "slots"):
        agent = _agent(tok, mode, decoder, pin_first_turn=(mode == "window"))
        runs[decoder] = (agent, collect(ENV, agent, episodes=6, seed=3, split="dev", num_envs=4, env_kwargs=ENV_KW,
                                        progress=False))
    (_, a), (fast, b) = runs["hf"], runs["slots"]
    assert sum(t.num_turns for t in a) > 12
    assert [[list(t.action_ids) for t in tr.turns] for tr in a] == [[list(t.action_ids) for t in tr.turns]
                                                                  for tr in b]
    worst = max(float((torch.tensor(x.action_logprobs) - torch.tensor(y.action_logprobs)).abs().max())
                for tx, ty in zip(a, b, strict=True) for x, y in zip(tx.turns, ty.turns, strict=True))
    assert worst < 1e-5
    assert fast.slots.reused_tokens > 0
    # what the slot path recorded is what one forward pass over the recorded sequence gives
    for tr in b:
        for t in tr.turns:
            ids = torch.tensor([list(t.prompt_ids) + list(t.action_ids)])
            with torch.no_grad():
                lp, _ = token_logprobs(fast.model, ids, torch.ones_like(ids))
            assert float((lp[0, len(t.prompt_ids):] - torch.tensor(t.action_logprobs)).abs().max()) < 1e-4


def test_grouped_query_attention_matches_the_reference(tok):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                      tie_word_embeddings=True, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                      bos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    assert supports(model)
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [14, 15, 16, 17, 18, 19, 20, 21]]
    config = SamplingConfig(greedy=True, max_new_tokens=8)
    ref = sample(model, prompts, stop_ids={tok.eos_token_id}, pad_id=tok.pad_token_id, config=config)
    out = SlotDecoder().sample(model, prompts, [0, 1, 2], stop_ids={tok.eos_token_id}, pad_id=tok.pad_token_id,
                               config=config)
    assert out.ids == ref.ids
    assert max(abs(x - y) for a, b in zip(out.logprobs, ref.logprobs, strict=True)
               for x, y in zip(a, b, strict=True)) < 1e-5


def test_cached_keys_are_not_reused_after_the_weights_change(tok):
    model = build_model(tok, size="tiny", seed=4)
    config = SamplingConfig(greedy=True, max_new_tokens=6)
    stop, pad = {tok.eos_token_id}, tok.pad_token_id
    dec = SlotDecoder()
    first = [list(range(5, 40))]
    out = dec.sample(model, first, ["a"], stop_ids=stop, pad_id=pad, config=config)
    follow = [first[0] + out.ids[0][:-1] + list(range(40, 60))]
    with torch.no_grad():  # an optimizer step changes the weights in place
        for p in model.parameters():
            p.mul_(1.5)
    again = dec.sample(model, follow, ["a"], stop_ids=stop, pad_id=pad, config=config)
    fresh = SlotDecoder().sample(model, follow, ["a"], stop_ids=stop, pad_id=pad, config=config)
    assert again.extra["reused_tokens"] == 0
    assert again.ids == fresh.ids
    assert again.logprobs[0] == pytest.approx(fresh.logprobs[0], abs=1e-6)


def test_a_slot_reuses_the_head_of_its_next_episode(tok):
    model = build_model(tok, size="tiny", seed=5)
    config = SamplingConfig(greedy=True, max_new_tokens=6)
    stop, pad = {tok.eos_token_id}, tok.pad_token_id
    head = list(range(5, 30))
    dec = SlotDecoder()
    dec.sample(model, [head + [40, 41, 42]], [0], stop_ids=stop, pad_id=pad, config=config)
    dec.drop(0)  # the episode ended
    nxt = [head + [50, 51, 52, 53]]
    out = dec.sample(model, nxt, [0], stop_ids=stop, pad_id=pad, config=config)
    fresh = SlotDecoder().sample(model, nxt, [0], stop_ids=stop, pad_id=pad, config=config)
    assert out.extra["reused_tokens"] == len(head)
    assert out.ids == fresh.ids


def test_decoder_choice_is_checked(tok):
    gpt2 = build_model(tok, arch="gpt2", size="tiny", seed=0)
    assert not supports(gpt2)
    with pytest.raises(ConfigError, match="Llama-family"):
        LMAgent(model=gpt2, tokenizer=tok, decoder="slots")
    assert LMAgent(model=gpt2, tokenizer=tok).slots is None  # auto falls back to the reference path
    with pytest.raises(ConfigError, match="decoder="):
        LMAgent(model=build_model(tok, size="tiny"), tokenizer=tok, decoder="fast")
    with pytest.raises(ConfigError, match="distinct key"):
        SlotDecoder().sample(build_model(tok, size="tiny"), [[5, 6], [7, 8]], [1, 1], stop_ids={4}, pad_id=0,
                             config=SamplingConfig())


def test_draft_is_the_continuation_of_the_most_recent_match():
    import numpy as np

    dec = SlotDecoder(draft_tokens=4)
    ctx = np.array([5, 1, 2, 3, 7, 8, 9, 1, 2, 3, 4, 6])
    # the tail (6, 1, 2) never occurred; (1, 2) did, last at position 7, followed by 3, 4, 6, 1
    assert dec._draft(ctx, [1, 2], room=10) == [3, 4, 6, 1]
    assert dec._draft(ctx, [1, 2], room=3) == [3, 4]  # the token after the drafts needs room too
    assert dec._draft(ctx, [], room=10) == []  # 6 never occurred before
    assert dec._draft(ctx, [2, 3], room=10) == [4, 6, 2, 3]  # (6, 2, 3) never occurred; (2, 3) last at 8
    assert SlotDecoder(draft_tokens=0)._draft(ctx, [1, 2], room=10) == []
    with pytest.raises(ConfigError, match="draft_tokens"):
        SlotDecoder(draft_tokens=-1)


def test_draft_search_matches_a_window_scan():
    """The byte search finds what scanning every window of the sequence finds (the most recent earlier match of the
    longest tail n-gram), on random sequences over small vocabularies, where matches across token boundaries of
    the int64 bytes are common."""
    import numpy as np
    from numpy.lib.stride_tricks import sliding_window_view

    from agents.lm.decoder import DRAFT_NGRAM

    def scan(a: np.ndarray, k: int) -> list[int]:
        for n in range(min(DRAFT_NGRAM, len(a) - 1), 0, -1):
            hits = np.flatnonzero((sliding_window_view(a[:-1], n) == a[-n:]).all(1))
            if hits.size:
                return a[int(hits[-1]) + n: int(hits[-1]) + n + k].tolist()
        return []

    rng = np.random.default_rng(0)
    dec = SlotDecoder(draft_tokens=4)
    found = 0
    for trial in range(400):
        vocab = int(rng.choice([3, 8, 300, 70_000]))  # 256 + x and 65,536 + x ids share bytes with small ones
        a = rng.integers(0, vocab, size=int(rng.integers(1, 60)))
        cut = int(rng.integers(1, len(a) + 1))
        got = dec._draft(a[:cut].tobytes() if trial % 2 else a[:cut], a[cut:].tolist(), room=10)
        assert got == scan(a, 4), (a.tolist(), cut)
        found += bool(got)
    assert found > 100


@pytest.mark.parametrize("greedy", [True, False])
def test_drafting_changes_no_token_and_saves_decoding_passes(greedy):
    """Prompt-lookup drafting checks several copied tokens per pass; the shipped agent's tokens, log-probs and
    rewards are those of one-token-per-pass decoding, greedy and sampled from per-episode streams. (Sampled at top_p
    0.95: over the whole vocabulary, which of the far-tail tokens (p ~ 1e-7) a uniform lands on depends on float
    rounding of the cumulative sum, which any change of kernel shapes moves, this path's or the reference's.)"""
    ckpt = ROOT / "data" / "lm" / "sft"
    env_kw = {"family": "bundle"}
    runs = {}
    for k in (0, 8):
        agent = agents.load_checkpoint(ckpt, env_id=ENV)
        agent.slots = SlotDecoder(draft_tokens=k)
        agent.sampling.greedy = greedy
        agent.sampling.temperature, agent.sampling.top_p = 0.7, 0.95
        trajs = collect(ENV, agent, episodes=8, seed=11, split="dev", num_envs=8, env_kwargs=env_kw, progress=False,
                        agent_seed=5)
        runs[k] = (agent.slots, trajs)
    (plain, a), (drafted, b) = runs[0], runs[8]
    assert sum(t.num_turns for t in a) > 40
    assert [[(t.action, t.reward, list(t.action_ids)) for t in tr.turns] for tr in a] == \
        [[(t.action, t.reward, list(t.action_ids)) for t in tr.turns] for tr in b]
    worst = max(float((torch.tensor(x.action_logprobs) - torch.tensor(y.action_logprobs)).abs().max())
                for tx, ty in zip(a, b, strict=True) for x, y in zip(tx.turns, ty.turns, strict=True))
    assert worst < 1e-4
    assert plain.drafted_tokens == 0 and drafted.accepted_tokens > 0
    assert drafted.decode_passes < 0.8 * plain.decode_passes
