"""What an env record holds (`EnvRecord`), the registry of records, and the registry of leaderboard metrics.

Every shopsim env is described by one `EnvRecord`: its id, entry point, family, what it is, how the leaderboard
evaluates and ranks it, which reference agents and baselines the benchmark runs on it at each tier, its split file
and its client wrappers. The shipped envs' records are in `shopsim.envs.records`; `register_env` adds one at runtime
(docs/adding-an-env.md). Everything that needs to know something about an env reads its record (`env_record`)
instead of testing its id.

Metrics are described once, in `METRICS` (`Metric`: direction, interval kind, what it measures); a record lists the
metric names its leaderboard table shows. `register_metric` adds one.

This module imports nothing from the rest of shopsim, so that every layer can read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: `EnvRecord.api` values: a Gymnasium env (``gymnasium.make``) or a PettingZoo parallel env (``parallel_env``)
APIS = ("gymnasium", "pettingzoo")
#: `Metric.interval` values: a Wilson score interval over episodes (a rate) or a bootstrap over tasks (a mean)
INTERVALS = ("wilson", "bootstrap")
#: `Budget` tiers (`shopsim bench --tier`)
TIERS = ("standard", "quick", "tiny", "full")


# ---------------------------------------------------------------------------------------------------- metrics
@dataclass(frozen=True)
class Metric:
    """One leaderboard metric: its name in results files, which direction is better, its interval, its meaning."""

    name: str
    text: str
    """What it measures (one sentence; the leaderboard page adds the direction)."""
    lower_is_better: bool = False
    interval: str = "bootstrap"
    """``wilson`` (a success rate: Wilson interval over episodes) or ``bootstrap`` (a mean: bootstrap over tasks)."""

    def __post_init__(self) -> None:
        if self.interval not in INTERVALS:
            raise ValueError(f"metric {self.name}: interval must be one of {', '.join(INTERVALS)}, "
                             f"got {self.interval!r}")


#: metric name -> its description. Families of names (``success/<family>``, ``pass^<k>``, ``cost/<agent>``) are
#: described by `metric` from their prefix.
METRICS: dict[str, Metric] = {m.name: m for m in (
    Metric("success", "share of episodes the env grades a success.", interval="wilson"),
    Metric("success_rate", "share of episodes the env grades a success.", interval="wilson"),
    Metric("score", "the env's episode score (Shopping: the purchase grade in [0, 1], partial credit for near "
                    "misses)."),
    Metric("return", "sum of rewards over the episode."),
    Metric("turns", "actions per episode.", lower_is_better=True),
    Metric("tokens", "tokens the language agent generated per episode.", lower_is_better=True),
    Metric("invalid_rate", "share of actions the env rejected as invalid (unparsable, or a tool call that failed).",
           lower_is_better=True),
    Metric("IoI", "Increase of Interest: the rise of log P(target | history) over the episode (ProRL)."),
    Metric("IoR", "Increase of Rank: how many positions the target item rose in the user's ranking (ProRL)."),
    Metric("CTR", "mean probability that the user accepts a recommended item."),
    Metric("length", "items recommended before stopping (at most 10); very short paths mean a collapsed policy."),
    Metric("policy_value", "expected reward of the items the ranker shows from the retrieved candidates (without "
                           "noise)."),
    Metric("regret", "value of the best candidate set minus the policy value.", lower_is_better=True),
    Metric("recall", "share of the best K items (by true relevance) among the retrieved candidates."),
    Metric("cost", "holding, backlog and fixed ordering cost of an episode after the warm-up periods.",
           lower_is_better=True),
    Metric("gap_to_s_S_pct", "cost relative to the (s, S) policy on the same episodes, in % (0 = equal, −10 = 10% "
                             "cheaper).", lower_is_better=True),
    Metric("fill_rate", "share of demand served from stock."),
    Metric("order_rate", "share of (SKU, period) pairs with an order."),
)}


def register_metric(metric: Metric) -> Metric:
    """Add `metric` to `METRICS` (replacing one of the same name) and return it."""
    METRICS[metric.name] = metric
    return metric


def metric(name: str) -> Metric | None:
    """The description of metric `name`: its `METRICS` entry, else one derived from its prefix (``success/<family>``:
    a family's success rate; ``pass^<k>``: τ-bench's pass^k; ``cost/<agent>``: one agent's cost), else None."""
    if name in METRICS:
        return METRICS[name]
    head, _, tail = name.partition("/")
    if head == "success" and tail:
        return Metric(name, f"success rate on the tasks of the {tail} family.", interval="wilson")
    if head == "cost" and tail:
        return Metric(name, f"the cost of {tail} alone (the total cost is the sum over agents).",
                      lower_is_better=True)
    if name.startswith("pass^"):
        k = name[5:]
        return Metric(name, f"probability that all {k} tries of a task succeed (τ-bench's pass^k, the mean over "
                            f"tasks of C(c, {k}) / C(n, {k})); it falls with k unless the agent is consistent.")
    return None


def lower_is_better(name: str) -> bool:
    """Whether a lower value of metric `name` is better (unknown metrics: higher is better)."""
    m = metric(name)
    return m is not None and m.lower_is_better


def is_rate(name: str) -> bool:
    """Whether metric `name` is a success rate, summarised with a Wilson interval over episodes."""
    m = metric(name)
    return m is not None and m.interval == "wilson"


#: table columns of an env whose record names none
DEFAULT_METRICS: tuple[str, ...] = ("success_rate", "score", "return", "pass^1", "pass^4", "turns")


# ---------------------------------------------------------------------------------------------------- budgets
@dataclass(frozen=True)
class Budget:
    """What one env gets in one benchmark tier (`shopsim.app.bench`)."""

    references: tuple[str, ...] = ("expert", "random")
    """Agent names (`agents.make`) evaluated as reference rows."""
    algos: dict[str, int] = field(default_factory=dict)
    """Baselines trained on the env: algorithm name -> training iterations."""
    overrides: dict[str, dict] = field(default_factory=dict)
    """Config overrides per algorithm name (small models / batches for the quick run)."""
    user_iterations: int = 10
    """Iterations for classes given with --algo."""
    tasks: int | None = None
    """Use the first `tasks` test tasks (None: all)."""
    seeds: int | None = None
    """Use the first `seeds` eval seeds (None: all)."""
    tries: int | None = None
    """Tries per task and seed (None: the protocol's; pass^k needs >= k)."""
    num_envs: int | None = None
    """Env copies an evaluation steps together (None: the agent's evaluation batch, `evaluate.eval_num_envs`)."""
    train_seeds: int = 1
    """Independent training runs per baseline (seeds train_seed, train_seed+1, ...). With more than one, a trained
    entry's intervals are over training seeds (each run's metrics averaged over the eval seeds first)."""
    needs_init: bool = False
    """Trainers start from the shipped SFT checkpoint (LM envs); skipped when there is none."""
    demo: bool = False
    """The trained rows are short live demos (``demo-<algo>``), shown apart from the shipped standard rows."""
    imported: tuple[str, ...] = ()
    """Trained rows this tier shows but never trains: another command trains them and writes their results files
    with `shopsim.app.bench.import_trained` (the Shopping rows come from the learning benchmark's runs). The tier
    renders the recorded file and says which command writes it when there is none."""
    imported_by: str = ""
    """The command that trains and writes the `imported` rows."""
    live_checkpoints: tuple[str, ...] | None = None
    """The shipped trained entries whose checkpoint this tier re-evaluates live (None: every one). The main job
    checks one LM checkpoint, since each costs an LM evaluation of the whole protocol; ``--tier standard`` on the
    env reproduces them all."""


# ---------------------------------------------------------------------------------------------------- records
@dataclass(frozen=True)
class EvalSize:
    """The default evaluation size of an env: the first `tasks` test (or dev) tasks, `tries` per task, these eval
    seeds (None: the split file's)."""

    tasks: int | None = None
    tries: int | None = None
    seeds: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Scenario:
    """A further leaderboard section of an env: the env built with `env_kwargs`, its own protocol (the options
    are part of the protocol hash), table, results folder (``<Env-vN>_<name>/``) and key (``<env id>:<name>``)."""

    env_kwargs: dict
    description: str = ""
    """The paragraph above its table (empty: the env's)."""
    budgets: dict[str, Budget] = field(default_factory=dict)
    """Tier -> its benchmark budget (a tier without one uses the env's)."""


@dataclass(frozen=True)
class EnvRecord:
    """Everything shopsim knows about one env, in one place (module docstring; docs/adding-an-env.md)."""

    id: str
    """The env id, ``<namespace>/<Name>-v<N>``."""
    entry_point: str
    """``"module:Class"`` for a Gymnasium env; the module with ``parallel_env(**kwargs)`` for a PettingZoo env."""
    family: str
    """The kind of agent and trainer that fits it (`agents.make` and `baselines.make` look agents up by family)."""
    description: str
    """What the env is and what its leaderboard measures (the paragraph above its table)."""
    api: str = "gymnasium"
    """``gymnasium`` or ``pettingzoo`` (a multi-agent parallel env, not in Gymnasium's registry)."""
    register_kwargs: dict = field(default_factory=dict)
    """Options of ``gymnasium.register`` (e.g. ``max_episode_steps``)."""
    metrics: tuple[str, ...] = DEFAULT_METRICS
    """The leaderboard table's columns (`METRICS` names), the first sorting the table."""
    gap_reference: str | None = None
    """The reference agent whose cost on the same episodes every row's gap is measured against (None: no gap)."""
    protocol_size: EvalSize | None = None
    """The default evaluation size (None: the whole split)."""
    references: tuple[str, ...] = ("expert", "random")
    """Reference agents (`agents.make` names): the leaderboard's reference rows."""
    budgets: dict[str, Budget] = field(default_factory=dict)
    """Tier (`TIERS`) -> what ``shopsim bench`` runs on it (a tier without one uses the app's default)."""
    scenarios: dict[str, Scenario] = field(default_factory=dict)
    """Further leaderboard sections: name -> `Scenario`."""
    split_file: str = ""
    """The split manifest under the data folder (default ``splits/<Name-vN>.json``)."""
    sb3_wrapper: str | None = None
    """``"module:function"`` that makes the env for Stable-Baselines3 / CleanRL (`shopsim.wrappers.make_sb3_env`);
    None: it has no SB3 form."""
    text: bool = False
    """Observations and actions are text: language-model agents act in it, and TRL and OpenEnv serve it."""
    test_kwargs: dict = field(default_factory=dict)
    """Constructor options that build the same tasks quickly, for the conformance test."""

    def __post_init__(self) -> None:
        if self.api not in APIS:
            raise ValueError(f"{self.id}: api must be one of {', '.join(APIS)}, got {self.api!r}")
        unknown = sorted(set(self.budgets) - set(TIERS))
        for scenario in self.scenarios.values():
            unknown += sorted(set(scenario.budgets) - set(TIERS))
        if unknown:
            raise ValueError(f"{self.id}: unknown budget tier(s) {', '.join(unknown)}; choose from {', '.join(TIERS)}")
        if not self.split_file:
            object.__setattr__(self, "split_file", f"splits/{self.name}.json")

    @property
    def name(self) -> str:
        """The id without its namespace (``Name-vN``): the results folder and the page's tab."""
        return self.id.split("/")[-1]

    @property
    def multi_agent(self) -> bool:
        """Whether it is a PettingZoo (multi-agent) env."""
        return self.api == "pettingzoo"


#: env id -> its record, in registration order (the leaderboard's table order)
RECORDS: dict[str, EnvRecord] = {}


def add_record(record: EnvRecord) -> EnvRecord:
    """Put `record` in `RECORDS` (replacing one of the same id) and return it; `shopsim.envs.register_env` also
    registers it with Gymnasium."""
    RECORDS[record.id] = record
    return record


def find_record(env_id: str) -> EnvRecord | None:
    """The record of `env_id` (an id, or its ``Name-vN`` without the namespace), or None."""
    if env_id in RECORDS:
        return RECORDS[env_id]
    return next((r for r in RECORDS.values() if r.name == env_id), None)


def records_of_family(family: str) -> list[EnvRecord]:
    """The records of `family`, in registration order."""
    return [r for r in RECORDS.values() if r.family == family]


def table_metrics(env_id: str, family: str | None = None) -> tuple[str, ...]:
    """The table columns of `env_id`: its record's, else those of the first record of `family`, else
    `DEFAULT_METRICS`."""
    rec = find_record(env_id)
    if rec is None and family:
        rec = next(iter(records_of_family(family)), None)
    return rec.metrics if rec is not None else DEFAULT_METRICS


def text_env_ids() -> list[str]:
    """Ids of the envs with text observations and actions (`EnvRecord.text`)."""
    return [r.id for r in RECORDS.values() if r.text]
