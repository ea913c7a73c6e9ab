"""Results files: round trip, schema validation with clear errors, protocol loading, evaluation on a toy env."""

import json

import pytest

from shopsim.app.bench import reference_agent
from shopsim.errors import ConfigError, DatasetError
from shopsim.leaderboard.evaluate import evaluate
from shopsim.leaderboard.protocols import Protocol, load_protocol
from shopsim.leaderboard.results import (
    SCHEMA_VERSION,
    config_hash,
    find_results,
    git_commit,
    make_results,
    read_results,
    validate_results,
    write_results,
)
from tests.fixtures.leaderboard_toy import FAMILY, TEST_IDS, TOY_ID, CoinExpert, CoinHalf, CoinPolicy

PROTO = Protocol(env_id=TOY_ID, family=FAMILY, task_ids=(1, 2), seeds=(0, 1), tries=4)
METRICS = {"success_rate": {"mean": 0.5, "std": 0.1, "ci95": [0.4, 0.6], "n": 2, "per_seed": [0.45, 0.55]}}


def good():
    return make_results(protocol=PROTO, entry="expert", kind="reference", metrics=METRICS, agent="m:C",
                        budget={"iterations": 3})


def test_round_trip_and_fields(tmp_path):
    rec = good()
    assert rec["schema_version"] == SCHEMA_VERSION and rec["env_version"] == 0 and rec["episodes"] == 16
    assert rec["git_commit"] and rec["package_version"] and len(rec["config_hash"]) == 16
    path = write_results(tmp_path / "a" / "r.json", rec)
    back = read_results(path)
    assert back["metrics"] == METRICS and back["_path"] == str(path)
    assert [r["entry"] for r in find_results(tmp_path)] == ["expert"]


def test_config_hash_is_stable_and_sensitive():
    assert config_hash({"b": 1, "a": [1, 2]}) == config_hash({"a": [1, 2], "b": 1})
    assert config_hash({"a": 1}) != config_hash({"a": 2})
    other = make_results(protocol=PROTO, entry="expert", kind="reference", metrics=METRICS, agent="m:C",
                         budget={"iterations": 4})
    assert other["config_hash"] != good()["config_hash"]


def test_git_commit_outside_a_checkout_is_unknown(tmp_path):
    assert git_commit(tmp_path) == "unknown"


@pytest.mark.parametrize("mutate,match", [
    (lambda d: d.update(schema_version=0), "older than the supported.*re-run `shopsim eval`"),
    (lambda d: d.update(schema_version=SCHEMA_VERSION + 1), "newer.*upgrade shopsim"),
    (lambda d: d.pop("schema"), "not a shopsim results file"),
    (lambda d: d.pop("config_hash"), "missing field.*config_hash"),
    (lambda d: d.update(seeds="0,1"), "'seeds' must be list"),
    (lambda d: d.update(kind="winner"), "kind 'winner' is not one of"),
    (lambda d: d["metrics"].update(score=0.3), "metric 'score' must be an object"),
    (lambda d: d["metrics"]["success_rate"].update(ci95=[0.1]), "malformed 'ci95'"),
    (lambda d: d.update(metrics={}), "status 'ok' but no metrics"),
])
def test_malformed_records_raise_clear_errors(mutate, match):
    d = good()
    mutate(d)
    with pytest.raises(DatasetError, match=match):
        validate_results(d, "r.json")


def test_malformed_files_name_the_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(DatasetError, match="bad.json: not valid JSON"):
        read_results(bad)
    with pytest.raises(DatasetError, match="expected a JSON object"):
        validate_results([1, 2], "x.json")
    old = tmp_path / "old.json"
    rec = good()
    rec["schema_version"] = 0
    old.write_text(json.dumps(rec))
    ckpt = tmp_path / "runs" / "hpo" / "checkpoint"  # a checkpoint's JSON files are not results: skipped
    (ckpt / "tokenizer").mkdir(parents=True)
    (ckpt / "shopsim_agent.json").write_text(json.dumps({"class": "m:C"}))
    (ckpt / "tokenizer" / "vocab.json").write_text("{}")
    with pytest.raises(DatasetError, match="bad.json: not valid JSON"):  # a broken file is never skipped
        find_results(tmp_path)
    bad.unlink()
    with pytest.raises(DatasetError, match="old.json: results schema_version 0"):
        find_results(tmp_path)
    with pytest.raises(DatasetError, match="no such folder"):
        find_results(tmp_path / "nope")


def test_protocol_from_splits_file(toy_world):
    p = load_protocol(TOY_ID)
    assert p.task_ids == tuple(TEST_IDS) and p.seeds == (0, 1, 2) and p.tries == 4 and p.family == FAMILY
    tasks, seeds = p.episodes(1)
    assert tasks[:5] == [100, 100, 100, 100, 101] and len(set(seeds)) == len(seeds) == 24
    assert set(seeds).isdisjoint(p.episodes(0)[1])
    small = p.limited(tasks=2, seeds=1)
    assert small.task_ids == (100, 101) and small.seeds == (0,)
    assert load_protocol(TOY_ID, "dev").task_ids == (200, 201)
    with pytest.raises(ConfigError, match="split 'test' or 'dev'"):
        load_protocol(TOY_ID, "train")
    (toy_world / "splits" / "ToyCoin-v0.json").unlink()
    with pytest.raises(DatasetError, match="no evaluation split for shopsim/ToyCoin-v0"):
        load_protocol(TOY_ID)


def test_evaluate_expert_beats_random_and_is_deterministic(toy_world):
    p = load_protocol(TOY_ID)
    ev = evaluate(CoinExpert(), p, num_envs=3)
    again = evaluate(CoinExpert(), p, num_envs=5)
    assert ev.metrics == again.metrics  # same episodes whatever the number of env copies
    rand = evaluate(CoinPolicy(q=0.5), p)
    # expert: success prob = mean p over tasks 100..105 = 0.3 + 0.1 * mean(4,5,0,1,2,3) = 0.55
    assert 0.4 < ev.metrics["success_rate"]["mean"] < 0.7
    assert rand.metrics["success_rate"]["mean"] < ev.metrics["success_rate"]["mean"]
    m = ev.metrics
    assert m["pass^1"]["mean"] == pytest.approx(m["success_rate"]["mean"])
    assert m["pass^1"]["mean"] >= m["pass^2"]["mean"] >= m["pass^3"]["mean"] >= m["pass^4"]["mean"]
    assert m["success_rate"]["n"] == 3 and len(m["success_rate"]["ci95"]) == 2
    assert m["turns"]["mean"] == 2.0 and m["episodes"]["mean"] == 24 * 3  # all eval seeds


class _Sampling(CoinPolicy):
    """A coin player with an LM agent's decoding switch: arg-max (always 1, q > 0.5) when ``sampling.greedy``."""

    def __init__(self, **kw):
        super().__init__(q=0.7, **kw)
        self.sampling = type("Sampling", (), {"greedy": False})()

    def act_one(self, slot, observation, info):
        return 1 if self.sampling.greedy else super().act_one(slot, observation, info)


def test_evaluate_decodes_greedily_unless_the_protocol_samples(toy_world):
    """The protocol's decoding, not the agent's own setting, decides: greedy (the default) makes every try of a
    task play 1, `decoding="sample"` keeps the agent's sampling; either way the agent's setting is restored."""
    from dataclasses import replace

    p = load_protocol(TOY_ID)
    agent = _Sampling()
    greedy = evaluate(agent, p)
    assert agent.sampling.greedy is False
    assert greedy.metrics == evaluate(CoinPolicy(q=1.0), p).metrics  # arg-max plays the coin's best face
    sampled = evaluate(agent, replace(p, decoding="sample"))
    assert sampled.metrics == evaluate(CoinPolicy(q=0.7), p).metrics  # the agent's own q, same seeded episodes
    assert sampled.metrics["success_rate"]["mean"] != greedy.metrics["success_rate"]["mean"]
    assert replace(p, decoding="sample").hash != p.hash
    assert make_results(protocol=replace(p, decoding="sample"), entry="s", kind="agent", metrics={})["decoding"] \
        == "sample" and "decoding" not in make_results(protocol=p, entry="g", kind="agent", metrics={})
    with pytest.raises(ConfigError, match="decoding must be one of greedy, sample"):
        replace(p, decoding="beam")


class _Failing(CoinExpert):
    def act_one(self, slot, observation, info):
        raise RuntimeError("this reference always fails")


def test_evaluate_gap_to_reference(toy_world):
    p = Protocol(env_id=TOY_ID, family=FAMILY, task_ids=(100, 101), seeds=(0, 1), tries=4, reference="half")
    ev = evaluate(CoinPolicy(q=0.5), p, reference=CoinHalf())  # "half" always plays 1 like the expert
    ref = evaluate(CoinExpert(), Protocol(env_id=TOY_ID, family=FAMILY, task_ids=(100, 101), seeds=(0, 1), tries=4))
    for mine, theirs in zip(ev.per_seed, ref.per_seed, strict=True):
        assert mine["gap_to_s_S_pct"] == pytest.approx(100 * (mine["cost"] - theirs["cost"]) / theirs["cost"])
    assert not ev.notes
    missing = evaluate(CoinPolicy(q=0.5), p)  # the protocol names a reference, the caller gave none
    assert "gap_to_s_S_pct" not in missing.metrics and "no reference agent" in missing.notes[0]
    broken = Protocol(env_id=TOY_ID, family=FAMILY, task_ids=(100,), seeds=(0,), tries=1, reference="nope")
    out = evaluate(CoinExpert(), broken, reference=_Failing())
    assert "gap_to_s_S_pct" not in out.metrics and "reference failed" in out.notes[0]
    assert out.metrics["success_rate"]["mean"] > 0  # the entry's own metrics survive a broken reference


def test_reference_agent_is_the_registered_one_built_once(toy_world):
    """The app layer (`shopsim.app.bench`) builds the protocol's reference from the agent registry."""
    p = Protocol(env_id=TOY_ID, family=FAMILY, task_ids=(100,), seeds=(0,), tries=1, reference="half")
    agent = reference_agent(p)
    assert isinstance(agent, CoinHalf) and reference_agent(p) is agent
    assert reference_agent(Protocol(env_id=TOY_ID, family=FAMILY, task_ids=(100,), seeds=(0,), tries=1)) is None


def test_one_rollout_per_evaluation_and_the_reference_runs_once(toy_world):
    from dataclasses import replace

    from shopsim.rollout import collect

    calls = []

    def counting(*a, **kw):
        calls.append((kw["tasks"], kw["progress"]))
        return collect(*a, **kw)

    p = replace(load_protocol(TOY_ID), reference="random", seeds=(0, 1, 2))
    ref = CoinPolicy(q=0.5)
    ev = evaluate(CoinPolicy(q=0.5), p, reference=ref, collect=counting)  # the agent is the reference
    assert len(calls) == 1 and len(calls[0][0]) == p.episodes_per_seed * 3  # every eval seed in one call (one bar)
    assert len(ev.per_seed) == 3 and ev.metrics["episodes"]["mean"] == p.episodes_per_seed * 3
    evaluate(CoinExpert(), p, reference=ref, collect=counting)
    assert len(calls) == 2  # the reference's run is reused, only the expert's episodes run


def test_nan_and_infinite_numbers_are_refused_on_write_and_on_read(tmp_path):
    """A results file with a NaN mean was ranked as if it were a number (and written, Python's json allowing it)."""
    for bad in (float("nan"), float("inf"), -float("inf")):
        rec = good()
        rec["metrics"]["success_rate"]["mean"] = bad
        with pytest.raises(DatasetError, match="metrics.success_rate.mean is not a finite number"):
            write_results(tmp_path / "w.json", rec)
        rec = good()
        rec["metrics"]["success_rate"]["ci95"] = [0.4, bad]
        with pytest.raises(DatasetError, match=r"metrics.success_rate.ci95\[1\] is not a finite number"):
            validate_results(rec, "r.json")
    assert not (tmp_path / "w.json").exists()
    text = json.dumps(good())
    for literal in ("NaN", "Infinity", "-Infinity"):
        path = tmp_path / "read" / f"{literal}.json"
        path.parent.mkdir(exist_ok=True)
        path.write_text(text.replace('"mean": 0.5', f'"mean": {literal}'))
        with pytest.raises(DatasetError, match=f"{literal}.json: holds {literal}, which is not a number"):
            read_results(path)
        with pytest.raises(DatasetError, match="finite numbers only"):
            find_results(path.parent)
        path.unlink()
    path.write_text(text.replace('"mean": 0.5', '"mean": 1e999'))  # a literal that overflows to inf
    with pytest.raises(DatasetError, match="metrics.success_rate.mean is not a finite number"):
        read_results(path)


@pytest.mark.parametrize("name,match", [
    ("x" * 20_000, "is 20000 characters long; the leaderboard takes at most 100"),
    ("evil\u202egnp.exe", "bidirectional-text control U\\+202E"),
    ("a\u2066b", "bidirectional-text control U\\+2066"),
    ("mark\u200f", "bidirectional-text control U\\+200F"),
    ("two\nlines", "control character U\\+000A"),
    ("=HYPERLINK(\"http://x\")", "spreadsheets read as a formula"),
    ("  ", "is empty"),
])
def test_entry_names_the_leaderboard_would_show_wrongly_are_refused(name, match, tmp_path):
    rec = good()
    rec["entry"] = name
    with pytest.raises(DatasetError, match=f"entry name .*{match}"):
        write_results(tmp_path / "r.json", rec)
    path = tmp_path / "in.json"
    path.write_text(json.dumps(rec))
    with pytest.raises(DatasetError, match=f"in.json: entry name .*{match}"):
        read_results(path)


def test_ordinary_entry_names_pass():
    from shopsim.leaderboard.results import MAX_ENTRY_CHARS, entry_name_problem

    for name in ("expert", "s_S", "hpo/mine", "capg-seed0", "modèle α", "x" * MAX_ENTRY_CHARS,
                 "tests.fixtures.leaderboard_toy.ToyAlgo", "<img src=x>"):  # markup is escaped where shown
        assert entry_name_problem(name) is None, name
