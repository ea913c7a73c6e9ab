"""The semantic-ID policy of the proactive-recommendation env: vocabulary, a tiny causal transformer,
constrained sampling.

ProRL (arXiv 2605.28293, §4; code) generates a path as semantic-ID tokens: 4 tokens per item, at most 10 items,
then EOS (≤ 41 generated tokens), from a prompt made of the target's and the history's semantic IDs. ProRL uses a
small T5; we use a Hugging Face GPT-2 built from a config (2 layers, d = 64, 4 heads), so checkpoints are ordinary
`save_pretrained` folders.

Token layout: PAD 0, BOS 1, SEP 2, EOS 3, then the codes of level 1, level 2, level 3 and the collision digit, each in
its own id range. Prompt = BOS target(4) SEP history(40) SEP (47 tokens, same length for every user, so batches need
no padding). Decoding is *structurally* constrained — generated position j may only hold a level-(j mod 4) code,
EOS only at item boundaries, and only EOS after 10 items — but not constrained to existing items, so the policy can
still hallucinate a semantic ID that names no item (an invalid item, as in ProRL). `SidVocab.restrict_to(codes)`
adds a prefix-trie constraint to real items (as TIGER-style generative retrievers do; off by default), and
`SidVocab.forbid_repeats()` a no-repeat constraint: no item of the user's history or earlier in the path can be
generated again (a code is allowed only while some not-yet-used item continues the prefix; off by default, since
ProRL decodes with duplicates possible and charges them CTR := 0). Log-probs are always taken under the same
constraint mask, so behaviour and training log-probs agree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from transformers import GPT2Config, GPT2LMHeadModel

PAD, BOS, SEP, EOS = 0, 1, 2, 3
N_SPECIAL = 4
L_MAX = 10
HIST = 10
GEN_LEN = 4 * L_MAX + 1
PROMPT_LEN = 1 + 4 + 1 + 4 * HIST + 1


@dataclass
class SidVocab:
    """Maps semantic-ID digits (sizes K1, K2, K3, C) to token ids and back."""

    sizes: tuple[int, ...]  # (K1, K2, K3, C)

    def __post_init__(self) -> None:
        self.sizes = tuple(int(s) for s in self.sizes)
        self.offsets = np.cumsum([N_SPECIAL, *self.sizes[:-1]])
        self.vocab_size = N_SPECIAL + sum(self.sizes)
        allowed = torch.zeros(GEN_LEN, self.vocab_size, dtype=torch.bool)
        for j in range(GEN_LEN):
            lvl = j % 4
            if j < 4 * L_MAX:
                allowed[j, self.offsets[lvl]: self.offsets[lvl] + self.sizes[lvl]] = True
            if lvl == 0:
                allowed[j, EOS] = True
        self.allowed = allowed  # [GEN_LEN, V]: which tokens generated position j may hold
        # per level: number of real items under each code prefix (None: every tuple is legal)
        self.tables: list[torch.Tensor] | None = None
        self.no_repeat = False

    def restrict_to(self, codes) -> SidVocab:
        """Enable catalog-constrained decoding (a prefix trie over the real semantic IDs: no hallucinated items)."""
        c = torch.as_tensor(np.asarray(codes, dtype=np.int64))
        k = self.sizes
        t = [torch.zeros(k[:lvl + 1], dtype=torch.long) for lvl in range(4)]
        for lvl in range(4):
            t[lvl].index_put_(tuple(c[:, i] for i in range(lvl + 1)), torch.ones(len(c), dtype=torch.long),
                              accumulate=True)
        self.tables = t
        return self

    def forbid_repeats(self, on: bool = True) -> SidVocab:
        """No-repeat decoding: items of the history (read from the prompt) or earlier in the path are excluded."""
        self.no_repeat = bool(on)
        return self

    def history_codes(self, prompts: torch.Tensor) -> torch.Tensor:
        """The history's codes [B, 10, 4] read back from prompts [B, 47]."""
        h = prompts[:, 6: 6 + 4 * HIST].reshape(len(prompts), HIST, 4)
        return h - torch.as_tensor(self.offsets)

    def used_items(self, gen: torch.Tensor, prompts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(codes [B, 20, 4] of the history then the 10 path slots, [B, 20] first occurrence of each item). Entry m
        is marked by looking only at entries before it, so a prefix of the rows is valid at any position."""
        path = gen[:, : 4 * L_MAX].reshape(len(gen), L_MAX, 4) - torch.as_tensor(self.offsets)
        u = torch.cat([self.history_codes(prompts), path], 1)
        same = (u[:, :, None] == u[:, None]).all(-1)  # [B, M, M]
        return u, ~torch.tril(same, diagonal=-1).any(-1)

    def _used_counts(self, j: int, used: tuple[torch.Tensor, torch.Tensor], prev: torch.Tensor) -> torch.Tensor:
        """[B, K_lvl]: distinct used items (history + path items before position j) under each next code."""
        lvl = j % 4
        m = HIST + j // 4
        u, first = used[0][:, :m], used[1][:, :m]
        match = first & (u[:, :, :lvl] == prev[:, None]).all(-1)
        cnt = torch.zeros(len(u), self.sizes[lvl], dtype=torch.long)
        return cnt.scatter_add_(1, u[:, :, lvl].clamp(0, self.sizes[lvl] - 1), match.long())

    def step_mask(self, j: int, gen: torch.Tensor, prompts: torch.Tensor | None = None,
                  used: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """Allowed tokens [B, V] at generated position j given the generated ids so far (`gen[:, :j]`); the
        no-repeat constraint also needs the `prompts` (they hold the history), or `used_items` computed once."""
        base = self.allowed[j][None].expand(len(gen), -1)
        lvl = j % 4
        if (self.tables is None and not self.no_repeat) or j >= 4 * L_MAX:
            return base
        prev = (gen[:, j - lvl:j] - torch.as_tensor(self.offsets[:lvl])).clamp_min(0)
        if self.tables is None:  # structural decoding: every tuple is a legal item
            avail = torch.full((len(gen), self.sizes[lvl]), int(np.prod(self.sizes[lvl + 1:])), dtype=torch.long)
        elif lvl == 0:
            avail = self.tables[0][None].expand(len(gen), -1)
        else:
            avail = self.tables[lvl][tuple(prev[:, i] for i in range(lvl))]  # [B, K_lvl]
        if self.no_repeat:
            if used is None:
                if prompts is None:
                    raise ValueError("no-repeat decoding needs the prompts (they hold the history): pass prompts=")
                used = self.used_items(gen, prompts)
            avail = avail - self._used_counts(j, used, prev)
        ok = avail > 0
        mask = base.clone()
        mask[:, self.offsets[lvl]: self.offsets[lvl] + self.sizes[lvl]] = ok
        empty = ~mask.any(1)  # rows past their EOS (PAD prefix): no real item continues it; never used
        return torch.where(empty[:, None], base, mask)

    def masks(self, gen: torch.Tensor, prompts: torch.Tensor | None = None) -> torch.Tensor:
        """Allowed tokens [B, 41, V] at every generated position (teacher forcing)."""
        if self.tables is None and not self.no_repeat:
            return self.allowed[None]
        used = self.used_items(gen, prompts) if self.no_repeat and prompts is not None else None
        return torch.stack([self.step_mask(j, gen, prompts, used) for j in range(GEN_LEN)], 1)

    def item_tokens(self, codes) -> np.ndarray:
        return np.asarray(codes, dtype=np.int64) + self.offsets

    def codes_of(self, tokens) -> np.ndarray:
        return np.asarray(tokens, dtype=np.int64) - self.offsets

    def prompts(self, target_sid, hist_sid) -> torch.Tensor:
        """[B, 47] prompt ids from target codes [B, 4] and history codes [B, 10, 4]."""
        t = self.item_tokens(target_sid)
        h = self.item_tokens(hist_sid).reshape(len(t), -1)
        b = len(t)
        ids = np.concatenate([np.full((b, 1), BOS), t, np.full((b, 1), SEP), h, np.full((b, 1), SEP)], axis=1)
        return torch.as_tensor(ids, dtype=torch.long)

    def decode(self, gen: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Generated tokens [B, 41] -> (codes [B, 10, 4], number of items before EOS [B])."""
        gen = np.asarray(gen)
        is_eos = gen[:, 0::4] == EOS  # EOS can only sit at item boundaries
        lengths = np.where(is_eos.any(1), is_eos.argmax(1), L_MAX)
        items = gen[:, : 4 * L_MAX].reshape(len(gen), L_MAX, 4)
        codes = np.clip(items - self.offsets, 0, None)
        return codes, lengths


def build_model(vocab: SidVocab, *, d: int = 64, layers: int = 2, heads: int = 4, dropout: float = 0.1,
                seed: int = 0) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=vocab.vocab_size, n_positions=PROMPT_LEN + GEN_LEN, n_embd=d, n_layer=layers,
                     n_head=heads, n_inner=4 * d, resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout,
                     bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD)
    return GPT2LMHeadModel(cfg)


def _masked_logprobs(logits: torch.Tensor, allowed: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    return torch.log_softmax(logits.float().masked_fill(~allowed, float("-inf")) / temperature, dim=-1)


@torch.no_grad()
def generate(model, vocab: SidVocab, prompts: torch.Tensor, *, greedy: bool = False, temperature: float = 1.0,
             generator: torch.Generator | None = None, prefix: torch.Tensor | None = None,
             max_tokens: int = GEN_LEN) -> tuple[torch.Tensor, torch.Tensor]:
    """Constrained decoding with the KV cache. Returns (generated ids [B, 41] with PAD after EOS, token log-probs).

    `prefix` [B, j] continues already generated tokens (all rows the same length); `max_tokens` stops early
    (the agent generates one item = 4 tokens per env step)."""
    model.eval()
    b = len(prompts)
    start = 0 if prefix is None else prefix.shape[1]
    ctx = prompts if prefix is None else torch.cat([prompts, prefix], 1)
    out = torch.full((b, GEN_LEN), PAD, dtype=torch.long)
    logp = torch.zeros(b, GEN_LEN)
    if prefix is not None:
        out[:, :start] = prefix
    done = (prefix == EOS).any(1) if prefix is not None else torch.zeros(b, dtype=torch.bool)
    o = model(input_ids=ctx, use_cache=True)
    for j in range(start, min(GEN_LEN, start + max_tokens)):
        lp = _masked_logprobs(o.logits[:, -1], vocab.step_mask(j, out, prompts), temperature)
        if greedy:
            tok = lp.argmax(-1)
        else:
            tok = torch.multinomial(lp.exp(), 1, generator=generator).squeeze(1)
        tok = torch.where(done, torch.full_like(tok, PAD), tok)
        out[:, j] = tok
        logp[:, j] = torch.where(done, torch.zeros(()), lp.gather(1, tok.clamp_min(0)[:, None]).squeeze(1))
        done = done | (tok == EOS)
        if bool(done.all()):
            break
        o = model(input_ids=tok[:, None], cache=o.cache, use_cache=True)
    return out, logp


def token_logprobs(model, vocab: SidVocab, prompts: torch.Tensor, gen: torch.Tensor) -> torch.Tensor:
    """Teacher-forced constrained log-probs [B, 41] of generated ids (0 at PAD positions); differentiable."""
    ids = torch.cat([prompts, gen.clamp_min(0)], 1)
    logits = model(input_ids=ids).logits[:, PROMPT_LEN - 1: PROMPT_LEN - 1 + GEN_LEN]
    lp = _masked_logprobs(logits, vocab.masks(gen.clamp_min(0), prompts))
    tok_lp = lp.gather(2, gen.clamp_min(0)[..., None]).squeeze(2)
    return torch.where(gen == PAD, torch.zeros(()), tok_lp)


def item_logprobs(tok_lp: torch.Tensor, lengths: torch.Tensor, *, reduce: str = "mean"):
    """Per-item log-probs [B, 10] (mean or sum of the 4 tokens; ProRL uses the mean) and the EOS log-prob [B]
    (at position 4·n; 0 when the path hit L_max, where EOS is forced)."""
    items = tok_lp[:, : 4 * L_MAX].reshape(len(tok_lp), L_MAX, 4)
    item_lp = items.mean(-1) if reduce == "mean" else items.sum(-1)
    eos_lp = tok_lp.gather(1, (4 * lengths.clamp_max(L_MAX))[:, None]).squeeze(1)
    mask = torch.arange(L_MAX)[None] < lengths[:, None]
    return item_lp * mask, eos_lp


def sft_targets(vocab: SidVocab, codes: np.ndarray, lengths: np.ndarray) -> torch.Tensor:
    """Generated-token targets [B, 41] for expert paths (codes [B, 10, 4], lengths [B]): items, EOS, PAD."""
    b = len(codes)
    gen = np.full((b, GEN_LEN), PAD, dtype=np.int64)
    toks = vocab.item_tokens(codes).reshape(b, -1)
    for i in range(b):
        n = int(lengths[i])
        gen[i, : 4 * n] = toks[i, : 4 * n]
        gen[i, 4 * n] = EOS
    return torch.as_tensor(gen)


def sft_train(model, vocab: SidVocab, prompts: torch.Tensor, targets: torch.Tensor, *, steps: int = 400,
              batch: int = 64, lr: float = 3e-3, seed: int = 0, log=None) -> list[float]:
    """Supervised pre-training on expert paths: masked next-token cross-entropy under the constraint mask."""
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.05)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / max(1, steps // 10)))
    losses = []
    model.train()
    for step in range(steps):
        idx = torch.randint(len(prompts), (batch,), generator=g)
        tgt = targets[idx]
        lp = token_logprobs(model, vocab, prompts[idx], tgt)
        mask = (tgt != PAD).float()
        loss = -(lp * mask).sum() / mask.sum()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        if log and step % 100 == 0:
            log(f"sft step {step}: loss {loss.item():.3f}")
    model.eval()
    return losses


@torch.no_grad()
def beam_search(model, vocab: SidVocab, prompts: torch.Tensor, *, beams: int = 10,
                length_penalty: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Constrained beam search, ProRL's evaluation decoder (10 beams, Metric@K over the top-K beams).

    Follows the Hugging Face beam-search rule that ProRL's `generate(num_beams=10)` uses: at each position the
    2·beams best continuations (by summed log-prob) are examined in order, a continuation ending in EOS becomes a
    finished hypothesis scored sum / length^length_penalty, the others refill the `beams` live beams; position 40
    admits only EOS, so every live beam finishes. Returns (generated ids [B, beams, 41] best first, scores [B, beams]).
    Recomputes the prefix each step (no KV cache): fine for the evaluation sizes used here."""
    model.eval()
    b, v = len(prompts), vocab.vocab_size
    gen = torch.full((b, 1, GEN_LEN), PAD, dtype=torch.long)
    score = torch.zeros(b, 1)
    finished: list[list[tuple[float, torch.Tensor]]] = [[] for _ in range(b)]
    for j in range(GEN_LEN):
        nb = gen.shape[1]
        flat = gen.reshape(b * nb, GEN_LEN)
        rep = prompts.repeat_interleave(nb, 0)
        ids = torch.cat([rep, flat[:, :j]], 1)
        lp = _masked_logprobs(model(input_ids=ids).logits[:, -1], vocab.step_mask(j, flat, rep)).view(b, nb, v)
        cand = (score[..., None] + lp).view(b, -1)
        val, idx = cand.topk(min(2 * beams, cand.shape[1]), -1)
        new_gen = torch.full((b, beams, GEN_LEN), PAD, dtype=torch.long)
        new_score = torch.full((b, beams), float("-inf"))
        for r in range(b):
            kept = 0
            for s, ix in zip(val[r].tolist(), idx[r].tolist(), strict=False):
                if not math.isfinite(s):
                    break
                src, tok = divmod(ix, v)
                seq = gen[r, src].clone()
                seq[j] = tok
                if tok == EOS:
                    finished[r].append((s / (j + 1) ** length_penalty, seq))
                elif kept < beams:
                    new_gen[r, kept], new_score[r, kept] = seq, s
                    kept += 1
                if kept == beams:
                    break
        gen, score = new_gen, new_score
        if not torch.isfinite(score).any():
            break
    out = torch.full((b, beams, GEN_LEN), PAD, dtype=torch.long)
    out_score = torch.full((b, beams), float("-inf"))
    for r in range(b):
        best = sorted(finished[r], key=lambda x: -x[0])[:beams]
        for k, (s, seq) in enumerate(best):
            out[r, k], out_score[r, k] = seq, s
    return out, out_score
