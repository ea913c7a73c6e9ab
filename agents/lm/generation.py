"""Batched sampling with the KV cache, and exact log-prob recomputation (design §4-§5, anchors §7).

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
real prompt tokens (``"mean"``) and at the last prompt token (``"last"``, the state the action is generated from).
"""

from __future__ import annotations

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

    def __post_init__(self) -> None:
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


# transformers >= 5.2x names the KV cache `cache`; older versions `past_key_values`
def _cache_of(out):
    return out.cache if getattr(out, "cache", None) is not None else out.past_key_values


def _cache_kw(model) -> str:
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


@torch.no_grad()
def sample(model, prompts: list[list[int]], *, stop_ids, pad_id: int, config: SamplingConfig,
           generator: torch.Generator | None = None) -> SampleOutput:
    """Sample one continuation per prompt with the KV cache (see module docstring for what is recorded)."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ConfigError("every prompt needs at least one token")
    device = next(model.parameters()).device
    stop = torch.tensor(sorted(set(stop_ids)), dtype=torch.long, device=device)
    ids, mask = left_pad(prompts, pad_id, device)
    batch = ids.shape[0]
    import inspect

    # the prompt's output layer is only needed at its last position
    keep = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions(mask), use_cache=True,
                output_hidden_states=config.record_hidden, **keep)
    hidden = None
    if config.record_hidden:
        h = out.hidden_states[-1].float()
        m = mask.unsqueeze(-1).float()
        mean = (h * m).sum(1) / m.sum(1).clamp(min=1.0)
        hidden = [{"mean": mean[i].tolist(), "last": h[i, -1].tolist()} for i in range(batch)]
    past, cache_kw = _cache_of(out), _cache_kw(model)
    logits = out.logits[:, -1, :].float()
    last_pos = positions(mask)[:, -1]
    done = torch.zeros(batch, dtype=torch.bool, device=device)
    gen_ids: list[list[int]] = [[] for _ in range(batch)]
    gen_lp: list[list[float]] = [[] for _ in range(batch)]
    t = config.logprob_temperature
    steps = 0
    for _ in range(config.max_new_tokens):
        logp = torch.log_softmax(logits / t, dim=-1)
        if config.greedy:
            tok = logits.argmax(-1)
        else:
            probs = _top_p_filter(logits / t, config.top_p).softmax(-1)
            tok = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        tok_lp = logp.gather(-1, tok.unsqueeze(-1)).squeeze(-1)
        steps += 1
        tok_l, lp_l = tok.tolist(), tok_lp.tolist()
        for i in torch.nonzero(~done).flatten().tolist():
            gen_ids[i].append(tok_l[i])
            gen_lp[i].append(lp_l[i])
        done |= torch.isin(tok, stop)
        if bool(done.all()) or steps == config.max_new_tokens:
            break
        # finished rows keep decoding a pad token whose output is ignored (keeps the batch rectangular)
        tok = torch.where(done, torch.full_like(tok, pad_id), tok)
        mask = torch.cat([mask, torch.ones((batch, 1), dtype=mask.dtype, device=device)], dim=1)
        last_pos = last_pos + 1
        out = model(input_ids=tok.unsqueeze(-1), attention_mask=mask, position_ids=last_pos.unsqueeze(-1),
                    use_cache=True, **{cache_kw: past})
        past = _cache_of(out)
        logits = out.logits[:, -1, :].float()
    stopped = [bool(g) and g[-1] in set(stop.tolist()) for g in gen_ids]
    return SampleOutput(ids=gen_ids, logprobs=gen_lp, stopped=stopped, hidden=hidden,
                        new_tokens=sum(len(g) for g in gen_ids), extra={"steps": steps})


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
    width = max(len(p) + len(a) for p, a in zip(prompts, actions))
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    amask = torch.zeros_like(ids, dtype=torch.bool)
    for i, (p, a) in enumerate(zip(prompts, actions)):
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
    for i, (p, a) in enumerate(zip(prompts, actions)):
        out[i, : len(a)] = lp[i, len(p): len(p) + len(a)]
        omask[i, : len(a)] = True
    return out, omask
