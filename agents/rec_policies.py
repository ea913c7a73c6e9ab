"""Agents for the proactive-recommendation env: the greedy simulator expert, a random recommender, and the
semantic-ID policy.

* `GreedyRecExpert` ("expert"): privileged — plans with the env's frozen simulator. At each step it shortlists
  `n_candidates` unseen items (closest to the target, plus closeness to the current user state), scores each one's
  exact step reward under the simulator and recommends the best by
  `IoI + IoR / n + CTR` among the candidates accepted with probability ≥ `min_ctr` (0.2); it stops (EOS) when no
  acceptable candidate raises log P(target) by more than `stop_ioi` (0). Its paths are the SFT data of the policy
  (ProRL pre-trains on ground-truth paths; we have none, so greedy simulator paths stand in).
* `RandomRecAgent` ("random"): uniform over existing items, EOS with probability 1/(L_max + 1) per step
  (`valid_only=False`: uniform over all semantic-ID tuples, mostly hallucinations).
* `RecPolicyAgent`: the transformer policy of `agents.rec_model` (greedy by default), `from_checkpoint(dir)`.
  `pretrained_policy(...)` builds (and caches) the SFT-pre-trained policy that the RL baselines start from.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agents.base import Agent, Decision, ScriptedAgent
from agents.rec_model import EOS, GEN_LEN, L_MAX, PAD, SidVocab, build_model, generate, sft_targets, sft_train
from agents.registry import save_manifest
from shopsim.envs.proactive_rec import PathScorer, get_world
from shopsim.envs.proactive_rec.simulator import SIM_VERSION
from shopsim.envs.proactive_rec.world import World
from shopsim.envs.records import PROACTIVE_REC
from shopsim.paths import cache_dir

ENV_ID = PROACTIVE_REC.id


def _world_kwargs(kw: dict) -> dict:
    return {k: kw[k] for k in ("catalog_size", "catalog_seed", "simulator") if k in kw}


# ------------------------------------------------------------------ expert
@torch.no_grad()
def greedy_step(world: World, scorer: PathScorer, seqs: list[list[int]], targets: np.ndarray, *,
                n_candidates: int = 32, stop_ioi: float = 0.0, min_ctr: float = 0.2,
                z_weight: float = 0.3) -> np.ndarray:
    """One greedy expert step for a batch of users: item id per user, or −1 (stop).

    Candidates whose acceptance probability is below `min_ctr` are ruled out (each step must stay acceptable,
    which is what makes the expert steer gradually instead of jumping straight to the target)."""
    b = len(seqs)
    e = world.emb
    sim = world.sim
    t_len = max(len(s) for s in seqs)
    pad = world.n_items
    seq = np.full((b, t_len), pad, dtype=np.int64)
    last = np.array([len(s) - 1 for s in seqs])
    for i, s in enumerate(seqs):
        seq[i, : len(s)] = s
    h_all = sim.states(torch.as_tensor(seq))
    h = h_all[torch.arange(b), torch.as_tensor(last)]  # current state [B, d]
    s_now = sim.scores(h)
    tgt = torch.as_tensor(targets)
    lp_now = s_now.gather(1, tgt[:, None]).squeeze(1) - torch.logsumexp(s_now, 1)
    rank_now = 1 + (s_now > s_now.gather(1, tgt[:, None])).sum(1)
    # shortlist: close to the target, still acceptable for the user now
    mu, sd = sim.score_moments(h)
    z = ((s_now - mu[:, None]) / sd[:, None]).numpy()
    pref = e[targets] @ e.T + z_weight * z
    for i, s in enumerate(seqs):
        pref[i, s] = -np.inf
    cand = np.argpartition(-pref, n_candidates, axis=1)[:, :n_candidates]  # [B, M]
    m = cand.shape[1]
    ext = np.concatenate([np.repeat(seq, m, 0), np.full((b * m, 1), pad)], 1)
    ext[np.arange(b * m), np.repeat(last, m) + 1] = cand.reshape(-1)
    hc = sim.states(torch.as_tensor(ext))[torch.arange(b * m), torch.as_tensor(np.repeat(last, m) + 1)]
    sc = sim.scores(hc)
    tt = tgt.repeat_interleave(m)
    st = sc.gather(1, tt[:, None]).squeeze(1)
    lp = (st - torch.logsumexp(sc, 1)).view(b, m)
    rank = (1 + (sc > st[:, None]).sum(1)).view(b, m)
    ioi = (lp - lp_now[:, None]).numpy()
    ior = (rank_now[:, None] - rank).numpy() / world.n_items
    ctr = 1 / (1 + np.exp(-(np.take_along_axis(z, cand, 1) - scorer.ctr_offset)))
    fused = np.where(ctr >= min_ctr, ioi + ior + ctr, -np.inf)
    best = fused.argmax(1)
    choice = cand[np.arange(b), best]
    ok = np.isfinite(fused[np.arange(b), best]) & (ioi[np.arange(b), best] >= stop_ioi)
    return np.where(ok, choice, -1)


def expert_paths(world: World, histories: np.ndarray, targets: np.ndarray, *, n_candidates: int = 32,
                 stop_ioi: float = 0.0, chunk: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """Greedy expert paths for many users: (items [B, 10] with −1 after the stop, lengths [B])."""
    scorer = PathScorer(world)
    out = np.full((len(targets), L_MAX), -1, dtype=np.int64)
    for s0 in range(0, len(targets), chunk):
        sl = slice(s0, s0 + chunk)
        seqs = [list(h) for h in histories[sl]]
        alive = np.ones(len(seqs), dtype=bool)
        for k in range(L_MAX):
            idx = np.flatnonzero(alive)
            if not len(idx):
                break
            pick = greedy_step(world, scorer, [seqs[i] for i in idx], targets[sl][idx], n_candidates=n_candidates,
                               stop_ioi=stop_ioi)
            for i, p in zip(idx, pick, strict=False):
                if p < 0:
                    alive[i] = False
                else:
                    seqs[i].append(int(p))
                    out[s0 + i, k] = p
    return out, (out >= 0).sum(1)


class GreedyRecExpert(ScriptedAgent):
    """Greedy one-step-lookahead expert under the simulator (see module docstring). Privileged."""

    name = "expert"

    def __init__(self, env_id: str = ENV_ID, n_candidates: int = 32, stop_ioi: float = 0.0, action_mode: str =
                 "semantic_id", **world_kw):
        self.world = get_world(**_world_kwargs(world_kw))
        self.scorer = PathScorer(self.world)
        self.n_candidates, self.stop_ioi, self.action_mode = n_candidates, stop_ioi, action_mode

    def act(self, observations, infos, slots) -> list[Decision]:
        """One `greedy_step` call for every slot that is still choosing (the simulator's forward passes batched
        over users instead of one per slot)."""
        n = self.world.n_items
        picks: list[int] = [-1] * len(observations)
        live = [k for k, o in enumerate(observations) if o["length"] < L_MAX]
        if live:
            seqs = [[int(i) for i in observations[k]["history"] if i < n] for k in live]
            targets = np.array([observations[k]["target"] for k in live])
            chosen = greedy_step(self.world, self.scorer, seqs, targets, n_candidates=self.n_candidates,
                                 stop_ioi=self.stop_ioi)
            for k, pick in zip(live, chosen, strict=True):
                picks[k] = int(pick)
        return [Decision(self._item_action(p)) for p in picks]

    def act_one(self, slot, observation, info):
        return self.act([observation], [info], [slot])[0].action

    def _item_action(self, pick: int):
        if pick < 0:
            return self._eos()
        return pick if self.action_mode == "item" else self.world.sids.codes[pick].copy()

    def _eos(self):
        if self.action_mode == "item":
            return self.world.n_items
        return np.array([self.world.sids.sizes[0], 0, 0, 0], dtype=np.int64)


class RandomRecAgent(ScriptedAgent):
    """Uniform random recommender (existing items; EOS with probability 1/(L_max+1) per step)."""

    name = "random"

    def __init__(self, env_id: str = ENV_ID, valid_only: bool = True, action_mode: str = "semantic_id", **world_kw):
        self.world = get_world(**_world_kwargs(world_kw))
        self.valid_only, self.action_mode = valid_only, action_mode

    def act_one(self, slot, observation, info):
        sizes = self.world.sids.sizes
        if self.rng.random() < 1.0 / (L_MAX + 1):
            return self.world.n_items if self.action_mode == "item" else np.array([sizes[0], 0, 0, 0])
        if not self.valid_only and self.action_mode == "semantic_id":
            return np.array([self.rng.integers(s) for s in sizes], dtype=np.int64)
        item = int(self.rng.integers(self.world.n_items))
        return item if self.action_mode == "item" else self.world.sids.codes[item].copy()

    def reset(self, num_slots, seed=None):
        super().reset(num_slots, seed)


def policy_paths(agent: RecPolicyAgent, histories, targets, *, greedy: bool = True, temperature: float = 1.0,
                 generator: torch.Generator | None = None):
    """Decode whole paths with the policy for a batch of users: (prompts, generated ids, token log-probs,
    item ids [B, 10] (−2 invalid, −1 after EOS), lengths [B])."""
    world = agent.world
    prompts = agent.vocab.prompts(world.sids.codes[targets], world.sids.codes[histories])
    gen, lp = generate(agent.model, agent.vocab, prompts, greedy=greedy, temperature=temperature, generator=generator)
    codes, lengths = agent.vocab.decode(gen.numpy())
    items = world.sids.lookup(codes)
    items = np.where(items < 0, -2, items)
    items = np.where(np.arange(L_MAX)[None] < lengths[:, None], items, -1)
    return prompts, gen, lp, items, lengths


def random_paths(world: World, n: int, rng: np.random.Generator) -> np.ndarray:
    """Batched `RandomRecAgent` paths: items [n, 10] with −1 after the stop."""
    items = rng.integers(world.n_items, size=(n, L_MAX))
    stop = rng.random((n, L_MAX)) < 1.0 / (L_MAX + 1)
    alive = np.cumprod(~stop, axis=1).astype(bool)
    return np.where(alive, items, -1)


# ------------------------------------------------------------------ the transformer policy
class RecPolicyAgent(Agent):
    """The semantic-ID transformer policy as an `Agent` (per-step: generates one item = 4 tokens, or EOS)."""

    learns = True

    def __init__(self, env_id: str = ENV_ID, model=None, greedy: bool = True, temperature: float = 1.0,
                 valid_only: bool = False, no_repeat: bool = False, **world_kw):
        self.world_kw = _world_kwargs(world_kw)
        self.world = get_world(**self.world_kw)
        self.vocab = SidVocab(self.world.sids.sizes)
        self.valid_only, self.no_repeat = valid_only, no_repeat
        if valid_only:  # decode only real items (prefix trie); off = ProRL's setting, hallucinations possible
            self.vocab.restrict_to(self.world.sids.codes)
        # never re-recommend a history or path item; off = ProRL's setting, duplicates possible (CTR := 0)
        self.vocab.forbid_repeats(no_repeat)
        self.model = model if model is not None else build_model(self.vocab)
        self.model.eval()
        self.greedy, self.temperature = greedy, temperature
        self.name = "rec_policy"

    def reset(self, num_slots, seed=None):
        super().reset(num_slots, seed)
        self._gen = torch.Generator().manual_seed(int(seed or 0))

    def prompts(self, observations) -> torch.Tensor:
        tsid = np.stack([o["target_sid"] for o in observations])
        hsid = np.stack([np.asarray(o["history_sid"])[:10] for o in observations])
        return self.vocab.prompts(tsid, hsid)

    def act(self, observations, infos, slots):
        if not hasattr(self, "_gen"):
            self.reset(len(slots), 0)
        decisions: list[Decision | None] = [None] * len(observations)
        lengths = np.array([int(o["length"]) for o in observations])
        prompts = self.prompts(observations)
        for n in np.unique(lengths):  # same context length -> one batched call
            idx = np.flatnonzero(lengths == n)
            prefix = None
            if n > 0:
                codes = np.stack([np.asarray(observations[i]["path_sid"])[:n] for i in idx])
                prefix = torch.as_tensor(self.vocab.item_tokens(codes).reshape(len(idx), -1))
            gen, lp = generate(self.model, self.vocab, prompts[idx], prefix=prefix, greedy=self.greedy,
                               temperature=self.temperature, generator=self._gen, max_tokens=4)
            for r, i in enumerate(idx):
                toks = gen[r, 4 * n: 4 * n + 4]
                lps = lp[r, 4 * n: 4 * n + 4]
                if int(toks[0]) == EOS:
                    action = np.array([self.world.sids.sizes[0], 0, 0, 0], dtype=np.int64)
                    toks, lps = toks[:1], lps[:1]
                else:
                    action = self.vocab.codes_of(toks.numpy())
                decisions[i] = Decision(action, action_ids=toks.tolist(), action_logprobs=lps.tolist(),
                                        logprob=float(lps.sum()))
        return decisions

    # ---- checkpoints
    def save(self, directory) -> Path:
        from shopsim.paths import atomic_files

        directory = Path(directory)
        with atomic_files(directory / "model") as tmp:
            self.model.save_pretrained(tmp)
        save_manifest(directory, type(self), ENV_ID, world=self.world_kw, sizes=list(self.vocab.sizes),
                      valid_only=self.valid_only, no_repeat=self.no_repeat)
        return directory

    @classmethod
    def from_checkpoint(cls, directory, env_id: str = ENV_ID, **kw):
        from transformers import GPT2LMHeadModel

        directory = Path(directory)
        meta = json.loads((directory / "shopsim_agent.json").read_text())
        model = GPT2LMHeadModel.from_pretrained(directory / "model")
        kw.setdefault("valid_only", meta.get("valid_only", False))
        kw.setdefault("no_repeat", meta.get("no_repeat", False))
        return cls(env_id=env_id, model=model, **{**meta.get("world", {}), **kw})


def logged_paths(world: World, task_ids, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """"Logged" paths, the stand-in for ProRL's ground-truth pre-training paths: the user's own next L_max items
    under the hidden user process (continuing exactly the scenario's history), cut after the item closest to the
    target. Not optimised against the simulator, unlike `expert_paths`. Returns (items [B, 10] with −1 after the
    stop, lengths [B])."""
    from shopsim.envs.proactive_rec.simulator import generate_sequences
    from shopsim.envs.proactive_rec.world import HISTORY_LEN

    seqs = np.stack([generate_sequences(world.emb, 1, HISTORY_LEN + L_MAX, seed=[world.seed, int(t), 0x7A5C])[0]
                     for t in task_ids])
    fut = seqs[:, HISTORY_LEN:]
    cos = (world.emb[fut] * world.emb[np.asarray(targets)][:, None]).sum(-1)
    lengths = cos.argmax(1) + 1
    return np.where(np.arange(L_MAX)[None] < lengths[:, None], fut, -1), lengths


def pretrained_policy(*, catalog_size: int = 5000, catalog_seed: int = 0, simulator: str = "sasrec",
                      n_users: int = 1500, sft_steps: int = 400, seed: int = 0, sft_source: str = "expert",
                      log=None) -> RecPolicyAgent:
    """The SFT-pre-trained policy on train users 900000.. (cached in cache_dir). `sft_source`: 'expert' (greedy
    simulator-expert paths, privileged) or 'logged' (`logged_paths`, closer to ProRL's ground-truth paths)."""
    if sft_source not in ("expert", "logged"):
        from shopsim.errors import ConfigError

        raise ConfigError(f"sft_source={sft_source!r}; choose 'expert' or 'logged'")
    world_kw: dict[str, Any] = dict(catalog_size=catalog_size, catalog_seed=catalog_seed, simulator=simulator)
    src = "" if sft_source == "expert" else f"-{sft_source}"
    key = f"n{catalog_size}-s{catalog_seed}-{simulator}-sim{SIM_VERSION}{src}-u{n_users}-t{sft_steps}-seed{seed}-v1"
    path = cache_dir() / "proactive_rec" / f"policy-{key}"
    if (path / "shopsim_agent.json").is_file():
        return RecPolicyAgent.from_checkpoint(path)
    world = get_world(catalog_size, catalog_seed, simulator)
    ids = np.arange(900_000, 900_000 + n_users)
    hist, tgt = world.tasks(ids)
    if sft_source == "expert":
        items, lengths = expert_paths(world, hist, tgt)
    else:
        items, lengths = logged_paths(world, ids, tgt)
    vocab = SidVocab(world.sids.sizes)
    codes = world.sids.codes[np.clip(items, 0, None)]
    prompts = vocab.prompts(world.sids.codes[tgt], world.sids.codes[hist])
    model = build_model(vocab, seed=seed)
    losses = sft_train(model, vocab, prompts, sft_targets(vocab, codes, lengths), steps=sft_steps, seed=seed, log=log)
    agent = RecPolicyAgent(model=model, **world_kw)
    from shopsim.paths import atomic_path

    tmp = atomic_path(path)
    agent.save(tmp)
    (tmp / "sft.json").write_text(json.dumps({"expert_mean_length": float(lengths.mean()), "final_loss": losses[-1],
                                              "n_users": n_users, "steps": sft_steps}))
    if path.exists():
        shutil.rmtree(tmp)
    else:
        os.replace(tmp, path)
    return RecPolicyAgent.from_checkpoint(path)


__all__ = ["GreedyRecExpert", "RandomRecAgent", "RecPolicyAgent", "expert_paths", "greedy_step", "pretrained_policy",
           "random_paths", "logged_paths", "GEN_LEN", "PAD"]
