"""Configuration and small records of the shared LM training loop (`baselines.core.trainer`).

`LMConfig` holds the options every Shopping LM algorithm shares; each algorithm's `Config` subclasses it with its
paper's defaults (docs/algorithms/). `Advantages` is what an algorithm's `compute_advantages` returns, `Ctx` what the
trainer computed (no grad) before the update.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from shopsim.errors import ConfigError

from .losses import AGG_MODES

__all__ = ["LMConfig", "Advantages", "Ctx"]


@dataclass
class LMConfig:
    """Options shared by every LM algorithm; each algorithm's Config subclasses this with its paper's defaults."""

    lr: float = 1e-6
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    group_size: int = 8
    """Rollouts per task (G); they share the task and the reset seed."""
    tasks_per_iter: int = 8
    update_epochs: int = 1
    minibatches: int = 1
    micro_batch_rows: int = 0
    """Most rows per forward/backward inside one optimizer step (gradient accumulation; 0 = no row limit).
    Normalisers are computed over the whole step, so the gradient does not depend on this value."""
    micro_batch_tokens: int = 8192
    """Length bucketing: a step's rows are sorted by length and cut into micro-batches of at most this many
    padded tokens, each trimmed to its own longest row, so padding costs almost nothing (0: one micro-batch of
    the whole minibatch, every row padded to the batch's longest). The gradient does not depend on it."""
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = None
    loss_agg: str = "token-mean"
    normalize_advantage: bool = False
    """Whiten advantages over all generated tokens of the batch."""
    kl_coef: float = 0.0
    kl_kind: str = "k3"
    entropy_coef: float = 0.0
    recompute_old_logp: bool | None = None
    """π_old = log-probs recomputed over the recorded ids before the update (True) or the recorded behaviour
    log-probs (False). None: recompute only with more than one update epoch; with one epoch of on-policy data the
    recorded log-probs are π_old (they agree with a recomputation within 1e-4, tested) and the extra forward pass
    is skipped."""
    # critic (ppo, vapo, mpo)
    vf_coef: float = 0.5
    critic_lr: float = 1e-5
    value_clip: float | None = None
    critic_shared: bool = False
    """Value head on the policy backbone instead of a separate copy (§2 alternative)."""
    # rollouts
    temperature: float = 1.0
    max_new_tokens: int | None = None
    """Per-turn generation limit (None: the agent's default)."""
    context_mode: str | None = None
    """'concat' or 'window' (None: the agent's default)."""
    reset_options: dict = field(default_factory=dict)
    """Extra reset options for training episodes (e.g. {"family": "find_and_buy"})."""
    task_families: tuple = ()
    """Restrict training/eval tasks to these task families (empty: all)."""
    num_envs: int = 8
    env_kwargs: dict = field(default_factory=dict)
    """Keyword options for the env constructor (e.g. {"max_turns": 20}) for training and evaluation."""
    agent_kwargs: dict = field(default_factory=dict)
    """Keyword options for `agents.make("lm", ...)` when no `init` checkpoint is given."""
    max_length: int | None = None
    # evaluation / checkpoints
    eval_every: int = 1
    """Evaluate on the dev split every N iterations (0: only after the last one)."""
    eval_episodes: int = 16
    eval_split: str = "dev"
    """Split(s) to evaluate on, comma-separated (e.g. "dev,test")."""
    eval_greedy: bool = True
    eval_seed: int | None = None
    """Seed of the evaluation episodes (episode i gets eval_seed + i); None: 10_000 + the training seed. A fixed
    value evaluates every run on the same episodes (paired comparisons across seeds and algorithms)."""
    checkpoint_every: int = 1
    device: str = "cpu"

    @property
    def recomputes_old_logp(self) -> bool:
        return self.update_epochs > 1 if self.recompute_old_logp is None else bool(self.recompute_old_logp)

    def __post_init__(self) -> None:
        if self.loss_agg not in AGG_MODES:
            raise ConfigError(f"loss_agg={self.loss_agg!r}; choose one of {', '.join(AGG_MODES)}")
        if self.kl_kind not in ("k1", "k3"):
            raise ConfigError(f"kl_kind={self.kl_kind!r}; choose 'k1' or 'k3'")
        if self.micro_batch_tokens < 0 or self.micro_batch_rows < 0:
            raise ConfigError("micro_batch_tokens and micro_batch_rows must be >= 0 (0: no limit)")
        for name in ("group_size", "tasks_per_iter", "update_epochs", "minibatches", "num_envs"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.lr <= 0 or self.critic_lr <= 0:
            raise ConfigError("lr and critic_lr must be > 0")
        if not (0 <= self.clip_low < 1) or self.clip_high < 0:
            raise ConfigError(f"need 0 <= clip_low < 1 and clip_high >= 0, got {self.clip_low}, {self.clip_high}")
        if self.context_mode not in (None, "concat", "window"):
            raise ConfigError(f"context_mode={self.context_mode!r}; choose 'concat' or 'window'")
        bad = [x for x in str(self.eval_split).split(",") if x not in ("train", "dev", "test")]
        if bad:
            raise ConfigError(f"eval_split={self.eval_split!r}; use dev, test or train, comma-separated")
        if self.eval_every < 0 or self.eval_episodes < 0:
            raise ConfigError("eval_every and eval_episodes must be >= 0")
        if isinstance(self.task_families, str):
            self.task_families = tuple(f for f in self.task_families.split(",") if f)
        self.task_families = tuple(self.task_families)


@dataclass
class Advantages:
    """What `compute_advantages` returns. Token tensors are [R, S] like the batch."""

    adv: torch.Tensor
    returns: torch.Tensor | None = None
    """Critic targets per token (None: no critic loss)."""
    value_mask: torch.Tensor | None = None
    """Tokens whose value is regressed (default: generated tokens)."""
    value_groups: torch.Tensor | None = None
    """Group id of each value-regressed token, [R, S] (−1: none). The critic loss is then the mean over groups of
    each group's token-mean (`losses.group_mean_weights`); None: one token-mean over all of them."""
    token_mask: torch.Tensor | None = None
    """Tokens that enter the policy loss (default: generated tokens; DAPO/WAPO may drop some)."""
    metrics: dict = field(default_factory=dict)


@dataclass
class Ctx:
    """Per-batch tensors computed under no_grad before the update."""

    old_logp: torch.Tensor
    behav_logp: torch.Tensor
    values: torch.Tensor | None = None
    ref_logp: torch.Tensor | None = None
    iteration: int = 0
