"""Results files: one JSON file per leaderboard entry, schema-versioned and validated on read.

An entry is (env id + version, split, algorithm, config hash, seeds, budget) → metrics with
confidence intervals over seeds. Results are files that anyone can re-render (`shopsim leaderboard`).

Schema (``schema_version`` = `SCHEMA_VERSION`)::

    {"schema": "shopsim.results", "schema_version": 1,
     "env_id": "shopsim/<Name-vN>", "env_version": 0, "family": "inventory", "split": "test",
     "task_ids": [...], "seeds": [0, 1, 2], "tries": 4, "episodes": 96, "protocol_hash": "9a0e...",
     "entry": "hpo", "kind": "reference" | "trained" | "agent" | "checkpoint",
     "agent": "module:Class", "algorithm": "hpo" | null, "config": {...}, "config_hash": "1f0c...",
     "budget": {"iterations": 20, "train_seed": 0} | null,
     "metrics": {"cost": {"mean", "ci95": [lo, hi] | null, "interval": "wilson" | "bootstrap",
                          "tasks" | "episodes": N, "per_seed": [...], "std": sample std | null, "n",
                          "seeds_over": "eval_seeds" | "train_seeds"}, ...},
     "ci_over": "eval_seeds" | "train_seeds",
     "status": "ok" | "error" | "skipped", "error": null | "message",
     "curve": {"metric": "cost", "x": [iterations...], "per_seed": [[values...], ...]} | null,
     "command": "shopsim bench --tier standard --envs <Name-vN>" | null,
     "scenario": "seasonal", "env_kwargs": {...}  (only on a scenario's rows: the env record's scenarios),
     "decoding": "sample"  (only when LM agents sampled; absent: greedy, `Protocol.decoding`),
     "train_seeds": [0, 1, 2] | null,
     "package_version": "0.1.0", "git_commit": "abc123..." | "unknown", "created": "2026-...Z", "wall_s": 12.3}

``ci95`` is the 95% interval of the mean over the protocol's episodes (Wilson for rates, a seeded bootstrap over
tasks otherwise; `shopsim.leaderboard.metrics`); ``per_seed``/``std`` are the per-seed values (eval seeds, or the
training runs of a trained entry) and their sample standard deviation (ddof = 1). ``curve`` is the learning curve
of the env's primary metric per training run (`shopsim.app.bench.learning_curve`); older files may hold the
path of a training run's ``metrics.csv`` there instead. ``protocol_hash`` names the episodes (`Protocol.hash`): only
results with equal hashes are ranked together.

Version history: 1 — first version (later fields are optional additions).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import subprocess
import unicodedata
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from shopsim.errors import DatasetError
from shopsim.paths import write_text_atomic
from shopsim.trajectory import to_jsonable

SCHEMA = "shopsim.results"
SCHEMA_VERSION = 1
KINDS = ("reference", "trained", "agent", "checkpoint")
STATUSES = ("ok", "error", "skipped")

#: key -> accepted types (checked by `validate_results`)
REQUIRED: dict[str, tuple[type, ...]] = {
    "schema": (str,), "schema_version": (int,), "env_id": (str,), "split": (str,), "seeds": (list,),
    "entry": (str,), "kind": (str,), "config_hash": (str,), "metrics": (dict,), "status": (str,),
    "package_version": (str,), "git_commit": (str,),
}
_REPO_ROOT = Path(__file__).resolve().parents[2]
#: the longest entry name a results file may hold: names are labels in tables and page tabs, and one of thousands of
#: characters would only stretch every table it is in
MAX_ENTRY_CHARS = 100
#: bidirectional-text controls: a name holding one displays its characters in another order than they are stored
#: (right-to-left override), so it could pose as another entry
BIDI_CONTROLS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
#: first characters that spreadsheet programs read as the start of a formula in leaderboard.csv
FORMULA_STARTS = ("=", "+", "-", "@")


def entry_name_problem(name: Any) -> str | None:
    """What is wrong with `name` as a leaderboard entry name, or None if nothing: it must be a non-empty string of
    at most `MAX_ENTRY_CHARS` printable characters, without bidirectional-text controls, and not start like a
    spreadsheet formula."""
    if not isinstance(name, str) or not name.strip():
        return "is empty; give a short name such as the agent's or algorithm's"
    if len(name) > MAX_ENTRY_CHARS:
        return f"is {len(name)} characters long; the leaderboard takes at most {MAX_ENTRY_CHARS}"
    for ch in name:
        if ch in BIDI_CONTROLS:
            return (f"holds the bidirectional-text control U+{ord(ch):04X}, which makes a name display other than "
                    "it reads; remove it")
        if unicodedata.category(ch) == "Cc":
            return f"holds the control character U+{ord(ch):04X}; use printable characters only"
    if name.startswith(FORMULA_STARTS):
        return f"starts with {name[0]!r}, which spreadsheets read as a formula; start it with a letter or digit"
    return None


def _non_finite(value: Any, where: str = "") -> str | None:
    """The place of the first NaN or infinite number in a JSON-like value (e.g. ``metrics.cost.mean``), or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return where or "the record"
    items: Iterable[tuple[Any, Any]]
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, (list, tuple)):
        items = ((f"[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    for key, item in items:
        sub = f"{where}{key}" if str(key).startswith("[") else (f"{where}.{key}" if where else str(key))
        found = _non_finite(item, sub)
        if found:
            return found
    return None


def git_commit(root: str | Path = _REPO_ROOT) -> str:
    """The checkout's commit (with ``+dirty`` if it has local changes), or "unknown" (no git, not a checkout)."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                             timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=5, check=False).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{sha}+dirty" if sha and dirty else (sha or "unknown")


def config_hash(payload: Any) -> str:
    """First 16 hex digits of the SHA-256 of the canonical JSON of `payload` (keys sorted)."""
    text = json.dumps(to_jsonable(payload), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def env_version(env_id: str) -> int | None:
    tail = env_id.rsplit("-v", 1)
    return int(tail[1]) if len(tail) == 2 and tail[1].isdigit() else None


def make_results(*, protocol, entry: str, kind: str, metrics: dict, agent: str | None = None,
                 algorithm: str | None = None, config: dict | None = None, budget: dict | None = None,
                 status: str = "ok", error: str | None = None, curve: dict | None = None,
                 wall_s: float | None = None, extra: dict | None = None) -> dict:
    """A results record for one leaderboard entry evaluated under `protocol` (see module docstring)."""
    from shopsim import __version__

    config = dict(config or {})
    hashed = {"entry": entry, "agent": agent, "algorithm": algorithm, "config": config, "budget": budget}
    data = {
        "schema": SCHEMA, "schema_version": SCHEMA_VERSION,
        "env_id": protocol.env_id, "env_version": env_version(protocol.env_id), "family": protocol.family,
        "split": protocol.split, "task_ids": list(protocol.task_ids), "seeds": list(protocol.seeds),
        "protocol_hash": protocol.hash if hasattr(protocol, "hash") else None,
        "tries": protocol.tries, "episodes": protocol.episodes_per_seed * len(protocol.seeds),
        "entry": entry, "kind": kind, "agent": agent, "algorithm": algorithm, "config": config,
        "config_hash": config_hash(hashed), "budget": budget, "metrics": metrics,
        "status": status, "error": error, "curve": curve,
        "package_version": __version__, "git_commit": git_commit(),
        "created": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "wall_s": None if wall_s is None else round(float(wall_s), 3),
    }
    if getattr(protocol, "decoding", "greedy") != "greedy":  # greedy, the protocol default, goes unrecorded
        data["decoding"] = protocol.decoding
    if getattr(protocol, "scenario", None):  # a scenario's rows: its name and env options (its own table)
        data.update(scenario=protocol.scenario, env_kwargs=dict(protocol.env_kwargs))
    if extra:
        data.update(extra)
    return to_jsonable(data)


def validate_results(data: Any, source: str = "results") -> dict:
    """Check a results record; raise `DatasetError` naming the file and what to change."""
    if not isinstance(data, dict):
        raise DatasetError(f"{source}: not a shopsim results file (expected a JSON object, got "
                           f"{type(data).__name__}); write it with `shopsim eval` or move it elsewhere")
    if data.get("schema") != SCHEMA:
        raise DatasetError(f"{source}: not a shopsim results file (missing \"schema\": \"{SCHEMA}\"); "
                           "write it with `shopsim eval` or move it elsewhere")
    version = data.get("schema_version")
    if not isinstance(version, int):
        raise DatasetError(f"{source}: 'schema_version' must be an integer, got {version!r}")
    if version < SCHEMA_VERSION:
        raise DatasetError(f"{source}: results schema_version {version} is older than the supported "
                           f"{SCHEMA_VERSION}; re-run `shopsim eval` (or `shopsim bench`) to regenerate it")
    if version > SCHEMA_VERSION:
        raise DatasetError(f"{source}: results schema_version {version} is newer than this shopsim reads "
                           f"({SCHEMA_VERSION}); upgrade shopsim")
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise DatasetError(f"{source}: missing field(s) {', '.join(missing)}; regenerate it with `shopsim eval`")
    for key, types in REQUIRED.items():
        if not isinstance(data[key], types) or isinstance(data[key], bool):
            raise DatasetError(f"{source}: field {key!r} must be {' or '.join(t.__name__ for t in types)}, "
                               f"got {type(data[key]).__name__}")
    if data.get("scenario") is not None and not isinstance(data["scenario"], str):
        raise DatasetError(f"{source}: 'scenario' must be a string (a name in shopsim.leaderboard.protocols."
                           f"SCENARIOS) or absent, got {type(data['scenario']).__name__}")
    problem = entry_name_problem(data["entry"])
    if problem:
        raise DatasetError(f"{source}: entry name {data['entry'][:40]!r} {problem} (the 'entry' field)")
    bad = _non_finite(data)
    if bad:
        raise DatasetError(f"{source}: {bad} is not a finite number; a results file holds finite numbers only, so "
                           "fix what produced it and rerun `shopsim eval` (or delete the file)")
    if data["kind"] not in KINDS:
        raise DatasetError(f"{source}: kind {data['kind']!r} is not one of {', '.join(KINDS)}")
    if data["status"] not in STATUSES:
        raise DatasetError(f"{source}: status {data['status']!r} is not one of {', '.join(STATUSES)}")
    if not all(isinstance(s, int) and not isinstance(s, bool) for s in data["seeds"]):
        raise DatasetError(f"{source}: 'seeds' must be a list of integers")
    for name, value in data["metrics"].items():
        if not isinstance(value, dict) or not isinstance(value.get("mean"), (int, float)):
            raise DatasetError(f"{source}: metric {name!r} must be an object with a numeric 'mean' "
                               "(and 'std', 'ci95', 'n'); regenerate the file with `shopsim eval`")
        ci = value.get("ci95")
        if ci is not None and not (isinstance(ci, list) and len(ci) == 2
                                   and all(isinstance(v, (int, float)) for v in ci)):
            raise DatasetError(f"{source}: metric {name!r} has a malformed 'ci95' {ci!r} (want [lo, hi] or null)")
    if data["status"] == "ok" and not data["metrics"]:
        raise DatasetError(f"{source}: status 'ok' but no metrics; regenerate the file")
    return data


def write_results(path: str | Path, data: dict) -> Path:
    """Validate and write atomically (temporary sibling, then rename)."""
    path = Path(path)
    validate_results(data, str(path))
    return write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True, allow_nan=False) + "\n")


def read_results(path: str | Path) -> dict:
    """Read and validate one results file; a missing, empty, truncated or non-results file raises `DatasetError`
    naming the file."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise DatasetError(f"{path}: no such results file") from None
    except UnicodeDecodeError:
        raise DatasetError(f"{path}: not a text file; a results file is JSON written by `shopsim eval`") from None
    if not text.strip():
        raise DatasetError(f"{path}: empty file, not a results file; regenerate it with `shopsim eval` or delete it")
    def refuse(constant: str):
        raise DatasetError(f"{path}: holds {constant}, which is not a number; a results file holds finite numbers "
                           "only, so fix what produced it and rerun `shopsim eval` (or delete the file)")

    try:
        data = json.loads(text, parse_constant=refuse)  # NaN / Infinity: Python's json reads them, JSON has none
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{path}: not valid JSON ({exc}), e.g. a truncated write; regenerate it with "
                           "`shopsim eval` or delete it") from None
    data = validate_results(data, str(path))
    data["_path"] = str(path)
    return data


#: the manifest that marks a checkpoint folder (`agents.registry.CHECKPOINT_MANIFEST`); JSON files in such a folder
#: (manifest, model config, tokenizer) are a checkpoint's, not results
CHECKPOINT_MANIFEST = "shopsim_agent.json"


def _is_checkpoint_file(path: Path, root: Path) -> bool:
    folder = path.parent
    while True:
        if (folder / CHECKPOINT_MANIFEST).is_file():
            return True
        if folder == root or folder == folder.parent:
            return False
        folder = folder.parent


def find_results(directory: str | Path) -> list[dict]:
    """Every results file under `directory` (recursively, ``*.json``), validated; `directory` may also be one file.

    Every ``.json`` there must be a results file: an empty, truncated or foreign JSON file raises `DatasetError`
    naming it, so that a broken file never silently drops its entry (and an env's whole table) from the
    leaderboard. Exempt are hidden files and folders and the files of checkpoint folders (those holding
    `CHECKPOINT_MANIFEST`), so a folder with training runs next to the results can be rendered too.
    """
    directory = Path(directory)
    if directory.is_file():  # one results file
        return [read_results(directory)]
    if not directory.is_dir():
        raise DatasetError(f"{directory}: no such folder of results files")
    out = []
    for path in sorted(directory.rglob("*.json")):
        if any(part.startswith(".") for part in path.relative_to(directory).parts):
            continue
        if _is_checkpoint_file(path, directory):
            continue
        out.append(read_results(path))
    return out
