import pytest

import agents
import baselines
from baselines.base import Algorithm
from shopsim.errors import ConfigError, ShopsimError, UnknownNameError
from shopsim.testing import CountExpert


def test_unknown_algorithm_lists_available():
    with pytest.raises(UnknownNameError) as err:
        baselines.make("nope")
    msg = str(err.value)
    assert "unknown algorithm 'nope'" in msg and "grpo" in msg and "hpo" in msg


def test_algorithm_family_mismatch_says_which_envs():
    with pytest.raises(UnknownNameError, match="does not train 'inventory'"):
        baselines.resolve("grpo", env_id="shopsim/Replenishment-v0")
    assert "hpo" in baselines.available(env_id="shopsim/Replenishment-v0")
    assert "hpo" not in baselines.available(env_id="shopsim/Shopping-v0")


def test_bad_import_path_is_clear():
    with pytest.raises(UnknownNameError, match="cannot import"):
        baselines.resolve("no_such_pkg.mod:Algo")
    with pytest.raises(UnknownNameError, match="has no attribute"):
        baselines.resolve("tests.test_registries:Missing")


class MyConfig:
    pass


from dataclasses import dataclass  # noqa: E402


@dataclass
class _Cfg:
    lr: float = 0.1

    def __post_init__(self):
        if self.lr <= 0:
            raise ConfigError(f"lr must be > 0, got {self.lr}")


class MyAlgo(Algorithm):
    name = "mine"
    families = ("shopping",)
    Config = _Cfg


def test_third_party_registration_by_class_and_by_path():
    algo = baselines.make("tests.test_registries:MyAlgo", lr=0.5)
    assert isinstance(algo, MyAlgo) and algo.config.lr == 0.5
    baselines.register("mine_test", MyAlgo, family="shopping")
    assert "mine_test" in baselines.available()
    assert isinstance(baselines.make("mine_test", env_id="shopsim/Shopping-v0"), MyAlgo)
    with pytest.raises(ValueError, match="already registered"):
        baselines.register("mine_test", MyAlgo, family="shopping")
    with pytest.raises(ConfigError, match="valid options: lr"):
        baselines.make("mine_test", lrr=1)
    with pytest.raises(ConfigError, match="lr must be > 0"):
        baselines.make("mine_test", lr=-1)


def test_unknown_agent_lists_available_for_that_env():
    with pytest.raises(UnknownNameError) as err:
        agents.make("nope", "shopsim/Shopping-v0")
    assert "expert" in str(err.value) and "random" in str(err.value)
    with pytest.raises(UnknownNameError, match="unknown env"):
        agents.make("expert", "shopsim/Nope-v0")


class Saved(CountExpert):
    """A checkpoint-loadable agent: `agents.load_checkpoint` finds it by module:qualname in the manifest."""

    @classmethod
    def from_checkpoint(cls, directory, env_id=None, **kw):
        agent = cls(env_id=env_id)
        agent.loaded_from = directory
        return agent


def test_checkpoint_manifest_round_trip(tmp_path, monkeypatch):
    monkeypatch.setitem(agents.registry._REGISTRY, ("saved_test", "shopping"), f"{__name__}:Saved")
    agents.save_manifest(tmp_path, Saved, "shopsim/Shopping-v0", note="x")
    agent = agents.load_checkpoint(tmp_path)
    assert isinstance(agent, Saved) and agent.loaded_from == tmp_path
    with pytest.raises(UnknownNameError, match="not a shopsim checkpoint"):
        agents.load_checkpoint(tmp_path / "missing")


def test_checkpoint_manifest_cannot_import_an_arbitrary_module(tmp_path, monkeypatch):
    """A manifest's "class" is imported only when it names a registered agent or one of shopsim's checkpoint agent
    modules: a downloaded checkpoint naming any other module is refused before that module is imported."""
    import json
    import sys

    (tmp_path / "planted.py").write_text("import pathlib\npathlib.Path(__file__).with_name('ran').touch()\n"
                                         "class Agent:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    for target in ("planted:Agent", "this:Nothing", "agents.lm.agent:Path", "agents.lm.agent:Nope"):
        (ckpt / "shopsim_agent.json").write_text(json.dumps({"class": target, "env_id": "shopsim/Shopping-v0"}))
        with pytest.raises(ShopsimError, match=r"shopsim_agent.json: \"class\" .* is not"):
            agents.load_checkpoint(ckpt)
    assert not (tmp_path / "ran").exists() and "planted" not in sys.modules and "this" not in sys.modules
    monkeypatch.setitem(agents.registry._REGISTRY, ("saved_test", "shopping"), f"{__name__}:Saved")
    agents.save_manifest(ckpt, Saved, "shopsim/Shopping-v0")  # registered: loads
    assert isinstance(agents.load_checkpoint(ckpt), Saved)


def test_every_registered_env_id_is_in_gymnasium():
    import gymnasium

    import shopsim

    for env_id in (r.id for r in shopsim.envs.RECORDS.values() if r.api == "gymnasium"):
        assert env_id in gymnasium.registry
