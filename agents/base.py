"""The agent protocol (docs/design.md, docs/agents.md).

An agent acts on a *batch* of observations, one per env slot. The rollout runner calls

1. ``agent.reset(num_slots, seed)`` once before a batch of episodes,
2. ``agent.seed_episode(slot, seed)`` then ``agent.begin_episode(slot, observation, info)`` when the episode in
   `slot` starts (`seed` is the episode's own sampling seed, `shopsim.rollout.episode_seed`),
3. ``agent.act(observations, infos, slots) -> list[Decision]`` for the slots that are still running,
4. ``agent.observe(slot, reward, terminated, truncated, info)`` after each step (optional bookkeeping).

A `Decision` is the action plus whatever a trainer needs from the policy (token ids, log-probs, hidden
summaries, values for LM agents; the log-prob of the raw action for numeric agents). Its fields map one to one
onto `shopsim.trajectory.Turn`.

`ScriptedAgent` is the convenience base for agents that decide one slot at a time (experts, random agents):
implement `act_one(slot, observation, info) -> action`.

Privileged information: scripted experts may read `info["oracle"]` (the hidden goal, written by the env).
Learning agents must not; the rollout runner never shows it to them via `Decision` records, and LM agents build
prompts from the observation only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Decision:
    """One action for one env slot, with the policy's records for the trajectory."""

    action: Any
    prompt_ids: list[int] | None = None
    action_ids: list[int] | None = None
    action_logprobs: list[float] | None = None
    hidden: dict[str, list[float]] | None = None
    value: float | None = None
    logprob: float | None = None
    extra: dict = field(default_factory=dict)


class Agent:
    """Base class of every agent. Subclasses override `act` (batched) or use `ScriptedAgent`."""

    name: str = "agent"
    #: True for agents that learn from trajectories (their Decisions carry log-probs).
    learns: bool = False
    #: Env options the agent was trained with (a checkpoint's manifest ``env_kwargs``, set by
    #: `agents.load_checkpoint`); trainers start from them and the leaderboard applies the env's presentation
    #: options among them (`shopsim.envs.presentation_kwargs`).
    env_kwargs: dict = {}

    def reset(self, num_slots: int, seed: int | None = None) -> None:
        self.num_slots = num_slots
        self.rng = np.random.default_rng(seed)

    def seed_episode(self, slot: int, seed: int) -> None:  # noqa: B027
        """Called before `begin_episode` with the seed of that episode's own sampling stream, derived from the agent
        seed and the episode's index in the plan. An agent that draws each episode's samples from a stream seeded
        here gives the same samples whichever episodes share its batch (the LM agent); the default keeps the one
        stream of `reset`."""

    def begin_episode(self, slot: int, observation: Any, info: dict) -> None:  # noqa: B027
        """Called when the episode in `slot` starts (after the env reset)."""

    def act(self, observations: Sequence[Any], infos: Sequence[dict], slots: Sequence[int]) -> list[Decision]:
        raise NotImplementedError

    def observe(self, slot: int, reward: float, terminated: bool, truncated: bool, info: dict) -> None:  # noqa: B027
        """Called after each env step of `slot`."""

    def close(self) -> None:  # noqa: B027
        pass


class ScriptedAgent(Agent):
    """An agent that decides each slot independently with `act_one`."""

    def act(self, observations, infos, slots) -> list[Decision]:
        return [Decision(self.act_one(s, o, i)) for o, i, s in zip(observations, infos, slots, strict=False)]

    def act_one(self, slot: int, observation: Any, info: dict) -> Any:
        raise NotImplementedError
