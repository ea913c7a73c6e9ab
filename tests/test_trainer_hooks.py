"""The shared trainer grows by composition (docs/algorithms/core.md): algorithms use its public hooks, never override
its private methods, and share advantage estimators through the registry instead of importing each other."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import baselines
from baselines.core import advantages
from baselines.registry import _REGISTRY, load_target
from shopsim.errors import UnknownNameError

ROOT = Path(__file__).resolve().parents[1]
CLASSES = sorted({target for target in _REGISTRY.values()})


def _private_overrides(cls: type) -> list[str]:
    """``Class.method`` for every private method (one leading underscore, not a dunder) that a class outside
    baselines/core defines while a base class inside baselines/core defines it too."""
    core = [b for b in cls.__mro__ if b.__module__.startswith("baselines.core.")]
    out = []
    for klass in cls.__mro__:
        if klass.__module__.startswith("baselines.core.") or klass is object:
            continue
        for name in vars(klass):
            if name.startswith("_") and not name.startswith("__") and any(name in vars(b) for b in core):
                out.append(f"{klass.__module__}.{klass.__qualname__}.{name}")
    return out


@pytest.mark.parametrize("target", CLASSES)
def test_no_algorithm_overrides_a_private_method_of_the_core(target):
    bad = _private_overrides(load_target(target))
    assert not bad, f"{target} overrides private core methods {bad}; turn what it needs into a documented hook"


def test_the_private_override_check_catches_one():
    from baselines.core.trainer import LMAlgorithm

    class Sneaky(LMAlgorithm):
        def _minibatch_step(self, *args, **kwargs):  # pragma: no cover - never called
            return {}

    assert _private_overrides(Sneaky) == [f"{__name__}.{Sneaky.__qualname__}._minibatch_step"]


def test_algorithm_modules_do_not_import_each_other_for_shared_math():
    """grpo.py is one algorithm, not a second core: no sibling imports it; the shared pieces live in core."""
    for path in sorted((ROOT / "baselines").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert node.module not in ("baselines.grpo", "baselines.gigpo"), f"{path.name} imports {node.module}"


def test_estimator_registry():
    assert {"group_outcome", "token_gae"} <= set(advantages.estimators())
    with pytest.raises(UnknownNameError, match="group_outcome"):
        advantages.estimator("nope")
    with pytest.raises(ValueError, match="already registered"):
        advantages.register_estimator("group_outcome")(advantages.group_outcome)
    from baselines.grpo import GRPO
    from baselines.midtrain import MidTrain
    from baselines.ppo import PPO

    assert GRPO.advantage_estimator == MidTrain.advantage_estimator == "group_outcome"
    assert PPO.advantage_estimator == "token_gae"
    # the default hook calls the registered estimator
    assert inspect.getsource(GRPO).count("def compute_advantages") == 0


def test_config_digests_of_the_regrouped_configs_are_unchanged():
    """GRPO's options live in `GroupOutcomeConfig` (shared with ARC and midtrain): the default configs of the
    algorithms built on the shared estimators keep the digests recorded before the split (runs are reused by
    digest)."""
    from baselines.core.loop import config_digest

    recorded = {"grpo": "582cc991cefb25fe", "arc": "e6508494f1ad5fe4", "midtrain": "9b7cde2a59c72ca2",
                "ppo": "72082c86eb3cd212", "tropd": "6a4439af5bbc1cb6", "bipace": "40eb8a665967640a",
                "gigpo": "f24c545647d969fb", "dapo": "45ad24a3c8efd5b3", "wapo": "8fee6f1e270fa1b3"}
    for name, digest in recorded.items():
        algo = baselines.make(name, env_id="shopsim/Shopping-v0")
        assert config_digest(algo.run_identity("shopsim/Shopping-v0", 0)["config"]) == digest, name


def test_history_check_script_records_and_compares(tmp_path):
    """`benchmarks.trainer_histories` (the before/after check of a trainer refactor) records a short run and finds
    two recordings of the same code identical, and a changed history different."""
    from benchmarks.trainer_histories import compare, record_case

    record_case("grpo", tmp_path / "a", iterations=1)
    record_case("grpo", tmp_path / "b", iterations=1)
    assert compare(tmp_path / "a", tmp_path / "b")[-1] == "1/1 cases identical"
    hist = tmp_path / "b" / "grpo" / "history.json"
    hist.write_text(hist.read_text().replace('"iteration": 1', '"iteration": 2'))
    lines = compare(tmp_path / "a", tmp_path / "b")
    assert "DIFFERS" in lines[0] and lines[-1] == "0/1 cases identical"
