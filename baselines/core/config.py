"""Configuration and small records of the shared LM training loop (`baselines.core.trainer`).

`LMConfig` holds the options every Shopping LM algorithm shares; each algorithm's `Config` subclasses it with its
paper's defaults (docs/algorithms/). `Advantages` is what an algorithm's `compute_advantages` returns, `Ctx` what the
trainer computed (no grad) before the update.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

import torch

from shopsim.configs import bounded, validate
from shopsim.errors import ConfigError

from .batch import RowTensors
from .losses import AGG_MODES

__all__ = ["LMConfig", "AggMode", "Truncation", "Advantages", "Ctx"]


AggMode = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
assert get_args(AggMode) == AGG_MODES  # one list of the aggregation modes (baselines.core.losses)
Truncation = Literal["terminal", "last_value"]
"""How GAE treats a truncated episode (`baselines.core.advantages`): as terminal, or bootstrapped from the value
at the start of the last turn."""


@dataclass
class LMConfig:
    """Options shared by every LM algorithm; each algorithm's Config subclasses this with its paper's defaults.

    Fields are checked by `shopsim.configs.validate` (types, Literal options, the bounds in their metadata);
    `__post_init__` adds the rules that involve several fields."""

    # optimisation
    lr: float = bounded(1e-6, gt=0)
    """Learning rate of the policy's AdamW optimizer."""
    weight_decay: float = bounded(0.0, min=0)
    """AdamW weight decay of the policy (and critic)."""
    lr_warmup_iters: int = bounded(0, min=0)
    """Iterations over which the learning rates (policy and critic) rise linearly to their set values at the start of
    a run; iteration k < W trains at (k + 1)/W of them. 0: no warm-up."""
    lr_decay: Literal["constant", "linear", "cosine"] = "constant"
    """The learning rates after the warm-up: held ("constant"), or decayed to zero at the end of the run, linearly
    (TRL's default scheduler) or along a half cosine; the run's last iteration still trains at a small positive
    rate (`baselines.core.trainer.lr_schedule_factor`)."""
    max_grad_norm: float = bounded(1.0, gt=0)
    """Gradient-norm clip per optimizer step."""
    group_size: int = bounded(8, min=1)
    """Rollouts per task (G); they share the task and the reset seed."""
    tasks_per_iter: int = bounded(8, min=1)
    """Tasks drawn per iteration; an iteration collects tasks_per_iter × group_size episodes."""
    update_epochs: int = bounded(1, min=1)
    """Passes over each iteration's batch."""
    minibatches: int = bounded(1, min=1)
    """Optimizer steps per epoch (the batch's `minibatch_unit`s are shuffled and split into this many parts)."""
    minibatch_unit: Literal["group", "row"] = "group"
    """What a minibatch is made of. "group": whole rollout groups (the rows of every trajectory that shares a group
    id, else of one trajectory), as verl and the cards count mini-batches in prompts: a group's advantages sum to
    zero, so tokens that all its rollouts share (the first turn's prefix) get no net push, and a step never sees a
    group's failures without its successes. "row": rows shuffled one by one (a group's rollouts can land in
    different steps; with Adam's momentum the first step's part of a group then steers the later ones)."""
    micro_batch_rows: int = bounded(0, min=0)
    """Most rows per forward/backward inside one optimizer step (gradient accumulation; 0 = no row limit).
    Normalisers are computed over the whole step, so the gradient does not depend on this value."""
    micro_batch_tokens: int = bounded(8192, min=0)
    """Length bucketing: a step's rows are sorted by length and cut into micro-batches of at most this many
    padded tokens, each trimmed to its own longest row, so padding costs almost nothing (0: one micro-batch of
    the whole minibatch, every row padded to the batch's longest). The gradient does not depend on it."""
    micro_batch_padding: float | None = bounded(0.125, min=0)
    """Length bucketing: the most padding a micro-batch may carry, as a share of its real tokens; a row that would
    pad its micro-batch beyond this starts the next one (rows are sorted by length, so only rows of very different
    lengths, such as a short and a long concat-mode episode, are kept apart). None: the token budget alone decides.
    The limit trades padding for more, smaller micro-batches; `benchmarks/bench_lm_rl.py` times the update without
    it as an ablation."""
    padding_mask: bool = False
    """Hand the padding mask to the model in the trainer's forward passes (π_old, π_ref, the update). False: the
    rows are right-padded, so causal attention never lets a real token see the padding after it and the model runs
    without a mask, on SDPA's causal kernel (`baselines.core.trainer.body_inputs`; the same log-probs within float
    error, tested). True: an explicit [B, 1, S, S] padding mask, dense attention (the previous path)."""
    # policy loss
    clip_low: float = bounded(0.2, min=0, lt=1)
    """ε_low of the clipped surrogate: the ratio is clipped below at 1 − clip_low."""
    clip_high: float = bounded(0.2, min=0)
    """ε_high of the clipped surrogate: the ratio is clipped above at 1 + clip_high (DAPO's clip-higher)."""
    dual_clip: float | None = bounded(None, gt=1)
    """Dual-clip constant c > 1 for negative advantages (the loss is capped at c·|A|); None: off."""
    loss_agg: AggMode = "token-mean"
    """How per-token losses are averaged (`baselines.core.losses.aggregate`): over all tokens of the batch, per
    sequence then over sequences, or summed per sequence."""
    normalize_advantage: bool = False
    """Whiten advantages over all generated tokens of the batch."""
    negative_advantage_scale: float = bounded(1.0, min=0)
    """Factor on every negative token advantage, after the algorithm's estimator (and the optional whitening): the
    weighting of negative against positive sample reinforcement of Zhu et al. 2025 (arXiv 2506.01347, §3; their
    W-REINFORCE weighs the positive part instead). 1: the algorithm as published; 0: only rollouts better than their
    baseline are reinforced (the update then cannot push a sampled token down)."""
    argmax_negative_scale: float = bounded(1.0, min=0)
    """Factor on the negative advantage of every token that was its distribution's arg-max under the policy being
    updated (the token greedy decoding picks there), on top of `negative_advantage_scale`. A failed rollout
    mostly follows the greedy path and fails at a few sampled deviations; pushing its arg-max tokens down moves the
    greedy path of every task that shares those decisions. 0: a failed rollout is blamed on its deviations from
    the arg-max only; 1: as published."""
    success_anchor_coef: float = bounded(0.0, min=0)
    """λ of a log-likelihood term on the arg-max tokens of the batch's successful rollouts, all groups included
    (those whose rollouts all succeeded carry no group-relative advantage): ``−λ · token-mean(log π)`` over those
    tokens. It widens the margin of the greedy choices that led to a success, the near-ties that an update's other
    tokens would otherwise flip on tasks the policy already solves. 0: off (every algorithm as published)."""
    kl_coef: float = bounded(0.0, min=0)
    """β of the KL penalty to the frozen reference policy in the loss (0: no reference copy is kept)."""
    kl_kind: Literal["k1", "k3"] = "k3"
    """KL estimator of the loss penalty: k1 = log π − log π_ref, k3 = the unbiased non-negative estimator."""
    entropy_coef: float = bounded(0.0, min=0)
    """Weight of the token-entropy bonus (0: entropy is not computed)."""
    recompute_old_logp: bool | None = None
    """π_old = log-probs recomputed over the recorded ids before the update (True) or the recorded behaviour
    log-probs (False). None: recompute only with more than one update epoch; with one epoch of on-policy data the
    recorded log-probs are π_old (they agree with a recomputation within 1e-4, tested) and the extra forward pass
    is skipped."""
    logprob_nucleus: bool = False
    """Policy log-probs of the update (and π_old, π_ref) under the distribution the rollouts were drawn from, the
    temperature-scaled softmax restricted to its top-p nucleus and renormalised, instead of the whole softmax. With
    top_p < 1 this is the score function of the sampling policy itself: a token that was its step's whole nucleus
    was drawn with probability 1, so it gets log-prob 0 and no gradient, where the whole softmax would push its
    probability up or down with the episode's advantage. Implies recomputing π_old (the sampler records whole-softmax
    log-probs). No effect at top_p = 1."""
    skip_zero_advantage_rows: bool = True
    """Leave out of the update's forward and backward passes the rows whose advantage is zero at every trained
    token (e.g. GRPO groups whose rollouts all got the same reward): their policy-loss gradient is exactly zero.
    Applies only when nothing else in the loss reads those rows (no KL term, no entropy, no critic, no extra
    loss); the step's normalisers still count them, so the update is the same."""
    # critic (ppo, vapo, mpo)
    vf_coef: float = bounded(0.5, min=0)
    """Weight of the critic's value loss (algorithms with a critic)."""
    critic_lr: float = bounded(1e-5, gt=0)
    """Learning rate of the critic (algorithms with a critic)."""
    value_clip: float | None = bounded(None, gt=0)
    """Clip of the value update around the old values (PPO-style value clipping); None: off."""
    critic_shared: bool = False
    """Value head on the policy backbone instead of a separate copy (docs/algorithms/ppo.md, the shared-backbone
    alternative)."""
    # rollouts
    temperature: float = bounded(1.0, gt=0)
    """Sampling temperature of the rollouts; log-probs are computed at the same temperature."""
    top_p: float = bounded(1.0, gt=0, max=1)
    """Nucleus mass of the rollouts' draws (1.0: off). The recorded and recomputed log-probs stay those of the whole
    distribution at `temperature`, as in verl and TRL with vLLM sampling, so the ratio of the first update step is
    exactly 1; what changes is which tokens can be drawn."""
    max_new_tokens: int | None = bounded(None, min=1)
    """Per-turn generation limit (None: the agent's default)."""
    context_mode: Literal["concat", "window"] | None = None
    """'concat' (one growing context per episode) or 'window' (a fresh prompt per turn); None: the agent's
    default."""
    reset_options: dict = field(default_factory=dict)
    """Extra reset options for training episodes (e.g. {"family": "find_and_buy"})."""
    task_families: tuple[str, ...] = ()
    """Restrict training/eval tasks to these task families (empty: all)."""
    train_task_ids: tuple[int, ...] = ()
    """Draw each iteration's training tasks from these train-split task ids (uniformly, with the rollout generator);
    empty: from the whole train split (in `task_families`). A benchmark screens such a pool once for tasks on which
    the start policy both succeeds and fails, so that groups of rollouts disagree (benchmarks/learning_lm.py)."""
    greedy_failed_share: float = bounded(0.0, min=0, max=1)
    """Share of each iteration's tasks drawn among those the current policy fails under greedy decoding: candidate
    tasks (drawn as usual, with their episode seeds) are first played once greedily, in rounds of `tasks_per_iter`
    candidates (at most `screen_rounds`), and the iteration takes round(share · tasks_per_iter) failed ones, the rest
    from the others in draw order (`LMAlgorithm.prefer_greedy_failures`). A group's rollouts only change what greedy
    decoding does where greedy decoding is wrong; on the tasks it solves their differences are slips of sampling.
    0: no screening."""
    screen_rounds: int = bounded(4, min=1)
    """Most screening rounds per iteration under `greedy_failed_share`; if they find fewer failures than asked for, the
    iteration fills up with solved candidates."""
    num_envs: int = bounded(8, min=1)
    """Env copies stepped together during rollouts and evaluation."""
    rollout_workers: int = bounded(0, min=0)
    """Ray workers that run each iteration's training rollouts (docs/scale.md, "Training rollouts on Ray"): the
    learner stays in this process and broadcasts the policy weights to the workers once per iteration; 0: roll out
    in this process. A seeded run gives the same rollouts (and curve) either way: each episode samples from its own
    stream. Needs the ``ray`` extra; a local Ray instance with this many CPUs is started unless this process has
    already joined one."""
    env_kwargs: dict = field(default_factory=dict)
    """Keyword options for the env constructor (e.g. {"max_turns": 20}) for training and evaluation."""
    agent_kwargs: dict = field(default_factory=dict)
    """Keyword options for `agents.make("lm", ...)` when no `init` checkpoint is given."""
    max_length: int | None = bounded(None, min=1)
    """Longest training row in tokens; a longer concat-mode row is an error (None: no limit)."""
    # evaluation / checkpoints
    eval_every: int = bounded(1, min=0)
    """Evaluate on the dev split every N iterations (0: only after the last one)."""
    eval_episodes: int = bounded(16, min=0)
    """Evaluation episodes (the first tasks of the split; 0: no evaluation)."""
    eval_split: str = "dev"
    """Split(s) to evaluate on, comma-separated (e.g. "dev,test")."""
    eval_greedy: bool = True
    """Evaluate with greedy decoding (False: sample at `temperature`)."""
    eval_sampled: bool = False
    """Also play the same evaluation episodes (same tasks and reset seeds) once with the rollouts' own sampling
    (`temperature`, `top_p`; per-episode streams seeded from the eval seed), logged as ``{split}_sampled_success``
    and per family: the objective RL climbs, next to the greedy success a table reports. Evaluation only, so not
    part of the config digest."""
    eval_seed: int | None = None
    """Seed of the evaluation episodes (episode i gets eval_seed + i); None: 10_000 + the training seed. A fixed
    value evaluates every run on the same episodes (paired comparisons across seeds and algorithms)."""
    checkpoint_every: int = bounded(1, min=0)
    """Save the checkpoint every N iterations (0: only after the last one)."""
    log_kl_start: bool = True
    """Log ``kl_start`` every iteration: the k1 estimate of KL(π_rollout ‖ π_start) on the sampled tokens, against a
    frozen copy of the policy as it started (a forward pass of that copy over `kl_start_rows` rows; False: no copy is
    kept)."""
    kl_start_rows: int = bounded(64, min=0)
    """Rows of the batch the ``kl_start`` estimate reads, evenly spaced over it (0: every row). The estimate is a mean
    over sampled tokens either way; a subset keeps the start model's forward pass a small part of the update."""
    device: str = "cpu"
    """Torch device of the policy, critic and update (e.g. "cuda")."""

    @property
    def recomputes_old_logp(self) -> bool:
        if self.logprob_nucleus and self.top_p < 1.0:
            return True
        return self.update_epochs > 1 if self.recompute_old_logp is None else bool(self.recompute_old_logp)

    def __post_init__(self) -> None:
        if isinstance(self.task_families, str):  # "a,b" from a command line or a JSON config
            self.task_families = tuple(f for f in self.task_families.split(",") if f)
        validate(self)
        if self.rollout_workers > 0:
            import importlib.util

            if importlib.util.find_spec("ray") is None:
                raise ConfigError(f"rollout_workers={self.rollout_workers} needs Ray: pip install 'shopsim[ray]', "
                                  "or set rollout_workers=0 to roll out in this process")
        bad = [x for x in str(self.eval_split).split(",") if x not in ("train", "dev", "test")]
        if bad:
            raise ConfigError(f"eval_split: expected dev, test or train, comma-separated, got {self.eval_split!r}")


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
    extra: RowTensors | None = None
    """The algorithm's extension: per-row tensors computed with the advantages that its loss hooks read (TrOPD's
    K1, trust region and teacher top-k). The trainer hands them on at each micro-batch's rows (`MicroBatch.ext`)."""


@dataclass
class Ctx:
    """Per-batch tensors computed under no_grad before the update."""

    old_logp: torch.Tensor
    behav_logp: torch.Tensor
    values: torch.Tensor | None = None
    ref_logp: torch.Tensor | None = None
    iteration: int = 0
