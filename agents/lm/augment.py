"""Prior-breaking copy augmentation for supervised warm starts of small language agents.

Why: in expert shopping episodes almost every argument the agent writes is a copy from its context (query words and
option values from the task line, ``#k`` from the results page). A from-scratch model of a million parameters first
learns the *prior* over those strings instead ("storage" is followed by "64gb" or "128gb") and only slowly grows the
attention circuit that copies ("induction heads", Olsson et al. 2022), so it writes plausible but wrong values: after
15 CPU-minutes of plain SFT it buys the right product in a few percent of episodes.

What: `copy_augment` adds copies of expert episodes in which the task's content words are replaced, consistently in
every observation and action of the episode, by other content words drawn at random from the task lines of the
whole dataset (a counterfactual-substitution augmentation, as used for delexicalised dialogue data). In a copy the
replaced strings cannot be predicted from the prior, only copied, so the copying circuit gets all the gradient;
because the replacement is consistent, every action of the copy is still the right one in the rewritten episode.

Protected from replacement (``protected_words``): words of the action grammar and the page's buttons (``buy``,
``now``, ``next``...) and template words that occur in more than `template_df` of the task lines (``find``, ``with``,
``price``...); numbers are never replaced (price comparisons must stay true).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import replace

import numpy as np

_WORD = re.compile(r"[A-Za-z][a-z]+")
#: action verbs of the text grammar and UI words an action may have to spell out
GRAMMAR_WORDS = frozenset(
    "search click back next prev page buy now add to cart description checkout ask answer finish view list orders "
    "get order cancel return item exchange remove from task results of product price rating reviews features "
    "buttons feedback chose chosen".split())


def _task_line(traj) -> str:
    obs = str(traj.turns[0].observation) if traj.turns else ""
    line = obs.split("\n", 1)[0]
    return line.split(":", 1)[1] if line.lower().startswith("task:") else line


def protected_words(trajectories, template_df: float = 0.15) -> set[str]:
    """Words never replaced: grammar/UI words, words inside ``[...]`` buttons, frequent task-template words."""
    df: Counter = Counter()
    buttons: set[str] = set()
    n = 0
    for traj in trajectories:
        n += 1
        df.update({w.lower() for w in _WORD.findall(_task_line(traj))})
        for turn in traj.turns:
            for line in str(turn.observation).splitlines():
                if line.startswith("Buttons:"):
                    buttons.update(w.lower() for w in _WORD.findall(line))
    frequent = {w for w, c in df.items() if c > template_df * max(n, 1)}
    return set(GRAMMAR_WORDS) | buttons | frequent


def copy_augment(trajectories, copies: int = 1, *, seed: int = 0, template_df: float = 0.15,
                 only_success: bool = True) -> list:
    """`copies` rewritten copies of every (successful) trajectory, see the module docstring. Deterministic in
    `seed`. Observations and actions are rewritten as text; token records (``prompt_ids`` etc.) are dropped."""
    if copies <= 0:
        return []
    trajs = [t for t in trajectories if t.success or not only_success]
    keep = protected_words(trajs, template_df)
    pool = sorted({w.lower() for t in trajs for w in _WORD.findall(_task_line(t))} - keep)
    if len(pool) < 2:
        return []
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(copies):
        for traj in trajs:
            words = sorted({w.lower() for w in _WORD.findall(_task_line(traj))} - keep)
            if not words:
                continue
            # replacements never collide with a word already in the episode (the rewrite stays unambiguous)
            seen = {w.lower() for turn in traj.turns for text in (turn.observation, turn.action)
                    for w in _WORD.findall(str(text))}
            free = [w for w in pool if w not in seen]
            if len(free) < len(words):
                continue
            picks = rng.choice(len(free), size=len(words), replace=False)
            mapping = dict(zip(words, (free[i] for i in picks), strict=False))
            out.append(_rewrite(traj, mapping))
    return out


def _case_like(src: str, word: str) -> str:
    if src.isupper() and len(src) > 1:
        return word.upper()
    if src[:1].isupper():
        return word[:1].upper() + word[1:]
    return word


def _rewrite(traj, mapping: dict[str, str]):
    pattern = re.compile(r"\b(" + "|".join(re.escape(w) for w in sorted(mapping, key=len, reverse=True)) + r")\b",
                         re.IGNORECASE)

    def sub(text):
        if not isinstance(text, str):
            return text
        return pattern.sub(lambda m: _case_like(m.group(0), mapping[m.group(0).lower()]), text)

    turns = [replace(t, observation=sub(t.observation), action=sub(t.action), prompt_ids=None, action_ids=None,
                     action_logprobs=None) for t in traj.turns]
    return replace(traj, turns=turns)
