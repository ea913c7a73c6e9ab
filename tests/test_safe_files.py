"""Files shopsim writes and reads back under hostile conditions: state files that load without unpickling, caches
that a crafted file cannot hijack, checkpoint files written atomically with the normal file mode, and the
temporary files of killed writers removed by the next run."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from shopsim.errors import ShopsimError
from tests.fixtures.planted import plant_pickle

SHOPPING = "shopsim/Shopping-v0"


# ------------------------------------------------------------------ state files
def test_state_file_round_trips_what_a_resume_needs(tmp_path):
    from shopsim.statefile import load_state, save_state

    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    emb = torch.nn.Embedding(5, 3)
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
             "generator": np.random.default_rng(7).bit_generator.state, "optimizer": opt.state_dict(),
             "tied": {"a": emb.weight, "b": emb.weight, "row": emb.weight[1:]}, "stats": np.arange(3.0),
             "scalar": np.float32(0.1), "history": [{"loss": float("nan"), "note": None}], "empty": torch.zeros(0, 2),
             "$tuple": "a key that looks like a tag"}
    old = os.umask(0o022)
    try:
        path = save_state(tmp_path / "s.safetensors", state)
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o644  # not safetensors' private 0600
    back = load_state(path)
    assert back["python"] == state["python"] and isinstance(back["python"], tuple)
    assert back["numpy"][0] == "MT19937" and np.array_equal(back["numpy"][1], state["numpy"][1])
    assert torch.equal(back["torch"], state["torch"]) and back["generator"] == state["generator"]
    assert back["optimizer"]["param_groups"] == state["optimizer"]["param_groups"]  # tuples (betas) stay tuples
    assert set(back["optimizer"]["state"]) == {0, 1}  # int keys stay ints
    assert back["tied"]["a"] is back["tied"]["b"] and torch.equal(back["tied"]["row"], emb.weight[1:].detach())
    assert type(back["scalar"]) is np.float32 and back["scalar"] == state["scalar"]
    assert np.isnan(back["history"][0]["loss"]) and back["$tuple"] == state["$tuple"]
    assert back["empty"].shape == (0, 2)
    opt.load_state_dict(back["optimizer"])


def test_a_pickle_is_never_run_by_the_loaders(tmp_path):
    from shopsim.statefile import load_state, load_weights

    marker = tmp_path / "ran"
    with pytest.raises(ShopsimError, match="x.safetensors is damaged or not a shopsim state file.*delete it"):
        load_state(plant_pickle(tmp_path / "x.safetensors", marker))
    with pytest.raises(ShopsimError, match="policy.pt is damaged or not a weights file"):
        load_weights(plant_pickle(tmp_path / "policy.pt", marker))  # weights_only: the payload is refused, not run
    assert not marker.exists()


def test_a_crafted_simulator_cache_is_not_run(tmp_path, monkeypatch):
    """A crafted file where the ProactiveRec simulator cache lives (the pickled name older versions read, or the
    current one) never runs: the simulator is trained again and cached in the safe format."""
    from shopsim.envs.proactive_rec import simulator

    monkeypatch.setenv("SHOPSIM_CACHE_DIR", str(tmp_path / "cache"))
    emb = np.eye(4, dtype=np.float32)
    trained = []

    def fast_train(emb, *, seed, log=None):
        trained.append(seed)
        return simulator.SASRec(len(emb)), {"val_loss": 1.0}

    monkeypatch.setattr(simulator, "train_sasrec", fast_train)
    stem = tmp_path / "cache" / "proactive_rec" / f"sasrec-k-v{simulator.SIM_VERSION}"
    marker = tmp_path / "ran"
    plant_pickle(stem.with_suffix(".pt"), marker)
    plant_pickle(stem.with_suffix(".safetensors"), marker)
    sim = simulator.load_simulator("sasrec", emb, key="k")
    assert not marker.exists() and trained == [0] and sim.report == {"val_loss": 1.0}
    assert simulator.load_simulator("sasrec", emb, key="k").report == {"val_loss": 1.0} and trained == [0]


# ------------------------------------------------------------------ checkpoint files: atomic, normal mode
class Killed(BaseException):
    """Stands for the process dying in the middle of writing a file."""


def _lm_agent(seed: int = 0):
    from agents.lm.agent import LMAgent
    from agents.lm.model import build_model
    from agents.lm.tokenizer import load_tokenizer

    tok = load_tokenizer()
    return LMAgent(env_id=SHOPPING, model=build_model(tok, size="tiny", seed=seed), tokenizer=tok, max_new_tokens=4)


def _save_lm(directory: Path, seed: int):
    _lm_agent(seed).save(directory)


def _load_lm(directory: Path):
    import agents

    return agents.load_checkpoint(directory).model.state_dict()


def _save_hybrid(directory: Path, seed: int):
    from agents.inventory_nets import HybridPolicy
    from agents.inventory_policies import HybridPolicyAgent

    torch.manual_seed(seed)
    HybridPolicyAgent(policy=HybridPolicy(6, (4,))).save(directory)


def _load_hybrid(directory: Path):
    import agents

    return agents.load_checkpoint(directory).policy.state_dict()


def _save_retriever(directory: Path, seed: int):
    from agents.retrieval_policies import PLRetriever

    PLRetriever(env_kwargs={"n_items": 20, "k": 3}, seed=seed).save(directory)


def _load_retriever(directory: Path):
    import agents

    return agents.load_checkpoint(directory).scorer.state_dict()


def _save_critic(directory: Path, seed: int):
    from baselines.core.value_head import ValueModel
    from tests.fixtures.toy_lm import tiny_gpt2

    ValueModel(tiny_gpt2(seed)).save(directory)


def _load_critic(directory: Path):
    from baselines.core.value_head import ValueModel
    from tests.fixtures.toy_lm import tiny_gpt2

    critic = ValueModel(tiny_gpt2(99))
    critic.load(directory)
    return critic.state_dict()


# (save(directory, seed), load(directory) -> state dict, the writer a kill interrupts (module, name))
SAVERS = {
    "lm": (_save_lm, _load_lm, ("transformers.modeling_utils", "safe_save_file")),
    "hybrid_policy": (_save_hybrid, _load_hybrid, ("torch", "save")),
    "retriever": (_save_retriever, _load_retriever, ("torch", "save")),
    "critic": (_save_critic, _load_critic, ("torch", "save")),
}


@pytest.mark.parametrize("kind", list(SAVERS))
def test_a_save_killed_midway_leaves_the_previous_checkpoint(kind, tmp_path, monkeypatch):
    """A kill while a checkpoint's weights are being written leaves the previous, complete file (not a truncated
    one under the final name), and the rerun's sweep leaves no temporary file behind."""
    import importlib

    save, load, (module, name) = SAVERS[kind]
    save(tmp_path / "ckpt", 0)
    before = load(tmp_path / "ckpt")

    def killed_writer(obj, path, *args, **kwargs):
        Path(path).write_bytes(b"\x00" * 64)  # a file cut short
        raise Killed

    monkeypatch.setattr(importlib.import_module(module), name, killed_writer)
    with pytest.raises(Killed):
        save(tmp_path / "ckpt", 1)
    monkeypatch.undo()
    after = load(tmp_path / "ckpt")
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    assert not [p for p in (tmp_path / "ckpt").rglob("*") if ".tmp-" in p.name]


def test_checkpoint_files_get_the_normal_file_mode(tmp_path):
    """Every file of a saved checkpoint gets the mode the umask gives new files (safetensors alone makes its files
    private, which locks out the other users of a shared folder)."""
    old = os.umask(0o022)
    try:
        _save_lm(tmp_path / "lm", 0)
        _save_hybrid(tmp_path / "hybrid", 0)
        _save_critic(tmp_path / "critic", 0)
    finally:
        os.umask(old)
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name == "model.safetensors" for p in files)
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in files} == {p.name: oct(0o644) for p in files}


# ------------------------------------------------------------------ temporaries of killed writers
def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_stale_temporaries_are_removed_and_live_ones_kept(tmp_path):
    """The next writer in a folder removes the temporaries of writers that are gone (a dead process on this
    machine; this process's id but no such thread, as after a container restart), and keeps those of live writers
    and of other machines (a shared folder), and every other file."""
    from shopsim.paths import _host_tag, remove_stale_temps

    host, me = _host_tag(), os.getpid()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        names = {
            "dead": f".a.parquet.tmp-{_dead_pid()}-1-{host}",
            "dead_old_style": f".b.parquet.tmp-{_dead_pid()}",
            "own_pid_no_such_thread": f".c.parquet.tmp-{me}-1-{host}",
            "live_process": f".d.parquet.tmp-{sleeper.pid}-1-{host}",
            "own_live_thread": f".e.parquet.tmp-{me}-{threading.get_ident()}-{host}",
            "other_machine": f".f.parquet.tmp-{_dead_pid()}-1-{'0' * 8 if host != '0' * 8 else '1' * 8}",
            "not_a_temporary": "g.parquet",
        }
        for key, name in names.items():
            (tmp_path / name).write_text(key)
        folder = tmp_path / f".h.tmp-{_dead_pid()}-1-{host}"  # a folder: a search index being built
        (folder / "part").mkdir(parents=True)
        removed = remove_stale_temps(tmp_path)
        assert sorted(p.name for p in removed) == sorted([names["dead"], names["dead_old_style"],
                                                          names["own_pid_no_such_thread"], folder.name])
        left = {p.name for p in tmp_path.iterdir()}
        assert left == {names[k] for k in ("live_process", "own_live_thread", "other_machine", "not_a_temporary")}
    finally:
        sleeper.kill()
        sleeper.wait()


def test_the_next_atomic_write_sweeps_its_folder(tmp_path):
    from shopsim.paths import _host_tag, atomic_path, atomic_write

    stale = tmp_path / f".x.json.tmp-{_dead_pid()}-1-{_host_tag()}"
    stale.write_text("{")
    with atomic_write(tmp_path / "x.json") as tmp:
        assert tmp == atomic_path(tmp_path / "x.json") and tmp.parent == tmp_path
        tmp.write_text("{}")
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]
