"""Mid-training on self-generated, diverse, correct trajectories before GRPO (docs/algorithms/midtrain.md).

RRV et al., "Mid-Training with Self-Generated Data Improves Reinforcement Learning in Language Models",
arXiv 2605.08472: a supervised stage on the model's own correct solutions, one per problem-solving heuristic,
inserted before RL, so that RL has several approaches to compose. The shopsim adaptation (strategies instead of
Pólya's heuristics, env success as the verifier, a rule-based adherence check) has three stages, each resumable
at its boundary because its output is written atomically into ``OUT/midtrain/`` and a finished stage is not redone:

1. **Generate** (`generate_dataset`): for each task of a fixed pool drawn from the run's seed and each strategy of
   `MidTrainConfig.strategies`, the checkpoint that will be RL-trained acts with the env's ``strategy`` reset option
   (the observation says ``Strategy: ...``) and one exemplar trajectory of the scripted expert following that
   strategy on another task (`exemplar_text`, prepended to the first observation); `candidates` samples at
   `gen_temperature`. `select_best` keeps per (task, strategy) the best candidate that succeeded (the verifier,
   reward == 1) and adheres to the strategy (`adheres`): fewest turns, then earliest sample. Output:
   ``data.parquet`` (`shopsim.datasets`, one ``strategy`` label per episode) and ``generate.json``.
2. **Mid-train** (`midtrain_sft`): `agents.lm.sft.train_sft` on the agent tokens of that dataset (``sft_lr``,
   ``sft_epochs``), in place on the policy; output ``sft/checkpoint`` and ``sft.json``.
3. **RL**: GRPO (the ``"group_outcome"`` estimator of `baselines.core.advantages`, group size 16, β = 0) from
   the mid-trained weights: the shared loop's iterations, so ``--iterations N`` is N GRPO iterations and a run
   interrupted during RL resumes from ``state.safetensors``. ``--iterations 0`` runs stages 1–2 only.

Controls (`MidTrainConfig.data`): ``star`` (correct own samples without a strategy prompt, STaR-style),
``incorrect`` (adherent but failed samples: diverse but incorrect), ``none`` (plain GRPO); the "many tasks × 1
strategy" control is ``strategies_per_task=1`` with ``num_tasks`` multiplied by the number of strategies.
"""

from __future__ import annotations

import json
import math
import re
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from baselines.core.advantages import GroupOutcomeConfig
from baselines.core.trainer import LMAlgorithm, sampling_as
from shopsim.configs import bounded
from shopsim.errors import ConfigError
from shopsim.paths import write_text_atomic

#: the strategies the scripted expert follows and `adheres` checks. The card's "check price before options" is left
#: out: the price is on every result line and product page, so no action (or trajectory rule) expresses checking it
SUPPORTED = ("recommend_directly", "ask_first", "confirm_before_buying", "broad_then_filter", "all_in_one_query",
             "compare_two")
#: strategies whose rule needs an action a plain trajectory does not take; a trajectory that adheres to two or more
#: of them combines strategies (`strategy_mix`). recommend_directly and all_in_one_query describe the default
#: behaviour, so adhering to them says nothing about combining
MARKED = ("ask_first", "confirm_before_buying", "broad_then_filter", "compare_two")
CLARIFY_HINT = "I have more preferences"

_ACTION = re.compile(r"^\s*([A-Za-z_]+)\s*(?:\[\s*(.*?)\s*\])?\s*$", re.S)


def parse_action(action) -> tuple[str, str]:
    """(name, argument) of a text action, lower-cased and with argument blanks stripped (``click[ #1]`` →
    ``("click", "#1")``); JSON tool calls and unparsable text give ``(text, "")``."""
    text = str(action)
    m = _ACTION.match(text)
    if not m:
        return text.strip().lower(), ""
    return m.group(1).lower(), (m.group(2) or "").strip().lower()


def _is_buy(name: str, arg: str) -> bool:
    return name in ("buy", "checkout") or (name == "click" and arg in ("buy now", "checkout"))


def _is_product_page(observation) -> bool:
    return any(line.startswith(("Product:", "Page: product")) for line in str(observation).splitlines())


def adheres(strategy: str | None, traj) -> bool:
    """Whether `traj` (a `Trajectory`, or any object with ``turns`` of ``action`` / ``observation``) follows
    `strategy`, by a rule on its actions (the card's rule-based adherence check):

    * recommend_directly: no ``answer[...]`` before the purchase and no question unless the task says the customer
      has more preferences (clarify_and_buy);
    * ask_first: a question (``ask[...]``) precedes the first search;
    * confirm_before_buying: an ``answer[...]`` after the first search precedes the purchase;
    * broad_then_filter: two or more searches before the purchase, the first with fewer words than the last;
    * all_in_one_query: exactly one search;
    * compare_two: the agent goes back (``click[< prev]``) from a product page before the purchase.

    Rules that need a purchase (confirm_before_buying, compare_two) fail without one. A strategy of None (no
    instruction) adheres trivially.
    """
    if strategy is None:
        return True
    acts = [parse_action(t.action) for t in traj.turns]
    buy = next((i for i, (n, a) in enumerate(acts) if _is_buy(n, a)), None)
    end = len(acts) if buy is None else buy
    searches = [i for i, (n, _) in enumerate(acts) if n == "search"]
    first_search = searches[0] if searches else None
    if strategy == "recommend_directly":
        hint = bool(traj.turns) and CLARIFY_HINT in str(traj.turns[0].observation)
        return not any(n == "answer" for n, _ in acts[:end]) and (hint or not any(n == "ask" for n, _ in acts))
    if strategy == "ask_first":
        return first_search is not None and any(n == "ask" for n, _ in acts[:first_search])
    if strategy == "confirm_before_buying":
        return (buy is not None and first_search is not None
                and any(n == "answer" for n, _ in acts[first_search:buy]))
    if strategy == "broad_then_filter":
        before = [acts[i][1] for i in searches if i < end]
        return len(before) >= 2 and len(before[0].split()) < len(before[-1].split())
    if strategy == "all_in_one_query":
        return len(searches) == 1
    if strategy == "compare_two":
        return buy is not None and any(
            n == "click" and a == "< prev" and _is_product_page(traj.turns[i].observation)
            for i, (n, a) in enumerate(acts[:buy]))
    raise ConfigError(f"no adherence rule for strategy {strategy!r}; supported: {', '.join(SUPPORTED)}")


def strategy_profile(traj) -> tuple[str, ...]:
    """The `MARKED` strategies `traj` adheres to."""
    return tuple(s for s in MARKED if adheres(s, traj))


def strategy_mix(trajs) -> dict[str, float]:
    """Share of `trajs` that combine strategies (adhere to ≥ 2 of `MARKED`) and the share adhering to each."""
    if not trajs:
        return {}
    prof = [strategy_profile(t) for t in trajs]
    out = {"strategy_mix": float(np.mean([len(p) >= 2 for p in prof]))}
    out.update({f"adheres/{s}": float(np.mean([s in p for p in prof])) for s in MARKED})
    return out


def select_best(candidates, strategy: str | None, data: str = "diverse"):
    """The candidate kept for one (task, strategy), or None.

    diverse: succeeded (the verifier: env success, reward == 1) and adheres to `strategy`; star: succeeded (any
    strategy); incorrect: adheres but failed. Among those, "best" is the fewest turns (the shortest correct
    solution), then the highest score, then the earliest sample.
    """
    if data == "diverse":
        keep = [t for t in candidates if t.success and adheres(strategy, t)]
    elif data == "star":
        keep = [t for t in candidates if t.success]
    elif data == "incorrect":
        keep = [t for t in candidates if not t.success and adheres(strategy, t)]
    else:
        raise ConfigError(f"data={data!r} selects no candidates; choose diverse, star or incorrect")
    if not keep:
        return None
    return min(enumerate(keep), key=lambda p: (p[1].num_turns, -p[1].score, p[0]))[1]


def exemplar_text(traj) -> str:
    """One expert trajectory as a few-shot exemplar: its task line and its actions in order."""
    first = str(traj.turns[0].observation).splitlines() if traj.turns else []
    task = next((line for line in first if line.startswith("Task: ")), "")
    actions = " | ".join(str(t.action) for t in traj.turns)
    return f"Example of this strategy on another task.\n{task}\nActions: {actions}\nNow your task.\n"


class ExemplarAgent:
    """Wraps an agent so that each episode's first observation starts with `text` (the exemplar); everything
    else is the wrapped agent's. The env's observations, hence the recorded trajectory, are unchanged."""

    def __init__(self, agent, text: str):
        self.agent, self.text = agent, text
        self.name = getattr(agent, "name", type(agent).__name__)

    def reset(self, num_slots: int, seed: int | None = None) -> None:
        self.agent.reset(num_slots, seed)

    def begin_episode(self, slot, observation, info) -> None:
        self.agent.begin_episode(slot, self.text + str(observation), info)

    def act(self, observations, infos, slots):
        return self.agent.act(observations, infos, slots)

    def observe(self, slot, reward, terminated, truncated, info) -> None:
        self.agent.observe(slot, reward, terminated, truncated, info)


def strip_strategy(traj):
    """A copy of `traj` whose observations lack the ``Strategy: ...`` line (the SFT prompt without the
    instruction)."""
    import copy

    out = copy.deepcopy(traj)
    for t in out.turns:
        if isinstance(t.observation, str):
            t.observation = "\n".join(line for line in t.observation.splitlines() if not line.startswith("Strategy: "))
    return out


@dataclass
class MidTrainConfig(GroupOutcomeConfig):
    """Mid-training's options (card §14); the RL stage is GRPO with the card's G = 16 and β = 0."""

    group_size: int = 16
    kl_coef: float = 0.0
    data: Literal["diverse", "star", "incorrect", "none"] = "diverse"
    """Mid-training data: diverse (best correct, adherent sample per task and strategy; the method), star (correct
    own samples without a strategy prompt), incorrect (adherent but failed samples), none (plain GRPO)."""
    strategies: tuple[str, ...] = SUPPORTED
    """Strategy set (names of the env's STRATEGIES with an adherence rule); n = its size when every task gets every
    strategy."""
    strategies_per_task: int | None = bounded(None, min=1)
    """Strategies per task (None: all, the card's D_n with n = len(strategies)); k: each task gets k of them in
    rotation, so every strategy is used about equally (1 = the "many tasks × 1 strategy" control)."""
    num_tasks: int = bounded(32, min=1)
    """Training tasks in the generation pool (drawn from the run's seed, in `task_families`)."""
    candidates: int = bounded(4, min=1)
    """Samples c per (task, strategy)."""
    gen_temperature: float = bounded(1.0, gt=0)
    """Sampling temperature of the generation stage."""
    exemplar: bool = True
    """Prompt the generation with one scripted-expert exemplar of the strategy on another task (False: the strategy
    description only)."""
    strategy_prompt: bool = True
    """Prompt the generation with the strategy (the reset option, and the exemplar if on). False [derived]: sample
    without any strategy prompt and let the adherence check alone assign samples to strategies (for a model too
    small to follow the prompt)."""
    sft_lr: float = bounded(1e-4, gt=0)
    """Mid-training learning rate (peak, `agents.lm.sft` schedule)."""
    sft_epochs: float = bounded(2.0, gt=0)
    """Mid-training passes over the dataset (steps = ceil(epochs × examples / sft_batch_size))."""
    sft_batch_size: int = bounded(16, min=1)
    """Mid-training rows (episodes in concat mode) per step."""
    sft_strategy_prompt: bool = False
    """Keep the ``Strategy: ...`` line in the mid-training prompts (False: the plain task prompt, the one RL and
    evaluation show, so the data teaches several solutions to the same prompt)."""

    def __post_init__(self) -> None:
        if isinstance(self.strategies, str):
            self.strategies = tuple(s for s in self.strategies.split(",") if s)
        super().__post_init__()
        bad = [s for s in self.strategies if s not in SUPPORTED]
        if bad or not self.strategies:
            raise ConfigError(f"strategies={self.strategies!r}: give a non-empty subset of {', '.join(SUPPORTED)} "
                              "(the strategies the expert exemplar and the adherence check support)")
        if self.strategies_per_task is not None and self.strategies_per_task > len(self.strategies):
            raise ConfigError(f"strategies_per_task={self.strategies_per_task} exceeds the {len(self.strategies)} "
                              "strategies; lower it or add strategies")


#: the options that decide what stage 1 generates (a finished stage is reused only under the same ones)
GEN_FIELDS = ("data", "strategies", "strategies_per_task", "num_tasks", "candidates", "gen_temperature", "exemplar",
              "strategy_prompt", "task_families")


def task_plan(tasks: list, strategies: tuple[str, ...], per_task: int | None) -> list[tuple[int, str]]:
    """(task, strategy) pairs: every strategy for every task, or `per_task` strategies per task in rotation."""
    k = len(strategies) if per_task is None else per_task
    return [(t, strategies[(i * k + j) % len(strategies)]) for i, t in enumerate(tasks) for j in range(k)]


def _expert_kwargs(env_kwargs: dict) -> dict:
    """The expert writing the exemplars acts like the SFT data the checkpoint was trained on (`agents.lm.sft`)."""
    from agents.lm.sft import SFTConfig

    return SFTConfig(numbered_results=bool(env_kwargs.get("numbered_results"))).expert_options()


def make_exemplars(env_id: str, strategies, env_kwargs: dict, tasks: list, seed: int) -> dict[str, str]:
    """One exemplar per strategy: the scripted expert on the first of `tasks` where it succeeds and adheres."""
    import agents
    from shopsim.rollout import collect

    expert = agents.make("expert", env_id, **_expert_kwargs(env_kwargs))
    out = {}
    for s in strategies:
        trajs = collect(env_id, expert, tasks=tasks, seeds=[seed + i for i in range(len(tasks))], split="train",
                        reset_options={"strategy": s}, env_kwargs=env_kwargs, progress=False, num_envs=4)
        good = [t for t in trajs if t.success and adheres(s, t)]
        if not good:
            raise ConfigError(f"the scripted expert found no exemplar for strategy {s!r} on {len(tasks)} tasks; "
                              "drop the strategy or pass exemplar=False")
        out[s] = exemplar_text(good[0])
    return out


def generate_dataset(env_id: str, agent, config: MidTrainConfig, out_dir: Path, *, seed: int,
                     env_kwargs: dict | None = None) -> dict:
    """Stage 1: write ``out_dir/data.parquet`` (kept trajectories, strategy-labelled) and ``out_dir/generate.json``
    (statistics, exemplars); returns the statistics. Skipped when ``generate.json`` exists (it is written last)."""
    from baselines.core.tasks import sample_tasks
    from shopsim.datasets import write_dataset
    from shopsim.rollout import collect

    out_dir = Path(out_dir)
    stats_path = out_dir / "generate.json"
    c = config
    setting = {k: getattr(c, k) for k in GEN_FIELDS}
    setting = json.loads(json.dumps(setting))  # tuples as lists, as read back
    if stats_path.is_file():
        stats = json.loads(stats_path.read_text())
        if stats.get("setting", setting) != setting:
            raise ConfigError(f"{out_dir} holds mid-training data generated with {stats['setting']}, not {setting}; "
                              "use another output folder or delete that one")
        return stats
    env_kwargs = dict(env_kwargs or {})
    rng = np.random.default_rng([seed, 14])
    # a pool of distinct tasks, plus a few other tasks for the exemplars
    pool: list = []
    while len(pool) < c.num_tasks + 8:
        drawn = sample_tasks(env_id, "train", rng, 4 * (c.num_tasks + 8), families=c.task_families)
        if drawn is None:
            raise ConfigError(f"{env_id} has no train split to draw the mid-training tasks from")
        pool.extend(t for t in drawn if t not in pool)
    tasks, ex_tasks = pool[:c.num_tasks], pool[c.num_tasks:c.num_tasks + 8]
    pairs = task_plan(tasks, c.strategies, c.strategies_per_task)
    star = c.data == "star"
    prompt = c.strategy_prompt and not star
    exemplars = {} if (not prompt or not c.exemplar) else make_exemplars(env_id, c.strategies, env_kwargs, ex_tasks,
                                                                   seed=int(rng.integers(0, 2**31 - 1)))
    sampling = (sampling_as(agent, temperature=c.gen_temperature, greedy=False)
                if getattr(agent, "sampling", None) is not None else nullcontext())
    kept, cands = [], []
    with sampling:
        for s in dict.fromkeys(s for _, s in pairs):
            group_tasks = [t for t, st in pairs if st == s]
            seeds = [int(x) for x in rng.integers(0, 2**31 - 1, size=len(group_tasks))]
            actor = ExemplarAgent(agent, exemplars[s]) if s in exemplars else agent
            trajs = collect(env_id, actor, tasks=group_tasks, seeds=seeds, split="train", group_size=c.candidates,
                            reset_options={"strategy": s} if prompt else None, env_kwargs=env_kwargs,
                            num_envs=c.num_envs, progress=False, agent_seed=int(rng.integers(0, 2**31 - 1)))
            for g in range(len(group_tasks)):
                group = trajs[g * c.candidates:(g + 1) * c.candidates]
                cands += [(s, t) for t in group]
                best = select_best(group, None if star else s, c.data)
                if best is not None:
                    best.strategy = best.strategy or (None if star else s)  # the label, when not prompted
                    best.meta = {**best.meta, "midtrain_strategy": s, "midtrain_data": c.data}
                    kept.append(best)
    if kept:
        write_dataset(out_dir / "data.parquet", kept, metadata={"env_id": env_id, "midtrain": {
            "data": c.data, "strategies": list(c.strategies), "candidates": c.candidates}})
    stats = {"gen_pairs": len(pairs), "gen_tasks": len(tasks), "gen_candidates": len(cands),
             "pretrain_rollouts": len(cands),
             "gen_success": float(np.mean([t.success for _, t in cands])) if cands else 0.0,
             "gen_adherence": float(np.mean([adheres(s, t) for s, t in cands])) if cands and not star else None,
             "gen_kept": len(kept),
             "gen_kept_per_strategy": {s: sum(t.meta.get("midtrain_strategy") == s for t in kept)
                                       for s in c.strategies},
             **{f"gen_kept_{k}": v for k, v in strategy_mix(kept).items()},
             "setting": setting, "exemplars": exemplars,
             "tasks": [int(t) if isinstance(t, (int, np.integer)) else t for t in tasks]}
    write_text_atomic(stats_path, json.dumps(stats, indent=2, default=float))
    return stats


def midtrain_sft(env_id: str, agent, config: MidTrainConfig, out_dir: Path, *, seed: int,
                 env_kwargs: dict | None = None) -> dict:
    """Stage 2: SFT of `agent.model` in place on ``out_dir/data.parquet`` with `agents.lm.sft.train_sft` (agent
    tokens only); writes ``out_dir/sft/checkpoint`` and then ``out_dir/sft.json``. When ``sft.json`` exists the
    stage is done: the mid-trained weights are loaded into `agent.model` instead."""
    from agents.lm.sft import SFTConfig, train_sft
    from shopsim.datasets import read_trajectories

    out_dir = Path(out_dir)
    done = out_dir / "sft.json"
    if done.is_file():
        info = json.loads(done.read_text())
        if info.get("examples"):
            from agents.lm.model import load_model

            agent.model.load_state_dict(load_model(out_dir / "sft" / "checkpoint").state_dict())
        return info
    c = config
    data = out_dir / "data.parquet"
    trajs = read_trajectories(data) if data.is_file() else []
    if not c.sft_strategy_prompt:
        trajs = [strip_strategy(t) for t in trajs]
    if not trajs:  # nothing kept: RL starts from the unchanged checkpoint (logged, not an error)
        info = {"examples": 0, "sft_steps": 0}
        write_text_atomic(done, json.dumps(info))
        return info
    steps = max(1, math.ceil(c.sft_epochs * len(trajs) / c.sft_batch_size))
    opts = getattr(agent, "options", {})
    sft_cfg = SFTConfig(
        steps=steps, batch_size=c.sft_batch_size, lr=c.sft_lr, warmup=max(1, steps // 10), seed=seed,
        context_mode=opts.get("context_mode", "concat"), history=opts.get("history", 1),
        history_obs_chars=opts.get("history_obs_chars", 100), pin_first_turn=opts.get("pin_first_turn", False),
        max_new_tokens=opts.get("max_new_tokens", 48), obs_mode="compact", numbered_results=False,
        results_per_page=None, env_kwargs=dict(env_kwargs or {}), curriculum_steps=0, augment_copies=0,
        only_success=c.data != "incorrect", families=tuple(c.task_families), eval_every=0,
        eval_episodes=max(1, c.eval_episodes), num_envs=c.num_envs)
    _, hist = train_sft(env_id, trajs, sft_cfg, out_dir=out_dir / "sft", tokenizer=agent.tokenizer,
                        model=agent.model, progress=False)
    info = {"examples": len(trajs), "sft_steps": steps, "sft_loss_first": hist[0]["loss"],
            "sft_loss_last": hist[-1]["loss"],
            **{f"sft_{k}": v for k, v in hist[-1].items() if k.startswith("eval_")}}
    write_text_atomic(done, json.dumps(info, indent=2, default=float))
    return info


class MidTrain(LMAlgorithm):
    """Generate → mid-train → GRPO (module docstring); stages 1–2 run once in `before_training`, the RL stage
    uses GRPO's estimator (``"group_outcome"``)."""

    name = "midtrain"
    Config = MidTrainConfig
    advantage_estimator = "group_outcome"

    def before_training(self, env_id: str, agent, rng: np.random.Generator, out_dir: Path) -> dict:
        c = self.config
        if c.data == "none":
            return {}
        if not hasattr(agent, "model") or not hasattr(agent, "tokenizer"):
            raise ConfigError("midtrain needs an LM agent (model and tokenizer) to generate and mid-train")
        stage = Path(out_dir) / "midtrain"
        seed = self.run.seed
        gen = generate_dataset(env_id, agent, c, stage, seed=seed, env_kwargs=self._env_kwargs)
        sft = midtrain_sft(env_id, agent, c, stage, seed=seed, env_kwargs=self._env_kwargs)
        self.model.to(c.device).eval()
        if self.ref_model is not None:  # β > 0: the reference is the mid-trained policy
            self.ref_model.load_state_dict(self.model.state_dict())
        return {k: v for k, v in {**gen, **sft}.items() if k not in ("tasks", "exemplars", "setting")}

    def eval_trajectory_metrics(self, split: str, trajs) -> dict:
        return {f"{split}_{k}": v for k, v in strategy_mix(trajs).items()}
