"""The shared LM training loop on a toy text env with a tiny GPT-2 (fast): every algorithm runs two iterations,
same seed -> same loss curve, resume continues exactly, metrics/TensorBoard/checkpoint are written."""

import csv

import pytest
import torch

import baselines
from tests.fixtures.toy_lm import ToyLMAgent, env_fns

ALGOS = ["reinforce", "ppo", "grpo", "dapo", "gigpo", "vapo", "mpo"]
SMALL = dict(group_size=2, tasks_per_iter=2, eval_episodes=2, num_envs=2, lr=1e-3, critic_lr=1e-3)


def _train(name, out, iterations=2, seed=0, mode="concat", **kw):
    extra = {"value_pretrain_steps": 2, "value_pretrain_batches": 1} if name == "vapo" else {}
    if name == "dapo":
        extra["max_gen_batches"] = 2
    algo = baselines.make(name, env_id="shopsim/Shopping-v0", **{**SMALL, **extra, **kw})
    return algo.train("toy", iterations=iterations, seed=seed, out_dir=out, agent=ToyLMAgent(context_mode=mode),
                      env_fns=env_fns(2), progress=False)


@pytest.mark.parametrize("name", ALGOS)
def test_every_algorithm_runs_two_iterations(name, tmp_path):
    mode = "window" if name in ("grpo", "mpo") else "concat"
    before = [p.detach().clone() for p in ToyLMAgent().model.parameters()]
    res = _train(name, tmp_path, mode=mode)
    assert len(res.history) == 2
    last = res.history[-1]
    assert all(torch.isfinite(torch.tensor(float(last[k]))) for k in ("loss", "grad_norm"))
    assert "dev_success" in last
    after = list(res.agent.model.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=False)), "the policy did not change"
    rows = list(csv.DictReader(open(tmp_path / "metrics.csv")))
    assert len(rows) == 2 and rows[1]["iteration"] == "2"
    assert (tmp_path / "checkpoint" / "config.json").is_file()
    assert any((tmp_path / "tb").iterdir())
    if name in ("ppo", "vapo", "mpo"):
        assert "loss_value" in last and (tmp_path / "checkpoint" / "critic.pt").is_file()
    if name == "mpo":
        assert 0.0 <= last["between_turn_value_var_share"] <= 1.0
    if name == "gigpo":
        assert "anchor_singleton_share" in last


@pytest.mark.parametrize("name", ["grpo", "mpo"])
def test_same_seed_same_loss_curve(name, tmp_path):
    a = _train(name, tmp_path / "a", iterations=2, seed=3)
    b = _train(name, tmp_path / "b", iterations=2, seed=3)
    c = _train(name, tmp_path / "c", iterations=2, seed=4)
    key = lambda h: [(r["loss"], r["train_return"], r["gen_tokens"]) for r in h]  # noqa: E731
    assert key(a.history) == key(b.history)
    assert key(a.history) != key(c.history)


@pytest.mark.parametrize("name,kw", [("ppo", {}), ("reinforce", {"baseline": "ema"})])
def test_resume_continues_exactly(name, kw, tmp_path):
    full = _train(name, tmp_path / "full", iterations=3, seed=1, **kw)
    _train(name, tmp_path / "part", iterations=1, seed=1, **kw)
    resumed = _train(name, tmp_path / "part", iterations=3, seed=1, **kw)
    assert [r["loss"] for r in resumed.history] == pytest.approx([r["loss"] for r in full.history], rel=1e-6)


def test_unknown_option_is_a_config_error():
    from shopsim.errors import ConfigError

    with pytest.raises(ConfigError, match="valid options"):
        baselines.make("mpo", env_id="shopsim/Shopping-v0", lam=0.3)


def test_micro_batching_does_not_change_the_update(tmp_path):
    """Step-wide normalisers: the same step in 1-row micro-batches gives the same losses (float tolerance)."""
    a = _train("grpo", tmp_path / "a", iterations=2, seed=5, loss_agg="seq-mean-token-mean")
    b = _train("grpo", tmp_path / "b", iterations=2, seed=5, loss_agg="seq-mean-token-mean", micro_batch_rows=1)
    assert [r["loss"] for r in b.history] == pytest.approx([r["loss"] for r in a.history], rel=1e-4, abs=1e-6)
    assert [r["grad_norm"] for r in b.history] == pytest.approx([r["grad_norm"] for r in a.history], rel=1e-3)


@pytest.mark.parametrize("name", ALGOS)
def test_one_update_moves_logprobs_with_the_advantage_sign(name):
    from baselines.core.batch import build_batch
    from baselines.core.trainer import forward_policy
    from shopsim.rollout import collect

    agent = ToyLMAgent()
    extra = {"value_pretrain_steps": 0} if name == "vapo" else {}
    algo = baselines.make(name, env_id="shopsim/Shopping-v0", group_size=4, lr=1e-2, critic_lr=1e-2, minibatches=1,
                          update_epochs=1, **extra)
    algo.setup(agent)
    trajs = collect("toy", agent, seeds=[1, 2, 3, 4], group_size=4, env_fns=env_fns(4), progress=False, num_envs=4)
    b = build_batch(trajs)
    ctx = algo.prepare(b)
    adv = algo.compute_advantages(b, ctx).adv
    algo.update(b)
    with torch.no_grad():
        after, _, _ = forward_policy(agent.model, b.input_ids, b.attention_mask)
    d = (after - ctx.old_logp) * b.gen_mask
    pos, neg = (adv > 0) & b.gen_mask, (adv < 0) & b.gen_mask
    assert pos.any() and neg.any()
    assert d[pos].mean() > 0 > d[neg].mean()


@pytest.mark.slow
@pytest.mark.parametrize("name", ALGOS)
def test_learning_sanity_on_toy_task(name, tmp_path):
    """Every algorithm learns the toy task (put token 3 in the last action) from ~28% to near 100% in 15 iterations.
    The fast counterpart is test_one_update_moves_logprobs_with_the_advantage_sign."""
    import numpy as np

    kw = dict(group_size=8, tasks_per_iter=4, eval_episodes=32, eval_every=0, eval_greedy=False, num_envs=4,
              lr=1e-2, critic_lr=1e-2, checkpoint_every=0, update_epochs=2)
    if name in ("ppo", "mpo", "reinforce"):
        kw.update(group_size=1, tasks_per_iter=32)
    if name == "vapo":
        kw.update(value_pretrain_steps=5)
    if name == "dapo":
        kw.update(max_gen_batches=2)
    res = baselines.make(name, env_id="shopsim/Shopping-v0", **kw).train(
        "toy", iterations=15, seed=0, out_dir=tmp_path, agent=ToyLMAgent(), env_fns=env_fns(4), progress=False)
    s = [r["train_success"] for r in res.history]
    assert np.mean(s[:3]) < 0.5 and np.mean(s[-3:]) > 0.8
    assert res.history[-1]["dev_success"] > 0.8


def test_forward_policy_on_positions_matches_the_full_forward():
    """The output layer on the generated tokens only gives the same log-probs and entropies there, zeros elsewhere."""
    from baselines.core.batch import build_batch
    from baselines.core.trainer import forward_policy
    from shopsim.rollout import collect

    agent = ToyLMAgent()
    trajs = collect("toy", agent, seeds=[1, 2], group_size=2, env_fns=env_fns(2), progress=False, num_envs=2)
    b = build_batch(trajs)
    with torch.no_grad():
        full, ent_full, hid_full = forward_policy(agent.model, b.input_ids, b.attention_mask, temperature=0.7,
                                                  need_entropy=True, need_hidden=True)
        part, ent, hid = forward_policy(agent.model, b.input_ids, b.attention_mask, temperature=0.7,
                                        need_entropy=True, need_hidden=True, positions=b.gen_mask)
    g = b.gen_mask.bool()
    assert g.any() and (~g).any()
    torch.testing.assert_close(part[g], full[g], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent[g], ent_full[g], atol=1e-5, rtol=1e-5)
    assert (part[~g] == 0).all() and (ent[~g] == 0).all()
    torch.testing.assert_close(hid, hid_full)


@pytest.mark.parametrize("eval_seed,expected", [(None, 10_003), (77, 77)])
def test_eval_seed_sets_the_evaluation_episodes(eval_seed, expected, tmp_path, monkeypatch):
    """eval_seed=None: 10_000 + the training seed; a fixed value gives every run the same evaluation episodes."""
    from baselines.core.trainer import LMAlgorithm

    seen = []
    real = LMAlgorithm.evaluate

    def spy(self, env_id, agent, *, seed, **kw):
        seen.append(seed)
        return real(self, env_id, agent, seed=seed, **kw)

    monkeypatch.setattr(LMAlgorithm, "evaluate", spy)
    res = _train("grpo", tmp_path, iterations=1, seed=3, eval_seed=eval_seed)
    assert seen == [expected] and "dev_success" in res.history[-1]


@pytest.mark.parametrize("mode", ["concat", "window"])
def test_length_bucketing_does_not_change_the_update(mode, tmp_path):
    """Micro-batches cut by token budget and trimmed to their own longest row give the same step as one padded
    micro-batch of every row."""
    kw = dict(iterations=2, seed=7, mode=mode, loss_agg="seq-mean-token-mean", group_size=3)
    a = _train("grpo", tmp_path / "a", micro_batch_tokens=0, **kw)
    b = _train("grpo", tmp_path / "b", micro_batch_tokens=24, **kw)
    assert [r["loss"] for r in b.history] == pytest.approx([r["loss"] for r in a.history], rel=1e-4, abs=1e-6)
    assert [r["grad_norm"] for r in b.history] == pytest.approx([r["grad_norm"] for r in a.history], rel=1e-3)


def test_micro_batches_respect_the_token_budget_and_cover_every_row():
    from baselines.core.batch import build_batch
    from shopsim.rollout import collect

    agent = ToyLMAgent(context_mode="window")
    algo = baselines.make("grpo", env_id="shopsim/Shopping-v0", micro_batch_tokens=30)
    trajs = collect("toy", agent, seeds=[1, 2, 3, 4], group_size=2, env_fns=env_fns(4), progress=False, num_envs=4)
    b = build_batch(trajs)
    rows = torch.arange(b.num_rows)
    chunks = algo.micro_batches(b, rows)
    assert sorted(torch.cat(chunks).tolist()) == rows.tolist()
    lengths = b.attention_mask.sum(1)
    assert len(chunks) > 1
    for ch in chunks:
        assert len(ch) == 1 or int(lengths[ch].max()) * len(ch) <= 30


def test_skipping_zero_advantage_rows_does_not_change_the_update():
    """GRPO groups whose rollouts all got the same reward have zero advantage everywhere: leaving their rows out of
    the forward/backward passes gives the same parameters, also over several optimizer steps (momentum)."""
    import copy

    from baselines.core.batch import build_batch
    from shopsim.rollout import collect

    agent = ToyLMAgent()
    trajs = collect("toy", agent, seeds=[1, 2, 3], group_size=4, env_fns=env_fns(4), progress=False, num_envs=4)
    for t in trajs:  # the second group: every rollout gets the same reward
        if t.group_id == trajs[4].group_id:
            for turn in t.turns:
                turn.reward = 0.5
    batch = build_batch(trajs)
    out = {}
    for skip in (True, False):
        a = copy.deepcopy(agent)
        algo = baselines.make("grpo", env_id="shopsim/Shopping-v0", group_size=4, lr=1e-2, minibatches=2,
                              update_epochs=2, skip_zero_advantage_rows=skip)
        algo.setup(a)
        m = algo.update(batch, generator=torch.Generator().manual_seed(0))
        out[skip] = (m, [p.detach().clone() for p in a.model.parameters()])
    assert out[True][0]["rows_skipped_zero_adv"] > 0 and "rows_skipped_zero_adv" not in out[False][0]
    # the same loss and gradient norm: the skipped rows still count in the step's normalisers
    assert out[True][0]["loss_policy"] == pytest.approx(out[False][0]["loss_policy"], abs=1e-6)
    assert out[True][0]["grad_norm"] == pytest.approx(out[False][0]["grad_norm"], rel=1e-4)
    for p, q in zip(out[True][1], out[False][1], strict=True):  # float reduction order only (Adam, lr 1e-2)
        assert torch.allclose(p, q, atol=1e-4)
    moved = [not torch.equal(p, q) for p, q in zip(out[True][1], agent.model.parameters(), strict=True)]
    assert any(moved)


def test_minibatches_keep_rollout_groups_whole():
    from baselines.core.batch import build_batch
    from shopsim.rollout import collect

    agent = ToyLMAgent()
    trajs = collect("toy", agent, seeds=[1, 2, 3, 4], group_size=4, env_fns=env_fns(4), progress=False, num_envs=4)
    for i, t in enumerate(trajs):  # distinct rewards inside every group: every row has a nonzero advantage
        for turn in t.turns:
            turn.reward = float(i % 4) / 4
    batch = build_batch(trajs)
    algo = baselines.make("grpo", env_id="shopsim/Shopping-v0", group_size=4, minibatches=2)
    algo.setup(agent)
    parts = algo.minibatch_rows(batch, torch.Generator().manual_seed(0))
    group_of = batch.group_ids[batch.row_traj]
    assert sorted(torch.cat(parts).tolist()) == list(range(batch.num_rows))  # every row once
    assert len(parts) == 2
    for rows in parts:  # two whole groups per step: no group is split between steps
        groups = set(group_of[rows].tolist())
        assert len(groups) == 2 and all(int((group_of == g).sum()) == len([r for r in rows if group_of[r] == g])
                                         for g in groups)
    # hence each step's GRPO advantages sum to zero (a group's failures never reach a step without its successes)
    adv = algo.compute_advantages(batch, algo.prepare(batch)).adv
    first = torch.stack([adv[r][batch.gen_mask[r]][0] for r in range(batch.num_rows)])
    for rows in parts:
        assert float(first[rows].sum()) == pytest.approx(0.0, abs=1e-5)
    # "row" is the plain row permutation, under which a step does take part of a group
    row_algo = baselines.make("grpo", env_id="shopsim/Shopping-v0", group_size=4, minibatches=2, minibatch_unit="row")
    row_algo.setup(agent)
    row_parts = row_algo.minibatch_rows(batch, torch.Generator().manual_seed(0))
    perm = torch.randperm(batch.num_rows, generator=torch.Generator().manual_seed(0))
    assert [p.tolist() for p in row_parts] == [p.sort().values.tolist() for p in torch.tensor_split(perm, 2)]
    assert any(abs(float(first[rows].sum())) > 1e-3 for rows in row_parts)


def _toy_groups(reward_of):
    """The toy agent and a batch of 3 groups of 4 toy rollouts, rollout i rewarded `reward_of(i)` on every turn."""
    from baselines.core.batch import build_batch
    from shopsim.rollout import collect

    agent = ToyLMAgent()
    trajs = collect("toy", agent, seeds=[1, 2, 3], group_size=4, env_fns=env_fns(4), progress=False, num_envs=4)
    for i, t in enumerate(trajs):
        for turn in t.turns:
            turn.reward = reward_of(i)
    return agent, build_batch(trajs)


def test_negative_advantage_scale_weighs_only_the_negative_part():
    """`negative_advantage_scale` multiplies the negative advantages and nothing else: at the first step (ratio 1)
    the policy loss is linear in the advantages, so L(0.5) is the mean of L(0) and L(1); L(0) keeps only the
    reinforced rollouts (a negative loss, its failing rows left out of the passes) and L(1) is plain GRPO."""
    import copy

    agent, batch = _toy_groups(lambda i: float(i % 4 == 0))  # one success per group: +, −, −, −
    out = {}
    for s in (1.0, 0.5, 0.0):
        algo = baselines.make("grpo", env_id="shopsim/Shopping-v0", group_size=4, lr=1e-6,
                              recompute_old_logp=True, negative_advantage_scale=s)
        algo.setup(copy.deepcopy(agent))
        out[s] = algo.update(batch, generator=torch.Generator().manual_seed(0))
    loss = {s: m["loss_policy"] for s, m in out.items()}
    assert loss[0.5] == pytest.approx((loss[0.0] + loss[1.0]) / 2, abs=1e-5)
    assert loss[0.0] < -0.1 and loss[1.0] > loss[0.0] + 0.1
    assert out[0.0]["rows_skipped_zero_adv"] > out[1.0].get("rows_skipped_zero_adv", 0)
    with pytest.raises(Exception, match="negative_advantage_scale"):
        baselines.make("grpo", env_id="shopsim/Shopping-v0", negative_advantage_scale=-1.0)


def test_argmax_negative_scale_spares_only_the_greedy_tokens_of_failed_rollouts():
    """`argmax_negative_scale` multiplies the negative advantage of the tokens that are their distribution's
    arg-max and nothing else: the first-step loss is linear in it, and at 0 it lies strictly between plain GRPO
    (every negative kept) and `negative_advantage_scale` 0 (none kept), because the failed rollouts hold both
    greedy tokens and sampled deviations. `forward_policy(need_argmax=True)` is the arg-max of the model's own
    logits, the same on the trained-positions path and the full one."""
    import copy

    from baselines.core.trainer import forward_policy

    agent, batch = _toy_groups(lambda i: float(i % 4 == 0))  # one success per group: +, −, −, −
    with torch.no_grad():
        *_, full = forward_policy(agent.model, batch.input_ids, batch.attention_mask, need_argmax=True)
        *_, part = forward_policy(agent.model, batch.input_ids, batch.attention_mask, positions=batch.gen_mask,
                                  need_argmax=True)
        logits = agent.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    gen = batch.gen_mask[:, 1:].bool()
    manual = logits[:, :-1].argmax(-1) == batch.input_ids[:, 1:]
    assert torch.equal(full[:, 1:][gen], manual[gen]) and torch.equal(part[:, 1:][gen], manual[gen])
    assert not part[:, 1:][~gen].any() and 0 < int(manual[gen].sum()) < int(gen.sum())
    out = {}
    for key, kw in {"am1": {}, "am0.5": {"argmax_negative_scale": 0.5}, "am0": {"argmax_negative_scale": 0.0},
                    "neg0": {"negative_advantage_scale": 0.0}}.items():
        algo = baselines.make("grpo", env_id="shopsim/Shopping-v0", group_size=4, lr=1e-6,
                              recompute_old_logp=True, **kw)
        algo.setup(copy.deepcopy(agent))
        out[key] = algo.update(batch, generator=torch.Generator().manual_seed(0))
    loss = {k: m["loss_policy"] for k, m in out.items()}
    assert loss["am0.5"] == pytest.approx((loss["am0"] + loss["am1"]) / 2, abs=1e-5)
    assert loss["neg0"] + 1e-3 < loss["am0"] < loss["am1"] - 1e-3
    assert 0 < out["am0"]["argmax_token_share"] < 1 and "argmax_token_share" not in out["am1"]
    with pytest.raises(Exception, match="argmax_negative_scale"):
        baselines.make("grpo", env_id="shopsim/Shopping-v0", argmax_negative_scale=-1.0)


def test_success_anchor_raises_the_greedy_tokens_of_successful_rollouts_only():
    """`success_anchor_coef` adds −λ·token-mean(log π) over the arg-max tokens of successful rollouts, rows of
    all-success groups included (their advantage is zero, so plain GRPO skips them). With every group agreeing
    the policy loss is 0 and the anchor alone moves the model: the arg-max tokens of the successful rollouts
    gain log-probability, the failed rollouts' tokens are not in the term."""
    import copy

    from baselines.core.trainer import forward_policy

    agent, batch = _toy_groups(lambda i: float(i // 4 != 1))  # groups 0 and 2 all succeed, group 1 all fail
    gen = batch.gen_mask.bool()
    won = (batch.success[batch.row_traj] > 0)[:, None] & gen
    with torch.no_grad():
        lp, _, _, am = forward_policy(agent.model, batch.input_ids, batch.attention_mask, positions=batch.gen_mask,
                                      need_argmax=True)
    expect = -float((lp * (am & won)).sum() / won.sum())
    algo = baselines.make("grpo", env_id="shopsim/Shopping-v0", group_size=4, lr=1e-3,
                          recompute_old_logp=True, success_anchor_coef=0.5)
    algo.setup(copy.deepcopy(agent))
    m = algo.update(batch, generator=torch.Generator().manual_seed(0))
    assert m["loss_anchor"] == pytest.approx(expect, rel=1e-4) and expect > 0
    assert m["loss_policy"] == 0 and m["loss"] == pytest.approx(0.5 * expect, rel=1e-4)
    assert m.get("rows_skipped_zero_adv", 0) == 0
    with torch.no_grad():
        after, _, _ = forward_policy(algo.model, batch.input_ids, batch.attention_mask, positions=batch.gen_mask)
    keep = am & won
    assert float(after[keep].mean()) > float(lp[keep].mean()) + 1e-4
    plain = baselines.make("grpo", env_id="shopsim/Shopping-v0", group_size=4, lr=1e-3, recompute_old_logp=True)
    plain.setup(copy.deepcopy(agent))
    assert "loss_anchor" not in plain.update(batch, generator=torch.Generator().manual_seed(0))


def test_eval_sampled_plays_the_same_episodes_at_the_rollout_setting():
    """`eval_sampled` adds the sampled success of the evaluation episodes (the shipped agent at the rollout
    temperature, per-episode streams) and leaves the greedy figures as they were; the agent is greedy again
    afterwards, and the sampled figures are what sampling those episodes gives."""
    import agents
    from agents.lm.agent import default_checkpoint_dir
    from baselines.core.tasks import eval_tasks
    from shopsim.rollout import collect

    env = "shopsim/Shopping-v0"
    kw = dict(eval_episodes=8, num_envs=8, eval_split="test", temperature=1.5)
    plain = baselines.make("grpo", env_id=env, **kw)
    both = baselines.make("grpo", env_id=env, eval_sampled=True, **kw)
    agent = agents.load_checkpoint(default_checkpoint_dir(), env_id=env)
    plain.configure_agent(agent)
    agent.sampling.greedy = True
    opts = agent.env_kwargs  # the checkpoint's rendering
    a = plain.evaluate(env, agent, seed=7, env_kwargs=opts)
    b = both.evaluate(env, agent, seed=7, env_kwargs=opts)
    assert agent.sampling.greedy
    assert {k: v for k, v in b.items() if "sampled" not in k} == a
    agent.sampling.greedy = False
    drawn = collect(env, agent, tasks=eval_tasks(env, "test", 8), seeds=[7 + i for i in range(8)], split="test",
                    num_envs=8, env_kwargs=opts, progress=False, agent_seed=7)
    assert b["test_sampled_success"] == pytest.approx(sum(t.success for t in drawn) / 8)
    fams = {t.meta.get("family") for t in drawn}
    assert {k.split("/")[1] for k in b if k.startswith("test_sampled_success/")} == fams
    # at T = 1.5 the shipped agent's draws fail where greedy decoding succeeds (0.375 against 0.75)
    assert b["test_sampled_success"] < b["test_success"]


def test_sampling_as_restores_the_agent_however_the_block_ends():
    """`sampling_as` sets sampling fields for a block and puts the old ones back, also when the block raises; an
    agent without the field is a config error that names it."""
    from types import SimpleNamespace

    from baselines.core.trainer import sampling_as
    from shopsim.errors import ConfigError

    agent = SimpleNamespace(sampling=SimpleNamespace(greedy=False, temperature=1.0))
    with sampling_as(agent, greedy=True, temperature=0.5):
        assert agent.sampling.greedy is True and agent.sampling.temperature == 0.5
    assert agent.sampling.greedy is False and agent.sampling.temperature == 1.0
    with pytest.raises(RuntimeError), sampling_as(agent, greedy=True):
        raise RuntimeError("a collect that fails")
    assert agent.sampling.greedy is False
    with pytest.raises(ConfigError, match="agent.sampling.top_p"), sampling_as(agent, top_p=0.9):
        pass
    with pytest.raises(ConfigError, match="greedy_failed_share needs an agent with agent.sampling.greedy"):
        with sampling_as(object(), needed_by="greedy_failed_share", greedy=True):
            pass
    assert not hasattr(agent.sampling, "top_p")
