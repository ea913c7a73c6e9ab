"""Shopping-v0 search price clauses: `cache.split_price` reads them, the env keeps only results within the
ceiling in the unfiltered rank order, the results header states the filter, and the SFT expert writes them."""

from __future__ import annotations

import pytest

from agents.shopping_expert import ShoppingExpert
from shopsim.envs.shopping import ShoppingEnv, cache
from shopsim.envs.shopping.cache import split_price
from shopsim.envs.shopping.tasks import split_ids

SIZE = 2000
ENV_ID = "shopsim/Shopping-v0"


@pytest.fixture(scope="module")
def env():
    return ShoppingEnv(catalog_size=SIZE)


@pytest.mark.parametrize("query, keywords, ceiling", [
    ("a blue backpack, and price lower than 60.00 dollars", "a blue backpack", 60.0),
    ("backpack price less than $25", "backpack", 25.0),
    ("backpack price under 7.5", "backpack", 7.5),
    ("shoes under $30 black", "shoes black", 30.0),
    ("shirt below 12 dollars", "shirt", 12.0),
    ("Lamp, and PRICE LOWER THAN 19.99 DOLLARS", "Lamp", 19.99),
    ("a under $40 b, price lower than 20 dollars", "a b", 20.0),  # the last clause wins, both are removed
    ("toys for kids under 5", "toys for kids under 5", None),  # a bare number is a keyword, not a price
    ("under armour shirt", "under armour shirt", None),
    ("price lower than dollars", "price lower than dollars", None),
])
def test_split_price_reads_the_clause_and_leaves_the_keywords(query, keywords, ceiling):
    assert split_price(query) == (keywords, ceiling)


def _results(env, query):
    obs, _, term, trunc, info = env.step(f"search[{query}]")
    assert not (term or trunc) and info["structured"]["page"] == "results"
    return obs, env.hits


@pytest.mark.parametrize("ceiling", [15.0, 40.0, 1000.0])
def test_a_price_clause_keeps_the_ranked_results_within_the_ceiling(env, ceiling):
    env.reset(seed=0, options={"family": "find_and_buy"})
    keywords = "lightweight backpack blue"
    plain_obs, plain = _results(env, keywords)
    full = [pid for pid, _ in env.index.search(keywords, k=len(env.index))]  # the whole ranked match list
    obs, hits = _results(env, f"{keywords}, and price lower than {ceiling:.2f} dollars")
    want = [pid for pid in full if env.catalog.prices[pid] <= ceiling][:env.max_results]
    assert list(hits) == want and len(hits) > 0
    assert all(env.catalog.prices[pid] <= ceiling for pid in hits)
    assert f"{len(hits)} results at most ${ceiling:.2f})" in obs.splitlines()[1]
    # a plain query is searched as before: the first max_results of the same ranking, and no filter in the header
    assert list(plain) == full[:env.max_results] and "at most" not in plain_obs


def test_a_tight_ceiling_scans_past_the_first_window(env):
    """A ceiling few products meet: the filtered hits come from deep in the match list (past the first window the
    search reads), and are still exactly the matches within the ceiling, in rank order."""
    env.reset(seed=0, options={"family": "find_and_buy"})
    keywords = "black"
    full = [pid for pid, _ in env.index.search(keywords, k=len(env.index))]
    prices = sorted(env.catalog.prices[pid] for pid in full)
    ceiling = float(prices[20])  # about 21 of the matches qualify
    _, hits = _results(env, f"{keywords} price under ${ceiling}")
    want = [pid for pid in full if env.catalog.prices[pid] <= ceiling + 1e-9]
    assert list(hits) == want[:env.max_results]
    assert full.index(hits[-1]) >= max(4 * env.max_results, 64)  # found beyond the first window


def test_terse_header_and_paging_keep_the_filter():
    env = ShoppingEnv(catalog_size=SIZE, obs_mode="terse", results_per_page=5, numbered_results=True)
    env.reset(seed=1, options={"family": "find_and_buy"})
    obs, hits = _results(env, "backpack, and price lower than 50.00 dollars")
    assert "hits at most $50.00):" in obs
    obs, *_ = env.step("click[next >]")
    shown = [float(line.rsplit("$", 1)[1]) for line in obs.splitlines() if line.startswith("#")]
    assert shown and all(p <= 50.0 for p in shown)
    cache.clear()  # a cold search gives the same hits
    _, again = _results(env, "backpack, and price lower than 50.00 dollars")
    assert again == hits


@pytest.mark.parametrize("family", ["find_and_buy", "clarify_and_buy"])
def test_the_sft_expert_searches_with_the_price_clause(family):
    """query="instruction", price_clause=True: find_and_buy searches the task line verbatim, price clause included;
    clarify_and_buy appends the budget the customer named, as the same clause. The clause makes the first result the
    one opened in most episodes."""
    env = ShoppingEnv(catalog_size=SIZE, numbered_results=True, results_per_page=5, obs_mode="terse")
    expert = ShoppingExpert(env_id=ENV_ID, click_by="index", query="instruction", price_clause=True)
    expert.reset(1, 0)
    first_clicks, successes, n = [], 0, 20
    for i, tid in enumerate(list(split_ids("test"))[:n]):
        obs, info = env.reset(seed=i, options={"family": family, "task_id": tid, "split": "test"})
        task_line = obs.splitlines()[0][len("Task: "):]
        ceiling = info["oracle"]["goals"][0]["price_ceiling"]
        expert.begin_episode(0, obs, info)
        term = trunc = False
        search = click = None
        while not (term or trunc):
            a = expert.act_one(0, obs, info)
            search = search or (a if a.startswith("search[") else None)
            click = click or (a if search and a.startswith("click[#") else None)
            obs, _, term, trunc, info = env.step(a)
        successes += info["episode_metrics"]["success"]
        first_clicks.append(click)
        assert search.endswith(f", and price lower than {ceiling:.2f} dollars]")
        if family == "find_and_buy":
            assert search == f"search[{task_line}]"
        else:
            assert split_price(search[7:-1])[1] == ceiling
    assert successes == n
    assert first_clicks.count("click[#1]") >= 0.6 * n


def test_price_clause_is_off_by_default_and_a_bundle_searches_under_its_whole_budget():
    env = ShoppingEnv(catalog_size=SIZE, numbered_results=True, results_per_page=5, obs_mode="terse")
    for kwargs, family in (({}, "find_and_buy"), ({"price_clause": True}, "bundle")):
        expert = ShoppingExpert(env_id=ENV_ID, click_by="index", query="instruction", **kwargs)
        expert.reset(1, 0)
        obs, info = env.reset(seed=3, options={"family": family})
        expert.begin_episode(0, obs, info)
        term = trunc = False
        searches = []
        while not (term or trunc):
            a = expert.act_one(0, obs, info)
            if a.startswith("search["):
                searches.append(split_price(a[7:-1])[1])
            obs, _, term, trunc, info = env.step(a)
        assert info["episode_metrics"]["success"] == 1.0
        want = [None] * len(searches) if not kwargs else [info["oracle"]["budget"]] * len(searches)
        assert searches == want and len(searches) >= (2 if family == "bundle" else 1)
