"""A tiny text env and a tiny random GPT-2 agent for testing the LM trainer without the shopping env.

The env shows a digit string; the agent "types" tokens; reward 1 at the end when the last action contains token 3.
Three turns per episode. The agent records exact prompt/action ids and log-probs in both context modes.
"""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import torch

from agents.base import Agent, Decision

VOCAB = 12
EOS = 11
PAD = 0


def tiny_gpt2(seed: int = 0, vocab: int = VOCAB):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=vocab, n_positions=256, n_embd=16, n_layer=1, n_head=2, n_inner=32,
                     bos_token_id=EOS, eos_token_id=EOS, pad_token_id=PAD)
    return GPT2LMHeadModel(cfg).eval()


class ToyTextEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, turns: int = 3):
        self.observation_space = gym.spaces.Text(64, charset="0123456789 ")
        self.action_space = gym.spaces.Text(64, charset="0123456789 ")
        self.turns = turns

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.k = 0
        self.state = int(self.np_random.integers(1, 10))
        return str(self.state), {"anchor": f"s{self.state}-0"}

    def step(self, action):
        self.k += 1
        toks = [int(t) for t in str(action).split()] if str(action).strip() else []
        done = self.k >= self.turns
        hit = 3 in toks
        reward = float(hit) if done else 0.1 * float(hit)
        self.state = (self.state + len(toks)) % 10 or 1
        info = {"anchor": f"s{self.state}-{self.k}"}
        if done:
            info.update(success=bool(hit), score=reward, episode_metrics={"success": float(hit)})
        return str(self.state), reward, done, False, info


class ToyLMAgent(Agent):
    """Samples up to `max_new` tokens (stop at EOS) from a tiny GPT-2; records ids and log-probs."""

    learns = True

    def __init__(self, env_id: str = "toy", *, context_mode: str = "concat", max_new: int = 4, seed: int = 0,
                 model=None):
        self.model = model if model is not None else tiny_gpt2(seed)
        self.tokenizer = None
        self.pad_id = PAD
        self.context_mode = context_mode
        self.max_new = max_new
        self.hist: dict[int, list[int]] = {}

    def reset(self, num_slots, seed=None):
        super().reset(num_slots, seed)
        self.gen = torch.Generator().manual_seed(int(seed or 0))

    def begin_episode(self, slot, observation, info):
        self.hist[slot] = []

    def _obs_ids(self, obs: str) -> list[int]:
        return [EOS] + [1 + int(ch) % 10 for ch in obs if ch.isdigit()]

    @torch.no_grad()
    def act(self, observations, infos, slots):
        out = []
        for obs, slot in zip(observations, slots, strict=False):
            if self.context_mode == "concat":
                prompt = self.hist[slot] + self._obs_ids(obs)
            else:
                prompt = self._obs_ids(obs)
            ids, lps = [], []
            seq = list(prompt)
            for _ in range(self.max_new):
                x = torch.tensor([seq])
                logits = self.model(input_ids=x, attention_mask=torch.ones_like(x)).logits[0, -1].float()
                lp = torch.log_softmax(logits, -1)
                tok = int(torch.multinomial(lp.exp(), 1, generator=self.gen))
                ids.append(tok)
                lps.append(float(lp[tok]))
                seq.append(tok)
                if tok == EOS:
                    break
            self.hist[slot] = prompt + ids
            action = " ".join(str(t) for t in ids if t != EOS)
            out.append(Decision(action, prompt_ids=prompt, action_ids=ids, action_logprobs=lps,
                                hidden={"last": [float(len(prompt)), 1.0]}))
        return out

    def save(self, directory):
        Path(directory).mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(directory)


def env_fns(n: int = 4, turns: int = 3):
    return [lambda: ToyTextEnv(turns)] * n
