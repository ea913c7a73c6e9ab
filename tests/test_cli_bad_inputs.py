"""Bad command-line inputs a new user hits: each ends with exit status 2 and one line on stderr, before any work.

The table runs `shopsim.app.cli.main` in-process. The functions that do a command's work (evaluation, rollouts, the
viewer, rendering) are replaced by ones that fail the test, so a check that comes only after the work (an
unwritable ``--out`` found once the evaluation has run) fails here too. The tests after the table check what the
fixes produce on good input: the checkpoint's leaderboard name and budget, ``rollout --family``, no success rate for
cost envs, and README commands whose checkpoint paths match.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from shopsim.app.cli import main

ROOT = Path(__file__).resolve().parents[1]
RETRIEVAL = "shopsim/TwoStageRetrieval-v0"
REPLENISHMENT = "shopsim/Replenishment-v0"
SHOPPING = "shopsim/Shopping-v0"
TINY_EVAL = ["--tasks", "1", "--seeds", "0", "--tries", "1", "--no-progress"]
LONG_NAME = "x" * 300 + ".json"  # longer than any file system's name limit (255 bytes)


@pytest.fixture(scope="module")
def retrieval_run(tmp_path_factory):
    """A real TwoStageRetrieval checkpoint (CA-PG, one iteration), in a run folder named like `shopsim train`'s
    default ``runs/<algo>-seed<S>``."""
    import baselines

    run = tmp_path_factory.mktemp("ckpt") / "runs" / "capg-seed0"
    algo = baselines.make("capg", env_id=RETRIEVAL)
    result = algo.train(RETRIEVAL, iterations=1, seed=0, out_dir=run, progress=False)
    return Path(result.checkpoint)


@pytest.fixture(scope="module")
def results_dir(tmp_path_factory):
    """A folder with one valid results file (so a bad sibling cannot hide behind an empty leaderboard)."""
    from shopsim.leaderboard.protocols import load_protocol
    from shopsim.leaderboard.results import make_results, write_results

    folder = tmp_path_factory.mktemp("results")
    protocol = load_protocol(REPLENISHMENT).limited(tasks=1, seeds=[0], tries=1)
    metric = {"mean": 10.0, "std": 0.0, "ci95": None, "n": 1, "per_seed": [10.0]}
    write_results(folder / "good.json", make_results(protocol=protocol, entry="s_S", kind="reference",
                                                     metrics={"cost": metric}))
    return folder


@pytest.fixture
def no_work(monkeypatch):
    """Make every command's work fail the test: the bad input must be refused before it."""

    def forbidden(*args, **kwargs):
        raise AssertionError("the command started its work before refusing the bad input")

    import shopsim.leaderboard.evaluate
    import shopsim.leaderboard.render
    import shopsim.leaderboard.viewer
    import shopsim.rollout

    monkeypatch.setattr(shopsim.leaderboard.evaluate, "evaluate", forbidden)
    monkeypatch.setattr(shopsim.rollout, "collect", forbidden)
    monkeypatch.setattr(shopsim.leaderboard.viewer, "write_viewer", forbidden)
    monkeypatch.setattr(shopsim.leaderboard.render, "render_all", forbidden)


def _file(tmp: Path) -> Path:
    """A plain file, used where a folder is needed."""
    path = tmp / "a-file"
    path.write_text("x")
    return path


def _dir(tmp: Path) -> Path:
    (tmp / "a-folder").mkdir(exist_ok=True)
    return tmp / "a-folder"


def _manifest_only(tmp: Path, checkpoint: Path) -> Path:
    """A copy of `checkpoint` with its manifest but without its weights (an interrupted copy)."""
    folder = tmp / "partial"
    folder.mkdir()
    (folder / "shopsim_agent.json").write_text((checkpoint / "shopsim_agent.json").read_text())
    return folder


def _leaderboard_with(content: str, name: str):
    def build(tmp: Path, results: Path) -> list[str]:
        folder = tmp / "res"
        folder.mkdir()
        (folder / "good.json").write_text((results / "good.json").read_text())
        (folder / "Replenishment-v0").mkdir()
        (folder / "Replenishment-v0" / name).write_text(content)
        return ["leaderboard", "--results", str(folder), "--out", str(tmp / "board"), "--no-plots"]

    return build


def _truncated(tmp: Path, results: Path) -> list[str]:
    text = (results / "good.json").read_text()
    return _leaderboard_with(text[: len(text) // 2], "hpo.json")(tmp, results)


def _damaged_lm(tmp: Path) -> Path:
    """A saved LM checkpoint whose ``model.safetensors`` was cut short (a kill during a save or a copy)."""
    import contextlib
    import io

    from agents.lm.agent import LMAgent
    from agents.lm.model import build_model
    from agents.lm.tokenizer import load_tokenizer

    tok = load_tokenizer()
    with contextlib.redirect_stderr(io.StringIO()):  # save_pretrained's progress bar is not the command's output
        folder = LMAgent(env_id=SHOPPING, model=build_model(tok, size="tiny"), tokenizer=tok).save(tmp / "lm")
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    return folder


def _copy_with(tmp: Path, checkpoint: Path, *, cut: str | None = None, **manifest) -> Path:
    """A copy of `checkpoint` with the file `cut` cut in half and the manifest entries `manifest` replaced."""
    import shutil

    folder = shutil.copytree(checkpoint, tmp / "copy")
    if cut:
        (folder / cut).write_bytes((checkpoint / cut).read_bytes()[: (checkpoint / cut).stat().st_size // 2])
    path = folder / "shopsim_agent.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **manifest}))
    return folder


# (case id, argv builder (tmp folder, retrieval checkpoint, results folder) -> argv, text(s) the error line must hold)
CASES = [
    # an unwritable --out, refused before any work
    ("rollout-out-under-a-file",
     lambda t, c, r: ["rollout", "--env", SHOPPING, "--agent", "random", "--episodes", "1", "--no-progress",
                      "--out", str(_file(t) / "sub" / "x.parquet")], "a-file is a file, not a folder"),
    ("rollout-out-name-too-long",
     lambda t, c, r: ["rollout", "--env", SHOPPING, "--agent", "random", "--episodes", "1", "--no-progress",
                      "--out", str(t / LONG_NAME)], "cannot be written"),
    ("eval-out-under-a-file",
     lambda t, c, r: ["eval", "--env", REPLENISHMENT, "--agent", "s_S", *TINY_EVAL,
                      "--out", str(_file(t) / "r.json")], "choose a writable path"),
    ("eval-out-name-too-long",
     lambda t, c, r: ["eval", "--env", REPLENISHMENT, "--agent", "s_S", *TINY_EVAL, "--out", str(t / LONG_NAME)],
     "cannot be written"),
    ("eval-out-is-a-folder",
     lambda t, c, r: ["eval", "--env", REPLENISHMENT, "--agent", "s_S", *TINY_EVAL, "--out", str(_dir(t))],
     "is a folder; give a file path"),
    ("eval-out-empty",
     lambda t, c, r: ["eval", "--env", REPLENISHMENT, "--agent", "s_S", *TINY_EVAL, "--out", ""], "--out is empty"),
    ("view-out-under-a-file",
     lambda t, c, r: ["view", str(t / "d.parquet"), "--out", str(_file(t) / "v.html")], "choose a writable path"),
    ("view-out-name-too-long",
     lambda t, c, r: ["view", str(t / "d.parquet"), "--out", str(t / (LONG_NAME + ".html"))], "cannot be written"),
    ("leaderboard-out-is-a-file",
     lambda t, c, r: ["leaderboard", "--results", str(r), "--out", str(_file(t)), "--no-plots"],
     "is a file; give a folder path"),
    # a checkpoint of another env
    ("eval-retrieval-checkpoint-on-shopping",
     lambda t, c, r: ["eval", "--env", SHOPPING, "--checkpoint", str(c), *TINY_EVAL, "--out", str(t / "r.json")],
     f"checkpoint for {RETRIEVAL}"),
    ("rollout-retrieval-checkpoint-on-shopping",
     lambda t, c, r: ["rollout", "--env", SHOPPING, "--agent", "random", "--checkpoint", str(c), "--episodes", "1",
                      "--no-progress", "--out", str(t / "x.parquet")], f"use --env {RETRIEVAL}"),
    # the README's eval path next to the run `shopsim train` wrote under its default name
    ("eval-checkpoint-of-default-run-name",
     lambda t, c, r: ["eval", "--env", RETRIEVAL, "--checkpoint", str(c.parent.parent / "capg" / "checkpoint"),
                      *TINY_EVAL, "--out", str(t / "r.json")],
     ("did you mean ", f"{Path('capg-seed0', 'checkpoint')}?")),
    # results files that are not results
    ("leaderboard-truncated-json", lambda t, c, r: _truncated(t, r), "hpo.json: not valid JSON"),
    ("leaderboard-empty-json", lambda t, c, r: _leaderboard_with("", "hpo.json")(t, r), "hpo.json: empty file"),
    ("leaderboard-foreign-json", lambda t, c, r: _leaderboard_with('{"lr": 0.1}', "config.json")(t, r),
     "config.json: not a shopsim results file"),
    ("leaderboard-json-list", lambda t, c, r: _leaderboard_with("[1, 2]", "x.json")(t, r),
     "x.json: not a shopsim results file"),
    # rollout --family
    ("rollout-unknown-family",
     lambda t, c, r: ["rollout", "--env", SHOPPING, "--agent", "expert", "--family", "find_and_buy", "gifts",
                      "--episodes", "1", "--out", str(t / "x.parquet")], "'gifts' is not a Shopping task family"),
    ("rollout-family-on-a-cost-env",
     lambda t, c, r: ["rollout", "--env", REPLENISHMENT, "--agent", "s_S", "--family", "bundle", "--episodes", "1",
                      "--out", str(t / "x.parquet")], "has no task families"),
    # damaged weights (a kill during a save or a copy)
    ("eval-truncated-lm-weights",
     lambda t, c, r: ["eval", "--env", SHOPPING, "--checkpoint", str(_damaged_lm(t)), *TINY_EVAL,
                      "--out", str(t / "r.json")], ("the model weights are damaged", "copy or save the checkpoint")),
    ("rollout-truncated-lm-weights",
     lambda t, c, r: ["rollout", "--env", SHOPPING, "--agent", "lm", "--checkpoint", str(_damaged_lm(t)),
                      "--episodes", "1", "--no-progress", "--out", str(t / "x.parquet")],
     "the model weights are damaged"),
    ("sft-init-truncated-lm-weights",
     lambda t, c, r: ["sft", "--init", str(_damaged_lm(t)), "--expert-episodes", "2", "--steps", "1",
                      "--no-progress", "--out", str(t / "sft")], "the model weights are damaged"),
    ("eval-truncated-retriever-weights",
     lambda t, c, r: ["eval", "--env", RETRIEVAL, "--checkpoint", str(_copy_with(t, c, cut="retriever.pt")),
                      *TINY_EVAL, "--out", str(t / "r.json")], "retriever.pt is damaged or not a weights file"),
    # env options, checked against each env's declared options before any work
    ("eval-misspelled-shopping-option",
     lambda t, c, r: ["eval", "--env", SHOPPING, "--agent", "expert", "--env-kwargs", '{"max_turn": 5}', *TINY_EVAL,
                      "--out", str(t / "r.json")],
     ("--env-kwargs: shopsim/Shopping-v0 has no option 'max_turn'", "did you mean 'max_turns'?")),
    ("eval-wrongly-typed-env-option",
     lambda t, c, r: ["eval", "--env", REPLENISHMENT, "--agent", "s_S", "--env-kwargs", '{"horizon": "long"}',
                      *TINY_EVAL, "--out", str(t / "r.json")],
     "shopsim/Replenishment-v0 option horizon: expected an int, got 'long'"),
    ("rollout-checkpoint-with-a-misspelled-env-option",
     lambda t, c, r: ["rollout", "--env", RETRIEVAL, "--agent", "random", "--episodes", "1", "--no-progress",
                      "--checkpoint", str(_copy_with(t, c, env_kwargs={"n_item": 50})), "--out", str(t / "x.parquet")],
     ("shopsim_agent.json env_kwargs: shopsim/TwoStageRetrieval-v0 has no option 'n_item'", "'n_items'")),
    # a checkpoint manifest naming code that is not a shopsim agent
    ("eval-checkpoint-naming-another-module",
     lambda t, c, r: ["eval", "--env", RETRIEVAL, "--checkpoint", str(_copy_with(t, c, **{"class": "this:Nothing"})),
                      *TINY_EVAL, "--out", str(t / "r.json")], "'this:Nothing' is not a shopsim agent"),
    # a few of the inputs that already gave one line, kept that way
    ("eval-unknown-env",
     lambda t, c, r: ["eval", "--env", "shopsim/Nope-v0", "--agent", "expert", "--out", str(t / "r.json")],
     "unknown env"),
    ("rollout-unknown-agent",
     lambda t, c, r: ["rollout", "--env", SHOPPING, "--agent", "nope", "--episodes", "1", "--out",
                      str(t / "x.parquet")], "unknown agent 'nope'"),
    ("eval-env-kwargs-not-an-object",
     lambda t, c, r: ["eval", "--env", REPLENISHMENT, "--agent", "s_S", "--env-kwargs", "[1]", *TINY_EVAL,
                      "--out", str(t / "r.json")], "--env-kwargs must be a JSON object"),
    ("eval-checkpoint-without-manifest",
     lambda t, c, r: ["eval", "--env", RETRIEVAL, "--checkpoint", str(_dir(t)), *TINY_EVAL, "--out",
                      str(t / "r.json")], "not a shopsim checkpoint"),
    ("eval-checkpoint-without-weights",
     lambda t, c, r: ["eval", "--env", RETRIEVAL, "--checkpoint", str(_manifest_only(t, c)), *TINY_EVAL, "--out",
                      str(t / "r.json")], "is an incomplete checkpoint"),
    ("eval-checkpoint-is-a-file",
     lambda t, c, r: ["eval", "--env", RETRIEVAL, "--checkpoint", str(c / "shopsim_agent.json"), *TINY_EVAL,
                      "--out", str(t / "r.json")], "is a file, not a shopsim checkpoint folder"),
    ("leaderboard-missing-folder",
     lambda t, c, r: ["leaderboard", "--results", str(t / "nope"), "--out", str(t / "board")], "no such folder"),
    # shopsim serve: every check before the "serving" line (and before any env is built)
    ("serve-unknown-env", lambda t, c, r: ["serve", "--env", "shopsim/Nope-v0", "--port", "0"],
     "shopsim serve exposes shopsim/Shopping-v0"),
    ("serve-port-in-use", lambda t, c, r: ["serve", "--port", str(_busy_port()), "--env-kwargs",
                                           '{"catalog_size": 2000}'], ("is in use", "choose another --port")),
    ("serve-misspelled-env-option", lambda t, c, r: ["serve", "--port", "0", "--env-kwargs", '{"max_turn": 5}'],
     "'max_turn'"),
    # Ray: an address where nothing listens, more workers than CPUs
    ("rollout-ray-address-nothing-listening",
     lambda t, c, r: ["rollout", "--env", REPLENISHMENT, "--agent", "s_S", "--episodes", "1", "--no-progress",
                      "--ray-address", "127.0.0.1:1", "--out", str(t / "d")], "127.0.0.1:1: nothing listens there"),
    ("rollout-more-workers-than-cpus",
     lambda t, c, r: ["rollout", "--env", REPLENISHMENT, "--agent", "s_S", "--episodes", "1", "--no-progress",
                      "--workers", str(_cpus() + 1), "--out", str(t / "d")], "lower --workers"),
    # results files and entry names the leaderboard would show wrongly
    ("leaderboard-nan-mean", lambda t, c, r: _leaderboard_with(_nan_mean(r), "nan.json")(t, r),
     "nan.json: holds NaN"),
    ("eval-name-too-long",
     lambda t, c, r: ["eval", "--env", REPLENISHMENT, "--agent", "s_S", "--name", "x" * 20_000, *TINY_EVAL,
                      "--out", str(t / "r.json")], "--name is 20000 characters long"),
    ("eval-name-with-a-bidi-override",
     lambda t, c, r: ["eval", "--env", REPLENISHMENT, "--agent", "s_S", "--name", "evil\u202egnp.exe", *TINY_EVAL,
                      "--out", str(t / "r.json")], "bidirectional-text control U+202E"),
]

#: sockets held open for the test session, so the port they hold stays in use
_HELD: list = []


def _busy_port() -> int:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    _HELD.append(s)
    return s.getsockname()[1]


def _cpus() -> int:
    from shopsim.distributed import usable_cpus

    return usable_cpus()


def _nan_mean(results: Path) -> str:
    """The valid results file with its mean replaced by NaN (Python's json writes and reads that, JSON has none)."""
    text = (results / "good.json").read_text()
    assert '"mean": 10.0' in text
    return text.replace('"mean": 10.0', '"mean": NaN')


@pytest.mark.parametrize(("argv", "expected"), [pytest.param(build, text, id=name) for name, build, text in CASES])
def test_bad_input_is_one_line_and_exit_2(argv, expected, tmp_path, retrieval_run, results_dir, capsys, no_work):
    args = argv(tmp_path, retrieval_run, results_dir)
    code = main(args)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2, err
    assert len(lines) == 1, err
    assert lines[0].startswith(f"shopsim {args[0]}: error: "), lines[0]
    for text in (expected,) if isinstance(expected, str) else expected:
        assert text in lines[0], lines[0]


def test_unwritable_out_check_leaves_no_probe_behind(tmp_path):
    from shopsim.app.commands import writable_output

    assert writable_output(tmp_path / "new" / "deeper" / "r.json") == tmp_path / "new" / "deeper" / "r.json"
    assert writable_output(tmp_path / "board", is_dir=True).is_dir()
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["board", "deeper", "new"]  # folders made, no files


def test_checkpoint_without_name_is_listed_by_run_and_budget(tmp_path, retrieval_run, capsys):
    """`eval --checkpoint` without --name: the entry is the run folder, with its algorithm and the iterations it
    trained (here from the run's metrics.csv); the leaderboard shows that budget."""
    out = tmp_path / "res" / "r.json"
    assert main(["eval", "--env", RETRIEVAL, "--checkpoint", str(retrieval_run), *TINY_EVAL, "--out", str(out)]) == 0
    rec = json.loads(out.read_text())
    assert rec["entry"] == "capg-seed0" and rec["algorithm"] == "capg"
    assert rec["budget"] == {"iterations": 1, "train_seed": 0}
    assert main(["leaderboard", "--results", str(tmp_path / "res"), "--out", str(tmp_path / "b"), "--no-plots"]) == 0
    row = next(ln for ln in capsys.readouterr().out.splitlines() if "| capg-seed0 " in ln)  # after the rank
    assert "| 1 it |" in row
    assert main(["leaderboard", "--results", str(out), "--out", str(tmp_path / "b1"), "--no-plots"]) == 0  # one file
    assert "| capg-seed0 " in capsys.readouterr().out


def test_checkpoint_name_prefixes_the_algorithm(tmp_path):
    from shopsim.app.commands.eval import checkpoint_budget, checkpoint_entry_name

    assert checkpoint_entry_name(tmp_path / "runs" / "mine" / "checkpoint", {"algorithm": "hpo"}) == "hpo/mine"
    assert checkpoint_entry_name(tmp_path / "runs" / "HPO-2" / "checkpoint", {"algorithm": "hpo"}) == "HPO-2"
    assert checkpoint_entry_name(tmp_path / "sft", {}) == "sft"
    assert checkpoint_budget(tmp_path / "x" / "checkpoint", {"iterations": 7, "seed": 3}) == {"iterations": 7,
                                                                                              "train_seed": 3}
    assert checkpoint_budget(tmp_path / "x" / "checkpoint", {"seed": 3}) is None  # nothing records a budget


def _families(path: Path) -> list[str]:
    from shopsim.datasets import read_trajectories

    return [t.meta["family"] for t in read_trajectories(path)]


def test_rollout_family_chooses_the_tasks(tmp_path, capsys):
    out = tmp_path / "x.parquet"
    assert main(["rollout", "--env", SHOPPING, "--agent", "expert", "--family", "bundle", "--episodes", "2",
                 "--no-progress", "--out", str(out)]) == 0
    assert _families(out) == ["bundle", "bundle"]
    assert main(["rollout", "--env", SHOPPING, "--agent", "expert", "--family", "find_and_buy", "after_sales",
                 "--episodes", "3", "--no-progress", "--out", str(out)]) == 0
    assert _families(out) == ["find_and_buy", "after_sales", "find_and_buy"]
    assert main(["rollout", "--env", SHOPPING, "--agent", "expert", "--episodes", "4", "--no-progress",
                 "--out", str(out)]) == 0
    assert len(set(_families(out))) > 1  # without --family (and no checkpoint): the env's mix


def test_rollout_of_a_checkpoint_uses_its_families_and_rendering(tmp_path, capsys):
    """A checkpoint whose manifest records its training families and env options rolls out on those: an SFT model
    trained on clarify_and_buy with numbered results gets clarify_and_buy tasks rendered that way."""
    from agents.lm.agent import LMAgent
    from agents.lm.model import build_model
    from agents.lm.tokenizer import load_tokenizer

    tok = load_tokenizer()
    lm = LMAgent(env_id=SHOPPING, model=build_model(tok, size="tiny"), tokenizer=tok, max_new_tokens=4)
    lm.save(tmp_path / "sft", env_kwargs={"numbered_results": True, "max_invalid": 1},
            sft={"families": ["clarify_and_buy"]})
    out = tmp_path / "x.parquet"
    assert main(["rollout", "--env", SHOPPING, "--agent", "lm", "--checkpoint", str(tmp_path / "sft"),
                 "--episodes", "2", "--num-envs", "2", "--no-progress", "--out", str(out)]) == 0
    assert "clarify_and_buy tasks" in capsys.readouterr().out
    assert _families(out) == ["clarify_and_buy", "clarify_and_buy"]
    from shopsim.datasets import read_metadata

    assert read_metadata(out)["env_kwargs"] == {"numbered_results": True, "max_invalid": 1}
    assert main(["rollout", "--env", SHOPPING, "--agent", "lm", "--checkpoint", str(tmp_path / "sft"),
                 "--family", "bundle", "--episodes", "1", "--no-progress", "--out", str(out)]) == 0
    assert _families(out) == ["bundle"]  # --family overrides the manifest


def test_cost_env_reports_no_success(tmp_path, capsys):
    """Replenishment defines no success: its results carry no success_rate or pass^k (the table shows "—"), and
    `rollout` prints no success rate; Shopping keeps both."""
    from shopsim.leaderboard.metrics import seed_summary

    out = tmp_path / "r.json"
    assert main(["eval", "--env", REPLENISHMENT, "--agent", "expert", *TINY_EVAL, "--out", str(out)]) == 0
    metrics = json.loads(out.read_text())["metrics"]
    assert "cost" in metrics and not {"success", "success_rate", "pass^1"} & set(metrics)
    assert main(["rollout", "--env", REPLENISHMENT, "--agent", "expert", "--episodes", "1", "--no-progress",
                 "--out", str(tmp_path / "x.parquet")]) == 0
    printed = capsys.readouterr().out
    assert "score" in printed and "success" not in printed
    cost = [{"task_id": 1, "success": None, "cost": 3.0}, {"task_id": 1, "success": None, "cost": 5.0}]
    assert seed_summary(cost, tries=2) == {"cost": 4.0, "episodes": 2.0}
    shop = [{"task_id": 1, "success": 1.0}, {"task_id": 1, "success": 0.0}]
    assert seed_summary(shop, tries=2)["success_rate"] == 0.5 and seed_summary(shop, tries=2)["pass^2"] == 0.0


def _readme_commands() -> list[list[str]]:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```(?:bash|sh|console)\n(.*?)```", text, flags=re.S)
    lines = " \n".join(blocks).replace("\\\n", " ").splitlines()
    return [shlex.split(ln, comments=True) for ln in lines if ln.strip().startswith("shopsim ")]


def test_readme_commands_parse_and_their_checkpoint_paths_match():
    """Every `shopsim` command in the README parses, and every checkpoint a command reads (``--checkpoint``,
    ``--init``) is the ``OUT/checkpoint`` of a training command above it (`shopsim train`'s default OUT is
    ``runs/<algo>-seed<S>``)."""
    from shopsim.app.cli import build_parser

    parser = build_parser()
    written, commands = set(), _readme_commands()
    assert commands, "the README shows no shopsim commands"
    for argv in commands:
        try:
            args = parser.parse_args(argv[1:])
        except SystemExit:
            pytest.fail(f"README command does not parse: {shlex.join(argv)}")
        for read in (getattr(args, "checkpoint", None), getattr(args, "init", None)):
            if read is not None:
                assert Path(read) in written, f"{shlex.join(argv)} reads {read}, which no command above writes"
        if args.command in ("train", "sft"):
            out = args.out or f"runs/{args.algo.replace(':', '_')}-seed{args.seed}"
            written.add(Path(out) / "checkpoint")


@pytest.mark.parametrize(("manifest", "families"), [
    ({"sft": {"families": ["find_and_buy"]}}, ["find_and_buy"]),  # `shopsim sft`
    ({"config": {"reset_options": {"family": "bundle"}}}, ["bundle"]),  # an LM trainer's task choice
    ({"env_kwargs": {"family": "after_sales"}}, ["after_sales"]),  # an env option
    ({"config": {"env_kwargs": {}}}, None),  # nothing recorded: the env's mix
])
def test_manifest_families(tmp_path, manifest, families):
    from agents.registry import manifest_families

    (tmp_path / "shopsim_agent.json").write_text(json.dumps({"class": "m:C", **manifest}))
    assert manifest_families(tmp_path) == families
