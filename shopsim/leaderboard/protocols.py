"""Evaluation protocols: which tasks, seeds and tries an env is scored on, and which metrics its table shows.

An evaluation split is a fixed list of task ids in ``data/splits/<Name-vN>.json`` that training
never samples. The file is shared with the env (which resolves ``reset(options={"split": ..., "task_id": ...})``)::

    {"env_id": "<env id>", "train": {"range": [lo, hi]}, "dev": [...], "test": [...],
     "eval_seeds": [0, 1, 2], "tries": 4}

``tries`` (optional, default 4) is the number of episodes per task and eval seed; pass^k needs ``tries >= k``, and
the leaderboard reports k = 1..4 as τ-bench does. An eval seed fixes the per-episode reset seeds (see
`Protocol.episode_seed`), so a protocol names every episode exactly (`Protocol.hash`); confidence intervals are
taken over tasks (`shopsim.leaderboard.metrics`). By default an evaluation uses the first tasks, tries and eval seeds
of the env record's ``protocol_size`` (`shopsim.envs.record.EnvRecord`) rather than the whole split.

Which metrics a table shows, and the reference agent of the gap metric, are the env record's (``metrics``,
``gap_reference``); the results file stores every metric the episodes produced, so a table can be re-rendered with
other columns later. An env's scenarios (``scenarios`` in its record) are further leaderboard sections, each evaluated
(and its baselines trained) with the scenario's env options: a scenario's protocol carries them in
`Protocol.env_kwargs`, so its protocol hash differs from the env's default one and its rows get their own table; its
leaderboard key is ``<env id>:<name>`` (``shopsim bench --envs <Name-vN>:<name>``) and its results live in
``<Name-vN>_<name>/``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from shopsim.envs.record import DEFAULT_METRICS, find_record, table_metrics
from shopsim.errors import ConfigError, DatasetError
from shopsim.splits import load_splits, splits_path

#: default episodes per (task, eval seed); pass^k is reported for k = 1..min(4, tries)
DEFAULT_TRIES = 4
MAX_K = 4
#: reset seed of try j of task i under eval seed s: s * SEED_STRIDE + i * tries + j (see `Protocol.episode_seed`)
SEED_STRIDE = 100_000

SCENARIO_SEP = ":"

#: `Protocol.decoding` values: arg-max decoding, or the agent's own sampling
DECODINGS = ("greedy", "sample")


def scenarios_of(env_id: str) -> dict:
    """Scenario name -> `shopsim.envs.record.Scenario` of `env_id` (empty for an env without a record)."""
    record = find_record(env_id)
    return dict(record.scenarios) if record is not None else {}


def split_key(key: str) -> tuple[str, str | None]:
    """(env id, scenario name or None) of a leaderboard key ``<env id>`` or ``<env id>:<scenario>``; raises
    `ConfigError` for a scenario the env does not have."""
    env_id, sep, scenario = key.partition(SCENARIO_SEP)
    if not sep:
        return key, None
    known = scenarios_of(env_id)
    if scenario not in known:
        raise ConfigError(f"{env_id} has no leaderboard scenario {scenario!r}; choose one of "
                          f"{', '.join(known) or '(none)'} (the scenarios of its record, shopsim.envs.records)")
    return env_id, scenario


def board_key(env_id: str, scenario: str | None = None) -> str:
    """The leaderboard key of an env (and scenario): ``<env id>`` or ``<env id>:<scenario>``."""
    return f"{env_id}{SCENARIO_SEP}{scenario}" if scenario else env_id


def key_slug(key: str) -> str:
    """The folder name of a leaderboard key's results: ``<Name-vN>`` or ``<Name-vN>_<scenario>``."""
    env_id, scenario = split_key(key)
    name = env_id.split("/")[-1]
    return f"{name}_{scenario}" if scenario else name


def record_key(rec: dict) -> str:
    """The leaderboard key of a results record (its env id and, for a scenario's rows, the scenario)."""
    return board_key(rec["env_id"], rec.get("scenario"))


def scenario_keys(env_ids: list[str]) -> list[str]:
    """`env_ids` with every scenario key of each env right after it."""
    return [k for e in env_ids for k in (e, *(board_key(e, s) for s in scenarios_of(e)))]


@dataclass(frozen=True)
class Protocol:
    """Every episode an evaluation runs: (eval seed, task id, try) → one reset of `env_id` on `split`."""

    env_id: str
    family: str
    split: str = "test"
    task_ids: tuple = ()
    seeds: tuple[int, ...] = (0, 1, 2)
    tries: int = DEFAULT_TRIES
    metrics: tuple[str, ...] = DEFAULT_METRICS
    reference: str | None = None
    env_kwargs: dict = field(default_factory=dict, compare=False, hash=False)
    scenario: str | None = field(default=None, compare=False, hash=False)
    """The scenario (of the env record's ``scenarios``) whose options `env_kwargs` holds (None: the env's defaults)."""
    decoding: str = "greedy"
    """How an agent that samples its actions from a language model decodes them (`DECODINGS`): ``greedy``
    (arg-max, the default: every entry of a board is measured at the same decoding, whatever temperature it was
    trained or saved with) or ``sample`` (the agent's own sampling settings). Agents without a ``sampling.greedy``
    switch (scripted experts, numeric policies) act as they always do."""

    def __post_init__(self) -> None:
        if not self.task_ids:
            raise ConfigError(f"{self.env_id}: the {self.split!r} split has no task ids; list them in "
                              f"{splits_path(self.env_id)}")
        if self.tries < 1:
            raise ConfigError(f"tries must be >= 1 (pass^k needs tries >= k), got {self.tries}")
        if not self.seeds:
            raise ConfigError("give at least one eval seed")
        if self.decoding not in DECODINGS:
            raise ConfigError(f"decoding must be one of {', '.join(DECODINGS)}, got {self.decoding!r}")
        if len(self.task_ids) * self.tries > SEED_STRIDE:
            raise ConfigError(f"{len(self.task_ids)} tasks x {self.tries} tries exceeds {SEED_STRIDE} episodes "
                              "per seed; use fewer tasks or tries")

    @property
    def episodes_per_seed(self) -> int:
        return len(self.task_ids) * self.tries

    @property
    def max_k(self) -> int:
        return min(MAX_K, self.tries)

    def episode_seed(self, seed: int, task_index: int, try_index: int) -> int:
        """The reset seed of one episode: distinct for every (eval seed, task, try), stable across runs."""
        return int(seed) * SEED_STRIDE + task_index * self.tries + try_index

    def episodes(self, seed: int) -> tuple[list, list[int]]:
        """(task ids, reset seeds) of every episode under one eval seed, tries of a task adjacent."""
        tasks, seeds = [], []
        for i, task in enumerate(self.task_ids):
            for j in range(self.tries):
                tasks.append(task)
                seeds.append(self.episode_seed(seed, i, j))
        return tasks, seeds

    def limited(self, *, tasks: int | None = None, seeds: int | list[int] | None = None,
                tries: int | None = None) -> Protocol:
        """A smaller protocol: the first `tasks` task ids, the first `seeds` eval seeds (or these seeds)."""
        kw: dict = {}
        if tasks is not None:
            if tasks < 1:
                raise ConfigError(f"tasks must be >= 1, got {tasks}")
            kw["task_ids"] = tuple(self.task_ids[:tasks])
        if seeds is not None:
            kw["seeds"] = tuple(self.seeds[:seeds]) if isinstance(seeds, int) else tuple(int(s) for s in seeds)
        if tries is not None:
            kw["tries"] = int(tries)
        return replace(self, **kw)

    @property
    def key(self) -> str:
        """The leaderboard key (`board_key`): the env id, with ``:<scenario>`` for a scenario's protocol."""
        return board_key(self.env_id, self.scenario)

    def to_dict(self) -> dict:
        out = {"env_id": self.env_id, "family": self.family, "split": self.split, "task_ids": list(self.task_ids),
               "seeds": list(self.seeds), "tries": self.tries, "metrics": list(self.metrics),
               "reference": self.reference, "decoding": self.decoding}
        if self.scenario:
            out.update(scenario=self.scenario, env_kwargs=dict(self.env_kwargs))
        return out

    @property
    def hash(self) -> str:
        """16 hex digits naming the episodes (env, split, task ids, eval seeds, tries, env options, reference) and
        a decoding other than greedy: results with the same protocol hash were measured on the same episodes, the
        same way, and may be ranked together."""
        from shopsim.leaderboard.results import config_hash

        named = {"env_id": self.env_id, "split": self.split, "task_ids": list(self.task_ids),
                 "seeds": list(self.seeds), "tries": self.tries, "reference": self.reference,
                 "env_kwargs": dict(sorted(self.env_kwargs.items()))}
        if self.decoding != "greedy":  # greedy protocols keep the hash they had before decoding was recorded
            named["decoding"] = self.decoding
        return config_hash(named)


def load_protocol(env_id: str, split: str = "test", *, root: str | Path | None = None,
                  family: str | None = None, sized: bool = True) -> Protocol:
    """The evaluation protocol of `env_id` on `split` ("test" or "dev"), read from its splits file, limited to the
    env record's ``protocol_size`` unless `sized` is False; its table columns and gap reference are the record's.
    `env_id` may be a scenario key (``<env id>:<scenario>``): the protocol then runs the same tasks with the
    scenario's env options."""
    env_id, scenario = split_key(env_id)
    if family is None:
        from shopsim.envs import family_of

        family = family_of(env_id)
    path = splits_path(env_id, root)
    if not path.is_file():
        raise DatasetError(f"no evaluation split for {env_id}: expected {path} with "
                           '{"env_id", "train", "dev", "test", "eval_seeds"} (the env issue ships it)')
    spec = load_splits(env_id, root)
    if spec.get("env_id", env_id) != env_id:
        raise DatasetError(f"{path} is for {spec.get('env_id')!r}, not {env_id!r}")
    if split not in ("test", "dev"):
        raise ConfigError(f"evaluate on split 'test' or 'dev', not {split!r} (training samples 'train')")
    ids = spec.get(split)
    if not isinstance(ids, list) or not ids:
        raise DatasetError(f"{path} has no {split!r} task-id list; add one (e.g. \"{split}\": [0, 1, 2])")
    seeds = spec.get("eval_seeds", [0, 1, 2])
    if not isinstance(seeds, list) or not all(isinstance(s, int) for s in seeds) or not seeds:
        raise DatasetError(f"{path}: 'eval_seeds' must be a non-empty list of integers, got {seeds!r}")
    tries = spec.get("tries", DEFAULT_TRIES)
    if not isinstance(tries, int) or tries < 1:
        raise DatasetError(f"{path}: 'tries' must be a positive integer, got {tries!r}")
    record = find_record(env_id)
    protocol = Protocol(env_id=env_id, family=family, split=split, task_ids=tuple(ids), seeds=tuple(seeds),
                        tries=tries, metrics=table_metrics(env_id, family),
                        reference=record.gap_reference if record is not None else None,
                        env_kwargs=dict(scenarios_of(env_id)[scenario].env_kwargs) if scenario else {},
                        scenario=scenario)
    size = record.protocol_size if record is not None and sized else None
    if size is None:
        return protocol
    return protocol.limited(tasks=size.tasks, seeds=list(size.seeds) if size.seeds is not None else None,
                            tries=size.tries)


def protocol_envs(root: str | Path | None = None) -> list[str]:
    """Registered env ids that have a splits file (the envs a leaderboard can cover)."""
    from shopsim.envs import all_env_ids

    return [e for e in all_env_ids() if splits_path(e, root).is_file()]
