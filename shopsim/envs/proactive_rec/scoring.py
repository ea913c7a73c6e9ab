"""Batched scoring of whole recommendation paths under the frozen simulator (ProRL's step rewards).

ProRL (arXiv 2605.28293, §3-4; code) scores a generated path i_1..i_n for a user with history `hist` and a target:

    IoI_k = log P(target | hist ⊕ i_1..i_k) − log P(target | hist ⊕ i_1..i_{k−1})      (interest of interest)
    IoR_k = rank_before − rank_after of the target, rank = 1 + #items scored above it  (interest of rank)
    CTR_k = acceptance probability of i_k given the state before it

CTR. ProRL uses σ(h · e_i) with its SASRec's raw scale. Our simulators have other scales, so the score is
standardised over the catalog first: CTR_k = σ((s_{i_k} − mean_j s_j) / std_j s_j − `ctr_offset`) with the mean and
std in closed form (`Simulator.score_moments`); an item two standard deviations above the average item is accepted
with probability 1/2 (offset 2.0) [derived].

Special items (ProRL's rules):
* invalid (a semantic ID that names no item; passed here as item id −2): it is *not* appended to the history;
  CTR := −1; IoI, IoR := `fixed` constants (the env's per-step rule) or, with ``invalid="batch_min"``, the minimum
  over the batch's valid steps minus 1 (ProRL's rule; needs a batch, so only the scorer offers it);
* duplicate (already in the history or earlier in the path): appended as usual, IoI and IoR kept, CTR := 0.

Because the simulator is causal, one forward pass over hist ⊕ path gives the state after every prefix, so a whole
batch of paths is scored with one transformer call per `chunk` sequences plus one catalog pass per reached state.
That catalog pass (log-sum-exp and target rank over all n items) is ~80 % of the cost with SASRec; it streams
cache-sized row blocks through one reused buffer (`PathScorer._target_stats`). `PathScorer.score_reference` keeps
the first implementation (same results) for tests and `benchmarks.bench_proactive_rec`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from shopsim.envs.proactive_rec.world import World

STOP = -1  # no item at this position (after EOS / padding)
INVALID = -2  # a hallucinated semantic ID


@dataclass
class PathScores:
    """Per-step components [B, L] (zero where `step_mask` is False) and per-prefix target statistics [B, L+1]."""

    ioi: np.ndarray
    ior: np.ndarray
    ctr: np.ndarray
    valid: np.ndarray
    duplicate: np.ndarray
    step_mask: np.ndarray
    logp_target: np.ndarray  # after k steps, k = 0..L (k = 0: the history alone)
    target_rank: np.ndarray

    @property
    def lengths(self) -> np.ndarray:
        return self.step_mask.sum(1)


@dataclass
class RewardWeights:
    """Weights of the fused raw reward r = w_ctr·CTR + w_ioi·IoI + w_ior·IoR / ior_scale (env reward)."""

    w_ctr: float = 1.0
    w_ioi: float = 1.0
    w_ior: float = 1.0
    ior_scale: float = 500.0  # rank positions per reward unit; the env sets it to n_items / 10

    def fuse(self, ioi, ior, ctr):
        return self.w_ctr * ctr + self.w_ioi * ioi + self.w_ior * ior / self.ior_scale


@dataclass
class _Layout:
    """Index bookkeeping of one `PathScorer.score` call (B paths of L steps, histories of H items)."""

    hist: np.ndarray  # [B, H]
    tgt: np.ndarray  # [B]
    path: np.ndarray  # [B, L]
    seq: np.ndarray  # [B, H+L] history ⊕ valid items, padded with n
    step_mask: np.ndarray  # [B, L] a step exists (before the first STOP)
    valid: np.ndarray  # [B, L] the step is a real item
    before: np.ndarray  # [B, L] state index (valid items so far) before step k
    after: np.ndarray  # [B, L+1] state index after k steps
    need: np.ndarray  # [B, L+1] states the path reaches (scored against the catalog)
    flat: np.ndarray  # [B, L+1] row of each needed state in the flat [M] arrays (-1: not needed)
    state_row: np.ndarray  # [M] the path each needed state belongs to


class PathScorer:
    """Scores batches of paths (item ids, `STOP`, `INVALID`) for (history, target) pairs under `world.sim`."""

    def __init__(self, world: World, *, ctr_offset: float = 2.0, invalid_ioi: float = -2.0,
                 invalid_ior: float | None = None, chunk: int = 256, rows: int | None = None):
        self.world = world
        self.sim = world.sim
        self.n = world.n_items
        self.ctr_offset = ctr_offset
        self.invalid_ioi = invalid_ioi
        self.invalid_ior = -0.1 * self.n if invalid_ior is None else invalid_ior
        self.chunk = chunk  # sequences per transformer call
        self.rows = rows  # states per catalog-score block; None: `default_rows`

    def score(self, histories, targets, paths, *, invalid: str = "fixed") -> PathScores:
        """Step components of paths [B, L] (item ids, `STOP`, `INVALID`) for histories [B, H] and targets [B];
        `invalid` = "fixed" (the env's constants) or "batch_min" (ProRL's rule), see the module docstring."""
        lay = self._layout(histories, targets, paths)
        path, hist, valid = lay.path, lay.hist, lay.valid
        # duplicates: an item seen before in the history or earlier (as a valid item) in the path; [B, L, L] compare
        earlier = np.tri(path.shape[1], path.shape[1], -1, dtype=bool)[None] & valid[:, None, :]  # j < k, j valid
        seen = (path[:, :, None] == hist[:, None, :]).any(2) | ((path[:, :, None] == path[:, None, :]) & earlier).any(2)
        dup = valid & seen
        with torch.inference_mode():
            h = self._states(lay)
            lp_flat, rk_flat = self._target_stats(h[torch.as_tensor(lay.need)], lay.tgt[lay.state_row])
            ctr = self._ctr(h, lay)
        return self._assemble(lay, lp_flat, rk_flat, ctr, dup, invalid)

    @staticmethod
    def default_rows(n: int) -> int:
        """States per catalog block: ~640k scores (2.5 MB, cache-resident) on one thread; with t intra-op threads
        4t times that (1024 rows at 5k items, 2 threads: 20 MB, within a shared L3), because every op on a block is a
        parallel region whose barrier is costly on a busy machine (2 threads on 2 cores with load ~5, SASRec, 5k items:
        128-row blocks ran at 1k-23k steps/s from run to run, 1024-row blocks at 29k, 4096 at 33k; 1 thread: 68k, 57k,
        49k)."""
        t = torch.get_num_threads()
        return max(16, min(4096, (640_000 // n) * (1 if t == 1 else 4 * t)))

    def _target_stats(self, hs: torch.Tensor, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """log P(target | state) (float64 of the float32 value) and rank of the target for states hs [M, d].

        The [M, n] score matrix is never materialised: rows go through one cache-sized buffer (`rows` x n floats,
        `default_rows`) that the matmul writes into, so each pass below reads cache rather than freshly faulted memory.
        log-sum-exp uses the same torch ops as `torch.logsumexp` (max shift, exp, sum, log), in place, so log P is
        bit-identical to the reference; the rank (1 + #items scored strictly above the target) uses numpy's
        vectorised compare and a uint16 row count because torch's bool-output compare is ~6x slower on CPU.
        """
        m_all = len(hs)
        lp = np.empty(m_all, dtype=np.float32)
        rk = np.empty(m_all, dtype=np.int64)
        mat = self.sim._score_mat
        n = mat.shape[1]
        rows = self.rows or self.default_rows(n)
        buf = torch.empty(min(rows, max(m_all, 1)), n)
        above = np.empty(tuple(buf.shape), dtype=bool)
        count_dtype = np.uint16 if n <= 2 ** 16 else np.int64  # a count is at most n - 1
        t_all = torch.as_tensor(targets)
        for m0 in range(0, m_all, rows):
            sc = buf[: min(rows, m_all - m0)]
            m = len(sc)
            torch.mm(hs[m0:m0 + m], mat, out=sc)
            st = sc.gather(1, t_all[m0:m0 + m, None])  # [m, 1] the target's own score (same bits as in sc)
            gt = np.greater(sc.numpy(), st.numpy(), out=above[:m])
            rk[m0:m0 + m] = 1 + gt.view(np.uint8).sum(1, dtype=count_dtype)
            mx = sc.amax(1, keepdim=True)
            mx.masked_fill_(mx.abs() == float("inf"), 0.0)  # as torch.logsumexp does
            lse = sc.sub_(mx).exp_().sum(1).log_().add_(mx.squeeze(1))
            lp[m0:m0 + m] = (st.squeeze(1) - lse).numpy()
        return lp.astype(np.float64), rk

    def score_reference(self, histories, targets, paths, *, invalid: str = "fixed") -> PathScores:
        """The first implementation of `score` (torch `logsumexp` and bool compare on [2048, n] score blocks, python
        loop for duplicates), kept as the reference that tests and `benchmarks.bench_proactive_rec` compare the
        fast path against. Same results (log P bit-identical, ranks exact)."""
        lay = self._layout(histories, targets, paths)
        path, hist, valid = lay.path, lay.hist, lay.valid
        dup = np.zeros_like(valid)
        for k in range(path.shape[1]):
            cur = path[:, k:k + 1]
            seen = (hist == cur).any(1) | ((path[:, :k] == cur) & valid[:, :k]).any(1)
            dup[:, k] = valid[:, k] & seen
        with torch.no_grad():
            h = self._states(lay)
            hs = h[torch.as_tensor(lay.need)]  # [M, d]
            t_all = torch.as_tensor(lay.tgt[lay.state_row])
            lp_flat = torch.empty(len(hs), dtype=torch.float64)
            rk_flat = torch.empty(len(hs), dtype=torch.int64)
            step = 8 * self.chunk
            for m0 in range(0, len(hs), step):
                sc = self.sim.scores(hs[m0:m0 + step])  # [m, n]
                st = sc.gather(1, t_all[m0:m0 + step, None])
                lp_flat[m0:m0 + step] = (st.squeeze(1) - torch.logsumexp(sc, 1)).double()
                rk_flat[m0:m0 + step] = 1 + (sc > st).sum(1, dtype=torch.int32)
            ctr = self._ctr(h, lay)
        return self._assemble(lay, lp_flat.numpy(), rk_flat.numpy(), ctr, dup, invalid)

    # ------------------------------------------------------------------ shared by both implementations
    def _layout(self, histories, targets, paths) -> _Layout:
        hist = np.asarray(histories, dtype=np.int64)
        tgt = np.asarray(targets, dtype=np.int64)
        path = np.asarray(paths, dtype=np.int64)
        if path.ndim != 2 or hist.ndim != 2 or len(hist) != len(path) or len(tgt) != len(path):
            raise ValueError("score(histories [B,H], targets [B], paths [B,L]) with matching B")
        b, h_len = hist.shape
        length = path.shape[1]
        # a step exists until the first STOP
        step_mask = np.cumprod(path != STOP, axis=1).astype(bool)
        valid = step_mask & (path >= 0)
        if (path >= self.n).any() or (path < INVALID).any():
            raise ValueError(f"path entries must be item ids in [0, {self.n}), {STOP} (stop) or {INVALID} (invalid)")
        # compacted sequences hist ⊕ valid items, padded with the simulator's padding id n
        seq = np.full((b, h_len + length), self.n, dtype=np.int64)
        seq[:, :h_len] = hist
        n_valid = np.cumsum(valid, axis=1)  # valid items among the first k+1 steps
        rows, cols = np.nonzero(valid)
        seq[rows, h_len - 1 + n_valid[rows, cols]] = path[rows, cols]
        before = np.concatenate([np.zeros((b, 1), np.int64), n_valid[:, :-1]], axis=1)  # state index before step k
        after = np.concatenate([np.zeros((b, 1), np.int64), n_valid], axis=1)  # state index after k steps
        # only the states a path reaches are scored against the catalog (short paths cost less)
        need = np.arange(length + 1)[None] <= after[:, -1:]
        flat = np.full((b, length + 1), -1, dtype=np.int64)
        flat[need] = np.arange(int(need.sum()))
        return _Layout(hist, tgt, path, seq, step_mask, valid, before, after, need, flat, np.nonzero(need)[0])

    def _states(self, lay: _Layout) -> torch.Tensor:
        """[B, L+1, d]: the simulator's state after 0..L valid items (one causal pass per `chunk` sequences)."""
        h_len = lay.hist.shape[1]
        return torch.cat([self.sim.states(torch.as_tensor(lay.seq[s0:s0 + self.chunk]))[:, h_len - 1:]
                          for s0 in range(0, len(lay.seq), self.chunk)])

    def _ctr(self, h: torch.Tensor, lay: _Layout) -> np.ndarray:
        """CTR of each real item from the state before it: one dot product per step, closed-form moments."""
        hb = h[torch.arange(len(h))[:, None], torch.as_tensor(lay.before)]  # [B, L, d]
        cols = self.sim._score_mat[:, torch.as_tensor(np.where(lay.valid, lay.path, 0))]  # [d, B, L]
        si = torch.einsum("bld,dbl->bl", hb, cols)
        mu, sd = self.sim.score_moments(hb)
        return torch.sigmoid((si - mu) / sd - self.ctr_offset).double().numpy()

    def _assemble(self, lay: _Layout, lp_flat, rk_flat, ctr, dup, invalid: str) -> PathScores:
        """Step components from per-state log P / ranks and per-step CTR, with the special-item rules."""
        b = len(lay.path)
        logp = lp_flat[lay.flat[np.arange(b)[:, None], lay.after]]
        rank = rk_flat[lay.flat[np.arange(b)[:, None], lay.after]]
        step_mask, valid = lay.step_mask, lay.valid
        ioi = logp[:, 1:] - logp[:, :-1]
        ior = (rank[:, :-1] - rank[:, 1:]).astype(np.float64)
        ctr = np.where(dup, 0.0, ctr)
        inv = step_mask & ~valid
        if invalid == "fixed":
            ioi_fill, ior_fill = self.invalid_ioi, self.invalid_ior
        elif invalid == "batch_min":
            ioi_fill = (ioi[valid].min() if valid.any() else 0.0) - 1.0
            ior_fill = (ior[valid].min() if valid.any() else 0.0) - 1.0
        else:
            raise ValueError(f"invalid={invalid!r}; choose 'fixed' or 'batch_min'")
        ioi = np.where(inv, ioi_fill, ioi)
        ior = np.where(inv, ior_fill, ior)
        ctr = np.where(inv, -1.0, ctr)
        z = ~step_mask
        return PathScores(np.where(z, 0.0, ioi), np.where(z, 0.0, ior), np.where(z, 0.0, ctr), valid, dup,
                          step_mask, logp, rank)

    def score_codes(self, histories, targets, codes, lengths, *, invalid: str = "fixed") -> PathScores:
        """Score paths given as semantic-ID codes [B, L, 4] with per-row lengths (items before EOS)."""
        codes = np.asarray(codes, dtype=np.int64)
        items = self.world.sids.lookup(codes)
        items = np.where(items < 0, INVALID, items)
        pos = np.arange(codes.shape[1])[None]
        items = np.where(pos < np.asarray(lengths)[:, None], items, STOP)
        return self.score(histories, targets, items, invalid=invalid)


def path_metrics(s: PathScores) -> dict[str, float]:
    """Batch means of the env's episode metrics (IoI, IoR sums; CTR mean over items with invalid counted 0; length;
    invalid share), plus `distinct`: the share of distinct paths across the batch's users."""
    n = s.step_mask.sum(1)
    ctr = np.clip(s.ctr, 0.0, None) * s.step_mask
    inv = (s.step_mask & ~s.valid).sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        ctr_mean = np.where(n > 0, ctr.sum(1) / np.maximum(n, 1), 0.0)
        inv_share = np.where(n > 0, inv / np.maximum(n, 1), 0.0)
    return {"IoI": float(s.ioi.sum(1).mean()), "IoR": float(s.ior.sum(1).mean()), "CTR": float(ctr_mean.mean()),
            "length": float(n.mean()), "invalid": float(inv_share.mean())}
