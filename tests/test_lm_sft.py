"""Supervised warm start: the loss falls, agent-token masks are right, and held-out play beats the random agent."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import agents
from agents.lm.model import build_model
from agents.lm.prompts import ChatFormat
from agents.lm.sft import (
    LEGACY_RESUME_STATE,
    RESUME_STATE,
    SFTConfig,
    build_examples,
    evaluate,
    expert_trajectories,
    finished_run,
    heldout_loss,
    sft_expert_data,
    train_sft,
)
from agents.lm.tokenizer import load_tokenizer
from shopsim.errors import ConfigError
from shopsim.statefile import save_state
from tests.fixtures.planted import plant_pickle

ENV = "shopsim/Shopping-v0"
FIND = {"family": "find_and_buy"}
#: plain behaviour cloning on the default env and expert (the SFTConfig defaults are the full recipe)
PLAIN = dict(context_mode="window", curriculum_steps=0, augment_copies=0, obs_mode="compact", numbered_results=False,
             results_per_page=None, expert_query="full", arg_space=False, expert_price_clause=False, families=(),
             order_refs="id")


def plain(**kw) -> SFTConfig:
    return SFTConfig(**{**PLAIN, **kw})


@pytest.fixture(scope="module")
def expert_trajs():
    return expert_trajectories(ENV, 40, reset_options=FIND, progress=False, num_envs=8)


def learnt_actions(rows, eos: int) -> list[list[int]]:
    """The runs of loss-masked ids of SFT rows, one per learnt action (each ends at the eos token)."""
    got = []
    for ids, mask in rows:
        seg: list[int] = []
        for i, m in zip(ids, mask, strict=False):
            if m:
                seg.append(i)
                if i == eos:
                    got.append(seg)
                    seg = []
    return got


@pytest.mark.parametrize("mode", ["window", "concat"])
def test_examples_mask_exactly_the_expert_actions(expert_trajs, mode):
    tok = load_tokenizer()
    fmt = ChatFormat(tok)
    rows = build_examples(expert_trajs[:3], fmt, mode=mode)
    want = [tok(str(t.action), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            for traj in expert_trajs[:3] for t in traj.turns]
    assert learnt_actions(rows, tok.eos_token_id) == want


@pytest.mark.parametrize("mode", ["window", "concat"])
def test_examples_leave_perturbed_actions_unlearnt(mode):
    """The expert's injected wrong clicks (``extra["perturbed"]``) stay in the context but get no loss: the learnt
    actions are exactly the unflagged ones, in order."""
    cfg = SFTConfig(expert_noise=0.4, families=("clarify_and_buy",))
    trajs = expert_trajectories(ENV, 4, seed=2, split="dev", reset_options={"family": "clarify_and_buy"},
                                progress=False, num_envs=4, env_kwargs=cfg.env_options(),
                                expert_kwargs=cfg.expert_options())
    assert any(t.extra.get("perturbed") for x in trajs for t in x.turns)
    tok = load_tokenizer()
    rows = build_examples(trajs, ChatFormat(tok), mode=mode, history=1, pin_first_turn=True)
    want = [tok(str(t.action), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            for x in trajs for t in x.turns if not t.extra.get("perturbed")]
    assert learnt_actions(rows, tok.eos_token_id) == want
    if mode == "concat":  # the wrong clicks are still in the context the later actions are learnt from
        wrong = next(t for x in trajs for t in x.turns if t.extra.get("perturbed"))
        text = [tok.decode(ids) for ids, _ in rows]
        assert any(str(wrong.action) in t for t in text)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_sft_loss_without_padding_mask_equals_the_masked_loss(expert_trajs, arch):
    """Right-padded rows of different lengths: the maskless forward (the default) gives the masked forward's loss
    and gradient."""
    from agents.lm.sft import sft_loss

    tok = load_tokenizer()
    rows = build_examples(expert_trajs[:6], ChatFormat(tok), mode="concat")
    assert len({len(r[0]) for r in rows}) > 1
    out = {}
    for masked in (False, True):
        model = build_model(tok, arch=arch, size="tiny", seed=0).eval()  # GPT-2's dropout off: same function
        loss, n, _ = sft_loss(model, rows, tok.pad_token_id, obs_loss_weight=0.5, padding_mask=masked)
        loss.backward()
        out[masked] = (loss.item(), n, torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert out[False][1] == out[True][1]
    assert abs(out[False][0] - out[True][0]) < 1e-5
    assert torch.allclose(out[False][2], out[True][2], atol=1e-5, rtol=1e-4)


def test_sft_loss_falls_on_train_and_held_out(expert_trajs, tmp_path):
    dev = expert_trajectories(ENV, 8, split="dev", reset_options=FIND, progress=False, num_envs=8)
    tok = load_tokenizer()
    model = build_model(tok, size="tiny", seed=0)
    dev_rows = build_examples(dev, ChatFormat(tok), history=1, history_obs_chars=100)
    before = heldout_loss(model, dev_rows, tok.pad_token_id)
    cfg = plain(steps=120, batch_size=8, lr=5e-3, warmup=10, size="tiny", eval_every=0, eval_episodes=4,
                    num_envs=4, reset_options=FIND, max_new_tokens=24)
    agent, hist = train_sft(ENV, expert_trajs, cfg, out_dir=tmp_path, progress=False, tokenizer=tok, model=model)
    losses = [h["loss"] for h in hist]
    assert np.mean(losses[-10:]) < 0.5 * np.mean(losses[:5])
    assert heldout_loss(agent.model, dev_rows, tok.pad_token_id) < 0.5 * before
    assert (tmp_path / "metrics.csv").is_file() and (tmp_path / "sft_curve.png").is_file()
    assert "eval_success" in hist[-1] and "eval_success/find_and_buy" in hist[-1]
    again = agents.load_checkpoint(tmp_path / "checkpoint", greedy=True, max_new_tokens=24)
    assert again.options["context_mode"] == "window" and again.options["history"] == 1
    for a, b in zip(again.model.parameters(), agent.model.parameters(), strict=False):
        assert torch.equal(a, b)


def test_sft_data_options_reach_the_expert_env_and_manifest(tmp_path):
    """Positional clicks in the SFT data (expert click_by="index" on a numbered env) and the env options recorded
    in the checkpoint so that evaluation uses the same rendering."""
    cfg = plain(steps=2, batch_size=4, size="tiny", eval_every=0, eval_episodes=2, num_envs=2, reset_options=FIND,
                max_new_tokens=8, numbered_results=True, results_per_page=5, expert_query="instruction",
                families=("find_and_buy",))
    kw = {"numbered_results": True, "results_per_page": 5}
    assert cfg.env_options() == kw and cfg.expert_options() == {"click_by": "index", "query": "instruction"}
    trajs = sft_expert_data(ENV, 6, cfg, progress=False)
    assert {t.meta["family"] for t in trajs} == {"find_and_buy"}
    acts = [str(t.action) for tr in trajs for t in tr.turns]
    assert any(a.startswith("click[#") for a in acts) and not any(a.startswith("click[B0") for a in acts)
    assert "\n#1 [" in trajs[0].turns[1].observation
    agent, _ = train_sft(ENV, trajs, cfg, out_dir=tmp_path, progress=False)
    from agents.registry import CHECKPOINT_MANIFEST, manifest_env_kwargs

    assert manifest_env_kwargs(tmp_path / "checkpoint" / CHECKPOINT_MANIFEST) == kw


def test_recipe_options_become_env_and_expert_options():
    """The default SFTConfig is the recipe: terse with the task restated after cart changes, numbered results 5 per
    page, the expert clicking by position
    and searching the task line with a blank after the bracket and the price clause; `env_kwargs` go over the derived
    options."""
    cfg = SFTConfig()
    assert cfg.env_options() == {"numbered_results": True, "obs_mode": "terse", "results_per_page": 5,
                                 "order_refs": "position", "task_reminder": True}
    # the reminder is a terse-mode option: the other modes state the task on every page
    assert "task_reminder" not in SFTConfig(obs_mode="compact").env_options()
    assert "task_reminder" not in SFTConfig(task_reminder=False).env_options()
    assert cfg.expert_options() == {"click_by": "index", "query": "instruction", "arg_space": True,
                                    "price_clause": True, "order_refs": "title"}
    assert (cfg.context_mode, cfg.curriculum_steps, cfg.augment_copies, cfg.families) == \
        ("concat", 2000, 1, ("find_and_buy",))
    assert not cfg.pins_first_turn and SFTConfig(context_mode="window").pins_first_turn
    assert not SFTConfig(context_mode="window", obs_mode="compact").pins_first_turn
    assert SFTConfig(env_kwargs={"results_per_page": 7}).env_options()["results_per_page"] == 7
    assert SFTConfig(families="a,b").families == ("a", "b")


def test_sft_is_deterministic(expert_trajs, tmp_path):
    cfg = plain(steps=5, batch_size=4, size="tiny", eval_every=0, eval_episodes=2, num_envs=2,
                    reset_options=FIND, max_new_tokens=8)
    runs = [train_sft(ENV, expert_trajs[:10], cfg, out_dir=tmp_path / str(i), progress=False)[1] for i in range(2)]
    assert [h["loss"] for h in runs[0]] == [h["loss"] for h in runs[1]]


def test_bf16_autocast_trains_in_bfloat16_and_keeps_float32_weights(expert_trajs, tmp_path):
    """autocast="bf16" runs the step in bfloat16 (its losses differ from float32's by bfloat16 rounding, not
    more), keeps float32 weights in the checkpoint, learns as fast, and is deterministic."""
    cfg = dict(steps=40, batch_size=8, lr=5e-3, warmup=5, size="tiny", eval_every=0, eval_episodes=2, num_envs=2,
               reset_options=FIND, max_new_tokens=8)
    fp32 = train_sft(ENV, expert_trajs, plain(**cfg), out_dir=tmp_path / "fp32", progress=False)[1]
    runs = [train_sft(ENV, expert_trajs, plain(**cfg, autocast="bf16"), out_dir=tmp_path / f"bf16-{i}",
                      progress=False) for i in range(2)]
    bf16 = runs[0][1]
    assert [h["loss"] for h in bf16] == [h["loss"] for h in runs[1][1]]
    assert bf16[0]["loss"] != fp32[0]["loss"] and abs(bf16[0]["loss"] - fp32[0]["loss"]) < 0.02 * fp32[0]["loss"]
    assert np.mean([h["loss"] for h in bf16[-5:]]) < 1.2 * np.mean([h["loss"] for h in fp32[-5:]])
    assert {p.dtype for p in runs[0][0].model.parameters()} == {torch.float32}
    saved = json.loads((tmp_path / "bf16-0" / "checkpoint" / "config.json").read_text())
    assert saved["dtype"] == "float32"
    with pytest.raises(ConfigError, match="autocast"):
        SFTConfig(autocast="fp16")


def test_interrupted_sft_resumes_on_the_same_batches(expert_trajs, tmp_path):
    cfg = plain(steps=6, batch_size=4, size="tiny", eval_every=3, eval_episodes=2, num_envs=2,
                reset_options=FIND, max_new_tokens=8)
    full = train_sft(ENV, expert_trajs[:10], cfg, out_dir=tmp_path / "full", progress=False)[1]

    class Stop(Exception):
        pass

    def stop_after_4(rec):
        if rec["step"] == 4:
            raise Stop

    with pytest.raises(Stop):
        train_sft(ENV, expert_trajs[:10], cfg, out_dir=tmp_path / "cut", progress=False, callback=stop_after_4)
    assert (tmp_path / "cut" / RESUME_STATE).is_file()
    steps_run = []
    agent, resumed = train_sft(ENV, expert_trajs[:10], cfg, out_dir=tmp_path / "cut", progress=False,
                               callback=lambda r: steps_run.append(r["step"]))
    assert steps_run == [4, 5, 6]  # continued after the step-3 checkpoint, step 4 redone
    assert [h["loss"] for h in resumed] == [h["loss"] for h in full]
    assert not (tmp_path / "cut" / RESUME_STATE).exists()
    with pytest.raises(ConfigError, match="other options"):
        save_state(tmp_path / "cut" / RESUME_STATE, {"config": {**vars(cfg), "lr": 1.0}})
        train_sft(ENV, expert_trajs[:10], cfg, out_dir=tmp_path / "cut", progress=False)


def test_a_crafted_sft_resume_state_is_refused_unread(expert_trajs, tmp_path):
    """An SFT run folder whose resume state is a crafted pickle (under the old name or the new one) is refused
    with a message saying to delete it, and the pickle never runs."""
    cfg = plain(steps=2, batch_size=4, size="tiny", eval_every=0, num_envs=1, max_new_tokens=4)
    out, marker = tmp_path / "run", tmp_path / "ran"
    (out / "checkpoint").mkdir(parents=True)
    (out / "checkpoint" / "config.json").write_text("{}")  # an interrupted run: its resume state is read
    plant_pickle(out / LEGACY_RESUME_STATE, marker)
    with pytest.raises(ConfigError, match=f"{LEGACY_RESUME_STATE} is the resume state of an older shopsim"):
        train_sft(ENV, expert_trajs[:4], cfg, out_dir=out, progress=False)
    (out / LEGACY_RESUME_STATE).rename(out / RESUME_STATE)
    with pytest.raises(ConfigError, match="not a shopsim state file.*delete it"):
        train_sft(ENV, expert_trajs[:4], cfg, out_dir=out, progress=False)
    assert not marker.exists()


def test_bad_config():
    with pytest.raises(ConfigError):
        SFTConfig(steps=0)
    with pytest.raises(ConfigError, match="context_mode"):
        SFTConfig(context_mode="both")


@pytest.mark.slow
def test_full_sft_beats_random_on_success(tmp_path):
    """The shipped recipe at reduced length: held-out success well above the random agent's (near 0)."""
    torch.set_num_threads(2)
    trajs = expert_trajectories(ENV, 300, reset_options=FIND, progress=False)
    cfg = plain(steps=300, size="mini", lr=3e-3, eval_every=0, eval_episodes=40, reset_options=FIND)
    _, hist = train_sft(ENV, trajs, cfg, out_dir=tmp_path, progress=False)
    rand = evaluate(agents.make("random", ENV), ENV, episodes=40, reset_options=FIND)
    assert hist[-1]["eval_success"] >= rand["success"] + 0.2


def test_curriculum_draws_the_shortest_rows_first_with_the_same_token_budget(expert_trajs, tmp_path):
    tok = load_tokenizer()
    rows = build_examples(expert_trajs, ChatFormat(tok), history=1, history_obs_chars=100)
    lengths = sorted(len(r[0]) for r in rows)
    cutoff = lengths[int(np.ceil(0.25 * len(lengths))) - 1]
    seen = []
    cfg = plain(steps=8, batch_size=4, size="tiny", eval_every=0, eval_episodes=2, num_envs=2,
                    reset_options=FIND, max_new_tokens=8, curriculum_steps=5, curriculum_share=0.25, warmup=2,
                    lr=1e-3)
    train_sft(ENV, expert_trajs, cfg, out_dir=tmp_path, progress=False, tokenizer=tok, callback=seen.append)
    tokens = np.diff([0] + [h["tokens_seen"] for h in seen])
    per_row = tokens / np.array([h["rows"] for h in seen])
    # shorter rows, so more of them per batch (a chunk's last batch may be partial); then the normal batch size
    assert max(h["rows"] for h in seen[:5]) > 4 and all(h["rows"] <= 4 for h in seen[5:])
    assert per_row[:5].max() <= cutoff < per_row[5:].max()
    # warm-up then constant during the curriculum; the main phase restarts its warm-up
    assert [h["lr"] for h in seen[:6]] == pytest.approx([5e-4, 1e-3, 1e-3, 1e-3, 1e-3, 5e-4])
    with pytest.raises(ConfigError, match="curriculum_share"):
        SFTConfig(curriculum_share=0.0)


def test_sft_on_several_families_collects_and_evaluates_each(tmp_path):
    fams = ("find_and_buy", "clarify_and_buy")
    trajs = expert_trajectories(ENV, 5, progress=False, num_envs=2, families=fams)
    assert [t.meta["family"] for t in trajs] == ["find_and_buy"] * 3 + ["clarify_and_buy"] * 2
    cfg = plain(steps=2, batch_size=4, size="tiny", eval_every=0, eval_episodes=4, num_envs=2,
                    max_new_tokens=8, families=fams, augment_copies=1)
    _, hist = train_sft(ENV, trajs, cfg, out_dir=tmp_path, progress=False)
    assert hist[-1]["eval_episodes"] == 4
    assert {"eval_success/find_and_buy", "eval_success/clarify_and_buy"} <= set(hist[-1])


def test_evaluation_of_all_families_takes_an_equal_share_of_each():
    """families=() on Shopping: the first dev tasks, which interleave the four families (not the env's random
    default mix), so that every family's success is measured on the same number of episodes."""
    from shopsim.envs.shopping import FAMILIES

    expert = agents.make("expert", ENV)
    out = evaluate(expert, ENV, episodes=4, num_envs=4)
    assert out["episodes"] == 4
    assert {f"success/{f}" for f in FAMILIES} <= set(out)
    assert all(out[f"success/{f}"] == 1.0 for f in FAMILIES)  # one task of each family, each solved


def test_sft_command_runs_and_rejects_a_bad_family(tmp_path, capsys):
    from shopsim.app.cli import main

    assert main(["sft", "--expert-episodes", "4", "--steps", "3", "--curriculum-steps", "2", "--size", "tiny",
                 "--eval-episodes", "2", "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    assert (tmp_path / "run" / "checkpoint" / "config.json").is_file()
    manifest = (tmp_path / "run" / "checkpoint" / "shopsim_agent.json").read_text()
    assert '"numbered_results": true' in manifest and '"curriculum_steps": 2' in manifest
    assert main(["sft", "--expert-episodes", "4", "--family", "find_and_buy,nope", "--out",
                 str(tmp_path / "bad")]) == 2
    assert "nope" in capsys.readouterr().err
    # a second stage started from the first: its manifest names the start and the start's options
    assert main(["sft", "--init", str(tmp_path / "run" / "checkpoint"), "--expert-episodes", "4", "--family", "all",
                 "--steps", "2", "--curriculum-steps", "0", "--eval-episodes", "4",
                 "--out", str(tmp_path / "stage2"), "--no-progress"]) == 0
    stage2 = json.loads((tmp_path / "stage2" / "checkpoint" / "shopsim_agent.json").read_text())
    assert stage2["init"]["path"] == str(tmp_path / "run" / "checkpoint")
    assert stage2["init"]["sft"]["curriculum_steps"] == 2 and stage2["init"]["sft"]["size"] == "tiny"
    assert stage2["sft"]["families"] == [] and stage2["env_kwargs"]["order_refs"] == "position"


def test_sft_command_run_again_reuses_a_finished_stage_and_retrains_a_changed_one(tmp_path, capsys):
    """A staged recipe run again skips its finished stages: the same options, start and data reuse OUT untouched;
    other data (or an interrupted run) trains."""
    from shopsim.app.cli import main

    out = tmp_path / "run"
    argv = ["sft", "--expert-episodes", "4", "--steps", "2", "--curriculum-steps", "0", "--size", "tiny",
            "--eval-episodes", "2", "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    weights = out / "checkpoint" / "model.safetensors"
    first = weights.read_bytes(), weights.stat().st_mtime_ns
    manifest = json.loads((out / "checkpoint" / "shopsim_agent.json").read_text())
    assert manifest["data"] == {"expert_episodes": 4} and "step" not in manifest
    stage2 = ["sft", "--init", str(out / "checkpoint"), "--expert-episodes", "4", "--steps", "2",
              "--curriculum-steps", "0", "--size", "tiny", "--eval-episodes", "2", "--out", str(tmp_path / "s2"),
              "--no-progress"]
    assert main(stage2) == 0
    capsys.readouterr()
    assert main(argv) == 0 and main(stage2) == 0
    assert capsys.readouterr().out.count("already holds this finished run") == 2
    assert (weights.read_bytes(), weights.stat().st_mtime_ns) == first
    assert main([*argv[:2], "5", *argv[3:]]) == 0  # 5 expert episodes: other data, trained anew
    assert "already holds" not in capsys.readouterr().out and weights.stat().st_mtime_ns != first[1]
    assert main(stage2) == 0  # its start was retrained (other weights): trained anew too
    assert "already holds" not in capsys.readouterr().out
    cfg = SFTConfig(**json.loads((out / "checkpoint" / "shopsim_agent.json").read_text())["sft"])
    assert finished_run(out, cfg, data={"expert_episodes": 5}) == out / "checkpoint"
    assert finished_run(out, cfg, data={"expert_episodes": 4}) is None
    assert finished_run(out, SFTConfig(**{**vars(cfg), "lr": 1.0}), data={"expert_episodes": 5}) is None
    assert finished_run(out, cfg, init={"path": "x"}, data={"expert_episodes": 5}) is None
    (out / RESUME_STATE).write_bytes(b"")  # an interrupted run's resume state: not finished
    assert finished_run(out, cfg, data={"expert_episodes": 5}) is None


def test_files_digest_names_a_dataset_by_its_bytes(tmp_path):
    """The data record of `shopsim sft --data`: same bytes same digest; other bytes, or another file in a folder,
    another digest."""
    from shopsim.paths import files_digest

    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.parquet").write_bytes(b"abc")
    one = files_digest(tmp_path / "d")
    assert files_digest(tmp_path / "d") == one and len(one) == 64
    (tmp_path / "d" / "b.parquet").write_bytes(b"")
    assert files_digest(tmp_path / "d") != one
    (tmp_path / "d" / "b.parquet").unlink()
    (tmp_path / "d" / "a.parquet").write_bytes(b"abd")
    assert files_digest(tmp_path / "d") != one


def test_concat_curriculum_trains_on_each_episode_cut_after_its_first_action(expert_trajs, tmp_path):
    from agents.lm.sft import first_turn

    tok = load_tokenizer()
    fmt = ChatFormat(tok)
    rows = build_examples(expert_trajs, fmt, mode="concat")
    firsts = [first_turn(r) for r in rows]
    for (ids, mask), (fids, fmask) in zip(rows, firsts, strict=False):
        assert ids[: len(fids)] == fids and fmask[-1] and fmask[-1] == mask[len(fmask) - 1]
        agent = [i for i, m in zip(fids, fmask, strict=False) if m]
        assert agent[-1] == tok.eos_token_id and agent.count(tok.eos_token_id) == 1  # exactly one action
    seen = []
    cfg = plain(steps=6, batch_size=2, size="tiny", eval_every=0, eval_episodes=2, num_envs=2,
                    reset_options=FIND, max_new_tokens=8, curriculum_steps=4, warmup=2, lr=1e-3,
                    context_mode="concat")
    train_sft(ENV, expert_trajs, cfg, out_dir=tmp_path, progress=False, tokenizer=tok, callback=seen.append)
    longest_first = max(len(f[0]) for f in firsts)
    tokens = np.diff([0] + [h["tokens_seen"] for h in seen])
    per_row = tokens / np.array([h["rows"] for h in seen])
    assert per_row[:4].max() <= longest_first < per_row[4:].max()
    # one action per curriculum row: agent tokens per row are one action's length
    assert all(h["agent_tokens"] / h["rows"] < 20 for h in seen[:4])


def test_clarify_hint_names_each_slot_with_the_tokens_the_question_copies():
    """The expert asks "Which <slot> would you like?"; the hint must spell every option slot with the same BPE
    tokens (a leading blank, not "(color"), so that the question is a token copy of the task line."""
    from agents.shopping_expert import _question
    from shopsim.catalog import load_catalog
    from shopsim.envs.shopping.tasks import make_task

    tok = load_tokenizer()
    cat = load_catalog(2000, 0)
    checked = 0
    for task_id in range(60):
        task = make_task(cat, "clarify_and_buy", "train", task_id)
        hint_ids = tok(task.instruction)["input_ids"]
        for kind, name in task.hidden:
            if kind != "option":
                continue
            slot_ids = tok(" " + name)["input_ids"]
            question_ids = tok(" " + _question([kind, name]))["input_ids"]  # as in "ask[ Which ...]"
            for ids in (question_ids, hint_ids):
                assert any(ids[i:i + len(slot_ids)] == slot_ids for i in range(len(ids))), (task.instruction, name)
            checked += 1
    assert checked >= 20
