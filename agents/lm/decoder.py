"""Per-episode KV cache with packed prefill and batched decoding for Llama-family models (docs/lm-agent.md).

`SlotDecoder` is the LM agent's default decoding path when the model is a `transformers` Llama-architecture causal
LM (the shipped agent and every from-config model of `agents.lm.model`). It computes what `generation.sample` with
a `PrefixCache` computes — the same tokens under greedy decoding, the same per-row draws from the same generators
when sampling, log-probs equal up to float rounding — with far less work per decoding step:

* **One KV buffer per episode** (a rollout slot), keys/values of the sequence the episode has fed so far stored in
  place with spare capacity. A new turn reuses the longest common prefix of that sequence and the new prompt (the
  whole previous context in concat mode, the unchanged head in window mode) and encodes only the rest; nothing is
  copied between turns (the prefix cache path stores, re-stacks and re-slices every row's keys/values each turn).
* **Packed prefill**: the new tokens of every row are concatenated into one sequence for the projections and the
  feed-forward (no padding), and only attention runs per row, over that row's own buffer, so a long first prompt
  in the batch does not make every row pay for its length.
* **Decoding in place**: every step runs the projections and feed-forward of the decoding rows together, writes
  their keys/values into their own buffers and attends once per row over exactly its positions (no padding, no
  mask: rows of very different lengths cost what they hold); rows that have stopped cost nothing, and no cache is
  ever copied.
* **Prompt-lookup drafting** (`_draft`, `_accept`): a pass feeds each row its last token and up to `draft_tokens`
  guesses copied from its own context, and the row takes tokens in order up to the first guess that differs from
  the token chosen there, which is what one-token-per-pass decoding chooses; a pass reads a row's keys/values once
  for several tokens. Like speculative decoding with an n-gram draft (Leviathan et al. 2023, §2.3 with a
  deterministic draft), but exact token by token, so no acceptance test is needed.
* The layers' own modules (norms, projections, rotary embedding, MLP) do the arithmetic; only the KV bookkeeping,
  masks and attention call are this module's, so a trained model's weights are read as they are at call time.

This is the continuous-batching and paged-KV idea of vLLM, cut to what a CPU and a small model need: the batch is
kept full by the rollout runner (`shopsim.rollout.collect` refills a slot as soon as its episode ends) and the
per-step Python and kernel-launch overhead of the general `transformers` forward is what this path removes.
`generation.sample` stays the reference and the path for other architectures (`LMAgent(decoder="hf")`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from agents.lm.generation import Generators, SampleOutput, SamplingConfig, next_tokens
from shopsim.errors import ConfigError

#: model types whose decoder layers this module drives (their attention is Llama's: q/k/v/o projections, rotary
#: embedding on q and k, no per-head norms); anything else decodes through `generation.sample`
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")
#: longest n-gram of the context's tail that prompt-lookup drafting matches (`SlotDecoder._draft`)
DRAFT_NGRAM = 3
#: bytes of one token id in the drafting search (int64)
_TOKEN_BYTES = 8
#: drafted tokens checked per decoding pass by default (`SlotDecoder(draft_tokens=...)`; 0: one token per pass)
DRAFT_TOKENS = 4


def supports(model) -> bool:
    """Whether `model` has the layout `SlotDecoder` drives (a Llama-family `transformers` causal LM)."""
    cfg = getattr(model, "config", None)
    inner = getattr(model, "model", None)
    if cfg is None or inner is None or getattr(cfg, "model_type", None) not in SUPPORTED_MODEL_TYPES:
        return False
    if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True):
        return False
    layers = getattr(inner, "layers", None)
    if not layers:
        return False
    need = ("q_proj", "k_proj", "v_proj", "o_proj")
    return all(all(hasattr(layer.self_attn, n) for n in need) and not hasattr(layer.self_attn, "q_norm")
               for layer in layers)


class _Row:
    """One episode slot's cache: the ids whose keys/values are stored, and one ``[layers, 2, kv_heads, capacity,
    head_dim]`` buffer of their keys (index 0) and values (index 1), the sequence left-aligned."""

    __slots__ = ("ids", "kv")

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.kv: torch.Tensor | None = None

    def reserve(self, n: int, like) -> None:
        """Room for `n` positions, keeping the stored ones (grows geometrically, by whole rows: only this episode's
        buffer is copied)."""
        layers, kv_heads, dim, dtype, device = like
        if self.kv is not None and (self.kv.dtype != dtype or self.kv.device != device
                                    or self.kv.shape[0] != layers or self.kv.shape[2] != kv_heads):
            self.kv, self.ids = None, []
        have = 0 if self.kv is None else self.kv.shape[3]
        if n <= have:
            return
        # never read past a row's stored length, so the buffer need not be zeroed
        kv = torch.empty((layers, 2, kv_heads, max(n, 2 * have, 256), dim), dtype=dtype, device=device)
        if self.kv is not None and self.ids:
            kv[:, :, :, : len(self.ids)] = self.kv[:, :, :, : len(self.ids)]
        self.kv = kv

    def buffer(self) -> torch.Tensor:
        """The keys/values buffer, which `reserve` made."""
        if self.kv is None:
            raise RuntimeError("reserve() the row before writing to it")
        return self.kv


class SlotDecoder:
    """Decoding with one KV cache per episode key (see module docstring).

    Each key (the rollout slot) owns a `_Row` buffer sized to its own sequence. `drop` keeps the row's content: the
    key's next episode starts with the same system prompt, which the longest-common-prefix check then reuses; `clear`
    forgets every sequence but keeps the buffers for the next collect. Stored keys/values are only reused for the same
    tokens at the same positions under the same weights: a change of the model's parameters (an optimizer step, a
    load) empties every row before the next call. Attention always reads exactly a row's own positions, never
    padding, so rows of very different lengths cost what they hold."""

    def __init__(self, draft_tokens: int = DRAFT_TOKENS) -> None:
        if draft_tokens < 0:
            raise ConfigError(f"draft_tokens={draft_tokens}; give 0 (no drafting) or more")
        self.draft_tokens = draft_tokens
        self.rows: dict = {}
        self.weights: tuple | None = None
        self.fused: list = []  # per layer: (q|k|v weight, bias), (gate|up weight, bias), built per weights version
        self.reused_tokens = 0
        self.encoded_tokens = 0
        self.decode_passes = 0  # model passes after the prefill (one per step, or per check of drafted tokens)
        self.drafted_tokens = 0
        self.accepted_tokens = 0  # drafted tokens that became generated tokens

    def clear(self) -> None:
        for row in self.rows.values():
            row.ids = []

    def drop(self, key) -> None:
        """The key's episode ended: its row is kept for its next episode's common head (see class docstring)."""

    def _check_weights(self, model) -> None:
        """Forget every stored sequence when the model's parameters changed since they were encoded (in-place
        updates bump a tensor's version counter; replaced tensors have a new address)."""
        sig = (id(model),) + tuple((p.data_ptr(), p._version) for p in model.parameters())
        if sig != self.weights:
            self.clear()
            self.weights = sig
            self.fused = [(self._cat(layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj),
                           self._cat(layer.mlp.gate_proj, layer.mlp.up_proj)) for layer in model.model.layers]

    @staticmethod
    def _cat(*lins):
        """One projection for several that read the same input (one matrix product per step instead of several;
        each output is the same dot product of the same row and column)."""
        weight = torch.cat([lin.weight.detach() for lin in lins])
        bias = None if lins[0].bias is None else torch.cat([lin.bias.detach() for lin in lins])
        return weight, bias

    # ------------------------------------------------------------------ model pieces
    @staticmethod
    def _parts(model):
        inner = model.model
        cfg = model.config
        heads = cfg.num_attention_heads
        kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
        dim = getattr(inner.layers[0].self_attn, "head_dim", None) or cfg.hidden_size // heads
        p = next(model.parameters())
        return inner, heads, kv_heads, dim, (len(inner.layers), kv_heads, dim, p.dtype, p.device)

    @staticmethod
    def _norm(norm, x):
        """`LlamaRMSNorm.forward`, inlined (the same operations in the same order)."""
        dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
        return norm.weight * h.to(dtype)

    @staticmethod
    def _rope(x, cos, sin):
        """`apply_rotary_pos_emb` for one tensor (``x * cos + rotate_half(x) * sin``)."""
        half = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

    @staticmethod
    def _proj(lin, x):
        return F.linear(x, lin.weight, lin.bias)

    def _mlp(self, layer, x, wgu, bgu):
        """`LlamaMLP` with the gate and up projections as one product."""
        gu = F.linear(self._norm(layer.post_attention_layernorm, x), wgu, bgu)
        half = gu.shape[-1] // 2
        return self._proj(layer.mlp.down_proj, layer.mlp.act_fn(gu[..., :half]) * gu[..., half:])

    @staticmethod
    def _kv_heads(keys, values, groups: int):
        if groups > 1:  # grouped-query attention: each key/value head serves `groups` query heads
            return keys.repeat_interleave(groups, 1), values.repeat_interleave(groups, 1)
        return keys, values

    # ------------------------------------------------------------------ prefill
    def _prefill(self, model, rows: list[_Row], new: list[list[int]], parts, every: bool = False) -> torch.Tensor:
        """Encode every row's `new` tokens after its stored ones (packed), store their keys/values and return the
        next-token logits of each row ``[B, vocab]`` (float32); with `every`, the logits after each new token,
        ``[sum(len(x) for x in new), vocab]`` in the rows' order (what checking drafted tokens needs).

        Otherwise in the last layer only each row's last token needs a query, attention output and feed-forward (the
        other tokens' outputs feed nothing but the logits nobody reads); their keys and values are still stored."""
        inner, heads, kv_heads, dim, like = parts
        device = like[4]
        lens = [len(r.ids) for r in rows]
        counts = [len(x) for x in new]
        flat = torch.tensor([t for x in new for t in x], dtype=torch.long, device=device)
        pos = torch.cat([torch.arange(n, n + c, device=device) for n, c in zip(lens, counts, strict=True)])
        x = inner.embed_tokens(flat)[None]  # [1, T, h]
        cos, sin = inner.rotary_emb(x, pos[None])
        cos, sin = cos[:, None], sin[:, None]  # [1, 1, T, D]
        offsets = [0]
        for c in counts:
            offsets.append(offsets[-1] + c)
        last = torch.tensor(offsets[1:], device=device) - 1
        groups = heads // kv_heads
        # query j of a row (position n + j) sees its keys 0..n + j
        masks = [torch.ones((c, n + c), dtype=torch.bool, device=device).tril(diagonal=n) if c > 1 else None
                 for n, c in zip(lens, counts, strict=True)]
        final = len(inner.layers) - 1
        qd, kd = heads * dim, kv_heads * dim
        for li, layer in enumerate(inner.layers):
            att = layer.self_attn
            (wqkv, bqkv), (wgu, bgu) = self.fused[li]
            h = self._norm(layer.input_layernorm, x)
            if li == final and not every:  # keys and values of every token, a query for each row's last token only
                kv = F.linear(h, wqkv[qd:], None if bqkv is None else bqkv[qd:])
                k = self._rope(kv[..., :kd].view(1, -1, kv_heads, dim).transpose(1, 2), cos, sin)
                v = kv[..., kd:].view(1, -1, kv_heads, dim).transpose(1, 2)
                h, x = h[:, last], x[:, last]
                q = F.linear(h, wqkv[:qd], None if bqkv is None else bqkv[:qd]).view(1, -1, heads, dim)
                q = self._rope(q.transpose(1, 2), cos[:, :, last], sin[:, :, last])
            else:
                qkv = F.linear(h, wqkv, bqkv)
                q = self._rope(qkv[..., :qd].view(1, -1, heads, dim).transpose(1, 2), cos, sin)
                k = self._rope(qkv[..., qd: qd + kd].view(1, -1, kv_heads, dim).transpose(1, 2), cos, sin)
                v = qkv[..., qd + kd:].view(1, -1, kv_heads, dim).transpose(1, 2)
            outs = []
            for i, row in enumerate(rows):
                a, b, n, c = offsets[i], offsets[i + 1], lens[i], counts[i]
                buf = row.buffer()[li]
                buf[0, :, n: n + c] = k[0, :, a:b]
                buf[1, :, n: n + c] = v[0, :, a:b]
                keys, values = self._kv_heads(buf[0:1, :, : n + c], buf[1:2, :, : n + c], groups)
                if li == final and not every:  # the row's last token sees every key: no mask
                    outs.append(F.scaled_dot_product_attention(q[:, :, i: i + 1], keys, values, scale=att.scaling))
                else:
                    outs.append(F.scaled_dot_product_attention(q[:, :, a:b], keys, values, attn_mask=masks[i],
                                                               scale=att.scaling))
            o = torch.cat(outs, dim=2).transpose(1, 2).reshape(1, -1, heads * dim)
            x = x + self._proj(att.o_proj, o)
            x = x + self._mlp(layer, x, wgu, bgu)
        return model.lm_head(self._norm(inner.norm, x[0])).float()

    # ------------------------------------------------------------------ decoding
    @torch.no_grad()
    def sample(self, model, prompts: list[list[int]], keys: Sequence, *, stop_ids, pad_id: int,
               config: SamplingConfig, generator: Generators = None) -> SampleOutput:
        """One continuation per prompt, row `i` continuing the cached episode `keys[i]` (see module docstring).
        Same contract as `generation.sample` with a cache; `record_hidden` is not supported here."""
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ConfigError("every prompt needs at least one token")
        if len(keys) != len(prompts) or len(set(keys)) != len(keys):
            raise ConfigError("SlotDecoder.sample needs one distinct key per prompt")
        if config.record_hidden:
            raise ConfigError("SlotDecoder does not record hidden states; use generation.sample")
        # one generator per row, or one shared (or none)
        gens = None if generator is None or isinstance(generator, torch.Generator) else list(generator)
        per_row = gens is not None
        if gens is not None and len(gens) != len(prompts):
            raise ConfigError(f"{len(gens)} generators for {len(prompts)} prompts; give one per prompt")
        parts = self._parts(model)
        like = parts[4]
        self._check_weights(model)
        rows = [self.rows.setdefault(key, _Row()) for key in keys]
        new, reused = [], []
        for row, p in zip(rows, prompts, strict=True):
            row.reserve(len(p) + config.max_new_tokens, like)
            n = _common_prefix(row.ids, p)
            row.ids = row.ids[:n]
            new.append(list(p[n:]))
            reused.append(n)
        self.reused_tokens += sum(reused)
        self.encoded_tokens += sum(len(x) for x in new)
        logits = self._prefill(model, rows, new, parts)

        stop_set = set(stop_ids)
        gen_ids: list[list[int]] = [[] for _ in prompts]
        gen_lp: list[list[float]] = [[] for _ in prompts]
        # drafted tokens are checked in order per row, so a row's draws stay those of sequential decoding only when
        # each row has its own stream (or under arg-max); one shared generator would be drawn in another order
        drafting = self.draft_tokens > 0 and (config.greedy or per_row)
        ctx = {i: np.asarray(p, dtype=np.int64).tobytes() for i, p in enumerate(prompts)} if drafting else {}
        # cand[i]: row i's next-token logits, one row per position still to choose (the last prefill or decoding
        # position, then one per drafted token); drafts[i]: the drafted tokens those positions were fed
        cand = {i: logits[i: i + 1] for i in range(len(prompts))}
        drafts: dict[int, list[int]] = {i: [] for i in range(len(prompts))}
        steps = 0
        while cand:
            going, accepted = self._accept(cand, drafts, gen_ids, gen_lp, config,
                                           generator if not per_row else None, gens, stop_set)
            self.accepted_tokens += accepted
            steps += 1
            if not going:
                break
            live = going
            for i in live:
                rows[i].ids = list(prompts[i]) + gen_ids[i][:-1]
            drafts = {i: self._draft(ctx[i], gen_ids[i], config.max_new_tokens - len(gen_ids[i])) if drafting
                      else [] for i in live}
            self.decode_passes += 1
            self.drafted_tokens += sum(len(drafts[i]) for i in live)
            if any(drafts[i] for i in live):  # check every row's drafts in one packed pass
                out = self._prefill(model, [rows[i] for i in live], [[gen_ids[i][-1]] + drafts[i] for i in live],
                                    parts, every=True)
                cand, at = {}, 0
                for i in live:
                    cand[i] = out[at: at + 1 + len(drafts[i])]
                    at += 1 + len(drafts[i])
            else:
                feed = torch.tensor([gen_ids[i][-1] for i in live], dtype=torch.long, device=like[4])
                at_pos = [len(prompts[i]) + len(gen_ids[i]) - 1 for i in live]
                out = self._step(parts, [rows[i] for i in live], feed, at_pos, model)
                cand = {i: out[j: j + 1] for j, i in enumerate(live)}
        for row, p, g in zip(rows, prompts, gen_ids, strict=True):
            row.ids = list(p) + g[:-1]  # the last sampled token was never fed
        stopped = [bool(g) and g[-1] in stop_set for g in gen_ids]
        return SampleOutput(ids=gen_ids, logprobs=gen_lp, stopped=stopped, hidden=None,
                            new_tokens=sum(len(g) for g in gen_ids),
                            extra={"steps": steps, "encoded_tokens": sum(len(x) for x in new),
                                   "reused_tokens": sum(reused)})

    def _draft(self, ctx: np.ndarray | bytes, gen: list[int], room: int) -> list[int]:
        """Prompt-lookup drafting (Saxena 2023; `prompt_lookup_num_tokens` in `transformers`): the tokens that
        followed the most recent earlier occurrence of the context's last `DRAFT_NGRAM` tokens (down to 1), at most
        `draft_tokens` of them and never more than ``room - 1`` (the position after the drafts yields a token too).
        `ctx` is the prompt (an int64 array, or its bytes: `sample` converts each prompt once), `gen` the tokens
        generated so far. Actions copy product ids, option values and query words from the observation, so these
        guesses are often right; a wrong one costs only the extra positions of one decoding pass.

        The search is `bytes.rfind` over the int64 bytes of the sequence (C speed, no per-call array of windows),
        keeping only matches that start on a token boundary."""
        k = min(self.draft_tokens, room - 1)
        if k <= 0:
            return []
        raw = ctx if isinstance(ctx, bytes) else np.ascontiguousarray(ctx, dtype=np.int64).tobytes()
        if gen:
            raw += np.asarray(gen, dtype=np.int64).tobytes()
        w = _TOKEN_BYTES
        length = len(raw) // w
        for n in range(min(DRAFT_NGRAM, length - 1), 0, -1):
            pat = raw[(length - n) * w:]
            at = raw.rfind(pat, 0, (length - 1) * w)  # a match must end before the last token
            while at > 0 and at % w:  # a match across token boundaries: look further left
                at = raw.rfind(pat, 0, at + len(pat) - 1)
            if at >= 0:
                start = at // w + n
                return np.frombuffer(raw, dtype=np.int64, count=min(k, length - start),
                                     offset=start * w).tolist()
        return []

    @staticmethod
    def _accept(cand: dict, drafts: dict, gen_ids: list[list[int]], gen_lp: list[list[float]], config: SamplingConfig,
                generator, gens, stop_set: set) -> tuple[list[int], int]:
        """Choose tokens from each row's candidate positions in order, as sequential decoding would: the token at
        position s comes from the logits after the drafted tokens 0..s-1, so it is the token sequential decoding
        picks as long as each earlier draft equalled the token chosen there; the row stops taking tokens at the first
        draft that differs, at a stop token, or at `max_new_tokens`. Each row's generator is drawn once per chosen
        token, in order, so sampled rows get the same tokens from the same streams. Returns the rows that go on and
        how many drafted tokens were taken."""
        active = sorted(cand)
        going: list[int] = []
        s = taken = 0
        while active:
            logits = torch.cat([cand[i][s: s + 1] for i in active])
            tok, tok_lp = next_tokens(logits, config, [gens[i] for i in active] if gens is not None else generator)
            nxt = []
            for i, t, lp in zip(active, tok.tolist(), tok_lp.tolist(), strict=True):
                gen_ids[i].append(t)
                gen_lp[i].append(lp)
                taken += s < len(drafts[i]) and t == drafts[i][s]
                if t in stop_set or len(gen_ids[i]) >= config.max_new_tokens:
                    continue
                if s < len(drafts[i]) and t == drafts[i][s]:
                    nxt.append(i)  # the next position's logits are the sequential ones
                else:
                    going.append(i)
            active = nxt
            s += 1
        return sorted(going), taken

    def _step(self, parts, rows: list[_Row], tok, pos: list[int], model) -> torch.Tensor:
        """One decoding step: token `tok[j]` at position `pos[j]` of row `rows[j]`; the next-token logits. The
        projections and feed-forward run over the rows together, attention once per row over exactly its keys."""
        inner, heads, kv_heads, dim, like = parts
        n = tok.shape[0]
        groups = heads // kv_heads
        x = inner.embed_tokens(tok)[:, None]  # [n, 1, h]
        cos, sin = inner.rotary_emb(x, torch.tensor(pos, dtype=torch.long, device=tok.device)[:, None])
        cos, sin = cos[:, None], sin[:, None]
        qd, kd = heads * dim, kv_heads * dim
        for li, layer in enumerate(inner.layers):
            att = layer.self_attn
            (wqkv, bqkv), (wgu, bgu) = self.fused[li]
            qkv = F.linear(self._norm(layer.input_layernorm, x), wqkv, bqkv)
            q = self._rope(qkv[..., :qd].view(n, 1, heads, dim).transpose(1, 2), cos, sin)
            k = self._rope(qkv[..., qd: qd + kd].view(n, 1, kv_heads, dim).transpose(1, 2), cos, sin)
            v = qkv[..., qd + kd:].view(n, 1, kv_heads, dim).transpose(1, 2)
            kv = torch.stack((k, v), dim=1)  # [n, 2, kv_heads, 1, dim]
            outs = []
            for j, (row, p) in enumerate(zip(rows, pos, strict=True)):
                buf = row.buffer()[li]
                buf[:, :, p: p + 1] = kv[j]
                keys, values = self._kv_heads(buf[0:1, :, : p + 1], buf[1:2, :, : p + 1], groups)
                outs.append(F.scaled_dot_product_attention(q[j: j + 1], keys, values, scale=att.scaling))
            o = torch.cat(outs)
            x = x + self._proj(att.o_proj, o.transpose(1, 2).reshape(n, 1, heads * dim))
            x = x + self._mlp(layer, x, wgu, bgu)
        return model.lm_head(self._norm(inner.norm, x[:, 0])).float()


def _common_prefix(a: list[int], b: Sequence[int]) -> int:
    """Length of the common prefix of `a` and `b`, at most ``len(b) - 1`` (the last prompt token is always encoded:
    it gives the next-token logits)."""
    limit = min(len(a), len(b) - 1)
    if limit <= 0:
        return 0
    if a[:limit] == list(b[:limit]):
        return limit
    x = torch.tensor(a[:limit])
    y = torch.tensor(list(b[:limit]))
    diff = (x != y).nonzero()
    return int(diff[0]) if len(diff) else limit
