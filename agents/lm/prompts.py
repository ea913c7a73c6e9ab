"""Prompt building for the two context modes (docs/design.md, docs/lm-agent.md), token-in/token-out.

Observations are tokenised once, as they arrive, and generated actions are kept as the exact ids the model
sampled; nothing the model generated is ever decoded and re-encoded (re-tokenising
generated text can give other ids than the sampled ones, and the recorded log-probs would no longer match).

A `ChatFormat` cuts the tokenizer's chat template into the pieces a dialogue is assembled from, by rendering
sentinel messages and splitting the text around them:

* ``system_ids``: the rendered system message (including any BOS text the template adds);
* ``observation_ids(obs)``: one user message *plus* the generation prompt (the assistant header);
* ``close_ids(action_ids)``: what follows an assistant message up to the next user message (for the default
  template ``<|end|>``, dropped when the action already ended with the stop token).

Works with any template that renders messages in order (the shipped one, ChatML, Llama-3 style...); a tokenizer
without a template gets `FALLBACK_TEMPLATE`.

`EpisodeContext` holds one episode:

* **concat**: one growing sequence. Turn k's prompt is exactly turn k-1's prompt + its action ids + the close ids
  + the new observation's ids (strict prefix property, tested), so a trainer can score the whole episode in one
  row with a mask over the generated segments (`concat_layout`).
* **window**: each turn's prompt is rebuilt as system + the last `history` turns (their observations without
  the lines the current observation repeats, cut to `history_obs_chars` characters, and their exact action ids)
  + the current observation; the oldest history
  turns are dropped first when the prompt would not fit in `max_prompt_tokens`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shopsim.errors import ConfigError

MODES = ("window", "concat")

DEFAULT_SYSTEM = ("You are a shopping assistant. Read the page and reply with exactly one action, "
                  "e.g. search[...] or click[...].")

#: template for tokenizers that have none (plain-text roles; the eos token ends each message)
FALLBACK_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] + ': ' + message['content'] + eos_token + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
)

_X, _Y = "\u241fOBSERVATION\u241f", "\u241fACTION\u241f"


def supports_tools(tokenizer) -> bool:
    """Whether the tokenizer's chat template renders a ``tools=`` list (it reads the ``tools`` variable)."""
    import re

    template = getattr(tokenizer, "chat_template", None)
    return isinstance(template, str) and re.search(r"\btools\b", template) is not None


class ChatFormat:
    """Token pieces of a tokenizer's chat template (see module docstring)."""

    def __init__(self, tokenizer, system_prompt: str = DEFAULT_SYSTEM, tools: list[dict] | None = None):
        if not getattr(tokenizer, "chat_template", None):
            tokenizer.chat_template = FALLBACK_TEMPLATE
        if tools and not supports_tools(tokenizer):
            raise ConfigError("the tokenizer's chat template does not render tools; give the text grammar in the "
                              "system prompt instead (tools=None)")
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt
        self.tools = tools

        def render(messages, gen=False):
            # the tool schemas go to the template, which renders them where the model was trained to read them
            # (usually the system message, so `system_ids` carries them)
            extra = {"tools": tools} if tools else {}
            return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen, **extra)

        sys_msgs = [{"role": "system", "content": system_prompt}]
        sys_text = render(sys_msgs)
        with_user = render(sys_msgs + [{"role": "user", "content": _X}], gen=True)
        with_action = render(sys_msgs + [{"role": "user", "content": _X}, {"role": "assistant", "content": _Y},
                                          {"role": "user", "content": _X}], gen=True)
        if not with_user.startswith(sys_text) or _X not in with_user or _Y not in with_action:
            raise ConfigError("the tokenizer's chat template does not render messages in order; "
                              "give the LM agent a tokenizer with a standard chat template")
        self.user_pre, self.user_post = with_user[len(sys_text):].split(_X)
        after = with_action.split(_Y, 1)[1]
        self.close_text = after.split(self.user_pre + _X, 1)[0] if self.user_pre else after.split(_X, 1)[0]
        self.system_ids = self.encode(sys_text)
        self.stop_ids = self._stop_ids()
        self._close_cache: dict[int | None, list[int]] = {}

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _stop_ids(self) -> set[int]:
        """Ids that end an action: eos and the first token of the close text (e.g. ``<|end|>``, ``<|im_end|>``)."""
        ids = set()
        eos = self.tokenizer.eos_token_id
        if isinstance(eos, int):
            ids.add(eos)
        close = self.encode(self.close_text.strip()) if self.close_text.strip() else []
        if close and close[0] in set(self.tokenizer.all_special_ids):
            ids.add(close[0])
        return ids

    def observation_ids(self, observation) -> list[int]:
        return self.encode(self.user_pre + str(observation) + self.user_post)

    def close_ids(self, action_ids: list[int]) -> list[int]:
        """Tokens between a generated action and the next user message."""
        last = action_ids[-1] if action_ids and action_ids[-1] in self.stop_ids else None
        if last not in self._close_cache:
            text = self.close_text
            if last is not None:
                stop_text = self.tokenizer.decode([last])
                text = text[len(stop_text):] if text.startswith(stop_text) else text
            self._close_cache[last] = self.encode(text) if text else []
        return list(self._close_cache[last])


@dataclass
class EpisodeContext:
    """The token context of one episode in one of the two modes."""

    fmt: ChatFormat
    mode: str = "window"
    history: int = 2
    history_obs_chars: int | None = 160
    max_prompt_tokens: int = 4000
    pin_first_turn: bool = False
    """window: always keep the first turn (the task page and the first action) after the system prompt; with an
    env that states the task only once (``obs_mode="terse"``) this keeps the task in every prompt, and it is a
    prefix that the KV cache reuses."""
    first: list[int] = field(default_factory=list)  # window + pin_first_turn: the pinned first turn's ids
    ids: list[int] = field(default_factory=list)  # concat: the running sequence
    turns: list[tuple[list[int], list[int]]] = field(default_factory=list)  # window: (past obs ids, action ids)
    current: list[int] = field(default_factory=list)  # window: current observation ids
    truncated: bool = False

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"context_mode={self.mode!r}; choose one of {MODES}")
        if self.history < 0:
            raise ConfigError(f"history must be >= 0, got {self.history}")

    def start(self, observation) -> None:
        self.turns, self.truncated, self.first = [], False, []
        self._obs = observation
        if self.mode == "concat":
            self.ids = self.fmt.system_ids + self.fmt.observation_ids(observation)
            self._head = min(len(self.ids), self.max_prompt_tokens // 2)
        else:
            self.current = self.fmt.observation_ids(observation)

    def prompt(self) -> list[int]:
        if self.mode == "concat":
            if len(self.ids) > self.max_prompt_tokens:
                # over budget: keep system + first observation (the task) + the most recent tokens (breaks the
                # prefix property for the rest of the episode, which `truncated` records). The cut point moves in
                # steps of half the remaining budget, so the truncated prompts of the next turns still extend each
                # other and a KV cache keeps reusing them
                self.truncated = True
                head = self._head
                room = self.max_prompt_tokens - head
                step = max(1, room // 2)
                drop = -(-(len(self.ids) - self.max_prompt_tokens) // step) * step
                return self.ids[:head] + self.ids[head + drop:]
            return list(self.ids)
        sys_ids = self.fmt.system_ids + self.first
        for start in range(max(0, len(self.turns) - self.history), len(self.turns) + 1):
            body: list[int] = []
            for obs_ids, act_ids in self.turns[start:]:
                body += obs_ids + act_ids + self.fmt.close_ids(act_ids)
            ids = sys_ids + body + self.current
            if len(ids) <= self.max_prompt_tokens:
                return ids
        self.truncated = True
        return self._cut(sys_ids + self.current)

    def _cut(self, ids: list[int]) -> list[int]:
        keep_head = len(self.fmt.system_ids) + (len(self.first) if self.mode == "window" else 0)
        return ids[:keep_head] + ids[len(ids) - (self.max_prompt_tokens - keep_head):]

    def step(self, action_ids: list[int], observation) -> None:
        """Record the action just taken and the observation that came back."""
        if self.mode == "concat":
            self.ids = self.ids + list(action_ids) + self.fmt.close_ids(action_ids) + \
                self.fmt.observation_ids(observation)
        elif self.pin_first_turn and not self.first:
            self.first = self.current + list(action_ids) + self.fmt.close_ids(action_ids)
            self.current = self.fmt.observation_ids(observation)
        else:
            past = history_text(str(self._obs), str(observation), self.history_obs_chars)
            self.turns.append((self.fmt.observation_ids(past), list(action_ids)))
            self.turns = self.turns[-max(self.history, 1):]
            self.current = self.fmt.observation_ids(observation)
        self._obs = observation


def history_text(past: str, current: str, max_chars: int | None) -> str:
    """A past observation as shown in the window: lines repeated in the current observation (the task line,
    unchanged buttons) are dropped, the rest is cut to `max_chars` characters (None = no cut)."""
    seen = set(current.splitlines())
    text = "\n".join(line for line in past.splitlines() if line not in seen)
    if max_chars is not None and len(text) > max_chars:
        text = text[:max_chars] + " ..."
    return text


def concat_layout(turns) -> tuple[list[int], list[bool], list[int]]:
    """One concat-mode episode as a single row: (ids, generated-token mask, turn index per token or -1).

    `turns` are `Turn`s (or dicts) with `prompt_ids` and `action_ids`. Raises `ValueError` when a turn's prompt
    does not extend the previous prompt + action (the strict prefix property), e.g. after context truncation.
    """
    ids: list[int] = []
    gen: list[bool] = []
    turn_of: list[int] = []
    for k, turn in enumerate(turns):
        p = turn["prompt_ids"] if isinstance(turn, dict) else turn.prompt_ids
        a = turn["action_ids"] if isinstance(turn, dict) else turn.action_ids
        p, a = list(p), list(a)
        if p[: len(ids)] != ids:
            raise ValueError(f"turn {k}: prompt does not extend the previous turns (prefix property broken)")
        extra = p[len(ids):]
        ids += extra + a
        gen += [False] * len(extra) + [True] * len(a)
        turn_of += [-1] * len(extra) + [k] * len(a)
    return ids, gen, turn_of
