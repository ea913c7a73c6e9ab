"""The simulated customer of the shopping env: a seeded, programmatic user (no language model).

It knows the task's hidden constraints (clarify_and_buy) and answers `ask[...]` questions from templates
(`data/shopping/templates.json`); the phrasing is drawn with the episode RNG, so the same reset seed gives the same
words. Rules:

* Every question costs one unit of patience. When patience reaches 0 the customer leaves: the episode ends with
  reward 0 and ``end_reason = "customer_left"`` (logged so that simulator-caused failures can be told apart, cf.
  tau2-bench#392).
* A question is *relevant* to a hidden slot when it mentions it: an option slot by a word of its dimension name
  ("color", "waist size") or a synonym, the attribute slot by words like "feature", "requirement" or "must",
  the price slot by words like "budget", "price", "spend". The best-scoring hidden slot not yet revealed is revealed
  (one per question); asking about an already revealed slot repeats the answer; anything else gets a polite
  non-answer. Generic questions ("anything else?") reveal nothing.
* ``answer[...]`` messages cost no patience; the customer acknowledges them.

Plug-in protocol (``ShoppingEnv(customer=...)``): a class or callable ``(task, rng) -> obj`` where ``obj`` has
``ask(question) -> str``, ``hear(message) -> str``, ``said() -> list[str]`` (kept in the observation) and the
attributes ``patience`` (int), ``left`` (bool: the customer quit), ``questions`` (int) and ``revealed`` (sized).
"""

from __future__ import annotations

import re

from shopsim.envs.shopping.tasks import Task, templates

_WORD = re.compile(r"[a-z0-9]+")
SYNONYMS = {
    "color": {"color", "colour", "colors", "colours"}, "size": {"size", "sizes", "fit"},
    "flavor": {"flavor", "flavour", "flavors", "taste"}, "scent": {"scent", "smell", "fragrance"},
    "pack": {"pack", "packs", "count", "quantity"}, "count": {"count", "quantity", "many"},
    "capacity": {"capacity", "volume"}, "weight": {"weight", "heavy"}, "shade": {"shade", "shades"},
}
ATTRIBUTE_WORDS = {"feature", "features", "requirement", "requirements", "must", "attribute", "attributes",
                   "specific", "important", "property", "properties", "need", "needs"}
PRICE_WORDS = {"budget", "price", "spend", "cost", "afford", "expensive", "cheap", "money", "dollars", "much"}


def _words(text: str) -> set[str]:
    return set(_WORD.findall(text.lower()))


class Customer:
    """Per-episode customer state: patience, revealed slots and what was said."""

    def __init__(self, task: Task, rng):
        self.task, self.rng = task, rng
        self.patience = task.patience
        self.revealed: dict[tuple[str, str], str] = {}
        self.left = False
        self.questions = 0

    def _pick(self, key: str) -> str:
        options = templates()[key]
        return options[int(self.rng.integers(len(options)))]

    def _slot_score(self, slot: tuple[str, str], words: set[str], qlow: str) -> int:
        kind, name = slot
        if kind == "option":
            score = 0
            for w in name.split():
                syn = SYNONYMS.get(w, {w})
                score += 2 * len(words & (syn | {w}))
            return score
        if kind == "attribute":
            return len(words & ATTRIBUTE_WORDS) + 3 * int(name.lower() in qlow)
        return len(words & PRICE_WORDS)

    def _sentence(self, slot: tuple[str, str]) -> str:
        goal = self.task.goals[0]
        kind, name = slot
        if kind == "option":
            value = dict(goal.options)[name]
            return self._pick("reveal_option").format(dim=name, Dim=name[:1].upper() + name[1:], value=value)
        if kind == "attribute":
            return self._pick("reveal_attribute").format(value=name)
        return self._pick("reveal_price").format(price=f"{goal.price_ceiling:.2f}")

    def ask(self, question: str) -> str:
        """The customer's reply to a question (and the patience bookkeeping)."""
        self.questions += 1
        self.patience -= 1
        words = _words(question)
        reply = None
        if self.task.hidden:
            qlow = question.lower()
            scored = [(self._slot_score(s, words, qlow), i, s) for i, s in enumerate(self.task.hidden)]
            fresh = [x for x in scored if x[0] > 0 and x[2] not in self.revealed]
            old = [x for x in scored if x[0] > 0 and x[2] in self.revealed]
            if fresh:
                slot = max(fresh, key=lambda x: (x[0], -x[1]))[2]
                self.revealed[slot] = reply = self._sentence(slot)
            elif old:
                slot = max(old, key=lambda x: (x[0], -x[1]))[2]
                reply = self._pick("repeat").format(said=self.revealed[slot])
            else:
                reply = self._pick("irrelevant")
        elif self.task.family == "after_sales":
            reply = f"As I said: {self.task.instruction.split('. ', 1)[-1]}"
        else:
            reply = self._pick("nothing_more")
        if self.patience <= 0:
            self.left = True
            reply = f"{reply} {self._pick('leave')}"
        return reply

    def hear(self, message: str) -> str:
        """The customer's reply to a user-visible message."""
        if self.task.family == "after_sales":
            return self._pick("after_sales_followup")
        return self._pick("ack")

    def said(self) -> list[str]:
        """What the customer revealed so far, in task order (kept in the observation)."""
        return [self.revealed[s] for s in self.task.hidden if s in self.revealed]
