"""`ShoppingEnv`: a multi-turn shopping assistant with a simulated customer."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from shopsim.catalog import Catalog, Product
from shopsim.configs import checked_options
from shopsim.envs.shopping import render
from shopsim.envs.shopping.actions import DEFAULT_MAX_INPUT_CHARS, Action, ActionError, parse
from shopsim.envs.shopping.cache import product as _product
from shopsim.envs.shopping.cache import row as _row
from shopsim.envs.shopping.cache import search as _search
from shopsim.envs.shopping.cache import search_priced, split_price
from shopsim.envs.shopping.customer import Customer
from shopsim.envs.shopping.grading import MAX_CART_LINES, score_bundle, score_purchase
from shopsim.envs.shopping.orders import OrderDB, ToolError, apply_gold
from shopsim.envs.shopping.tasks import (
    ALL_FAMILIES,
    ENV_ID,
    FAMILIES,
    INSTRUCTION_STYLES,
    SPLITS,
    Task,
    make_task,
    split_ids,
    split_of,
)
from shopsim.envs.shopping.tools import TOOLS, Tool, system_prompt, tool_schemas
from shopsim.errors import ConfigError

ACTION_CHARSET = "".join(chr(c) for c in range(32, 127))
MAX_OBS_CHARS = 20_000
OBS_MODES = ("compact", "full", "terse")
#: loose: partial credit (WebShop); strict: all-or-nothing, 1 only when every constraint holds (ShopSimulator)
REWARD_SCHEMES = ("loose", "strict")
STRATEGIES = {
    "recommend_directly": "Recommend and buy directly; ask the customer only if something is unclear.",
    "ask_first": "Ask the customer a question before you search.",
    "confirm_before_buying": "Tell the customer what you are about to buy (answer[...]) before buying.",
    "broad_then_filter": "Search the product type alone first, then search again with all the details.",
    "all_in_one_query": "Put every detail of the request into one search and do not search again.",
    "compare_two": "Open two candidate products before you buy one.",
}


class ShoppingEnv(gym.Env):
    """
    ## Description
    A shopping assistant serves a simulated customer on a seeded synthetic catalog (`shopsim.catalog`): it searches
    (BM25), opens products, chooses options, asks clarifying questions, fills a cart and checks out, or handles an
    after-sales request on the customer's order database. Four task families in the default mix (`tasks.FAMILIES`):
    find_and_buy (WebShop-like), clarify_and_buy (hidden constraints revealed by asking), bundle (2-4 items under a
    budget, the long-horizon family) and after_sales (tau-bench-like cancel/return/exchange under a written policy);
    a fifth, personalized_buy, is chosen by name (`tasks.ALL_FAMILIES`): the instruction names the product type and
    its must-have features, and the brand, options and price ceiling come from the customer's profile and purchase
    history (`profiles`), which the first observation shows and the tools ``get_profile`` / ``get_orders`` return.

    ## Action Space
    `Text(max_length=max_input_chars)`: one action string per step, either the WebShop-compatible text grammar
    (``search[query]``, ``click[target]``, ``ask[...]``, ``answer[...]``, ``buy``, ``checkout``, after-sales tools...)
    or a JSON tool call ``{"name": ..., "arguments": {...}}`` (`shopsim.envs.shopping.actions`). The tools are one
    table, ``env.tools`` (a copy of `shopsim.envs.shopping.tools.TOOLS`; `register_tool` adds one to this env), and
    ``env.tool_schemas`` is its OpenAI-style function list. Anything that does not parse, whose arguments do not fit the
    tool's schema, or that does not apply to the current page is an *invalid action*: ``info["invalid_action"]`` holds
    the reason, the observation says it, the reward is ``-invalid_penalty`` and the episode continues;
    ``info["invalid_kind"]`` says whether the action did not parse (``"parse"``: unknown action, malformed JSON,
    wrong argument count) or parsed but the tool call failed (``"tool"``: not applicable here, bad argument value),
    None for a valid action.

    ## Observation Space
    `Text(max_length=20000, charset=printable ASCII + newline)`: the page rendered as text (`render`): compact
    (about 400 tokens or fewer; instruction, page, last feedback) or full. ``info`` carries ``valid_actions`` (text
    forms; entries ending in ``[...]`` are templates), ``structured`` (a JSON view of the page), ``anchor`` (a state
    key without history, for anchor-state grouping) and ``oracle`` (the hidden goal: privileged, for scripted
    experts only).

    ## Rewards
    Zero until the episode ends (minus ``invalid_penalty`` per invalid action). At the end: find_and_buy and
    clarify_and_buy use WebShop's partial credit (`grading.score_purchase`); bundle the mean item score times budget
    satisfied (`grading.score_bundle`); with ``reward_scheme="strict"`` every purchase scores 1 only when every
    constraint holds (the loose score is 1) and 0 otherwise (``reward_parts["loose_score"]`` keeps the partial
    credit); checkout of several lines in a one-item family scores the best line divided by
    the number of lines; after_sales 1 if the final order database equals the gold one, the agent opened the request's
    order and answered the customer (`orders.grade`). ``info["score"]`` is that number, ``info["success"]`` is
    ``score == 1``; ``info["reward_parts"]`` has the components. At every episode end ``info["episode_metrics"]``
    has success, score, turns, invalid_actions, questions, turns/chars before the first answer and side-effect counts
    (purchased, wrong_purchase, customer_left; after_sales: writes, wrong_write).

    ## Starting State
    ``reset(options={"split": "train"|"dev"|"test", "task_id": int, "family": str, "strategy": str})`` (the split
    defaults to the one the task id belongs to, else "train"; unknown keys are ignored). The task is a
    pure function of (family, task id, catalog); without ``task_id`` one is drawn from the split with `np_random`;
    without a family the constructor's family is used, else the default mix (family = ``FAMILIES[task_id % 4]``).
    The reset seed only drives the customer's phrasing. The agent starts on the search page.

    ## Episode End
    Terminated on ``buy``/``click[buy now]``, ``checkout``, ``finish``, or when the customer runs out of patience
    (``info["end_reason"]``). Truncated after ``max_invalid`` consecutive invalid actions or after ``max_turns``
    steps (default 60, the registered ``max_episode_steps``). The env truncates itself so that
    ``info["episode_metrics"]`` is present at every episode end; to shorten episodes pass ``max_turns=N`` (a smaller
    ``max_episode_steps`` given to `gymnasium.make` cuts episodes in the `TimeLimit` wrapper, which the env cannot see,
    so those cut episodes carry no ``episode_metrics``).

    ## Arguments
    ``catalog_size=10_000, catalog_seed=0`` (shared, memoised catalog and index), ``obs_mode="compact"|"full"|"terse"``
    (`render`; terse states the task once per episode and drops SKUs from result lines: the rendering for LM agents that
    keep the episode in context), ``family=None`` (default mix) or one of `ALL_FAMILIES`, ``invalid_penalty=0.0``,
    ``max_invalid=5``, ``results_per_page=10``, ``max_results=50`` (search hits kept, as WebShop),
    ``max_input_chars=1000``, ``max_turns=60``, ``render_mode=None|"ansi"``, ``customer=None|"scripted"|"lm"`` or a
    class or callable ``(task, rng)`` returning a simulated user with the `customer.Customer` interface (the plug-in
    point for other user simulators; default and "scripted": the seeded programmatic `Customer`; "lm" with
    ``customer_model=PATH``: `lm_customer.LMCustomer`, whose reveals a local causal LM words greedily, checked to
    state only the asked slot, with a scripted fallback counted in ``info["customer_fallbacks"]``),
    ``customer_model=None``, ``numbered_results=False`` (prefix each result line with its position on the page,
    ``#3 [SKU] ...``, so that a small LM can click it as ``click[#3]``
    instead of copying a 10-character SKU; positional clicks are accepted either way), ``order_refs="id"|"position"``
    (after-sales pages: position shows orders, order items and after-sales result lines as ``#k`` instead of their
    order ids and SKUs, for agents that name them by position; the tools take ``#k`` either way, `orders`),
    ``task_reminder=False`` (terse mode: the observation after each cart change states the task line again, so an
    agent that keeps the episode in context finds a multi-item request near where it writes the next search;
    the other modes state the task on every page anyway),
    ``style_bias=0.0`` (see
    Rewards), ``reward_scheme="loose"|"strict"`` (see Rewards), ``instruction_style="template"|"paraphrase"``
    (template: WebShop-style lines stating every value verbatim; paraphrase: a seeded rewording with synonyms,
    numeric forms and reordering, `paraphrase`; the goal, hidden slots and grading are the same),
    ``near_duplicates=0`` (k = 2..5: the catalog gains, for one product in five, k - 1 siblings that differ from it
    in one attribute, option or price, `shopsim.catalog.near_duplicates`; targets are drawn among those cluster
    heads and every goal names what tells a cluster apart, so the first plausible hit is often wrong).

    ## Vector envs
    Copies in one process share the memoised catalog, its search index and the read caches (`cache`); pickling an
    env leaves the catalog out and re-attaches it on load. `gymnasium.vector.AsyncVectorEnv` needs
    ``shared_memory=False`` (Text observations do not fit its fixed-width shared buffers); `SyncVectorEnv` works as is.

    ## Version History
    * v0: initial version.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 1}
    #: options that change only the rendering (`shopsim.envs.presentation_kwargs`): an agent evaluated on the
    #: leaderboard may use the ones it was trained with
    PRESENTATION_KWARGS = frozenset({"numbered_results", "results_per_page", "obs_mode", "order_refs",
                                     "task_reminder"})

    @checked_options(ENV_ID)
    def __init__(self, catalog_size: int = 10_000, catalog_seed: int = 0, obs_mode: str = "compact",
                 family: str | None = None, invalid_penalty: float = 0.0, max_invalid: int = 5,
                 results_per_page: int = 10, max_results: int = 50, max_input_chars: int = DEFAULT_MAX_INPUT_CHARS,
                 max_turns: int = 60, render_mode: str | None = None, customer=None,
                 numbered_results: bool = False, style_bias: float = 0.0, reward_scheme: str = "loose",
                 instruction_style: str = "template", near_duplicates: int = 0, customer_model: str | None = None,
                 order_refs: str = "id", task_reminder: bool = False):
        if obs_mode not in OBS_MODES:
            raise ConfigError(f"obs_mode={obs_mode!r}; choose one of {', '.join(OBS_MODES)}")
        if family is not None and family not in ALL_FAMILIES:
            raise ConfigError(f"family={family!r}; choose one of {', '.join(ALL_FAMILIES)} or None (default mix)")
        for name, v, lo in (("max_invalid", max_invalid, 1), ("results_per_page", results_per_page, 1),
                            ("max_results", max_results, 1), ("max_input_chars", max_input_chars, 16),
                            ("max_turns", max_turns, 1)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
                raise ConfigError(f"{name} must be an integer >= {lo}, got {v!r}")
        if not np.isfinite(invalid_penalty) or invalid_penalty < 0:
            raise ConfigError(f"invalid_penalty must be a finite number >= 0, got {invalid_penalty!r}")
        if isinstance(style_bias, bool) or not isinstance(style_bias, (int, float)) or not np.isfinite(style_bias):
            raise ConfigError(f"style_bias must be a finite number (0 turns it off), got {style_bias!r}")
        if reward_scheme not in REWARD_SCHEMES:
            raise ConfigError(f"reward_scheme={reward_scheme!r}; choose one of {', '.join(REWARD_SCHEMES)}")
        if instruction_style not in INSTRUCTION_STYLES:
            raise ConfigError(f"instruction_style={instruction_style!r}; choose one of {', '.join(INSTRUCTION_STYLES)}")
        if near_duplicates != 0:
            from shopsim.catalog.near_duplicates import MAX_CLUSTER

            if isinstance(near_duplicates, bool) or not isinstance(near_duplicates, (int, np.integer)) or \
                    not 2 <= near_duplicates <= MAX_CLUSTER:
                raise ConfigError(f"near_duplicates={near_duplicates!r}: give the cluster size 2..{MAX_CLUSTER} "
                                  "(head + siblings), or 0 for the plain catalog")
        if render_mode not in (None, "ansi"):
            raise ConfigError(f"render_mode={render_mode!r}; choose None or 'ansi'")
        if order_refs not in ("id", "position"):
            raise ConfigError(f"order_refs={order_refs!r}; choose 'id' (order ids and SKUs) or 'position' (#k)")
        self.order_refs = order_refs
        self.task_reminder = bool(task_reminder)
        self.catalog_size, self.catalog_seed = int(catalog_size), int(catalog_seed)
        self.obs_mode, self.family = obs_mode, family
        self.invalid_penalty, self.max_invalid = float(invalid_penalty), int(max_invalid)
        self.results_per_page, self.max_results = int(results_per_page), int(max_results)
        self.max_input_chars, self.max_turns, self.render_mode = int(max_input_chars), int(max_turns), render_mode
        if customer == "lm":
            if not customer_model:
                raise ConfigError('customer="lm" needs customer_model=PATH, a local causal LM checkpoint folder')
            from functools import partial

            from shopsim.envs.shopping.lm_customer import LMCustomer, hf_generator

            customer = partial(LMCustomer, generate=hf_generator(customer_model))
        elif customer_model is not None:
            raise ConfigError('customer_model is only used with customer="lm"')
        elif customer == "scripted":
            customer = None
        if customer is not None and not callable(customer):
            raise ConfigError("customer must be 'scripted', 'lm' (with customer_model=PATH) or a class or callable "
                              "(task, rng) -> customer; see shopsim.envs.shopping.customer for the protocol")
        # (task, rng) -> a customer object (the duck-typed protocol in shopsim.envs.shopping.customer)
        self.customer_factory: Callable[[Task, np.random.Generator], Any] = customer or Customer
        self.numbered_results = bool(numbered_results)
        self.style_bias = float(style_bias)
        self.reward_scheme, self.instruction_style = reward_scheme, instruction_style
        self.near_duplicates = int(near_duplicates)
        self._catalog_ref = {"size": self.catalog_size, "seed": self.catalog_seed}
        if self.near_duplicates:
            self._catalog_ref["near_duplicates"] = self.near_duplicates
        self._attach_catalog()
        self.action_space = spaces.Text(max_length=self.max_input_chars, min_length=0, charset=ACTION_CHARSET)
        self.observation_space = spaces.Text(max_length=MAX_OBS_CHARS, min_length=1, charset=render.OBS_CHARSET)
        self.tools: dict[str, Tool] = dict(TOOLS)
        self.tool_schemas = tool_schemas(self.tools)
        self.task: Task | None = None  # the episode's task: set by reset()

    def system_prompt(self, form: str = "text") -> str:
        """How to act here, as a system prompt for a chat model (`tools.system_prompt` over this env's tools):
        ``"text"`` writes out the text grammar, ``"tools"`` is for chat templates that take ``tool_schemas``."""
        return system_prompt(self.tools, form)

    def register_tool(self, tool: Tool, replace: bool = False) -> None:
        """Add `tool` to this env's table (both action forms, dispatch and ``tool_schemas`` follow from it).

        A name already in the table raises `ConfigError` unless ``replace=True``."""
        if not isinstance(tool, Tool):
            raise ConfigError(f"register_tool takes a shopsim.envs.shopping.tools.Tool, got {type(tool).__name__}")
        if tool.name in self.tools and not replace:
            raise ConfigError(f"tool {tool.name!r} already exists; pass replace=True to replace it")
        self.tools = {**self.tools, tool.name: tool}
        self.tool_schemas = tool_schemas(self.tools)

    # ---- catalog sharing / pickling ----------------------------------------------------------------------
    def _attach_catalog(self) -> None:
        from shopsim.catalog import load_catalog

        self.catalog: Catalog
        if getattr(self, "near_duplicates", 0):
            from shopsim.catalog.near_duplicates import load_near_duplicates

            self.catalog = load_near_duplicates(self.catalog_size, self.catalog_seed, self.near_duplicates)
        else:
            self.catalog = load_catalog(self.catalog_size, self.catalog_seed)  # memoised: shared by every copy
        self.index = self.catalog.index()

    def __getstate__(self):
        state = self.__dict__.copy()
        for k in ("catalog", "index"):
            state.pop(k, None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._attach_catalog()

    def _title(self, pid) -> str:
        return _row(self.catalog, int(pid))[1]

    def _sku(self, pid) -> str:
        return _row(self.catalog, int(pid))[0]

    def _rating(self, pid) -> str:
        return f"{self.catalog.column('rating')[int(pid)].as_py():.1f} stars"

    # ---- gymnasium API -----------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        options = dict(options or {})
        task_id = options.get("task_id")
        if task_id is not None:
            try:
                task_id = int(task_id)
            except (TypeError, ValueError):
                raise ConfigError(f"reset option task_id must be an integer, got {task_id!r}") from None
        split = options.get("split") or (split_of(task_id) if task_id is not None else None) or "train"
        if split not in SPLITS:
            raise ConfigError(f"reset option split={split!r}; choose one of {', '.join(SPLITS)}")
        if task_id is None:
            ids = split_ids(split)
            task_id = ids[int(self.np_random.integers(len(ids)))]
        family = options.get("family") or self.family or FAMILIES[int(task_id) % len(FAMILIES)]
        strategy = options.get("strategy")
        if strategy is not None and not isinstance(strategy, str):
            raise ConfigError(f"reset option strategy must be a string, got {type(strategy).__name__}")
        self.task = make_task(self.catalog, family, split, int(task_id), self.instruction_style)
        self.strategy = strategy or None
        self.strategy_text = STRATEGIES.get(strategy, strategy) if strategy else ""
        self.customer = self.customer_factory(self.task, self.np_random)
        orders = self.task.orders
        self.db: OrderDB | None = orders.copy() if orders is not None else None
        self._gold: OrderDB | None = apply_gold(orders, self.task.request, self.catalog) if orders is not None else None
        self.page = "search"
        self.history: list[tuple] = []  # the pages `back` returns to: see _goto
        self.query, self.page_num = "", 0
        self.hits: Sequence[int] = []  # product ids: search() returns shared tuples
        self._rows_key: tuple[Sequence[int], int] | None = None
        self._rows: list[tuple[int, str, str, float]] = []
        self.product: Product | None = None  # the open item page's product
        self.selected: dict[str, str] = {}
        self._option_owner: dict[str, str | None] = {}
        self.cart: list[tuple[int, dict]] = []
        self.order_id: str | None = None
        self.feedback: list[str] = []
        self.turns = self.invalid_total = self.invalid_run = 0
        self.cart_changed = False
        self.first_answer_turn, self.chars_before_answer = None, 0
        self.answered = False
        self.viewed: set[str] = set()  # the order ids get_order opened
        self.done, self.score = False, 0.0
        self.end_reason: str | None = None
        self.parts: dict = {}
        return self._obs(), self._info(None)

    def step(self, action):
        if self.task is None:
            raise RuntimeError("call reset() before step()")
        if self.done:
            raise RuntimeError("the episode has ended; call reset()")
        self.turns += 1
        self.feedback = []
        self.cart_changed = False
        invalid, invalid_kind, reward = None, None, 0.0
        text = action if isinstance(action, str) else repr(action)
        # a parse failure (format) and a failed tool call (execution) are told apart in info["invalid_kind"]
        try:
            act = parse(action, self.max_input_chars, self.tools)
        except ActionError as exc:
            invalid, invalid_kind = str(exc), "parse"
        else:
            try:
                self._dispatch(act)
            except (ActionError, ToolError) as exc:
                invalid, invalid_kind = str(exc), "tool"
        if self.first_answer_turn is None:
            self.chars_before_answer += len(text)
        truncated = False
        if invalid is not None:
            self.invalid_total += 1
            self.invalid_run += 1
            reward -= self.invalid_penalty
            self.feedback = [f"Invalid action: {invalid}."]
            if self.invalid_run >= self.max_invalid:
                truncated, self.end_reason = True, "too_many_invalid"
        else:
            self.invalid_run = 0
        terminated = self.done
        if terminated:
            reward += self.score
        elif not truncated and self.turns >= self.max_turns:
            truncated, self.end_reason = True, "turn_limit"
        self.done = terminated or truncated
        style_bonus = 0.0
        if self.done and self.style_bias and self.customer.questions == 0:
            # a deliberately style-biased reward (ARC's check): episodes that never asked the customer get a bonus
            style_bonus = self.style_bias
            reward += style_bonus
        info = self._info(invalid)
        info["invalid_kind"] = invalid_kind
        if self.done:
            info["style_bonus"] = style_bonus
            info["episode_metrics"] = {
                "success": float(self.score >= 1.0 - 1e-9), "score": float(self.score), "turns": float(self.turns),
                "invalid_actions": float(self.invalid_total), "questions": float(self.customer.questions),
                "turns_before_first_answer": float(info["turns_before_first_answer"]),
                "chars_before_first_answer": float(info["chars_before_first_answer"]),
                **self._side_effects()}
        return self._obs(), float(reward), bool(terminated), bool(truncated), info

    def render(self):
        if self.render_mode == "ansi":
            return render.observation(self) if self.task is not None else ""
        return None

    def close(self):
        pass

    # ---- helpers -----------------------------------------------------------------------------------------

    def _obs(self) -> str:
        return render.observation(self)

    def _info(self, invalid: str | None) -> dict:
        t = self.task
        assert t is not None  # called from reset() and step() only
        return {
            "valid_actions": self._valid_actions(), "invalid_action": invalid,
            "success": bool(self.done and self.score >= 1.0 - 1e-9), "score": float(self.score),
            "family": t.family, "task_id": int(t.task_id), "split": t.split, "strategy": self.strategy,
            "reward_parts": dict(self.parts), "structured": render.structured(self),
            "oracle": {**t.oracle(), "catalog": dict(self._catalog_ref)},
            "anchor": render.anchor(self), "end_reason": self.end_reason, "patience": self.customer.patience,
            "turns_before_first_answer": self.first_answer_turn if self.first_answer_turn is not None else self.turns,
            "chars_before_first_answer": self.chars_before_answer,
            # an LM customer (customer="lm") reports how often its answer was replaced by the scripted one
            **({"customer_fallbacks": self.customer.fallbacks, "customer_lm_replies": self.customer.lm_replies}
               if hasattr(self.customer, "fallbacks") else {}),
        }

    def _valid_actions(self) -> list[str]:
        """`render.valid_actions`, then the ``hint`` of each tool that has one and applies to this task."""
        out = render.valid_actions(self)
        for tool in self.tools.values():
            if tool.hint is not None and (tool.available is None or tool.available(self)):
                out += tool.hint(self)
        return out

    def page_ids(self) -> Sequence[int]:
        start = self.page_num * self.results_per_page
        return self.hits[start:start + self.results_per_page]

    def page_rows(self) -> list[tuple[int, str, str, float]]:
        """(product id, sku, title, price) of the results on the current page (memoised per page)."""
        # the key holds the hits object itself (compared with `is`): an id() could be reused after garbage collection
        key = (self.hits, self.page_num)
        if self._rows_key is None or self._rows_key[0] is not self.hits or self._rows_key[1] != self.page_num:
            self._rows = [(pid, *_row(self.catalog, pid), float(self.catalog.prices[pid])) for pid in self.page_ids()]
            self._rows_key = key
        return self._rows

    def cart_total(self) -> float:
        return float(sum(self.catalog.prices[pid] for pid, _ in self.cart))

    def _goto(self, page: str) -> None:
        self.history.append((self.page, self.query, self.hits, self.page_num, self.product, dict(self.selected),
                             self.order_id))
        del self.history[:-20]  # bounded: back goes at most 20 pages
        self.page = page

    def _restore(self) -> None:
        """Go back to the last page in the history (with its query, results, product and chosen options)."""
        (self.page, self.query, self.hits, self.page_num, self.product, self.selected,
         self.order_id) = self.history.pop()
        self._option_owner = self._owners(self.product) if self.product is not None else {}

    def _side_effects(self) -> dict:
        """Side-effect metrics: wrong purchases, wrong writes, customers who gave up."""
        purchased = float(self.end_reason in ("buy", "checkout"))
        out = {"purchased": purchased, "wrong_purchase": float(purchased and self.score < 1.0 - 1e-9),
               "customer_left": float(self.end_reason == "customer_left")}
        if self.db is not None:
            out["writes"] = float(len(self.db.writes))
            assert self._gold is not None  # reset() sets both or neither
            out["wrong_write"] = float(bool(self.db.writes) and self.db.state_key() != self._gold.state_key())
        return out

    def _finish(self, score: float, parts: dict, reason: str) -> None:
        self.done, self.score, self.parts, self.end_reason = True, float(score), parts, reason

    # ---- actions -----------------------------------------------------------------------------------------
    def _dispatch(self, act: Action) -> None:
        """Run a parsed action through its `Tool`: availability for this task, then the handler."""
        tool = self.tools[act.name]
        if tool.available is not None and not tool.available(self):
            raise ActionError(tool.unavailable.format(name=tool.name))
        result = tool.handler(self, **dict(zip(tool.arg_names, act.args, strict=True)))
        if result is not None:
            self.feedback.append(result)

    def _search(self, query: str) -> None:
        keywords, ceiling = split_price(query)
        # shared, immutable tuples; a price clause ("price lower than 20.00 dollars") filters instead of matching
        hits = (_search(self.index, query, self.max_results) if ceiling is None
                else search_priced(self.index, self.catalog, keywords, ceiling, self.max_results))
        self._goto("results")
        self.query, self.hits, self.page_num = query, hits, 0
        if not self.hits:
            self.feedback.append("No results; try other keywords.")

    def _owners(self, product) -> dict:
        owners: dict[str, str | None] = {}
        for n, vals in product.options.items():
            for v in vals:
                owners[v.lower()] = n if v.lower() not in owners else None
        return owners

    def _click(self, target: str) -> None:
        t = " ".join(target.lower().split())
        page = self.page
        if t == "back to search" and page != "search":
            self._goto("search")
            return
        if page == "results":
            if t == "next >" and (self.page_num + 1) * self.results_per_page < len(self.hits):
                self.page_num += 1
                return
            if t == "< prev" and self.page_num > 0:
                self.page_num -= 1
                return
            rows = self.page_rows()
            for pid, sku, _, _ in rows:
                if sku.lower() == t:
                    self._open(pid)
                    return
            pos = t[1:] if t.startswith("#") else t  # positional reference: click[#3] / click[3] = 3rd result shown
            if pos.isdigit() and 1 <= int(pos) <= len(rows):
                self._open(rows[int(pos) - 1][0])
                return
        elif page == "item":
            if t == "< prev":
                while self.history and self.history[-1][0] == "item":
                    self.history.pop()
                if self.history:
                    self._restore()
                    return
            assert self.product is not None and self.task is not None  # the item page shows a product
            if t == "description":
                self.feedback.append("Description: " + self.product.description)
                return
            if t in ("buy now", "add to cart") and self.task.family != "after_sales":
                self._cart_action("buy" if t == "buy now" else "add_to_cart", ())
                return
            if self._select_option(t):
                return
        elif page == "cart" and t == "checkout" and self.cart:
            self._cart_action("checkout", ())
            return
        clickable = [b for b in render.buttons(self)]
        raise ActionError(f"cannot click {target[:40]!r} on the {page} page" +
                          (f" (buttons: {', '.join(clickable)})" if clickable else ""))

    def _open(self, pid: int) -> None:
        self._goto("item")
        self.product = _product(self.catalog, pid)
        self.selected = {}
        self._option_owner = self._owners(self.product)

    def _select_option(self, t: str) -> bool:
        assert self.product is not None  # called on the item page only
        opts = self.product.options
        name, sep, value = t.partition(":")
        if sep and name.strip() in {n.lower() for n in opts}:
            dims = [n for n in opts if n.lower() == name.strip()]
            value = value.strip()
        else:
            dims, value = list(opts), t
        for n in dims:
            for v in opts[n]:
                if v.lower() == value:
                    if not sep and self._option_owner.get(value) is None:
                        raise ActionError(f"{value!r} is offered for several options; click[<option>: {value}]")
                    self.selected[n] = v
                    self.feedback.append(f"Chose {n}: {v}.")
                    return True
        return False

    def _cart_action(self, name: str, args: tuple) -> None:
        if name in ("buy", "add_to_cart"):
            if self.page != "item":
                raise ActionError(f"{name} needs an open product page")
            assert self.product is not None  # the item page shows a product
            pid, chosen = int(self.product.product_id), dict(self.selected)
            if name == "buy":
                self._grade_purchase([(pid, chosen)], "buy")
                return
            others = [(p, c) for p, c in self.cart if p != pid]  # adding a product again replaces its line
            if len(others) >= MAX_CART_LINES:
                raise ActionError(f"the cart holds at most {MAX_CART_LINES} products")
            self.cart = [*others, (pid, chosen)]
            self.cart_changed = True
            self.feedback.append(f"Added {self.product.sku} to the cart ({len(self.cart)} items, "
                                 f"${self.cart_total():.2f}).")
        elif name == "remove_from_cart":
            sku = args[0].strip().upper()
            if not any(self._sku(p) == sku for p, _ in self.cart):
                raise ActionError(f"{args[0][:20]!r} is not in the cart")
            self.cart = [(p, c) for p, c in self.cart if self._sku(p) != sku]
            self.cart_changed = True
            self.feedback.append(f"Removed {sku} from the cart.")
        elif name == "view_cart":
            if self.page != "cart":
                self._goto("cart")
        elif name == "checkout":
            if not self.cart:
                raise ActionError("the cart is empty")
            self._grade_purchase(list(self.cart), "checkout")

    def _grade_purchase(self, lines: list[tuple[int, dict]], reason: str) -> None:
        task = self.task
        assert task is not None  # a purchase happens inside an episode
        items = [(_product(self.catalog, p), c) for p, c in lines]
        if task.family == "bundle":
            assert task.budget is not None  # bundle tasks always have a budget (tasks._bundle)
            score, parts = score_bundle(task.goals, items, task.budget)
        else:
            scored = [score_purchase(task.goals[0], p, c) for p, c in items]
            best = max(range(len(scored)), key=lambda i: scored[i][0])
            score, parts = scored[best][0] / len(items), dict(scored[best][1])
            parts["lines_bought"] = float(len(items))
        parts["purchased"] = 1.0
        if self.reward_scheme == "strict":
            # all-or-nothing: the loose score is 1 exactly when every constraint of every goal holds (and, for a
            # one-item family, a single line was bought; for a bundle, the budget holds)
            parts["loose_score"] = float(score)
            score = float(score >= 1.0 - 1e-9)
        bought = "; ".join(f"{p.sku}" + (f" ({', '.join(f'{k}={v}' for k, v in c.items())})" if c else "")
                           for p, c in items)
        self.feedback.append(f"Purchased {bought}. The episode is over.")
        self._finish(score, parts, reason)
