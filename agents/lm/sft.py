"""Supervised warm start of the LM agent on scripted-expert trajectories (behaviour cloning).

Each expert turn becomes a training example built with exactly the prompt builder the agent uses at run time
(`agents.lm.prompts.EpisodeContext`), so training and acting see the same token layout:

* window mode: one row per turn, ``prompt_ids + action_ids``;
* concat mode: one row per episode (`concat_layout`), all actions of the episode in one sequence.

The expert's action text is tokenised once and followed by the stop token (so the model learns to stop); the loss
is the cross-entropy of the agent tokens only (prompt and observation tokens are masked out), averaged over the
agent tokens of the batch (token-mean). An optional auxiliary language-modelling loss on the observation tokens
(``obs_loss_weight``, default 0) exists because a from-scratch model learns to copy SKUs and query words from the
page only slowly when ~3% of the tokens carry a target; it is off unless asked for and logged apart
(``loss`` is always the agent-token loss, ``total_loss`` includes the auxiliary term). Held-out evaluation runs
the agent greedily on the dev split with the rollout runner. Checkpoints are ``save_pretrained`` folders (safetensors)
with the shopsim manifest (`agents.load_checkpoint` reads them). `train_sft` also writes ``metrics.csv`` and
``sft_curve.png``.

What a from-scratch model needs (the `shopsim sft` defaults). Nearly every argument the agent writes is a copy from
its context, and a million-parameter model trained on plain expert data learns the prior over those strings long
before it learns to copy (after 15 CPU-minutes it writes well-formed but wrong queries and option values: 0-3%
find_and_buy success). Four changes, each measured (docs/agents.md, "Language-model agent"):

1. copy-light data: the expert opens results by position (``click[#1]``, env ``numbered_results``, 5 results per
   page) instead of by a 10-character SKU, and searches the task line itself (``query="instruction"``), price
   clause included (``expert_price_clause``: the env's search then filters by price);
2. ``arg_space``: the expert writes ``click[ medium]``, so the argument's first word is the same BPE token
   (``Ġmedium``) as in the task line it is copied from;
3. a short-to-long curriculum (`SFTConfig.curriculum_steps`): the first steps train on the shortest rows only, the
   first turns, where the action is a copy of the task line; the copying circuit forms there (dev exact-match of the
   query, teacher-forced: 0% after 500 steps, 83% after 1,000) and carries over to the option values;
4. prior-breaking copy augmentation (`SFTConfig.augment_copies`, `agents.lm.augment`).

`SFTConfig.env_kwargs` records the env options in the checkpoint manifest (and ``agent.env_kwargs``), so that
`shopsim eval --checkpoint`, RL trainers started from the checkpoint and the leaderboard use the same rendering.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from agents.lm.prompts import ChatFormat, EpisodeContext, concat_layout
from shopsim.configs import bounded, validate
from shopsim.datasets import write_metrics_csv
from shopsim.errors import ConfigError
from shopsim.trajectory import success_by_family


@dataclass
class SFTConfig:
    """Options of `train_sft` and of its expert data (`sft_expert_data`). The defaults are the recipe the module
    docstring describes (the `shopsim sft` defaults, which are built from these fields): copy-friendly expert data,
    concat context, a short-to-long curriculum and copy augmentation. Plain behaviour cloning on the expert's
    default actions is ``numbered_results=False, results_per_page=None, expert_query="full", arg_space=False,
    expert_price_clause=False, curriculum_steps=0, augment_copies=0, order_refs="id", task_reminder=False``."""

    # optimisation
    steps: int = bounded(2900, min=1)
    """Optimizer steps, curriculum included."""
    batch_size: int = bounded(16, min=1)
    """Rows per step (turns in window mode, episodes in concat mode)."""
    lr: float = bounded(2e-3, gt=0)
    """Peak AdamW learning rate (a from-scratch few-million-parameter model tolerates a high one)."""
    warmup: int = bounded(50, min=1)
    """Linear warm-up steps, then cosine decay to 10% of `lr` (the curriculum and the main phase each warm up)."""
    weight_decay: float = bounded(0.01, min=0)
    """AdamW weight decay."""
    grad_clip: float = bounded(1.0, gt=0)
    """Gradient-norm clip per step."""
    seed: int = 0
    """Seed of the model initialisation, the batch order, the augmentation and the expert episodes."""
    autocast: Literal["off", "bf16"] = "off"
    """Mixed precision of the training forward and backward: bf16 runs them under ``torch.autocast`` in bfloat16
    (the weights, the gradients, the optimizer state and the loss stay float32; evaluation runs in float32). On a
    CPU with bfloat16 matrix units (AMX, AVX512-BF16) the ``small`` size then trains several times faster
    (`benchmarks.bench_sft_autocast`); off: float32 throughout, the shipped `mini` recipe."""
    # what the agent sees
    context_mode: Literal["window", "concat"] = "concat"
    """concat: the whole episode in one growing context, each token encoded once with the KV cache; window: a
    fresh prompt per turn with the last `history` turns (docs/design.md). The trained agent acts in this mode."""
    history: int = bounded(1, min=0)
    """Window mode: past turns in the prompt."""
    history_obs_chars: int | None = bounded(100, min=0)
    """Window mode: characters kept of each past observation (None: all)."""
    pin_first_turn: bool | None = None
    """Window mode: keep the first turn (task page + first action) in every prompt (`EpisodeContext`); needed
    with ``obs_mode="terse"``, which states the task only in the first observation. None: on exactly in window mode
    with ``obs_mode="terse"``."""
    obs_mode: Literal["compact", "terse", "full"] = "terse"
    """Env ``obs_mode`` the agent is trained and evaluated on; terse states the task once per episode."""
    task_reminder: bool = True
    """Env ``task_reminder`` (terse mode): the task line again in the observation after each cart change. A bundle's
    later items are otherwise copied from a task line a thousand or more tokens back, which the small model gets
    wrong (a clause of another item, a miscounted item number)."""
    max_new_tokens: int = bounded(48, min=1)
    """Per-turn generation limit of the trained agent."""
    # model
    arch: Literal["llama", "gpt2"] = "llama"
    """Model architecture of a fresh model (`agents.lm.model.build_model`)."""
    size: Literal["tiny", "mini", "small", "medium"] = "mini"
    """Model size of a fresh model (mini: the default 1.4M-parameter model)."""
    # loss and data
    obs_loss_weight: float = bounded(0.0, min=0)
    """Weight of the auxiliary language-modelling loss on prompt/observation tokens (0 = agent tokens only)."""
    only_success: bool = True
    """Train on successful expert episodes only."""
    curriculum_steps: int = bounded(2000, min=0)
    """Short-to-long curriculum: the first this many steps (part of `steps`) draw only from the shortest
    `curriculum_share` of the rows (concat mode: every episode cut after its first action), in batches of the
    same token budget as the others. In the shopping env those are the first turns, whose action is a copy of the
    task line, so a from-scratch model learns to copy on short rows before it meets the long ones, and reuses that
    for option values (docs/agents.md). 0: off."""
    curriculum_share: float = bounded(0.25, gt=0, max=1)
    """Share of the rows (the shortest) the window-mode curriculum draws from."""
    augment_copies: int = bounded(1, min=0)
    """Prior-breaking copy augmentation (`agents.lm.augment.copy_augment`): this many rewritten copies of every
    expert episode are added to the training rows (0: off)."""
    augment_ids: bool = False
    """The augmented copies also get fresh order and product ids (consistent within an episode), so the after-sales
    tools' id arguments are learnt as copies (`copy_augment(resample_ids=True)`)."""
    # expert data (`sft_expert_data`)
    numbered_results: bool = True
    """Env ``numbered_results`` and the expert opens results by position (``click[#3]``) instead of by SKU."""
    results_per_page: int | None = bounded(5, min=1)
    """Env ``results_per_page`` (None: the env's default)."""
    expert_query: Literal["full", "span", "instruction"] = "instruction"
    """The expert's search: full = attributes, option values, type; span = '<attributes> <type>'; instruction =
    the task line up to its price clause."""
    expert_price_clause: bool = True
    """The expert's search ends with the price clause ``, and price lower than X dollars`` (the task line's own, the
    budget the customer named, or a bundle's whole budget), which the env's search turns into a price filter: the
    first result then fits the budget in most episodes, instead of one the model must find by comparing prices."""
    order_refs: Literal["id", "position", "title"] = "title"
    """Env ``order_refs`` and the expert's after-sales references: position names orders, order items and the
    replacement product as ``#k`` (and the expert's answers name none of them), id copies order ids and SKUs;
    title is the position rendering with the expert opening the order by the item's title and naming the item by
    it, both copied from the customer's request (a copy instead of matching the request against the order list)."""
    arg_space: bool = True
    """The expert writes ``click[ x]`` / ``search[ q]``: the same action, but the argument's first word tokenizes
    as in the task line it is copied from."""
    expert_noise: float = bounded(0.0, min=0, lt=1)
    """Share of the expert's result and option clicks replaced by a wrong or garbled click, which the expert then
    recovers from (DART noise injection; the wrong clicks are not trained on). 0: off."""
    families: tuple[str, ...] = ("find_and_buy",)
    """Task families of the expert episodes and of the dev evaluation (the first dev tasks of these families,
    `baselines.core.tasks.eval_tasks`, the same lists the RL trainers use); empty: all, `reset_options` decide."""
    env_kwargs: dict = field(default_factory=dict)
    """Further env constructor options, over those of `obs_mode`, `numbered_results` and `results_per_page`
    (`env_options` merges them). The merged options are recorded in the checkpoint manifest so that
    `shopsim eval --checkpoint` evaluates on the same env."""
    # evaluation
    eval_every: int = bounded(1000, min=0)
    """Evaluate on the dev split every this many steps (0: only at the end)."""
    eval_episodes: int = bounded(50, min=1)
    """Dev episodes per evaluation."""
    eval_split: Literal["dev", "test", "train"] = "dev"
    """Split of the evaluation episodes."""
    num_envs: int = bounded(16, min=1)
    """Env copies stepped together when collecting expert data and evaluating."""
    reset_options: dict = field(default_factory=dict)
    """Options for the evaluation resets (e.g. {"family": "find_and_buy"})."""

    def __post_init__(self) -> None:
        if isinstance(self.families, str):  # "a,b" from a command line or a JSON config
            self.families = tuple(f for f in self.families.split(",") if f)
        validate(self)

    @property
    def pins_first_turn(self) -> bool:
        """`pin_first_turn`, resolved (None: window mode with the terse observation)."""
        if self.pin_first_turn is None:
            return self.context_mode == "window" and self.obs_mode == "terse"
        return self.pin_first_turn

    def env_options(self) -> dict:
        """Env constructor options of the expert data, the evaluations and the checkpoint manifest."""
        return {**({"numbered_results": True} if self.numbered_results else {}),
                **({"obs_mode": self.obs_mode} if self.obs_mode != "compact" else {}),
                **({"results_per_page": self.results_per_page} if self.results_per_page else {}),
                **({"order_refs": "position"} if self.order_refs != "id" else {}),
                **({"task_reminder": True} if self.task_reminder and self.obs_mode == "terse" else {}),
                **self.env_kwargs}

    def expert_options(self) -> dict:
        """Options of the scripted expert (`agents.shopping_expert`) that writes the SFT data."""
        return {**({"click_by": "index"} if self.numbered_results else {}), "query": self.expert_query,
                **({"arg_space": True} if self.arg_space else {}),
                **({"price_clause": True} if self.expert_price_clause else {}),
                **({"order_refs": self.order_refs} if self.order_refs != "id" else {}),
                **({"noise": self.expert_noise} if self.expert_noise else {})}


def expert_trajectories(env_id: str, episodes: int, *, seed: int = 0, split: str = "train", reset_options=None,
                        num_envs: int = 16, progress: bool = True, env_kwargs=None, expert_kwargs=None,
                        families=()):
    """Scripted-expert episodes on `split` (seeds `seed .. seed+episodes-1`); `expert_kwargs` go to the expert
    (e.g. ``{"click_by": "index", "query": "span"}``), `env_kwargs` to the env. With `families`, the episodes are
    shared evenly between those task families (``reset_options["family"]``), each on its own seeds."""
    import agents
    from shopsim.rollout import collect

    if families:
        out = []
        for k, fam in enumerate(families):
            n = episodes // len(families) + (k < episodes % len(families))
            out += expert_trajectories(env_id, n, seed=seed + k * episodes, split=split,
                                       reset_options={**(reset_options or {}), "family": fam}, num_envs=num_envs,
                                       progress=progress, env_kwargs=env_kwargs, expert_kwargs=expert_kwargs)
        return out
    expert = agents.make("expert", env_id, **(expert_kwargs or {}))
    return collect(env_id, expert, episodes=episodes, seed=seed, split=split, reset_options=reset_options,
                   num_envs=num_envs, progress=progress, env_kwargs=env_kwargs or None)


def sft_expert_data(env_id: str, episodes: int, config: SFTConfig | None = None, *, progress: bool = True):
    """The expert episodes `config` trains on: `episodes` scripted-expert episodes on the train split, shared
    between `config.families`, on the env of `config.env_options()` with the expert of `config.expert_options()`
    (what `shopsim sft --expert-episodes N` collects)."""
    config = config or SFTConfig()
    return expert_trajectories(env_id, episodes, seed=config.seed, families=config.families,
                               num_envs=config.num_envs, progress=progress, env_kwargs=config.env_options(),
                               expert_kwargs=config.expert_options())


def encode_turns(traj, ctx: EpisodeContext, fmt: ChatFormat, stop: int) -> list[dict]:
    """An episode's recorded text re-encoded turn by turn: ``{"prompt_ids", "action_ids"}`` per turn, the prompt
    from `ctx` (a fresh `EpisodeContext`), the action's ids followed by the `stop` token."""
    turns: list[dict] = []
    for k, turn in enumerate(traj.turns):
        if k == 0:
            ctx.start(turn.observation)
        else:
            ctx.step(turns[-1]["action_ids"], turn.observation)
        turns.append({"prompt_ids": ctx.prompt(), "action_ids": fmt.encode(str(turn.action)) + [stop]})
    return turns


def build_examples(trajectories, fmt: ChatFormat, *, mode: str = "window", history: int = 2,
                   history_obs_chars: int | None = 160, max_tokens: int = 4096, only_success: bool = True,
                   pin_first_turn: bool = False):
    """(ids, loss_mask) rows from trajectories; the mask is True on the agent's tokens (actions + stop token),
    except on the actions of turns flagged ``extra["perturbed"]`` (the expert's injected mistakes, see
    `agents.shopping_expert.ShoppingExpert`'s `noise`): they stay in the context but are not learnt."""
    stop = min(fmt.stop_ids) if fmt.tokenizer.eos_token_id is None else fmt.tokenizer.eos_token_id
    rows: list[tuple[list[int], list[bool]]] = []
    for traj in trajectories:
        if only_success and not traj.success:
            continue
        # concat rows are cut to max_tokens below; cutting each prompt instead would break the prefix property
        ctx = EpisodeContext(fmt, mode=mode, history=history, history_obs_chars=history_obs_chars,
                             max_prompt_tokens=max_tokens if mode == "window" else 1 << 30,
                             pin_first_turn=pin_first_turn)
        turns = encode_turns(traj, ctx, fmt, stop)
        learnt = [not (turn.extra or {}).get("perturbed") for turn in traj.turns]
        if mode == "window":
            rows += [(t["prompt_ids"] + t["action_ids"], [False] * len(t["prompt_ids"]) + [ok] * len(t["action_ids"]))
                     for t, ok in zip(turns, learnt, strict=True) if ok]
        else:
            ids, gen, turn_of = concat_layout(turns)
            gen = [g and learnt[k] for g, k in zip(gen, turn_of, strict=True)]
            rows.append((ids[:max_tokens], gen[:max_tokens]))
    return rows


def first_turn(row: tuple[list[int], list[bool]]) -> tuple[list[int], list[bool]]:
    """A concat-mode example cut after its first action (the first run of agent tokens)."""
    ids, mask = row
    start = mask.index(True) if True in mask else len(mask)
    end = start
    while end < len(mask) and mask[end]:
        end += 1
    return ids[:end], mask[:end]


def _batches(rows, batch_size: int, rng: np.random.Generator):
    """Endless shuffled batches; rows of similar length share a batch (less padding)."""
    while True:
        order = rng.permutation(len(rows))
        chunk = batch_size * 16
        for c in range(0, len(order), chunk):
            part = sorted(order[c: c + chunk], key=lambda i: len(rows[i][0]))
            groups = [part[j: j + batch_size] for j in range(0, len(part), batch_size)]
            for g in rng.permutation(len(groups)):
                yield [rows[i] for i in groups[g]]


def sft_loss(model, batch, pad_id: int, obs_loss_weight: float = 0.0,
             padding_mask: bool = False) -> tuple[torch.Tensor, int, float]:
    """Token-mean cross-entropy over the agent tokens of a right-padded batch: ``(loss, n_agent_tokens,
    agent_loss)`` (``agent_loss`` excludes the auxiliary term, for logging).

    The rows are right-padded and run without a padding mask (positions ``0..S-1``), as the RL trainers' updates
    do (`baselines.core.trainer.body_inputs`); the losses equal the masked forward's (`padding_mask=True`) up to
    float error, since only real tokens' outputs are read.

    With ``obs_loss_weight > 0`` an auxiliary token-mean cross-entropy over the other (prompt/observation) tokens
    is added with that weight: plain language modelling of the pages, which teaches a small model to copy strings
    (SKUs, option values, query words) much sooner than the few agent tokens alone do.
    """
    from agents.lm.generation import positions

    width = max(len(ids) for ids, _ in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    att = torch.zeros_like(ids)
    lm = torch.zeros((len(batch), width), dtype=torch.bool)
    for i, (row, mask) in enumerate(batch):
        ids[i, : len(row)] = torch.tensor(row)
        att[i, : len(row)] = 1
        lm[i, : len(mask)] = torch.tensor(mask)
    # run the body once, then the (vocabulary-sized) output layer only where there is a target: the agent
    # tokens are a few percent of the sequence, so this skips most of the output layer's cost
    if padding_mask:
        body = model.base_model(input_ids=ids, attention_mask=att, position_ids=positions(att), use_cache=False)
    else:
        # right-padded rows: causal attention never lets a real token see the padding after it, so no mask is
        # needed and SDPA runs its causal kernel instead of dense attention under a [B, 1, S, S] mask
        body = model.base_model(input_ids=ids, position_ids=torch.arange(width).expand(len(batch), width),
                                use_cache=False)
    hidden = body.last_hidden_state[:, :-1]
    target, tmask = ids[:, 1:], lm[:, 1:]
    head = model.get_output_embeddings()
    agent_loss = torch.nn.functional.cross_entropy(head(hidden[tmask]).float(), target[tmask])
    loss = agent_loss
    if obs_loss_weight > 0:
        omask = att[:, 1:].bool() & ~tmask
        loss = loss + obs_loss_weight * torch.nn.functional.cross_entropy(head(hidden[omask]).float(), target[omask])
    return loss, int(tmask.sum()), agent_loss.item()


@torch.no_grad()
def heldout_loss(model, rows, pad_id: int, batch_size: int = 16) -> float:
    """Token-mean agent-token cross-entropy of `rows` (teacher forcing), e.g. on dev-split expert episodes."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(rows), batch_size):
        _, n, loss = sft_loss(model, rows[i: i + batch_size], pad_id)
        total, count = total + loss * n, count + n
    model.train(was_training)
    return total / max(count, 1)


def evaluate(agent, env_id: str, *, episodes: int, split: str = "dev", seed: int = 10_000, num_envs: int = 16,
             reset_options=None, progress: bool = False, env_kwargs=None, families=()) -> dict:
    """Greedy rollouts on `split`: success, score, turns, invalid-action rate and success per task family.
    The first `episodes` tasks of `split` (`shopsim.splits.eval_tasks`), of `families` interleaved when given, so
    that every family gets its share; episodes drawn from the env's default mix when the env has no such split or
    `reset_options` names a family."""
    from shopsim.rollout import collect, summarize
    from shopsim.splits import eval_tasks

    named = (reset_options or {}).get("family")
    tasks = eval_tasks(env_id, split, episodes, families=tuple(families)) if families or not named else None
    if tasks:
        trajs = collect(env_id, agent, tasks=tasks, seeds=[seed + i for i in range(len(tasks))], split=split,
                        num_envs=num_envs, reset_options=reset_options, progress=progress,
                        env_kwargs=env_kwargs or None)
    else:
        trajs = collect(env_id, agent, episodes=episodes, seed=seed, split=split, num_envs=num_envs,
                        reset_options=reset_options, progress=progress, env_kwargs=env_kwargs or None)
    out = summarize(trajs)
    out.update({f"success/{fam}": v for fam, v in success_by_family(trajs).items()})
    inv = [bool(turn.info.get("invalid_action")) for t in trajs for turn in t.turns]
    out["invalid_rate"] = float(np.mean(inv)) if inv else 0.0
    return out


def plot_curve(history: Sequence[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    steps = [h["step"] for h in history if "loss" in h]
    losses = np.array([h["loss"] for h in history if "loss" in h])
    ax.plot(steps, losses, color="tab:blue", lw=0.5, alpha=0.3)
    k = max(1, min(50, len(losses) // 10))  # batches are length-bucketed, so the raw loss is noisy: smooth it
    ax.plot(steps[k - 1:], np.convolve(losses, np.ones(k) / k, mode="valid"), color="tab:blue", lw=1.5)
    ax.set_xlabel("step")
    ax.set_ylabel("SFT loss (agent tokens)", color="tab:blue")
    ax.set_yscale("log")
    ev = [h for h in history if "eval_success" in h]
    if ev:
        ax2 = ax.twinx()
        ax2.plot([h["step"] for h in ev], [h["eval_success"] for h in ev], "o-", color="tab:red")
        ax2.set_ylabel("dev success", color="tab:red"), ax2.set_ylim(0, 1)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


#: file in an SFT run folder holding what a resumed run needs besides the checkpoint's weights (a
#: `shopsim.statefile` file: it loads without unpickling, so a crafted run folder cannot run code)
RESUME_STATE = "sft_state.safetensors"
#: the pickled resume state of older versions: refused unread
LEGACY_RESUME_STATE = "sft_state.pt"


def _save_resume_state(out_dir: Path, config: SFTConfig, opt, step: int, tokens_seen: int, history) -> None:
    """Written next to each intermediate checkpoint (atomically): optimizer state, step and the metrics so far."""
    from shopsim.statefile import save_state

    save_state(out_dir / RESUME_STATE, {"config": asdict(config), "step": step, "tokens_seen": tokens_seen,
                                        "history": history, "optimizer": opt.state_dict()})


def _load_resume_state(out_dir: Path, config: SFTConfig, model, opt):
    """``(step, tokens_seen, history)`` of an interrupted run of the same config in `out_dir` (its latest checkpoint's
    weights are loaded into `model`, its optimizer state into `opt`), or None when there is nothing to resume."""
    from shopsim.errors import ShopsimError
    from shopsim.statefile import load_state

    path = out_dir / RESUME_STATE
    if (out_dir / LEGACY_RESUME_STATE).is_file() and not path.is_file():
        raise ConfigError(f"{out_dir / LEGACY_RESUME_STATE} is the resume state of an older shopsim (a pickle, not "
                          "loaded: it could run code); delete it (or choose another --out) to start the run again")
    if not path.is_file() or not (out_dir / "checkpoint" / "config.json").is_file():
        return None
    try:
        state = load_state(path)
    except ShopsimError as exc:
        raise ConfigError(f"{exc} (or choose another --out) to start the run again") from None
    if not isinstance(state, dict) or not isinstance(state.get("config"), dict):
        raise ConfigError(f"{path} is not an SFT resume state; delete it (or choose another --out) to start the "
                          "run again")
    if state["config"] != asdict(config):
        changed = sorted(k for k, v in asdict(config).items() if state["config"].get(k) != v)
        raise ConfigError(f"{out_dir} holds an interrupted SFT run with other options ({', '.join(changed)}); "
                          "rerun with the same options to resume it, or choose another --out")
    from agents.lm.model import load_model

    model.load_state_dict(load_model(out_dir / "checkpoint").state_dict())
    opt.load_state_dict(state["optimizer"])
    return state["step"], state["tokens_seen"], list(state["history"])


def init_record(path: str | Path) -> dict:
    """What a checkpoint folder used as a starting point was made with: its path, its weights' digest
    (`agents.lm.model.weights_digest`, so a retrained start is not mistaken for the old one), and its manifest's
    ``sft`` options and own ``init`` record (the earlier stages), when it has a manifest."""
    import json

    from agents.lm.model import weights_digest
    from agents.registry import CHECKPOINT_MANIFEST

    manifest = Path(path) / CHECKPOINT_MANIFEST
    out: dict = {"path": str(path), "weights_sha256": weights_digest(path)}
    if manifest.is_file():
        m = json.loads(manifest.read_text())
        out.update({k: m[k] for k in ("sft", "examples", "init") if k in m})
    return out


def _json_form(obj):
    """`obj` as it reads back from a JSON file (tuples become lists), for comparisons with a manifest."""
    import json

    return json.loads(json.dumps(obj))


def finished_run(out_dir: str | Path, config: SFTConfig, *, init: dict | None = None,
                 data: dict | None = None) -> Path | None:
    """The final checkpoint in `out_dir` when it holds a finished `train_sft` run of the same `config`, start
    (`init`) and training data (`data`), else None; a staged recipe that is run again then skips its finished
    stages instead of training them anew. An interrupted run (its resume state, or a checkpoint with a ``step``)
    is not finished; a run with other options, start or data is not this one."""
    import json

    from agents.registry import CHECKPOINT_MANIFEST

    ckpt = Path(out_dir) / "checkpoint"
    manifest = ckpt / CHECKPOINT_MANIFEST
    if not manifest.is_file() or any((Path(out_dir) / f).exists() for f in (RESUME_STATE, LEGACY_RESUME_STATE)):
        return None
    m = json.loads(manifest.read_text())
    if "step" in m or m.get("sft") != _json_form(asdict(config)):
        return None
    if m.get("init") != _json_form(init) or m.get("data") != _json_form(data):
        return None
    return ckpt


def train_sft(env_id: str, trajectories, config: SFTConfig, *, out_dir: str | Path, tokenizer=None,
              model=None, progress: bool = True, callback=None, init: dict | None = None,
              data: dict | None = None, system_prompt: str | None = None):
    """Behaviour-clone `trajectories`; returns ``(agent, history)``. Writes checkpoints, metrics.csv, the plot.

    `init` describes where `model` came from when it is not a fresh one (`init_record`); it is written to the
    checkpoint manifest, so a checkpoint trained in stages names every stage's options. `data` describes the
    trajectories (``{"expert_episodes": n}``, ``{"path": ...}``); it is written to the manifest too, and
    `finished_run` compares it.

    `system_prompt` replaces the agent's default one (a pretrained model from `agents.lm.pretrained` is told the env's
    text grammar there, `shopsim sft --init MODEL_DIR`); the checkpoint keeps it.

    `callback(record)` is called after every step with that step's metrics dict. An interrupted run resumes: each
    intermediate checkpoint (every `config.eval_every` steps) also saves the optimizer state and the metrics so far,
    and calling again with the same config and `out_dir` continues from that step on the same batches.
    """
    from agents.lm.agent import LMAgent
    from agents.lm.model import build_model
    from agents.lm.tokenizer import load_tokenizer

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(config.seed)
    tokenizer = tokenizer or load_tokenizer()
    model = model or build_model(tokenizer, arch=config.arch, size=config.size, seed=config.seed)
    prompt_kw: dict[str, Any] = {"system_prompt": system_prompt} if system_prompt is not None else {}
    agent = LMAgent(env_id=env_id, model=model, tokenizer=tokenizer, context_mode=config.context_mode,
                    history=config.history, history_obs_chars=config.history_obs_chars, greedy=True,
                    max_new_tokens=config.max_new_tokens, pin_first_turn=config.pins_first_turn, **prompt_kw)
    env_kwargs = config.env_options()
    agent.env_kwargs = dict(env_kwargs)
    if config.augment_copies:
        from agents.lm.augment import copy_augment

        trajectories = list(trajectories) + copy_augment(trajectories, config.augment_copies, seed=config.seed,
                                                         resample_ids=config.augment_ids,
                                                         only_success=config.only_success)
    rows = build_examples(trajectories, agent.fmt, mode=config.context_mode, history=config.history,
                          history_obs_chars=config.history_obs_chars, only_success=config.only_success,
                          pin_first_turn=config.pins_first_turn)
    if not rows:
        raise ConfigError("no training examples: the expert trajectories are empty or none succeeded")
    rng = np.random.default_rng(config.seed)
    batches = _batches(rows, config.batch_size, rng)
    short_batches = None
    if config.curriculum_steps:
        lengths = np.array([len(r[0]) for r in rows])
        n_short = max(1, math.ceil(config.curriculum_share * len(rows)))
        if config.context_mode == "concat":
            # an episode row's shortest part with a target is its first turn (system + task page + the search,
            # a copy of the task line): the same rows a window-mode curriculum starts on
            short = [first_turn(r) for r in rows]
        else:
            short = [rows[i] for i in np.argsort(lengths, kind="stable")[:n_short]]
        ratio = lengths.mean() / np.mean([len(r[0]) for r in short])
        short_batches = _batches(short, max(1, round(config.batch_size * ratio)), rng)
    opt = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay, betas=(0.9, 0.95))
    history: list[dict] = []
    start, tokens_seen = 0, 0
    resumed = _load_resume_state(out_dir, config, model, opt)
    if resumed is not None:
        start, tokens_seen, history = resumed
        # the batch streams are seeded generators: replaying their first `start` draws puts them where the
        # interrupted run left them, so the resumed run sees the same batches as an uninterrupted one
        for step in range(start):
            next(short_batches if step < config.curriculum_steps and short_batches else batches)

    cur = min(config.curriculum_steps, config.steps)

    def lr_at(step: int) -> float:
        # curriculum: warm-up, then constant; the main phase restarts the schedule (warm-up, cosine to 10%) so that
        # it gets the full learning rate (a single cosine over both phases left it at a third of `lr`: 25-38% dev
        # success instead of 65-70% in the measurement of the module docstring)
        if step < cur:
            return config.lr * min(1.0, (step + 1) / config.warmup)
        step, total = step - cur, config.steps - cur
        if step < config.warmup:
            return config.lr * (step + 1) / config.warmup
        frac = (step - config.warmup) / max(1, total - config.warmup)
        return config.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))

    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=config.steps, initial=start, desc="sft", unit="step")
    t0 = time.perf_counter() - (history[-1]["time_s"] if history else 0.0)
    for step in range(start, config.steps):
        model.train()
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        batch = next(short_batches if step < config.curriculum_steps and short_batches else batches)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=config.autocast == "bf16"):
            loss, n_tok, agent_loss = sft_loss(model, batch, agent.policy.pad_id, config.obs_loss_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        opt.step()
        tokens_seen += sum(len(r[0]) for r in batch)
        rec = {"step": step + 1, "loss": agent_loss, "total_loss": loss.item(), "lr": lr_at(step), "rows": len(batch),
               "agent_tokens": n_tok,
               "tokens_seen": tokens_seen, "time_s": time.perf_counter() - t0}
        last = step + 1 == config.steps
        if last or (config.eval_every and (step + 1) % config.eval_every == 0):
            model.eval()
            ev = evaluate(agent, env_id, episodes=config.eval_episodes, split=config.eval_split,
                          num_envs=config.num_envs, reset_options=config.reset_options or None,
                          families=config.families,
                          env_kwargs=env_kwargs)
            rec.update({f"eval_{k}": v for k, v in ev.items()})
            rec["time_s"] = time.perf_counter() - t0
            if not last:  # latest checkpoint, so that an interrupted run still leaves a usable one
                agent.save(out_dir / "checkpoint", sft=asdict(config), examples=len(rows), step=step + 1,
                           env_kwargs=dict(env_kwargs), **({"init": init} if init else {}),
                           **({"data": data} if data else {}),
                           final_eval={k: v for k, v in rec.items() if k.startswith("eval_")})
                write_metrics_csv(out_dir / "metrics.csv", history + [rec])
                _save_resume_state(out_dir, config, opt, step + 1, tokens_seen, history + [rec])
        history.append(rec)
        if callback is not None:
            callback(rec)
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{float(loss):.3f}", **({"dev": f"{rec['eval_success']:.2f}"}
                                                          if "eval_success" in rec else {}))
    if bar is not None:
        bar.close()
    model.eval()
    ckpt = agent.save(out_dir / "checkpoint", sft=asdict(config), examples=len(rows), env_kwargs=dict(env_kwargs),
                      **({"init": init} if init else {}), **({"data": data} if data else {}),
                      final_eval={k: v for k, v in history[-1].items() if k.startswith("eval_")})
    write_metrics_csv(out_dir / "metrics.csv", history)
    (out_dir / RESUME_STATE).unlink(missing_ok=True)
    (out_dir / LEGACY_RESUME_STATE).unlink(missing_ok=True)
    plot_curve(history, out_dir / "sft_curve.png")
    agent.checkpoint = str(ckpt)
    return agent, history
