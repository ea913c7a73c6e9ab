"""The one training loop every algorithm runs on: seeded, resumable, metrics.csv, TensorBoard, a progress bar.

`LoopAlgorithm.train(env_id, iterations=N, seed=S, out_dir=OUT)` owns the loop; an algorithm overrides its steps:

* `setup_run(run)`          build the model, optimizer, simulators and random generators for a run (always called,
  also when resuming: the saved state is loaded on top of what it built)
* `start_fresh(run)`        work done once at the start of a new run (e.g. VAPO's value pre-training)
* `iteration(it)`           one training iteration → its metrics row
* `eval_due(it, last)` / `evaluation(it)`   whether to evaluate after iteration `it`, and the evaluation metrics
* `stop_after(it, row)`     True ends the run early (CA-PG's gradient overflow, ProRL's early stop)
* `state_dict()` / `load_state_dict(state)` everything that must survive a resume besides the random generators
* `rng_streams()`           the algorithm's own generators (numpy `Generator`, `torch.Generator`) by name
* `save_checkpoint(dir)`    the evaluable checkpoint folder; `result_agent()` the agent handed back

A new run records what it was asked (`OUT/run.json`: algorithm, env, seed, config, init). After each iteration
the loop appends the row to the history and to `OUT/metrics.csv` (see `MetricsCSV`), logs every
finite number to TensorBoard (`OUT/tb`, step = iteration + 1), and on the checkpoint cadence (`checkpoint_every`
of the config when it has one, else every iteration; always after the last) writes the checkpoint and then
`OUT/state.safetensors`: the iteration counter, the history, `state_dict()`, and the states of python `random`,
numpy's global and named generators and torch's CPU (and CUDA) generators. It is a `shopsim.statefile` file (tensors,
plus everything else as JSON), which loads without unpickling, so a crafted run folder cannot run code; it is written
to a temporary file and moved into place with `os.replace`, so a crash leaves the previous state intact. A pickled
``state.pt`` of an older shopsim is refused unread.

A second `train` call on the same `out_dir` resumes: it rebuilds the run with `setup_run`, loads the state and
continues at the next iteration, so an interrupted run yields the same curve and parameters as an uninterrupted one
(tests/test_training_loop.py). A run that already reached `iterations` (or stopped early) is complete: nothing is
retrained or rewritten, and the result says so (`TrainResult.already_complete`). A state file written by another
algorithm, env, seed or config is refused with a `ConfigError` instead of being mixed into this run.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from baselines.base import Algorithm, TrainResult, write_metrics_csv
from shopsim.errors import ConfigError, ShopsimError
from shopsim.paths import write_text_atomic
from shopsim.statefile import load_state, save_state

log = logging.getLogger(__name__)

STATE_FILE = "state.safetensors"
#: the pickled state file of older versions: refused unread, since unpickling it could run code
LEGACY_STATE_FILE = "state.pt"
#: config fields that only say how often the run is saved or what it logs, not what it computes: a run may be
#: resumed with another value (e.g. a run started with state only at its end, continued with a state after every
#: iteration), and recorded runs keep their digest when a logging option is added
RESUME_FREE_FIELDS = frozenset({"checkpoint_every", "log_kl_start", "kl_start_rows", "eval_sampled"})
#: config fields added after runs were recorded, at the value that computes what those runs computed: left out of
#: the digest while they hold it, so the recorded runs (whose run.json lacks them) keep their digest
DIGEST_NEUTRAL = {"train_task_ids": [], "top_p": 1.0, "lr_warmup_iters": 0, "lr_decay": "constant",
                  "logprob_nucleus": False, "greedy_failed_share": 0.0, "screen_rounds": 4,
                  "negative_advantage_scale": 1.0, "argmax_negative_scale": 1.0,
                  "success_anchor_coef": 0.0}
#: bumped when the layout of the state file changes; an older file is refused with a clear message
STATE_FORMAT = 3

__all__ = ["LoopAlgorithm", "MetricsCSV", "Run", "STATE_FILE", "capture_rng", "config_digest", "restore_rng",
           "seed_everything", "tb_writer"]


@dataclass
class Run:
    """What one `train` call was asked to do (available to every step as `self.run`)."""

    env_id: str
    iterations: int
    seed: int
    out_dir: Path
    init: Path | None = None
    options: dict = field(default_factory=dict)
    """The extra keyword arguments of `train` the algorithm accepts (`LoopAlgorithm.train_options`)."""


def seed_everything(seed: int) -> None:
    """Seed python `random`, numpy's global generator and torch's global generators."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def capture_rng(streams: dict[str, Any] | None = None) -> dict:
    """The state of every global generator and of the named `streams` (numpy Generators / torch Generators): python's
    and numpy's as JSON-able values, torch's as uint8 tensors."""
    state = np.random.get_state()
    assert isinstance(state, tuple)  # the legacy form (legacy=True, the default)
    name, key, pos, has_gauss, gauss = state
    out: dict[str, Any] = {
        "python": random.getstate(), "numpy": [name, key.tolist(), int(pos), int(has_gauss), float(gauss)],
        "torch": torch.get_rng_state(), "streams": {}}
    if torch.cuda.is_available():
        out["cuda"] = torch.cuda.get_rng_state_all()
    for name, g in (streams or {}).items():
        out["streams"][name] = g.bit_generator.state if isinstance(g, np.random.Generator) else g.get_state()
    return out


def restore_rng(state: dict, streams: dict[str, Any] | None = None) -> None:
    """Inverse of `capture_rng`: restores the global generators and, in place, the named `streams`."""
    random.setstate(state["python"])
    name, key, *rest = state["numpy"]
    np.random.set_state((name, np.asarray(key, dtype=np.uint32), *rest))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    for name, g in (streams or {}).items():
        if name not in state["streams"]:
            raise ConfigError(f"the saved state has no random generator {name!r}; delete the run folder to restart")
        if isinstance(g, np.random.Generator):
            g.bit_generator.state = state["streams"][name]
        else:
            g.set_state(state["streams"][name])


def tb_writer(path: Path, purge_step: int | None = None):
    """A TensorBoard `SummaryWriter` (None when tensorboard cannot be imported: logging never fails training).

    `purge_step`: events already in `path` at or after this step are dropped: on resume those an interrupted
    process logged after its last saved state, on a restart (`resume=False`) the old run's, so no curve is drawn
    twice."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except Exception:  # pragma: no cover - tensorboard is a dependency
        return None
    return SummaryWriter(str(path), purge_step=purge_step)


def _jsonable(obj: Any) -> Any:
    """A JSON-comparable copy (tuples become lists, unknown objects their str), for comparing configs."""
    return json.loads(json.dumps(obj, default=str, sort_keys=True))


def config_digest(config: dict) -> str:
    """sha256 (16 hex digits) of a run's config as `run.json` records it, without `RESUME_FREE_FIELDS`: two runs
    with the same digest compute the same thing (a benchmark reuses a recorded run only under the same digest)."""
    import hashlib

    kept = {k: v for k, v in _jsonable(config).items()
            if k not in RESUME_FREE_FIELDS and not (k in DIGEST_NEUTRAL and v == DIGEST_NEUTRAL[k])}
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()[:16]


class MetricsCSV:
    """`metrics.csv`, one row per iteration: a row whose columns the header already has is appended; a row with a
    new column (e.g. the first evaluation) rewrites the file atomically from the whole history with the wider
    header. The result equals `write_metrics_csv(path, history)` after every row, without rewriting a long file
    each iteration."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.header: list[str] | None = None

    def rewrite(self, history: list[dict]) -> None:
        write_metrics_csv(self.path, history)
        self.header = list(dict.fromkeys(k for row in history for k in row))

    def add(self, row: dict, history: list[dict]) -> None:
        if self.header is None or not set(row) <= set(self.header) or not self.path.is_file():
            self.rewrite(history)
            return
        import csv

        with self.path.open("a", newline="") as f:
            csv.DictWriter(f, fieldnames=self.header).writerow(row)


class LoopAlgorithm(Algorithm):
    """An algorithm trained by the shared loop (module docstring); subclasses override the steps, not `train`."""

    #: extra keyword arguments of `train` this algorithm accepts (others are a ConfigError)
    train_options: ClassVar[tuple[str, ...]] = ()
    #: env used when `train` is called without one
    default_env_id: ClassVar[str | None] = None
    #: the fewest iterations a run may ask for
    min_iterations: ClassVar[int] = 1

    run: Run

    # ------------------------------------------------------------------ steps (override these)
    def setup_run(self, run: Run) -> None:
        """Build everything the run needs (model, optimizer, generators) from `run`; called fresh and on resume."""
        raise NotImplementedError

    def start_fresh(self, run: Run) -> None:  # noqa: B027 - optional hook
        """Work done once at the start of a new run, never on resume."""

    def teardown_run(self) -> None:  # noqa: B027 - optional hook
        """Release what `setup_run` (or the iterations) started, e.g. rollout workers; runs however `train` ends."""

    def iteration(self, it: int) -> dict:
        """Train iteration `it` (0-based) and return its metrics row."""
        raise NotImplementedError

    def eval_due(self, it: int, last: bool) -> bool:
        """Evaluate after iteration `it`: every `eval_every` iterations (if the config has it) and after the last."""
        every = getattr(self.config, "eval_every", 0)
        return last or bool(every and (it + 1) % every == 0)

    def evaluation(self, it: int) -> dict:
        """Evaluation metrics merged into the row of iteration `it`."""
        return {}

    def stop_after(self, it: int, row: dict) -> bool:
        """True ends the run after iteration `it` (the run is then complete); may add a marker to `row`."""
        return False

    def checkpoint_due(self, it: int, last: bool) -> bool:
        """Write checkpoint and state after iteration `it`: every `checkpoint_every` (config; default 1)."""
        every = getattr(self.config, "checkpoint_every", 1)
        return last or bool(every and (it + 1) % every == 0)

    def state_dict(self) -> dict:
        """Model, optimizer and algorithm state to save (the loop adds the generators, counter and history)."""
        raise NotImplementedError

    def load_state_dict(self, state: dict) -> None:
        raise NotImplementedError

    def rng_streams(self) -> dict[str, Any]:
        """The algorithm's own random generators by name (numpy `Generator` or `torch.Generator`)."""
        return {}

    def save_checkpoint(self, directory: Path) -> Path:
        """Write the evaluable checkpoint folder (`agents.load_checkpoint(directory)` rebuilds the agent)."""
        raise NotImplementedError

    def result_agent(self) -> Any:
        """The trained agent returned in `TrainResult.agent`."""
        return getattr(self, "agent", None)

    def progress_postfix(self, row: dict) -> dict:
        """What the progress bar shows after an iteration."""
        keys = ("loss", "reward", "value", "train_cost", "train_success", "return_raw")
        return {k: f"{row[k]:.3g}" for k in keys if isinstance(row.get(k), (int, float))}

    # ------------------------------------------------------------------ the loop
    def run_identity(self, env_id: str, seed: int) -> dict:
        """What a saved state must match to be resumed by this call."""
        config = (dataclasses.asdict(self.config)
                  if dataclasses.is_dataclass(self.config) and not isinstance(self.config, type) else {})
        return _jsonable({"algo": self.name, "class": f"{type(self).__module__}:{type(self).__qualname__}",
                          "env_id": env_id, "seed": seed, "config": config})

    def _load_state_file(self, path: Path, identity: dict) -> dict:
        legacy = path.with_name(LEGACY_STATE_FILE)
        if not path.is_file():
            raise ConfigError(f"{legacy} is the resume state of an older shopsim (a pickle, not loaded: it could "
                              "run code); delete it (or use another --out) to start the run again")
        try:
            state = load_state(path)
        except ShopsimError as exc:
            raise ConfigError(f"{exc} (or use another --out) to start the run again") from None
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise ConfigError(f"{path} was written by another version of shopsim; delete it (or use another "
                              "--out) to start the run again")
        saved = state["identity"]

        def strip(ident: dict) -> dict:
            # a field added after the run was saved matches it at its neutral value (as in `config_digest`)
            return {**ident, "config": {k: v for k, v in ident.get("config", {}).items()
                                        if k not in RESUME_FREE_FIELDS
                                        and not (k in DIGEST_NEUTRAL and v == DIGEST_NEUTRAL[k])}}

        saved, identity = strip(saved), strip(identity)
        if saved != identity:
            diff = [k for k in identity if saved.get(k) != identity[k]]
            if "config" in diff:
                sc, nc = saved.get("config", {}), identity["config"]
                fields = sorted(k for k in set(sc) | set(nc) if sc.get(k) != nc.get(k))
                diff = [d for d in diff if d != "config"] + [f"config field {f}" for f in fields]
            raise ConfigError(f"{path.parent} holds a run with a different {', '.join(diff)}; resume it with the "
                              "same settings, or use another --out")
        return state

    def train(self, env_id: str | None = None, *, iterations: int, seed: int = 0, out_dir: str | Path = "runs/train",
              init: str | Path | None = None, progress: bool = True, resume: bool = True,
              **options: Any) -> TrainResult:
        """Train for `iterations` iterations into `out_dir`, resuming a run found there (module docstring).

        `resume=False` ignores a saved state and starts again (the old run's files are overwritten)."""
        unknown = sorted(set(options) - set(self.train_options))
        if unknown:
            accepted = ", ".join(self.train_options) or "none"
            raise ConfigError(f"{self.name}.train: unknown argument(s) {', '.join(unknown)} (accepted: {accepted})")
        if iterations < self.min_iterations:
            raise ConfigError(f"iterations must be >= {self.min_iterations}, got {iterations}")
        env_id = env_id or self.default_env_id
        if env_id is None:
            raise ConfigError(f"{self.name}.train needs an env id")
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        state_path = out / STATE_FILE
        identity = self.run_identity(env_id, seed)
        found = state_path.is_file() or (out / LEGACY_STATE_FILE).is_file()
        state = self._load_state_file(state_path, identity) if resume and found else None

        seed_everything(seed)
        self.run = Run(env_id=env_id, iterations=iterations, seed=seed, out_dir=out,
                       init=None if init is None else Path(init), options=dict(options))
        self.setup_run(self.run)
        try:
            return self._train_loop(env_id, iterations, init, out, state_path, identity, state, progress)
        finally:
            self.teardown_run()

    def _train_loop(self, env_id, iterations, init, out, state_path, identity, state, progress) -> TrainResult:
        """`train` after `setup_run`: start or resume, then the iterations."""
        if state is None:
            start, history, done = 0, [], False
            # resume=False over an old run: its state must not be resumed if this run dies before its first save
            state_path.unlink(missing_ok=True)
            (out / LEGACY_STATE_FILE).unlink(missing_ok=True)
            meta = {**identity, "init": None if init is None else str(init)}
            write_text_atomic(out / "run.json", json.dumps(meta, indent=2))
            self.start_fresh(self.run)
        else:
            self.load_state_dict(state["algorithm"])
            restore_rng(state["rng"], self.rng_streams())
            start, history, done = int(state["iteration"]), list(state["history"]), bool(state["done"])
        ckpt = out / "checkpoint" if (out / "checkpoint").exists() else None
        if state is not None and (done or start >= iterations):
            why = "stopped early" if done else f"{start} of {iterations} iterations done"
            log.warning("%s: the run in %s is already complete (%s); nothing to train", self.name, out, why)
            return TrainResult(out_dir=out, history=history, agent=self.result_agent(), checkpoint=ckpt,
                               resumed_from=start, already_complete=True)
        if start:
            log.info("%s: resuming the run in %s at iteration %d of %d", self.name, out, start + 1, iterations)

        from tqdm.auto import tqdm

        metrics = MetricsCSV(out / "metrics.csv")
        if start:  # drop rows an interrupted process logged after its last saved state
            metrics.rewrite(history)
        writer = tb_writer(out / "tb", purge_step=start + 1)
        bar = tqdm(range(start, iterations), desc=f"{self.name} {env_id}", disable=not progress, unit="it",
                   initial=start, total=iterations)
        try:
            for it in bar:
                last = it + 1 == iterations
                row = self.iteration(it)
                if self.eval_due(it, last):
                    row.update(self.evaluation(it))
                done = self.stop_after(it, row)
                history.append(row)
                metrics.add(row, history)
                if writer is not None:
                    for k, v in row.items():
                        if isinstance(v, (int, float)) and math.isfinite(float(v)):
                            writer.add_scalar(k, float(v), it + 1)
                    writer.flush()
                if done or self.checkpoint_due(it, last):
                    # checkpoint first, state second: a crash in between resumes from the previous state and
                    # rewrites the checkpoint, so the two never disagree after a completed save
                    ckpt = self.save_checkpoint(out / "checkpoint")
                    save_state(state_path, {"format": STATE_FORMAT, "identity": identity, "iteration": it + 1,
                                            "done": done, "history": history, "algorithm": self.state_dict(),
                                            "rng": capture_rng(self.rng_streams())})
                bar.set_postfix(self.progress_postfix(row))
                if done:
                    break
        finally:
            bar.close()
            if writer is not None:
                writer.close()
        return TrainResult(out_dir=out, history=history, agent=self.result_agent(), checkpoint=ckpt,
                           resumed_from=start)
