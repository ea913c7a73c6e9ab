"""Critic for the LM algorithms (ppo, vapo, mpo): a scalar value head on a causal LM backbone.

Default ([derived]: the papers do not fix it; docs/algorithms/ppo.md): a *separate* copy of the policy backbone
with a fresh scalar head, so critic updates never move the policy. ``shared=True`` puts the head on the policy's
own backbone instead; then the critic reads the policy's hidden states and its loss also trains the backbone.

Alignment: ``values[:, p]`` is the value of the state *before* the token at position p is generated, i.e. the head
applied to the last-layer hidden state at p−1 (the same shift as log-probs). ``values[:, 0] = 0``.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from torch import nn

from shopsim.paths import atomic_write
from shopsim.statefile import load_weights

__all__ = ["ValueHead", "ValueModel", "shift_values"]


class ValueHead(nn.Module):
    """Linear hidden -> scalar, initialised at zero output so the first values are exactly the bias (0)."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.proj = nn.Linear(hidden_size, 1)
        nn.init.normal_(self.proj.weight, std=1.0 / (hidden_size + 1))
        nn.init.zeros_(self.proj.bias)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.proj(h.float()).squeeze(-1)


def shift_values(v: torch.Tensor) -> torch.Tensor:
    """Per-position head outputs [B, S] -> values aligned with the token they precede (see module docstring)."""
    return torch.cat([torch.zeros_like(v[:, :1]), v[:, :-1]], dim=1)


def _hidden_size(model) -> int:
    cfg = model.config
    for name in ("hidden_size", "n_embd", "d_model"):
        if getattr(cfg, name, None):
            return int(getattr(cfg, name))
    raise ValueError(f"cannot find the hidden size of {type(model).__name__}")


class ValueModel(nn.Module):
    """A causal LM backbone (a deep copy of the policy, or the policy itself when shared) plus a `ValueHead`."""

    def __init__(self, policy_model: nn.Module, *, shared: bool = False) -> None:
        super().__init__()
        self.shared = shared
        # keep a shared backbone out of this module's parameters so the critic optimizer does not see it twice
        if shared:
            object.__setattr__(self, "backbone", policy_model)
        else:
            self.backbone = copy.deepcopy(policy_model)
        self.head = ValueHead(_hidden_size(policy_model))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, hidden: torch.Tensor | None = None):
        """Values [B, S] aligned with tokens. Pass the policy's last hidden states as `hidden` when shared."""
        if hidden is None:
            pos = (attention_mask.long().cumsum(-1) - 1).clamp_min(0)
            out = self.backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=pos,
                                use_cache=False, output_hidden_states=True)
            hidden = out.hidden_states[-1]
        return shift_values(self.head(hidden))

    def save(self, directory: str | Path) -> None:
        directory = Path(directory)
        state = {"head": self.head.state_dict(), "shared": self.shared}
        if not self.shared:
            state["backbone"] = self.backbone.state_dict()
        with atomic_write(directory / "critic.pt") as tmp:
            torch.save(state, tmp)

    def load(self, directory: str | Path) -> None:
        state = load_weights(Path(directory) / "critic.pt")
        self.head.load_state_dict(state["head"])
        if not self.shared and "backbone" in state:
            self.backbone.load_state_dict(state["backbone"])
