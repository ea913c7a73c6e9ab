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


# ---- paraphrased instructions ----------------------------------------------------------------------------------
def test_paraphrase_keeps_the_task_and_is_deterministic():
    from shopsim.envs.shopping.tasks import make_task

    t_env = ShoppingEnv(catalog_size=SIZE)
    changed = 0
    for fam in ("find_and_buy", "clarify_and_buy", "bundle", "after_sales"):
        for tid in range(2_000_000, 2_000_010):
            a = make_task(t_env.catalog, fam, "test", tid)
            b = make_task(t_env.catalog, fam, "test", tid, "paraphrase")
            c = make_task(t_env.catalog, fam, "test", tid, "paraphrase")
            assert (a.goals, a.hidden, a.budget, a.request) == (b.goals, b.hidden, b.budget, b.request)
            assert b.instruction == c.instruction
            changed += a.instruction != b.instruction
    assert changed >= 28  # the three shopping families are reworded (after_sales keeps its wording)
    with pytest.raises(ConfigError, match="instruction_style"):
        ShoppingEnv(catalog_size=SIZE, instruction_style="free")


def test_paraphrase_states_all_values_verbatim_in_under_half_of_tasks():
    from shopsim.envs.shopping.paraphrase import verbatim_values
    from shopsim.envs.shopping.tasks import make_task

    cat = ShoppingEnv(catalog_size=SIZE).catalog
    share = {}
    for style in ("template", "paraphrase"):
        hits = 0
        for fam in ("find_and_buy", "clarify_and_buy", "bundle"):
            for tid in range(2_000_000, 2_000_030):
                t = make_task(cat, fam, "test", tid, style)
                counts = [verbatim_values(g, t.instruction, t.hidden) for g in t.goals]
                hits += all(k == n for k, n in counts)
        share[style] = hits / 90
    assert share["template"] == 1.0 and share["paraphrase"] < 0.5


def test_numeric_forms_and_synonyms_by_hand():
    import numpy as np

    from shopsim.envs.shopping.paraphrase import number_words, reword

    assert number_words(9.5) == "nine and a half" and number_words(45) == "forty five"
    assert number_words(120) == "one hundred twenty" and number_words(1250) == "one thousand two hundred fifty"
    rng = np.random.default_rng(0)
    assert {reword("5 pack", rng, p=1.0) for _ in range(30)} <= {"pack of five", "five pack bundle", "set of five"}
    assert {reword("waterproof", rng, p=1.0) for _ in range(30)} == {"water tight", "keeps water out"}
    assert reword("128gb", rng, p=1.0) in ("128 gigabytes", "128 gb")
    assert reword("waterproof", rng, p=0.0) == "waterproof"


def test_taxonomy_synonyms_never_repeat_the_original_and_leave_the_catalog_hash_alone():
    import re

    from shopsim.catalog.taxonomy import load_taxonomy, synonyms

    table = synonyms()
    assert len(table) > 200
    for value, alts in table.items():
        assert alts and all(not re.search(rf"(?<![a-z0-9]){re.escape(value)}(?![a-z0-9])", a) for a in alts), value
    known = set()
    for cat in load_taxonomy()["categories"].values():
        for t, spec in cat["types"].items():
            known |= {t, *spec["attributes"], *(v for vals in spec["options"].values() for v in vals)}
    assert set(table) <= known  # no entry for a word the catalog never uses


# ---- personalized_buy --------------------------------------------------------------------------------------------
def test_personalized_buy_passes_check_env():
    import gymnasium as gym
    from gymnasium.utils.env_checker import check_env

    env = gym.make("shopsim/Shopping-v0", family="personalized_buy", catalog_size=SIZE)
    check_env(env.unwrapped, skip_render_check=True)


def test_personalized_target_is_consistent_with_the_profile_and_left_open_by_the_instruction():
    env = ShoppingEnv(catalog_size=SIZE, family="personalized_buy")
    for k in range(40):
        obs, info = env.reset(seed=k, options={"task_id": 2_000_000 + k})
        goal, prof = info["oracle"]["goals"][0], info["oracle"]["profile"]
        target = env.catalog.product(goal["target_id"])
        assert prof["brands"][target.category] == target.brand == goal["brand"]
        assert prof["preferences"][target.product_type] == goal["options"]
        assert target.price <= prof["max_spend"][target.product_type] == goal["price_ceiling"]
        assert all(h["sku"] != target.sku for h in prof["history"])
        task_line = obs.split("\n")[0].lower()
        assert target.brand.lower() not in task_line and "$" not in task_line
        assert all(a in task_line for a in goal["attributes"])
        assert "Profile: " + prof["name"] in obs and "Past orders: [W" in obs  # the first observation shows both
        # the same task twice is the same profile (task = f(family, id, catalog))
        assert env.reset(seed=k + 99, options={"task_id": 2_000_000 + k})[1]["oracle"]["profile"] == prof


def test_profile_tools_only_in_personalized_tasks():
    env = ShoppingEnv(catalog_size=SIZE)
    _, info = env.reset(seed=0, options={"family": "personalized_buy", "task_id": 5})
    assert {"get_profile", "get_orders"} <= set(info["valid_actions"])
    obs, _, _, _, info = env.step('{"name": "get_profile", "arguments": {}}')
    assert info["invalid_action"] is None and "Favourite brands:" in obs.split("Feedback: ")[1]
    obs, _, _, _, info = env.step("get_orders")
    first = info["oracle"]["profile"]["history"][0]
    assert info["invalid_action"] is None and first["title"] in obs.split("Feedback:")[1]
    _, info = env.reset(seed=0, options={"family": "find_and_buy", "task_id": 5})
    assert "get_profile" not in info["valid_actions"]
    _, _, _, _, info = env.step("get_profile")
    assert info["invalid_kind"] == "tool" and "profile" in info["invalid_action"]
    names = [s["function"]["name"] for s in env.tool_schemas]
    assert "get_profile" in names and "get_orders" in names


def test_wrong_brand_loses_the_brand_term_by_hand():
    env = ShoppingEnv(catalog_size=SIZE, family="personalized_buy")
    _, info = env.reset(seed=0, options={"task_id": 7})
    goal = info["oracle"]["goals"][0]
    target = env.catalog.product(goal["target_id"])
    # a product of the same type from another brand, opened directly, bought with the goal's options where offered
    other = next(i for i in range(len(env.catalog)) if env.catalog.product(i).product_type == target.product_type
                 and env.catalog.product(i).brand != target.brand)
    p = env.catalog.product(other)
    env.step(f"search[{p.title}]")
    env.step(f"click[{p.sku}]")
    for name, value in goal["options"].items():
        if value in p.options.get(name, []):
            env.step(f"click[{name}: {value}]")
    _, r, _, _, info = env.step("buy")
    parts = info["reward_parts"]
    assert parts["brand_ok"] == 0.0
    n = parts["attributes_total"] + parts["options_total"] + 2  # + brand + price
    assert r == pytest.approx((parts["attributes_matched"] + parts["options_matched"] + parts["price_ok"]) / n)


def test_expert_solves_personalized_test_tasks_and_random_does_not():
    from agents.random_agent import RandomTextAgent
    from agents.shopping_expert import ShoppingExpert

    env = ShoppingEnv(catalog_size=SIZE, family="personalized_buy")
    rates = []
    for agent in (ShoppingExpert(), RandomTextAgent(env_id="shopsim/Shopping-v0")):
        agent.reset(1, 0)
        ok = 0
        for k in range(60):
            obs, info = env.reset(seed=k, options={"task_id": 2_000_000 + k})
            agent.begin_episode(0, obs, info)
            while True:
                obs, _, term, trunc, info = env.step(agent.act_one(0, obs, info))
                if term or trunc:
                    break
            ok += info["success"]
        rates.append(ok / 60)
    assert rates[0] >= 0.95 and rates[1] <= 0.05


# ---- near-duplicate catalog --------------------------------------------------------------------------------------
def test_near_duplicate_siblings_differ_from_their_head_in_exactly_one_thing():
    from shopsim.catalog import load_catalog
    from shopsim.catalog.near_duplicates import near_duplicate_catalog

    base = load_catalog(SIZE, 0)
    cat = near_duplicate_catalog(base, 4)
    again = near_duplicate_catalog(base, 4)
    assert cat.table.equals(again.table) and cat.clusters == again.clusters  # deterministic
    in_cluster = {m for c in cat.clusters.values() for m in c["members"]}
    plain = [i for i in range(SIZE) if i not in in_cluster]
    assert cat.table.take(plain).equals(base.table.take(plain))  # products outside clusters are untouched
    assert len(cat) == SIZE + sum(len(c["members"]) - 1 for c in cat.clusters.values()) > SIZE
    # the target is not always the cluster's lowest id (search ties rank lower ids first)
    assert 0.2 < sum(t != min(c["members"]) for t, c in cat.clusters.items()) / len(cat.clusters) < 0.95
    kinds = {"attributes": 0, "options": 0, "price": 0}
    for head, cl in list(cat.clusters.items())[:100]:
        h = cat.product(head)
        assert head in cl["members"]
        for m in (m for m in cl["members"] if m != head):
            s = cat.product(m)
            assert (s.product_type, s.brand, s.option_names) == (h.product_type, h.brand, h.option_names)
            assert cat.sku_to_id(s.sku) == m
            diff = [k for k, a, b in (("attributes", s.attributes, h.attributes),
                                      ("options", s.option_values, h.option_values), ("price", s.price, h.price))
                    if a != b]
            assert len(diff) == 1, (head, m, diff)
            kinds[diff[0]] += 1
    assert all(kinds.values())
    with pytest.raises(ConfigError, match="near_duplicates"):
        ShoppingEnv(catalog_size=SIZE, near_duplicates=1)


def test_near_duplicate_tasks_target_heads_and_every_sibling_misses_the_goal():
    import pickle

    from shopsim.envs.shopping.grading import Goal, best_options, satisfies

    env = ShoppingEnv(catalog_size=SIZE, near_duplicates=4)
    assert len(ShoppingEnv(catalog_size=SIZE).catalog) == SIZE  # the default catalog has no clusters
    for fam in ("find_and_buy", "clarify_and_buy", "personalized_buy"):
        for k in range(15):
            _, info = env.reset(seed=k, options={"family": fam, "task_id": 2_000_000 + k})
            g = info["oracle"]["goals"][0]
            goal = Goal(g["product_type"], tuple(g["attributes"]), tuple(g["options"].items()), g["price_ceiling"],
                        g["target_id"], brand=g.get("brand"))
            members = env.catalog.clusters[goal.target_id]["members"]
            assert satisfies(goal, env.catalog.product(goal.target_id))
            for m in (m for m in members if m != goal.target_id):
                sib = env.catalog.product(m)
                assert not satisfies(goal, sib), (fam, k, m, best_options(goal, sib))
    clone = pickle.loads(pickle.dumps(env))
    assert clone.catalog is env.catalog and clone.reset(seed=0, options={"task_id": 3})[1]["oracle"] == \
        env.reset(seed=0, options={"task_id": 3})[1]["oracle"]


# ---- every option: check_env, fuzzing, determinism ---------------------------------------------------------------
OPTION_KWARGS = [{"reward_scheme": "strict"}, {"instruction_style": "paraphrase"}, {"near_duplicates": 3},
                 {"family": "personalized_buy", "instruction_style": "paraphrase", "near_duplicates": 5}]


@pytest.mark.parametrize("kwargs", OPTION_KWARGS)
def test_options_pass_check_env_and_survive_garbage(kwargs):
    import numpy as np
    from gymnasium.utils.env_checker import check_env

    from tests.test_shopping_fuzz import garbage

    env = ShoppingEnv(catalog_size=SIZE, **kwargs)
    check_env(env, skip_render_check=True)
    env = ShoppingEnv(catalog_size=SIZE, max_invalid=10**9, max_turns=10**9, **kwargs)
    rng = np.random.default_rng(0)
    env.reset(seed=0, options={"family": kwargs.get("family", "find_and_buy")})
    env.step("search[shirt]")
    for _ in range(200):
        obs, r, term, trunc, info = env.step(garbage(rng))
        assert info["invalid_action"] and env.observation_space.contains(obs) and not term and not trunc


@pytest.mark.parametrize("kwargs", OPTION_KWARGS)
def test_options_same_seed_same_episode(kwargs):
    from agents.random_agent import RandomTextAgent

    def run() -> list:
        env = ShoppingEnv(catalog_size=SIZE, **kwargs)
        agent = RandomTextAgent(env_id="shopsim/Shopping-v0")
        agent.reset(1, 3)
        obs, info = env.reset(seed=3)
        out = [obs]
        for _ in range(40):
            a = agent.act_one(0, obs, info)
            obs, r, term, trunc, info = env.step(a)
            out.append((a, obs, r, info["oracle"]))
            if term or trunc:
                obs, info = env.reset(seed=4)
                out.append(obs)
        return out

    assert run() == run()


# ---- LM customer -------------------------------------------------------------------------------------------------
def _clarify_task_with_option_and_price(env):
    for tid in range(200):
        _, info = env.reset(seed=0, options={"family": "clarify_and_buy", "task_id": tid})
        kinds = [h[0] for h in info["oracle"]["hidden"]]
        if "option" in kinds and "price" in kinds:
            return tid, info
    raise AssertionError("no clarify task hides an option and the price among the first 200")


def test_lm_customer_uses_checked_replies_and_falls_back_on_leaks():
    from functools import partial

    from shopsim.envs.shopping.lm_customer import LMCustomer

    replies = {}

    def stub(prompt: str) -> str:
        return replies["next"]

    env = ShoppingEnv(catalog_size=SIZE, customer=partial(LMCustomer, generate=stub))
    tid, info = _clarify_task_with_option_and_price(env)
    goal = info["oracle"]["goals"][0]
    dim = next(h[1] for h in info["oracle"]["hidden"] if h[0] == "option")
    value = goal["options"][dim]
    price = f"{goal['price_ceiling']:.2f}"
    # 1) a reply that states the asked value and nothing hidden is used as is
    replies["next"] = f"I would like {value}, thanks."
    obs, _, _, _, info = env.step(f"ask[Which {dim} would you like?]")
    assert f"Customer: I would like {value}, thanks." in obs
    assert info["customer_lm_replies"] == 1 and info["customer_fallbacks"] == 0
    # 2) a reply that also leaks the hidden budget is replaced by the scripted sentence and counted
    env.reset(seed=0, options={"family": "clarify_and_buy", "task_id": tid})
    replies["next"] = f"{value}, and I spend at most {price} dollars."
    obs, _, _, _, info = env.step(f"ask[Which {dim} would you like?]")
    assert price not in obs.split("Feedback:")[1] and value in obs.split("Feedback:")[1]
    assert info["customer_fallbacks"] == 1 and info["customer_lm_replies"] == 0
    assert env.customer.fallback_reasons == ["leaks price"]
    # 3) a reply that does not state the asked value falls back too
    env.reset(seed=0, options={"family": "clarify_and_buy", "task_id": tid})
    replies["next"] = "Whatever you think is best."
    _, _, _, _, info = env.step(f"ask[Which {dim} would you like?]")
    assert info["customer_fallbacks"] == 1 and env.customer.fallback_reasons == ["does not state the asked value"]
    # the scripted customer reports no LM counters (the default info is unchanged)
    assert "customer_fallbacks" not in ShoppingEnv(catalog_size=SIZE).reset(seed=0)[1]


def test_lm_customer_with_a_tiny_local_checkpoint(tmp_path):
    from agents.lm.model import build_model
    from agents.lm.tokenizer import load_tokenizer

    tok = load_tokenizer()
    build_model(tok, size="tiny", seed=0).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)

    def episode():
        env = ShoppingEnv(catalog_size=SIZE, customer="lm", customer_model=str(tmp_path))
        tid, info = _clarify_task_with_option_and_price(env)
        out = []
        for h in info["oracle"]["hidden"]:
            q = {"option": f"Which {h[1]} would you like?", "attribute": "Is there a feature it must have?",
                 "price": "What is your budget?"}[h[0]]
            obs, _, _, _, info = env.step(f"ask[{q}]")
            out.append(obs)
        return out, info, len(info["oracle"]["hidden"])

    import pickle

    out, info, n = episode()
    env = ShoppingEnv(catalog_size=SIZE, customer="lm", customer_model=str(tmp_path))
    assert pickle.loads(pickle.dumps(env)).customer_factory.keywords["generate"] is \
        env.customer_factory.keywords["generate"]  # pickles as its path; the same process reuses the loaded model
    # an untrained model never states the value: every reveal falls back to the scripted answer, and is counted
    assert info["customer_fallbacks"] + info["customer_lm_replies"] == n and info["customer_fallbacks"] == n
    assert out == episode()[0]  # greedy decoding: the same episode again
    with pytest.raises(ConfigError, match="customer_model"):
        ShoppingEnv(catalog_size=SIZE, customer="lm")
    with pytest.raises(ConfigError, match="not a folder"):
        ShoppingEnv(catalog_size=SIZE, customer="lm", customer_model=str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="customer_model"):
        ShoppingEnv(catalog_size=SIZE, customer_model=str(tmp_path))
