"""benchmarks.diagnose_sft: action classes and the per-kind teacher-forced accounting."""

import math

from benchmarks.diagnose_sft import action_kind, diagnose
from shopsim.paths import data_dir


def test_action_kinds():
    assert action_kind("search[ (2) a midi dress]", 1) == "search2"
    assert action_kind("click[ #3]", 0) == "click#"
    assert action_kind("click[ add to cart]", 0) == "click-btn"
    assert action_kind("click[ navy]", 0) == "click-opt"
    assert action_kind('get_order[ "a title"]', 0) == "get_order"
    assert action_kind("view_cart", 0) == "view_cart"


def test_diagnose_counts_every_expert_action_once():
    """Every action of the expert episodes lands in one kind, with a finite loss and a share in [0, 1]; the
    shipped checkpoint writes its first search (a copy of the task line) with confidence."""
    result = diagnose(data_dir() / "lm" / "sft", ["find_and_buy"], episodes=3, seed=5)["find_and_buy"]
    from agents.lm.sft import expert_trajectories
    from benchmarks.diagnose_sft import ENV_ID, sft_config_of

    cfg = sft_config_of(data_dir() / "lm" / "sft", ["find_and_buy"])
    trajs = expert_trajectories(ENV_ID, 3, seed=5, split="dev", families=("find_and_buy",), progress=False,
                                env_kwargs=cfg.env_options(), expert_kwargs=cfg.expert_options())
    assert sum(r["n"] for r in result.values()) == sum(len(t.turns) for t in trajs)
    assert result["search1"]["n"] == 3
    assert all(math.isfinite(r["loss_per_token"]) and 0 <= r["confident"] <= 1 for r in result.values())
    assert result["search1"]["confident"] == 1.0


def test_diagnosis_expert_injects_no_noise(tmp_path):
    """A checkpoint trained on noisy expert data is diagnosed on the expert's own actions: the manifest's
    expert_noise is dropped, its other options kept."""
    import json

    from benchmarks.diagnose_sft import sft_config_of

    (tmp_path / "shopsim_agent.json").write_text(json.dumps({"sft": {"expert_noise": 0.3, "order_refs": "title"}}))
    cfg = sft_config_of(tmp_path, ["clarify_and_buy"])
    assert "noise" not in cfg.expert_options() and cfg.expert_options()["order_refs"] == "title"
    assert cfg.families == ("clarify_and_buy",)
