"""The leaderboard (docs/leaderboard.md): evaluation protocols, metrics, results files, rendering, the benchmark.

* `protocols` — per-env evaluation protocol from ``data/splits/<Name-vN>.json`` (`shopsim.splits`: test task ids,
  eval seeds, tries);
* `metrics` — per-episode records, pass^k / pass@k, 95% t-intervals over seeds;
* `evaluate` — run an agent (and the protocol's reference agent, both given by the caller) through a protocol with
  `shopsim.rollout.collect`;
* `results` — schema-versioned results JSON (write, read, validate);
* `render` — Markdown, CSV, static HTML (`page`) and matplotlib plots (`charts`), over the table helpers of
  `tables` (grouping, columns, names); `viewer` — static trajectory viewer.

The benchmark that trains, evaluates and renders (``shopsim bench``) builds agents and trainers, so it belongs to the
app layer: `shopsim.app.bench`. Everything here sits below `agents` (``[tool.importlinter]`` in pyproject.toml).
"""

from shopsim.leaderboard.metrics import pass_at_k, pass_hat_k
from shopsim.leaderboard.protocols import Protocol, load_protocol
from shopsim.leaderboard.results import SCHEMA_VERSION, read_results, validate_results, write_results

__all__ = ["SCHEMA_VERSION", "Protocol", "load_protocol", "pass_at_k", "pass_hat_k", "read_results",
           "validate_results", "write_results"]
