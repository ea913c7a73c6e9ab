"""ARC (baselines/arc.py, docs/algorithms/arc.md): (task, strategy) groups and their advantages, the mixed reward,
the strategy injection into reset options (and none at evaluation), the env's style-bias / invalid-kind channels,
and two training iterations on the real Shopping-v0 env with a tiny random LM."""

from __future__ import annotations

import math

import gymnasium
import numpy as np
import pytest
import torch

import baselines
import shopsim.envs  # noqa: F401  (registers the env ids)
from agents.base import ScriptedAgent
from baselines.arc import (
    ARCConfig,
    format_tool_rewards,
    plan_strategies,
    strategy_group_ids,
    strategy_reset_options,
)
from baselines.core.batch import build_batch
from baselines.grpo import grpo_advantages
from shopsim.errors import ConfigError
from shopsim.rollout import plan_episodes
from shopsim.trajectory import Trajectory, Turn

ENV = "shopsim/Shopping-v0"
S3 = ("recommend_directly", "ask_first", "confirm_before_buying")
H = 1 / math.sqrt(2)  # |A| of each member of a two-rollout group with different rewards (unbiased std)


def _traj(task: int, strategy: str | None, reward: float, kinds=(None,), i: int = 0) -> Trajectory:
    """A window-mode trajectory: one turn per entry of `kinds` (the env's info["invalid_kind"]), the episode reward
    on the last turn; group id = the task (as `shopsim.rollout.collect` sets it)."""
    tr = Trajectory(env_id=ENV, task_id=task, group_id=task, strategy=strategy, traj_id=i)
    for k, kind in enumerate(kinds):
        info = {"invalid_kind": kind, "invalid_action": None if kind is None else "bad"}
        tr.append(Turn(observation=f"o{k}", action="a", reward=reward if k == len(kinds) - 1 else 0.0,
                       terminated=k == len(kinds) - 1, info=info, prompt_ids=[1, 2, 3 + k], action_ids=[7, 8],
                       action_logprobs=[-0.5, -0.5]))
    return tr


# two tasks × three strategies × two rollouts; every action valid, so the mixed reward is r_task + 0.2
REWARDS = {(0, "recommend_directly"): (1.0, 0.0), (0, "ask_first"): (1.0, 1.0),
           (0, "confirm_before_buying"): (0.0, 0.0), (1, "recommend_directly"): (0.5, 0.5),
           (1, "ask_first"): (1.0, 0.0), (1, "confirm_before_buying"): (0.75, 0.25)}


def _batch():
    trajs = [_traj(t, s, r) for (t, s), rs in REWARDS.items() for r in rs]
    return build_batch(trajs, pad_id=0)


def _arc(**over):
    return baselines.make("arc", env_id=ENV, **over)


def test_advantages_are_normalised_inside_task_strategy_groups():
    b = _batch()
    adv = _arc().compute_advantages(b, None)
    A = adv.adv[:, -1]  # one row per trajectory; every generated token carries A_i
    # hand: a two-rollout group gives ±1/√2 when its rewards differ, 0 when they are equal
    want = torch.tensor([H, -H, 0, 0, 0, 0,  # task 0: direct (1, 0), ask (1, 1), confirm (0, 0)
                         0, 0, H, -H, H, -H])  # task 1: direct (.5, .5), ask (1, 0), confirm (.75, .25)
    assert torch.allclose(A, want, atol=1e-5)
    assert torch.allclose(adv.adv[:, -2], want, atol=1e-5)
    # GRPO's task-only grouping of the same rewards gives other advantages (e.g. task 0's ask rollouts ≠ 0)
    R = torch.tensor([r for rs in REWARDS.values() for r in rs])
    grpo = grpo_advantages(R, b.group_ids)
    assert not torch.allclose(grpo, want, atol=1e-3)
    assert grpo[2] == pytest.approx(0.5 / math.sqrt(0.3), abs=1e-4)  # task 0: mean .5, std √.3
    assert adv.metrics["groups"] == 6 and adv.metrics["group_size_mean"] == 2
    assert adv.metrics["zero_variance_groups"] == pytest.approx(3 / 6)


def test_strategy_groups_never_merge_across_strategies_or_with_the_free_group():
    g = torch.tensor([0, 0, 0, 0, 1, 1])
    s = torch.tensor([0, 0, 1, 2, 0, 0])  # strategy ids; 2 = the free group (strategy None)
    ids = strategy_group_ids(g, s)
    assert ids.tolist() == [0, 0, 1, 2, 3, 3]


def test_mixed_reward_components_on_a_hand_trajectory():
    # 5 actions: 1 unparseable, 1 parsed but the tool call failed, 3 fine
    tr = _traj(0, "ask_first", 1.0, kinds=(None, "parse", "tool", None, None))
    r_fmt, r_tool = format_tool_rewards(tr)
    assert r_fmt == pytest.approx(4 / 5) and r_tool == pytest.approx(3 / 4)
    assert format_tool_rewards(_traj(0, None, 0.0, kinds=("parse", "parse"))) == (0.0, 0.0)
    # inside one group with equal task rewards, only the format/tool channel separates the two rollouts
    b = build_batch([_traj(0, "ask_first", 1.0, kinds=(None, None)), _traj(0, "ask_first", 1.0, kinds=(None, "parse"))],
                    pad_id=0)
    adv = _arc().compute_advantages(b, None)
    assert adv.metrics["r_format"] == pytest.approx(0.75) and adv.metrics["r_task"] == pytest.approx(1.0)
    # r = 1 + .1·1 + .1·1 = 1.2 vs 1 + .1·.5 + .1·1 = 1.15
    assert adv.metrics["reward_mixed"] == pytest.approx((1.2 + 1.15) / 2)
    assert adv.adv[0, -1] == pytest.approx(H, abs=1e-4) and adv.adv[-1, -1] == pytest.approx(-H, abs=1e-4)
    off = _arc(w_fmt=0.0, w_tool=0.0).compute_advantages(b, None)
    assert torch.all(off.adv == 0)


def test_drop_zero_variance_groups_leave_the_loss():
    b = _batch()
    adv = _arc(drop_zero_variance=True).compute_advantages(b, None)
    kept = adv.token_mask.any(1)
    assert kept.tolist() == [True, True, False, False, False, False, False, False, True, True, True, True]
    assert _arc().compute_advantages(b, None).token_mask is None


def test_strategy_injection_plan():
    plan = plan_strategies(S3, 2, 0, True)
    assert plan == [[*S3, None], [*S3, None]]
    specs = plan_episodes(tasks=[5, 9], seeds=[11, 12], group_size=3 * 4, split="train",
                          reset_options=strategy_reset_options(plan, 3, {"family": "clarify_and_buy"}))
    assert len(specs) == 24
    for sp in specs:
        r = sp.index - sp.group_id * 12
        want = plan[sp.group_id][r // 3]
        assert sp.options.get("strategy") == want and ("strategy" in sp.options) == (want is not None)
        assert sp.options["family"] == "clarify_and_buy" and sp.seed == 11 + sp.group_id
    sub = plan_strategies(S3, 50, 2, False, np.random.default_rng(0))
    assert all(len(p) == 2 and p == sorted(p, key=S3.index) for p in sub)
    assert {tuple(p) for p in sub} == {(S3[0], S3[1]), (S3[0], S3[2]), (S3[1], S3[2])}


class _Finisher(ScriptedAgent):
    """Records the strategy and first observation of every episode and ends it at once."""

    name = "finisher"

    def __init__(self):
        self.seen = []

    def begin_episode(self, slot, observation, info):
        self.seen.append((info.get("strategy"), observation))

    def act_one(self, slot, observation, info):
        return "finish"


def test_training_rollouts_carry_their_strategy_and_evaluation_none():
    algo = _arc(group_size=2, tasks_per_iter=2, eval_episodes=4, num_envs=2, env_kwargs={"max_turns": 2})
    agent = _Finisher()
    trajs, m = algo.collect_batch(ENV, agent, 0, np.random.default_rng(0))
    assert len(trajs) == 12 and m["rollouts_per_task"] == 6
    for g in range(2):
        chunk = trajs[g * 6:(g + 1) * 6]
        assert [t.strategy for t in chunk] == [s for s in S3 for _ in range(2)]
        assert len({(t.task_id, t.seed) for t in chunk}) == 1  # same task, same reset seed
    assert all(s in S3 and "Strategy:" in obs for s, obs in agent.seen)
    assert set(k for k in m if k.startswith("strategy_success/")) == {f"strategy_success/{s}" for s in S3}
    agent.seen.clear()
    ev = algo.evaluate(ENV, agent, seed=0)
    assert len(agent.seen) == 4 and all(s is None and "Strategy:" not in obs for s, obs in agent.seen)
    assert ev["dev_asked"] == 0.0 and "dev_turns_before_first_answer" in ev


def test_config_rejects_bad_strategies():
    with pytest.raises(ConfigError, match="repeats"):
        ARCConfig(strategies=("ask_first", "ask_first"))
    with pytest.raises(ConfigError, match="strategies_per_task"):
        ARCConfig(strategies_per_task=4)
    with pytest.raises(ConfigError, match="reset_options"):
        ARCConfig(reset_options={"strategy": "ask_first"})
    with pytest.raises(ConfigError, match="base"):
        ARCConfig(base="dapo")
    assert ARCConfig(strategies="ask_first,recommend_directly").strategies == ("ask_first", "recommend_directly")


def _play(env, actions):
    out = []
    for a in actions:
        out.append(env.step(a))
        if out[-1][2] or out[-1][3]:
            break
    return out


def test_env_style_bias_and_invalid_kind():
    steps = ["hello there", "click[nonexistent]", "search[shirt]", "click[#1]", "click[buy now]"]
    env = gymnasium.make(ENV, style_bias=0.3, numbered_results=True, family="find_and_buy").unwrapped
    env.reset(seed=0, options={"task_id": 0})
    out = _play(env, steps)
    assert [o[4]["invalid_kind"] for o in out[:3]] == ["parse", "tool", None]
    last = out[-1]
    assert last[2] and last[4]["style_bonus"] == 0.3
    assert last[1] == pytest.approx(last[4]["score"] + 0.3)  # the bonus moves the reward, not the score
    env.reset(seed=0, options={"task_id": 0})
    out = _play(env, ["ask[which color?]", *steps[2:]])
    assert out[-1][4]["style_bonus"] == 0.0 and out[-1][1] == pytest.approx(out[-1][4]["score"])
    plain = gymnasium.make(ENV, numbered_results=True, family="find_and_buy").unwrapped
    plain.reset(seed=0, options={"task_id": 0})
    assert _play(plain, steps[2:])[-1][4]["style_bonus"] == 0.0
    with pytest.raises(ConfigError, match="style_bias"):
        gymnasium.make(ENV, style_bias=float("nan"))


@pytest.mark.parametrize("base", ["grpo", "ppo"])
def test_arc_trains_two_iterations_on_shopping(tmp_path, base):
    from agents.lm.agent import LMAgent
    from agents.lm.model import build_model
    from agents.lm.tokenizer import load_tokenizer

    torch.set_num_threads(1)
    tok = load_tokenizer()
    agent = LMAgent(env_id=ENV, model=build_model(tok, size="tiny", seed=0), tokenizer=tok, context_mode="window",
                    max_new_tokens=6)
    algo = _arc(group_size=1, tasks_per_iter=1, eval_episodes=2, num_envs=3, max_new_tokens=6, lr=1e-4, base=base,
                env_kwargs={"max_turns": 2}, task_families=("find_and_buy", "clarify_and_buy"), checkpoint_every=0)
    res = algo.train(ENV, iterations=2, seed=0, out_dir=tmp_path, agent=agent, progress=False)
    assert len(res.history) == 2
    last = res.history[-1]
    assert math.isfinite(last["loss"]) and last["rollouts"] == 3
    assert last["entropy"] > 0 and math.isfinite(last["entropy"])
    assert 0 <= last["r_format"] <= 1 and 0 <= last["r_tool"] <= 1
    if base == "grpo":
        assert last["groups"] == 3 and "loss_value" not in last
    else:  # the critic is trained on the GAE returns
        assert math.isfinite(last["loss_value"]) and "explained_variance" in last
    assert 0 <= last["train_asked"] <= 1 and 0 <= last["train_turns_before_first_answer"] <= 2
    assert {f"strategy_success/{s}" for s in S3} <= set(last)
    assert "dev_success" in last and "dev_asked" in last
    import agents

    assert agents.load_checkpoint(tmp_path / "checkpoint").model is not None


def test_ppo_base_gae_on_the_mixed_reward_whitened_inside_task_strategy_groups():
    """base='ppo' with a zero critic, γ = λ = 1: every token's GAE advantage is the trajectory's mixed reward
    r = r_task + 0.2; whitening a two-rollout group's four tokens (a, a, b, b) gives ±√3/2, a tie gives 0; the
    critic targets are r. A critic is built only for this base."""
    from types import SimpleNamespace

    from agents.lm.model import build_model
    from agents.lm.tokenizer import load_tokenizer
    from baselines.core.config import Ctx

    b = _batch()
    algo = _arc(base="ppo")
    zeros = torch.zeros_like(b.old_logp)
    adv = algo.compute_advantages(b, Ctx(old_logp=b.old_logp, behav_logp=b.old_logp, values=zeros))
    q = math.sqrt(3) / 2
    want = torch.tensor([q, -q, 0, 0, 0, 0, 0, 0, q, -q, q, -q])
    assert torch.allclose(adv.adv[:, -1], want, atol=1e-4) and torch.allclose(adv.adv[:, -2], want, atol=1e-4)
    r = torch.tensor([x for rs in REWARDS.values() for x in rs]) + 0.2
    assert torch.allclose(adv.returns[:, -1], r) and torch.allclose(adv.returns[:, -2], r)
    # a critic value moves the advantage before whitening: V = r on one rollout zeroes its raw advantage
    values = zeros.clone()
    values[0, -2:] = r[0]
    adv2 = algo.compute_advantages(b, Ctx(old_logp=b.old_logp, behav_logp=b.old_logp, values=values))
    assert not torch.allclose(adv2.adv[0], adv.adv[0])
    tok = load_tokenizer()
    model = build_model(tok, size="tiny", seed=0)
    algo.setup(SimpleNamespace(model=model, tokenizer=tok))
    assert algo.critic is not None
    grpo_base = _arc()
    grpo_base.setup(SimpleNamespace(model=build_model(tok, size="tiny", seed=0), tokenizer=tok))
    assert grpo_base.critic is None
