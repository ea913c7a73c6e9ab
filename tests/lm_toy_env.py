"""A tiny text env for the LM-agent tests: it does not need the catalog or the shopping env.

Each episode asks for `length` actions; the observation names the word to type (``click[<word>]``), the reward is 1
for the exact action. Observations vary with the seed, so the context changes every turn.
"""

from __future__ import annotations

import gymnasium as gym
from gymnasium import spaces

WORDS = ["red", "blue", "green", "shoes", "mat", "lamp", "desk", "yoga", "soap", "cable"]


class ToyTextEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, length: int = 3):
        self.length = length
        self.observation_space = spaces.Text(max_length=2000)
        self.action_space = spaces.Text(max_length=2000)

    def _obs(self):
        return f"Step {self.t}. Instruction: click[{self.target}] to continue. Options: {' '.join(WORDS[:5])}"

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.target = WORDS[int(self.np_random.integers(len(WORDS)))]
        return self._obs(), {"task_id": 0}

    def step(self, action):
        ok = action == f"click[{self.target}]"
        self.t += 1
        self.target = WORDS[int(self.np_random.integers(len(WORDS)))]
        done = self.t >= self.length
        info = {"success": ok, "score": float(ok)}
        if done:
            info["episode_metrics"] = {"success": float(ok)}
        return self._obs(), float(ok), done, False, info
