"""Batched sampling with the KV cache, and exact log-prob recomputation (docs/lm-agent.md).

`sample` runs one prefill over a left-padded batch of prompts, then one token per step with the model's KV cache,
until every row has produced a stop token or `max_new_tokens`. For every row it records exactly what the model
computed: the generated ids (including the stop token when one was produced), the log-prob of each sampled token,
and on request a hidden-state summary of the prompt.

Log-prob convention (the one RL trainers use): ``log_softmax(logits / T)[token]`` with T the sampling temperature
(T = 1 for greedy decoding); top-p truncation shapes sampling only and is *not* folded into the recorded
log-probs. `token_logprobs` recomputes the same quantity with one forward pass over any padded batch; with float32
weights it matches the sampled log-probs within 1e-4 (tested).

Padding: prompts are left-padded; position ids are ``cumsum(attention_mask) - 1`` so that a token's position does
not depend on how much padding its row got, both while sampling and while recomputing (right padding works too).

Hidden summary (``record_hidden=True``): from the prefill pass, the last layer's hidden states averaged over the
real prompt tokens (``"mean"``) and at the last prompt token (``"last"``, the state the action is generated from);
``hidden_layer`` picks another entry of ``hidden_states``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from shopsim.errors import ConfigError


@dataclass
class SamplingConfig:
    """How to sample one action per prompt."""

    temperature: float = 1.0
    """Softmax temperature; also the temperature of the recorded log-probs."""
    top_p: float = 1.0
    """Nucleus sampling mass (1.0 = off)."""
    max_new_tokens: int = 48
    """Per-turn limit on generated tokens (a per-turn budget, not a trajectory budget)."""
    greedy: bool = False
    """Arg-max decoding (log-probs then use temperature 1)."""
    record_hidden: bool = False
    """Also return the last-layer mean / last-token summaries of each prompt."""
    hidden_layer: int = -1
    """Which entry of the model's ``hidden_states`` the summaries read (-1: the last block's output, after the
    final norm; 0 is the embeddings, L the last block)."""
    keep_finished: bool = False
    """Keep rows that have produced their stop token in the batch, decoding ignored pad tokens until every row has
    stopped (the behaviour before finished rows left the batch; benchmarks use it as their baseline)."""
    multinomial: bool = False
    """Draw with `torch.multinomial` (the previous sampler; benchmarks' baseline) instead of `categorical`."""
    prefill: str = "auto"
    """How the prompts' new tokens are encoded before decoding. ``"rows"``: one forward per prompt over its own new
    tokens and cached prefix, then the rows' caches are stacked for batched decoding; attention costs
    Σ new_i × context_i. ``"batch"``: one padded forward over every row, which costs rows × the longest new part ×
    the longest context (in concat mode one long episode in the batch makes every row pay for its context), but
    pays the per-forward overhead once. ``"auto"``: whichever `prefill_cost` estimates cheaper for this call.
    The three give the same tokens and log-probs up to float rounding (tested)."""

    def __post_init__(self) -> None:
        if self.prefill not in ("auto", "rows", "batch"):
            raise ConfigError(f"prefill must be 'auto', 'rows' or 'batch', got {self.prefill!r}")
        if not self.temperature > 0:
            raise ConfigError(f"temperature must be > 0, got {self.temperature}; use greedy=True for arg-max")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")

    @property
    def logprob_temperature(self) -> float:
        return 1.0 if self.greedy else self.temperature


@dataclass
class SampleOutput:
    """Per row: generated ids, their log-probs, whether a stop token ended the row, optional hidden summary."""

    ids: list[list[int]]
    logprobs: list[list[float]]
    stopped: list[bool]
    hidden: list[dict[str, list[float]]] | None = None
    new_tokens: int = 0
    extra: dict = field(default_factory=dict)


def left_pad(seqs: list[list[int]], pad_id: int, device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad id lists into (input_ids, attention_mask)."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            ids[i, width - len(s):] = torch.tensor(s, dtype=torch.long)
            mask[i, width - len(s):] = 1
    return ids.to(device), mask.to(device)


def positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids that ignore padding on either side."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def _top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    if top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
    probs = sorted_logits.softmax(-1)
    # drop a token when the mass strictly before it already reaches top_p (keeps at least the best one)
    drop = probs.cumsum(-1) - probs >= top_p
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)


Generators = torch.Generator | Sequence[torch.Generator] | None
"""One generator for the whole batch, or one per row (each row's draws then come from its own stream only)."""


def uniforms(n: int, generator: Generators, *, device=None, dtype=torch.float32) -> torch.Tensor:
    """`n` uniforms in [0, 1) as an [n, 1] tensor: from one generator, or the i-th from the i-th of a sequence of
    generators (a row's draw then does not depend on which other rows share the batch)."""
    if generator is None or isinstance(generator, torch.Generator):
        return torch.rand(n, 1, generator=generator, device=device, dtype=dtype)
    if len(generator) != n:
        raise ConfigError(f"{len(generator)} generators for {n} rows; give one per row")
    return torch.cat([torch.rand(1, 1, generator=g, dtype=dtype) for g in generator]).to(device)


def categorical(probs: torch.Tensor, generator: Generators = None) -> torch.Tensor:
    """One draw per row of `probs` [B, V] by inverting the cumulative distribution: one uniform per row, a cumsum
    and a binary search (`torch.multinomial` draws the same distribution, `SamplingConfig.multinomial`).
    `generator`: one for the batch, or one per row (`uniforms`)."""
    cdf = probs.cumsum(-1)
    u = uniforms(probs.shape[0], generator, device=probs.device, dtype=cdf.dtype) * cdf[:, -1:]
    tok = torch.searchsorted(cdf, u, right=True).squeeze(-1)
    # a draw past the last nonzero mass (float rounding at the top) takes the last token with mass
    last = probs.shape[-1] - 1 - (probs.flip(-1) > 0).to(torch.uint8).argmax(-1)
    return torch.minimum(tok, last)


def next_tokens(logits: torch.Tensor, config: SamplingConfig, generator: Generators = None):
    """One token per row of `logits` [B, V] as `config` says (arg-max, or a draw at its temperature and top-p from
    `generator`: one for the batch or one per row), and its recorded log-prob ``log_softmax(logits / T)[token]``
    (T = `SamplingConfig.logprob_temperature`). Returns ``(tokens [B], log-probs [B])``."""
    t = config.logprob_temperature
    logp = torch.log_softmax(logits / t, dim=-1)
    if config.greedy:
        tok = logits.argmax(-1)
    else:
        probs = _top_p_filter(logits / t, config.top_p).softmax(-1)
        if not config.multinomial:
            tok = categorical(probs, generator)
        elif generator is not None and not isinstance(generator, torch.Generator):  # one per row
            tok = torch.cat([torch.multinomial(probs[b: b + 1], 1, generator=g) for b, g in enumerate(generator)])
            tok = tok.squeeze(-1)
        else:
            tok = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return tok, logp.gather(-1, tok.unsqueeze(-1)).squeeze(-1)


# transformers >= 5.2x names the KV cache `cache`; older versions `past_key_values`
def _cache_of(out):
    return out.cache if getattr(out, "cache", None) is not None else out.past_key_values


def _cache_kw(model) -> str:
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


class PrefixCache:
    """Per-episode KV cache of the last sequence each episode fed to the model (prefix caching).

    The anchor is vLLM's automatic prefix caching and SGLang's RadixAttention: a prompt that begins with tokens
    already encoded reuses their keys and values, so only the rest is encoded. Here the unit is one episode
    (`key`, the rollout slot): after a turn the entry holds the turn's prompt + generated ids (less the last
    sampled token, which was never fed) and their per-layer keys/values. The next turn reuses the longest common
    prefix of that sequence and the new prompt: in concat mode the whole previous context, so a turn encodes only
    the env's new tokens; in window mode the unchanged head (system prompt and any pinned first turn).

    Entries are plain per-layer ``(key, value)`` tensors of shape ``[heads, length, head_dim]``; `sample` stacks
    them into a transformers `DynamicCache` for the batch (padding between the reused and the new part is masked,
    positions are explicit), so any `transformers` causal LM with a standard KV cache works.
    """

    def __init__(self) -> None:
        self.entries: dict = {}
        self.reused_tokens = 0
        self.encoded_tokens = 0

    def clear(self) -> None:
        self.entries.clear()

    def drop(self, key) -> None:
        self.entries.pop(key, None)

    def lookup(self, key, prompt: list[int]) -> tuple[int, list | None, torch.Tensor | None]:
        """``(n, kv, hidden)``: how many leading prompt tokens have cached keys/values (always < len(prompt), so
        the last prompt token is encoded and gives the next-token logits), and those cached tensors."""
        entry = self.entries.get(key)
        if entry is None:
            return 0, None, None
        ids, kv, hidden = entry
        limit = min(len(ids), len(prompt) - 1)
        n = 0
        while n < limit and ids[n] == prompt[n]:
            n += 1
        return n, kv, hidden

    def store(self, key, ids: list[int], kv: list, hidden: torch.Tensor | None) -> None:
        self.entries[key] = (ids, kv, hidden)


def _layer_kv(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    layers = getattr(cache, "layers", None)
    if layers is not None:
        return [(layer.keys, layer.values) for layer in layers]
    return list(zip(cache.key_cache, cache.value_cache, strict=False))  # older transformers


def _reserved_cache(model, capacity: int):
    """A transformers `DynamicCache` whose layers write into buffers with room for `capacity` positions.

    `DynamicLayer.update` concatenates the whole cache with each decoding step's keys/values, a copy that grows with
    the context (the dominant cost of decoding after a long concat-mode prompt); these layers write the step in place
    and grow their buffer geometrically only when it is full. Everything else is DynamicCache's."""
    from transformers import DynamicCache
    from transformers.cache_utils import Cache, DynamicLayer

    class ReservedLayer(DynamicLayer):
        def lazy_initialization(self, key_states, value_states) -> None:
            b, h, _, d = key_states.shape
            self.device = key_states.device
            # positions past the written length are never read (the views stop there)
            self._k = key_states.new_empty((b, h, capacity, d))
            self._v = value_states.new_empty((b, h, capacity, value_states.shape[-1]))
            self._n = 0
            self.is_initialized = True

        def _views(self):
            self.keys, self.values = self._k[:, :, : self._n], self._v[:, :, : self._n]

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            n = key_states.shape[-2]
            if self._n + n > self._k.shape[2]:
                grow = max(self._k.shape[2], n)
                self._k = torch.cat([self._k, self._k.new_empty(self._k.shape[:2] + (grow,) + self._k.shape[3:])], 2)
                self._v = torch.cat([self._v, self._v.new_empty(self._v.shape[:2] + (grow,) + self._v.shape[3:])], 2)
            self._k[:, :, self._n: self._n + n] = key_states
            self._v[:, :, self._n: self._n + n] = value_states
            self._n += n
            self._views()
            return self.keys, self.values

        def get_seq_length(self) -> int:
            return self._n if self.is_initialized else 0

        def batch_select_indices(self, indices) -> None:
            if self.is_initialized:
                self._k, self._v = self._k[indices], self._v[indices]
                self._views()

    cache = DynamicCache.__new__(DynamicCache)
    Cache.__init__(cache, layers=[ReservedLayer() for _ in range(model.config.get_text_config().num_hidden_layers)])
    return cache


def _stack_past(model, reused: list[int], kvs: list, width: int, capacity: int):
    """A reserved-capacity cache holding `width` positions: row i's `reused[i]` cached positions right-aligned."""
    cache = _reserved_cache(model, capacity)
    ref = next(kv for kv in kvs if kv is not None)
    for layer, (k0, v0) in enumerate(ref):
        k = k0.new_zeros((len(reused), k0.shape[0], width, k0.shape[2]))
        v = v0.new_zeros((len(reused), v0.shape[0], width, v0.shape[2]))
        for i, (n, kv) in enumerate(zip(reused, kvs, strict=False)):
            if n:
                k[i, :, width - n:] = kv[layer][0][:, :n]
                v[i, :, width - n:] = kv[layer][1][:, :n]
        cache.update(k, v, layer)
    return cache


#: fixed cost of one forward pass (Python, kernel launches, cache bookkeeping) in units of one query token's
#: attention to one context token; at the 128-wide default model it is about the work of 100 prompt tokens
ROW_OVERHEAD_UNITS = 80_000


def prefill_cost(model, new: Sequence[int], context: Sequence[int], mode: str) -> float:
    """Estimated cost of encoding prompts with `new` new tokens each over contexts of `context` tokens (new
    included), in units of one query token's attention to one context token: per token the linear layers cost
    ``linear`` units (≈ (4·h² + 3·h·f) / (2·h) for width h and feed-forward width f), attention the context length.
    ``"rows"``: Σ new_i · (linear + context_i) + rows · `ROW_OVERHEAD_UNITS`; ``"batch"``: rows · max new ·
    (linear + max context) + one overhead."""
    cfg = model.config
    # (a missing size reads as 0, falsy as None was: the next name is tried)
    h: int = getattr(cfg, "hidden_size", 0) or getattr(cfg, "n_embd", 128)
    f: int = getattr(cfg, "intermediate_size", 0) or getattr(cfg, "n_inner", 0) or 4 * h
    linear = (4 * h * h + 3 * h * f) / (2 * h)
    if mode == "rows":
        return sum(n * (linear + c) for n, c in zip(new, context, strict=True)) + len(new) * ROW_OVERHEAD_UNITS
    return len(new) * max(new) * (linear + max(context)) + ROW_OVERHEAD_UNITS


def _prefill_batch(model, new, reused, kvs, config, keep, cache_kw, pad_id, device, reserve):
    """One padded forward over every row's new tokens: the cached prefixes right-aligned to the longest, the new
    tokens left-padded. Returns (cache, attention mask, last positions, last logits, new tokens' states or None)."""
    batch = len(new)
    ids, new_mask = left_pad(new, pad_id, device)
    width = max(reused)
    past = None
    capacity = width + ids.shape[1] + config.max_new_tokens
    if width > 0:
        past = _stack_past(model, reused, kvs, width, capacity)
    elif reserve:
        past = _reserved_cache(model, capacity)
    if width > 0:
        old_mask = torch.zeros((batch, width), dtype=torch.long, device=device)
        for i, n in enumerate(reused):
            if n:
                old_mask[i, width - n:] = 1
        mask = torch.cat([old_mask, new_mask], dim=1)
    else:
        mask = new_mask
    pos = (positions(new_mask) + torch.tensor(reused, device=device)[:, None]) * new_mask
    kw = {cache_kw: past} if past is not None else {}
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                output_hidden_states=config.record_hidden, **keep, **kw)
    states = None
    if config.record_hidden:
        h = out.hidden_states[config.hidden_layer].float()
        states = [h[i, h.shape[1] - len(new[i]):] for i in range(batch)]
    return _cache_of(out), mask, pos[:, -1], out.logits[:, -1, :].float(), states


def _prefill_rows(model, new, reused, kvs, config, keep, cache_kw, device):
    """One forward per row over its own new tokens and cached prefix (no padding), then the rows' keys/values
    stacked right-aligned into one reserved cache for batched decoding. Same returns as `_prefill_batch`."""
    logits, row_kv, states = [], [], []
    for i, toks in enumerate(new):
        n = reused[i]
        past = _stack_past(model, [n], [kvs[i]], n, n + len(toks)) if n else None
        ids = torch.tensor([toks], dtype=torch.long, device=device)
        pos = torch.arange(n, n + len(toks), device=device)[None]
        mask = torch.ones((1, n + len(toks)), dtype=torch.long, device=device)
        kw = {cache_kw: past} if past is not None else {}
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                    output_hidden_states=config.record_hidden, **keep, **kw)
        row_kv.append([(k[0], v[0]) for k, v in _layer_kv(_cache_of(out))])
        logits.append(out.logits[:, -1, :].float())
        if config.record_hidden:
            states.append(out.hidden_states[config.hidden_layer][0].float())
    total = [n + len(t) for n, t in zip(reused, new, strict=True)]
    width = max(total)
    past = _stack_past(model, total, row_kv, width, width + config.max_new_tokens)
    mask = torch.zeros((len(new), width), dtype=torch.long, device=device)
    for i, n in enumerate(total):
        mask[i, width - n:] = 1
    last_pos = torch.tensor(total, device=device) - 1
    return past, mask, last_pos, torch.cat(logits), (states if config.record_hidden else None)


@torch.no_grad()
def sample(model, prompts: list[list[int]], *, stop_ids, pad_id: int, config: SamplingConfig,
           generator: Generators = None, cache: PrefixCache | None = None,
           keys: list | None = None) -> SampleOutput:
    """Sample one continuation per prompt with the KV cache (see module docstring for what is recorded).

    With a `PrefixCache` and one key per prompt (the episode), each row reuses the cached keys/values of its
    longest common prefix with that episode's previous sequence, encodes only the rest, and leaves its new
    sequence in the cache. A row leaves the batch as soon as it has produced a stop token (finished rows cost no
    further decoding steps). Rows are sampled in the same order with the same generator either way, so a seed
    gives the same ids with and without the prefix cache (up to float rounding, below 1e-5 in the log-probs).

    `generator` is one generator for the batch (a row's draws then depend on the rows sampled with it) or one per
    prompt: each row then draws one uniform per generated token from its own generator only, so its tokens do not
    depend on which other prompts share the batch (the LM agent's per-episode streams).
    """
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ConfigError("every prompt needs at least one token")
    if cache is not None and (keys is None or len(keys) != len(prompts)):
        raise ConfigError("sample(cache=...) needs one key per prompt")
    # one generator per row, or one shared (or none)
    gens = None if generator is None or isinstance(generator, torch.Generator) else list(generator)
    per_row = gens is not None
    if gens is not None and len(gens) != len(prompts):
        raise ConfigError(f"sample got {len(gens)} generators for {len(prompts)} prompts; give one per prompt")
    import inspect

    device = next(model.parameters()).device
    stop = torch.tensor(sorted(set(stop_ids)), dtype=torch.long, device=device)
    stop_set = set(stop.tolist())
    batch = len(prompts)
    reused = [0] * batch
    kvs: list[list | None] = [None] * batch
    hid_cached: list[torch.Tensor | None] = [None] * batch
    if cache is not None:
        assert keys is not None  # checked above
        for i, (key, p) in enumerate(zip(keys, prompts, strict=False)):
            reused[i], kvs[i], hid_cached[i] = cache.lookup(key, p)
    if config.record_hidden:  # the prompt mean needs every prompt token's state: reuse only what has them
        reused = [n if h is not None and len(h) >= n else 0 for n, h in zip(reused, hid_cached, strict=False)]
    new = [p[n:] for p, n in zip(prompts, reused, strict=False)]
    cache_kw = _cache_kw(model)
    # the prompt's output layer is only needed at its last position
    keep = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
    rows = config.prefill == "rows"
    if config.prefill == "auto" and batch > 1:
        sizes = ([len(x) for x in new], [n + len(x) for n, x in zip(reused, new, strict=False)])
        rows = prefill_cost(model, *sizes, "rows") < prefill_cost(model, *sizes, "batch")
    if rows and batch > 1:
        past, mask, last_pos, logits, new_states = _prefill_rows(model, new, reused, kvs, config, keep, cache_kw,
                                                                device)
    else:
        past, mask, last_pos, logits, new_states = _prefill_batch(model, new, reused, kvs, config, keep, cache_kw,
                                                                  pad_id, device, cache is not None)
    if cache is not None:
        cache.reused_tokens += sum(reused)
        cache.encoded_tokens += sum(len(x) for x in new)
    hidden: list[dict] | None = None
    prompt_hidden: list[torch.Tensor | None] = [None] * batch
    if config.record_hidden:
        hidden = []
        for i in range(batch):
            states = new_states[i]
            cached = hid_cached[i]
            if reused[i] and cached is not None:
                states = torch.cat([cached[: reused[i]], states])
            prompt_hidden[i] = states
            hidden.append({"mean": states.mean(0).tolist(), "last": states[-1].tolist()})
    alive = list(range(batch))  # original row of each batch position
    done: set[int] = set()  # with keep_finished: batch positions that have stopped but stay in the batch
    spare = torch.Generator().manual_seed(0) if per_row and config.keep_finished else None
    gen_ids: list[list[int]] = [[] for _ in range(batch)]
    gen_lp: list[list[float]] = [[] for _ in range(batch)]
    steps = 0
    fed_hidden: list[list[torch.Tensor]] = [[] for _ in range(batch)]  # states of fed generated tokens

    def retire(rows_here: list[int]) -> None:
        """Move finished rows' keys/values (real positions only) into the prefix cache."""
        if cache is None:
            return
        assert keys is not None  # checked above
        layers = _layer_kv(past)
        for b in rows_here:
            i = alive[b]
            real = mask[b].bool()
            idx = real.nonzero().squeeze(1)
            kv = [(k[b].index_select(1, idx), v[b].index_select(1, idx)) for k, v in layers]
            seq = list(prompts[i]) + gen_ids[i][:-1]
            h = prompt_hidden[i]
            if h is not None and fed_hidden[i]:
                h = torch.cat([h] + fed_hidden[i])
            cache.store(keys[i], seq, kv, h)

    while True:
        # the rows still in the batch; a finished row kept in it (keep_finished) draws from a throw-away stream so
        # that its own stream does not advance
        gen: Generators = generator
        if gens is not None:  # (`done` is filled only with keep_finished, so `spare` is set when it is used)
            gen = [gens[i] if b not in done or spare is None else spare for b, i in enumerate(alive)]
        tok, tok_lp = next_tokens(logits, config, gen)
        steps += 1
        tok_l, lp_l = tok.tolist(), tok_lp.tolist()
        for b, i in enumerate(alive):
            if b not in done:
                gen_ids[i].append(tok_l[b])
                gen_lp[i].append(lp_l[b])
        finished = [b for b in range(len(alive)) if b not in done and tok_l[b] in stop_set]
        if steps == config.max_new_tokens or len(finished) + len(done) == len(alive):
            retire([b for b in range(len(alive)) if b not in done])
            break
        if finished:
            retire(finished)
            if config.keep_finished:  # the previous behaviour: decode a pad token whose output is ignored
                done.update(finished)
                tok = tok.clone()
                tok[torch.tensor(sorted(done), device=device)] = pad_id
            else:  # finished rows leave the batch: no more decoding steps for them
                keep_rows = [b for b in range(len(alive)) if tok_l[b] not in stop_set]
                sel = torch.tensor(keep_rows, dtype=torch.long, device=device)
                past.batch_select_indices(sel)
                mask, tok, last_pos = mask[sel], tok[sel], last_pos[sel]
                alive = [alive[b] for b in keep_rows]
        mask = torch.cat([mask, torch.ones((len(alive), 1), dtype=mask.dtype, device=device)], dim=1)
        last_pos = last_pos + 1
        track = config.record_hidden and cache is not None
        out = model(input_ids=tok.unsqueeze(-1), attention_mask=mask, position_ids=last_pos.unsqueeze(-1),
                    use_cache=True, output_hidden_states=track, **{cache_kw: past})
        if track:
            h = out.hidden_states[config.hidden_layer][:, -1].float()
            for b, i in enumerate(alive):
                fed_hidden[i].append(h[b: b + 1])
        past = _cache_of(out)
        logits = out.logits[:, -1, :].float()
    stopped = [bool(g) and g[-1] in stop_set for g in gen_ids]
    return SampleOutput(ids=gen_ids, logprobs=gen_lp, stopped=stopped, hidden=hidden,
                        new_tokens=sum(len(g) for g in gen_ids),
                        extra={"steps": steps, "encoded_tokens": sum(len(x) for x in new),
                               "reused_tokens": sum(reused)})


def token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, temperature: float = 1.0,
                   return_hidden: bool = False):
    """``logp[b, t] = log p(input_ids[b, t] | input_ids[b, :t])`` (0 at t = 0) with one forward pass.

    Differentiable (call under `torch.no_grad()` for old/reference log-probs). Works with left or right padding.
    Returns ``(logp [B, L], last_hidden [B, L, H] or None)``.
    """
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions(attention_mask),
                use_cache=False, output_hidden_states=return_hidden)
    logits = out.logits[:, :-1, :].float() / temperature
    lp = torch.log_softmax(logits, dim=-1).gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    lp = torch.cat([torch.zeros_like(lp[:, :1]), lp], dim=1)
    return lp, (out.hidden_states[-1] if return_hidden else None)


def pack(prompts: list[list[int]], actions: list[list[int]], pad_id: int, device="cpu"):
    """Right-pad prompt+action rows: (input_ids, attention_mask, action_mask) with action_mask on action tokens."""
    width = max(len(p) + len(a) for p, a in zip(prompts, actions, strict=False))
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    amask = torch.zeros_like(ids, dtype=torch.bool)
    for i, (p, a) in enumerate(zip(prompts, actions, strict=False)):
        n = len(p) + len(a)
        ids[i, :n] = torch.tensor(list(p) + list(a), dtype=torch.long)
        mask[i, :n] = 1
        amask[i, len(p):n] = True
    return ids.to(device), mask.to(device), amask.to(device)


def action_logprobs(model, prompts: list[list[int]], actions: list[list[int]], *, pad_id: int,
                    temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of each action's tokens given its prompt: ``(logp [B, A], mask [B, A])``, A = longest action.

    One forward pass over the right-padded batch; differentiable.
    """
    device = next(model.parameters()).device
    ids, mask, amask = pack(prompts, actions, pad_id, device)
    lp, _ = token_logprobs(model, ids, mask, temperature=temperature)
    width = max(len(a) for a in actions)
    out = torch.zeros((len(actions), width), dtype=lp.dtype, device=device)
    omask = torch.zeros((len(actions), width), dtype=torch.bool, device=device)
    for i, (p, a) in enumerate(zip(prompts, actions, strict=False)):
        out[i, : len(a)] = lp[i, len(p): len(p) + len(a)]
        omask[i, : len(a)] = True
    return out, omask
