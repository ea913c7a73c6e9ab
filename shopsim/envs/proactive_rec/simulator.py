"""The frozen user model of the proactive-recommendation env: P(next item | interaction history).

ProRL (arXiv 2605.28293) scores recommendation paths with a frozen SASRec (Kang & McAuley 2018) trained
on real interaction logs: the user state is the encoder output at the last position, item scores are state · item
embedding, recommended items are appended to the sequence as if consumed. We have no logs, so the SASRec here is
trained on **synthetic interaction sequences** drawn from a hidden "true" user process over the catalog embeddings
(`generate_sequences`):

    i_0 ~ uniform over items;  v_0 = e[i_0]                    (taste starts at a random item)
    for t = 1..T−1:
        with prob. p_jump (0):    v_t = e[j], j uniform         (interest jump: a new "genre")
        else:                     v_t = normalise(ρ v_{t−1} + (1−ρ) e[i_{t−1}]),  ρ = 0.85   (slow drift)
        i_t ~ softmax(β · e·v_t) over the 50 best-matching items not yet consumed, β = 10
        with prob. p_explore = 0.2: i_t := a uniform unconsumed item instead (exploratory consumption)

Why these defaults (changed before v0's release; the first draft used p_jump = 0.1, ρ = 0.7, no exploration).
With frequent jumps and no exploratory items, an off-genre item in the training data almost always *is* a jump, so
SASRec learned that the last item alone sets the interest: one or two items near the target moved it from rank
~1400 to ~20 of 2000 and log P(target) then stalled (mean IoI of the expert by position 3.8, 2.6, 1.4, 0.8, ...;
IoR 980, 330, 100, 33). Paths longer than 2-3 items were worthless, which is not the setting of ProRL, whose ML-1M
paths steer interest over up to 10 steps. With a slow drift and 20 % exploratory consumption, a single off-genre
item is mostly noise and interest moves ~15 % per consumed item, so IoI stays informative over ~10 steps
(2k-item catalog, greedy expert: IoI by position 1.35, 0.70, 0.51, 0.54, 0.38, 0.50, 0.43, 0.37; the target's
median rank 1665 → 1212 → 918 → 640 → 448 → 346 → 229 → 169 → 134 → 91).

Two simulators share one interface (`states`, `scores`):

* `SASRecSimulator` (default): 2 causal self-attention layers, d = 32, 2 heads, learned absolute positions, item
  embeddings tied with the output layer, trained by next-item cross-entropy over the full catalog; cached on disk.
* `AnalyticSimulator`: the state is the decayed mean of the history embeddings (decay 0.8 per step), scores are
  β · state · e with β = 10 — no training, closed form.

Both are deterministic given the sequence, so the per-step env and the batched path scorer agree.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from shopsim.paths import cache_dir, write_text_atomic

MAX_SEQ = 32  # positions: 10 history items + at most 10 recommendations fit with room to spare
SIM_VERSION = 2  # cache key of the trained SASRec weights (bumped when the sequence process changes)
P_JUMP, RHO, P_EXPLORE = 0.0, 0.85, 0.2  # defaults of the hidden user process (module docstring)


# ------------------------------------------------------------------ synthetic interaction sequences
def generate_sequences(emb: np.ndarray, n_seqs: int, length: int, *, seed: int | list[int], beta: float = 10.0,
                       p_jump: float | None = None, rho: float | None = None, p_explore: float | None = None,
                       top: int = 50, chunk: int = 1024) -> np.ndarray:
    """Sample `n_seqs` item sequences of `length` from the hidden user process (module docstring). int64 [n, L]."""
    p_jump = P_JUMP if p_jump is None else p_jump
    rho = RHO if rho is None else rho
    p_explore = P_EXPLORE if p_explore is None else p_explore
    rng = np.random.default_rng(seed)
    e = np.asarray(emb, dtype=np.float32)
    n = len(e)
    out = np.empty((n_seqs, length), dtype=np.int64)
    for s0 in range(0, n_seqs, chunk):
        b = min(chunk, n_seqs - s0)
        seq = np.empty((b, length), dtype=np.int64)
        seq[:, 0] = rng.integers(n, size=b)
        v = e[seq[:, 0]].copy()
        rows = np.arange(b)
        for t in range(1, length):
            jump = rng.random(b) < p_jump
            drift = rho * v + (1 - rho) * e[seq[:, t - 1]]
            v = np.where(jump[:, None], e[rng.integers(n, size=b)], drift)
            v /= np.linalg.norm(v, axis=1, keepdims=True)
            s = v @ e.T
            s[rows[:, None], seq[:, :t]] = -np.inf  # no repeats
            cand = np.argpartition(-s, top, axis=1)[:, :top]
            logits = beta * np.take_along_axis(s, cand, 1)
            g = rng.gumbel(size=logits.shape)  # Gumbel-max = one softmax sample per row
            seq[:, t] = cand[rows, np.argmax(logits + g, axis=1)]
            if p_explore > 0:  # exploratory consumption: a uniform item (not a taste change by itself)
                explore = rng.random(b) < p_explore
                pick = rng.integers(n, size=b)
                fresh = ~(seq[:, :t] == pick[:, None]).any(1)
                seq[:, t] = np.where(explore & fresh, pick, seq[:, t])
        out[s0:s0 + b] = seq
    return out


# ------------------------------------------------------------------ SASRec
class SASRec(nn.Module):
    """A small SASRec: causal transformer over item ids; scores = state · item embeddings (tied)."""

    def __init__(self, n_items: int, d: int = 32, layers: int = 2, heads: int = 2, dropout: float = 0.1,
                 init_emb: np.ndarray | None = None):
        super().__init__()
        self.n_items = n_items
        self.item = nn.Embedding(n_items + 1, d, padding_idx=n_items)  # last row = padding
        with torch.no_grad():  # content-based init (unit catalog embeddings): trains in a few epochs on CPU
            if init_emb is not None:
                self.item.weight[:n_items] = torch.as_tensor(np.asarray(init_emb, dtype=np.float32))
            else:
                self.item.weight.normal_(0.0, d ** -0.5)
            self.item.weight[n_items] = 0.0
        self.pos = nn.Embedding(MAX_SEQ, d)
        layer = nn.TransformerEncoderLayer(d, heads, 2 * d, dropout, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.drop = nn.Dropout(dropout)

    def states(self, seqs: torch.Tensor) -> torch.Tensor:
        """Causal user states [B, T, d] for item sequences [B, T] (state t has seen items 0..t)."""
        t = seqs.shape[1]
        x = self.item(seqs) * (self.item.embedding_dim ** 0.5) + self.pos.weight[:t]
        mask = torch.triu(torch.full((t, t), float("-inf")), 1)
        h = self.encoder(self.drop(x), mask=mask, is_causal=True)
        return self.norm(h)

    def item_matrix(self) -> torch.Tensor:
        return self.item.weight[: self.n_items]


def train_sasrec(emb: np.ndarray, *, seed: int, n_seqs: int = 6000, length: int = 20, epochs: int = 3,
                 batch: int = 128, lr: float = 3e-3, log=None) -> tuple[SASRec, dict]:
    """Train SASRec on synthetic sequences (full-softmax next-item cross-entropy); returns (model, report)."""
    t0 = time.time()
    seqs = generate_sequences(emb, n_seqs, length, seed=seed + 17)
    n_val = max(1, n_seqs // 10)
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = SASRec(len(emb), init_emb=emb)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    train = torch.as_tensor(seqs[n_val:])
    model.train()
    for ep in range(epochs):
        perm = torch.randperm(len(train), generator=g)
        for i in range(0, len(train), batch):
            x = train[perm[i:i + batch]]
            h = model.states(x[:, :-1])
            logits = h @ model.item_matrix().T
            loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
        if log:
            log(f"sasrec epoch {ep}: loss {loss.item():.3f}")
    model.eval()
    with torch.no_grad():
        val = torch.as_tensor(seqs[:n_val])
        logits = model.states(val[:, :-1]) @ model.item_matrix().T
        val_loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), val[:, 1:].reshape(-1)).item()
        hit10 = (logits.topk(10, -1).indices == val[:, 1:, None]).any(-1).float().mean().item()
    return model, {"val_loss": val_loss, "val_hit@10": hit10, "train_seconds": time.time() - t0,
                   "n_seqs": n_seqs, "length": length, "epochs": epochs}


# ------------------------------------------------------------------ simulators (shared interface)
class Simulator:
    """Frozen next-item model. `states(seqs)` [B,T,d] causal states; `scores(h)` [..., n] item scores."""

    kind = "base"
    item_emb: torch.Tensor  # [n, d] the vectors scores are taken against (used for CTR)

    def states(self, seqs: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def scores(self, h: torch.Tensor) -> torch.Tensor:
        return h @ self._score_mat

    def score_moments(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and std over all items of the scores of state(s) h, in closed form (O(d²), no [n] pass)."""
        mean = h @ self._mean_vec
        var = ((h @ self._cov) * h).sum(-1)
        return mean, var.clamp_min(1e-12).sqrt()

    def _prepare(self, score_mat: torch.Tensor) -> None:
        self._score_mat = score_mat.contiguous()  # [d, n]
        self._mean_vec = score_mat.mean(1)
        centred = score_mat - self._mean_vec[:, None]
        self._cov = centred @ centred.T / score_mat.shape[1]


class SASRecSimulator(Simulator):
    kind = "sasrec"

    def __init__(self, model: SASRec, report: dict | None = None):
        self.model = model.eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.report = report or {}
        self.item_emb = model.item_matrix().detach().clone()
        self._prepare(self.item_emb.T)

    @torch.no_grad()
    def states(self, seqs: torch.Tensor) -> torch.Tensor:
        return self.model.states(seqs)


class AnalyticSimulator(Simulator):
    """State = decayed mean of the history embeddings; scores = beta · state · e (closed form, no training)."""

    kind = "analytic"

    def __init__(self, emb: np.ndarray, decay: float = 0.8, beta: float = 10.0):
        self.decay, self.beta = decay, beta
        self.item_emb = torch.as_tensor(np.asarray(emb, dtype=np.float32))
        self._padded = torch.cat([self.item_emb, torch.zeros(1, self.item_emb.shape[1])])  # id n = padding
        self._prepare(beta * self.item_emb.T)
        self.report = {"decay": decay, "beta": beta}

    @torch.no_grad()
    def states(self, seqs: torch.Tensor) -> torch.Tensor:
        t = seqs.shape[1]
        idx = torch.arange(t)
        age = (idx[:, None] - idx[None, :]).clamp_min(0).double()
        w = torch.where(idx[None, :] <= idx[:, None], self.decay ** age, torch.zeros(()).double()).float()
        w = w / w.sum(1, keepdim=True)  # w[t, j]: weight of item j in the state after item t
        return torch.einsum("tj,bjd->btd", w, self._padded[seqs])


def load_simulator(kind: str, emb: np.ndarray, *, key: str, seed: int = 0, log=None) -> Simulator:
    """Build (or load from the cache) the simulator `kind` for item embeddings `emb`.

    `key` names the catalog the embeddings came from (size, seed); the SASRec weights are cached as
    ``cache_dir()/proactive_rec/sasrec-<key>-v<SIM_VERSION>.safetensors`` (a `shopsim.statefile` file, read
    without unpickling) and reused by every later process; a damaged cache file is trained again.
    """
    if kind == "analytic":
        return AnalyticSimulator(emb)
    if kind != "sasrec":
        from shopsim.errors import ConfigError

        raise ConfigError(f"simulator={kind!r}; choose 'sasrec' or 'analytic'")
    from shopsim.errors import ShopsimError
    from shopsim.statefile import load_state, save_state

    path = cache_dir() / "proactive_rec" / f"sasrec-{key}-v{SIM_VERSION}.safetensors"
    model = SASRec(len(emb))
    if path.is_file():
        try:
            blob = load_state(path)
            model.load_state_dict(blob["state_dict"])
            return SASRecSimulator(model, blob["report"])
        except (ShopsimError, KeyError, TypeError, RuntimeError) as exc:  # a damaged or foreign cache file
            if log:
                log(f"retraining the SASRec simulator: {exc}")
    with torch.random.fork_rng():
        model, report = train_sasrec(emb, seed=seed, log=log)
    save_state(path, {"state_dict": model.state_dict(), "report": report})
    write_text_atomic(Path(str(path) + ".json"), json.dumps(report, indent=2))
    return SASRecSimulator(model, report)
