"""One record per shipped env: the single place an env is described (`shopsim.envs.record.EnvRecord`).

Importing `shopsim.envs` registers every record here (with Gymnasium, for the Gymnasium envs), in this order, which
is also the order of the leaderboard's tables. To add an env, write its record here (or call
`shopsim.envs.register_env` at runtime): docs/adding-an-env.md walks a toy env through it.

The budgets are the benchmark's (`shopsim.app.bench`, ``shopsim bench --tier``): ``standard`` trains every baseline
of an env at one fixed budget with 3 seeds (its results ship in ``data/results/standard/``), ``quick`` is the main
job (the shipped rows re-checked live plus one short demo per family), ``tiny`` the CI smoke run and ``full`` the
papers' iteration counts. Their config overrides are recorded in every results file's config (and so in its digest):
changing one here makes the shipped results of that entry stale.
"""

from __future__ import annotations

from shopsim.envs.record import Budget, EnvRecord, EvalSize, Scenario

STANDARD_TRAIN_SEEDS = 3

# ----------------------------------------------------------------------------------------------------- shopping
# LM demo trainers: a few rollouts per iteration, no in-training evaluation (the leaderboard evaluates), the learning
# rate of benchmarks/learning_lm.py (the papers' 1e-6 is for billion-parameter models)
_SHOP_REFS = ("expert", "random")
_SHOP_SMALL = {"lr": 1e-4, "temperature": 0.7, "eval_episodes": 0, "checkpoint_every": 0}
_SHOP_TINY = {"grpo": {**_SHOP_SMALL, "group_size": 2, "tasks_per_iter": 2, "max_new_tokens": 32}}
_SHOP_FULL = ("grpo", "mpo", "ppo", "reinforce", "gigpo", "dapo", "bipace", "basis", "arc", "delta", "wapo", "tropd",
              "midtrain", "vapo")

SHOPPING = EnvRecord(
    id="shopsim/Shopping-v0",
    entry_point="shopsim.envs.shopping:ShoppingEnv",
    family="shopping",
    register_kwargs={"max_episode_steps": 60},
    text=True,
    description=(
        "A multi-turn text shop: the agent searches a catalog, opens products, picks options, asks the simulated "
        "customer questions and buys, across four task families (find_and_buy, clarify_and_buy with hidden "
        "constraints, bundle under a budget, after_sales under a written policy, graded on the final order database). "
        "The primary metric is the success rate; the per-family columns and chart show where an agent fails."),
    metrics=("success_rate", "success/find_and_buy", "success/clarify_and_buy", "success/bundle",
             "success/after_sales", "success/personalized_buy", "score", "pass^1", "pass^2", "pass^3", "pass^4",
             "turns", "tokens", "invalid_rate"),
    # 100 tasks, i.e. 100 episodes per task family, for a Wilson interval under ±0.1 on every family; 4 tries for
    # pass^1..4
    protocol_size=EvalSize(tasks=100, tries=4, seeds=(0,)),
    references=_SHOP_REFS,
    budgets={
        # the trained rows are the learning benchmark's table of record (every LM algorithm from the shipped agent,
        # 16 iterations x 256 rollouts, 3 seeds: docs/training.md), trained once there and imported, not re-trained
        "standard": Budget(_SHOP_REFS, imported=_SHOP_FULL, imported_by="make learning-record", needs_init=True,
                           user_iterations=10, train_seeds=STANDARD_TRAIN_SEEDS),
        # the main job checks one LM checkpoint live, on the whole protocol (100 tasks x 4 tries keep every family's
        # Wilson interval under ±0.1)
        "quick": Budget(_SHOP_REFS, {"grpo": 2}, overrides=_SHOP_TINY, needs_init=True, demo=True,
                        live_checkpoints=("grpo",), user_iterations=3),
        "tiny": Budget(_SHOP_REFS, {"grpo": 1}, tasks=2, seeds=2, tries=4, needs_init=True, overrides=_SHOP_TINY,
                       user_iterations=1),
        "full": Budget(_SHOP_REFS, dict.fromkeys(_SHOP_FULL, 200), needs_init=True, user_iterations=200,
                       train_seeds=3),
    },
)

# ------------------------------------------------------------------------------------------------ proactive rec
# Smaller batches and evaluations than the paper's defaults, so that the quick run fits in ~10 min on 2 cores.
# The standard tier decodes real, unseen items only (valid_only, no_repeat): at this budget the unconstrained
# decoding lets the policy learn to stop after almost no items, and the constrained SFT start is the stronger one.
_REC_ALGOS = ("prorl", "reinforce", "grpo")
_REC_SMALL = {"sft_steps": 50, "eval_tasks": 8, "group_size": 8, "prompts_per_iter": 4}
_REC_STD = {"sft_steps": 100, "eval_tasks": 32, "group_size": 8, "prompts_per_iter": 4, "eval_every": 10,
            "valid_only": True, "no_repeat": True}

PROACTIVE_REC = EnvRecord(
    id="shopsim/ProactiveRec-v0",
    entry_point="shopsim.envs.proactive_rec:ProactiveRecEnv",
    family="rec",
    description=(
        "Proactive recommendation: the agent emits up to 10 items as semantic IDs to steer a simulated user's "
        "interest from their history toward a far target item. Rows are ranked by return, the fused reward of the "
        "three ProRL components: IoI (interest in the target), IoR (its rank) and CTR (acceptance)."),
    metrics=("return", "IoI", "IoR", "CTR", "length", "success_rate"),
    protocol_size=EvalSize(tasks=256, tries=1, seeds=(0,)),
    sb3_wrapper="shopsim.wrappers:sb3_proactive_rec",
    # the default SASRec simulator trains for a minute on a cold cache; the analytic one builds at once
    test_kwargs={"simulator": "analytic"},
    budgets={
        "standard": Budget(algos=dict.fromkeys(_REC_ALGOS, 100), overrides=dict.fromkeys(_REC_ALGOS, _REC_STD),
                           user_iterations=100, train_seeds=STANDARD_TRAIN_SEEDS),
        # the standard tier's decoding (real, unseen items): a 10-iteration demo decoding freely stops early
        "quick": Budget(algos={"prorl": 10}, tasks=64, demo=True,
                        overrides={"prorl": {**_REC_SMALL, "valid_only": True, "no_repeat": True}}),
        "tiny": Budget(algos={"reinforce": 1}, tasks=2, seeds=2, tries=4, user_iterations=1,
                       overrides=dict.fromkeys(_REC_ALGOS, _REC_SMALL)),
        "full": Budget(algos={"prorl": 500, "grpo": 500, "reinforce": 500}, user_iterations=500, train_seeds=3),
    },
)

# ------------------------------------------------------------------------------------------- two-stage retrieval
_RET_ALGOS = ("capg", "capg_swr", "vpg", "vpg_swr", "top1")
_RET_SMALL = dict.fromkeys(_RET_ALGOS, {"eval_contexts": 1000})
_RET_STD = {"eval_contexts": 1000, "eval_every": 25}

TWO_STAGE_RETRIEVAL = EnvRecord(
    id="shopsim/TwoStageRetrieval-v0",
    entry_point="shopsim.envs.two_stage_retrieval:TwoStageRetrievalEnv",
    family="retrieval",
    description=(
        "Two-stage recommendation as a contextual bandit (the CA-PG setting): the retriever picks K candidates out of "
        "the catalog and a fixed later-stage ranker shows some of them. Rows are ranked by the policy value, the "
        "expected reward of the items shown; regret is the gap to the best candidate set."),
    metrics=("policy_value", "regret", "recall", "success_rate"),
    protocol_size=EvalSize(tasks=4000, tries=1, seeds=(0,)),
    sb3_wrapper="shopsim.wrappers:sb3_as_made",
    budgets={
        "standard": Budget(algos=dict.fromkeys(_RET_ALGOS, 300), overrides=dict.fromkeys(_RET_ALGOS, _RET_STD),
                           user_iterations=300, train_seeds=STANDARD_TRAIN_SEEDS),
        "quick": Budget(algos={"capg": 50}, tasks=1000, demo=True, overrides=_RET_SMALL),
        "tiny": Budget(algos={"capg": 1}, tasks=4, seeds=2, tries=4, user_iterations=1, overrides=_RET_SMALL),
        "full": Budget(algos=dict.fromkeys(_RET_ALGOS, 2000), user_iterations=2000, train_seeds=3),
    },
    scenarios={
        # The CA-PG card's claims are about growth in K: V-PG overflows, and CA-PG and TOP1 pull ahead at K = 20.
        # The same five baselines at the standard budget, with candidate sets of 20 (the same contexts, LSR and L).
        "k20": Scenario(
            env_kwargs={"k": 20},
            description=(
                "TwoStageRetrieval-v0 at the CA-PG card's K = 20: the retriever picks 20 candidates out of the same "
                "1000-item catalog and the same optimal later-stage ranker shows one of them. The card's claims "
                "are about growth in K: V-PG's likelihood overflows as K grows, and CA-PG and TOP1 pull ahead of "
                "V-PG-SWR at K = 20. Rows are ranked by the policy value, as on the default K = 10 table."),
            budgets={
                "standard": Budget(algos=dict.fromkeys(_RET_ALGOS, 300),
                                   overrides=dict.fromkeys(_RET_ALGOS, _RET_STD), user_iterations=300,
                                   train_seeds=STANDARD_TRAIN_SEEDS),
                # references and the shipped checkpoints only (the demo training is the default scenario's)
                "quick": Budget(tasks=1000, user_iterations=50),
                "tiny": Budget(tasks=4, seeds=2, tries=4, user_iterations=1),
            }),
    },
)

# ------------------------------------------------------------------------------------------------- replenishment
# The numeric envs' standard budgets are sized so that all of them together train and evaluate in about 40 minutes
# on one CPU core; in-training evaluation is off (the leaderboard evaluates on the protocol).
_INV_REFS = ("s_S", "base_stock", "random")
_INV_SMALL = {"batch_scenarios": 32, "eval_scenarios": 0}
_INV_OVERRIDES: dict[str, dict] = {"hpo": {**_INV_SMALL, "hidden": (128, 128)}, "ppo": _INV_SMALL}
_INV_TEXT = ("Periodic-review inventory control of several SKUs with lead times, stochastic demand, holding, backlog "
             "and fixed ordering costs.")

REPLENISHMENT = EnvRecord(
    id="shopsim/Replenishment-v0",
    entry_point="shopsim.envs.replenishment:ReplenishmentEnv",
    family="inventory",
    description=(
        f"{_INV_TEXT} Rows are ranked by cost (lower is better); the reference is the (s, S) policy, and each row's "
        "gap to it is measured on the same demand paths."),
    metrics=("cost", "gap_to_s_S_pct", "fill_rate", "order_rate"),
    gap_reference="s_S",
    protocol_size=EvalSize(tasks=256, tries=1, seeds=(0,)),
    references=_INV_REFS,
    sb3_wrapper="shopsim.wrappers:sb3_replenishment",
    budgets={
        "standard": Budget(_INV_REFS, {"hpo": 60, "ppo": 60}, overrides=_INV_OVERRIDES, user_iterations=60,
                           train_seeds=STANDARD_TRAIN_SEEDS),
        "quick": Budget(_INV_REFS, {"hpo": 10}, tasks=64, demo=True, overrides=_INV_OVERRIDES, user_iterations=6),
        "tiny": Budget(_INV_REFS, {"hpo": 1}, tasks=2, seeds=2, tries=4, user_iterations=1, overrides=_INV_OVERRIDES),
        "full": Budget(_INV_REFS, {"hpo": 300, "ppo": 300}, user_iterations=300, train_seeds=3),
    },
    scenarios={
        # Seasonal demand, factor 1 + 0.7·sin(2πt/20 + phase_i) (a season of 20 periods, 5 per 100-period
        # episode), and a shared warehouse capacity of 100 on-hand units (about two periods of total mean demand)
        # above which every unit costs 5 per period. A stationary (s, S) rule is not optimal here: its levels
        # cannot follow the season, and its per-SKU tuning ignores the shared capacity (its batches overflow at the
        # peaks).
        "seasonal": Scenario(
            env_kwargs={"seasonality": 0.7, "season_period": 20, "capacity": 100.0, "overflow_cost": 5.0},
            description=(
                "Replenishment-v0's seasonal scenario: the same SKUs with seasonal demand (mean × (1 + "
                "0.7·sin(2πt/20 + phase)), five seasons per episode) and a shared capacity of 100 on-hand units, "
                "above which every unit costs 5 per period. A stationary (s, S) rule is not optimal here: the "
                "reference is the same (s, S) rule as on the default scenario (one pair of levels per SKU for the "
                "whole episode, tuned per SKU without the shared capacity), and a learned policy can follow the "
                "season and keep the stock under the capacity."),
            budgets={
                # 30 iterations, half the default scenario's, sized so its 6 runs fit in about 25 minutes on 2 cores
                "standard": Budget(_INV_REFS, {"hpo": 30, "ppo": 30}, overrides=_INV_OVERRIDES, user_iterations=30,
                                   train_seeds=STANDARD_TRAIN_SEEDS),
                # references and the shipped checkpoints only (the demo training is the default scenario's)
                "quick": Budget(_INV_REFS, tasks=32, user_iterations=6),
            }),
    },
)

# ---------------------------------------------------------------------------------------------- multi-warehouse
# references: (s, S) per warehouse (the gap's reference) and random
_MW_REFS = ("s_S", "random")
_MW_STD: dict[str, dict] = {"hpo": {"batch_scenarios": 16, "eval_scenarios": 0, "hidden": (128, 128)},
           "ppo": {"batch_scenarios": 16, "eval_scenarios": 0}}

MULTI_WAREHOUSE = EnvRecord(
    id="shopsim/MultiWarehouse-v0",
    entry_point="shopsim.envs.multi_warehouse",
    api="pettingzoo",
    family="inventory",
    description=(
        "Several warehouses (PettingZoo agents) replenish from one supplier of limited capacity that allocates "
        "proportionally; the evaluation runs the PettingZoo parallel env, one agent action per warehouse and "
        "period. Rows are ranked by total (team) cost, the sum of every warehouse's cost, with each warehouse's "
        "own cost beside it; the reference is (s, S) per warehouse (each warehouse tunes and runs its own (s, S) "
        "on its own observation, ignoring the shared supplier)."),
    metrics=REPLENISHMENT.metrics,
    gap_reference="s_S",
    protocol_size=EvalSize(tasks=128, tries=1, seeds=(0,)),
    references=_MW_REFS,
    budgets={
        # 3 warehouses: 20 iterations of 16 scenarios x 3 warehouses, sized like the seasonal scenario's
        "standard": Budget(_MW_REFS, {"hpo": 20, "ppo": 20}, overrides=_MW_STD, user_iterations=20,
                           train_seeds=STANDARD_TRAIN_SEEDS),
        # references and the shipped checkpoints live (a demo training would cost > 20 s)
        "quick": Budget(_MW_REFS, tasks=16, user_iterations=3),
        "tiny": Budget(_MW_REFS, {"hpo": 1}, tasks=2, user_iterations=1, overrides=_MW_STD),
    },
)

#: every shipped env, in registration (and leaderboard) order
SHIPPED: tuple[EnvRecord, ...] = (SHOPPING, PROACTIVE_REC, TWO_STAGE_RETRIEVAL, REPLENISHMENT, MULTI_WAREHOUSE)
