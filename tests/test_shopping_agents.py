"""Shopping-v0 reference agents: the scripted expert solves every family on held-out tasks; random is near 0."""

from __future__ import annotations

import numpy as np
import pytest

from agents.random_agent import RandomTextAgent
from agents.shopping_expert import ShoppingExpert
from shopsim.envs.shopping import FAMILIES, ShoppingEnv
from shopsim.envs.shopping.cache import split_price
from shopsim.envs.shopping.tasks import split_ids

SIZE = 2000
ENV_ID = "shopsim/Shopping-v0"
TARGET = {"find_and_buy": 0.95, "clarify_and_buy": 0.95, "bundle": 0.90, "after_sales": 0.90}


def run(agent, env, family, task_ids, split="test", seed=0):
    out = []
    for i, tid in enumerate(task_ids):
        obs, info = env.reset(seed=seed + i, options={"family": family, "task_id": tid, "split": split})
        agent.begin_episode(0, obs, info)
        while True:
            obs, r, term, trunc, info = env.step(agent.act_one(0, obs, info))
            if term or trunc:
                out.append(info["episode_metrics"])
                break
    return out


@pytest.fixture(scope="module")
def env():
    return ShoppingEnv(catalog_size=SIZE)


@pytest.mark.parametrize("family", FAMILIES)
def test_expert_solves_held_out_tasks(env, family):
    expert = ShoppingExpert(env_id=ENV_ID)
    expert.reset(1, 0)
    ids = list(split_ids("test"))[-12:]
    m = run(expert, env, family, ids, seed=1234)  # held-out tasks and a reset seed the expert was not tuned on
    assert np.mean([x["success"] for x in m]) >= TARGET[family]
    assert all(x["invalid_actions"] == 0 for x in m)


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_expert_success_on_100_test_tasks(env, family):
    expert = ShoppingExpert(env_id=ENV_ID)
    expert.reset(1, 0)
    m = run(expert, env, family, list(split_ids("test"))[:100])
    assert np.mean([x["success"] for x in m]) >= TARGET[family]


def test_expert_episode_lengths(env):
    expert = ShoppingExpert(env_id=ENV_ID)
    expert.reset(1, 0)
    ids = list(split_ids("dev"))[:10]
    fb = [x["turns"] for x in run(expert, env, "find_and_buy", ids, split="dev")]
    bundle = [x["turns"] for x in run(expert, env, "bundle", ids, split="dev")]
    assert np.median(fb) <= 8 and min(fb) >= 4
    assert np.mean(bundle) >= 15  # the long-horizon family


def test_expert_follows_strategies(env):
    expert = ShoppingExpert(env_id=ENV_ID)
    expert.reset(1, 0)
    obs, info = env.reset(seed=0, options={"family": "find_and_buy", "task_id": 7, "strategy": "confirm_before_buying"})
    actions = []
    while True:
        a = expert.act_one(0, obs, info)
        actions.append(a)
        obs, r, term, trunc, info = env.step(a)
        if term or trunc:
            break
    assert info["success"] and actions[-2].startswith("answer[") and actions[-1] == "click[buy now]"
    obs, info = env.reset(seed=0, options={"family": "find_and_buy", "task_id": 7, "strategy": "ask_first"})
    assert expert.act_one(0, obs, info).startswith("ask[")


def test_random_agent_is_near_zero_and_seeded(env):
    scores = []
    for fam in FAMILIES:
        agent = RandomTextAgent(env_id=ENV_ID)
        agent.reset(1, 5)
        scores += [x["success"] for x in run(agent, env, fam, list(split_ids("dev"))[:10], split="dev")]
    assert np.mean(scores) <= 0.05
    a, b = RandomTextAgent(env_id=ENV_ID), RandomTextAgent(env_id=ENV_ID)
    a.reset(1, 3)
    b.reset(1, 3)
    obs, info = env.reset(seed=0, options={"family": "after_sales", "task_id": 9})
    assert [a.act_one(0, obs, info) for _ in range(20)] == [b.act_one(0, obs, info) for _ in range(20)]
    assert all(x.split("[")[0] in {v.split("[")[0] for v in info["valid_actions"]}
               for x in [a.act_one(0, obs, info) for _ in range(20)])


def test_rollout_runner_with_expert_and_random(tmp_path):
    from shopsim.rollout import collect

    for name, cls in (("expert", ShoppingExpert), ("random", RandomTextAgent)):
        trajs = collect(ENV_ID, cls(env_id=ENV_ID), episodes=4, split="dev", num_envs=2,
                        env_kwargs={"catalog_size": SIZE}, progress=False)
        assert len(trajs) == 4 and all(len(t.turns) >= 1 for t in trajs)
        if name == "expert":
            assert all(t.turns[-1].info["success"] for t in trajs)
            assert all("oracle" not in t.turns[0].info for t in trajs)  # privileged info is not stored
    # through a gymnasium vector env (infos batched and unbatched by the runner)
    trajs = collect(ENV_ID, ShoppingExpert(env_id=ENV_ID), episodes=4, split="test", num_envs=2, vector="sync",
                    env_kwargs={"catalog_size": SIZE}, progress=False)
    assert all(t.turns[-1].info["success"] for t in trajs)


@pytest.mark.parametrize("query", ["full", "instruction"])
def test_expert_sft_options_click_by_index_and_copyable_query(query):
    """The SFT-data options: results opened by position on a numbered results page, the search either the goal
    words or the task line up to its price clause; success stays at the expert's level."""
    env = ShoppingEnv(catalog_size=SIZE, numbered_results=True, results_per_page=5)
    expert = ShoppingExpert(env_id=ENV_ID, click_by="index", query=query)
    expert.reset(1, 0)
    ids = list(split_ids("test"))[:20]
    actions = []
    for i, tid in enumerate(ids):
        obs, info = env.reset(seed=i, options={"family": "find_and_buy", "task_id": tid, "split": "test"})
        task_line = obs.splitlines()[0][len("Task: "):]
        expert.begin_episode(0, obs, info)
        first = expert.act_one(0, obs, info)
        if query == "instruction":
            assert first == f"search[{task_line.split(', and price lower than')[0]}]"
        obs, _, term, trunc, info = env.step(first)
        while not (term or trunc):
            a = expert.act_one(0, obs, info)
            actions.append(a)
            obs, _, term, trunc, info = env.step(a)
        actions.append(info["episode_metrics"]["success"])
    success = np.mean([a for a in actions if isinstance(a, float)])
    clicks = [a for a in actions if isinstance(a, str) and a.startswith("click[#")]
    assert success >= 0.9 and clicks and not any(a.startswith("click[B0") for a in actions if isinstance(a, str))
    with pytest.raises(ValueError, match="click_by"):
        ShoppingExpert(env_id=ENV_ID, click_by="title")


@pytest.mark.parametrize("family", ["bundle", "clarify_and_buy"])
def test_expert_instruction_queries_are_copies_of_what_the_agent_was_told(family):
    """query="instruction" in a bundle searches each item's "(k) <request>" clause of the task line in turn, its
    number included, and the whole budget as its price clause; in clarify_and_buy the task line plus what the
    customer named, and the price clause with the budget the customer named. Only the rare title fallback searches
    words the agent was never shown."""
    env = ShoppingEnv(catalog_size=SIZE, numbered_results=True, results_per_page=5, obs_mode="terse")
    expert = ShoppingExpert(env_id=ENV_ID, click_by="index", query="instruction", price_clause=True)
    expert.reset(1, 0)
    copied = searches = successes = 0
    ids = list(split_ids("test"))[:20]
    for i, tid in enumerate(ids):
        obs, info = env.reset(seed=i, options={"family": family, "task_id": tid, "split": "test"})
        seen = obs.lower()
        expert.begin_episode(0, obs, info)
        items = [g for g in info["oracle"]["goals"]] if family == "bundle" else []
        term = trunc = False
        first_search = None
        while not (term or trunc):
            a = expert.act_one(0, obs, info)
            if a.startswith("search["):
                q = a[len("search["):-1].lower()
                searches += 1
                # the price clause is a fixed phrase; its number is the budget the agent was told
                words, ceiling = split_price(q)
                copied += all(w in seen for w in words.replace(",", " ").split()) and (
                    ceiling is None or f"{ceiling:.2f}" in seen)
                first_search = first_search or q
            obs, _, term, trunc, info = env.step(a)
            seen += "\n" + obs.lower()
        successes += info["episode_metrics"]["success"]
        if family == "bundle":
            # the clause with its number, so that the agent finds the next one by number
            assert first_search.split()[:2] in (["(1)", "a"], ["(1)", "an"]) and len(items) >= 2
            words, ceiling = split_price(first_search)
            assert words in seen.split("\n")[0]  # the first item's clause, verbatim
            assert ceiling == info["oracle"]["budget"]  # with the whole budget as its price clause
    assert successes >= 0.9 * len(ids)
    assert copied >= 0.85 * searches


def test_expert_arg_space_writes_the_same_actions_with_a_blank():
    """``arg_space=True`` only inserts a blank after the bracket; the env strips it, so the episodes are the same
    (same pages, same success) and every bracketed argument starts with one blank."""
    outs = {}
    for flag in (False, True):
        env = ShoppingEnv(catalog_size=SIZE, numbered_results=True, results_per_page=5)
        expert = ShoppingExpert(env_id=ENV_ID, click_by="index", query="instruction", arg_space=flag)
        expert.reset(1, 0)
        acts, pages = [], []
        for i, tid in enumerate(list(split_ids("test"))[:8]):
            obs, info = env.reset(seed=i, options={"family": "find_and_buy", "task_id": tid, "split": "test"})
            expert.begin_episode(0, obs, info)
            term = trunc = False
            while not (term or trunc):
                a = expert.act_one(0, obs, info)
                acts.append(a)
                obs, _, term, trunc, info = env.step(a)
                pages.append(obs)
        outs[flag] = acts, pages
    (plain, pages0), (spaced, pages1) = outs[False], outs[True]
    assert pages0 == pages1
    assert [a.replace("[ ", "[") for a in spaced] == plain
    assert all("[ " in a and "[  " not in a for a in spaced if "[" in a)


@pytest.mark.parametrize("family", ["find_and_buy", "clarify_and_buy", "bundle"])
def test_expert_noise_injects_flagged_wrong_clicks_and_recovers(family):
    """DART noise: some result/option clicks are replaced by another result, another option value or a garbled
    click, flagged ``extra["perturbed"]``; the expert recovers and still succeeds; the same seed gives the same
    episodes; after-sales episodes and non-click actions are never perturbed."""
    from shopsim.rollout import collect

    kw = dict(env_id=ENV_ID, click_by="index", query="instruction", arg_space=True)
    run_kw = dict(episodes=12, split="dev", num_envs=3, reset_options={"family": family}, progress=False,
                  env_kwargs={"catalog_size": SIZE, "numbered_results": True, "results_per_page": 5})
    noisy = collect(ENV_ID, ShoppingExpert(**kw, noise=0.3), seed=3, **run_kw)
    again = collect(ENV_ID, ShoppingExpert(**kw, noise=0.3), seed=3, **run_kw)
    clean = collect(ENV_ID, ShoppingExpert(**kw), seed=3, **run_kw)
    assert [[t.action for t in x.turns] for x in noisy] == [[t.action for t in x.turns] for x in again]
    assert not any(t.extra.get("perturbed") for x in clean for t in x.turns)
    perturbed = [(x, k) for x in noisy for k, t in enumerate(x.turns) if t.extra.get("perturbed")]
    assert len(perturbed) >= 3
    assert not any(x.turns[k + 1].extra.get("perturbed") for x, k in perturbed if k + 1 < len(x.turns))
    for x, k in perturbed:
        turn = x.turns[k]
        assert turn.action.startswith("click[")
        # the expert's next own action differs from the wrong one (it goes back, fixes the option or clicks again)
        after = [t for t in x.turns[k + 1:] if not t.extra.get("perturbed")]
        assert after and after[0].action != turn.action
    assert np.mean([x.success for x in noisy]) >= 0.9
    # a wrong click moved the episode off the clean path somewhere
    assert [len(x.turns) for x in noisy] != [len(x.turns) for x in clean]
    sales = collect(ENV_ID, ShoppingExpert(env_id=ENV_ID, order_refs="title", noise=0.5), seed=3,
                    **{**run_kw, "reset_options": {"family": "after_sales"}})
    assert not any(t.extra.get("perturbed") for x in sales for t in x.turns)
    with pytest.raises(ValueError, match="noise"):
        ShoppingExpert(env_id=ENV_ID, noise=1.0)
