"""The benchmark: train baselines briefly, evaluate them and the reference agents, render the leaderboard.

`run_bench(mode="quick")` is the project's main job (``shopsim bench --quick``, ``make run``). For every env that
has an evaluation split (`shopsim.leaderboard.protocols.protocol_envs`; PettingZoo envs too, evaluated on their
parallel env) and every scenario of it (``<env id>:<scenario>``, the ``scenarios`` of its record: its
own protocol, table and results folder), in registry order:

1. evaluate the reference agents (scripted expert, random; (s, S) and base-stock for replenishment; the shipped SFT
   LM checkpoint for shopping when ``data/lm/`` has one);
2. train each baseline of the env's row in `BUDGETS` for its iteration budget (shopping's LM trainers start from the
   shipped SFT checkpoint, and are skipped with a printed note when there is none), plus every user class given as
   ``--algo mypkg.module:MyAlgo`` on the envs of its ``families``, then evaluate the trained policy;
3. write one results file per entry (``OUT/results/<Env>/<entry>.json``), training runs under
   ``OUT/runs/<Env>/<entry>/`` (with ``metrics.csv`` for the learning curves), and render the leaderboard
   (``OUT/leaderboard.md``, ``.csv``, ``index.html``, ``plots/``).

A failing entry becomes an error row (its traceback in ``OUT/logs/``) and the run goes on; the exit status is
non-zero only if a reference agent failed (then the table has no anchor to read the others against).

All budgets live in the env records (``budgets``, `shopsim.envs.records`), gathered in `BUDGETS` (tier → env id
or family → `Budget`):

* ``standard`` — every baseline of an env at one fixed budget with 3 training seeds; its results ship in
  ``data/results/standard/<Env>/<entry>.json`` (plus the first seed's checkpoint) and are what the leaderboard
  shows. The run resumes: an entry whose results file exists on the same protocol is skipped.
  ``--tier standard --algo pkg.module:Class`` trains your class at the tier's budget and ranks it among the
  shipped rows (same protocol hash only).
* ``quick`` — the main job (``make run``): renders the shipped standard tier, evaluates the reference agents and
  the shipped checkpoints live and says which shipped results do not reproduce within their intervals
  (`reproduction`), and trains one short ``demo-<algo>`` row per env family, shown apart.
* ``tiny`` — the CI smoke run; ``full`` — the papers' iteration counts.
"""

from __future__ import annotations

import dataclasses
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shopsim.envs.record import RECORDS, TIERS, Budget, EnvRecord, find_record
from shopsim.envs.records import STANDARD_TRAIN_SEEDS
from shopsim.errors import ConfigError, ShopsimError
from shopsim.leaderboard.evaluate import agent_env_kwargs, evaluate
from shopsim.leaderboard.metrics import summarize
from shopsim.leaderboard.protocols import (
    Protocol,
    board_key,
    key_slug,
    load_protocol,
    protocol_envs,
    record_key,
    scenario_keys,
    split_key,
)
from shopsim.leaderboard.results import find_results, make_results, write_results
from shopsim.paths import portable_path

#: what a tier gives an env whose record names no budget for it
DEFAULT_BUDGETS: dict[str, Budget] = {
    "standard": Budget(user_iterations=100, train_seeds=STANDARD_TRAIN_SEEDS),
    "quick": Budget(tasks=8, seeds=2, tries=4, user_iterations=5),
    "tiny": Budget(tasks=2, seeds=2, tries=4, user_iterations=1),
    "full": Budget(user_iterations=100, train_seeds=3),
}


def budget_table(records: Iterable[EnvRecord] | None = None) -> dict[str, dict[str, Budget]]:
    """Tier -> leaderboard key (an env id, or ``<env id>:<scenario>``) -> `Budget`, read from the env records'
    ``budgets`` (and their scenarios'), with ``"*"`` -> the tier's `DEFAULT_BUDGETS` entry."""
    records = list(RECORDS.values() if records is None else records)
    table: dict[str, dict[str, Budget]] = {}
    for tier in TIERS:
        rows: dict[str, Budget] = {}
        for rec in records:
            if tier in rec.budgets:
                rows[rec.id] = rec.budgets[tier]
            for name, scenario in rec.scenarios.items():
                if tier in scenario.budgets:
                    rows[board_key(rec.id, name)] = scenario.budgets[tier]
        rows["*"] = DEFAULT_BUDGETS[tier]
        table[tier] = rows
    return table


#: tier -> env id, scenario key (or family, as a fallback for newly registered envs; "*" for any) -> Budget: the
#: records' budgets when shopsim was imported (`budget_for` reads a record registered later directly)
BUDGETS: dict[str, dict[str, Budget]] = budget_table()
MODES = tuple(BUDGETS)


def budget_for(mode: str, env_id: str, family: str, table: dict | None = None) -> Budget:
    """The budget of a leaderboard key (an env id, or ``<env id>:<scenario>``, which falls back to its env's row)
    in `mode`: its row in `table` (default `BUDGETS`), else its env record's budget for `mode` (a record registered
    after import), else its family's row, else ``"*"``."""
    table = (table or BUDGETS)
    if mode not in table:
        raise ConfigError(f"unknown benchmark mode {mode!r}; choose one of {', '.join(table)}")
    rows = table[mode]
    base = split_key(env_id)[0]
    record = find_record(base)
    late = record.budgets.get(mode) if record is not None and table is BUDGETS else None
    return (rows.get(env_id) or rows.get(base) or late or rows.get(family) or rows.get("*") or Budget())


def sft_checkpoint(root: str | Path | None = None) -> Path | None:
    """The shipped SFT LM checkpoint (``data/lm/sft``, or a folder under ``data/lm/`` with an agent manifest)."""
    from agents.registry import CHECKPOINT_MANIFEST
    from shopsim.paths import data_dir

    base = Path(root) if root is not None else data_dir() / "lm"
    sft = base / "sft"
    if (sft / CHECKPOINT_MANIFEST).is_file() or (sft / "config.json").is_file():
        return sft
    if (base / CHECKPOINT_MANIFEST).is_file():
        return base
    found = sorted(base.glob(f"*/{CHECKPOINT_MANIFEST}")) if base.is_dir() else []
    return found[0].parent if found else None


def make_agent(name: str, env_id: str, env_kwargs: dict | None = None):
    """Agent `name` (`agents.make`) for `env_id` built with the env options it will be evaluated on: an agent whose
    constructor takes ``env_kwargs`` (the retrieval agents, whose candidate-set size K and catalog size come from
    them) gets `env_kwargs`; any other is built as `agents.make` builds it (the inventory references are tuned on
    the default env whatever the scenario)."""
    import inspect

    import agents

    if env_kwargs and "env_kwargs" in inspect.signature(agents.resolve(name, env_id)).parameters:
        return agents.make(name, env_id, env_kwargs=dict(env_kwargs))
    return agents.make(name, env_id)


_REFERENCE_AGENTS: dict[tuple[str, str, str], Any] = {}


def reference_agent(protocol: Protocol):
    """The agent ``protocol.reference`` names (None when it names none) for `evaluate`'s gap metric, built for the
    protocol's env options (`make_agent`).

    Built once per (name, env, options) and process, so that `evaluate` runs it once per protocol however many
    entries are measured against it."""
    if not protocol.reference:
        return None
    key = (protocol.reference, protocol.env_id, repr(sorted(protocol.env_kwargs.items())))
    if key not in _REFERENCE_AGENTS:
        _REFERENCE_AGENTS[key] = make_agent(protocol.reference, protocol.env_id, protocol.env_kwargs)
    return _REFERENCE_AGENTS[key]


@dataclass
class Entry:
    """One leaderboard row to produce: a reference agent, a registered baseline, or a user class."""

    env_id: str
    name: str
    kind: str  # reference | trained | checkpoint | imported (trained by another command, `Budget.imported`)
    algorithm: str | None = None
    iterations: int = 0
    overrides: dict = field(default_factory=dict)
    checkpoint: Path | None = None
    skip_reason: str | None = None
    shipped_entry: str | None = None
    """For a shipped checkpoint evaluated live: the shipped entry it must reproduce."""
    scenario: str | None = None
    """The env's leaderboard scenario (one of its record's ``scenarios``), None for its default protocol."""

    @property
    def key(self) -> str:
        """The leaderboard key: the env id, with ``:<scenario>`` for a scenario's entry."""
        from shopsim.leaderboard.protocols import board_key

        return board_key(self.env_id, self.scenario)


def plan(mode: str, env_ids: list[str], user_algos: list[str], *, table: dict | None = None,
         sft: Path | None = None, shipped: Sequence[dict] = ()) -> list[Entry]:
    """Every entry of the run, in order (references first per env, so their failure shows early). `env_ids` are
    leaderboard keys: env ids, or ``<env id>:<scenario>`` for a scenario of the env's record."""
    import agents
    import baselines
    from baselines.registry import load_target
    from shopsim.envs import family_of

    user_classes = []
    for spec in user_algos:
        cls = load_target(spec)
        if not (isinstance(cls, type) and issubclass(cls, baselines.Algorithm)):
            raise ConfigError(f"--algo {spec}: {cls!r} is not a baselines.Algorithm subclass")
        if not cls.families:
            raise ConfigError(f"--algo {spec}: set `families = (...)` on the class to say which envs it trains")
        user_classes.append((spec, cls))
    entries: list[Entry] = []
    for key in env_ids:
        env_id, scenario = split_key(key)
        family = family_of(env_id)
        b = budget_for(mode, key, family, table)
        known = set(agents.available(env_id))
        for ref in b.references:
            if ref in known:
                entries.append(Entry(env_id, ref, "reference", scenario=scenario))
        if family == "shopping" and sft is not None and "lm" in known and not scenario:
            entries.append(Entry(env_id, "lm-sft", "checkpoint", checkpoint=sft))
        registered = set(baselines.available(env_id=env_id))
        note = None
        if b.needs_init and sft is None:
            note = "no SFT checkpoint in data/lm/ (see `shopsim sft`)"
        for rec in shipped:  # the main job re-evaluates the shipped checkpoints of this env live
            ckpt = shipped_checkpoint(rec)
            wanted = b.live_checkpoints is None or rec["entry"] in b.live_checkpoints
            if record_key(rec) == key and ckpt is not None and wanted:
                entries.append(Entry(env_id, f"{rec['entry']}-{ckpt.name}", "checkpoint", checkpoint=ckpt,
                                     shipped_entry=rec["entry"], scenario=scenario))
        for algo, iters in b.algos.items():
            if algo not in registered:
                continue
            name = f"demo-{algo}" if b.demo else algo
            entries.append(Entry(env_id, name, "trained", algorithm=algo, iterations=iters,
                                 overrides=dict(b.overrides.get(algo, {})), skip_reason=note, scenario=scenario))
        entries += [Entry(env_id, algo, "imported", algorithm=algo, scenario=scenario)
                    for algo in b.imported if algo in registered and algo not in b.algos]
        used = {e.name for e in entries if e.key == key}
        for spec, cls in user_classes:
            if family in cls.families:
                name = getattr(cls, "name", "algorithm")
                name = cls.__name__ if name in ("algorithm", "") else name
                name = spec.replace(":", ".") if name in used else name  # never overwrite another row's file
                used.add(name)
                entries.append(Entry(env_id, name, "trained", algorithm=spec, iterations=b.user_iterations,
                                     skip_reason=note, scenario=scenario))
    return entries


def _protocol(env_id: str, b: Budget, split: str) -> Protocol:
    return load_protocol(env_id, split).limited(tasks=b.tasks, seeds=b.seeds, tries=b.tries)


def results_path(results_dir: Path, env_id: str, entry: str) -> Path:
    """Where an entry's results file lives: ``<results_dir>/<Env-vN>/<entry>.json`` (``<Env-vN>_<scenario>/`` for
    a scenario key ``<env id>:<scenario>``)."""
    return Path(results_dir) / key_slug(env_id) / f"{entry}.json"


def existing_result(path: Path, protocol: Protocol) -> dict | None:
    """The finished results file at `path` when it is valid, ``ok`` and on `protocol`'s episodes (resume)."""
    from shopsim.errors import DatasetError
    from shopsim.leaderboard.results import read_results

    if not path.is_file():
        return None
    try:
        rec = read_results(path)
    except DatasetError:
        return None  # a truncated or foreign file is produced again
    return rec if rec["status"] == "ok" and rec.get("protocol_hash") == protocol.hash else None


def run_entry(entry: Entry, protocol: Protocol, out: Path, *, budget: Budget, mode: str, train_seed: int = 0,
              progress: bool = False, log: Callable[[str], None] = print, results_dir: Path | None = None,
              command: str | None = None, keep_checkpoints: bool = False) -> dict:
    """Train (if needed) and evaluate one entry; returns its results record (an error row on failure).

    The record is written to `results_path` under `results_dir` (default ``out/results``); training runs go to
    ``out/runs/<Env>/<entry>/``. With `keep_checkpoints` the trained checkpoints are copied next to the results file
    (``<entry>/seed<k>/``, the first training seed's), so that a shipped result can be evaluated again without
    training."""
    import agents
    import baselines

    slug = key_slug(entry.key)
    res_path = results_path(results_dir or out / "results", entry.key, entry.name)
    run_dir = out / "runs" / slug / entry.name
    info: dict[str, Any] = {"protocol": protocol, "entry": entry.name, "kind": entry.kind,
                            "algorithm": entry.algorithm}
    n_train = max(1, budget.train_seeds) if entry.kind == "trained" else 1
    train_seeds = [train_seed + i for i in range(n_train)]
    if entry.kind == "trained":
        info["budget"] = {"mode": mode, "iterations": entry.iterations, "train_seed": train_seed}
        if n_train > 1:
            info["budget"]["train_seeds"] = train_seeds
    if command is None:  # the command that reproduces this file (into runs/<tier>/)
        command = f"shopsim bench --tier {mode} --envs {entry.key.split('/')[-1]}"
        if entry.kind == "trained" and entry.algorithm and ":" in entry.algorithm:
            command += f" --algo {entry.algorithm}"
    meta: dict[str, Any] = {"command": command, "tier": mode}
    if entry.kind == "trained":
        meta["train_seeds"] = train_seeds
    if budget.demo and entry.kind == "trained":
        meta["demo"] = True
    t0 = time.perf_counter()
    if entry.skip_reason:
        rec = make_results(**info, metrics={}, status="skipped", error=entry.skip_reason)
        write_results(res_path, rec)
        return rec
    try:
        if entry.kind == "reference":  # built for the protocol's env options (a scenario's K, say)
            agent = make_agent(entry.name, entry.env_id, protocol.env_kwargs)
            info["agent"] = f"{type(agent).__module__}:{type(agent).__qualname__}"
        elif entry.kind == "checkpoint":
            from agents.registry import CHECKPOINT_MANIFEST

            assert entry.checkpoint is not None  # a checkpoint entry names its folder (plan)
            if (Path(entry.checkpoint) / CHECKPOINT_MANIFEST).is_file():
                agent = agents.load_checkpoint(entry.checkpoint, env_id=entry.env_id)
            else:  # a plain Hugging Face folder: the LM agent loads the shipped SFT model by default
                agent = agents.make("lm", entry.env_id)
            info["agent"] = f"{type(agent).__module__}:{type(agent).__qualname__}"
            info["config"] = {"checkpoint": portable_path(entry.checkpoint)}
            if entry.shipped_entry:
                meta["shipped_entry"] = entry.shipped_entry
        else:
            assert entry.algorithm is not None  # a trained entry names its algorithm (plan)
            overrides = dict(entry.overrides)
            if protocol.env_kwargs:  # a scenario: train on the env options it is evaluated with
                overrides["env_kwargs"] = {**overrides.get("env_kwargs", {}), **protocol.env_kwargs}
            algo = baselines.make(entry.algorithm, env_id=entry.env_id, **overrides)
            info["config"] = (dataclasses.asdict(algo.config)
                              if dataclasses.is_dataclass(algo.config) and not isinstance(algo.config, type) else {})
            init = sft_checkpoint() if budget.needs_init else None
            runs = []  # (per-eval-seed summaries, notes) per training seed
            csvs: list[Path] = []  # each run's metrics.csv (the learning curves)
            for ts in train_seeds:
                seed_dir = run_dir if n_train == 1 else run_dir / f"seed{ts}"
                result = algo.train(entry.env_id, iterations=entry.iterations, seed=ts, out_dir=seed_dir,
                                    init=init, progress=progress)
                agent = result.agent
                if agent is None and result.checkpoint is not None:
                    agent = agents.load_checkpoint(result.checkpoint, env_id=entry.env_id)
                if agent is None:
                    raise ShopsimError(f"{entry.algorithm}.train returned no agent and no checkpoint")
                info["agent"] = f"{type(agent).__module__}:{type(agent).__qualname__}"
                csvs.append(Path(result.out_dir or seed_dir) / "metrics.csv")
                if keep_checkpoints and ts == train_seeds[0] and result.checkpoint is not None:
                    # the first run's checkpoint only: enough to re-evaluate live, and the repo stays small
                    _copy_checkpoint(Path(result.checkpoint), res_path.parent / entry.name / f"seed{ts}")
                ev = evaluate(agent, protocol, reference=reference_agent(protocol), progress=progress,
                              num_envs=budget.num_envs)
                runs.append(ev)
                if n_train > 1:  # a fresh algorithm object per run: no state carried between seeds
                    algo = baselines.make(entry.algorithm, env_id=entry.env_id, **overrides)
            rec = trained_record(info, runs, csvs, agent, protocol, meta, time.perf_counter() - t0, log)
        if entry.kind != "trained":
            ev = evaluate(agent, protocol, reference=reference_agent(protocol), progress=progress,
                          num_envs=budget.num_envs)
            for note in ev.notes:
                log(f"  note: {note}")
            extra = {"ci_over": "eval_seeds", **meta}
            if agent_env_kwargs(agent, protocol) != dict(protocol.env_kwargs):
                extra["env_kwargs"] = agent_env_kwargs(agent, protocol)  # the agent's presentation options
            if ev.notes:
                extra["notes"] = ev.notes
            rec = make_results(**info, metrics=ev.metrics, wall_s=time.perf_counter() - t0, extra=extra)
    except Exception as exc:  # noqa: BLE001 - one entry's failure becomes an error row, the run goes on
        tb = traceback.format_exc()
        log_path = out / "logs" / f"{slug}_{entry.name}.txt"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_text(tb)
        rec = make_results(**{k: v for k, v in info.items() if k not in ("metrics", "curve")}, metrics={},
                           status="error", error=f"{type(exc).__name__}: {exc} (traceback: {log_path})",
                           wall_s=time.perf_counter() - t0, extra=meta)
    write_results(res_path, rec)
    return rec


def trained_record(info: dict, runs: list, csvs: list[Path], agent, protocol: Protocol, meta: dict, wall_s: float,
                   log: Callable[[str], None] = print) -> dict:
    """The results record of a trained entry from its runs' evaluations (one per training seed, pooled over them
    when there are several: `pool_runs`) and their ``metrics.csv`` (the learning curve)."""
    if len(runs) == 1:
        metrics, notes = runs[0].metrics, runs[0].notes
    else:
        metrics = pool_runs(runs, protocol)
        notes = sorted({n for ev in runs for n in ev.notes})
    for note in notes:
        log(f"  note: {note}")
    extra = {"ci_over": "train_seeds" if len(runs) > 1 else "eval_seeds", **meta}
    if agent_env_kwargs(agent, protocol) != dict(protocol.env_kwargs):
        extra["env_kwargs"] = agent_env_kwargs(agent, protocol)
    if notes:
        extra["notes"] = notes
    return make_results(**info, curve=learning_curve(csvs, protocol.family), metrics=metrics, wall_s=wall_s,
                        extra=extra)


def import_trained(env_id: str, entry: str, seed_dirs: Sequence[Path], results_dir: Path, *, budget: dict,
                   command: str, algorithm: str | None = None, mode: str = "standard", keep_checkpoint: bool = False,
                   progress: bool = False, log: Callable[[str], None] = print, table: dict | None = None) -> dict:
    """A trained row of `mode`'s table from runs trained elsewhere (`benchmarks.learning_lm` trains the Shopping
    rows of the standard tier). The final checkpoint of each training seed's run folder (``<seed dir>/checkpoint``,
    beside the trainer's ``metrics.csv`` and, from `baselines`' trainers, ``run.json``) is evaluated on the env's
    protocol exactly as `run_entry` evaluates the runs it trains, pooled over the seeds, and written to
    ``results_dir/<Env>/<entry>.json``. Nothing is trained. `budget` says how the runs were trained (recorded in
    the file, and part of its config hash); `command` is what trains them. With `keep_checkpoint` the first seed's
    checkpoint is copied beside the file, for the main job's live re-check. A file already there on the same
    protocol and budget is kept (resume)."""
    import json

    import agents
    from shopsim.envs import family_of

    seed_dirs = [Path(d) for d in seed_dirs]
    if not seed_dirs:
        raise ConfigError(f"{entry}: no training runs to import")
    missing = [str(d) for d in seed_dirs if not (d / "checkpoint").is_dir()]
    if missing:
        raise ConfigError(f"{entry}: not finished training runs (no checkpoint/): {', '.join(missing)}")
    b = budget_for(mode, env_id, family_of(env_id), table)
    protocol = _protocol(env_id, b, "test")
    res_path = results_path(results_dir, env_id, entry)
    done = existing_result(res_path, protocol)
    if done is not None and done.get("budget") == budget:
        return done
    t0 = time.perf_counter()
    runs, agent = [], None
    for d in seed_dirs:
        agent = agents.load_checkpoint(d / "checkpoint", env_id=env_id)
        runs.append(evaluate(agent, protocol, reference=reference_agent(protocol), progress=progress,
                             num_envs=b.num_envs))
    run_file = seed_dirs[0] / "run.json"  # a `baselines` trainer's record of its config
    config = json.loads(run_file.read_text()).get("config", {}) if run_file.is_file() else {}
    info = {"protocol": protocol, "entry": entry, "kind": "trained", "algorithm": algorithm or entry,
            "agent": f"{type(agent).__module__}:{type(agent).__qualname__}", "config": config, "budget": budget}
    meta = {"command": command, "tier": mode,
            "train_seeds": [int(d.name[4:]) if d.name.startswith("seed") else i for i, d in enumerate(seed_dirs)]}
    rec = trained_record(info, runs, [d / "metrics.csv" for d in seed_dirs], agent, protocol, meta,
                         time.perf_counter() - t0, log)
    write_results(res_path, rec)
    if keep_checkpoint:
        _copy_checkpoint(seed_dirs[0] / "checkpoint", res_path.parent / entry / seed_dirs[0].name)
    return rec


#: family -> metrics.csv columns for the learning curve, in order of preference: the metric that matters (success,
#: cost, value, IoI), never a loss
CURVE_COLUMNS: dict[str, tuple[str, ...]] = {
    "shopping": ("eval/success_rate", "eval_success", "success_rate", "success", "train_success", "reward",
                 "mean_reward"),
    "rec": ("eval_IoI", "sample_IoI", "return_raw"),
    "retrieval": ("value", "reward"),
    "inventory": ("dev_cost", "cost", "train_cost"),
}
CURVE_POINTS = 100


def learning_curve(csv_paths: list[Path], family: str) -> dict | None:
    """``{"metric", "x", "per_seed"}``: the family's curve metric (`CURVE_COLUMNS`) per training run, at the
    iterations every run logged it (at most `CURVE_POINTS`, evenly thinned); None when no run logged one."""
    import pandas as pd

    frames = []
    for path in csv_paths:
        try:
            frames.append(pd.read_csv(path))
        except (OSError, ValueError):
            return None
    if not frames:
        return None
    for col in CURVE_COLUMNS.get(family, ()) + ("success_rate", "return", "reward", "cost"):
        if not all(col in f.columns for f in frames):
            continue
        series = []
        for f in frames:
            xcol = "iteration" if "iteration" in f.columns else None
            d = f[[c for c in (xcol, col) if c]].dropna()
            d = d.groupby(xcol, as_index=False).last() if xcol else d
            x = d[xcol].astype(int).tolist() if xcol else list(range(len(d)))  # without iterations: the row number
            series.append(dict(zip(x, d[col].astype(float).tolist(), strict=True)))
        xs = sorted(set(series[0]).intersection(*series[1:]))
        if not xs:
            continue
        if len(xs) > CURVE_POINTS:  # keep the first and last points
            step = (len(xs) - 1) / (CURVE_POINTS - 1)
            xs = sorted({xs[round(i * step)] for i in range(CURVE_POINTS)})
        return {"metric": col, "x": xs, "per_seed": [[round(s[x], 6) for x in xs] for s in series]}
    return None


def _copy_checkpoint(src: Path, dst: Path) -> None:
    import shutil

    if dst.exists():
        shutil.rmtree(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(src, dst)


def pool_runs(runs: list, protocol: Protocol) -> dict[str, dict]:
    """Metrics of an entry trained with several seeds: the mean over every run's episodes with a two-level
    bootstrap interval over runs and tasks (`shopsim.leaderboard.metrics.summarize`), and one value per training
    run (its mean over the eval seeds) in ``per_seed`` with their sample std (ddof = 1)."""
    records = [{**r, "run": i} for i, ev in enumerate(runs) for r in ev.records]
    ref = next((ev.reference_records for ev in runs if ev.reference_records is not None), None)
    return summarize(records, per_seed=[_mean_over_seeds(ev.per_seed) for ev in runs], reference=ref,
                     tries=protocol.tries, seeds_over="train_seeds")


def _mean_over_seeds(per_seed: list[dict]) -> dict[str, float]:
    """One training run's summary: each metric's mean over the eval seeds (keys present in every seed)."""
    keys = set(per_seed[0]).intersection(*per_seed[1:])
    return {k: sum(s[k] for s in per_seed) / len(per_seed) for k in keys}


@dataclass
class BenchOutcome:
    results: list[dict]
    written: dict[str, Path]
    markdown: str
    reference_failed: bool
    wall_s: float
    reproduction: list[dict] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return 1 if self.reference_failed else 0


def run_bench(mode: str = "quick", out: str | Path = "runs/bench", *, envs: list[str] | None = None,
              user_algos: Sequence[str] = (), split: str = "test", train_seed: int = 0, progress: bool = True,
              table: dict | None = None, log: Callable[[str], None] | None = None,
              plots: bool = True, train_seeds: int | None = None, results_dir: str | Path | None = None,
              command: str | None = None, resume: bool = True) -> BenchOutcome:
    """Run the benchmark (see module docstring) and render the leaderboard into `out`.

    Results files go to `results_dir` (default ``out/results``). With `resume`, an entry whose results file already
    exists there (valid, ``ok``, on the same protocol) is not trained or evaluated again. `command` is recorded in
    every results file (the command line that reproduces it)."""
    from shopsim.envs import check_env_id, family_of
    from shopsim.leaderboard.render import render_all, to_markdown

    t_start = time.perf_counter()
    out = Path(out)
    log = log or _console_log()
    if envs:  # env ids or names, optionally with a scenario (<Name-vN>:<scenario>)
        env_ids = []
        for e in envs:
            key = e if "/" in e else f"shopsim/{e}"
            check_env_id(split_key(key)[0])
            env_ids.append(key)
    else:  # every env with a split (PettingZoo ones too: `evaluate` runs their parallel envs), and its scenarios
        env_ids = scenario_keys(protocol_envs())
        if not env_ids:
            raise ShopsimError("no env has an evaluation split under data/splits/; nothing to benchmark")
    shipped = [r for r in shipped_results() if record_key(r) in env_ids]
    live_check = mode == "quick"  # the main job re-evaluates the shipped checkpoints
    entries = plan(mode, env_ids, list(user_algos), table=table, sft=sft_checkpoint(),
                   shipped=shipped if live_check else ())
    if mode == "standard" and user_algos and shipped:
        # your algorithm among the shipped rows: train only it (the baselines' and references' rows ship)
        shipped_envs = {record_key(r) for r in shipped}
        entries = [e for e in entries if e.algorithm in user_algos or e.key not in shipped_envs]
    resume = resume and mode in RESUMABLE
    protocols: dict[str, Protocol] = {}
    results: list[dict] = []
    res_dir = Path(results_dir) if results_dir is not None else out / "results"
    bar = _progress(len(entries), progress)
    for i, entry in enumerate(entries, 1):
        b = budget_for(mode, entry.key, family_of(entry.env_id), table)
        if train_seeds is not None:
            b = dataclasses.replace(b, train_seeds=train_seeds)
        label = f"[{i}/{len(entries)}] {entry.key} · {entry.kind} {entry.name}"
        if entry.kind == "trained" and not entry.skip_reason:
            label += f" ({entry.iterations} it)"
        bar.describe(label)
        t0 = time.perf_counter()
        try:
            if entry.key not in protocols:
                protocols[entry.key] = _protocol(entry.key, b, split)
        except ShopsimError as exc:
            log(f"{label}: no protocol: {exc}")
            bar.advance()
            continue
        done = existing_result(results_path(res_dir, entry.key, entry.name), protocols[entry.key])
        if entry.kind == "imported":  # rendered as recorded, never trained here
            if done is not None:
                results.append(done)
            log(f"{label}: " + (f"recorded by `{done['command']}` ({done['_path']})" if done is not None else
                                f"not recorded in {res_dir}; `{b.imported_by}` trains it"))
            bar.advance()
            continue
        if resume and done is not None:
            results.append(done)
            log(f"{label}: done before ({done['_path']}), skipped")
            bar.advance()
            continue
        rec = run_entry(entry, protocols[entry.key], out, budget=b, mode=mode, train_seed=train_seed,
                        progress=progress, log=log, results_dir=res_dir, command=command,
                        keep_checkpoints=mode == "standard")
        results.append(rec)
        status = rec["status"] if rec["status"] != "ok" else f"ok ({time.perf_counter() - t0:.1f}s)"
        if rec["status"] != "ok":
            status += f": {rec.get('error')}"
        log(f"{label}: {status}")
        bar.advance()
    bar.close()
    all_results = find_results(res_dir) if res_dir.is_dir() else []
    current = {(record_key(r), r["entry"]) for r in results}
    shown = [r for r in all_results if (record_key(r), r["entry"]) in current]
    same_dir = res_dir.resolve() == shipped_dir().resolve()
    repro = reproduction(shown, shipped) if shipped and not same_dir else []
    if mode == "standard" and not same_dir:
        # your rows among the shipped ones: the shipped rows this run did not produce again
        mine = {(record_key(r), r["entry"]) for r in shown}
        board = shown + [r for r in shipped if (record_key(r), r["entry"]) not in mine]
        md = to_markdown(board) + reproduction_markdown(repro)
    elif live_check:
        board = shipped + shown
        md = main_job_markdown(shipped, shown, repro)
    else:
        board, md = shown, to_markdown(shown)
    written = render_all(board, out, plots=plots)
    wall = time.perf_counter() - t_start
    md += f"\nFinished in {wall:.0f} s ({mode} tier).\n"
    written["markdown"].write_text(md)
    ref_failed = any(r["kind"] == "reference" and r["status"] == "error" for r in results)
    return BenchOutcome(results=shown, written=written, markdown=md, reference_failed=ref_failed,
                        wall_s=wall, reproduction=repro)


#: tiers whose runs resume (an entry whose results file exists on the same protocol is not run again); the main
#: job always evaluates live
RESUMABLE = ("standard", "full")


def shipped_dir() -> Path:
    """``data/results/standard``: the shipped standard-tier results (and the first training seed's checkpoints)."""
    from shopsim.paths import data_dir

    return data_dir() / "results" / "standard"


def shipped_results(root: str | Path | None = None) -> list[dict]:
    """Every shipped standard-tier results file (validated), each marked ``_shipped``; [] when none ship."""
    root = Path(root) if root is not None else shipped_dir()
    if not root.is_dir():
        return []
    out = find_results(root)
    for r in out:
        r["_shipped"] = True
    return out


def shipped_checkpoint(rec: dict) -> Path | None:
    """The checkpoint folder shipped next to a trained results file (``<entry>/seed<k>/``), or None."""
    from agents.registry import CHECKPOINT_MANIFEST

    if rec.get("kind") != "trained" or rec.get("status") != "ok" or not rec.get("_path"):
        return None
    seeds = rec.get("train_seeds") or []
    folder = Path(rec["_path"]).parent / rec["entry"] / f"seed{seeds[0] if seeds else 0}"
    return folder if (folder / CHECKPOINT_MANIFEST).is_file() else None


def _primary(rec: dict) -> str | None:
    from shopsim.envs.record import table_metrics

    cols = table_metrics(rec.get("env_id") or "", rec.get("family"))
    return next((c for c in cols if c in rec["metrics"]), None)


def reproduction(live: list[dict], shipped: list[dict]) -> list[dict]:
    """Whether each live result reproduces its shipped counterpart on the env's primary metric.

    A live reference agent or re-trained entry is compared with the shipped row of the same name; a shipped
    checkpoint evaluated live (``shipped_entry``) with that row's value for the checkpoint's training seed, with
    the shipped interval's margins around it. It reproduces when the two 95% intervals overlap (live and shipped
    may use different task subsets of the split: the main job evaluates fewer tasks)."""
    by = {(record_key(r), r["entry"]): r for r in shipped if r["status"] == "ok"}
    rows = []
    for r in live:
        s = by.get((record_key(r), r.get("shipped_entry") or r["entry"]))
        if s is None or r["status"] != "ok" or r.get("demo"):
            continue
        metric = _primary(s)
        if metric is None or metric not in r["metrics"]:
            continue
        sm, lm = s["metrics"][metric], r["metrics"][metric]
        centre = sm["mean"]
        if r.get("shipped_entry") and sm.get("per_seed"):
            centre = sm["per_seed"][0]  # the shipped checkpoint is the first training seed's
        lo, hi = sm.get("ci95") or [sm["mean"], sm["mean"]]
        s_lo, s_hi = centre - (sm["mean"] - lo), centre + (hi - sm["mean"])
        l_lo, l_hi = lm.get("ci95") or [lm["mean"], lm["mean"]]
        rows.append({"env_id": record_key(r), "entry": r["entry"], "metric": metric, "shipped": centre,
                     "shipped_ci95": [s_lo, s_hi], "live": lm["mean"], "live_ci95": [l_lo, l_hi],
                     "reproduces": bool(l_lo <= s_hi and s_lo <= l_hi)})
    return rows


def reproduction_markdown(rows: list[dict]) -> str:
    if not rows:
        return ""
    bad = [r for r in rows if not r["reproduces"]]
    lines = ["", "## Live check: shipped results evaluated again on this machine", "",
             ("Every shipped result reproduces within its 95% interval." if not bad else
              f"**{len(bad)} of {len(rows)} shipped results do not reproduce within their 95% interval:** "
              + ", ".join(f"{r['env_id'].split('/')[-1]} {r['entry']}" for r in bad) + "."), "",
             "| env | entry | metric | shipped [95% CI] | live [95% CI] | reproduces |", "|---|---|---|---:|---:|---|"]
    def num(v: float) -> str:
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"

    for r in rows:
        lines.append(f"| {r['env_id'].split('/')[-1]} | {r['entry']} | {r['metric']} | {num(r['shipped'])} "
                     f"[{num(r['shipped_ci95'][0])}, {num(r['shipped_ci95'][1])}] | {num(r['live'])} "
                     f"[{num(r['live_ci95'][0])}, {num(r['live_ci95'][1])}] | "
                     f"{'yes' if r['reproduces'] else '**no**'} |")
    return "\n".join(lines) + "\n"


def main_job_markdown(shipped: list[dict], live: list[dict], repro: list[dict]) -> str:
    """The main job's leaderboard.md: the shipped standard tier, the live check, the demo rows apart."""
    from shopsim.leaderboard.render import to_markdown

    head = to_markdown(shipped, title="shopsim leaderboard: standard tier (shipped results)") if shipped else (
        "# shopsim leaderboard\n\nNo standard-tier results ship in data/results/standard; run "
        "`shopsim bench --tier standard --results data/results/standard`.\n")
    demo = [r for r in live if not r.get("shipped_entry")]  # the shipped checkpoints are in the live check
    text = head + reproduction_markdown(repro)
    checked = {(r["env_id"], r.get("shipped_entry")) for r in live}
    unchecked = sorted({f"{r['env_id'].split('/')[-1]} {r['entry']}" for r in shipped
                        if r["kind"] == "trained" and shipped_checkpoint(r) is not None
                        and (r["env_id"], r["entry"]) not in checked})
    if unchecked:
        text += ("\nNot re-evaluated here (an LM evaluation of the whole protocol each; `shopsim bench --tier "
                 "standard --envs <Env>` reproduces them): " + ", ".join(unchecked) + ".\n")
    if demo:
        body = to_markdown(demo, title=None, legend=False)
        text += ("\n## Live rows: reference agents and a demo training per env family\n\n"
                 "Evaluated on this machine on the main job's protocol (fewer tasks than the standard tier, so its "
                 "own tables). `demo-*` rows are trained for a few iterations only: they show that training runs, "
                 "not what the algorithm reaches; compare algorithms on the standard rows above.\n\n" + body)
    return text


class _Bar:
    """The overall progress bar; the rollout and training bars (tqdm, leave=False) appear below it."""

    def __init__(self, total: int, enabled: bool):
        self.bar = None
        if enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, desc="bench", unit="entry", position=0)

    def describe(self, text: str) -> None:
        if self.bar is not None:
            self.bar.set_description_str(text[:70])

    def advance(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _progress(total: int, enabled: bool) -> _Bar:
    return _Bar(total, enabled)


def _console_log() -> Callable[[str], None]:
    """Log lines that do not break the progress bars (tqdm.write prints above them)."""
    import sys

    from tqdm.auto import tqdm

    return lambda msg: tqdm.write(msg, file=sys.stderr)
