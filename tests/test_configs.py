"""Configs: the generic validator (`shopsim.configs`), field docs, flags built from fields, `--show-config`, typed
`--set`, and `shopsim sft` defaults equal to `SFTConfig()`."""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass, field
from typing import Literal

import pytest

from shopsim.configs import (
    add_config_arguments,
    bounded,
    config_fields,
    describe_config,
    field_docs,
    parse_text,
    validate,
)
from shopsim.errors import ConfigError


@dataclass
class Toy:
    """A hand-made config."""

    mode: Literal["fast", "slow"] = "fast"
    """How to go."""
    rate: float = bounded(0.5, gt=0, max=1)
    """A rate in (0, 1]."""
    count: int = bounded(3, min=1)
    """How many."""
    flag: bool = False
    """A switch."""
    name: str = "x"
    """A name."""
    limit: int | None = bounded(None, min=0)
    """An optional limit."""
    sizes: tuple[int, ...] = (4, 4)
    """Layer widths."""
    options: dict = field(default_factory=dict)
    """Free options."""

    def __post_init__(self) -> None:
        validate(self)


def _toy_registry_configs():
    import baselines.registry as reg

    classes = {reg.load_target(t).Config for t in reg._REGISTRY.values()}
    from agents.lm.sft import SFTConfig
    from baselines.core.config import LMConfig

    return sorted(classes | {SFTConfig, LMConfig}, key=lambda c: c.__qualname__)


REAL_CONFIGS = _toy_registry_configs()


# ---------------------------------------------------------------------------------------------- the validator
@pytest.mark.parametrize("kwargs,message", [
    ({"mode": "medium"}, "mode: expected one of 'fast', 'slow', got 'medium'"),
    ({"rate": "fast"}, "rate: expected a float, got 'fast'"),
    ({"rate": True}, "rate: expected a float, got True"),
    ({"count": 2.5}, "count: expected an int, got 2.5"),
    ({"flag": "yes"}, "flag: expected a bool (true or false), got 'yes'"),
    ({"name": 3}, "name: expected a string, got 3"),
    ({"limit": "none"}, "limit: expected an int or null, got 'none'"),
    ({"sizes": (4, "x")}, "sizes: expected a list of ints, got (4, 'x')"),
    ({"options": [1]}, "options: expected a JSON object, got [1]"),
    ({"rate": 0}, "rate: expected a value in (0, 1], got 0"),
    ({"rate": 1.5}, "rate: expected a value in (0, 1], got 1.5"),
    ({"count": 0}, "count: expected a value >= 1, got 0"),
    ({"limit": -1}, "limit: expected a value >= 0, got -1"),
])
def test_validator_names_field_value_and_what_is_allowed(kwargs, message):
    with pytest.raises(ConfigError) as err:
        Toy(**kwargs)
    assert str(err.value) == message


def test_validator_accepts_and_normalises_good_values():
    t = Toy(mode="slow", rate=1, count=1, flag=True, limit=None, sizes=[8, 16], options={"a": 1})
    assert t.rate == 1.0 and isinstance(t.rate, float)
    assert t.sizes == (8, 16) and isinstance(t.sizes, tuple)
    assert Toy(limit=0).limit == 0


@pytest.mark.parametrize("make,message", [
    (lambda: __import__("baselines.grpo").grpo.GRPOConfig(scale_rewards="std"), "scale_rewards: expected one of"),
    (lambda: __import__("baselines.mpo").mpo.MPOConfig(lam_turn=2), "lam_turn: expected a value in [0, 1], got 2"),
    (lambda: __import__("baselines.capg").capg.CAPGConfig(optimizer="rmsprop"), "optimizer: expected one of"),
    (lambda: __import__("baselines.prorl").prorl.ProRLConfig(group_size=1), "group_size: expected a value >= 2"),
    (lambda: __import__("baselines.hybrid_ppo").hybrid_ppo.HybridPPOConfig(clip=1.0),
     "clip: expected a value in (0, 1), got 1.0"),
    (lambda: __import__("baselines.reinforce").reinforce.ReinforceConfig(ema_decay="x"),
     "ema_decay: expected a float, got 'x'"),
    (lambda: __import__("agents.lm.sft").lm.sft.SFTConfig(size="huge"), "size: expected one of 'tiny'"),
    (lambda: __import__("baselines.core.config").core.config.LMConfig(kl_kind="k2"),
     "kl_kind: expected one of 'k1', 'k3', got 'k2'"),
])
def test_real_configs_use_the_validator(make, message):
    with pytest.raises(ConfigError) as err:
        make()
    assert str(err.value).startswith(message)


def test_cross_field_rules_stay():
    from baselines.prorl import ProRLConfig
    from baselines.reinforce import ReinforceConfig

    with pytest.raises(ConfigError, match="rloo"):
        ReinforceConfig(baseline="rloo", group_size=1)
    assert ReinforceConfig(baseline="rloo").group_size == 4 and ReinforceConfig().group_size == 1
    with pytest.raises(ConfigError, match="num_train_prompts"):
        ProRLConfig(prompts_per_iter=16, num_train_prompts=8)


@pytest.mark.parametrize("cls", REAL_CONFIGS, ids=lambda c: c.__qualname__)
def test_every_field_of_every_config_is_documented_and_defaults_validate(cls):
    docs = field_docs(cls)
    missing = [f.name for f in config_fields(cls) if not docs.get(f.name)]
    assert not missing, f"{cls.__qualname__}: undocumented fields {missing}"
    cls()  # the defaults pass the validator


def test_field_docs_are_inherited_by_a_redeclared_field():
    from baselines.core.config import LMConfig
    from baselines.grpo import GRPOConfig

    assert "lr" in GRPOConfig.__dict__["__annotations__"]  # re-declared with GRPO's default ...
    assert field_docs(GRPOConfig)["lr"] == field_docs(LMConfig)["lr"]  # ... keeps the base's doc
    with pytest.raises(ConfigError, match="lr: expected a value > 0"):  # ... and the base's bounds
        GRPOConfig(lr=0)


# ---------------------------------------------------------------------------------------------- text and flags
@pytest.mark.parametrize("name,text,want", [
    ("rate", "0.25", 0.25), ("count", "7", 7), ("flag", "true", True), ("flag", "no", False),
    ("limit", "none", None), ("limit", "null", None), ("limit", "5", 5), ("mode", "slow", "slow"),
    ("sizes", "8,16", (8, 16)), ("sizes", "[8, 16]", (8, 16)), ("options", '{"k": 20}', {"k": 20}),
    ("name", "true", "true"),
])
def test_parse_text_by_field_type(name, text, want):
    from shopsim.configs import field_types

    got = parse_text(name, text, field_types(Toy)[name])
    assert got == want and type(got) is type(want)


@pytest.mark.parametrize("name,text,message", [
    ("rate", "fast", "rate: expected a float, got 'fast'"),
    ("count", "1.5", "count: expected an int, got '1.5'"),
    ("flag", "maybe", "flag: expected a bool (true or false), got 'maybe'"),
    ("mode", "medium", "mode: expected one of 'fast', 'slow', got 'medium'"),
    ("options", '{"k": 20', "options: not valid JSON (Expecting ',' delimiter at character 8"),
    ("options", "[1]", "options: expected a JSON object, got '[1]'"),
])
def test_parse_text_errors_name_the_field(name, text, message):
    from shopsim.configs import field_types

    with pytest.raises(ConfigError) as err:
        parse_text(name, text, field_types(Toy)[name])
    assert str(err.value).startswith(message)


def test_flags_built_from_fields():
    parser = argparse.ArgumentParser()
    assert add_config_arguments(parser, Toy, exclude=("options",)) == [
        "mode", "rate", "count", "flag", "name", "limit", "sizes"]
    args = parser.parse_args([])
    assert {f.name: getattr(args, f.name) for f in config_fields(Toy) if f.name != "options"} == \
        {k: v for k, v in dataclasses.asdict(Toy()).items() if k != "options"}
    args = parser.parse_args(["--mode", "slow", "--rate", "1", "--flag", "--limit", "none", "--sizes", "2,3"])
    assert (args.mode, args.rate, args.flag, args.limit, args.sizes) == ("slow", 1.0, True, None, (2, 3))
    assert parser.parse_args(["--no-flag"]).flag is False
    for bad in (["--mode", "medium"], ["--rate", "2"], ["--count", "x"]):
        with pytest.raises(SystemExit):
            parser.parse_args(bad)
    help_text = parser.format_help()
    assert "How to go." in help_text and "(default: 0.5)" in help_text and "--options" not in help_text


def test_describe_config_lists_fields_defaults_and_docs():
    text = describe_config(Toy)
    for f in config_fields(Toy):
        assert f"\n{f.name} = " in text
    assert "rate = 0.5    (a float, a value in (0, 1])\n    A rate in (0, 1]." in text


# ---------------------------------------------------------------------------------------------- shopsim train
def _train(argv, capsys):
    from shopsim.app.cli import main

    code = main(["train", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err.strip().splitlines()


def test_show_config_prints_every_field_with_doc_and_default(capsys):
    from baselines.mpo import MPOConfig

    code, out, err = _train(["--algo", "mpo", "--env", "shopsim/Shopping-v0", "--show-config"], capsys)
    assert code == 0 and not err
    docs = field_docs(MPOConfig)
    for f in config_fields(MPOConfig):
        shown = repr(f.default) if f.default is not dataclasses.MISSING else json.dumps(f.default_factory())
        assert f"\n{f.name} = {shown}    (" in out
        assert " ".join(docs[f.name].split())[:40] in " ".join(out.split())
    code, out, _ = _train(["--algo", "hpo", "--show-config"], capsys)  # no --env needed
    assert code == 0 and "pathwise_coef = 10.0" in out and "Weight of the pathwise loss" in out


@pytest.mark.parametrize("argv,expect", [
    (["--env", "shopsim/Shopping-v0", "--algo", "grpo", "--set", "lr=fast"], "lr: expected a float, got 'fast'"),
    (["--env", "shopsim/Replenishment-v0", "--algo", "ppo", "--set", 'env_kwargs={"n_skus": 12'],
     "env_kwargs: not valid JSON (Expecting ',' delimiter"),
    (["--env", "shopsim/Replenishment-v0", "--algo", "hpo", "--set", 'env_kwargs={"kk": 20}'],
     "env_kwargs: shopsim/Replenishment-v0 has no option 'kk'; valid options: n_skus"),
    (["--env", "shopsim/Shopping-v0", "--algo", "grpo", "--set", 'env_kwargs={"kk": 20}'],
     "env_kwargs: shopsim/Shopping-v0 has no option 'kk'; valid options: catalog_size"),
    (["--env", "shopsim/TwoStageRetrieval-v0", "--algo", "capg", "--set", 'env_kwargs={"kk": 20}'],
     "env_kwargs: shopsim/TwoStageRetrieval-v0 has no option 'kk'; valid options: n_items"),
    (["--env", "shopsim/Shopping-v0", "--algo", "grpo", "--set", "group_size=0"],
     "group_size: expected a value >= 1, got 0"),
    (["--env", "shopsim/Shopping-v0", "--algo", "grpo", "--set", "loss_agg=mean"],
     "loss_agg: expected one of 'token-mean'"),
    (["--env", "shopsim/Shopping-v0", "--algo", "grpo", "--set", "lrr=1"],
     "grpo: unknown option(s) lrr; valid options: agent_kwargs, argmax_negative_scale, checkpoint_every"),
    (["--algo", "grpo"], "--env is required"),
])
def test_bad_set_values_are_one_line_exit_2(argv, expect, tmp_path, capsys):
    code, out, err = _train([*argv, "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and len(err) == 1 and expect in err[0], err
    assert not (tmp_path / "o").exists()  # rejected before any work


def test_set_values_are_typed_by_the_config_fields():
    from baselines.core.config import LMConfig
    from baselines.hybrid_ppo import HybridPPOConfig
    from shopsim.app.commands.train import parse_overrides

    assert parse_overrides(["lr=1e-5", "group_size=4", "dual_clip=null", "task_families=find_and_buy,bundle",
                            'env_kwargs={"max_turns": 3}', "normalize_advantage=true", "context_mode=window",
                            "eval_split=dev,test"], LMConfig) == {
        "lr": 1e-5, "group_size": 4, "dual_clip": None, "task_families": ("find_and_buy", "bundle"),
        "env_kwargs": {"max_turns": 3}, "normalize_advantage": True, "context_mode": "window",
        "eval_split": "dev,test"}
    assert parse_overrides(["hidden=[32, 32]", "lr=1"], HybridPPOConfig) == {"hidden": (32, 32), "lr": 1.0}
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_overrides(["lr"], LMConfig)


# ---------------------------------------------------------------------------------------------- shopsim sft
def test_sft_cli_defaults_are_sftconfig_defaults():
    from agents.lm.sft import SFTConfig
    from shopsim.app.cli import build_parser
    from shopsim.app.commands.sft import build_config

    args = build_parser().parse_args(["sft", "--expert-episodes", "3", "--out", "x"])
    assert build_config(args) == SFTConfig()
    # and every SFTConfig field is reachable from the command line
    args = build_parser().parse_args(["sft", "--data", "d.parquet", "--out", "x", "--steps", "7", "--family", "all",
                                      "--no-numbered-results", "--results-per-page", "none", "--context-mode",
                                      "window", "--env-kwargs", '{"max_turns": 9}'])
    assert build_config(args) == SFTConfig(steps=7, families=(), numbered_results=False, results_per_page=None,
                                           context_mode="window", env_kwargs={"max_turns": 9})


def test_sft_cli_trains_what_a_default_python_call_trains(tmp_path, monkeypatch):
    """`shopsim sft` with only the required arguments collects the same expert data (env and expert options,
    families, seed) and trains with the same config as `sft_expert_data` + `train_sft` with `SFTConfig()`."""
    from agents.lm import sft
    from shopsim.app.cli import main

    calls = []
    monkeypatch.setattr(sft, "expert_trajectories", lambda *a, **kw: calls.append(("data", a, kw)) or ["t"])

    class Agent:
        checkpoint = "ckpt"

    monkeypatch.setattr(sft, "train_sft", lambda env, trajs, cfg, **kw: calls.append(("train", env, cfg)) or (
        Agent(), [{"loss": 0.0}]))
    assert main(["sft", "--expert-episodes", "12", "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    cli = list(calls)
    calls.clear()
    cfg = sft.SFTConfig()
    sft.train_sft("shopsim/Shopping-v0", sft.sft_expert_data("shopsim/Shopping-v0", 12, cfg, progress=False), cfg)
    assert cli == calls
    (_, args, kw), (_, _, trained) = cli
    assert args == ("shopsim/Shopping-v0", 12) and trained == cfg
    assert kw["env_kwargs"] == {"numbered_results": True, "obs_mode": "terse", "results_per_page": 5,
                                "order_refs": "position", "task_reminder": True}
    assert kw["expert_kwargs"] == {"click_by": "index", "query": "instruction", "arg_space": True, "price_clause": True,
                                   "order_refs": "title"}
    assert kw["families"] == ("find_and_buy",) and kw["seed"] == 0
