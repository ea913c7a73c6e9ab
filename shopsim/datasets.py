"""Turn-segmented rollout datasets in Parquet (docs/design.md, docs/envs.md).

One file per dataset, one row per turn. Every row carries its episode's columns (env id, task, split, seed, group,
strategy, agent, return, success...), so the file is a flat table that `pandas.read_parquet` and
`datasets.load_dataset("parquet", data_files=...)` read directly; `read_episodes` gives one row per episode.

* **Streaming**: `DatasetWriter` buffers turns and writes a Parquet row group every `chunk_rows` turns, so memory
  stays bounded for large runs; `iter_trajectories` streams them back batch by batch.
* **Atomic**: the writer writes to a hidden temporary sibling (``.NAME.tmp-PID-THREAD-HOST``,
  `shopsim.paths.atomic_path`) and renames it over the final name only in `close()`. An interrupted run leaves no
  file under the final name, the reader refuses any file without the `shopsim` completion record in its footer, and
  the next writer into the folder removes the temporary file of a killed writer.
* **Sharded**: a folder of ``part-00000.parquet``, ``part-00001.parquet``... with a ``_manifest.json`` (written by
  `shopsim.distributed.rollout_to_shards`, e.g. ``shopsim rollout --workers N``) is read as one dataset by every
  reader here, its shards in episode order; an unfinished folder (``"complete": false``) is refused with a message
  saying to rerun its command. The manifest's leading underscore makes the folder a plain Parquet dataset for other
  readers (pyarrow's dataset discovery, hence ``pandas.read_parquet(FOLDER)``, skips names starting with ``_`` or
  ``.``), and Hugging Face ``datasets.load_dataset(FOLDER)`` reads the parts as one split. Folders written before
  the rename hold ``manifest.json`` (`LEGACY_MANIFEST`), which is still read.
* **Metadata**: a JSON record in the Parquet footer (key ``shopsim``): schema version, env config, catalog seed and
  size, agent, package versions and creation time. The creation time is taken from ``SOURCE_DATE_EPOCH`` when set
  (the reproducible-builds convention), so the same seed gives byte-identical files; otherwise it is the wall clock
  and only the footer differs between two runs.

Observations and actions that are not strings (numeric envs) are stored as JSON text with a flag column; `info`,
`hidden`, `extra` and episode `meta` are JSON text. Token ids are ``list<int32>``, log-probs ``list<float64>``.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from shopsim.errors import DatasetError
from shopsim.paths import atomic_path
from shopsim.trajectory import SCHEMA_VERSION, Trajectory, Turn, to_jsonable

METADATA_KEY = b"shopsim"
#: the index of a sharded dataset folder; the leading underscore hides it from pyarrow's (and pandas') discovery of the
#: folder's Parquet files
MANIFEST = "_manifest.json"
#: the index's name in folders written by shopsim 0.x before the rename (read, and replaced on resume)
LEGACY_MANIFEST = "manifest.json"

_EPISODE_FIELDS = [
    ("env_id", pa.string()), ("task_id", pa.string()), ("split", pa.string()), ("seed", pa.int64()),
    ("group_id", pa.string()), ("strategy", pa.string()), ("traj_id", pa.int64()), ("agent", pa.string()),
    ("num_turns", pa.int32()), ("total_reward", pa.float64()), ("score", pa.float64()), ("success", pa.bool_()),
    ("episode_terminated", pa.bool_()), ("episode_truncated", pa.bool_()), ("episode_meta", pa.string()),
]
_TURN_FIELDS = [
    ("turn", pa.int32()), ("observation", pa.string()), ("observation_is_json", pa.bool_()),
    ("action", pa.string()), ("action_is_json", pa.bool_()), ("reward", pa.float64()),
    ("terminated", pa.bool_()), ("truncated", pa.bool_()), ("info", pa.string()),
    ("prompt_ids", pa.list_(pa.int32())), ("action_ids", pa.list_(pa.int32())),
    ("action_logprobs", pa.list_(pa.float64())), ("hidden", pa.string()), ("value", pa.float64()),
    ("logprob", pa.float64()), ("extra", pa.string()),
]
SCHEMA = pa.schema([pa.field(n, t) for n, t in _EPISODE_FIELDS + _TURN_FIELDS])


def _json_default(value: Any) -> Any:
    converted = to_jsonable(value)
    if converted is value:
        raise TypeError(f"{type(value).__name__} is not JSON-serialisable")
    return converted


_ENCODER = json.JSONEncoder(ensure_ascii=False, sort_keys=True, allow_nan=True, default=_json_default)


def _dumps(value: Any) -> str:
    # numpy values are converted only when met (`default`), so plain-Python infos pay no extra walk
    return _ENCODER.encode(value)


def _seq(value: Any) -> list | None:
    """Token ids / log-probs as a plain list without walking it element by element."""
    if value is None or type(value) is list:
        return value
    return value.tolist() if hasattr(value, "tolist") else list(value)


def _encode(value: Any) -> tuple[str, bool]:
    if isinstance(value, str):
        return value, False
    return _dumps(value), True


def _package_versions() -> dict[str, str]:
    from importlib import metadata

    out = {"python": platform.python_version()}
    for name in ("shopsim", "gymnasium", "numpy", "pyarrow", "torch", "transformers"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def creation_time() -> str:
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    t = float(epoch) if epoch else time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


class DatasetWriter:
    """Stream trajectories into one Parquet file, atomically.

    Use as a context manager; the file appears under `path` only when the block exits without an exception::

        with DatasetWriter("runs/expert.parquet", metadata={"env_id": ..., "agent": "expert"}) as w:
            for traj in trajectories:
                w.write(traj)
    """

    def __init__(self, path: str | os.PathLike, metadata: dict | None = None, *, chunk_rows: int = 8192,
                 compression: str = "zstd") -> None:
        if chunk_rows < 1:
            raise DatasetError(f"chunk_rows must be >= 1, got {chunk_rows}")
        self.path = Path(path)
        if self.path.exists() and self.path.is_dir():
            raise DatasetError(f"{self.path} is a folder; give a file path such as {self.path / 'data.parquet'}")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tmp = atomic_path(self.path)
        self.metadata = {
            "schema_version": SCHEMA_VERSION,
            "created": creation_time(),
            "versions": _package_versions(),
            **to_jsonable(metadata or {}),
        }
        schema = SCHEMA.with_metadata({METADATA_KEY: _dumps(self.metadata).encode()})
        self._writer = pq.ParquetWriter(self._tmp, schema, compression=compression)
        self._schema = schema
        self._columns: dict[str, list] = {f.name: [] for f in SCHEMA}
        self._buffered = 0
        self.chunk_rows = chunk_rows
        self.num_turns = 0
        self.num_episodes = 0
        self._closed = False

    # ------------------------------------------------------------------ writing
    def write(self, traj: Trajectory) -> None:
        if self._closed:
            raise DatasetError(f"writer for {self.path} is closed")
        if not traj.turns:
            raise DatasetError(f"trajectory {traj.traj_id} of {traj.env_id} has no turns; nothing to write")
        ep = traj.episode_record()
        ep_values = [
            ep["env_id"], ep["task_id"], ep["split"], ep["seed"], ep["group_id"], ep["strategy"], ep["traj_id"],
            ep["agent"], ep["num_turns"], ep["total_reward"], ep["score"], ep["success"], ep["terminated"],
            ep["truncated"], ep["meta"],
        ]
        cols = self._columns
        ep_cols = [cols[n] for n, _ in _EPISODE_FIELDS]
        for k, turn in enumerate(traj.turns):
            for col, v in zip(ep_cols, ep_values, strict=False):
                col.append(v)
            obs, obs_json = _encode(turn.observation)
            act, act_json = _encode(turn.action)
            cols["turn"].append(k)
            cols["observation"].append(obs)
            cols["observation_is_json"].append(obs_json)
            cols["action"].append(act)
            cols["action_is_json"].append(act_json)
            cols["reward"].append(float(turn.reward))
            cols["terminated"].append(bool(turn.terminated))
            cols["truncated"].append(bool(turn.truncated))
            cols["info"].append(_dumps(turn.info))
            cols["prompt_ids"].append(_seq(turn.prompt_ids))
            cols["action_ids"].append(_seq(turn.action_ids))
            cols["action_logprobs"].append(_seq(turn.action_logprobs))
            cols["hidden"].append(None if turn.hidden is None else _dumps(turn.hidden))
            cols["value"].append(None if turn.value is None else float(turn.value))
            cols["logprob"].append(None if turn.logprob is None else float(turn.logprob))
            cols["extra"].append(_dumps(turn.extra) if turn.extra else None)
        self._buffered += len(traj.turns)
        self.num_turns += len(traj.turns)
        self.num_episodes += 1
        if self._buffered >= self.chunk_rows:
            self._flush()

    def write_all(self, trajectories) -> None:
        for traj in trajectories:
            self.write(traj)

    def _flush(self) -> None:
        if not self._buffered:
            return
        table = pa.Table.from_pydict(self._columns, schema=self._schema)
        self._writer.write_table(table, row_group_size=max(self._buffered, 1))
        for col in self._columns.values():
            col.clear()
        self._buffered = 0

    # ------------------------------------------------------------------ finishing
    def close(self) -> Path:
        """Flush, finish the file and move it to its final name."""
        if self._closed:
            return self.path
        self._flush()
        self._writer.close()
        os.replace(self._tmp, self.path)
        self._closed = True
        return self.path

    def abort(self) -> None:
        """Drop the partial file (called on an exception inside the `with` block)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._writer.close()
        finally:
            self._tmp.unlink(missing_ok=True)

    def __enter__(self) -> DatasetWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def write_dataset(path: str | os.PathLike, trajectories, metadata: dict | None = None, **kwargs) -> Path:
    """Write a list of trajectories to `path` atomically and return the path."""
    with DatasetWriter(path, metadata, **kwargs) as writer:
        writer.write_all(trajectories)
    return Path(path)


# ---------------------------------------------------------------------- reading
def manifest_file(folder: str | os.PathLike) -> Path | None:
    """The manifest of the sharded dataset folder `folder` (`MANIFEST`, else an older folder's `LEGACY_MANIFEST`),
    or None if it has neither."""
    for name in (MANIFEST, LEGACY_MANIFEST):
        if (Path(folder) / name).is_file():
            return Path(folder) / name
    return None


def dataset_files(path: str | os.PathLike) -> list[Path]:
    """The Parquet files of the dataset at `path`: the file itself, or a sharded folder's shards in episode order."""
    path = Path(path)
    if not path.is_dir():
        return [path]
    manifest_path = manifest_file(path)
    if manifest_path is None:
        raise DatasetError(f"{path} is a folder without {MANIFEST}; give a dataset file, or a folder written by "
                           f"`shopsim rollout --workers N --out {path}`")
    try:
        manifest = json.loads(manifest_path.read_text())
        shards, total = manifest["shards"], manifest["num_shards"]
    except (ValueError, KeyError, TypeError) as exc:
        raise DatasetError(f"{manifest_path} is not a shopsim shard manifest ({exc}); regenerate the dataset") from None
    if not manifest.get("complete") or len(shards) != total:
        raise DatasetError(f"{path} is unfinished ({len(shards)} of {total} shards); rerun the command that wrote "
                           f"it to finish only the missing shards")
    return [path / s["file"] for s in sorted(shards, key=lambda s: s["start"])]


def _open(path: str | os.PathLike) -> pq.ParquetFile:
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"no dataset at {path}; write one with `shopsim rollout ... --out {path}`")
    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise DatasetError(f"{path} is not a complete Parquet file ({exc}); regenerate it") from exc
    meta = pf.schema_arrow.metadata or {}
    if METADATA_KEY not in meta:
        raise DatasetError(f"{path} has no shopsim metadata record; it was not written by shopsim.datasets")
    return pf


def read_metadata(path: str | os.PathLike) -> dict:
    """The dataset's metadata record (env config, agent, versions, creation time...); for a sharded folder, its
    first shard's record without the shard's own range, plus ``num_shards``."""
    files = dataset_files(path)
    if Path(path).is_dir():
        meta = read_metadata(files[0])
        meta.pop("shard", None)
        return {**meta, "num_shards": len(files)}
    meta = json.loads(_open(path).schema_arrow.metadata[METADATA_KEY])
    version = meta.get("schema_version")
    if version != SCHEMA_VERSION:
        raise DatasetError(f"{path} has dataset schema version {version}; this shopsim reads version "
                           f"{SCHEMA_VERSION}; regenerate the dataset with this version")
    return meta


def _decode(text: str | None, is_json: bool) -> Any:
    if text is None:
        return None
    return json.loads(text) if is_json else text


def _rows_to_turn(row: dict) -> Turn:
    return Turn(
        observation=_decode(row["observation"], row["observation_is_json"]),
        action=_decode(row["action"], row["action_is_json"]),
        reward=row["reward"], terminated=row["terminated"], truncated=row["truncated"],
        info=json.loads(row["info"]) if row["info"] else {},
        prompt_ids=row["prompt_ids"], action_ids=row["action_ids"], action_logprobs=row["action_logprobs"],
        hidden=json.loads(row["hidden"]) if row["hidden"] else None, value=row["value"], logprob=row["logprob"],
        extra=json.loads(row["extra"]) if row["extra"] else {},
    )


def _new_traj(row: dict) -> Trajectory:
    task = row["task_id"]
    if task is not None and task.lstrip("-").isdigit():
        task = int(task)
    group = row["group_id"]
    if group is not None and group.lstrip("-").isdigit():
        group = int(group)
    return Trajectory(env_id=row["env_id"], task_id=task, split=row["split"], seed=row["seed"], group_id=group,
                      strategy=row["strategy"], traj_id=row["traj_id"], agent=row["agent"],
                      meta=json.loads(row["episode_meta"]) if row["episode_meta"] else {})


def iter_trajectories(path: str | os.PathLike, batch_rows: int = 8192) -> Iterator[Trajectory]:
    """Stream trajectories back in file order (shard by shard for a sharded folder), reading `batch_rows` turns at a
    time."""
    files = dataset_files(path)
    if len(files) > 1 or Path(path).is_dir():
        for file in files:
            yield from iter_trajectories(file, batch_rows)
        return
    pf = _open(path)
    read_metadata(path)
    current: Trajectory | None = None
    key = None
    for batch in pf.iter_batches(batch_size=batch_rows):
        for row in batch.to_pylist():
            row_key = (row["traj_id"], row["env_id"], row["group_id"], row["seed"])
            if current is None or row_key != key or row["turn"] == 0:
                if current is not None:
                    yield current
                current, key = _new_traj(row), row_key
            current.turns.append(_rows_to_turn(row))
    if current is not None:
        yield current


def read_trajectories(path: str | os.PathLike) -> list[Trajectory]:
    return list(iter_trajectories(path))


def read_turns(path: str | os.PathLike):
    """All rows as a pandas DataFrame (one row per turn)."""
    return _read_table(path).to_pandas()


def _read_table(path: str | os.PathLike, columns: list[str] | None = None) -> pa.Table:
    """The rows of a dataset file or sharded folder (shards concatenated in episode order)."""
    tables = []
    for file in dataset_files(path):
        _open(file)
        tables.append(pq.read_table(file, columns=columns).replace_schema_metadata(None))
    return pa.concat_tables(tables)


def read_episodes(path: str | os.PathLike):
    """One row per episode (the episode columns of each episode's first turn)."""
    table = _read_table(path, columns=[n for n, _ in _EPISODE_FIELDS] + ["turn"])
    df = table.to_pandas()
    return df[df["turn"] == 0].drop(columns=["turn"]).reset_index(drop=True)


MESSAGE_FORMS = ("text", "tool_calls")


def _content(value: Any) -> str:
    return value if isinstance(value, str) else _dumps(value)


def to_messages(source, *, form: str = "text", system: str | None = None, only_success: bool = False,
                tools: dict | None = None) -> list[dict]:
    """Episodes as chat rows for TRL's ``SFTTrainer`` (conversational format): ``[{"messages": [...]}, ...]``.

    `source` is a dataset path (read with `iter_trajectories`) or an iterable of `Trajectory`. One row per episode
    (with `only_success`, successful episodes only), starting with a ``system`` message if `system` is given.

    * ``form="text"``: each turn is a ``user`` message (the observation; non-text observations as JSON) followed by
      an ``assistant`` message (the action as sent, text or JSON).
    * ``form="tool_calls"`` (the shopping env, the form `shopsim.integrations.trl` trains in): the first observation is
      the ``user`` message; each action that parses against the tool table `tools` (default
      `shopsim.envs.shopping.tools.TOOLS`) is an ``assistant`` message with one OpenAI-style ``tool_calls`` entry
      (arguments by name), answered by a ``tool`` message holding the next observation; an action that does not
      parse stays an assistant text message, answered by a user message. The last action closes the row.

    ``datasets.Dataset.from_list(rows)`` makes the training set; `Dataset.from_list` keeps the nested messages.
    """
    if form not in MESSAGE_FORMS:
        raise DatasetError(f"form={form!r}; choose one of {', '.join(MESSAGE_FORMS)}")
    if isinstance(source, (str, os.PathLike)):
        source = iter_trajectories(source)
    if form == "tool_calls":
        from shopsim.envs.shopping.actions import ActionError, parse
        from shopsim.envs.shopping.tools import TOOLS

        tools = TOOLS if tools is None else tools
    rows = []
    for traj in source:
        if only_success and not traj.success:
            continue
        messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system is not None else []
        call: dict[str, Any] | None = None  # the previous action's tool call: its answer is a tool message
        for turn in traj.turns:
            observation = _content(turn.observation)
            messages.append({"role": "user", "content": observation} if call is None else
                            {"role": "tool", "name": call["function"]["name"], "content": observation})
            call = None
            if form == "tool_calls" and isinstance(turn.action, str):
                try:
                    act = parse(turn.action, max_chars=1 << 30, tools=tools)
                except ActionError:
                    pass
                else:
                    assert tools is not None  # set above for form="tool_calls"
                    names = tools[act.name].arg_names
                    call = {"type": "function", "function": {
                        "name": act.name, "arguments": dict(zip(names, act.args, strict=True))}}
            messages.append({"role": "assistant", "content": _content(turn.action)} if call is None else
                            {"role": "assistant", "content": "", "tool_calls": [call]})
        if traj.turns:
            rows.append({"messages": messages})
    return rows


def write_metrics_csv(path: str | Path, history: list[dict]) -> Path:
    """Write one row per iteration to `path` (the union of all keys as columns), atomically.

    Every trainer writes its learning curve this way, so the leaderboard can plot any run's `metrics.csv`.
    """
    import csv
    import os

    path = Path(path)
    keys = list(dict.fromkeys(k for row in history for k in row))
    tmp = atomic_path(path)
    with tmp.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        writer.writerows(history)
    os.replace(tmp, path)
    return path
