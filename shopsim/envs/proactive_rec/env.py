"""ProactiveRec-v0: steer a simulated user's interest toward a target item, one recommendation per step."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from shopsim.configs import checked_options
from shopsim.envs.proactive_rec.scoring import INVALID, STOP, PathScorer, RewardWeights
from shopsim.envs.proactive_rec.world import DEFAULT_CATALOG_SIZE, HISTORY_LEN, L_MAX, World, get_world
from shopsim.envs.records import PROACTIVE_REC
from shopsim.errors import ConfigError
from shopsim.splits import load_splits

ENV_ID = PROACTIVE_REC.id
SPLITS = ("train", "dev", "test")
SEQ_LEN = HISTORY_LEN + L_MAX


def load_split(name: str = ENV_ID) -> dict:
    """The split manifest of env `name` (its record's split file; `shopsim.splits`)."""
    return load_splits(name)


class ProactiveRecEnv(gym.Env):
    """
    ## Description
    Proactive recommendation after ProRL (Hou et al., arXiv 2605.28293): a user with 10 consumed items and a *target*
    item far from their interests. The agent recommends up to 10 items, one per step; each recommended item is
    appended to the user's history as if consumed, which moves the frozen user model (SASRec trained on synthetic
    sequences, or the analytic decayed-mean model; see `simulator.py`) toward or away from the target. Items come from
    the shared catalog (`shopsim.catalog.load_catalog`) and are named by 4-token semantic IDs (`semantic_ids.py`).

    ## Action Space
    `action_mode="semantic_id"` (default): `MultiDiscrete([K1 + 1, K2, K3, C])`, the item's semantic ID
    (3 residual k-means codes + collision digit). `action[0] == K1` is **EOS** (stop recommending; the other digits
    are ignored). A tuple that names no item is an *invalid* (hallucinated) item.
    `action_mode="item"`: `Discrete(n_items + 1)`, an item id; `n_items` is EOS.
    A malformed action (wrong shape, out-of-range digit) is an invalid item flagged in `info["invalid_action"]`.

    ## Observation Space
    `Dict`:
    | key | space | meaning |
    |-----|-------|---------|
    | history | MultiDiscrete([n+1]*20) | item ids consumed (10 history items, then valid recommendations); n = pad |
    | history_sid | MultiDiscrete((20, 4)) | their semantic IDs; pad digit = size of that digit |
    | path_sid | MultiDiscrete((10, 4)) | the semantic IDs the agent emitted so far (invalid ones too); padded |
    | target | Discrete(n) | the target item id |
    | target_sid | MultiDiscrete([K1, K2, K3, C]) | its semantic ID |
    | length | Discrete(11) | recommendations so far |

    ## Rewards
    Per step, raw ProRL components (in `info`): `IoI` = change in log P(target | history), `IoR` = rank improvement
    of the target (positions), `CTR` = acceptance probability of the recommended item. The reward is the raw fused sum
    `w_ctr·CTR + w_ioi·IoI + w_ior·IoR / ior_scale` (ior_scale = n_items by default: IoR as a share of the catalog).
    Invalid item: not appended, CTR = −1, IoI = `invalid_ioi` (−2), IoR = `invalid_ior` (−n/10) — fixed constants
    standing in for ProRL's batch-min rule, which needs a batch (`PathScorer(..., invalid="batch_min")` applies it).
    Duplicate item (already in the history or path): appended, IoI/IoR kept, CTR = 0. EOS: reward 0. `info["clicked"]`
    is a Bernoulli(CTR) draw from the env RNG (the only stochastic part; it does not affect the reward).

    ## Starting State
    A scenario (task id) = (10-item history from the synthetic user process, far target); a pure function of the
    catalog and the id. `reset(options={"split": s, "task_id": t})` picks it; without `task_id` one is drawn from the
    split (the record's split file, `data/splits/<Name-vN>.json`) with the env RNG.

    ## Episode End
    Terminated after EOS or after the 10th recommendation (L_max, part of the task). Never truncated.
    At the last step `info["episode_metrics"]` = {IoI (sum), IoR (sum), CTR (mean over items, invalid counted 0),
    length, invalid (share of invalid items)}; `info["success"]` = the target's rank improved; `info["score"]` = IoI.

    ## Arguments
    `catalog_size=5000`, `catalog_seed=0`, `simulator="sasrec"|"analytic"`, `action_mode="semantic_id"|"item"`,
    `w_ctr=w_ioi=w_ior=1.0`, `ior_scale=None` (n), `ctr_offset=2.0`, `invalid_ioi=-2.0`, `invalid_ior=None`
    (−n/10), `render_mode=None|"ansi"`.

    ## Version History
    * v0: initial version (before release, the synthetic user process behind the SASRec simulator was changed to
      a slow interest drift with exploratory consumption, so that IoI stays informative over ~10 steps; see
      `simulator` — cached SASRec weights are keyed by `SIM_VERSION`)
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4}

    @checked_options(ENV_ID)
    def __init__(self, catalog_size: int = DEFAULT_CATALOG_SIZE, catalog_seed: int = 0, simulator: str = "sasrec",
                 action_mode: str = "semantic_id", w_ctr: float = 1.0, w_ioi: float = 1.0, w_ior: float = 1.0,
                 ior_scale: float | None = None, ctr_offset: float = 2.0, invalid_ioi: float = -2.0,
                 invalid_ior: float | None = None, render_mode: str | None = None, world: World | None = None):
        if action_mode not in ("semantic_id", "item"):
            raise ConfigError(f"action_mode={action_mode!r}; choose 'semantic_id' or 'item'")
        if render_mode not in (None, "ansi"):
            raise ConfigError(f"render_mode={render_mode!r}; choose None or 'ansi'")
        if catalog_size < 100:
            raise ConfigError(f"catalog_size={catalog_size}; use at least 100 items")
        self.world = world or get_world(catalog_size, catalog_seed, simulator)
        self.n = self.world.n_items
        self.sids = self.world.sids
        self.scorer = PathScorer(self.world, ctr_offset=ctr_offset, invalid_ioi=invalid_ioi, invalid_ior=invalid_ior)
        self.weights = RewardWeights(w_ctr, w_ioi, w_ior, ior_scale if ior_scale is not None else float(self.n))
        self.action_mode, self.render_mode = action_mode, render_mode
        k1, k2, k3, c = self.sids.sizes
        self.eos_code = k1
        if action_mode == "semantic_id":
            self.action_space = spaces.MultiDiscrete(np.array([k1 + 1, k2, k3, c], dtype=np.int64))
        else:
            self.action_space = spaces.Discrete(self.n + 1)
        pad_sid = np.array([k1 + 1, k2 + 1, k3 + 1, c + 1], dtype=np.int64)
        self.observation_space = spaces.Dict({
            "history": spaces.MultiDiscrete(np.full(SEQ_LEN, self.n + 1, dtype=np.int64)),
            "history_sid": spaces.MultiDiscrete(np.tile(pad_sid, (SEQ_LEN, 1))),
            "path_sid": spaces.MultiDiscrete(np.tile(pad_sid, (L_MAX, 1))),
            "target": spaces.Discrete(self.n),
            "target_sid": spaces.MultiDiscrete(np.array([k1, k2, k3, c], dtype=np.int64)),
            "length": spaces.Discrete(L_MAX + 1),
        })
        self._pad_sid = pad_sid - 1
        self._split = load_split()
        self._done = True
        # the episode: set by reset(), None before the first one
        self.task_id: int | None = None
        self.hist: np.ndarray | None = None
        self.target: int | None = None

    # ------------------------------------------------------------------ gym API
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        options = options or {}
        split = options.get("split", "train")
        if split not in SPLITS:
            raise ConfigError(f"split={split!r}; choose one of {SPLITS}")
        task_id = options.get("task_id")
        if task_id is None:
            spec = self._split[split]
            if isinstance(spec, dict):
                lo, hi = spec["range"]
                task_id = int(self.np_random.integers(lo, hi))
            else:
                task_id = int(spec[self.np_random.integers(len(spec))])
        self.task_id = int(task_id)
        self.hist, self.target = self.world.task(self.task_id)
        self.path: list[int] = []  # item ids, or INVALID
        self.path_codes: list[np.ndarray] = []
        self.comps: list[tuple[float, float, float]] = []
        self._done = False
        scores = self.scorer.score(self.hist[None], [self.target], np.full((1, 1), STOP))
        self._rank0 = self._last_rank = int(scores.target_rank[0, 0])
        info = {"task_id": self.task_id, "split": split, "log_p_target": float(scores.logp_target[0, 0]),
                "target_rank": self._rank0}
        return self._obs(), info

    def step(self, action):
        if self._done:
            raise ConfigError("step() called on a finished episode; call reset() first")
        assert self.hist is not None and self.target is not None  # _done is False only after reset()
        item, codes, reason = self._parse(action)
        info: dict = {"task_id": self.task_id}
        if reason:
            info["invalid_action"] = reason
        if item == STOP:
            self._done = True
            info.update(IoI=0.0, IoR=0.0, CTR=0.0, valid=True, duplicate=False, item=-1, eos=True)
            reward = 0.0
        else:
            self.path.append(item)
            self.path_codes.append(codes)
            sc = self.scorer.score(self.hist[None], [self.target], np.array([self.path]))
            k = len(self.path) - 1
            ioi, ior, ctr = float(sc.ioi[0, k]), float(sc.ior[0, k]), float(sc.ctr[0, k])
            self.comps.append((ioi, ior, ctr))
            valid, dup = bool(sc.valid[0, k]), bool(sc.duplicate[0, k])
            reward = float(self.weights.fuse(ioi, ior, ctr))
            clicked = bool(valid and self.np_random.random() < max(ctr, 0.0))
            info.update(IoI=ioi, IoR=ior, CTR=ctr, valid=valid, duplicate=dup, item=int(item), eos=False,
                        clicked=clicked, log_p_target=float(sc.logp_target[0, k + 1]),
                        target_rank=int(sc.target_rank[0, k + 1]))
            if not valid and "invalid_action" not in info:
                info["invalid_action"] = "semantic ID names no item"
            self._done = len(self.path) >= L_MAX
            self._last_rank = int(sc.target_rank[0, k + 1])
        info["reward_components"] = {"IoI": info["IoI"], "IoR": info["IoR"], "CTR": info["CTR"]}
        if self._done:
            info.update(self._episode_end())
        return self._obs(), reward, self._done, False, info

    def render(self):
        if self.render_mode != "ansi":
            return None
        return (f"task {self.task_id}: history {self.hist.tolist()} target {self.target} "
                f"path {self.path}")

    def close(self):
        pass

    # ------------------------------------------------------------------ helpers
    def _parse(self, action) -> tuple[int, np.ndarray, str | None]:
        """-> (item id | STOP | INVALID, the emitted codes (pad for EOS), invalid reason or None)."""
        pad = self._pad_sid.copy()
        if self.action_mode == "item":
            try:
                a = int(np.asarray(action).reshape(()))
            except (TypeError, ValueError):
                return INVALID, pad, f"malformed action {action!r}: expected one int"
            if a == self.n:
                return STOP, pad, None
            if not 0 <= a < self.n:
                return INVALID, pad, f"item id {a} out of range [0, {self.n}]"
            return a, self.sids.codes[a].copy(), None
        try:
            codes = np.asarray(action, dtype=np.int64).reshape(4)
        except (TypeError, ValueError):
            return INVALID, pad, f"malformed action {action!r}: expected 4 semantic-ID digits"
        if codes[0] == self.eos_code:
            return STOP, pad, None
        item = int(self.sids.lookup(codes[None])[0])
        if item < 0:
            reason = None if self.sids.in_range(codes) else f"semantic-ID digit out of range: {codes.tolist()}"
            return INVALID, np.clip(codes, 0, self._pad_sid), reason
        return item, codes, None

    def _obs(self) -> dict:
        assert self.hist is not None and self.target is not None  # called from reset() and step() only
        seq = np.full(SEQ_LEN, self.n, dtype=np.int64)
        items = [*self.hist.tolist(), *[i for i in self.path if i >= 0]]
        seq[: len(items)] = items
        hsid = np.tile(self._pad_sid, (SEQ_LEN, 1))
        hsid[: len(items)] = self.sids.codes[items]
        psid = np.tile(self._pad_sid, (L_MAX, 1))
        if self.path_codes:
            psid[: len(self.path_codes)] = np.stack(self.path_codes)
        return {"history": seq, "history_sid": hsid, "path_sid": psid, "target": int(self.target),
                "target_sid": self.sids.codes[self.target].copy(), "length": len(self.path)}

    def _episode_end(self) -> dict:
        n_items = len(self.path)
        c = np.array(self.comps, dtype=np.float64).reshape(-1, 3)
        invalid = sum(1 for i in self.path if i == INVALID)
        metrics = {"IoI": float(c[:, 0].sum()), "IoR": float(c[:, 1].sum()),
                   "CTR": float(np.clip(c[:, 2], 0.0, None).mean()) if n_items else 0.0,
                   "length": float(n_items), "invalid": float(invalid / n_items) if n_items else 0.0}
        return {"episode_metrics": metrics, "success": bool(self._last_rank < self._rank0), "score": metrics["IoI"]}
