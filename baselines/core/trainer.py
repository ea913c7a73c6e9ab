"""The language-agent algorithms' iteration on the shared loop (docs/algorithms/core.md).

One iteration: collect G rollouts per task with `shopsim.rollout.collect(..., group_size=G)` → build the
`Batch` → π_ref and critic values over the recorded ids (π_old too when `recompute_old_logp` asks for it; else the
recorded log-probs are π_old) → the algorithm's advantages → `update_epochs` × `minibatches` optimizer steps, each in
length-bucketed micro-batches (`micro_batch_tokens`) → evaluation on the dev split → checkpoint. The loop itself
(seeding, resume from `out_dir/state.safetensors`, `metrics.csv`, TensorBoard in `out_dir/tb`, the progress bar) is
`baselines.core.loop.LoopAlgorithm`, shared with every other algorithm; `LMAlgorithm` fills in its steps.

An algorithm subclasses `LMAlgorithm` and overrides only what its paper changes. Every hook below is public and
documented in docs/algorithms/core.md; no algorithm overrides a private method of this class (tested).

* `advantage_estimator` (class attribute) → a registered estimator of `baselines.core.advantages` (GRPO:
  ``"group_outcome"``, PPO: ``"token_gae"``), used by the default `compute_advantages`
* `compute_advantages(batch, ctx)`  → `Advantages` (token advantages [R, S], optional critic targets, and the
  algorithm's typed extension `Advantages.extra`, handed on to the loss hooks as `MicroBatch.ext`)
* `policy_loss_tok(mb, logp, adv, mask)` → per-token policy loss (default: PPO's clipped surrogate)
* `extra_loss(mb, logp, mask)`      → additional loss terms (VAPO's positive-example NLL)
* `policy_weights(batch, rows, mask)` → the step-wide per-token weights of the policy loss (default: `loss_agg`;
  WAPO's per-group normaliser)
* `token_metrics(mb, logp, ent, coll)` → logging-only statistics of each micro-batch's forward (WAPO's token bins)
* `policy_forward(mb, ...)`         → the update's forward as a `Forward`, whose `extra` reaches the loss hooks as
  `MicroBatch.fwd` (TrOPD: the student's log-probs at the teacher's top-k ids)
* `reduce_step_metrics(steps)`      → the iteration's update metrics from those of its optimizer steps (default:
  their means; TrOPD adds the largest gradient norm)
* `reads_zero_advantage_rows` (class attribute) → the loss reads rows whose advantage is zero (TrOPD's forward KL
  on outlier tokens), so they are never skipped (`skip_zero_advantage_rows`)
* `configure_agent(agent)`          → the agent's sampling options before rollouts (BiPACE: the hidden layer)
* `collect_batch(...)`              → rollout policy (DAPO's dynamic sampling)
* `before_training(...)`            → e.g. VAPO's value pre-training
* `eval_trajectory_metrics(split, trajs)` → extra evaluation metrics (midtrain's strategy mix)
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from baselines.base import TrainResult
from baselines.core.loop import LoopAlgorithm, Run
from shopsim.errors import ConfigError
from shopsim.trajectory import style_metrics, success_by_family, zero_variance_groups

from .batch import Batch, Forward, MicroBatch, build_batch
from .config import Advantages, Ctx, LMConfig
from .losses import (
    aggregate,
    aggregation_weights,
    clipped_surrogate,
    collision_from_logits,
    entropy_from_logits,
    group_mean_weights,
    kl_term,
    nucleus_token_logprobs,
    value_loss,
)
from .stats import explained_variance, masked_mean, masked_whiten
from .value_head import ValueModel

__all__ = ["LMConfig", "LMAlgorithm", "Advantages", "Ctx", "MicroBatch", "Forward", "forward_policy", "body_inputs",
           "sampling_as"]


def body_inputs(attention_mask: torch.Tensor, *, causal_only: bool = False) -> tuple[torch.Tensor | None, torch.Tensor]:
    """``(attention_mask, position_ids)`` to hand a causal LM for rows whose real tokens are marked by
    `attention_mask` [B, S]. Position ids are ``cumsum(mask) − 1`` (the LM agent's convention).

    `causal_only`: the rows are right-padded (each row's real tokens are a prefix of it; checked). Causal attention
    never lets a token see the padding after it, so the mask is dropped and positions are ``0..S−1``: the model
    (transformers with SDPA) then runs its plain causal attention, whose kernel skips the masked upper triangle,
    instead of a dense [B, 1, S, S] padding mask. The real tokens' outputs are the masked forward's up to float
    error (tested with Llama and GPT-2); outputs at the padding are meaningless and callers mask them out."""
    mask = attention_mask.bool()
    if causal_only:
        ar = torch.arange(mask.shape[-1], device=mask.device).expand(mask.shape)
        if not torch.equal(mask, ar < mask.sum(-1, keepdim=True)):
            raise ConfigError("forward_policy(causal_only=True) needs right-padded rows (real tokens first); "
                              "pass causal_only=False (LMConfig.padding_mask=True) for other layouts")
        return None, ar
    return attention_mask, (attention_mask.long().cumsum(-1) - 1).clamp_min(0)


def lr_schedule_factor(iteration: int, total: int, warmup: int, decay: str) -> float:
    """The learning-rate multiplier of iteration `iteration` (0-based) of a `total`-iteration run: a linear warm-up
    over `warmup` iterations ((k + 1)/warmup), then 1 ("constant") or a linear or half-cosine decay that would reach 0
    one iteration after the last."""
    if iteration < warmup:
        return (iteration + 1) / warmup
    if decay == "constant":
        return 1.0
    span = max(total - warmup, 1)
    done = min(iteration - warmup, span) / span
    if decay == "linear":
        return 1.0 - done
    if decay == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * done))
    raise ConfigError(f"lr_decay must be 'constant', 'linear' or 'cosine', got {decay!r}")


def forward_policy(model, input_ids, attention_mask, *, temperature: float = 1.0, need_hidden: bool = False,
                   need_entropy: bool = False, positions=None, need_collision: bool = False,
                   causal_only: bool = False, top_p: float = 1.0, need_argmax: bool = False):
    """One forward over right-padded rows: (logp [B,S] aligned with tokens, entropy [B,S] or None, hidden or None).

    `need_collision`: also return, as a fourth element, the collision probability Σ_v p_v² [B,S] of the full
    next-token distribution (WAPO's peak/valley threshold), computed from the same logits as the entropy.
    `need_argmax`: also return, last, whether each token is the arg-max of its distribution (bool [B,S], False at
    the first position and outside `positions`).

    Position ids are ``cumsum(mask) − 1`` (the LM agent's convention), log-probs use the sampling temperature.
    `positions` (bool [B,S], e.g. the batch's ``gen_mask``): compute log-probs and entropy only there (zeros
    elsewhere); the vocabulary-sized output layer then runs on those tokens only, which in window-mode shopping
    batches are ~7% of the tokens (the full [B,S,V] logits dominated update time and memory).
    `causal_only`: run without the padding mask (`body_inputs`); the hidden states at padding are then zeroed.
    `top_p` < 1: the log-probs are those of the top-p nucleus, renormalised (`losses.nucleus_token_logprobs`); the
    entropy and collision probability stay those of the whole distribution.
    """
    attn, pos = body_inputs(attention_mask, causal_only=causal_only)
    if positions is not None:
        body = model.base_model(input_ids=input_ids, attention_mask=attn, position_ids=pos, use_cache=False)
        hidden = body.last_hidden_state
        if need_hidden and causal_only:
            hidden = hidden * attention_mask.unsqueeze(-1).to(hidden.dtype)
        sel = positions[:, 1:].bool()
        h = hidden[:, :-1][sel]
        logits = model.get_output_embeddings()(h)
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature
        lp = torch.zeros(input_ids.shape, dtype=logits.dtype, device=logits.device)
        lp[:, 1:][sel] = nucleus_token_logprobs(logits, input_ids[:, 1:][sel], top_p)
        ent = None
        if need_entropy:
            ent = torch.zeros_like(lp)
            ent[:, 1:][sel] = entropy_from_logits(logits)
        out = [lp, ent, hidden if need_hidden else None]
        if need_collision:
            coll = torch.zeros_like(lp)
            coll[:, 1:][sel] = collision_from_logits(logits)
            out.append(coll)
        if need_argmax:
            am = torch.zeros(input_ids.shape, dtype=torch.bool, device=logits.device)
            am[:, 1:][sel] = logits.detach().argmax(-1) == input_ids[:, 1:][sel]
            out.append(am)
        return tuple(out)
    out = model(input_ids=input_ids, attention_mask=attn, position_ids=pos, use_cache=False,
                output_hidden_states=need_hidden)
    last = out.hidden_states[-1] if need_hidden else None
    if last is not None and causal_only:  # (need_hidden)
        last = last * attention_mask.unsqueeze(-1).to(last.dtype)
    logits = out.logits[:, :-1, :].to(torch.promote_types(out.logits.dtype, torch.float32)) / temperature
    lp = nucleus_token_logprobs(logits, input_ids[:, 1:], top_p)
    lp = torch.cat([torch.zeros_like(lp[:, :1]), lp], dim=1)
    ent = None
    if need_entropy:
        ent = entropy_from_logits(logits)
        ent = torch.cat([torch.zeros_like(ent[:, :1]), ent], dim=1)
    res = [lp, ent, last]
    if need_collision:
        coll = collision_from_logits(logits)
        res.append(torch.cat([torch.zeros_like(coll[:, :1]), coll], dim=1))
    if need_argmax:
        am = logits.detach().argmax(-1) == input_ids[:, 1:]
        res.append(torch.cat([torch.zeros_like(am[:, :1]), am], dim=1))
    return tuple(res)


@contextmanager
def sampling_as(agent, *, needed_by: str = "this", **fields) -> Iterator[None]:
    """Set fields of ``agent.sampling`` (``greedy``, ``temperature``, ...) for the block and put the old values back
    however it ends. Raises `ConfigError` naming the missing field (and `needed_by`, the option that asked for it)
    when the agent has no such sampling option."""
    samp = getattr(agent, "sampling", None)
    missing = [k for k in fields if samp is None or not hasattr(samp, k)]
    if missing:
        raise ConfigError(f"{needed_by} needs an agent with {', '.join(f'agent.sampling.{k}' for k in missing)}")
    saved = {k: getattr(samp, k) for k in fields}
    for k, v in fields.items():
        setattr(samp, k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(samp, k, v)


def kl_rows(num_rows: int, most: int) -> torch.Tensor:
    """Row indices of the ``kl_start`` estimate: `most` rows evenly spaced over the batch (every row when `most` is 0
    or the batch is no larger)."""
    if most <= 0 or num_rows <= most:
        return torch.arange(num_rows)
    return torch.linspace(0, num_rows - 1, most).round().long().unique()


class LMAlgorithm(LoopAlgorithm):
    """Base of the Shopping LM algorithms: the steps of the shared loop; subclasses define advantages (and loss
    tweaks)."""

    families: ClassVar[tuple[str, ...]] = ("shopping",)
    Config: ClassVar[type] = LMConfig
    train_options: ClassVar[tuple[str, ...]] = ("env_kwargs", "env_fns", "agent")
    min_iterations: ClassVar[int] = 0
    uses_critic: bool = False  # a class flag; ARC sets it per run from its config (setup)
    needs_entropy: ClassVar[bool] = False
    #: compute Σ_v p_v² at the trained positions in the update's forward and hand it to `token_metrics`
    needs_collision: ClassVar[bool] = False
    #: record per-turn hidden summaries during rollouts (the LM agent's ``sampling.record_hidden``; BiPACE)
    needs_hidden: ClassVar[bool] = False
    #: the name of a registered estimator (`baselines.core.advantages.estimator`) that the default
    #: `compute_advantages` calls with ``(batch, ctx, self.config)``; None: the algorithm overrides
    #: `compute_advantages`
    advantage_estimator: ClassVar[str | None] = None
    #: the loss hooks read rows whose advantage is zero at every trained token (TrOPD's forward KL on outlier
    #: tokens): such rows are then never left out of the update (`LMConfig.skip_zero_advantage_rows`)
    reads_zero_advantage_rows: ClassVar[bool] = False

    @property
    def needs_argmax(self) -> bool:
        """Whether the update's forward must say which tokens were the arg-max (`Forward.is_argmax`): asked for by
        `argmax_negative_scale` and `success_anchor_coef`. An algorithm with its own `policy_forward` reads it too."""
        c = self.config
        return c.argmax_negative_scale != 1.0 or c.success_anchor_coef > 0

    # ------------------------------------------------------------------ hooks
    def compute_advantages(self, batch: Batch, ctx: Ctx) -> Advantages:
        """Token advantages of `batch`: by default the registered `advantage_estimator`."""
        if self.advantage_estimator is None:
            raise NotImplementedError(f"{type(self).__name__}: set advantage_estimator or override "
                                      "compute_advantages")
        from .advantages import estimator

        return estimator(self.advantage_estimator)(batch, ctx, self.config)

    def policy_loss_tok(self, mb: MicroBatch, logp: torch.Tensor, adv: torch.Tensor,
                        mask: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """Per-token policy loss [B, S] of micro-batch `mb` and its statistics (token-weighted means are logged).
        Default: PPO's clipped surrogate against π_old (arXiv 1707.06347, eq. 7; dual clip as in verl)."""
        c = self.config
        return clipped_surrogate(logp, mb.old_logp, adv, mask, c.clip_low, c.clip_high, c.dual_clip)

    def extra_loss(self, mb: MicroBatch, logp: torch.Tensor,
                   mask: torch.Tensor) -> tuple[torch.Tensor | None, dict]:
        """An extra loss term of micro-batch `mb` (already normalised over the step) and its metrics; default none.
        Overriding it keeps zero-advantage rows in the update."""
        return None, {}

    def policy_weights(self, batch: Batch, rows: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Per-token weights w [len(rows), S] of one optimizer step's policy loss (Σ w·ℓ is the step's loss), built
        once over the whole step (`mask` = the step's trained tokens). Default: the `loss_agg` aggregation, where a
        sequence is a trajectory (its turns in window mode, its segments in a cut concat episode)."""
        seq_index = torch.unique(batch.row_traj[rows], return_inverse=True)[1]
        return aggregation_weights(mask, self.config.loss_agg, seq_index=seq_index)

    def token_metrics(self, mb: MicroBatch, logp: torch.Tensor, ent: torch.Tensor | None,
                      coll: torch.Tensor | None) -> dict:
        """Logging-only statistics of one micro-batch's forward (`coll`: Σ_v p_v² when `needs_collision`). The
        values are summed over the step's micro-batches, so return each micro-batch's share of a step-wide mean."""
        return {}

    def before_training(self, env_id: str, agent, rng: np.random.Generator, out_dir: Path) -> dict:
        return {}

    def eval_trajectory_metrics(self, split: str, trajs) -> dict:
        """Extra evaluation metrics from the evaluation trajectories of `split` (midtrain's strategy mix)."""
        return {}

    def algo_state(self) -> dict:
        """Algorithm state that must survive a resume (e.g. REINFORCE's EMA baseline)."""
        return {}

    def load_algo_state(self, state: dict) -> None:  # noqa: B027
        pass

    def reduce_step_metrics(self, steps: dict[str, list[float]]) -> dict[str, float]:
        """The update's metrics from those of its optimizer steps (`steps`: metric -> one value per step that
        logged it, in step order). Default: the mean of each."""
        return {k: float(np.mean(v)) for k, v in steps.items()}

    # ------------------------------------------------------------------ setup
    def make_agent(self, env_id: str, init, seed: int):
        import agents

        c = self.config
        kw = dict(c.agent_kwargs)
        if c.context_mode is not None:
            kw["context_mode"] = c.context_mode
        if init is not None:  # a checkpoint, or any local causal-LM folder (`shopsim model import`)
            from agents.lm.pretrained import load_start

            agent = load_start(init, env_id=env_id, **kw)
        else:
            agent = agents.make("lm", env_id, **kw)
        self.configure_agent(agent)
        return agent

    def configure_agent(self, agent) -> None:
        """Apply the config's sampling options to the agent, where it exposes them (temperature, top_p, the token
        limit, sampling rather than greedy decoding, hidden-state recording with `needs_hidden`, the context mode).
        An algorithm that needs more of the agent extends it and calls this one first (BiPACE: the hidden layer)."""
        c = self.config
        samp = getattr(agent, "sampling", None)
        if samp is not None:
            if hasattr(samp, "temperature"):
                samp.temperature = c.temperature
            if hasattr(samp, "top_p"):
                samp.top_p = c.top_p
            if c.max_new_tokens is not None and hasattr(samp, "max_new_tokens"):
                samp.max_new_tokens = c.max_new_tokens
            if hasattr(samp, "greedy"):
                samp.greedy = False
            if self.needs_hidden and hasattr(samp, "record_hidden"):
                samp.record_hidden = True
        if c.context_mode is not None and hasattr(agent, "context_mode"):
            agent.context_mode = c.context_mode

    def setup(self, agent) -> None:
        """Optimizers, critic and reference model for `agent.model`."""
        c = self.config
        self.agent = agent
        self.model = agent.model
        # dropout off everywhere (rollouts, π_old and the update see the same function; verl does the same)
        self.model.to(c.device).eval()
        tok = getattr(agent, "tokenizer", None)
        self.pad_id = int(getattr(agent, "pad_id", None) or getattr(tok, "pad_token_id", None) or 0)
        self.temperature = c.temperature
        params = [{"params": [p for p in self.model.parameters() if p.requires_grad], "lr": c.lr}]
        self.critic = None
        if self.uses_critic:
            self.critic = ValueModel(self.model, shared=c.critic_shared).to(c.device).eval()
            params.append({"params": list(self.critic.parameters()), "lr": c.critic_lr})
        self.optimizer = torch.optim.AdamW(params, weight_decay=c.weight_decay)
        self.ref_model = None
        if c.kl_coef > 0 or getattr(c, "kl_in_reward", 0) > 0:
            import copy

            self.ref_model = copy.deepcopy(self.model).eval()
            for p in self.ref_model.parameters():
                p.requires_grad_(False)
        # the policy as the run started (resumed runs rebuild it from their init before loading their state)
        self.start_model = None
        if c.log_kl_start:
            import copy

            self.start_model = copy.deepcopy(self.model).eval()
            for p in self.start_model.parameters():
                p.requires_grad_(False)

    # ------------------------------------------------------------------ one update
    def _rows_forward(self, model, ids, attn, *, need_entropy=False, need_hidden=False, positions=None,
                      need_collision=False, whole_softmax=False, need_argmax=False):
        """`forward_policy` at the rollout temperature, under the rollout nucleus when `logprob_nucleus` asks for it
        (`whole_softmax`: never, for comparisons with the sampler's recorded log-probs)."""
        c = self.config
        top_p = c.top_p if c.logprob_nucleus and not whole_softmax else 1.0
        return forward_policy(model, ids, attn, temperature=self.temperature, need_entropy=need_entropy,
                              need_hidden=need_hidden, positions=positions, need_collision=need_collision,
                              causal_only=not c.padding_mask, top_p=top_p, need_argmax=need_argmax)

    def policy_forward(self, mb: MicroBatch, *, need_entropy: bool = False, need_hidden: bool = False) -> Forward:
        """The update's differentiable forward over the rows of `mb`, as a `Forward`: the log-probs of the trained
        tokens, the entropy and hidden states when asked for, and with `needs_collision` Σ_v p_v² at the trained
        positions. An algorithm that needs more from the same forward (TrOPD: the student's log-probs at the
        teacher's top-k ids) overrides it and returns its tensors in `Forward.extra`; the loss hooks then read
        them as `mb.fwd`."""
        batch, r = mb.batch, mb.rows
        coll = self.needs_collision  # Σ_v p_v² from the same forward, for `token_metrics` (WAPO's token bins)
        am = self.needs_argmax
        out = list(self.trimmed(lambda i, a, g: self._rows_forward(
            self.model, i, a, need_entropy=need_entropy, need_hidden=need_hidden, positions=g, need_collision=coll,
            need_argmax=am), batch, r, batch.gen_mask[r]))
        return Forward(logp=out[0], entropy=out[1], hidden=out[2], collision=out[3] if coll else None,
                       is_argmax=out[-1] if am else None)

    def micro_batches(self, batch: Batch, rows: torch.Tensor) -> list[torch.Tensor]:
        """Split `rows` into micro-batches, returned as positions into `rows`: length-bucketed under
        `micro_batch_tokens`, `micro_batch_padding` (and `micro_batch_rows`).

        Rows are sorted by length and taken in order while ``rows × longest row`` stays within the token budget
        and the padding stays within `micro_batch_padding` of the micro-batch's real tokens, so each micro-batch is
        padded only to its own longest row (see `trimmed`) and rows of very different lengths (a short episode
        and a long one in concat mode) do not share one."""
        c = self.config
        pos = torch.arange(len(rows), device=rows.device)
        if not c.micro_batch_tokens:
            if c.micro_batch_rows and c.micro_batch_rows < len(rows):
                return list(torch.split(pos, c.micro_batch_rows))
            return [pos]
        lengths = batch.attention_mask[rows].sum(1)
        order = torch.argsort(lengths, stable=True)
        out: list[torch.Tensor] = []
        cur: list[int] = []
        width, real = 0, 0
        for j in order.tolist():
            n = int(lengths[j])
            full = c.micro_batch_rows and len(cur) >= c.micro_batch_rows
            padded = max(width, n) * (len(cur) + 1)
            too_padded = c.micro_batch_padding is not None and padded - real - n > c.micro_batch_padding * (real + n)
            if cur and (full or padded > c.micro_batch_tokens or too_padded):
                out.append(torch.tensor(cur, device=rows.device))
                cur, width, real = [], 0, 0
            cur.append(j)
            width, real = max(width, n), real + n
        if cur:
            out.append(torch.tensor(cur, device=rows.device))
        return out

    def trimmed(self, fn, batch: Batch, r: torch.Tensor, *args, **kwargs):
        """Run ``fn(ids, attn, *args, **kwargs)`` on rows `r` cut to their longest row (right padding), then pad
        every [B, S']-shaped tensor of the result back to the batch width S."""
        S = batch.input_ids.shape[1]
        w = max(1, int(batch.attention_mask[r].sum(1).max()))
        cut = [a[:, :w] if isinstance(a, torch.Tensor) and a.dim() >= 2 and a.shape[1] == S else a for a in args]
        cut_kw = {k: v[:, :w] if isinstance(v, torch.Tensor) and v.dim() >= 2 and v.shape[1] == S else v
                  for k, v in kwargs.items()}
        out = fn(batch.input_ids[r, :w], batch.attention_mask[r, :w], *cut, **cut_kw)

        def pad(x):
            if isinstance(x, torch.Tensor) and x.dim() >= 2 and x.shape[1] == w and w < S:
                return torch.nn.functional.pad(x, (0, 0) * (x.dim() - 2) + (0, S - w))
            return x

        return tuple(pad(x) for x in out) if isinstance(out, tuple) else pad(out)

    @torch.no_grad()
    def prepare(self, batch: Batch, iteration: int = 0) -> Ctx:
        """π_old (when recomputed), π_ref and critic values over the recorded ids (no grad, micro-batched)."""
        c = self.config
        critic = self.critic
        shared = critic is not None and critic.shared
        behav = batch.old_logp
        need_old = c.recomputes_old_logp
        R = batch.num_rows
        old = torch.zeros_like(behav) if need_old else None
        ref = torch.zeros_like(behav) if self.ref_model is not None else None
        values = torch.zeros_like(behav) if critic is not None else None
        if need_old or ref is not None or values is not None:
            for r in self.micro_batches(batch, torch.arange(R, device=behav.device)):
                gen = batch.gen_mask[r]
                hid = None
                if need_old or shared:
                    lp, _, hid = self.trimmed(lambda i, a, g: self._rows_forward(
                        self.model, i, a, need_hidden=shared, positions=g), batch, r, gen)
                    if old is not None:  # (need_old)
                        old[r] = lp
                if ref is not None:
                    ref[r] = self.trimmed(lambda i, a, g: self._rows_forward(self.ref_model, i, a, positions=g),
                                           batch, r, gen)[0]
                if values is not None and critic is not None:  # (values are made exactly when there is a critic)
                    values[r] = self.trimmed(lambda i, a, h: critic(i, a, hidden=h), batch, r, hid)
        if values is not None:
            values = values * batch.gen_mask
        old_pi = old * batch.gen_mask if old is not None else behav
        return Ctx(old_logp=old_pi, behav_logp=behav, values=values, ref_logp=ref, iteration=iteration)

    def apply_lr_schedule(self, iteration: int) -> float:
        """Set every optimizer group's rate for `iteration` (`lr_schedule_factor` of the rate it was built with, over
        the run's iterations); returns the policy's rate. Outside a training run (no `run`) the factor is 1."""
        c = self.config
        run = getattr(self, "run", None)
        total = run.iterations if run is not None else iteration + 1
        f = lr_schedule_factor(iteration, total, c.lr_warmup_iters, c.lr_decay)
        for g in self.optimizer.param_groups:
            g["lr"] = g.setdefault("initial_lr", g["lr"]) * f
        return float(self.optimizer.param_groups[0]["lr"])

    def update(self, batch: Batch, iteration: int = 0, generator: torch.Generator | None = None) -> dict:
        """Advantages and `update_epochs` × `minibatches` optimizer steps on `batch`; returns mean metrics."""
        c = self.config
        batch = batch.to(c.device)
        ctx = self.prepare(batch, iteration)
        advs = self.compute_advantages(batch, ctx)
        gen = batch.gen_mask.float()
        tok_mask = gen if advs.token_mask is None else advs.token_mask.float() * gen
        adv = advs.adv * gen
        if c.normalize_advantage:
            adv = masked_whiten(adv, tok_mask)
        if c.negative_advantage_scale != 1.0:
            adv = torch.where(adv < 0, adv * c.negative_advantage_scale, adv)
        metrics: dict[str, float] = {k: float(v) for k, v in advs.metrics.items()}
        metrics["adv_mean"] = float(masked_mean(adv, tok_mask))
        if advs.returns is not None and ctx.values is not None:
            vm = gen if advs.value_mask is None else advs.value_mask.float()
            metrics["explained_variance"] = explained_variance(ctx.values, advs.returns, vm)
        metrics["lr"] = self.apply_lr_schedule(iteration)
        acc: dict[str, list[float]] = {}
        for _ in range(c.update_epochs):
            for rows in self.minibatch_rows(batch, generator):
                m = self._minibatch_step(batch, rows, ctx, advs, adv, tok_mask)
                for k, v in m.items():
                    acc.setdefault(k, []).append(v)
        metrics.update(self.reduce_step_metrics(acc))
        return metrics

    def minibatch_rows(self, batch: Batch, generator: torch.Generator | None = None) -> list[torch.Tensor]:
        """One epoch's minibatches as sorted row indices: the batch's units (`minibatch_unit`: whole groups, or
        single rows) in a random order from `generator`, split into `minibatches` parts of nearly equal unit count.
        With "row" the draw is the plain row permutation (``torch.randperm(R)``)."""
        c = self.config
        R = batch.num_rows
        if c.minibatch_unit == "row":
            unit = torch.arange(R)
        else:  # a trajectory without a group has a group id of its own (build_batch)
            unit = batch.group_ids.cpu()[batch.row_traj.cpu()]
        ids = torch.unique(unit)
        perm = ids[torch.randperm(len(ids), generator=generator)]
        out = []
        for part in torch.tensor_split(perm, min(c.minibatches, len(ids))):
            if part.numel():
                out.append(torch.nonzero(torch.isin(unit, part)).flatten().to(c.device))
        return out

    def _minibatch_step(self, batch: Batch, rows, ctx: Ctx, advs: Advantages, adv, tok_mask) -> dict:
        """One optimizer step on `rows`, in micro-batches of `micro_batch_rows` with step-wide normalisers."""
        c = self.config
        need_ent = c.entropy_coef > 0 or self.needs_entropy
        shared = self.critic is not None and self.critic.shared
        need_coll = self.needs_collision
        mask_all = tok_mask[rows]
        # weights computed over the whole step: Σ_micro Σ w·ℓ equals the aggregate over the step exactly
        w_pol = self.policy_weights(batch, rows, mask_all)
        w_tok = aggregation_weights(mask_all, "token-mean")
        vmask_all = (batch.gen_mask if advs.value_mask is None else advs.value_mask)[rows].float()
        if advs.value_groups is None:
            w_val = aggregation_weights(vmask_all, "token-mean")
        else:
            w_val = group_mean_weights(vmask_all, advs.value_groups[rows])
        w_anchor = won = None
        if c.success_anchor_coef > 0:  # token-mean over the step's tokens of successful rollouts
            won = (batch.success.to(mask_all.device)[batch.row_traj] > 0)[:, None]  # [R, 1], every row of the batch
            w_anchor = aggregation_weights(mask_all * won[rows].to(mask_all.dtype), "token-mean")
        full_rows = rows
        if self._zero_rows_skippable(ctx, need_ent):
            live = ((adv[rows] != 0) & (tok_mask[rows] > 0)).any(1)
            keep = torch.nonzero(live).squeeze(1)
            rows, mask_all_idx = rows[keep], keep  # the normalisers above still count the skipped rows
            w_pol, w_tok, w_val = w_pol[keep], w_tok[keep], w_val[keep]
            if w_anchor is not None:
                w_anchor = w_anchor[keep]
        else:
            mask_all_idx = None
        chunks = self.micro_batches(batch, rows) if len(rows) else []
        self.optimizer.zero_grad(set_to_none=True)
        acc: dict[str, float] = {}
        stats: dict[str, float] = {}
        for ch in chunks:
            r = rows[ch]
            mask = tok_mask[r]
            mb: MicroBatch = MicroBatch(batch=batch, rows=r, step_rows=full_rows, step_mask=mask_all, adv=adv[r],
                                        old_logp=ctx.old_logp[r], behav_logp=ctx.behav_logp[r], w_tok=w_tok[ch],
                                        ext=None if advs.extra is None else advs.extra.rows(r))
            fwd = self.policy_forward(mb, need_entropy=need_ent, need_hidden=shared)
            mb.fwd = fwd.extra
            logp, ent, hid = fwd.logp, fwd.entropy, fwd.hidden
            coll = fwd.collision if need_coll else None
            is_am = fwd.is_argmax
            if self.needs_argmax and is_am is None:
                raise ConfigError(f"argmax_negative_scale and success_anchor_coef need the arg-max of each token "
                                  f"from the policy forward, which {type(self).__name__}.policy_forward does not "
                                  "return; leave them at 1 and 0 for this algorithm")
            if is_am is not None and c.argmax_negative_scale != 1.0:
                mb.adv = torch.where((mb.adv < 0) & is_am, mb.adv * c.argmax_negative_scale, mb.adv)
            pg_tok, st = self.policy_loss_tok(mb, logp, mb.adv, mask)
            if is_am is not None:  # how much of the sampled text is the greedy choice
                st = {**st, "argmax_token_share": masked_mean(is_am.float(), mask)}
            for k, v in self.token_metrics(mb, logp, ent, coll).items():
                stats[k] = stats.get(k, 0.0) + float(v)
            lp = (pg_tok * w_pol[ch]).sum()
            loss = lp
            parts = {"loss_policy": lp}
            if ctx.ref_logp is not None and c.kl_coef > 0:
                kl = (kl_term(logp, ctx.ref_logp[r], c.kl_kind) * w_pol[ch]).sum()
                loss = loss + c.kl_coef * kl
                parts["kl_ref"] = kl
            if ent is not None:
                h = (ent * w_tok[ch]).sum()
                parts["entropy"] = h
                if c.entropy_coef > 0:
                    loss = loss - c.entropy_coef * h
            if is_am is not None and w_anchor is not None and won is not None:  # (success_anchor_coef > 0)
                keep = mask * (is_am & won[r]).to(mask.dtype)
                anc = -(logp * keep * w_anchor[ch]).sum()
                loss = loss + c.success_anchor_coef * anc
                parts["loss_anchor"] = anc
            extra, em = self.extra_loss(mb, logp, mask)
            if extra is not None:
                loss = loss + extra
            for k, v in em.items():
                stats[k] = stats.get(k, 0.0) + float(v) / len(chunks)
            if self.critic is not None and advs.returns is not None:
                v_new = self.trimmed(lambda i, a, h: self.critic(i, a, hidden=h), batch, r, hid)
                assert ctx.values is not None  # prepare() makes them when there is a critic
                vl_tok, _ = value_loss(v_new, ctx.values[r], advs.returns[r], c.value_clip)
                vl = (vl_tok * w_val[ch]).sum()
                loss = loss + c.vf_coef * vl
                parts["loss_value"] = vl
            loss.backward()
            parts["loss"] = loss
            for k, v in parts.items():
                acc[k] = acc.get(k, 0.0) + float(v.detach())
            share = float(mask.sum()) / max(float(tok_mask[rows].sum()), 1.0)
            for k, v in st.items():  # token-weighted means of the surrogate's statistics
                stats[k] = stats.get(k, 0.0) + float(v) * share
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        for p in params:  # skipped rows contribute a zero gradient: momentum and weight decay still apply
            if p.grad is None and p.requires_grad:
                p.grad = torch.zeros_like(p)
        gn = torch.nn.utils.clip_grad_norm_(params, c.max_grad_norm)
        self.optimizer.step()
        if not chunks:  # every row had zero advantage: the policy loss is exactly 0
            acc = {"loss_policy": 0.0, "loss": 0.0}
        out = {**acc, **stats, "grad_norm": float(gn)}
        if mask_all_idx is not None:
            out["rows_skipped_zero_adv"] = float(len(full_rows) - len(rows))
        out["tokens_processed"] = float(batch.attention_mask[rows].sum()) if len(rows) else 0.0
        # what the passes ran over, padding included (each micro-batch is trimmed to its longest row)
        padded = 0
        if len(rows):  # (no rows: no chunks)
            lengths = batch.attention_mask[rows].sum(1)
            padded = sum(len(ch) * int(lengths[ch].max()) for ch in chunks)
        out["tokens_processed_padded"] = float(padded)
        return out

    def _zero_rows_skippable(self, ctx: Ctx, need_ent: bool) -> bool:
        """Whether rows with zero advantage everywhere add nothing to the loss (see `skip_zero_advantage_rows`)."""
        c = self.config
        return (c.skip_zero_advantage_rows and not need_ent and not self.needs_collision and self.critic is None
                and c.success_anchor_coef == 0
                and (ctx.ref_logp is None or c.kl_coef == 0) and not self.reads_zero_advantage_rows
                and type(self).extra_loss is LMAlgorithm.extra_loss)

    # ------------------------------------------------------------------ rollouts
    def train_tasks(self, env_id: str, rng: np.random.Generator, n: int) -> list | None:
        """n training task ids drawn from `train_task_ids`, else from the env's train split (None: let the env draw from
        the seed)."""
        from baselines.core.tasks import sample_tasks

        pool = self.config.train_task_ids
        if pool:
            return [int(pool[int(i)]) for i in rng.integers(0, len(pool), size=n)]
        return sample_tasks(env_id, "train", rng, n, families=self.config.task_families)

    def rollout_collect(self):
        """The collect function of training rollouts: `shopsim.rollout.collect` in this process, or with
        `rollout_workers` > 0 the same call on Ray workers (`shopsim.distributed.RayPool.collect`; the pool starts
        on first use and ends with the run). Each call broadcasts the policy's current weights (one ``ray.put`` of
        the state dict); the workers' agent counters are added to the driver agent's ``stats``."""
        c = self.config
        if not c.rollout_workers:
            from shopsim.rollout import collect

            return collect
        if self._pool is None:
            from shopsim.distributed import RayPool

            self._pool = RayPool(workers=c.rollout_workers, option="rollout_workers")
        pool = self._pool

        def collect(env_id, agent, **kwargs):
            stats = getattr(agent, "stats", None)
            return pool.collect(env_id, agent, broadcast_weights=True,
                                agent_stats=stats if isinstance(stats, dict) else None, **kwargs)

        return collect

    def teardown_run(self) -> None:
        if getattr(self, "_pool", None) is not None:
            self._pool.close()
            self._pool = None

    def collect_batch(self, env_id: str, agent, iteration: int, rng: np.random.Generator,
                      env_kwargs: dict | None = None, env_fns=None, progress: bool = False):
        """G rollouts for each of `tasks_per_iter` tasks; returns (trajectories, metrics)."""
        collect = self.rollout_collect()
        c = self.config
        tasks, seeds, screen = self.iteration_tasks(env_id, agent, rng, env_kwargs=env_kwargs, env_fns=env_fns)
        trajs = collect(env_id, agent, tasks=tasks, seeds=seeds, episodes=c.tasks_per_iter if tasks else None,
                        split="train", group_size=c.group_size, num_envs=c.num_envs, env_kwargs=env_kwargs,
                        reset_options=dict(c.reset_options) or None, progress=progress, env_fns=env_fns,
                        agent_seed=int(rng.integers(0, 2**31 - 1)))
        return trajs, {"rollouts": len(trajs), **screen}

    def draw_tasks(self, env_id: str, rng: np.random.Generator) -> tuple[list | None, list[int]]:
        """`tasks_per_iter` training tasks (`train_tasks`) and a reset seed for each."""
        n = self.config.tasks_per_iter
        return self.train_tasks(env_id, rng, n), [int(s) for s in rng.integers(0, 2**31 - 1, size=n)]

    def iteration_tasks(self, env_id: str, agent, rng: np.random.Generator, *, env_kwargs=None, env_fns=None,
                        draw=None) -> tuple[list | None, list[int], dict]:
        """The iteration's tasks, their reset seeds and the screening metrics: `draw` (default `draw_tasks`) as it
        comes, or with `greedy_failed_share` the episodes greedy decoding fails first (`prefer_greedy_failures`)."""
        draw = draw or (lambda r: self.draw_tasks(env_id, r))
        tasks, seeds = draw(rng)
        if self.config.greedy_failed_share <= 0:
            return tasks, seeds, {}
        return self.prefer_greedy_failures(env_id, agent, tasks, seeds, rng, env_kwargs=env_kwargs, env_fns=env_fns,
                                           draw=draw)

    def prefer_greedy_failures(self, env_id: str, agent, tasks: list | None, seeds: list[int],
                               rng: np.random.Generator, *, env_kwargs=None, env_fns=None, draw=None):
        """The iteration's (tasks, seeds) under `greedy_failed_share`: each candidate episode (task and reset seed) is
        played once with greedy decoding, and round(share · n) of the failed ones come first, then solved ones in
        draw order (failed ones again when too few were solved). Rounds of n new candidates (`draw`, default
        `draw_tasks`) are drawn while fewer failures than asked for were found, at most `screen_rounds`. Returns the
        chosen lists and the metrics ``screen_rollouts``, ``screen_greedy_success`` (over every screened episode) and
        ``greedy_failed_tasks`` (the share of the iteration's tasks that greedy decoding failed).

        A rollout wrapper that guides the policy (TrOPD's teacher prefixes) names the policy's own agent `unguided`;
        the screen plays that one: what greedy decoding of the policy fails."""
        from shopsim.rollout import collect

        c = self.config
        agent = getattr(agent, "unguided", agent)
        draw = draw or (lambda r: self.draw_tasks(env_id, r))
        if tasks is None:
            raise ConfigError(f"greedy_failed_share needs task ids; {env_id} draws its tasks from the reset seed")
        n = len(tasks)
        want = round(c.greedy_failed_share * n)
        failed: list[tuple[int, int]] = []
        solved: list[tuple[int, int]] = []
        with sampling_as(agent, needed_by="greedy_failed_share", greedy=True):
            for r in range(c.screen_rounds):
                if r:
                    tasks, seeds = draw(rng)
                    tasks = tasks or []
                played = collect(env_id, agent, tasks=tasks, seeds=seeds, split="train", num_envs=c.num_envs,
                                 env_kwargs=env_kwargs, reset_options=dict(c.reset_options) or None, progress=False,
                                 env_fns=env_fns, agent_seed=int(rng.integers(0, 2**31 - 1)))
                for t, s, tr in zip(tasks, seeds, played, strict=True):
                    (solved if tr.success else failed).append((int(t), int(s)))
                if len(failed) >= want:
                    break
        take = failed[:want]
        chosen = take + (solved + failed[want:])[: n - len(take)]
        screened, bad = len(failed) + len(solved), set(failed)
        metrics = {"screen_rollouts": screened, "screen_greedy_success": len(solved) / screened,
                   "greedy_failed_tasks": sum(1 for x in chosen if x in bad) / n}
        return [t for t, _ in chosen], [s for _, s in chosen], metrics

    def evaluate(self, env_id: str, agent, *, seed: int, env_kwargs=None, env_fns=None) -> dict:
        """Success / score on each eval split (``eval_split="dev"`` or ``"dev,test"``), greedy by default, with
        fixed task ids (the first `eval_episodes` of the split, families interleaved) and fixed seeds."""
        from baselines.core.tasks import eval_tasks
        from shopsim.rollout import collect

        c = self.config
        if c.eval_episodes == 0:
            return {}
        # agents without a greedy switch (a scripted or toy agent) are evaluated as they decode
        switch = hasattr(getattr(agent, "sampling", None), "greedy")
        out = {}
        with sampling_as(agent, greedy=c.eval_greedy) if switch else nullcontext():
            for split in [s for s in c.eval_split.split(",") if s]:
                tasks = eval_tasks(env_id, split, c.eval_episodes, families=c.task_families)
                n = c.eval_episodes if tasks is None else len(tasks)

                def play(tasks=tasks, n=n, split=split):
                    return collect(env_id, agent, tasks=tasks, seeds=[seed + i for i in range(n)],
                                   episodes=n if tasks is None else None, split=split, num_envs=c.num_envs,
                                   env_kwargs=env_kwargs, progress=False, env_fns=env_fns,
                                   reset_options=dict(c.reset_options) or None, agent_seed=seed)

                if c.eval_sampled and switch:
                    with sampling_as(agent, greedy=False):
                        sampled = play()
                    out[f"{split}_sampled_success"] = float(np.mean([t.success for t in sampled]))
                    out.update({f"{split}_sampled_success/{fam}": v
                                for fam, v in success_by_family(sampled).items()})
                trajs = play()
                out[f"{split}_success"] = float(np.mean([t.success for t in trajs]))
                out[f"{split}_score"] = float(np.mean([t.score for t in trajs]))
                out[f"{split}_turns"] = float(np.mean([t.num_turns for t in trajs]))
                out.update({f"{split}_success/{fam}": v for fam, v in success_by_family(trajs).items()})
                # how the policy talks when no strategy is instructed (ARC's check): question share, latency proxy
                out.update({f"{split}_{k}": v for k, v in style_metrics(trajs).items()})
                out.update(self.eval_trajectory_metrics(split, trajs))
        return out

    def pretrain_critic(self, env_id: str, agent, rng: np.random.Generator, steps: int, batches: int = 2) -> dict:
        """VAPO-style value pre-training (arXiv 2504.05118): roll out the frozen initial policy, regress the critic
        on Monte-Carlo returns (token GAE with λ = 1, γ = 1) for `steps` critic-only steps.

        One more batch of rollouts is held out and never trained on: its explained variance before and after
        (``pretrain_heldout_ev_before`` / ``_after``) says whether the critic learned values or memorised returns.
        """
        from .advantages import token_gae_for_batch

        if self.critic is None:
            raise ConfigError(f"{self.name}: value pre-training needs a critic")
        c = self.config
        data = []
        for _ in range(max(1, batches) + 1):
            trajs, _ = LMAlgorithm.collect_batch(self, env_id, agent, -1, rng, env_kwargs=self._env_kwargs,
                                                 env_fns=self._env_fns)
            b = build_batch(trajs, pad_id=self.pad_id, max_length=c.max_length).to(c.device)
            zeros = torch.zeros_like(b.old_logp)
            _, ret = token_gae_for_batch(b, zeros, gamma=1.0, lam=1.0)
            # length-bucketed micro-batches, each cut to its longest row, as in the update: a bundle episode's
            # ~3000-token rows no longer pad every short row of the batch to their width
            mbs = self.micro_batches(b, torch.arange(b.num_rows, device=b.input_ids.device))
            hids = [None] * len(mbs)
            if self.critic.shared:
                with torch.no_grad():
                    hids = [self.trimmed(lambda i, a, g: self._rows_forward(
                        self.model, i, a, need_hidden=True, positions=torch.zeros_like(g)), b, r, b.gen_mask[r])[2]
                        for r in mbs]
            data.append((b, ret, mbs, hids))
        held = data.pop()

        def critic_rows(b, r, hid):
            return self.trimmed(lambda i, a, h: self.critic(i, a, hidden=h), b, r, hid)

        @torch.no_grad()
        def ev_of(d) -> float:
            b, ret, mbs, hids = d
            v = torch.zeros_like(ret)
            for r, hid in zip(mbs, hids, strict=True):
                v[r] = critic_rows(b, r, hid)
            return explained_variance(v, ret, b.gen_mask)

        ev_before = ev_of(held)
        params = [p for p in (self.critic.head.parameters() if self.critic.shared else self.critic.parameters())]
        opt = torch.optim.AdamW(params, lr=c.critic_lr)
        losses = []
        for s in range(steps):
            b, ret, mbs, hids = data[s % len(data)]
            n_tok = b.gen_mask.sum().clamp_min(1)  # the token-mean over the whole batch, accumulated
            opt.zero_grad(set_to_none=True)
            total = 0.0
            for r, hid in zip(mbs, hids, strict=True):
                vl = aggregate(value_loss(critic_rows(b, r, hid), None, ret[r])[0], b.gen_mask[r], "token-mean",
                               num_tokens=n_tok)
                vl.backward()
                total += float(vl.detach())
            torch.nn.utils.clip_grad_norm_(params, c.max_grad_norm)
            opt.step()
            losses.append(total)
        return {"pretrain_steps": steps, "pretrain_rollouts": sum(d[0].num_trajectories for d in [*data, held]),
                "pretrain_value_loss_first": losses[0] if losses else float("nan"),
                "pretrain_value_loss_last": losses[-1] if losses else float("nan"),
                "pretrain_explained_variance": ev_of(data[0]), "pretrain_heldout_ev_before": ev_before,
                "pretrain_heldout_ev_after": ev_of(held)}

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, directory: Path, env_id: str | None = None) -> Path:
        """Save the policy so `agents.load_checkpoint(directory)` rebuilds it (and the critic next to it)."""
        directory = Path(directory)
        save = getattr(self.agent, "save_checkpoint", None) or getattr(self.agent, "save", None)
        if save is None:
            raise ConfigError(f"{type(self.agent).__name__} cannot be saved (no save_checkpoint/save method)")
        save(directory)
        if self.critic is not None:
            self.critic.save(directory)
        return directory

    # ------------------------------------------------------------------ steps of the shared loop
    def setup_run(self, run: Run) -> None:
        """The agent (`run.options["agent"]`, else from `run.init` or the default LM agent), optimizers, critic,
        reference model, env options and the rollout generator."""
        c = self.config
        self.rng = np.random.default_rng(run.seed)
        agent = run.options.get("agent")
        if agent is None:
            agent = self.make_agent(run.env_id, run.init, run.seed)
        else:
            self.configure_agent(agent)
        self.setup(agent)
        # the checkpoint's own env options (e.g. the rendering it was fine-tuned on) unless the config overrides them
        env_kwargs = {**(getattr(agent, "env_kwargs", None) or {}), **c.env_kwargs,
                      **(run.options.get("env_kwargs") or {})} or None
        self._env_kwargs, self._env_fns = env_kwargs, run.options.get("env_fns")
        # reseeded from (seed, iteration) before every update, so it carries no state across a resume
        self._update_gen = torch.Generator().manual_seed(run.seed)
        self._pool = None  # the Ray workers of `rollout_workers`, started by the first rollout

    def start_fresh(self, run: Run) -> None:
        pre = self.before_training(run.env_id, self.agent, self.rng, run.out_dir)
        if pre:
            (run.out_dir / "pretrain.json").write_text(json.dumps(pre, indent=2, default=float))

    def rng_streams(self) -> dict:
        return {"rollouts": self.rng}

    def iteration(self, it: int) -> dict:
        """Collect, build the batch, update; the row holds rollout, timing and update metrics."""
        c, agent, run = self.config, self.agent, self.run
        t0 = time.perf_counter()
        stats = getattr(agent, "stats", None)
        enc0 = (stats.get("encoded_tokens", 0), stats.get("turns", 0)) if isinstance(stats, dict) else None
        trajs, cm = self.collect_batch(run.env_id, agent, it, self.rng, env_kwargs=self._env_kwargs,
                                       env_fns=self._env_fns)
        t1 = time.perf_counter()
        # what the model ran over per agent turn (enc0 is set when stats is a dict)
        if enc0 is not None and isinstance(stats, dict) and stats.get("turns", 0) > enc0[1]:
            cm["tokens_encoded_per_turn"] = (stats["encoded_tokens"] - enc0[0]) / (stats["turns"] - enc0[1])
        # the layout is detected from the recorded ids (a concat episode whose context was cut is split into
        # prefix-consistent rows, see build_batch)
        batch = build_batch(trajs, pad_id=self.pad_id, max_length=c.max_length)
        diag = self.rollout_diagnostics(batch)
        self._update_gen.manual_seed(run.seed * 1_000_003 + it)
        m = self.update(batch, it, generator=self._update_gen)
        t2 = time.perf_counter()
        return {"iteration": it + 1, **cm,
                "train_success": float(np.mean([t.success for t in trajs])),
                **{f"train_success/{f}": v for f, v in success_by_family(trajs).items()},
                **zero_variance_groups(trajs), **diag,
                "train_score": float(np.mean([t.score for t in trajs])),
                "train_return": float(np.mean([t.total_reward for t in trajs])),
                "train_turns": float(np.mean([t.num_turns for t in trajs])),
                # question share and answer-latency proxy of the rollouts (empty for envs without episode metrics)
                **{f"train_{k}": v for k, v in style_metrics(trajs).items()},
                "gen_tokens": batch.num_generated_tokens,
                "rollout_s": t1 - t0, "update_s": t2 - t1,
                "train_tokens_per_s": float(batch.attention_mask.sum()) * c.update_epochs / max(t2 - t1, 1e-9),
                **m}

    @torch.no_grad()
    def rollout_diagnostics(self, batch: Batch) -> dict:
        """What the rollouts say about the policy before the update: ``entropy_sampled`` (mean −log π of the sampled
        tokens at the rollout temperature, an estimate of the policy's token entropy) and, with `log_kl_start`,
        ``kl_start`` (mean of log π_rollout − log π_start over the sampled tokens: the k1 estimate of
        KL(π_rollout ‖ π_start))."""
        gen = batch.gen_mask.float()
        n = float(gen.sum())
        if n == 0:
            return {}
        behav = batch.old_logp
        out = {"entropy_sampled": float(-(behav * gen).sum() / n)}
        if self.start_model is not None:
            start = torch.zeros_like(behav)
            rows = kl_rows(batch.num_rows, self.config.kl_start_rows).to(behav.device)
            for at in self.micro_batches(batch, rows):  # positions into `rows`
                r = rows[at]
                start[r] = self.trimmed(lambda i, a, g: self._rows_forward(self.start_model, i, a, positions=g,
                                                                             whole_softmax=True),
                                         batch, r, batch.gen_mask[r])[0]
            sel = gen[rows]
            if float(sel.sum()) > 0:
                out["kl_start"] = float(((behav[rows] - start[rows]) * sel).sum() / sel.sum())
        return out

    def evaluation(self, it: int) -> dict:
        c, seed = self.config, self.run.seed
        ev_seed = 10_000 + seed if c.eval_seed is None else c.eval_seed
        return self.evaluate(self.run.env_id, self.agent, seed=ev_seed, env_kwargs=self._env_kwargs,
                             env_fns=self._env_fns)

    def state_dict(self) -> dict:
        state = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                 "algo_state": self.algo_state()}
        if self.critic is not None:
            state["critic"] = self.critic.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.critic is not None and "critic" in state:
            self.critic.load_state_dict(state["critic"])
        self.load_algo_state(state.get("algo_state", {}))

    def progress_postfix(self, row: dict) -> dict:
        return {"success": f"{row['train_success']:.2f}", "loss": f"{row.get('loss', float('nan')):.3g}"}

    def train(self, env_id: str | None = None, *, iterations: int, seed: int = 0, out_dir="runs/train", init=None,
              progress: bool = True, resume: bool = True, **options: Any) -> TrainResult:
        """Train for `iterations` iterations on the shared loop (`baselines.core.loop`; module docstring).
        Options: `env_kwargs`, `env_fns`, and `agent` (an agent object that overrides `init`, for tests)."""
        return super().train(env_id, iterations=iterations, seed=seed, out_dir=out_dir, init=init,
                             progress=progress, resume=resume, **options)
