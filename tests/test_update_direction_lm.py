"""`benchmarks.update_direction_lm`: greedy success along a trained update, split into its first- and second-order
parts."""

import json

import pytest


@pytest.fixture(scope="module")
def moved(tmp_path_factory):
    """The shipped agent with a random update added to its weights, saved as a checkpoint folder."""
    import torch

    from agents.lm.agent import LMAgent, default_checkpoint_dir

    agent = LMAgent(env_id="shopsim/Shopping-v0", checkpoint=default_checkpoint_dir())
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in agent.model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.02)
    out = tmp_path_factory.mktemp("moved") / "ckpt"
    agent.save(out)
    return out


def test_points_and_orders_are_consistent(moved, tmp_path):
    from benchmarks.update_direction_lm import main

    main(["--run", str(moved), "--eval-episodes", "12", "--alphas", "-1", "--controls", "1", "--num-envs", "12",
          "--classes",
          "--threads", "1", "--json", str(tmp_path / "r.json"), "--results", str(tmp_path)])
    res = json.loads((tmp_path / "r.json").read_text())
    pts = res["points"]
    assert set(pts) == {"alpha=-1", "alpha=0", "alpha=1", "row-signs-0"} | {
        f"{c}:alpha={a}" for c in ("embedding", "attention", "mlp", "norm") for a in (1, -1)}
    for c, v in res["classes"].items():
        plus, minus = pts[f"{c}:alpha=1"]["success"], pts[f"{c}:alpha=-1"]["success"]
        assert v["first_order"]["mean"] == pytest.approx((plus - minus) / 2)
    assert pts["alpha=0"]["changed"] == 0 and pts["alpha=0"]["gain"]["mean"] == 0
    assert res["delta_norm"] > 0
    f = {a: pts[f"alpha={a}"]["success"] for a in (-1, 0, 1)}
    assert res["first_order"]["mean"] == pytest.approx((f[1] - f[-1]) / 2)
    assert res["second_order"]["mean"] == pytest.approx((f[1] + f[-1]) / 2 - f[0])
    lo, hi = res["first_order"]["ci95"]
    assert lo <= res["first_order"]["mean"] <= hi
    for p in pts.values():  # per-family success averages to the overall (families take turns: equal counts)
        fam = p["success_family"]
        assert sum(fam.values()) / len(fam) == pytest.approx(p["success"])
    assert (tmp_path / "update_direction_lm.md").read_text().count("| θ₀ +") == 12
    # the table is rebuilt from saved results, one block per run
    main(["--from-json", str(tmp_path / "r.json"), str(tmp_path / "r.json"), "--results", str(tmp_path / "t"),
          "--label", "first", "--label", "second"])
    table = (tmp_path / "t" / "update_direction_lm.md").read_text()
    assert table.count("| θ₀ +") == 24 and "## first" in table and "| second |" in table
    with pytest.raises(SystemExit):  # one label per file
        main(["--from-json", str(tmp_path / "r.json"), "--results", str(tmp_path / "t"),
              "--label", "a", "--label", "b"])


def test_alpha_one_is_the_trained_checkpoint(moved):
    """θ₀ + 1·Δ evaluates as the trained checkpoint itself, and θ₀ as the start (same episodes, greedy)."""
    from agents.lm.agent import LMAgent, default_checkpoint_dir
    from agents.registry import manifest_env_kwargs
    from baselines.core.tasks import eval_tasks
    from benchmarks.update_direction_lm import ENV, evaluate

    tasks = eval_tasks(ENV, "test", 12)
    kw = {**manifest_env_kwargs(default_checkpoint_dir()), "max_turns": 40}
    direct = evaluate(LMAgent(env_id=ENV, checkpoint=moved, max_new_tokens=48), tasks, kw, 12)
    start = evaluate(LMAgent(env_id=ENV, checkpoint=default_checkpoint_dir(), max_new_tokens=48), tasks, kw, 12)
    import argparse

    from benchmarks.update_direction_lm import run

    res = run(argparse.Namespace(start=None, run=str(moved), alphas=[], controls=0, seed=0, eval_episodes=12,
                                 max_turns=40, max_new_tokens=48, num_envs=12, threads=1))
    assert res["points"]["alpha=1"]["success"] == sum(s for _, s in direct) / 12
    assert res["points"]["alpha=0"]["success"] == sum(s for _, s in start) / 12
    assert "first_order" not in res  # no −Δ point: no split


def test_a_folder_that_is_not_a_model_is_refused(tmp_path):
    from benchmarks.update_direction_lm import main
    from shopsim.errors import ConfigError

    with pytest.raises(ConfigError, match="not a model folder"):
        main(["--run", str(tmp_path), "--eval-episodes", "4"])
