"""TRL on shopsim: `shopsim.datasets.to_messages` rows train TRL's SFTTrainer, and the Shopping-v0 environment class
of `shopsim.integrations.trl` (tools generated from the tool table) runs TRL's GRPOTrainer, with the tiny
from-config model and the shipped tokenizer on CPU."""

from __future__ import annotations

import inspect
import json
import os

import pytest
import torch

from shopsim.datasets import to_messages, write_dataset
from shopsim.envs.shopping.tools import TOOLS, Tool
from shopsim.errors import ConfigError, DatasetError
from shopsim.integrations.trl import environment_class, shopping_environment, task_dataset, tool_chat_template

ENV = "shopsim/Shopping-v0"
SIZE = 2000


@pytest.fixture(scope="module")
def expert_trajs():
    from agents.lm.sft import expert_trajectories

    return expert_trajectories(ENV, 4, env_kwargs={"catalog_size": SIZE}, num_envs=1, progress=False)


@pytest.fixture
def tiny():
    from agents.lm.model import build_model
    from agents.lm.tokenizer import load_tokenizer

    torch.set_num_threads(1)
    tok = load_tokenizer()
    return tok, build_model(tok, size="tiny", seed=0)


# ---- to_messages -------------------------------------------------------------------------------------------------
def test_to_messages_text_form_alternates_observations_and_actions(expert_trajs, tmp_path):
    rows = to_messages(expert_trajs, system="Be brief.")
    assert len(rows) == len(expert_trajs)
    for row, traj in zip(rows, expert_trajs, strict=True):
        msgs = row["messages"]
        assert msgs[0] == {"role": "system", "content": "Be brief."}
        assert [m["content"] for m in msgs[1::2]] == [t.observation for t in traj.turns]
        assert [m["content"] for m in msgs[2::2]] == [t.action for t in traj.turns]
        assert {m["role"] for m in msgs[1::2]} == {"user"} and {m["role"] for m in msgs[2::2]} == {"assistant"}
    # a dataset path reads the same episodes back
    path = write_dataset(tmp_path / "expert.parquet", expert_trajs)
    assert to_messages(path, system="Be brief.") == rows


def test_to_messages_tool_call_form_names_the_arguments(expert_trajs):
    from shopsim.envs.shopping.actions import parse

    traj = expert_trajs[0]
    msgs = to_messages([traj], form="tool_calls")[0]["messages"]
    assert msgs[0] == {"role": "user", "content": traj.turns[0].observation}
    calls = [m for m in msgs if m["role"] == "assistant"]
    answers = [m for m in msgs if m["role"] == "tool"]
    assert len(calls) == len(traj.turns) and len(answers) == len(traj.turns) - 1
    for turn, call in zip(traj.turns, calls, strict=True):
        fn = call["tool_calls"][0]["function"]
        act = parse(turn.action)
        assert fn["name"] == act.name and tuple(fn["arguments"].values()) == act.args
        assert list(fn["arguments"]) == list(TOOLS[act.name].arg_names)
    for k, answer in enumerate(answers):  # each tool message is the next observation, named after the call
        assert answer["content"] == traj.turns[k + 1].observation
        assert answer["name"] == calls[k]["tool_calls"][0]["function"]["name"]


def test_to_messages_keeps_an_unparsable_action_as_text(expert_trajs):
    import copy

    traj = copy.deepcopy(expert_trajs[0])
    traj.turns[0].action = "dance[now]"
    msgs = to_messages([traj], form="tool_calls")[0]["messages"]
    assert msgs[1] == {"role": "assistant", "content": "dance[now]"}
    assert msgs[2]["role"] == "user"  # answered by the next observation as a user message
    with pytest.raises(DatasetError, match="form"):
        to_messages([traj], form="xml")


def test_sft_trainer_runs_on_converted_data(expert_trajs, tiny, tmp_path):
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    tok, model = tiny
    before = [p.detach().clone() for p in model.parameters()]
    cfg = SFTConfig(output_dir=str(tmp_path), max_steps=3, per_device_train_batch_size=2, report_to="none",
                    use_cpu=True, logging_steps=1, save_strategy="no", max_length=1024, learning_rate=1e-3, seed=0)
    trainer = SFTTrainer(model=model, args=cfg, train_dataset=Dataset.from_list(to_messages(expert_trajs)),
                         processing_class=tok)
    trainer.train()
    assert trainer.state.global_step == 3
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))
    assert any((a != b).any() for a, b in zip(before, model.parameters(), strict=True))


def test_sft_trainer_runs_on_the_tool_call_form(expert_trajs, tiny, tmp_path):
    """`sft_dataset` keeps each call's own arguments (a plain Arrow struct would add the other tools' argument names
    as None) and SFTTrainer renders calls and tool schemas with a tool-capable template."""
    from trl import SFTConfig, SFTTrainer

    from shopsim.integrations.trl import sft_dataset

    ds = sft_dataset(expert_trajs)
    assert ds[0]["messages"] == to_messages(expert_trajs[:1], form="tool_calls")[0]["messages"]
    assert [t["function"]["name"] for t in json.loads(ds[0]["tools"])] == list(TOOLS)
    tok, model = tiny
    tok.chat_template = tool_chat_template()
    text = tok.apply_chat_template(ds[0]["messages"], tools=json.loads(ds[0]["tools"]), tokenize=False)
    assert '{"name": "search", "arguments": {"query": ' in text and "null" not in text
    cfg = SFTConfig(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=2, report_to="none",
                    use_cpu=True, logging_steps=1, save_strategy="no", max_length=2048, seed=0)
    trainer = SFTTrainer(model=model, args=cfg, train_dataset=ds, processing_class=tok)
    trainer.train()
    assert trainer.state.global_step == 2


def test_sft_dataset_gives_every_assistant_turn_its_action_with_the_shipped_tokenizer(expert_trajs):
    """The default tool-call form rendered every assistant turn as ``<|assistant|><|end|>`` with the shipped
    checkpoint's template (it rendered ``content`` only), so SFT trained on empty targets. Every form now renders
    each turn's action, one the env parses back to the action taken."""
    import re

    from agents.lm.tokenizer import load_tokenizer
    from shopsim.envs.shopping.actions import parse
    from shopsim.integrations.trl import sft_dataset
    from shopsim.paths import data_dir

    tok = load_tokenizer(data_dir() / "lm" / "sft")
    for form in ("tool_calls", "text"):
        ds = sft_dataset(expert_trajs, form=form)
        assert len(ds) == len(expert_trajs)
        for row, traj in zip(ds, expert_trajs, strict=True):
            tools = json.loads(row["tools"]) if "tools" in row else None
            text = tok.apply_chat_template(row["messages"], tools=tools, tokenize=False)
            targets = re.findall(r"<\|assistant\|>(.*?)<\|end\|>", text, flags=re.S)
            assert len(targets) == len(traj.turns), form
            assert all(targets), f"{form}: an empty assistant target"
            assert [parse(t) for t in targets] == [parse(turn.action) for turn in traj.turns], form
            if form == "tool_calls":
                # the env's JSON form of each call (the model's own action text, a tool call)
                assert [json.loads(t)["name"] for t in targets] == [parse(turn.action).name for turn in traj.turns]
                # the tool answers are the pages, shown as the model sees them while acting
                assert text.count("<|user|>") == len(traj.turns) and "<|tool|>" not in text


# ---- the environment class -----------------------------------------------------------------------------------------
def test_one_method_per_tool_with_schema_types_and_docstring():
    cls = shopping_environment(catalog_size=SIZE)
    public = {n for n, _ in inspect.getmembers(cls, predicate=inspect.isfunction) if not n.startswith("_")}
    assert public == set(TOOLS) | {"reset", "get_reward"}  # what TRL turns into tools: exactly the tool table
    from transformers.utils import get_json_schema

    for tool in TOOLS.values():
        schema = get_json_schema(getattr(cls, tool.name))["function"]
        assert schema["name"] == tool.name and schema["description"] == tool.description
        props = tool.parameters["properties"]
        assert list(schema["parameters"]["properties"]) == list(props)
        assert schema["parameters"].get("required", []) == list(props)
        for arg, p in props.items():
            assert schema["parameters"]["properties"][arg]["type"] == p["type"]
            assert schema["parameters"]["properties"][arg]["description"] == p["description"]


def test_a_new_tool_in_the_table_becomes_a_typed_method():
    """Tools added to the table (e.g. a new family's tools) appear without changes to the integration."""
    def _rate(env, stars: int, public: bool, tone: str) -> str:
        return f"rated {stars} {public} {tone}"

    params = {"type": "object", "properties": {
        "stars": {"type": "integer", "description": "Stars, 1 to 5."},
        "public": {"type": "boolean", "description": "Publish the rating."},
        "tone": {"type": "string", "description": "Tone.", "enum": ["warm", "neutral"]}},
        "required": ["stars", "public", "tone"], "additionalProperties": False}
    table = {**TOOLS, "rate": Tool("rate", "Rate the service.", params, _rate)}
    cls = environment_class(table, catalog_size=SIZE)
    from transformers.utils import get_json_schema

    fn = get_json_schema(cls.rate)["function"]
    assert {k: v["type"] for k, v in fn["parameters"]["properties"].items()} == {
        "stars": "integer", "public": "boolean", "tone": "string"}
    assert fn["parameters"]["properties"]["tone"]["enum"] == ["warm", "neutral"]
    env = cls()
    env.reset(task_id=3)
    assert "rated 4 True warm" in env.rate(stars=4, public=True, tone="warm")  # registered on the instance's env
    with pytest.raises(ConfigError, match="clashes"):
        environment_class({"reset": Tool("reset", "x", {"type": "object", "properties": {}, "required": [],
                                                         "additionalProperties": False}, _rate)})


def test_tool_calls_play_the_episode_and_get_reward_reads_its_return():
    env = shopping_environment(catalog_size=SIZE, invalid_penalty=0.1)()
    first = env.reset(prompt=[{"role": "user", "content": "x"}], split="train", task_id=4, family="find_and_buy",
                      seed=1)
    assert first.startswith("Task:") and env.env.task.task_id == 4
    page = env.search(query="boots")
    assert "results for \"boots\"" in page
    bad = env.click(target="no such button")
    assert "Invalid action" in bad and not env.done  # an invalid call stays in the episode
    assert env.get_reward() == pytest.approx(-0.1)
    env.click(target="#1")
    assert "The episode is over" in env.buy()
    score = env.info["score"]
    assert env.done and env.get_reward() == pytest.approx(score - 0.1)
    with pytest.raises(ValueError, match="over"):
        env.search(query="more")
    env.reset(task_id=4, family="find_and_buy", seed=1)  # a reset clears the episode
    assert env.get_reward() == 0.0 and not env.done


def test_trl_parses_tool_calls_that_drive_the_environment(tiny):
    """The chat template TRL is given renders the generated schemas, and TRL's parser of that template reads back
    a generated tool call that the environment executes."""
    from trl.chat_template_utils import add_response_schema, parse_response, supports_tool_calling

    tok, _ = tiny
    # the shipped template renders tool calls (as the env's JSON actions), but TRL has no parser for it
    assert supports_tool_calling(tok)
    with pytest.raises(ValueError, match="Unrecognized chat template"):
        add_response_schema(tok)
    tok.chat_template = tool_chat_template()
    assert supports_tool_calling(tok)
    env = shopping_environment(catalog_size=SIZE)()
    env.reset(task_id=4, family="find_and_buy")
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tools=[env.search, env.cancel_order],
                                   tokenize=False, add_generation_prompt=True)  # what GRPOTrainer's prompt holds
    assert '"name": "search"' in text and TOOLS["cancel_order"].description in text
    add_response_schema(tok)
    generated = '<tool_call>\n{"name": "search", "arguments": {"query": "hiking boots"}}\n</tool_call><|im_end|>'
    tools = [env.search, env.cancel_order]
    prefix = tok.apply_chat_template([{"role": "user", "content": "hi"}], tools=tools, tokenize=True,
                                     add_generation_prompt=True, return_dict=False)
    parsed = parse_response(tok, tok(generated, add_special_tokens=False)["input_ids"], prefix=prefix, tools=tools)
    call = parsed["tool_calls"][0]["function"]
    arguments = call["arguments"] if isinstance(call["arguments"], dict) else json.loads(call["arguments"])
    page = getattr(env, call["name"])(**arguments)
    assert 'results for "hiking boots"' in page


def test_task_dataset_rows_are_reset_options():
    ds = task_dataset(3, split="dev", family="bundle", seed=5)
    assert ds.column_names == ["prompt", "split", "task_id", "seed", "family"]
    from shopsim.envs.shopping.tasks import split_ids

    assert ds["task_id"] == list(split_ids("dev")[:3]) and ds["seed"] == [5, 6, 7]
    with pytest.raises(ConfigError, match="choose 1 to"):
        task_dataset(0)


def test_grpo_trainer_runs_two_steps_with_the_environment(tiny, tmp_path, monkeypatch):
    from trl import GRPOConfig, GRPOTrainer

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    tok, model = tiny
    tok.chat_template = tool_chat_template()  # the TRL requirement the shipped template does not meet
    ds = task_dataset(4, family="find_and_buy")
    cfg = GRPOConfig(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=2, num_generations=2,
                     max_completion_length=8, report_to="none", use_cpu=True, logging_steps=1, save_strategy="no",
                     seed=0)
    trainer = GRPOTrainer(model=model, args=cfg, train_dataset=ds, processing_class=tok,
                          environment_factory=shopping_environment(catalog_size=SIZE, max_turns=6))
    assert sorted(t.__name__ for t in trainer.tools) == sorted(TOOLS)
    trainer.train()
    assert trainer.state.global_step == 2
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 2 and all("rewards/ShoppingToolEnv/mean" in h for h in logs)  # the env's reward column
    # the rollouts ran in environments reset on the dataset's tasks
    assert {e.env.task.task_id for e in trainer.environments} <= set(ds["task_id"])
    assert os.environ["TRL_EXPERIMENTAL_SILENCE"] == "1"
