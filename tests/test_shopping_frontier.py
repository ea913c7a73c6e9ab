"""Shopping-v0 options beyond the defaults: reward schemes, paraphrased instructions, the personalized_buy family,
the near-duplicate catalog and the LM customer."""

from __future__ import annotations

import pytest

from shopsim.envs.shopping import ShoppingEnv
from shopsim.errors import ConfigError

SIZE = 2000


def _open_target(env, goal: dict) -> None:
    """Search the target's title and open it (the target is on the first page of its own title's results)."""
    title = env.catalog.product(goal["target_id"]).title
    sku = env.catalog.product(goal["target_id"]).sku
    env.step(f"search[{title}]")
    env.step(f"click[{sku}]")
    assert env.page == "item" and env.product.product_id == goal["target_id"]


def _buy_target_missing_one_option(scheme: str):
    env = ShoppingEnv(catalog_size=SIZE, reward_scheme=scheme)
    # a find_and_buy task with at least two options, so one can be left unselected
    for tid in range(50):
        _, info = env.reset(seed=0, options={"family": "find_and_buy", "task_id": tid})
        goal = info["oracle"]["goals"][0]
        if len(goal["options"]) >= 2:
            break
    _open_target(env, goal)
    opts = list(goal["options"].items())
    for name, value in opts[1:]:
        env.step(f"click[{name}: {value}]")
    _, r, term, _, info = env.step("buy")
    assert term
    return r, info, goal


def test_loose_scheme_is_partial_credit_by_hand():
    r, info, goal = _buy_target_missing_one_option("loose")
    n_att, n_opt = len(goal["attributes"]), len(goal["options"])
    # type matches, every attribute and the price hold, one option of n_opt is missing
    expected = (n_att + (n_opt - 1) + 1) / (n_att + n_opt + 1)
    assert r == pytest.approx(expected) and info["score"] == pytest.approx(expected)
    assert not info["success"] and "loose_score" not in info["reward_parts"]


def test_strict_scheme_is_all_or_nothing_by_hand():
    r, info, goal = _buy_target_missing_one_option("strict")
    n_att, n_opt = len(goal["attributes"]), len(goal["options"])
    assert r == 0.0 and info["score"] == 0.0 and not info["success"]
    assert info["reward_parts"]["loose_score"] == pytest.approx((n_att + n_opt) / (n_att + n_opt + 1))
    # the same purchase with every option chosen scores 1 under both schemes
    for scheme in ("loose", "strict"):
        env = ShoppingEnv(catalog_size=SIZE, reward_scheme=scheme)
        _, info = env.reset(seed=0, options={"family": "find_and_buy", "task_id": info["task_id"]})
        _open_target(env, goal)
        for name, value in goal["options"].items():
            env.step(f"click[{name}: {value}]")
        _, r, _, _, info = env.step("buy")
        assert r == 1.0 and info["success"]


def test_strict_bundle_needs_every_item():
    env = ShoppingEnv(catalog_size=SIZE, reward_scheme="strict")
    _, info = env.reset(seed=0, options={"family": "bundle", "task_id": 2})
    goals = info["oracle"]["goals"]
    # put only the first item, fully matched, in the cart: loose = 1/len(goals) (mean item score), strict = 0
    _open_target(env, goals[0])
    for name, value in goals[0]["options"].items():
        env.step(f"click[{name}: {value}]")
    env.step("add_to_cart")
    _, r, term, _, info = env.step("checkout")
    assert term and r == 0.0
    assert info["reward_parts"]["loose_score"] == pytest.approx(1.0 / len(goals))


def test_unknown_reward_scheme_is_a_config_error():
    with pytest.raises(ConfigError, match="reward_scheme"):
        ShoppingEnv(catalog_size=SIZE, reward_scheme="multiplicative")
