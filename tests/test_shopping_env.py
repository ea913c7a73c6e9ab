"""Shopping-v0 env: Gymnasium contract, determinism, pickling, vector envs, invalid actions, pages, customer."""

from __future__ import annotations

import hashlib
import json
import pickle
import re
import subprocess
import sys
import warnings

import gymnasium as gym
import numpy as np
import pytest

import shopsim  # noqa: F401  (registers the ids)
from agents.random_agent import RandomTextAgent
from agents.shopping_expert import ShoppingExpert
from shopsim.envs.shopping import FAMILIES, ShoppingEnv
from shopsim.envs.shopping.actions import Action
from shopsim.envs.shopping.orders import ToolError
from shopsim.errors import ConfigError

SIZE = 2000
ENV_ID = "shopsim/Shopping-v0"


@pytest.fixture(scope="module")
def env():
    return ShoppingEnv(catalog_size=SIZE)


def run_expert(env, family, task_id, split="test", seed=0, json_actions=False, strategy=None):
    agent = ShoppingExpert(env_id=ENV_ID)
    agent.reset(1, 0)
    opts = {"family": family, "task_id": task_id, "split": split}
    if strategy:
        opts["strategy"] = strategy
    obs, info = env.reset(seed=seed, options=opts)
    agent.begin_episode(0, obs, info)
    steps = [(obs, None, 0.0, info)]
    while True:
        action = agent.act_one(0, obs, info)
        if json_actions:
            from shopsim.envs.shopping.actions import parse

            action = parse(action).to_json()
        obs, r, term, trunc, info = env.step(action)
        steps.append((obs, action, r, info))
        if term or trunc:
            return steps


def test_check_env_passes_without_warnings():
    from gymnasium.utils.env_checker import check_env

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        e = gym.make(ENV_ID, catalog_size=SIZE)
        check_env(e.unwrapped)
    assert [str(w.message) for w in caught] == []


def test_registered_with_step_limit_and_own_truncation():
    e = gym.make(ENV_ID, catalog_size=SIZE, max_turns=5)
    assert gym.spec(ENV_ID).max_episode_steps == 60
    e.reset(seed=0, options={"family": "find_and_buy", "task_id": 3})
    for _ in range(5):
        _, _, term, trunc, info = e.step("view_cart")
    assert trunc and not term and info["end_reason"] == "turn_limit"
    assert info["episode_metrics"]["turns"] == 5.0


def _episode_digest(seed: int, n: int = 100) -> str:
    env = ShoppingEnv(catalog_size=SIZE)
    agent = RandomTextAgent(env_id=ENV_ID)
    agent.reset(1, seed)
    h = hashlib.sha256()
    obs, info = env.reset(seed=seed)
    for _ in range(n):
        a = agent.act_one(0, obs, info)
        obs, r, term, trunc, info = env.step(a)
        h.update(json.dumps([a, obs, r, term, trunc, info], sort_keys=True, default=str).encode())
        if term or trunc:
            obs, info = env.reset(seed=seed + 1)
            h.update(obs.encode())
    return h.hexdigest()


def test_same_seed_same_100_steps_also_across_processes():
    here = _episode_digest(7)
    assert here == _episode_digest(7)
    assert here != _episode_digest(8)
    code = ("import sys; sys.path.insert(0, 'tests'); from test_shopping_env import _episode_digest; "
            "print(_episode_digest(7))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=str(__import__("pathlib").Path(__file__).parents[1]))
    assert out.stdout.strip().splitlines()[-1] == here


def test_task_depends_on_task_id_not_on_reset_seed(env):
    a, ia = env.reset(seed=1, options={"split": "dev", "task_id": 1_000_003, "family": "bundle"})
    b, ib = env.reset(seed=99, options={"split": "dev", "task_id": 1_000_003, "family": "bundle"})
    assert a == b and ia["oracle"] == ib["oracle"] and ia["split"] == "dev"
    with pytest.raises(ConfigError, match="not in split"):
        env.reset(options={"split": "train", "task_id": 2_000_000})
    with pytest.raises(ConfigError, match="task_id must be an integer"):
        env.reset(options={"task_id": "seven"})
    assert env.reset(options={"task_id": np.int64(1_000_003)})[1]["split"] == "dev"  # split from the id
    with pytest.raises(ConfigError, match="unknown task family"):
        env.reset(options={"family": "teleport", "task_id": 1})
    # default mix: the family follows the task id
    assert [env.reset(options={"task_id": t})[1]["family"] for t in range(4)] == list(FAMILIES)


def test_pickling_keeps_state_and_drops_the_catalog(env):
    obs, info = env.reset(seed=3, options={"family": "find_and_buy", "task_id": 11})
    env.step("search[waterproof boots]")
    blob = pickle.dumps(env)
    assert len(blob) < 200_000  # the catalog and index are not pickled
    clone = pickle.loads(blob)
    assert clone.catalog is env.catalog  # re-attached to the process-wide copy
    for a in ["click[next >]", "ask[what color?]", "search[tent]"]:
        o1, r1, t1, u1, i1 = env.step(a)
        o2, r2, t2, u2, i2 = clone.step(a)
        assert (o1, r1, t1, u1) == (o2, r2, t2, u2) and i1 == i2


def test_copies_share_catalog_and_vector_envs_work():
    e1, e2 = ShoppingEnv(catalog_size=SIZE), ShoppingEnv(catalog_size=SIZE)
    assert e1.catalog is e2.catalog and e1.index is e2.index
    fns = [lambda: gym.make(ENV_ID, catalog_size=SIZE) for _ in range(2)]
    # Text observations need AsyncVectorEnv(shared_memory=False): shared memory uses fixed-width buffers
    for make_vec in (lambda: gym.vector.SyncVectorEnv(fns),
                     lambda: gym.vector.AsyncVectorEnv(fns, shared_memory=False)):
        venv = make_vec()
        try:
            obs, infos = venv.reset(seed=[0, 1], options={"family": "find_and_buy"})
            assert len(obs) == 2 and all(o.startswith("Task: ") for o in obs)
            obs, r, term, trunc, infos = venv.step(["search[tent]", "fly[x]"])
            assert "Page: results" in obs[0] and "Invalid action" in obs[1]
            assert list(infos["invalid_action"][:1]) == [None]
        finally:
            venv.close()


def test_invalid_actions_flagged_penalised_and_truncate():
    env = ShoppingEnv(catalog_size=SIZE, invalid_penalty=0.1, max_invalid=3)
    env.reset(seed=0, options={"family": "find_and_buy", "task_id": 5})
    obs, r, term, trunc, info = env.step("click[buy now]")  # no product open
    assert info["invalid_action"] and "cannot click" in info["invalid_action"] and r == pytest.approx(-0.1)
    assert "Invalid action: cannot click" in obs
    obs, r, term, trunc, info = env.step("search[boots]")  # a valid action resets the run
    assert info["invalid_action"] is None and r == 0.0
    for _ in range(3):
        obs, r, term, trunc, info = env.step("{bad json")
        assert info["invalid_action"].startswith("malformed JSON")
    assert trunc and not term and info["end_reason"] == "too_many_invalid"
    assert info["episode_metrics"]["invalid_actions"] == 4.0


def test_page_flow_options_and_navigation(env):
    obs, info = env.reset(seed=0, options={"family": "find_and_buy", "task_id": 21})
    assert info["valid_actions"][0] == "search[...]" and "Page: search" in obs
    obs, _, _, _, info = env.step("search[cotton t-shirt]")
    res = info["structured"]["results"]
    assert len(res) == 10 and "click[next >]" in info["valid_actions"]
    obs, _, _, _, info = env.step("next_page")
    assert "(page 2 of" in obs and info["structured"]["results"][0]["sku"] != res[0]["sku"]
    obs, _, _, _, info = env.step("click[< prev]")
    assert info["structured"]["results"] == res
    anchor_results = info["anchor"]
    obs, _, _, _, info = env.step(f"click[{res[0]['sku'].lower()}]")  # SKUs are case-insensitive
    prod = info["structured"]["product"]
    assert info["structured"]["page"] == "item" and f"Page: product {prod['sku']}" in obs
    name, values = next(iter(prod["options"].items()))
    obs, _, _, _, info = env.step(f"click[{values[-1]}]")
    assert info["structured"]["selected"] == {name: values[-1]} and f"(chosen: {values[-1]})" in obs
    _, _, _, _, info = env.step("click[not an option]")
    assert info["invalid_action"]
    _, _, _, _, info = env.step("click[description]")
    assert info["invalid_action"] is None
    _, _, _, _, info = env.step("click[< prev]")
    assert info["anchor"] == anchor_results  # same state, longer history: same anchor
    _, _, _, _, info = env.step("click[back to search]")
    assert info["structured"]["page"] == "search"
    _, _, _, _, info = env.step("back")
    assert info["structured"]["page"] == "results"
    _, _, _, _, info = env.step("search[T-shirt,  COTTON]")  # same words, other order/case: same anchor
    assert info["anchor"] == anchor_results


def test_buy_scores_with_partial_credit(env):
    obs, info = env.reset(seed=0, options={"family": "find_and_buy", "task_id": 8})
    goal = info["oracle"]["goals"][0]
    target = env.catalog.product(goal["target_id"])
    env.step(f"search[{target.title}]")
    _, _, _, _, info = env.step(f"click[{target.sku}]")
    obs, r, term, trunc, info = env.step("click[buy now]")  # no options chosen
    n_att, n_opt = len(goal["attributes"]), len(goal["options"])
    assert term and info["end_reason"] == "buy"
    assert r == pytest.approx((n_att + 0 + 1) / (n_att + n_opt + 1)) == info["score"]
    assert info["success"] is False and info["reward_parts"]["options_matched"] == 0
    assert info["episode_metrics"]["score"] == pytest.approx(r)
    with pytest.raises(RuntimeError, match="reset"):
        env.step("search[x]")


def test_clarify_customer_reveals_and_leaves(env):
    for tid in range(40):
        obs, info = env.reset(seed=0, options={"family": "clarify_and_buy", "task_id": tid})
        if info["oracle"]["hidden"][0][0] == "option":
            break
    dim = info["oracle"]["hidden"][0][1]
    value = info["oracle"]["goals"][0]["options"][dim]
    patience = info["patience"]
    obs, r, term, _, info = env.step(f"ask[What {dim} do you want?]")
    assert value in obs.split("Customer said:")[1] and info["patience"] == patience - 1
    obs, r, term, _, info = env.step("ask[How is the weather?]")
    assert "Customer:" in obs and info["patience"] == patience - 2 and not term
    while not term:
        obs, r, term, trunc, info = env.step("ask[anything else?]")
    assert info["end_reason"] == "customer_left" and r == 0.0 and info["success"] is False


def test_strategy_and_answer_latency(env):
    obs, info = env.reset(seed=0, options={"family": "find_and_buy", "task_id": 2, "strategy": "ask_first"})
    assert info["strategy"] == "ask_first" and "Strategy: Ask the customer" in obs
    env.step("search[boots]")
    _, _, _, _, info = env.step("search[tent]")
    assert info["turns_before_first_answer"] == 2 and info["chars_before_first_answer"] == 25
    _, _, _, _, info = env.step("answer[Hello! Looking now.]")
    env.step("search[x]")
    _, _, _, _, info = env.step("finish")
    assert info["turns_before_first_answer"] == 2 and info["episode_metrics"]["chars_before_first_answer"] == 25
    obs, info = env.reset(seed=0, options={"family": "find_and_buy", "task_id": 2, "strategy": "be terse"})
    assert "Strategy: be terse" in obs and info["strategy"] == "be terse"


def test_after_sales_tools_and_family_rules(env):
    obs, info = env.reset(seed=0, options={"family": "after_sales", "task_id": 4})
    assert "Policy:" in obs and "list_orders" in info["valid_actions"]
    _, _, _, _, info = env.step("click[buy now]")
    assert info["invalid_action"]
    _, _, _, _, info = env.step("checkout")
    assert "not buying" in info["invalid_action"]
    obs, _, _, _, info = env.step("list_orders")
    oids = [o["order_id"] for o in info["structured"]["orders"]]
    assert all(o in obs for o in oids) and f"get_order[{oids[0]}]" in info["valid_actions"]
    _, _, _, _, info = env.step("get_order[W0000000]")
    assert "no order" in info["invalid_action"]
    obs, info = env.reset(seed=0, options={"family": "find_and_buy", "task_id": 4})
    _, _, _, _, info = env.step("list_orders")
    assert "after-sales tool" in info["invalid_action"]


def _after_sales_episode(env, kind, refs):
    """An after-sales episode of request `kind` played by the expert with order references `refs`:
    (actions, observations, final info)."""
    expert = ShoppingExpert(env_id=ENV_ID, click_by="index", order_refs=refs)
    expert.reset(1, 0)
    for task_id in range(200):
        obs, info = env.reset(seed=0, options={"family": "after_sales", "task_id": task_id})
        if info["oracle"]["request"]["kind"] == kind:
            break
    actions, observations = [], [obs]
    while True:
        actions.append(expert.act_one(0, obs, info))
        obs, _, term, trunc, info = env.step(actions[-1])
        observations.append(obs)
        if term or trunc:
            return actions, observations, info


def _same_database_as_ids(kind, refs):
    """The expert's episode of request `kind` with references `refs` on the position rendering, checked against
    the id references: both succeed on the same task and leave the same database. (env, actions, observations)"""
    by_id = ShoppingEnv(catalog_size=SIZE, obs_mode="terse", numbered_results=True, results_per_page=5)
    env = ShoppingEnv(catalog_size=SIZE, obs_mode="terse", numbered_results=True, results_per_page=5,
                      order_refs="position")
    _, _, id_info = _after_sales_episode(by_id, kind, "id")
    actions, observations, info = _after_sales_episode(env, kind, refs)
    assert id_info["success"] and info["success"]
    assert env.db.state_key() == by_id.db.state_key() and env.task.task_id == by_id.task.task_id
    return env, actions, observations


@pytest.mark.parametrize("kind", ["cancel", "return", "exchange", "refuse_window", "refuse_type"])
def test_after_sales_position_references_reach_the_same_database(kind):
    """order_refs="position": orders, items and the replacement named as #k give the same final database (and
    grade) as the ids, and the pages show positions instead of order ids and SKUs."""
    by_pos, pos_actions, pos_obs = _same_database_as_ids(kind, "position")
    writes = [a for a in pos_actions if a.split("[")[0] in ("get_order", "cancel_order", "return_item",
                                                             "exchange_item")]
    assert writes and all(re.fullmatch(r"\w+\[#\d+(, (#\d+|no longer needed|ordered by mistake))*\]", a)
                          for a in writes), writes
    req = by_pos.task.request
    shown = "\n".join(pos_obs[1:])  # after the task page: the tool pages and feedback lines the agent reads
    pages = "\n".join(x for x in shown.splitlines() if not x.startswith("Feedback:"))
    assert req["order_id"] not in pages and req["sku"] not in pages
    assert re.search(r"^#1 \(", shown, re.M)  # the orders page lists orders by position
    assert all(req["order_id"] not in a and req["sku"] not in a for a in pos_actions)


@pytest.mark.parametrize("kind", ["cancel", "return", "exchange", "refuse_window", "refuse_type"])
def test_after_sales_title_references_reach_the_same_database(kind):
    """The expert's order_refs="title": the item's title, copied from the request, opens its order (no order list)
    and names the item; the final database and grade equal those of the id references."""
    by_title, actions, observations = _same_database_as_ids(kind, "title")
    req = by_title.task.request
    title = next(it.title for o in by_title.db.orders.values() for it in o.items if it.sku == req["sku"])
    title = title.lower()  # as the request writes it
    assert f'"{title}"' in observations[0] and actions[0] == f'get_order["{title}"]'
    assert "list_orders" not in actions
    if kind in ("return", "exchange"):
        write = next(a for a in actions if a.startswith(("return_item", "exchange_item")))
        assert write[:-1].split("[", 1)[1].split(", ")[1] == f'"{title}"'
    if kind == "exchange":  # the new product's title, quoted as in the request, so its words tokenize the same
        new = by_title.catalog.product(req["new_id"]).title.lower()
        assert f'"{new}"' in observations[0] and f'search["{new}"]' in actions
    assert all(req["order_id"] not in a and req["sku"] not in a for a in actions)


def test_after_sales_title_references_are_checked():
    """A title names the order holding that item and the item itself, quoted or not, in any case and spacing; an
    unknown title or a title from another order is an invalid action."""
    env = ShoppingEnv(catalog_size=SIZE, order_refs="position")
    _, info = env.reset(seed=0, options={"family": "after_sales", "task_id": 3})
    orders = list(env.db.orders.values())
    last = orders[-1]
    item = last.items[-1]
    _, _, _, _, info = env.step(f'get_order[  "{item.title.upper()}" ]')
    assert info["invalid_action"] is None and info["structured"]["order_id"] == last.order_id
    assert env.db.order_key(item.title.lower()) == last.order_id
    assert env.db._item(last, " ".join(item.title.split())).sku == item.sku
    _, _, _, _, info = env.step("get_order[No Such Product Title]")
    assert "no order" in info["invalid_action"] and "title" in info["invalid_action"]
    other = orders[0].items[0].title
    with pytest.raises(ToolError, match="has no item"):
        env.db._item(last, other)


def test_after_sales_position_references_are_checked():
    env = ShoppingEnv(catalog_size=SIZE, order_refs="position")
    env.reset(seed=0, options={"family": "after_sales", "task_id": 3})
    _, _, _, _, info = env.step("list_orders")
    orders = info["structured"]["orders"]
    assert f"get_order[#{len(orders)}]" in info["valid_actions"]
    for bad in (f"get_order[#{len(orders) + 1}]", "get_order[#0]"):
        _, _, _, _, info = env.step(bad)
        assert "no order" in info["invalid_action"]
    _, _, _, _, info = env.step("get_order[#2]")
    assert info["invalid_action"] is None and info["structured"]["order_id"] == orders[1]["order_id"]
    _, _, _, _, info = env.step("get_order[" + orders[0]["order_id"] + "]")  # ids are accepted either way
    assert info["invalid_action"] is None and info["structured"]["order_id"] == orders[0]["order_id"]
    delivered = next((k for k, o in enumerate(orders, 1) if o["status"] == "delivered"), None)
    if delivered is not None:
        n_items = len(orders[delivered - 1]["items"])
        _, _, _, _, info = env.step(f"return_item[#{delivered}, #{n_items + 1}]")
        assert f"items #1 to #{n_items}" in info["invalid_action"]
        _, _, _, _, info = env.step(f"exchange_item[#{delivered}, #1, #1]")
        assert "search first" in info["invalid_action"]


@pytest.mark.parametrize("family", FAMILIES)
def test_text_and_json_episodes_are_identical(env, family):
    a = run_expert(env, family, 2_000_001)
    b = run_expert(env, family, 2_000_001, json_actions=True)
    assert [s[0] for s in a] == [s[0] for s in b] and [s[2] for s in a] == [s[2] for s in b]
    assert a[-1][3]["success"] and b[-1][3]["success"]


def test_every_action_kind_text_equals_json_in_env(env):
    """Each tool, in a state where it applies, gives the same observation and info in both forms."""
    from shopsim.envs.shopping.actions import TOOLS

    seen = set()

    def both(setup, action: Action, family="bundle", task=12):
        outs = []
        for form in (action.to_text(), action.to_json()):
            env.reset(seed=0, options={"family": family, "task_id": task})
            for s in setup:
                env.step(s)
            outs.append(env.step(form))
        infos = [{k: v for k, v in o[4].items() if k != "chars_before_first_answer"} for o in outs]  # form length
        for i in infos:
            i.get("episode_metrics", {}).pop("chars_before_first_answer", None)
        assert outs[0][:4] == outs[1][:4] and infos[0] == infos[1], action
        seen.add(action.name)
        return outs[0]

    env.reset(seed=0, options={"family": "bundle", "task_id": 12})
    _, _, _, _, info = env.step("search[shirt]")
    sku = info["structured"]["results"][0]["sku"]
    open_item = ["search[shirt]", f"click[{sku}]"]
    both([], Action("search", ("shirt",)))
    both(["search[shirt]"], Action("click", (sku,)))
    both(open_item, Action("back"))
    both(["search[shirt]"], Action("next_page"))
    both(["search[shirt]", "next_page"], Action("prev_page"))
    both([], Action("ask", ("which color?",)))
    both([], Action("answer", ("hello",)))
    both(open_item, Action("buy"))
    both(open_item, Action("add_to_cart"))
    both(open_item + ["add_to_cart"], Action("remove_from_cart", (sku,)))
    both(open_item + ["add_to_cart"], Action("view_cart"))
    both(open_item + ["add_to_cart"], Action("checkout"))
    both([], Action("finish"))
    obs, info = env.reset(seed=0, options={"family": "after_sales", "task_id": 3})
    req = info["oracle"]["request"]
    both([], Action("list_orders"), "after_sales", 3)
    both([], Action("get_order", (req["order_id"],)), "after_sales", 3)
    both([], Action("cancel_order", (req["order_id"], "no longer needed")), "after_sales", 3)
    both([], Action("return_item", (req["order_id"], req["sku"])), "after_sales", 3)
    both([], Action("exchange_item", (req["order_id"], req["sku"], sku)), "after_sales", 3)
    both([], Action("get_profile"), "personalized_buy", 3)
    both([], Action("get_orders"), "personalized_buy", 3)
    assert seen == set(TOOLS)


def test_compact_observation_is_small_and_stable(env):
    longest = 0
    for family in FAMILIES:
        for tid in range(2_000_000, 2_000_010):
            for obs, *_ in run_expert(env, family, tid):
                assert env.observation_space.contains(obs)
                longest = max(longest, len(obs))
    # ~4 characters per token: 400 tokens is about 1,600 characters; bundles with 4 items are the longest
    assert longest <= 2000, longest
    a = run_expert(env, "find_and_buy", 2_000_003)
    b = run_expert(env, "find_and_buy", 2_000_003)
    assert [s[0].encode() for s in a] == [s[0].encode() for s in b]
    full = ShoppingEnv(catalog_size=SIZE, obs_mode="full")
    obs, _ = full.reset(seed=0, options={"family": "after_sales", "task_id": 1})
    assert "Store policy:" in obs and "Valid actions:" in obs


def test_constructor_validates_arguments():
    with pytest.raises(ConfigError, match="obs_mode"):
        ShoppingEnv(catalog_size=SIZE, obs_mode="html")
    with pytest.raises(ConfigError, match="max_invalid"):
        ShoppingEnv(catalog_size=SIZE, max_invalid=0)
    with pytest.raises(ConfigError, match="family"):
        ShoppingEnv(catalog_size=SIZE, family="buy_everything")
    with pytest.raises(ConfigError, match="invalid_penalty"):
        ShoppingEnv(catalog_size=SIZE, invalid_penalty=float("nan"))
    assert np.isfinite(ShoppingEnv(catalog_size=SIZE, invalid_penalty=0.5).invalid_penalty)


def test_side_effect_metrics(env):
    steps = run_expert(env, "find_and_buy", 2_000_010)
    m = steps[-1][3]["episode_metrics"]
    assert m["purchased"] == 1.0 and m["wrong_purchase"] == 0.0 and m["customer_left"] == 0.0
    for tid in range(2_000_000, 2_000_100):
        env.reset(seed=0, options={"family": "after_sales", "task_id": tid})
        req = env.task.request
        others = [o.order_id for o in env.db.orders.values()
                  if o.order_id != req["order_id"] and o.status in ("pending", "processing")]
        if others:
            break
    env.step(f"get_order[{req['order_id']}]")
    _, _, _, _, info = env.step(f"cancel_order[{others[0]}, no longer needed]")  # the wrong order
    assert info["invalid_action"] is None
    env.step("answer[Done.]")
    _, r, term, _, info = env.step("finish")
    m = info["episode_metrics"]
    assert term and r == 0.0 and m["writes"] == 1.0 and m["wrong_write"] == 1.0
    assert info["reward_parts"]["wrong_order_writes"] == 1.0 and info["reward_parts"]["db_match"] == 0.0


class _Silent:
    """A plug-in customer that never reveals anything (the protocol in shopsim.envs.shopping.customer)."""

    def __init__(self, task, rng):
        self.patience, self.left, self.questions, self.revealed = 9, False, 0, {}

    def ask(self, question):
        self.questions += 1
        return "No comment."

    def hear(self, message):
        return "Hm."

    def said(self):
        return []


def test_customer_plug_in():
    env = ShoppingEnv(catalog_size=SIZE, customer=_Silent)
    env.reset(seed=0, options={"family": "clarify_and_buy", "task_id": 3})
    obs, *_, info = env.step("ask[which color?]")
    assert "Customer: No comment." in obs and info["patience"] == 9
    with pytest.raises(ConfigError, match="customer"):
        ShoppingEnv(catalog_size=SIZE, customer="llm")


def test_cart_add_replace_remove_and_capacity(env):
    from shopsim.envs.shopping.grading import MAX_CART_LINES

    env.reset(seed=0, options={"family": "bundle", "task_id": 5})
    _, _, _, _, info = env.step("search[shirt socks dress jeans]")
    skus = [r["sku"] for r in info["structured"]["results"]]
    added = []
    for sku in skus[:MAX_CART_LINES]:
        env.step(f"click[{sku}]")
        _, _, _, _, info = env.step("add_to_cart")
        assert info["invalid_action"] is None
        added.append(sku)
        env.step("click[< prev]")
    env.step(f"click[{skus[0]}]")
    _, _, _, _, info = env.step("click[add to cart]")  # re-adding a product replaces its line, even when full
    assert info["invalid_action"] is None and len(info["structured"]["cart"]) == MAX_CART_LINES
    env.step("click[< prev]")
    env.step(f"click[{skus[MAX_CART_LINES]}]")
    _, _, _, _, info = env.step("add_to_cart")
    assert "at most" in info["invalid_action"] and len(info["structured"]["cart"]) == MAX_CART_LINES
    obs, _, _, _, info = env.step(f"remove_from_cart[{skus[1].lower()}]")
    assert len(info["structured"]["cart"]) == MAX_CART_LINES - 1 and f"Removed {skus[1]}" in obs
    _, _, _, _, info = env.step(f"remove_from_cart[{skus[1]}]")
    assert "not in the cart" in info["invalid_action"]
    obs, _, _, _, info = env.step("view_cart")
    assert "Page: cart (7 items" in obs and "click[checkout]" in info["valid_actions"]
    total = info["structured"]["cart_total"]
    _, r, term, _, info = env.step("click[checkout]")
    assert term and info["end_reason"] == "checkout"
    assert info["reward_parts"]["cart_total"] == pytest.approx(total)
    assert r == pytest.approx(info["score"]) and r == pytest.approx(
        info["reward_parts"]["mean_item_score"] * info["reward_parts"]["budget_ok"])


def test_back_restores_the_previous_results(env):
    env.reset(seed=0, options={"family": "find_and_buy", "task_id": 6})
    _, _, _, _, first = env.step("search[wireless earbuds]")
    _, _, _, _, second = env.step("search[yoga mat]")
    assert first["structured"]["results"] != second["structured"]["results"]
    obs, _, _, _, info = env.step("back")
    assert info["structured"]["results"] == first["structured"]["results"] and '"wireless earbuds"' in obs
    assert info["anchor"] == first["anchor"]


def test_results_always_match_the_latest_search():
    """Every results page shows exactly the index's answer for the current query (no stale page memo)."""
    from shopsim.envs.shopping import cache

    env = ShoppingEnv(catalog_size=SIZE, max_turns=1000)
    env.reset(seed=0, options={"family": "find_and_buy", "task_id": 1})
    for q in ["tent", "yoga mat", "tent", "coffee beans", "socks", "laptop"] * 12:
        cache.clear()  # fresh result objects every time, as after evictions
        env.step("click[back to search]")
        _, _, _, _, info = env.step(f"search[{q}]")
        want = [pid for pid, _ in env.index.search(q, k=env.max_results)][: env.results_per_page]
        assert [r["product_id"] for r in info["structured"]["results"]] == want


def test_checkout_of_extra_lines_in_a_one_item_family_is_divided(env):
    obs, info = env.reset(seed=0, options={"family": "find_and_buy", "task_id": 9})
    goal = info["oracle"]["goals"][0]
    target = env.catalog.product(goal["target_id"])
    env.step(f"search[{target.title}]")
    env.step(f"click[{target.sku}]")
    for name, value in goal["options"].items():
        env.step(f"click[{name}: {value}]")
    _, _, _, _, info = env.step("add_to_cart")
    assert info["invalid_action"] is None
    _, _, _, _, info = env.step("click[< prev]")
    other = next(r["sku"] for r in info["structured"]["results"] if r["sku"] != target.sku)
    env.step(f"click[{other}]")
    env.step("add_to_cart")
    _, r, term, _, info = env.step("checkout")
    assert term and info["reward_parts"]["lines_bought"] == 2.0
    assert r == pytest.approx(0.5) and info["success"] is False  # the perfect line, divided by 2 lines


@pytest.mark.parametrize("numbered", [False, True])
def test_positional_result_clicks(numbered):
    """click[#k] / click[k] opens the k-th result shown (text and JSON alike); SKU clicks still work; the
    numbered rendering prefixes each result line with its position."""
    env = ShoppingEnv(catalog_size=SIZE, results_per_page=5, numbered_results=numbered)
    opened = []
    for action in ("click[#3]", "click[3]", '{"name": "click", "arguments": {"target": "#3"}}', None):
        env.reset(seed=0, options={"family": "find_and_buy", "task_id": 21})
        obs, _, _, _, info = env.step("search[cotton t-shirt]")
        res = info["structured"]["results"]
        assert len(res) == 5
        lines = [ln for ln in obs.splitlines() if f"[{res[2]['sku']}]" in ln]
        assert lines and lines[0].startswith("#3 [") == numbered
        obs, _, _, _, info = env.step(action or f"click[{res[2]['sku']}]")
        assert info["invalid_action"] is None and info["structured"]["page"] == "item"
        opened.append(info["structured"]["product"]["sku"])
    assert opened == [res[2]["sku"]] * 4
    env.reset(seed=0, options={"family": "find_and_buy", "task_id": 21})
    env.step("search[cotton t-shirt]")
    for bad in ("click[#6]", "click[#0]", "click[#x]"):
        _, _, _, _, info = env.step(bad)
        assert info["invalid_action"] and info["structured"]["page"] == "results"


@pytest.mark.parametrize("family", FAMILIES)
def test_terse_rendering_keeps_every_structured_fact(family):
    """obs_mode="terse": the task once per episode, and every position, title word, option value and price of
    info["structured"] still in the text; shorter than the compact rendering of the same states."""
    terse = ShoppingEnv(catalog_size=SIZE, obs_mode="terse", numbered_results=True, results_per_page=5)
    compact = ShoppingEnv(catalog_size=SIZE, numbered_results=True, results_per_page=5)
    checked_results = checked_options = 0
    lengths = {"terse": 0, "compact": 0}
    for task_id in range(3):
        steps = run_expert(terse, family, 2_000_000 + 4 * task_id + FAMILIES.index(family))
        again = run_expert(compact, family, 2_000_000 + 4 * task_id + FAMILIES.index(family))
        assert [s[1] for s in steps] == [s[1] for s in again]  # same episode, only the rendering differs
        for k, ((obs, _, _, info), (cobs, *_)) in enumerate(zip(steps, again, strict=False)):
            lengths["terse"] += len(obs)
            lengths["compact"] += len(cobs)
            task_line = "Task: " + terse.task.instruction
            assert (task_line in obs) == (k == 0)
            assert task_line in cobs
            st = info["structured"]
            for pos, r in enumerate(st["results"], 1):
                line = next(x for x in obs.splitlines() if x.startswith(f"#{pos} "))
                # the SKU only where a tool takes it (after-sales exchanges), else the agent clicks by position
                assert (r["sku"] in line) == (family == "after_sales")
                assert all(w in line.split() for w in r["title"].split()), (line, r["title"])
                assert f"${r['price']:.2f}" in line
                checked_results += 1
            if st["product"]:
                p = st["product"]
                assert f"${p['price']:.2f}" in obs and all(w in obs for w in p["title"].split())
                for name, values in p["options"].items():
                    line = next(x for x in obs.splitlines() if x.startswith(f"{name}: "))
                    assert all(v in line for v in values)
                    checked_options += len(values)
                for a in p["attributes"]:
                    assert a in obs
    if family != "after_sales":
        assert checked_results > 0 and checked_options > 0
    assert lengths["terse"] < 0.8 * lengths["compact"]


def test_terse_after_sales_results_keep_the_sku_the_exchange_tool_takes():
    env = ShoppingEnv(catalog_size=SIZE, obs_mode="terse", numbered_results=True, results_per_page=5)
    for family, with_sku in (("after_sales", True), ("find_and_buy", False)):
        env.reset(seed=0, options={"family": family})
        obs, *_, info = env.step("search[camping tent]")
        rows = info["structured"]["results"]
        assert rows
        for pos, r in enumerate(rows, 1):
            line = next(x for x in obs.splitlines() if x.startswith(f"#{pos} "))
            assert (f"[{r['sku']}]" in line) == with_sku


def test_terse_is_a_presentation_option():
    from shopsim.envs import presentation_kwargs

    assert "obs_mode" in presentation_kwargs(ENV_ID)


def test_task_reminder_restates_the_task_after_each_cart_change():
    """task_reminder=True (terse): the task line again exactly in the observations after an add-to-cart or a
    removal; off, or in compact mode, the observations are those of the env without the option."""
    from shopsim.envs import presentation_kwargs

    assert "task_reminder" in presentation_kwargs(ENV_ID)
    kw = dict(catalog_size=SIZE, obs_mode="terse", numbered_results=True, results_per_page=5)
    remind, plain = ShoppingEnv(**kw, task_reminder=True), ShoppingEnv(**kw)
    tid = 2_000_000 + FAMILIES.index("bundle")
    steps, again = run_expert(remind, "bundle", tid), run_expert(plain, "bundle", tid)
    assert [s[1] for s in steps] == [s[1] for s in again]
    task_line = "Task: " + remind.task.instruction
    adds = 0
    for k, ((obs, action, _, _), (pobs, *_)) in enumerate(zip(steps, again, strict=True)):
        changed = action is not None and action.replace(" ", "") == "click[addtocart]"
        adds += changed
        assert (task_line in obs) == (k == 0 or changed)
        assert obs == (pobs if k == 0 or not changed else task_line + "\n" + pobs)
    assert adds == len(remind.task.goals) >= 2
    # a removal changes the cart too; a failed removal (invalid action) does not
    obs, *_ = remind.reset(seed=0, options={"family": "bundle", "task_id": tid, "split": "test"})
    remind.step("search[tent]")
    remind.step("click[#1]")
    assert remind.step("click[add to cart]")[0].startswith("Task: " + remind.task.instruction + "\n")
    sku = remind._sku(remind.cart[0][0])
    assert remind.step(f"remove_from_cart[{sku}]")[0].startswith("Task: " + remind.task.instruction + "\n")
    assert not remind.step("remove_from_cart[B000000000]")[0].startswith("Task: ")
    compact = [ShoppingEnv(catalog_size=SIZE, task_reminder=flag) for flag in (True, False)]
    a, b = (run_expert(e, "bundle", tid) for e in compact)
    assert [s[0] for s in a] == [s[0] for s in b]
