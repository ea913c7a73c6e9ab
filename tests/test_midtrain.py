"""Mid-training (baselines.midtrain, card §14): adherence rules, the selection rule, the strategy mix, the
strategy-labelled dataset, resumability at the stage boundaries and a two-iteration run on Shopping-v0."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

import baselines
from baselines import midtrain as M
from shopsim.errors import ConfigError

ENV = "shopsim/Shopping-v0"
EXPERT_ENV = {"numbered_results": True, "obs_mode": "terse", "results_per_page": 5}

TASK = "Task: i need a red wool scarf, and price lower than 30.00 dollars\nPage: search (use search[keywords])"
CLARIFY = ("Task: i want a backpack, and price lower than 50.00 dollars. I have more preferences: a must-have "
           "feature; ask me about them.\nPage: search (use search[keywords])")
RESULTS = "Results page 1/5 (50 hits):\n#1 Red Wool Scarf $12.00"
PRODUCT = "Product: Red Wool Scarf\nPrice: $12.00"


def traj(*steps, first=TASK, success=True, score=None):
    """A hand-made trajectory: `steps` are actions, or (action, observation) pairs (observation = what the agent saw
    before acting); the first observation defaults to a find_and_buy task page."""
    turns = []
    for k, s in enumerate(steps):
        action, obs = s if isinstance(s, tuple) else (s, first if k == 0 else RESULTS)
        turns.append(SimpleNamespace(action=action, observation=obs))
    return SimpleNamespace(turns=turns, success=success, score=1.0 if score is None else score,
                           num_turns=len(turns))


BUY = ["click[ #1]", "click[ red]", "click[ buy now]"]
CASES = {
    # strategy: (adheres, does not adhere)
    "recommend_directly": (traj("search[ red wool scarf]", *BUY),
                           traj("ask[ Any colour?]", "search[ red wool scarf]", *BUY)),
    "ask_first": (traj("ask[ Anything else before I search?]", "search[ red wool scarf]", *BUY),
                  traj("search[ red wool scarf]", "ask[ Anything else?]", *BUY)),
    "confirm_before_buying": (traj("search[ scarf]", "click[ #1]", "answer[ I will buy the Red Scarf.]", "buy"),
                              traj("answer[ Hello]", "search[ scarf]", "click[ #1]", "buy")),
    "broad_then_filter": (traj("search[ scarf]", "search[ red wool scarf]", *BUY),
                          traj("search[ red wool scarf]", "search[ scarf]", *BUY)),
    "all_in_one_query": (traj("search[ red wool scarf]", *BUY),
                         traj("search[ scarf]", "search[ red wool scarf]", *BUY)),
    "compare_two": (traj("search[ scarf]", "click[ #2]", ("click[ < prev]", PRODUCT), "click[ #1]", "click[ buy now]"),
                    # going back from a results page (previous results page) is no comparison
                    traj("search[ scarf]", "click[ next >]", ("click[ < prev]", RESULTS), "click[ #1]",
                         "click[ buy now]")),
}


@pytest.mark.parametrize("strategy", M.SUPPORTED)
def test_adherence_rule_per_strategy(strategy):
    good, bad = CASES[strategy]
    assert M.adheres(strategy, good)
    assert not M.adheres(strategy, bad)


def test_adherence_details():
    # recommend_directly allows questions when the task says the customer has more preferences
    assert M.adheres("recommend_directly", traj("ask[ Which feature?]", "search[ backpack]", *BUY, first=CLARIFY))
    # confirm_before_buying and compare_two need a purchase
    assert not M.adheres("confirm_before_buying", traj("search[ scarf]", "answer[ I will buy it]"))
    assert not M.adheres("compare_two", traj("search[ scarf]", "click[ #2]", ("click[ < prev]", PRODUCT)))
    # argument blanks and case do not matter; JSON / garbage actions do not crash the rules
    assert M.parse_action("click[ Buy Now ]") == ("click", "buy now")
    assert not M.adheres("ask_first", traj('{"name": "search"}', "xx"))
    with pytest.raises(ConfigError, match="no adherence rule"):
        M.adheres("check_price", traj("search[ x]"))


def test_selection_keeps_best_correct_adherent():
    s = "ask_first"
    failed_adherent = traj("ask[ ?]", "search[ x]", "click[ #1]", success=False, score=0.5)
    correct_not_adherent = traj("search[ x]", "click[ #1]", "buy")
    long_ok = traj("ask[ ?]", "search[ x]", "click[ #2]", "click[ < prev]", "click[ #1]", "buy")
    short_ok = traj("ask[ ?]", "search[ x]", "click[ #1]", "buy")
    short_ok_later = traj("ask[ ?]", "search[ y]", "click[ #1]", "buy")
    cands = [failed_adherent, correct_not_adherent, long_ok, short_ok, short_ok_later]
    assert M.select_best(cands, s, "diverse") is short_ok  # fewest turns, then the earliest sample
    assert M.select_best([failed_adherent, correct_not_adherent], s, "diverse") is None
    # STaR: correct, any strategy (the non-adherent one is the shortest correct)
    assert M.select_best(cands, s, "star") is correct_not_adherent
    # diverse but incorrect: adherent and failed
    assert M.select_best(cands, s, "incorrect") is failed_adherent


def test_strategy_mix_counts_traces_with_two_marked_strategies():
    both = traj("ask[ ?]", "search[ x]", "click[ #1]", "answer[ buying x]", "buy")  # ask_first + confirm
    one = traj("ask[ ?]", "search[ x]", "click[ #1]", "buy")
    plain = traj("search[ x]", "click[ #1]", "buy")  # recommend_directly / all_in_one_query are not marked
    m = M.strategy_mix([both, one, plain, plain])
    assert m["strategy_mix"] == pytest.approx(0.25)
    assert m["adheres/ask_first"] == pytest.approx(0.5)
    assert m["adheres/confirm_before_buying"] == pytest.approx(0.25)
    assert M.strategy_profile(both) == ("ask_first", "confirm_before_buying")


def test_task_plan_and_config_validation():
    strategies = ("ask_first", "compare_two", "broad_then_filter")
    assert M.task_plan([7, 8], strategies, None) == [(7, s) for s in strategies] + [(8, s) for s in strategies]
    one = M.task_plan([1, 2, 3, 4, 5, 6], strategies, 1)  # many tasks x 1 strategy: every strategy twice
    assert [t for t, _ in one] == [1, 2, 3, 4, 5, 6]
    assert sorted(s for _, s in one) == sorted(strategies * 2)
    cfg = M.MidTrainConfig()
    assert (cfg.group_size, cfg.kl_coef, cfg.candidates, cfg.gen_temperature, cfg.sft_lr, cfg.sft_epochs) == \
        (16, 0.0, 4, 1.0, 1e-4, 2.0)
    assert cfg.exemplar and cfg.strategy_prompt and cfg.data == "diverse" and cfg.strategies == M.SUPPORTED
    with pytest.raises(ConfigError, match="subset"):
        M.MidTrainConfig(strategies=("check_price_before_options",))
    with pytest.raises(ConfigError, match="strategies_per_task"):
        M.MidTrainConfig(strategies=("ask_first",), strategies_per_task=2)
    assert M.MidTrainConfig(strategies="ask_first,compare_two").strategies == ("ask_first", "compare_two")


def test_exemplar_wrapper_and_strategy_stripping():
    seen = {}

    class Rec:
        name = "rec"

        def begin_episode(self, slot, observation, info):
            seen[slot] = observation

    w = M.ExemplarAgent(Rec(), "EXAMPLE\n")
    w.begin_episode(0, TASK, {})
    assert seen[0] == "EXAMPLE\n" + TASK
    t = traj(("search[ x]", TASK.replace("\nPage", "\nStrategy: Ask first.\nPage")))
    t.turns[0].info = {}
    stripped = M.strip_strategy(t)
    assert "Strategy:" not in stripped.turns[0].observation and "Strategy:" in t.turns[0].observation


@pytest.mark.parametrize("strategy", M.SUPPORTED)
def test_expert_follows_each_strategy(strategy):
    import agents
    from shopsim.rollout import collect

    expert = agents.make("expert", ENV, **M._expert_kwargs(EXPERT_ENV))
    trajs = collect(ENV, expert, episodes=4, seed=5, split="train", progress=False, env_kwargs=EXPERT_ENV,
                    reset_options={"strategy": strategy, "family": "find_and_buy"})
    assert all(t.success for t in trajs)
    assert all(M.adheres(strategy, t) for t in trajs)


def test_generate_writes_labelled_dataset_and_is_not_redone(tmp_path):
    """The scripted expert stands in for the LM (it follows strategies), so every pair keeps a candidate."""
    import agents
    from shopsim.datasets import read_episodes, read_trajectories

    cfg = M.MidTrainConfig(strategies=("ask_first", "compare_two"), num_tasks=2, candidates=2, num_envs=2,
                           task_families=("find_and_buy",), exemplar=True)
    expert = agents.make("expert", ENV, **M._expert_kwargs(EXPERT_ENV))
    stats = M.generate_dataset(ENV, expert, cfg, tmp_path, seed=0, env_kwargs=EXPERT_ENV)
    assert stats["gen_candidates"] == stats["pretrain_rollouts"] == 8 and stats["gen_kept"] == 4
    assert stats["gen_kept_per_strategy"] == {"ask_first": 2, "compare_two": 2}
    assert set(stats["exemplars"]) == {"ask_first", "compare_two"}
    eps = read_episodes(tmp_path / "data.parquet")
    assert sorted(eps["strategy"]) == ["ask_first", "ask_first", "compare_two", "compare_two"]
    for t in read_trajectories(tmp_path / "data.parquet"):
        assert t.success and M.adheres(t.strategy, t)
    # the recorded observations are the env's (the exemplar went to the agent only)
    assert all(t.turns[0].observation.startswith("Task: ") for t in read_trajectories(tmp_path / "data.parquet"))
    mtime = (tmp_path / "data.parquet").stat().st_mtime_ns

    class Boom:
        def __getattr__(self, name):
            raise AssertionError("stage 1 ran again")

    again = M.generate_dataset(ENV, Boom(), cfg, tmp_path, seed=0, env_kwargs=EXPERT_ENV)
    assert again == stats and (tmp_path / "data.parquet").stat().st_mtime_ns == mtime


def _tiny_agent():
    from agents.lm.agent import LMAgent
    from agents.lm.model import build_model
    from agents.lm.tokenizer import load_tokenizer

    tok = load_tokenizer()
    return LMAgent(env_id=ENV, model=build_model(tok, size="tiny", seed=0), tokenizer=tok, context_mode="concat",
                   max_new_tokens=6)


SMALL = dict(group_size=2, tasks_per_iter=1, eval_episodes=2, num_envs=2, max_new_tokens=6, lr=1e-4,
             env_kwargs={"max_turns": 2}, task_families=("find_and_buy", "clarify_and_buy"), checkpoint_every=0,
             num_tasks=2, candidates=1, exemplar=False)


def test_two_iterations_all_stages_and_resume(tmp_path, monkeypatch):
    """All three stages with a tiny random LM: it never succeeds, so the "incorrect" control (adherent failed
    samples, recommend_directly) is the data setting that keeps examples and exercises the SFT stage."""
    import agents
    from shopsim.datasets import read_episodes

    algo = baselines.make("midtrain", env_id=ENV, data="incorrect", strategies=("recommend_directly",), **SMALL)
    agent = _tiny_agent()
    before = {k: v.clone() for k, v in agent.model.state_dict().items()}
    res = algo.train(ENV, iterations=2, seed=0, out_dir=tmp_path, agent=agent, progress=False)
    import json

    pre = json.loads((tmp_path / "pretrain.json").read_text())
    assert pre["gen_candidates"] == 2 and pre["examples"] == pre["gen_kept"] >= 1 and pre["sft_steps"] >= 1
    assert list(read_episodes(tmp_path / "midtrain" / "data.parquet")["strategy"]) == ["recommend_directly"] * \
        pre["gen_kept"]
    assert (tmp_path / "midtrain" / "sft" / "checkpoint" / "config.json").is_file()
    sft = agents.load_checkpoint(tmp_path / "midtrain" / "sft" / "checkpoint").model.state_dict()
    # the RL stage started from the mid-trained weights, not the initial ones
    assert any(not torch.equal(before[k], sft[k]) for k in before if before[k].is_floating_point())
    assert len(res.history) == 2
    last = res.history[-1]
    assert np.isfinite(last["loss"]) and last["gen_tokens"] > 0
    assert 0.0 <= last["dev_strategy_mix"] <= 1.0 and "dev_adheres/compare_two" in last
    assert agents.load_checkpoint(tmp_path / "checkpoint").model is not None

    # a fresh start over finished stage outputs loads the mid-trained weights and regenerates nothing
    def boom(*a, **k):
        raise AssertionError("a finished stage ran again")

    monkeypatch.setattr("shopsim.rollout.collect", boom)
    monkeypatch.setattr("agents.lm.sft.train_sft", boom)
    algo2 = baselines.make("midtrain", env_id=ENV, data="incorrect", strategies=("recommend_directly",), **SMALL)
    algo2.run = SimpleNamespace(seed=0)
    agent2 = _tiny_agent()
    algo2.setup(agent2)
    algo2._env_kwargs = {"max_turns": 2}
    out = algo2.before_training(ENV, agent2, np.random.default_rng(0), tmp_path)
    assert out["examples"] == pre["examples"]
    assert all(torch.equal(agent2.model.state_dict()[k], sft[k]) for k in sft)


def test_plain_rl_control_skips_mid_training(tmp_path):
    algo = baselines.make("midtrain", env_id=ENV, data="none", **SMALL)
    res = algo.train(ENV, iterations=1, seed=0, out_dir=tmp_path, agent=_tiny_agent(), progress=False)
    assert not (tmp_path / "midtrain").exists() and len(res.history) == 1


def test_registered():
    assert "midtrain" in baselines.available(ENV)


def test_unprompted_generation_labels_by_adherence_and_refuses_other_settings(tmp_path):
    """strategy_prompt=False: no strategy line; the expert then never asks first, so only the strategy its default
    behaviour satisfies (all_in_one_query) keeps candidates, labelled by the adherence check."""
    import agents
    from shopsim.datasets import read_trajectories

    cfg = M.MidTrainConfig(strategies=("ask_first", "all_in_one_query"), num_tasks=2, candidates=1, num_envs=2,
                           task_families=("find_and_buy",), strategy_prompt=False)
    expert = agents.make("expert", ENV, **M._expert_kwargs(EXPERT_ENV))
    stats = M.generate_dataset(ENV, expert, cfg, tmp_path, seed=0, env_kwargs=EXPERT_ENV)
    assert stats["gen_kept_per_strategy"] == {"ask_first": 0, "all_in_one_query": 2} and not stats["exemplars"]
    kept = read_trajectories(tmp_path / "data.parquet")
    assert [t.strategy for t in kept] == ["all_in_one_query"] * 2
    assert not any("Strategy:" in str(turn.observation) for t in kept for turn in t.turns)
    # a finished stage made with other options is not silently reused
    other = M.MidTrainConfig(strategies=("ask_first", "all_in_one_query"), num_tasks=2, candidates=2,
                             task_families=("find_and_buy",), strategy_prompt=False)
    with pytest.raises(ConfigError, match="another output folder"):
        M.generate_dataset(ENV, expert, other, tmp_path, seed=0, env_kwargs=EXPERT_ENV)
