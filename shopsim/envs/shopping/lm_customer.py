"""An optional simulated customer whose answers are written by a local causal language model
(``ShoppingEnv(customer="lm", customer_model=PATH)``).

ShopSimulator (ACL 2026) and tau2-bench drive the user with an LLM. Here the programmatic `customer.Customer` still
decides *what* is revealed (which hidden slot a question is about, patience, repeats, leaving); the language model
only words the reveal. For a question that reveals slot s, the model is prompted with the product type, the
question and the value of s alone (it never sees the other hidden slots) and decodes greedily, so a reset seed
gives the same episode. The reply is then checked (`check_reply`):

* it must state the asked value (an option value, the must-have feature, or the budget as a number);
* it must not state the value of another hidden slot the customer has not revealed yet (a leak);
* it must be non-empty printable ASCII of at most `MAX_REPLY_CHARS` characters.

A reply that fails a check, or a generation that raises, is replaced by the scripted sentence for that slot, and
``info["customer_fallbacks"]`` (per episode) counts it, next to ``info["customer_lm_replies"]`` (replies the
model wrote and that were used). Everything else (non-answers, repeats, acknowledgements) stays scripted.

What a useful customer model needs: it must follow a short instruction and copy a value into a one-sentence answer
(an instruction-tuned or chat model of about 0.5B parameters or more does this reliably; a tiny or untrained model
falls back on nearly every turn, which is correct but measures nothing); a tokenizer saved next to the weights
(``AutoTokenizer.from_pretrained(PATH)``); and it must be local (``local_files_only``: nothing is downloaded).
Greedy decoding of up to `MAX_NEW_TOKENS` tokens on CPU costs one model call per revealing question.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from pathlib import Path

from shopsim.envs.shopping.customer import Customer
from shopsim.errors import ConfigError

MAX_NEW_TOKENS = 40
MAX_REPLY_CHARS = 300
PROMPT = ("You are a customer talking to a shopping assistant. You want to buy a {product}. The assistant asks: "
          "\"{question}\"\nAnswer in one short sentence. Say that you want {fact}. Do not mention anything else."
          "\nCustomer:")

_MODELS: dict[str, HFGenerator] = {}
_LOCK = threading.Lock()


def _mentions(text: str, value: str) -> bool:
    return re.search(r"(?<![a-z0-9])" + re.escape(value.lower()) + r"(?![a-z0-9])", text.lower()) is not None


def _price_forms(ceiling: float) -> list[str]:
    return [f"{ceiling:.2f}", f"{ceiling:.0f}" if ceiling == int(ceiling) else f"{ceiling:.2f}"]


def slot_value(task, slot: tuple[str, str]) -> list[str]:
    """The words that state `slot` of `task` (any one of them states it)."""
    goal = task.goals[0]
    kind, name = slot
    if kind == "option":
        return [dict(goal.options)[name]]
    if kind == "attribute":
        return [name]
    return _price_forms(float(goal.price_ceiling))


def check_reply(reply: str, task, slot: tuple[str, str], revealed) -> str | None:
    """Why `reply` cannot be used as the answer revealing `slot` (None: it can); see the module docstring."""
    if not reply or not reply.strip():
        return "empty"
    if len(reply) > MAX_REPLY_CHARS or not (reply.isascii() and reply.isprintable()):
        return "not one short printable line"
    if not any(_mentions(reply, v) for v in slot_value(task, slot)):
        return "does not state the asked value"
    for other in task.hidden:
        if other == slot or other in revealed:
            continue
        if any(_mentions(reply, v) for v in slot_value(task, other)):
            return f"leaks {other[0]} {other[1]}".strip()
    return None


class HFGenerator:
    """Greedy generation with a local causal LM: ``generate(prompt) -> first line of the continuation``.

    Pickles as its path (a copy in another process loads the checkpoint again)."""

    def __init__(self, path: str, tok, model):
        self.path, self.tok, self.model = path, tok, model
        self.pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id

    def __call__(self, prompt: str) -> str:
        import torch

        ids = self.tok(prompt, return_tensors="pt")
        with torch.no_grad():
            out = self.model.generate(**ids, max_new_tokens=MAX_NEW_TOKENS, do_sample=False, pad_token_id=self.pad)
        text = self.tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
        return text.strip().split("\n")[0].strip()

    def __reduce__(self):
        return (hf_generator, (self.path,))


def hf_generator(path: str | Path) -> HFGenerator:
    """The greedy generator over the local causal LM at `path` (loaded once per process and path)."""
    key = str(Path(path).resolve())
    with _LOCK:
        if key in _MODELS:
            return _MODELS[key]
        if not Path(key).is_dir():
            raise ConfigError(f"customer_model={str(path)!r} is not a folder; give a local checkpoint saved with "
                              "save_pretrained (weights, config and tokenizer)")
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        try:
            tok = AutoTokenizer.from_pretrained(key, local_files_only=True)
            model = AutoModelForCausalLM.from_pretrained(key, local_files_only=True, dtype=torch.float32).eval()
        except (OSError, ValueError) as exc:
            raise ConfigError(f"customer_model={str(path)!r}: cannot load a causal LM and its tokenizer ({exc})") \
                from exc
        _MODELS[key] = gen = HFGenerator(key, tok, model)
        return gen


class LMCustomer(Customer):
    """`Customer` whose reveal sentences come from `generate(prompt) -> str`, checked, with a scripted fallback."""

    def __init__(self, task, rng, generate: Callable[[str], str]):
        super().__init__(task, rng)
        self.generate = generate
        self.fallbacks = 0
        self.lm_replies = 0
        self.fallback_reasons: list[str] = []
        self._question = ""

    def ask(self, question: str) -> str:
        self._question = question
        return super().ask(question)

    def _sentence(self, slot: tuple[str, str]) -> str:
        kind, name = slot
        value = slot_value(self.task, slot)[0]
        fact = {"option": f"{name} {value}", "attribute": f"it to be {value}",
                "price": f"to spend at most {value} dollars"}[kind]
        prompt = PROMPT.format(product=self.task.goals[0].product_type, question=self._question[:200], fact=fact)
        try:
            reply = self.generate(prompt)
            why = check_reply(reply, self.task, slot, self.revealed)
        except Exception as exc:  # noqa: BLE001 - any model failure falls back to the scripted answer
            reply, why = "", f"generation failed: {type(exc).__name__}"
        if why is None:
            self.lm_replies += 1
            return reply
        self.fallbacks += 1
        self.fallback_reasons.append(why)
        return super()._sentence(slot)
