"""The training batch built from `Trajectory` lists (docs/design.md, "The training batch").

Two context modes:

* **concat** — one row per trajectory. The last turn's ``prompt_ids + action_ids`` is the whole dialogue; turn k's
  ``prompt_ids`` extends turn k−1's ``prompt_ids + action_ids`` (checked, never re-tokenised). Generated
  segments are masked; env/user/tool tokens between them are not trained on. When an agent had to cut an
  episode's context to fit (turn k's prompt no longer extends the previous sequence), that episode continues in a
  new row starting at turn k, so the episode is split into prefix-consistent segments and every other episode of
  the batch keeps one row (the recorded log-probs stay exact: each row is what the model saw).
* **window** — one row per turn: ``prompt_ids_k + action_ids_k`` (the prompt is rebuilt by the agent).

Conventions. Per-token tensors are [R, S] (rows × padded length, right padding) aligned with `input_ids`: the
log-prob / value at position p belongs to the token at p (computed from the model's output at p−1), so
``gen_mask[r, p] = 1`` exactly at recorded action ids. Per-trajectory tensors are [N, K] (trajectories × turns).

Advantages that run across turns (token GAE, MPO) are computed in the **trajectory-token layout** [N, L]: each
trajectory's generated tokens in order, whatever the mode (`to_traj_tokens` / `from_traj_tokens` gather and
scatter between layouts). GAE skips env tokens anyway, so this is exact in both modes.

What several algorithms read travels here too: per-turn hidden summaries (BiPACE, DelTA) in `turn_hidden`,
strategy ids (ARC) and task ids (batch-level baselines with one rollout per task, BASIS); the trajectories
themselves stay in `trajectories` for whatever else an algorithm derives from them. Tensors that only one algorithm
needs are that algorithm's **extension**: a `RowTensors` dataclass it declares (TrOPD's teacher scores and trust
region), returned in `Advantages.extra` and handed to its loss hooks at the rows of each micro-batch
(`MicroBatch.ext`); its forward's own per-row tensors come back the same way (`Forward.extra` → `MicroBatch.fwd`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, Generic, TypeVar

import torch

from shopsim.errors import ConfigError
from shopsim.trajectory import Trajectory

from .stats import group_index

__all__ = ["Batch", "build_batch", "detect_mode", "RowTensors", "MicroBatch", "Forward"]

MODES = ("concat", "window")


def _extends(prev, cur) -> bool:
    full = list(prev.prompt_ids or []) + list(prev.action_ids or [])
    return list(cur.prompt_ids or [])[: len(full)] == full


def detect_mode(trajs: Sequence[Trajectory]) -> str:
    """'concat' when some turn's prompt extends the previous prompt+action, else 'window'.

    Turns that do not extend (a concat agent cut an episode that outgrew its context, or a window agent's window
    filled up) start a new row in `build_batch`, which is exact either way and encodes shared prefixes once.
    """
    for tr in trajs:
        for prev, cur in zip(tr.turns, tr.turns[1:], strict=False):
            full = list(prev.prompt_ids or []) + list(prev.action_ids or [])
            if list(cur.prompt_ids or [])[: len(full)] == full:
                return "concat"
    return "window"


@dataclass
class Batch:
    """Tensors for one training step. See the module docstring for layouts."""

    mode: str
    # per-row tokens [R, S]
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    gen_mask: torch.Tensor
    turn_index: torch.Tensor  # turn of each generated token, -1 elsewhere
    old_logp: torch.Tensor  # behaviour log-probs at generated tokens, 0 elsewhere
    row_traj: torch.Tensor  # [R] trajectory of each row
    row_turn: torch.Tensor  # [R] turn of each row (window) or first turn of the row (concat)
    # per trajectory [N] / [N, K]
    turn_rewards: torch.Tensor
    turn_mask: torch.Tensor
    turn_len: torch.Tensor  # generated tokens per turn
    terminated: torch.Tensor
    truncated: torch.Tensor
    returns: torch.Tensor  # sum of rewards
    success: torch.Tensor
    score: torch.Tensor
    group_ids: torch.Tensor
    task_ids: torch.Tensor
    strategy_ids: torch.Tensor
    group_keys: list
    task_keys: list
    strategy_keys: list
    # trajectory-token layout [N, L]
    traj_tok_index: torch.Tensor  # flat index into R*S
    traj_tok_mask: torch.Tensor
    traj_tok_turn: torch.Tensor
    # optional extras
    turn_hidden: dict[str, torch.Tensor] = field(default_factory=dict)  # name -> [N, K, H]
    trajectories: list[Trajectory] = field(default_factory=list, repr=False)

    # ----------------------------------------------------------------- views
    @property
    def num_rows(self) -> int:
        return self.input_ids.shape[0]

    @property
    def num_trajectories(self) -> int:
        return self.turn_rewards.shape[0]

    @property
    def num_generated_tokens(self) -> int:
        return int(self.gen_mask.sum())

    @property
    def traj_gen_len(self) -> torch.Tensor:
        return self.turn_len.sum(1)

    def to_traj_tokens(self, x: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
        """[R, S] per-token tensor -> [N, L] trajectory-token layout (generated tokens only, in order)."""
        flat = x.reshape(-1)
        out = flat[self.traj_tok_index.clamp_min(0)]
        return torch.where(self.traj_tok_mask, out, torch.full_like(out, fill))

    def from_traj_tokens(self, y: torch.Tensor) -> torch.Tensor:
        """[N, L] trajectory-token layout -> [R, S] (0 at non-generated positions)."""
        R, S = self.input_ids.shape
        out = torch.zeros(R * S + 1, dtype=y.dtype, device=y.device)
        idx = torch.where(self.traj_tok_mask, self.traj_tok_index, torch.full_like(self.traj_tok_index, R * S))
        out = out.scatter(0, idx.reshape(-1), y.reshape(-1))
        return out[: R * S].reshape(R, S)

    def traj_to_tokens(self, v: torch.Tensor) -> torch.Tensor:
        """Broadcast a per-trajectory value [N] to every generated token [R, S] (0 elsewhere)."""
        return v[self.row_traj][:, None] * self.gen_mask

    def turn_to_tokens(self, v: torch.Tensor) -> torch.Tensor:
        """Broadcast a per-turn value [N, K] to every generated token of that turn [R, S] (0 elsewhere)."""
        ti = self.turn_index.clamp_min(0)
        per_row = v[self.row_traj]  # [R, K]
        return torch.gather(per_row, 1, ti) * self.gen_mask

    def turn_starts(self) -> torch.Tensor:
        """[N, K] flat index (into R*S) of the first generated token of each turn, -1 where the turn is empty."""
        tt = self.traj_tok_turn
        first = torch.ones_like(self.traj_tok_mask)
        first[:, 1:] = tt[:, 1:] != tt[:, :-1]
        first &= self.traj_tok_mask
        N, K = self.turn_mask.shape
        out = torch.full((N, K + 1), -1, dtype=torch.long)
        k = torch.where(first, tt, torch.full_like(tt, K))
        out.scatter_(1, k, torch.where(first, self.traj_tok_index, torch.full_like(tt, -1)))
        return out[:, :K]

    def select_rows(self, rows: torch.Tensor, **per_token: torch.Tensor) -> dict[str, torch.Tensor]:
        """A minibatch of rows: the token tensors plus any extra per-token tensors given as keywords."""
        out = {k: getattr(self, k)[rows]
               for k in ("input_ids", "attention_mask", "gen_mask", "turn_index", "old_logp", "row_traj")}
        out.update({k: v[rows] for k, v in per_token.items() if v is not None})
        return out

    def to(self, device) -> Batch:
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, torch.Tensor):
                setattr(self, f.name, v.to(device))
        return self


def _keys(values) -> tuple[torch.Tensor, list]:
    return group_index([None if v is None else v for v in values])


def build_batch(trajs: Sequence[Trajectory], *, mode: str | None = None, pad_id: int = 0,
                max_length: int | None = None) -> Batch:
    """Build a `Batch` from trajectories recorded by an LM agent (`prompt_ids`, `action_ids`, `action_logprobs`).

    `mode` is 'concat' or 'window' (default: detected). `max_length` truncates rows from the left in window mode
    and raises in concat mode (cutting a dialogue would silently drop turns). In concat mode a turn that does not
    extend its episode's previous prompt+action starts a new row of that episode.
    """
    trajs = list(trajs)
    if not trajs:
        raise ConfigError("build_batch needs at least one trajectory")
    for i, tr in enumerate(trajs):
        for k, t in enumerate(tr.turns):
            if t.action_ids is None or t.prompt_ids is None:
                raise ConfigError(f"trajectory {i} turn {k} has no prompt_ids/action_ids; collect it with an LM agent")
    mode = mode or detect_mode(trajs)
    if mode not in MODES:
        raise ConfigError(f"mode must be one of {MODES}, got {mode!r}")
    N = len(trajs)
    K = max(1, max(len(tr.turns) for tr in trajs))
    rows: list[list[int]] = []
    segs: list[list[tuple[int, int, int]]] = []  # per row: (start, turn, traj)
    row_traj, row_turn = [], []
    for i, tr in enumerate(trajs):
        if mode == "concat":
            seq: list[int] = []
            rs: list[tuple[int, int, int]] = []
            for k, t in enumerate(tr.turns):
                p = list(t.prompt_ids or [])
                if p[: len(seq)] != seq:  # the context was cut here: the episode continues in a new row
                    rows.append(seq)
                    segs.append(rs)
                    row_traj.append(i)
                    row_turn.append(rs[0][1])
                    rs = []
                rs.append((len(p), k, i))
                seq = p + list(t.action_ids or [])
            rows.append(seq)
            segs.append(rs)
            row_traj.append(i)
            row_turn.append(rs[0][1] if rs else 0)
        else:
            for k, t in enumerate(tr.turns):
                p = list(t.prompt_ids or [])
                a = list(t.action_ids or [])
                if max_length is not None and len(p) + len(a) > max_length:
                    p = p[len(p) + len(a) - max_length:]
                rows.append(p + a)
                segs.append([(len(p), k, i)])
                row_traj.append(i)
                row_turn.append(k)
    S = max(1, max(len(r) for r in rows))
    if max_length is not None and mode == "concat" and S > max_length:
        raise ConfigError(f"concat row of {S} tokens exceeds max_length={max_length}; raise it or use window mode")
    R = len(rows)
    input_ids = torch.full((R, S), pad_id, dtype=torch.long)
    attn = torch.zeros(R, S, dtype=torch.long)
    gen = torch.zeros(R, S, dtype=torch.bool)
    tix = torch.full((R, S), -1, dtype=torch.long)
    old = torch.zeros(R, S)
    tok_lists: list[list[tuple[int, int]]] = [[] for _ in range(N)]  # per traj: (flat index, turn)
    for r, (seq, rs) in enumerate(zip(rows, segs, strict=False)):
        input_ids[r, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        attn[r, : len(seq)] = 1
        for start, k, i in rs:
            t = trajs[i].turns[k]
            n = len(t.action_ids or [])
            if n == 0:
                continue
            gen[r, start : start + n] = True
            tix[r, start : start + n] = k
            if t.action_logprobs is not None:
                if len(t.action_logprobs) != n:
                    raise ConfigError(f"trajectory {i} turn {k}: {len(t.action_logprobs)} log-probs for {n} action ids")
                old[r, start : start + n] = torch.tensor(t.action_logprobs, dtype=torch.float32)
            tok_lists[i].extend((r * S + start + j, k) for j in range(n))
    L = max(1, max(len(tl) for tl in tok_lists))
    tti = torch.full((N, L), -1, dtype=torch.long)
    ttt = torch.full((N, L), -1, dtype=torch.long)
    for i, tl in enumerate(tok_lists):
        if tl:
            tti[i, : len(tl)] = torch.tensor([a for a, _ in tl])
            ttt[i, : len(tl)] = torch.tensor([b for _, b in tl])
    rew = torch.zeros(N, K)
    tmask = torch.zeros(N, K, dtype=torch.bool)
    tlen = torch.zeros(N, K, dtype=torch.long)
    for i, tr in enumerate(trajs):
        for k, t in enumerate(tr.turns):
            rew[i, k] = float(t.reward)
            tmask[i, k] = True
            tlen[i, k] = len(t.action_ids or [])
    hidden: dict[str, torch.Tensor] = {}
    names = {n for tr in trajs for t in tr.turns if t.hidden for n in t.hidden}
    for name in sorted(names):
        dim = next(len(t.hidden[name]) for tr in trajs for t in tr.turns if t.hidden and name in t.hidden)
        h = torch.zeros(N, K, dim)
        for i, tr in enumerate(trajs):
            for k, t in enumerate(tr.turns):
                if t.hidden and name in t.hidden:
                    h[i, k] = torch.tensor(t.hidden[name], dtype=torch.float32)
        hidden[name] = h
    gids, gkeys = _keys([tr.group_id if tr.group_id is not None else ("traj", i) for i, tr in enumerate(trajs)])
    tids, tkeys = _keys([tr.task_id for tr in trajs])
    sids, skeys = _keys([tr.strategy for tr in trajs])
    return Batch(
        mode=mode, input_ids=input_ids, attention_mask=attn, gen_mask=gen, turn_index=tix, old_logp=old,
        row_traj=torch.tensor(row_traj, dtype=torch.long), row_turn=torch.tensor(row_turn, dtype=torch.long),
        turn_rewards=rew, turn_mask=tmask, turn_len=tlen,
        terminated=torch.tensor([tr.terminated for tr in trajs]),
        truncated=torch.tensor([tr.truncated for tr in trajs]),
        returns=rew.sum(1), success=torch.tensor([float(tr.success) for tr in trajs]),
        score=torch.tensor([tr.score for tr in trajs], dtype=torch.float32),
        group_ids=gids, task_ids=tids, strategy_ids=sids, group_keys=gkeys, task_keys=tkeys, strategy_keys=skeys,
        traj_tok_index=tti, traj_tok_mask=tti >= 0, traj_tok_turn=ttt,
        turn_hidden=hidden, trajectories=trajs,
    )


# ------------------------------------------------------------------------------------------ micro-batches
_Self = TypeVar("_Self", bound="RowTensors")


@dataclass
class RowTensors:
    """Base of an algorithm's typed extension: a dataclass whose tensor fields are indexed by the batch's rows
    first ([R, ...]; None for a tensor that is absent). `rows` selects rows of every tensor field."""

    def rows(self: _Self, r: torch.Tensor) -> _Self:
        """The same extension at rows `r` (non-tensor fields are kept as they are)."""
        return replace(self, **{f.name: getattr(self, f.name)[r] for f in fields(self)
                                if isinstance(getattr(self, f.name), torch.Tensor)})


Ext = TypeVar("Ext", bound=RowTensors)
FwdExt = TypeVar("FwdExt", bound=RowTensors)


@dataclass
class Forward(Generic[FwdExt]):
    """What the update's differentiable forward over a micro-batch returns (`LMAlgorithm.policy_forward`).
    Per-token tensors are [B, S] over the micro-batch's rows."""

    logp: torch.Tensor
    """log π_θ of every token (0 outside the trained positions)."""
    entropy: torch.Tensor | None = None
    """Token entropy, when the trainer asked for it."""
    hidden: torch.Tensor | None = None
    """Last hidden states, when a shared-backbone critic reads them."""
    collision: torch.Tensor | None = None
    """Σ_v p_v² of the next-token distribution, when the algorithm sets `needs_collision`."""
    is_argmax: torch.Tensor | None = None
    """Whether each token is the arg-max of its next-token distribution (bool), when `LMAlgorithm.needs_argmax`."""
    extra: FwdExt | None = None
    """The algorithm's own per-row tensors from the same forward (TrOPD: the student's log-probs at the teacher's
    top-k ids)."""


@dataclass
class MicroBatch(Generic[Ext, FwdExt]):
    """One micro-batch of an optimizer step, as the loss hooks receive it (`policy_loss_tok`, `extra_loss`,
    `token_metrics`, `policy_forward`). Per-token tensors are [B, S] over `rows`."""

    batch: Batch
    """The whole batch (for per-trajectory tensors such as `success`, indexed through `row_traj`)."""
    rows: torch.Tensor
    """The micro-batch's rows of the batch [B]."""
    step_rows: torch.Tensor
    """Every row of the optimizer step, rows skipped for a zero advantage included."""
    step_mask: torch.Tensor
    """The trained tokens of the whole step [len(step_rows), S] (for step-wide normalisers)."""
    adv: torch.Tensor
    """Advantages at `rows` (after the optional whitening)."""
    old_logp: torch.Tensor
    """π_old at `rows`: the recorded behaviour log-probs, or their recomputation (`recompute_old_logp`)."""
    behav_logp: torch.Tensor
    """The behaviour policy's recorded log-probs at `rows`."""
    w_tok: torch.Tensor
    """Token-mean weights of the micro-batch's trained tokens over the step (Σ over the step = 1)."""
    ext: Ext | None = None
    """The algorithm's extension from `compute_advantages` (`Advantages.extra`) at `rows`."""
    fwd: FwdExt | None = None
    """The algorithm's extension from this micro-batch's forward (`Forward.extra`); set once the forward ran."""

    @classmethod
    def of_rows(cls, batch: Batch, rows: torch.Tensor | None = None, **fields_: Any) -> MicroBatch:
        """A micro-batch of `rows` (default: every row) that is its own optimizer step, with the recorded
        log-probs as π_old and behaviour, zero advantages and token-mean weights over the generated tokens, unless
        `fields_` gives them (for calling the loss hooks outside the trainer)."""
        r = torch.arange(batch.num_rows, device=batch.gen_mask.device) if rows is None else rows
        gen = batch.gen_mask[r].float()
        base = dict(step_rows=r, step_mask=batch.gen_mask[r], adv=torch.zeros_like(gen),
                    old_logp=batch.old_logp[r], behav_logp=batch.old_logp[r], w_tok=gen / gen.sum().clamp_min(1))
        return cls(batch=batch, rows=r, **{**base, **fields_})

    @property
    def gen_mask(self) -> torch.Tensor:
        return self.batch.gen_mask[self.rows]

    @property
    def turn_index(self) -> torch.Tensor:
        return self.batch.turn_index[self.rows]

    @property
    def row_traj(self) -> torch.Tensor:
        return self.batch.row_traj[self.rows]
