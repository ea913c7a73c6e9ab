"""The algorithm contract every baseline implements.

An algorithm is a class with a config dataclass (`Config`, defaults from its paper, validated in
`__post_init__`) and a `train` method. `shopsim train --env ENV --algo NAME` and the leaderboard's benchmark call
only this interface:

    env_id = shopsim.envs.records.SHOPPING.id  # any registered env id of the algorithm's families
    algo = baselines.make("grpo", env_id=env_id, lr=1e-5)
    result = algo.train(env_id, iterations=10, seed=0, out_dir="runs/grpo")
    result.agent            # an agents.Agent with the trained policy, ready for evaluation
    result.history          # one dict of metrics per iteration (also in out_dir/metrics.csv)

Every built-in algorithm trains on the one shared loop, `baselines.core.loop.LoopAlgorithm` (seeded, resumable from
`out_dir/state.safetensors`, metrics.csv, TensorBoard, progress bar), and overrides its steps rather than `train`.

`families` names the env families (see `shopsim.envs`) the class trains on.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from shopsim.datasets import write_metrics_csv  # noqa: F401  (re-exported: trainers import it from here)
from shopsim.errors import ConfigError


@dataclass
class TrainResult:
    out_dir: Path
    history: list[dict] = field(default_factory=list)
    agent: Any = None
    """An `agents.Agent` acting with the trained policy (greedy or sampling, as the algorithm documents)."""
    checkpoint: Path | None = None
    resumed_from: int = 0
    """Iterations already done in `out_dir` when this call started (0: a new run)."""
    already_complete: bool = False
    """True when `out_dir` held a finished run: nothing was trained and `history` is the saved one."""


class Algorithm:
    name: ClassVar[str] = "algorithm"
    families: ClassVar[tuple[str, ...]] = ()
    Config: ClassVar[type | None] = None  # a dataclass

    def __init__(self, **overrides: Any) -> None:
        if self.Config is None:
            raise TypeError(f"{type(self).__name__} must define a Config dataclass")
        known = {f.name for f in dataclasses.fields(self.Config)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ConfigError(
                f"{self.name}: unknown option(s) {', '.join(unknown)}; valid options: {', '.join(sorted(known))}"
            )
        self.config = self.Config(**overrides)

    def train(
        self,
        env_id: str,
        *,
        iterations: int,
        seed: int = 0,
        out_dir: str | Path = "runs/train",
        init: str | Path | None = None,
        progress: bool = True,
        **kwargs: Any,
    ) -> TrainResult:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.config})"

