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


def test_resampled_ids_are_fresh_and_consistent_within_an_episode():
    after = expert_trajectories(ENV, 12, reset_options={"family": "after_sales"}, progress=False, env_kwargs=KW,
                                expert_kwargs={"click_by": "index", "query": "instruction"}, num_envs=4)
    id_re = re.compile(r"\b(?:W[1-9]\d{6}|B0[0-9A-Z]{8})\b")
    plain = copy_augment(after, 1, seed=0)
    aug = copy_augment(after, 1, seed=0, resample_ids=True)
    assert len(aug) == sum(t.success for t in after) >= len(plain)
    n_ids = 0
    for new in aug:
        old = next(t for t in after if t.task_id == new.task_id and t.seed == new.seed)
        mapping = {}
        for a, b in zip(old.turns, new.turns, strict=True):
            for text_a, text_b in ((a.observation, b.observation), (a.action, b.action)):
                ids_a, ids_b = id_re.findall(str(text_a)), id_re.findall(str(text_b))
                assert len(ids_a) == len(ids_b)
                for x, y in zip(ids_a, ids_b, strict=True):
                    assert x != y and x[0] == y[0] and len(x) == len(y)
                    assert mapping.setdefault(x, y) == y  # the same old id always becomes the same new one
        assert len(set(mapping.values())) == len(mapping)  # distinct ids stay distinct
        n_ids += len(mapping)
    assert n_ids > 2 * len(aug)  # after-sales episodes carry order and product ids, and every one was replaced
