"""The transformers language-model agent (docs/agents.md, docs/lm-agent.md).

* `agents.lm.agent.LMAgent` — the agent (registered as ``("lm", "shopping")``) and `LMPolicy`, the trainer-facing
  handle for log-prob recomputation; read that module's docstring for the record format.
* `agents.lm.tokenizer` — the domain byte-level BPE tokenizer with role/turn-end tokens and a chat template.
* `agents.lm.model` — the small from-scratch Llama/GPT-2 configs.
* `agents.lm.prompts` — concat and window context modes (token-in/token-out, no retokenization).
* `agents.lm.generation` — batched KV-cache sampling with exact per-token records.
* `agents.lm.parsing` — generated text -> env action.
* `agents.lm.sft` — supervised warm start on scripted-expert trajectories (`shopsim sft`).
"""

from __future__ import annotations

__all__ = ["LMAgent", "LMPolicy"]


def __getattr__(name):  # lazy: importing agents.lm does not import torch/transformers
    if name in __all__:
        from agents.lm import agent

        return getattr(agent, name)
    raise AttributeError(name)
