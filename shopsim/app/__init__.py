"""The app layer: what a user runs, on top of everything else.

* `cli` — the ``shopsim`` command line (``python -m shopsim.app.cli``);
* `commands` — one module per subcommand;
* `bench` — ``shopsim bench``: train the baselines, evaluate them and the reference agents, render the leaderboard.

Only this package (with ``benchmarks/`` and the tests above it) names concrete agents and algorithms; the rest of
`shopsim` sits below `agents` and `baselines` (``[tool.importlinter]`` in pyproject.toml).
"""
