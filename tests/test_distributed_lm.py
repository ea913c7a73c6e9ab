"""The LM trainers' rollouts on Ray workers (``rollout_workers``) on a 2-CPU local Ray cluster.

The LM agent samples each episode from its own stream (`shopsim.rollout.episode_seed`), so a seeded collect gives
the same token ids whichever worker runs an episode and whichever episodes share its decoding batch. The forwards
themselves are batched differently (other padding, other batch shapes, one torch thread per worker), which moves
log-probs by float rounding (about 1e-6 on the tiny model); the tests compare token ids exactly and log-probs,
rewards and losses within 1e-5, on small cases where no sampled token sits on such a rounding boundary.
"""

from __future__ import annotations

import csv
import sys

import pytest
import ray  # in the dev extra that `make test` installs
import torch

import baselines
from baselines.grpo import GRPOConfig
from shopsim.errors import ConfigError
from shopsim.rollout import collect

ENV = "shopsim/Shopping-v0"
SMALL = dict(group_size=2, tasks_per_iter=2, eval_episodes=2, num_envs=2, max_new_tokens=6, lr=1e-3,
             env_kwargs={"max_turns": 2}, task_families=("find_and_buy", "clarify_and_buy"), checkpoint_every=0)


#: docs/scale.md: the tiny model's log-probs, losses and metrics with workers are the single-process ones within this
TINY_BOUND = 1e-5


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, logging_level="warning")
    yield
    ray.shutdown()


def _agent():
    from agents.lm.agent import LMAgent
    from agents.lm.model import build_model
    from agents.lm.tokenizer import load_tokenizer

    tok = load_tokenizer()
    return LMAgent(env_id=ENV, model=build_model(tok, size="tiny", seed=0), tokenizer=tok, context_mode="window",
                   max_new_tokens=6)


def _assert_same_trajectories(a, b):
    assert [t.traj_id for t in a] == [t.traj_id for t in b] == list(range(len(a)))
    for x, y in zip(a, b, strict=True):
        assert (x.task_id, x.seed, x.group_id) == (y.task_id, y.seed, y.group_id)
        assert [t.action_ids for t in x.turns] == [t.action_ids for t in y.turns]
        assert [t.prompt_ids for t in x.turns] == [t.prompt_ids for t in y.turns]
        for s, u in zip(x.turns, y.turns, strict=True):
            assert s.action_logprobs == pytest.approx(u.action_logprobs, abs=TINY_BOUND, rel=0)
        assert x.total_reward == pytest.approx(y.total_reward, abs=1e-6)


def test_lm_collect_on_two_workers_gives_the_in_process_trajectories(cluster):
    from shopsim.distributed import RayPool

    agent = _agent()
    kw = dict(seeds=[11, 12, 13, 14], episodes=4, group_size=2, split="train", num_envs=2, progress=False,
              env_kwargs={"max_turns": 2}, agent_seed=5)
    local = collect(ENV, agent, **kw)
    with RayPool(workers=2) as pool:
        remote = pool.collect(ENV, agent, broadcast_weights=True, **kw)
        _assert_same_trajectories(local, remote)
        # the comparison means something: the two rollouts of a group share their reset but sample other tokens
        assert [t.action_ids for t in local[0].turns] != [t.action_ids for t in local[1].turns]
        # a learner step changes the weights only: the next call broadcasts them into the workers' agent copies
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in agent.model.parameters():
                p.add_(0.5 * torch.randn(p.shape, generator=g))
        local2 = collect(ENV, agent, **kw)
        remote2 = pool.collect(ENV, agent, broadcast_weights=True, **kw)
    _assert_same_trajectories(local2, remote2)
    assert [t.action_logprobs for t in local2[0].turns] != [t.action_logprobs for t in local[0].turns]


def _rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_grpo_with_two_rollout_workers_logs_the_single_process_curve(cluster, tmp_path):
    runs = {}
    for workers in (0, 2):
        # the entropy bonus gives the update a gradient even when every rollout of a group gets the same reward
        algo = baselines.make("grpo", env_id=ENV, **SMALL, entropy_coef=0.1, rollout_workers=workers)
        res = algo.train(ENV, iterations=2, seed=0, out_dir=tmp_path / f"w{workers}", agent=_agent(),
                         progress=False)
        assert len(res.history) == 2
        runs[workers] = _rows(tmp_path / f"w{workers}" / "metrics.csv")
    single, ray_rows = runs[0], runs[2]
    assert len(single) == len(ray_rows) == 2
    # (not tokens_encoded_per_turn: a slot reuses its previous episode's system prompt, so what is encoded depends
    # on which slot of which worker ran an episode; the episodes themselves do not)
    exact = ["iteration", "rollouts", "gen_tokens", "train_turns"]
    close = ["train_success", "train_score", "train_return", "loss", "loss_policy", "entropy", "grad_norm",
             "dev_success", "dev_score"]
    for a, b in zip(single, ray_rows, strict=True):
        for k in exact:
            assert a[k] == b[k], k
        for k in close:
            assert float(a[k]) == pytest.approx(float(b[k]), abs=TINY_BOUND, rel=0), k
    # the policy was updated (a nonzero gradient), so iteration 2's rollouts ran on the broadcast new weights
    assert float(single[0]["grad_norm"]) > 0


def test_rollout_workers_bad_config():
    with pytest.raises(ConfigError, match="rollout_workers"):
        GRPOConfig(rollout_workers=-1)


def test_rollout_workers_without_ray(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now fails as if the extra were not installed
    with pytest.raises(ConfigError, match="rollout_workers=2 needs Ray"):
        GRPOConfig(rollout_workers=2)
    assert GRPOConfig(rollout_workers=0).rollout_workers == 0


#: docs/scale.md ("LM log-probs"): rows with workers have the single-process tokens, and log-probs within this
LOGPROB_BOUND = 1e-4


def test_shipped_lm_rows_on_workers_match_within_the_documented_bound(cluster):
    """The shipped model's rows on two workers: the tokens, actions and rewards of the in-process run exactly, the
    log-probs within `LOGPROB_BOUND` (float rounding of differently batched forwards), as docs/scale.md says."""
    from pathlib import Path

    import agents
    from shopsim.distributed import RayPool

    doc = (Path(__file__).resolve().parents[1] / "docs" / "scale.md").read_text()
    assert f"log-probs within {LOGPROB_BOUND:.0e}".replace("e-0", "e-") in doc
    agent = agents.make("lm", ENV)
    kw = dict(episodes=6, seed=0, split="train", num_envs=4, progress=False, env_kwargs={"max_turns": 3})
    local = collect(ENV, agent, **kw)
    with RayPool(workers=2) as pool:
        remote = pool.collect(ENV, agent, **kw)
    worst = 0.0
    for x, y in zip(local, remote, strict=True):
        assert (x.traj_id, x.task_id, x.seed, x.total_reward) == (y.traj_id, y.task_id, y.seed, y.total_reward)
        for s, u in zip(x.turns, y.turns, strict=True):
            assert (s.action_ids, s.action, s.observation, s.reward) == (u.action_ids, u.action, u.observation,
                                                                        u.reward)
            worst = max([worst, *(abs(a - b) for a, b in zip(s.action_logprobs, u.action_logprobs, strict=True))])
    assert worst <= LOGPROB_BOUND, worst


def test_scale_docs_state_what_these_tests_check():
    """docs/scale.md's table of what `rollout_workers` keeps identical names these tests and their bounds."""
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "scale.md").read_text()
    table = doc[doc.index("**Same curve, for tiny updates only.**"):doc.index("## Several machines")]
    named = set(re.findall(r"`(test_\w+)`", table))
    assert named and named <= set(globals()), named - set(globals())
    assert f"within {TINY_BOUND:.0e} (tiny model), within {LOGPROB_BOUND:.0e} (shipped model)".replace("e-0", "e-") \
        in table
    assert f"within {TINY_BOUND:.0e}".replace("e-0", "e-") + " | `test_grpo_with_two_rollout_workers" in table
