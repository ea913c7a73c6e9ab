"""Context modes: concat's strict prefix property, window's bounded history, masks aligned with recorded ids."""

from __future__ import annotations

import pytest
import torch

from agents.lm.agent import LMAgent
from agents.lm.model import build_model
from agents.lm.prompts import ChatFormat, EpisodeContext, concat_layout
from shopsim.errors import ConfigError
from shopsim.rollout import collect
from tests.fixtures.toy_lm import ClickWordEnv


def _run(tok, mode, episodes=3, length=5, **kw):
    model = build_model(tok, size="tiny", seed=0)
    agent = LMAgent(model=model, tokenizer=tok, context_mode=mode, max_new_tokens=10, **kw)
    trajs = collect("shopsim/Shopping-v0", agent, episodes=episodes, env_fns=[lambda: ClickWordEnv(length)],
                    num_envs=2, progress=False)
    return agent, trajs


def test_pieces_reassemble_the_chat_template(tok):
    fmt = ChatFormat(tok, "sys")
    msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": "page one $1.50"},
            {"role": "assistant", "content": "search[red mat]"}, {"role": "user", "content": "page two"}]
    want = tok(tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True),
               add_special_tokens=False)["input_ids"]
    action = fmt.encode("search[red mat]") + [tok.eos_token_id]
    got = fmt.system_ids + fmt.observation_ids("page one $1.50") + action + fmt.close_ids(action) + \
        fmt.observation_ids("page two")
    assert got == want
    assert fmt.stop_ids == {tok.eos_token_id}


def test_concat_prompts_are_strict_prefixes(tok):
    _, trajs = _run(tok, "concat")
    for traj in trajs:
        for prev, cur in zip(traj.turns, traj.turns[1:], strict=False):
            head = prev.prompt_ids + prev.action_ids
            assert cur.prompt_ids[: len(head)] == head
            assert len(cur.prompt_ids) > len(head)  # the new observation was appended


@pytest.mark.parametrize("mode", ["concat", "window"])
def test_generated_token_masks_align_with_recorded_ids(tok, mode):
    agent, trajs = _run(tok, mode)
    traj = trajs[0]
    if mode == "concat":
        ids, gen, turn_of = concat_layout(traj.turns)
        got = [i for i, g in zip(ids, gen, strict=False) if g]
        assert got == [i for t in traj.turns for i in t.action_ids]
        assert [k for k in turn_of if k >= 0] == [k for k, t in enumerate(traj.turns) for _ in t.action_ids]
        lp, _ = agent.policy.token_logprobs(torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long))
        rec = torch.tensor([x for t in traj.turns for x in t.action_logprobs])
        torch.testing.assert_close(lp[0][torch.tensor(gen)], rec, atol=1e-4, rtol=0)
    else:
        from agents.lm.generation import pack

        ids, att, amask = pack([t.prompt_ids for t in traj.turns], [t.action_ids for t in traj.turns],
                               agent.policy.pad_id)
        for row, t in enumerate(traj.turns):
            assert ids[row][amask[row]].tolist() == t.action_ids
        lp, mask = agent.policy.action_logprobs([t.prompt_ids for t in traj.turns], [t.action_ids for t in traj.turns])
        for row, t in enumerate(traj.turns):
            torch.testing.assert_close(lp[row][mask[row]], torch.tensor(t.action_logprobs), atol=1e-4, rtol=0)


def test_window_prompt_is_bounded(tok):
    _, trajs = _run(tok, "window", episodes=1, length=8, history=1)
    lengths = [len(t.prompt_ids) for t in trajs[0].turns]
    assert max(lengths[2:]) - min(lengths[2:]) <= 12 + 4  # one past turn: varies only with that action's length
    # the previous action's exact ids are in the window, right before the current observation
    for prev, cur in zip(trajs[0].turns, trajs[0].turns[1:], strict=False):
        n = len(prev.action_ids)
        assert any(cur.prompt_ids[i: i + n] == prev.action_ids for i in range(len(cur.prompt_ids) - n + 1))


def test_concat_layout_rejects_broken_prefix():
    with pytest.raises(ValueError, match="prefix"):
        concat_layout([{"prompt_ids": [1, 2], "action_ids": [3]}, {"prompt_ids": [1, 9, 3, 4], "action_ids": [5]}])


def test_window_drops_history_to_fit(tok):
    fmt = ChatFormat(tok)
    ctx = EpisodeContext(fmt, mode="window", history=3, history_obs_chars=None, max_prompt_tokens=200)
    ctx.start("a long page " * 10)
    for _ in range(3):
        ctx.step(fmt.encode("click[x]") + [tok.eos_token_id], "a long page " * 10)
    assert len(ctx.prompt()) <= 200 and not ctx.truncated


def test_bad_mode(tok):
    with pytest.raises(ConfigError, match="context_mode"):
        EpisodeContext(ChatFormat(tok), mode="sliding")


def test_concat_truncation_keeps_the_task_and_moves_in_steps(tok):
    """Over budget, a concat prompt keeps system + first observation and the most recent tokens, within the budget;
    the cut point moves in steps, so consecutive truncated prompts mostly extend each other (cache reuse)."""
    fmt = ChatFormat(tok)
    ctx = EpisodeContext(fmt, mode="concat", max_prompt_tokens=300)
    ctx.start("Task: buy a red lamp")
    head = fmt.system_ids + fmt.observation_ids("Task: buy a red lamp")
    prompts = []
    for k in range(40):
        ctx.step(fmt.encode(f"click[#{k % 5}]") + [tok.eos_token_id], f"page {k} " + "word " * 8)
        prompts.append(ctx.prompt())
    assert ctx.truncated
    assert all(len(p) <= 300 and p[: len(head)] == head for p in prompts)
    assert prompts[-1][-5:] == ctx.ids[-5:]
    extends = sum(b[: len(a)] == a for a, b in zip(prompts, prompts[1:], strict=False))
    assert extends >= 0.6 * (len(prompts) - 1)
