"""`LMAgent`: a `transformers` causal LM acting in the shopping env (docs/lm-agent.md).

Interface for trainers (kept stable; the RL baselines build on it):

* ``agent = LMAgent(env_id=..., checkpoint=DIR | None, context_mode="window" | "concat", kv_cache=True, ...)``;
  ``checkpoint=None`` loads the shipped SFT checkpoint (``data/lm/sft``) when present, else (with a warning) a
  random-init default model with the shipped tokenizer. A checkpoint's manifest options (`SAVED_OPTIONS`: context mode,
  history, ...) are restored; arguments given explicitly override them. ``model=`` / ``tokenizer=`` objects can be
  passed instead.
* ``agent.model`` (a `PreTrainedModel`, train it in place), ``agent.tokenizer``, ``agent.policy`` (`LMPolicy`).
* Every `Decision` carries ``prompt_ids`` (the exact context), ``action_ids`` (exactly the sampled ids, including
  the stop token when one was produced), ``action_logprobs`` (``log_softmax(logits / T)`` of each sampled token,
  T = sampling temperature, 1 for greedy) and, with ``record_hidden=True``, ``hidden = {"mean": [...], "last":
  [...]}`` (last-layer mean over the prompt and last prompt token). ``extra["context_truncated"]`` flags prompts cut
  to fit the context (concat mode then loses the prefix property for that episode).
* Recompute log-probs for a batch with one forward pass:
  ``logp, mask = agent.policy.action_logprobs(prompts, actions)`` (window rows: lists of ids; ``[B, A]`` tensors,
  differentiable) or, for concat rows built with `agents.lm.prompts.concat_layout`,
  ``logp, hidden = agent.policy.token_logprobs(input_ids, attention_mask, return_hidden=True)`` where
  ``logp[b, t]`` is the log-prob of token t (mask it with the generated-token mask). ``hidden`` is the last-layer
  state for a value head.
* ``kv_cache=True`` (default) keeps each episode's keys/values across turns (`agents.lm.generation.PrefixCache`,
  prefix caching as in vLLM / SGLang): in concat mode a turn encodes only what the env added since the last
  action, in window mode the unchanged head of the prompt (system prompt, and the first turn with
  ``pin_first_turn=True``) is reused. The records are the same as without it (tested). ``agent.stats`` counts
  turns, prompt tokens and ``encoded_tokens`` (what the model actually ran over).
* ``decoder="auto"`` (default) decodes Llama-family models with `agents.lm.decoder.SlotDecoder` (one KV buffer per
  episode, packed prefill, in-place decoding with per-row attention: the same greedy actions and per-row draws as
  the reference path at about three times its speed); ``decoder="hf"`` keeps the reference path,
  `agents.lm.generation.sample` over the `PrefixCache`, which is also used for other architectures and whenever
  ``record_hidden`` is on.
  ``agent.generate(prompts, keys)`` runs whichever applies (trainers that build their own prompts use it).
* ``tools=[schemas]`` hands tool schemas to the chat template (``apply_chat_template(tools=...)``) for models whose
  template renders them (`agents.lm.pretrained.model_agent` decides, and passes the env's prompt as
  ``system_prompt``); their tool calls are parsed by `agents.lm.parsing`.
* ``agent.save(dir)`` writes ``save_pretrained`` (safetensors) model + tokenizer + the shopsim manifest;
  ``LMAgent.from_checkpoint(dir, env_id=...)`` / ``agents.load_checkpoint(dir)`` rebuild it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from agents.base import Agent, Decision
from agents.lm.decoder import SlotDecoder
from agents.lm.decoder import supports as slot_decoder_supports
from agents.lm.generation import PrefixCache, SamplingConfig, action_logprobs, sample, token_logprobs
from agents.lm.parsing import decode_action
from agents.lm.prompts import DEFAULT_SYSTEM, ChatFormat, EpisodeContext
from shopsim.envs.records import SHOPPING
from shopsim.errors import ConfigError

#: options saved in the manifest and restored whenever a checkpoint with a manifest is loaded (the constructor's
#: `checkpoint=`, the shipped default, `from_checkpoint`); explicit constructor arguments override them
SAVED_OPTIONS = ("context_mode", "history", "history_obs_chars", "max_new_tokens", "system_prompt",
                 "pin_first_turn", "tools")
#: what the options are without a manifest
DEFAULT_OPTIONS = {"context_mode": "window", "history": 2, "history_obs_chars": 160, "max_new_tokens": 48,
                   "system_prompt": DEFAULT_SYSTEM, "pin_first_turn": False, "tools": None}
_UNSET: Any = object()
#: `LMAgent(decoder=...)` choices: the slot decoder where the model allows it, always it, or the reference path
DECODERS = ("auto", "slots", "hf")


def saved_options(checkpoint: str | Path | None) -> dict:
    """The agent options recorded in a checkpoint's manifest (empty for a plain model folder or none)."""
    path = default_checkpoint_dir() if checkpoint is None else Path(checkpoint)
    manifest = path / "shopsim_agent.json"
    if not manifest.is_file():
        return {}
    opts = json.loads(manifest.read_text()).get("options", {})
    return {k: v for k, v in opts.items() if k in SAVED_OPTIONS}


def default_checkpoint_dir() -> Path:
    from shopsim.paths import data_dir

    return data_dir() / "lm" / "sft"


class LMPolicy:
    """What a trainer needs from the LM: log-probs of given ids (one forward pass) and hidden states."""

    def __init__(self, model, tokenizer, *, temperature: float = 1.0):
        self.model, self.tokenizer, self.temperature = model, tokenizer, temperature

    @property
    def pad_id(self) -> int:
        pid = self.tokenizer.pad_token_id
        return pid if pid is not None else self.tokenizer.eos_token_id

    def action_logprobs(self, prompts: Sequence[Sequence[int]], actions: Sequence[Sequence[int]],
                        temperature: float | None = None):
        """``(logp [B, A], mask [B, A])`` of each action's tokens given its prompt (differentiable)."""
        return action_logprobs(self.model, [list(p) for p in prompts], [list(a) for a in actions],
                               pad_id=self.pad_id, temperature=temperature or self.temperature)

    def token_logprobs(self, input_ids, attention_mask, temperature: float | None = None, return_hidden=False):
        """``(logp [B, L], last_hidden | None)``: log-prob of every token given its prefix (differentiable)."""
        return token_logprobs(self.model, input_ids, attention_mask, temperature=temperature or self.temperature,
                              return_hidden=return_hidden)

    @property
    def hidden_size(self) -> int:
        cfg = self.model.config
        return int(getattr(cfg, "hidden_size", None) or cfg.n_embd)


class LMAgent(Agent):
    """Language-model agent for the shopping env (see module docstring for the trainer interface)."""

    learns = True
    #: env copies an evaluation runs for this agent (`shopsim.leaderboard.evaluate.run_seeds`): one decoding batch
    #: of this many episodes amortises each step's fixed cost; the actions do not depend on it
    eval_slots = 64

    def __init__(self, env_id: str = SHOPPING.id, checkpoint: str | Path | None = None,
                 context_mode: str = _UNSET, temperature: float = 1.0, top_p: float = 1.0,
                 max_new_tokens: int = _UNSET, greedy: bool = False, record_hidden: bool = False, device: str = "cpu",
                 history: int = _UNSET, history_obs_chars: int | None = _UNSET, max_prompt_tokens: int | None = None,
                 system_prompt: str = _UNSET, model=None, tokenizer=None, kv_cache: bool = True,
                 pin_first_turn: bool = _UNSET, decoder: str = "auto", tools: list[dict] | None = _UNSET):
        # the prompt layout a checkpoint was trained with travels with it: a model fine-tuned on history=1 acts
        # far worse under the default history=2 (shipped SFT: 67% -> 32% find_and_buy dev success)
        given = {"context_mode": context_mode, "history": history, "history_obs_chars": history_obs_chars,
                 "max_new_tokens": max_new_tokens, "system_prompt": system_prompt, "pin_first_turn": pin_first_turn,
                 "tools": tools}
        base: dict[str, Any] = {**DEFAULT_OPTIONS, **(saved_options(checkpoint) if model is None else {})}
        opt: dict[str, Any] = {k: base[k] if v is _UNSET else v for k, v in given.items()}
        context_mode, history, history_obs_chars = opt["context_mode"], opt["history"], opt["history_obs_chars"]
        max_new_tokens, system_prompt = opt["max_new_tokens"], opt["system_prompt"]
        pin_first_turn, tools = opt["pin_first_turn"], opt["tools"]
        if isinstance(tools, str):  # as a manifest keeps them: JSON text, so the schemas' key order survives
            tools = json.loads(tools)
        self.env_id = env_id
        self.device = torch.device(device)
        self.sampling = SamplingConfig(temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens,
                                       greedy=greedy, record_hidden=record_hidden)
        if (model is None) != (tokenizer is None):
            raise ConfigError("pass both model= and tokenizer=, or neither (then checkpoint= is used)")
        if model is None:
            model, tokenizer = self._load(checkpoint)
        self.checkpoint = str(checkpoint) if checkpoint is not None else None
        self.model = model.to(self.device)
        self.model.eval()
        self.tokenizer = tokenizer
        self.tokenizer.padding_side = "left"
        self.fmt = ChatFormat(tokenizer, system_prompt, tools=tools)
        #: how the model is told the actions: "tools" (schemas through its chat template) or "text" (a grammar)
        self.actions = "tools" if tools else "text"
        self.policy = LMPolicy(self.model, tokenizer, temperature=self.sampling.logprob_temperature)
        from agents.lm.model import context_length

        if max_prompt_tokens is None:
            max_prompt_tokens = context_length(self.model) - max_new_tokens
        if max_prompt_tokens < 16:
            raise ConfigError(f"max_prompt_tokens={max_prompt_tokens} leaves no room for an observation")
        self.options: dict[str, Any] = dict(
            context_mode=context_mode, history=history, history_obs_chars=history_obs_chars,
            max_new_tokens=max_new_tokens, system_prompt=system_prompt, pin_first_turn=pin_first_turn)
        if tools:  # recorded only when given, so that the manifests of text-grammar agents stay as they were
            self.options["tools"] = json.dumps(tools, ensure_ascii=False)
        self._ctx_kw: dict[str, Any] = dict(mode=context_mode, history=history, history_obs_chars=history_obs_chars,
                                            max_prompt_tokens=max_prompt_tokens, pin_first_turn=pin_first_turn)
        #: per-episode KV cache across turns (None: every turn encodes its whole prompt)
        self.kv_cache: PrefixCache | None = PrefixCache() if kv_cache else None
        if decoder not in DECODERS:
            raise ConfigError(f"decoder={decoder!r}; choose one of {DECODERS}")
        if decoder == "slots" and not slot_decoder_supports(self.model):
            raise ConfigError(f"decoder='slots' needs a Llama-family model, got {type(self.model).__name__}; "
                              "use decoder='auto' or 'hf'")
        #: the fast path's per-episode caches (None: every turn decodes through `generation.sample`)
        self.slots: SlotDecoder | None = (SlotDecoder() if decoder != "hf" and slot_decoder_supports(self.model)
                                          else None)
        EpisodeContext(self.fmt, **self._ctx_kw)  # validate options now
        self.contexts: dict[int, EpisodeContext] = {}
        self.pending: dict[int, list[int]] = {}
        self.generator = torch.Generator(device="cpu").manual_seed(0)
        #: each episode's own sampling stream (`seed_episode`); a slot without one samples from `generator`
        self.episode_generators: dict[int, torch.Generator] = {}
        self.stats = {"generate_s": 0.0, "act_s": 0.0, "new_tokens": 0}

    @staticmethod
    def _load(checkpoint):
        from agents.lm.model import build_model, load_model
        from agents.lm.tokenizer import load_tokenizer

        if checkpoint is None:
            ckpt = default_checkpoint_dir()
            if (ckpt / "config.json").is_file():
                return load_model(ckpt), load_tokenizer(ckpt)
            import warnings

            warnings.warn(f"no shipped SFT checkpoint in {ckpt}: the LM agent starts from a randomly initialised "
                          "model; train one with `shopsim sft` and pass checkpoint=OUT/checkpoint", stacklevel=3)
            tok = load_tokenizer()
            return build_model(tok), tok
        path = Path(checkpoint)
        if not (path / "config.json").is_file():
            raise ConfigError(f"{path} is not a model folder (no config.json); pass a save_pretrained directory")
        return load_model(path), load_tokenizer(path)

    # ------------------------------------------------------------------ agent protocol
    def reset(self, num_slots: int, seed: int | None = None) -> None:
        super().reset(num_slots, seed)
        self.generator = torch.Generator(device="cpu").manual_seed(0 if seed is None else int(seed))
        self.episode_generators = {}
        self.contexts, self.pending = {}, {}
        if self.kv_cache is not None:
            self.kv_cache.clear()
        if self.slots is not None:
            self.slots.clear()

    def seed_episode(self, slot: int, seed: int) -> None:
        """The episode starting in `slot` samples from its own generator seeded with `seed`: its tokens then depend
        on its seed and the model only, not on which episodes share the decoding batch (so a collect split over
        workers samples what one process samples)."""
        self.episode_generators[slot] = torch.Generator(device="cpu").manual_seed(int(seed))

    def begin_episode(self, slot: int, observation: Any, info: dict) -> None:
        ctx = EpisodeContext(self.fmt, **self._ctx_kw)
        ctx.start(observation)
        self.contexts[slot] = ctx
        self.pending.pop(slot, None)
        self._drop_cache(slot)

    def _drop_cache(self, slot) -> None:
        if self.kv_cache is not None:
            self.kv_cache.drop(slot)
        if self.slots is not None:
            self.slots.drop(slot)

    def generate(self, prompts: list[list[int]], keys: Sequence, *, config: SamplingConfig | None = None,
                 generator=None):
        """Sample one continuation per prompt, row i continuing episode `keys[i]`'s cache: through the slot decoder
        when it applies (a Llama-family model, the KV cache on, no hidden summaries), else `generation.sample` over
        the prefix cache. `config` defaults to the agent's sampling, `generator` to its stream."""
        config = config or self.sampling
        generator = self.generator if generator is None else generator
        stop, pad = self.fmt.stop_ids, self.policy.pad_id
        if self.slots is not None and self.kv_cache is not None and not config.record_hidden:
            return self.slots.sample(self.model, prompts, list(keys), stop_ids=stop, pad_id=pad, config=config,
                                     generator=generator)
        cache = self.kv_cache
        return sample(self.model, prompts, stop_ids=stop, pad_id=pad, config=config, generator=generator,
                      cache=cache, keys=list(keys) if cache is not None else None)

    def act(self, observations, infos, slots) -> list[Decision]:
        import time

        t_act = time.perf_counter()
        prompts = []
        for obs, slot in zip(observations, slots, strict=False):
            if slot not in self.contexts:
                self.begin_episode(slot, obs, {})
            ctx = self.contexts[slot]
            if slot in self.pending:
                ctx.step(self.pending.pop(slot), obs)
            prompts.append(ctx.prompt())
        t0 = time.perf_counter()
        self.model.eval()
        # per-episode streams when the runner seeded them (`seed_episode`), else the agent's one stream
        gens = self.episode_generators
        generator = [gens.get(s, self.generator) for s in slots] if gens else self.generator
        out = self.generate(prompts, slots, generator=generator)
        self.stats["generate_s"] += time.perf_counter() - t0
        self.stats["new_tokens"] += out.new_tokens
        self.stats["turns"] = self.stats.get("turns", 0) + len(slots)
        self.stats["prompt_tokens"] = self.stats.get("prompt_tokens", 0) + sum(len(p) for p in prompts)
        # what the model ran over: the prompt tokens it had no cache for, plus one decoding step per generated
        # token but the last
        self.stats["encoded_tokens"] = (self.stats.get("encoded_tokens", 0) + out.extra["encoded_tokens"]
                                        + out.new_tokens - len(slots))
        decisions = []
        for i, slot in enumerate(slots):
            ids = out.ids[i]
            self.pending[slot] = ids
            extra = {"stopped": out.stopped[i]}
            if self.contexts[slot].truncated:
                extra["context_truncated"] = True
            decisions.append(Decision(action=decode_action(self.tokenizer, ids), prompt_ids=prompts[i],
                                      action_ids=list(ids), action_logprobs=list(out.logprobs[i]),
                                      hidden=out.hidden[i] if out.hidden is not None else None, extra=extra))
        self.stats["act_s"] += time.perf_counter() - t_act
        return decisions

    def observe(self, slot: int, reward: float, terminated: bool, truncated: bool, info: dict) -> None:
        if terminated or truncated:
            self.contexts.pop(slot, None)
            self.pending.pop(slot, None)
            self.episode_generators.pop(slot, None)
            self._drop_cache(slot)

    # ------------------------------------------------------------------ checkpoints
    def save(self, directory: str | Path, **info: Any) -> Path:
        """``save_pretrained`` (safetensors) model and tokenizer + the shopsim manifest, each file written atomically
        with the normal file mode (`shopsim.paths.atomic_files`). A domain tokenizer's chat template is saved with
        this agent's system prompt as its default system message (`agents.lm.tokenizer.chat_template`)."""
        from agents.lm.tokenizer import chat_template, is_domain_template
        from agents.registry import save_manifest
        from shopsim.paths import atomic_files

        directory = Path(directory)
        template = getattr(self.tokenizer, "chat_template", None)
        try:
            if is_domain_template(template):
                # the folder's template carries the system prompt the policy acts with, so plain `transformers`
                # (`apply_chat_template` without a system message) builds the agent's prompt
                self.tokenizer.chat_template = chat_template(self.options["system_prompt"])
            with atomic_files(directory) as tmp:
                self.model.save_pretrained(str(tmp), safe_serialization=True)
                self.tokenizer.save_pretrained(str(tmp))
        finally:
            self.tokenizer.chat_template = template  # the live tokenizer (perhaps shared) stays as it was
        if self.env_kwargs and "env_kwargs" not in info:  # keep the env options the policy was trained on
            info["env_kwargs"] = dict(self.env_kwargs)
        save_manifest(directory, type(self), self.env_id, options=self.options, **info)
        return directory

    @classmethod
    def from_checkpoint(cls, directory, env_id: str | None = None, **kwargs: Any) -> LMAgent:
        return cls(env_id=env_id or SHOPPING.id, checkpoint=Path(directory), **kwargs)
