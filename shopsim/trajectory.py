"""Turn-segmented trajectories: the contract between environments, agents, datasets and trainers.

A `Trajectory` is one episode; each `Turn` is one env step (one agent action) with what the env
returned and, for learning agents, exactly what the policy computed:

* language agents: `prompt_ids` (the exact context the model saw), `action_ids` (exactly the generated token ids,
  never re-tokenised text), `action_logprobs` under the behaviour policy, optional `hidden` summaries
  (e.g. ``{"last": [...], "mean": [...]}``) and `value`;
* numeric agents: `action` holds the raw action structure (lists of numbers) and `logprob` its log-probability.

Everything is plain Python / JSON-serialisable so that a trajectory round-trips through Parquet
(`shopsim.datasets`) unchanged. `extra` is the place for algorithm-specific per-turn data (teacher log-probs,
item spans...) that the core does not interpret.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np

SCHEMA_VERSION = 1


def to_jsonable(value: Any) -> Any:
    """Convert numpy scalars/arrays and tuples recursively into JSON-serialisable Python objects."""
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if hasattr(value, "tolist") and callable(value.tolist):  # torch tensors without importing torch
        return value.tolist()
    return value


@dataclass
class Turn:
    """One agent action and the env's answer to it."""

    observation: Any
    """What the agent saw before acting (text, or a JSON-serialisable structure for numeric envs)."""
    action: Any
    """What the agent sent (text, JSON tool call text, or a structure of numbers)."""
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: dict = field(default_factory=dict)
    # language-model fields
    prompt_ids: list[int] | None = None
    action_ids: list[int] | None = None
    action_logprobs: list[float] | None = None
    hidden: dict[str, list[float]] | None = None
    value: float | None = None
    # numeric-agent fields
    logprob: float | None = None
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {f.name: to_jsonable(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: dict) -> Turn:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass
class Trajectory:
    """One episode of one env, as a list of turns plus what identifies it."""

    env_id: str
    task_id: int | str | None = None
    split: str | None = None
    seed: int | None = None
    group_id: int | str | None = None
    """Rollouts that share a task and initial state share a group id."""
    strategy: str | None = None
    """Strategy instruction given at reset (ARC's grouping key), if any."""
    traj_id: int | None = None
    agent: str | None = None
    turns: list[Turn] = field(default_factory=list)
    meta: dict = field(default_factory=dict)
    """Episode-level extras (e.g. task family); JSON-serialisable."""

    # ----------------------------------------------------------------- derived views
    @property
    def num_turns(self) -> int:
        return len(self.turns)

    @property
    def total_reward(self) -> float:
        return float(sum(t.reward for t in self.turns))

    @property
    def final_info(self) -> dict:
        return self.turns[-1].info if self.turns else {}

    @property
    def success(self) -> bool:
        return bool(self.final_info.get("success", False))

    @property
    def score(self) -> float:
        """The env's episode score (`info["score"]` at the last turn), else the return."""
        info = self.final_info
        return float(info["score"]) if "score" in info else self.total_reward

    @property
    def terminated(self) -> bool:
        return bool(self.turns and self.turns[-1].terminated)

    @property
    def truncated(self) -> bool:
        return bool(self.turns and self.turns[-1].truncated)

    @property
    def num_generated_tokens(self) -> int:
        return sum(len(t.action_ids or ()) for t in self.turns)

    def append(self, turn: Turn) -> None:
        self.turns.append(turn)

    # ----------------------------------------------------------------- (de)serialisation
    def episode_record(self) -> dict:
        """Episode-level columns (no turns)."""
        return {
            "env_id": self.env_id,
            "task_id": None if self.task_id is None else str(self.task_id),
            "split": self.split,
            "seed": self.seed,
            "group_id": None if self.group_id is None else str(self.group_id),
            "strategy": self.strategy,
            "traj_id": self.traj_id,
            "agent": self.agent,
            "num_turns": self.num_turns,
            "total_reward": self.total_reward,
            "score": self.score,
            "success": self.success,
            "terminated": self.terminated,
            "truncated": self.truncated,
            "meta": json.dumps(to_jsonable(self.meta), sort_keys=True, ensure_ascii=False),
        }

    def to_dict(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k != "turns"}
        d["meta"] = to_jsonable(self.meta)
        d["turns"] = [t.to_dict() for t in self.turns]
        return d

    @classmethod
    def from_dict(cls, data: dict) -> Trajectory:
        data = dict(data)
        turns = [Turn.from_dict(t) for t in data.pop("turns", [])]
        names = {f.name for f in fields(cls)}
        traj = cls(**{k: v for k, v in data.items() if k in names})
        traj.turns = turns
        return traj


def success_by_family(trajs) -> dict[str, float]:
    """Mean success per task family (``traj.meta["family"]``, set by the rollout runner from the env's info), over
    the trajectories that record one."""
    fams: dict[str, list[float]] = {}
    for t in trajs:
        fam = (t.meta or {}).get("family")
        if fam is not None:
            fams.setdefault(str(fam), []).append(float(t.success))
    return {f: float(np.mean(v)) for f, v in sorted(fams.items())}


def zero_variance_groups(trajs) -> dict[str, float]:
    """Share of rollout groups (trajectories sharing a ``group_id``, at least two of them) whose returns are all equal,
    overall (``zero_var_groups``) and per task family (``zero_var_groups/<family>``): a group-relative advantage is
    zero for every member of such a group, so it adds nothing to a GRPO-style update. Empty without groups."""
    groups: dict = {}
    for t in trajs:
        if t.group_id is not None:
            groups.setdefault(t.group_id, []).append(t)
    groups = {g: ts for g, ts in groups.items() if len(ts) > 1}
    if not groups:
        return {}
    flat: dict[str, list[float]] = {}
    overall = []
    for ts in groups.values():
        rewards = [float(t.total_reward) for t in ts]
        zero = float(max(rewards) - min(rewards) <= 1e-9)
        overall.append(zero)
        fam = (ts[0].meta or {}).get("family")
        if fam is not None:
            flat.setdefault(str(fam), []).append(zero)
    return {"zero_var_groups": float(np.mean(overall)),
            **{f"zero_var_groups/{f}": float(np.mean(v)) for f, v in sorted(flat.items())}}


#: `episode_metrics` keys whose mean `style_metrics` reports (the Shopping env's answer-latency proxy)
LATENCY_KEYS = ("turns_before_first_answer", "chars_before_first_answer")


def style_metrics(trajs) -> dict[str, float]:
    """How episodes talk to the customer, from the final ``info["episode_metrics"]`` (the shopping env): ``asked``
    (share of episodes that asked at least one question), ``asked/<family>`` per task family, and the means of the
    latency proxy (`LATENCY_KEYS`). Episodes without episode metrics are left out; empty when none has them."""
    em = [(t, (t.final_info or {}).get("episode_metrics") or {}) for t in trajs]
    em = [(t, m) for t, m in em if "questions" in m]
    if not em:
        return {}
    out = {"asked": float(np.mean([m["questions"] > 0 for _, m in em]))}
    fams: dict[str, list[float]] = {}
    for t, m in em:
        fam = (t.meta or {}).get("family")
        if fam is not None:
            fams.setdefault(str(fam), []).append(float(m["questions"] > 0))
    out.update({f"asked/{f}": float(np.mean(v)) for f, v in sorted(fams.items())})
    for k in LATENCY_KEYS:
        vals = [float(m[k]) for _, m in em if k in m]
        if vals:
            out[k] = float(np.mean(vals))
    return out
