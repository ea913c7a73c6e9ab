"""Prior-breaking copy augmentation (agents.lm.augment)."""

import re

import pytest

from agents.lm.augment import GRAMMAR_WORDS, copy_augment, protected_words
from agents.lm.sft import expert_trajectories

ENV = "shopsim/Shopping-v0"
KW = {"numbered_results": True, "results_per_page": 5, "catalog_size": 2000}


@pytest.fixture(scope="module")
def trajs():
    return expert_trajectories(ENV, 40, reset_options={"family": "find_and_buy"}, progress=False, env_kwargs=KW,
                               expert_kwargs={"click_by": "index", "query": "instruction"}, num_envs=4)


def _words(text):
    return set(re.findall(r"[a-z]+", str(text).lower()))


def test_rewrite_is_consistent_and_keeps_grammar(trajs):
    aug = copy_augment(trajs, 1, seed=0)
    assert len(aug) >= 0.9 * sum(t.success for t in trajs)
    keep = protected_words(trajs)
    changed = 0
    for new in aug:
        old = next(t for t in trajs if t.task_id == new.task_id and t.seed == new.seed)
        assert len(new.turns) == len(old.turns) and new.success == old.success
        task_old = old.turns[0].observation.splitlines()[0]
        task_new = new.turns[0].observation.splitlines()[0]
        changed += task_old != task_new
        # numbers (prices, '5 pack') are never touched
        assert re.findall(r"\d+(?:\.\d+)?", task_old) == re.findall(r"\d+(?:\.\d+)?", task_new)
        for to, tn in zip(old.turns, new.turns, strict=False):
            # same action verb and the copied argument is still on the (rewritten) page or task line
            assert str(tn.action).split("[")[0] == str(to.action).split("[")[0]
            arg = str(tn.action).partition("[")[2].rstrip("]").strip()
            if str(tn.action).startswith("click[") and not arg.startswith("#"):
                assert f"[{arg}]" in tn.observation
            if str(tn.action).startswith("search["):
                assert arg in task_new
            # protected words are never introduced or removed
            assert _words(to.observation) & keep == _words(tn.observation) & keep
            assert tn.prompt_ids is None
    assert changed == len(aug)
    assert GRAMMAR_WORDS <= keep


def test_replacements_never_collide_and_are_seeded(trajs):
    a, b, c = copy_augment(trajs, 1, seed=3), copy_augment(trajs, 1, seed=3), copy_augment(trajs, 1, seed=4)
    assert [t.turns[0].observation for t in a] == [t.turns[0].observation for t in b]
    assert [t.turns[0].observation for t in a] != [t.turns[0].observation for t in c]
    for new in a:
        old = next(t for t in trajs if t.task_id == new.task_id and t.seed == new.seed)
        new_words = _words(new.turns[0].observation) - _words(old.turns[0].observation)
        seen_old = set().union(*(_words(t.observation) for t in old.turns))
        assert not new_words & seen_old
    assert copy_augment(trajs, 0) == [] and len(copy_augment(trajs, 2, seed=0)) == 2 * len(a)
