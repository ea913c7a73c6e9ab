"""LMAgent: works with any causal LM architecture, checkpoints round-trip, actions are extracted not repaired."""

from __future__ import annotations

import pytest

import agents
from agents.lm.agent import LMAgent
from agents.lm.model import build_model
from agents.lm.parsing import extract_action, is_tool_call
from shopsim.errors import ConfigError
from shopsim.rollout import collect
from tests.fixtures.toy_lm import ClickWordEnv


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_random_weight_model_of_each_architecture_runs_an_episode(tok, arch):
    model = build_model(tok, arch=arch, size="tiny", seed=0)
    agent = LMAgent(model=model, tokenizer=tok, max_new_tokens=8, record_hidden=True)
    traj = collect("shopsim/Shopping-v0", agent, episodes=1, env_fns=[lambda: ClickWordEnv(3)], progress=False)[0]
    assert traj.num_turns == 3
    for turn in traj.turns:
        assert isinstance(turn.action, str)
        assert 1 <= len(turn.action_ids) <= 8 and len(turn.action_logprobs) == len(turn.action_ids)
        assert all(lp <= 0 for lp in turn.action_logprobs)
        assert len(turn.hidden["last"]) == model.config.hidden_size


def test_checkpoint_round_trip(tok, tmp_path):
    model = build_model(tok, size="tiny", seed=3)
    agent = LMAgent(model=model, tokenizer=tok, context_mode="concat", greedy=True, max_new_tokens=6)
    agent.save(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "model.safetensors").is_file()
    again = agents.load_checkpoint(tmp_path / "ckpt", greedy=True, max_new_tokens=6)
    assert isinstance(again, LMAgent) and again.options["context_mode"] == "concat"
    runs = [collect("shopsim/Shopping-v0", a, episodes=2, env_fns=[lambda: ClickWordEnv(2)], progress=False)
            for a in (agent, again)]
    assert [t.action_ids for t in runs[0][0].turns] == [t.action_ids for t in runs[1][0].turns]


def test_bf16_export_halves_the_weights_and_loads_back_as_rounded_float32(tok, tmp_path):
    import json

    import torch

    from agents.lm.model import export_checkpoint, load_model

    model = build_model(tok, size="tiny", seed=3)
    LMAgent(model=model, tokenizer=tok, context_mode="concat", max_new_tokens=6).save(tmp_path / "ckpt")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "stale.txt").write_text("replaced as a whole")
    dst = export_checkpoint(tmp_path / "ckpt", tmp_path / "out")
    size = {d: (tmp_path / d / "model.safetensors").stat().st_size for d in ("ckpt", "out")}
    assert 0.45 < size["out"] / size["ckpt"] < 0.55
    assert not (dst / "stale.txt").exists() and not list(tmp_path.glob("*.export-*"))
    manifest = json.loads((dst / "shopsim_agent.json").read_text())
    assert manifest["export"] == {"from": str(tmp_path / "ckpt"), "dtype": "bfloat16"}
    again = load_model(dst)
    for a, b in zip(model.parameters(), again.parameters(), strict=True):
        assert b.dtype == torch.float32 and torch.equal(b, a.detach().to(torch.bfloat16).float())
    assert isinstance(agents.load_checkpoint(dst), LMAgent)
    with pytest.raises(ConfigError, match="dtype"):
        export_checkpoint(tmp_path / "ckpt", tmp_path / "x", dtype="int8")
    with pytest.raises(ConfigError, match="no config.json"):
        export_checkpoint(tmp_path / "nothing", tmp_path / "x")


def test_same_seed_same_trajectories(tok):
    model = build_model(tok, size="tiny", seed=0)
    agent = LMAgent(model=model, tokenizer=tok, max_new_tokens=6)
    runs = [collect("shopsim/Shopping-v0", agent, episodes=2, seed=5, env_fns=[lambda: ClickWordEnv(2)],
                    progress=False) for _ in range(2)]
    assert [t.action_ids for t in runs[0][1].turns] == [t.action_ids for t in runs[1][1].turns]


def test_bad_options(tok):
    with pytest.raises(ConfigError):
        LMAgent(model=build_model(tok, size="tiny"), tokenizer=None)
    with pytest.raises(ConfigError, match="context_mode"):
        LMAgent(model=build_model(tok, size="tiny"), tokenizer=tok, context_mode="bad")


@pytest.mark.parametrize("text,want", [
    (" search[red yoga mat] ", "search[red yoga mat]"),
    ("click[B0U1Z8YZYE]\nclick[buy now]", "click[B0U1Z8YZYE]"),
    ("buy", "buy"),
    ('{"name": "search", "arguments": {"query": "mat"}} trailing', '{"name": "search", "arguments": {"query": "mat"}}'),
    ("I think the answer is 3 [maybe]", "I think the answer is 3 [maybe]"),  # unparseable: passed on as is
    ('{"name": broken', '{"name": broken'),
])
def test_extract_action(text, want):
    assert extract_action(text) == want


def test_is_tool_call():
    assert is_tool_call('{"name": "buy", "arguments": {}}') and not is_tool_call("buy")


def test_policy_logprobs_are_differentiable(tok):
    model = build_model(tok, size="tiny", seed=0)
    agent = LMAgent(model=model, tokenizer=tok)
    lp, mask = agent.policy.action_logprobs([[5, 6, 7], [8]], [[9, 10], [11, 12, 13]])
    assert lp.shape == mask.shape == (2, 3) and mask.sum() == 5
    lp[mask].sum().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_checkpoint_restores_its_prompt_options_on_every_load_path(tok, tmp_path):
    """The manifest's options (history, ...) come back with `LMAgent(checkpoint=...)`, `from_checkpoint` and
    `agents.load_checkpoint`; an explicit argument wins. (A model fine-tuned on history=1 acts far worse with the
    default history=2, so losing them silently changes the agent.)"""
    model = build_model(tok, size="tiny", seed=0)
    LMAgent(model=model, tokenizer=tok, history=1, history_obs_chars=100, max_new_tokens=12).save(tmp_path / "c")
    for agent in (LMAgent(checkpoint=tmp_path / "c"), LMAgent.from_checkpoint(tmp_path / "c"),
                  agents.load_checkpoint(tmp_path / "c")):
        assert agent._ctx_kw["history"] == 1 and agent._ctx_kw["history_obs_chars"] == 100
        assert agent.sampling.max_new_tokens == 12 and agent.options["history"] == 1
    over = LMAgent(checkpoint=tmp_path / "c", history=3, history_obs_chars=None)
    assert over._ctx_kw["history"] == 3 and over._ctx_kw["history_obs_chars"] is None
    model.save_pretrained(tmp_path / "plain")  # a plain Hugging Face folder has no manifest: the defaults
    tok.save_pretrained(tmp_path / "plain")
    assert LMAgent(checkpoint=tmp_path / "plain")._ctx_kw["history"] == 2


def test_shipped_checkpoint_prompts_and_acts_the_same_in_plain_transformers():
    """`data/lm/sft` loaded with plain `transformers` got no system prompt (it was only in shopsim_agent.json), so
    it generated nonsense. Its chat template now carries it: `apply_chat_template` on the first page gives the ids
    of the agent's first prompt, and greedy `generate` the agent's greedy action."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agents.registry import manifest_env_kwargs
    from shopsim.paths import data_dir

    ckpt = data_dir() / "lm" / "sft"
    agent = agents.load_checkpoint(ckpt, env_id="shopsim/Shopping-v0")
    agent.sampling.greedy = True
    env_kwargs = {**manifest_env_kwargs(ckpt / "shopsim_agent.json"), "max_turns": 1}
    first = collect("shopsim/Shopping-v0", agent, episodes=2, seed=0, env_kwargs=env_kwargs, progress=False)
    tok = AutoTokenizer.from_pretrained(str(ckpt), local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(str(ckpt), local_files_only=True).eval()
    for traj in first:
        turn = traj.turns[0]
        ids = tok.apply_chat_template([{"role": "user", "content": turn.observation}], add_generation_prompt=True,
                                      tokenize=True, return_dict=False)
        assert list(ids) == list(turn.prompt_ids)
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), max_new_tokens=len(turn.action_ids), do_sample=False,
                                 eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        generated = out[0, len(ids):].tolist()
        assert generated == list(turn.action_ids)[:len(generated)] and len(generated) == len(turn.action_ids)
        assert tok.decode(generated, skip_special_tokens=True).strip() == turn.action
