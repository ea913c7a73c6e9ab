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


#: order ids (``W`` + 7 digits) and product ids (``B0`` + 8 characters) as the env writes them
_ID = re.compile(r"\b(?:W[1-9]\d{6}|B0[0-9A-Z]{8})\b")
_ID_CHARS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _fresh_id(old: str, rng: np.random.Generator) -> str:
    if old.startswith("W"):
        return "W" + str(int(rng.integers(1_000_000, 10_000_000)))
    return "B0" + "".join(_ID_CHARS[i] for i in rng.integers(0, len(_ID_CHARS), size=8))


def copy_augment(trajectories, copies: int = 1, *, seed: int = 0, template_df: float = 0.15,
                 only_success: bool = True, resample_ids: bool = False) -> list:
    """`copies` rewritten copies of every (successful) trajectory, see the module docstring. Deterministic in
    `seed`. Observations and actions are rewritten as text; token records (``prompt_ids`` etc.) are dropped.

    With `resample_ids`, order and product ids are also replaced, consistently within the episode, by fresh random
    ids of the same form. An id is a string of single-character tokens that no prior predicts, so the after-sales
    tools (``get_order[W...]``, ``exchange_item[...]``) can only be learnt by copying digit by digit; fresh ids give
    each copy of an episode new strings to copy."""
    if copies <= 0:
        return []
    trajs = [t for t in trajectories if t.success or not only_success]
    keep = protected_words(trajs, template_df)
    pool = sorted({w.lower() for t in trajs for w in _WORD.findall(_task_line(t))} - keep)
    if len(pool) < 2 and not resample_ids:
        return []
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(copies):
        for traj in trajs:
            words = sorted({w.lower() for w in _WORD.findall(_task_line(traj))} - keep)
            # replacements never collide with a word already in the episode (the rewrite stays unambiguous)
            seen = {w.lower() for turn in traj.turns for text in (turn.observation, turn.action)
                    for w in _WORD.findall(str(text))}
            free = [w for w in pool if w not in seen]
            if words and len(free) >= len(words):
                picks = rng.choice(len(free), size=len(words), replace=False)
                new = _rewrite(traj, dict(zip(words, (free[i] for i in picks), strict=False)))
            elif resample_ids:  # nothing to rewrite but the ids
                new = _rewrite(traj, {})
            else:
                continue
            if resample_ids:
                new = _resample_ids(new, rng)
            out.append(new)
    return out


def _resample_ids(traj, rng: np.random.Generator):
    ids = sorted({m for turn in traj.turns for text in (turn.observation, turn.action)
                  for m in _ID.findall(str(text))})
    if not ids:
        return traj
    mapping: dict[str, str] = {}
    taken = set(ids)
    for old in ids:
        fresh = _fresh_id(old, rng)
        while fresh in taken:
            fresh = _fresh_id(old, rng)
        taken.add(fresh)
        mapping[old] = fresh

    def sub(text):
        return _ID.sub(lambda m: mapping[m.group(0)], text) if isinstance(text, str) else text

    return replace(traj, turns=[replace(t, observation=sub(t.observation), action=sub(t.action))
                                for t in traj.turns])


def _case_like(src: str, word: str) -> str:
    if src.isupper() and len(src) > 1:
        return word.upper()
    if src[:1].isupper():
        return word[:1].upper() + word[1:]
    return word


def _rewrite(traj, mapping: dict[str, str]):
    if not mapping:
        return replace(traj, turns=[replace(t, prompt_ids=None, action_ids=None, action_logprobs=None)
                                    for t in traj.turns])
    pattern = re.compile(r"\b(" + "|".join(re.escape(w) for w in sorted(mapping, key=len, reverse=True)) + r")\b",
                         re.IGNORECASE)

    def sub(text):
        if not isinstance(text, str):
            return text
        return pattern.sub(lambda m: _case_like(m.group(0), mapping[m.group(0).lower()]), text)

    turns = [replace(t, observation=sub(t.observation), action=sub(t.action), prompt_ids=None, action_ids=None,
                     action_logprobs=None) for t in traj.turns]
    return replace(traj, turns=turns)
