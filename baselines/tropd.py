"""TrOPD: trust-region on-policy distillation for the Shopping LM agent (docs/algorithms/tropd.md).

Xing, Wang, Gao, Li, Tang, "Trust Region On-Policy Distillation", arXiv 2606.01249. The student samples its own
rollouts (G = 1); a frozen teacher LM that shares the student's tokenizer scores the same ids. Per generated token
(p_S: the student's behaviour probability of the sampled token, p_T: the teacher's)::

    k1_t    = log p_S − log p_T                       (K1 estimator of the reverse KL on the sampled token)
    trust_t = min(p_T / p_S, 1)                       (decoding-agreement ratio)
    trust region: trust_t ≥ τ (τ = 1: the tokens with p_T ≥ p_S); outliers: the rest
    L_RKD   = agg_{t ∈ trust}    sg(k1_t)·log π_S(y_t|·)           policy-gradient form of the reverse KL
    L_FKD   = agg_{t ∈ outliers} Σ_{v ∈ TopK_T(t)} p̃_T(v)·[log p̃_T(v) − log π_S(v|·)]
              p̃_T: the teacher's top-k probabilities renormalised over the top-k set ([derived])
    L       = L_RKD + λ_out·L_FKD

Minimising L_RKD lowers the reverse KL: its gradient k1·∇log π_S is the score-function estimate of
∇ KL(π_S ‖ π_T) on the student's own samples (reward −k1). The outlier tokens are those where the student sampled
something the teacher finds less likely than the student does; there K1's reward −k1 is unbounded below and the
paper replaces it by a top-k forward KL toward the teacher (`outlier="topk_fkd"`), or compares clipping the reward
(`"clip"`) and dropping the token (`"mask"`). `objective="opd"` is plain on-policy distillation (K1 on every
token, no trust region), the comparison of the reproduction check.

The teacher forward runs once per batch, without gradient, at the generated positions only (`teacher_scores`); it
keeps the teacher's log-prob of every sampled token and its top-k ids and log-probs (`TeacherScores`), never the
full [R, S, V] distribution. TrOPD's per-token tensors travel as the trainer's typed extensions: `TrOPDTokens` (K1,
the trust region, the prefix tokens and the teacher's top-k, from `compute_advantages`) reaches the loss as
``mb.ext``, and the update's single student forward (`policy_forward`) also gathers the student's log-probs at the
teacher's top-k ids and the off-policy KL, `StudentTopK`, which reaches the loss as ``mb.fwd``.

Off-policy guidance (`prefix_guidance`, on by default): while f > 0 the training rollouts are collected by
`PrefixGuidedAgent`: the teacher samples each turn (T_T tokens), the student keeps the first ⌈f·T_T⌉ of them and
samples the rest of the turn itself. The prefix tokens (``turn.extra["teacher_prefix"]`` of them) leave
L_RKD / L_FKD and get the full-vocabulary forward KL toward the teacher, L_off = agg Σ_v p_T(v)·[log p_T(v) −
log π_S(v)], so L = L_RKD + λ_out·L_FKD + λ_off·L_off with one normaliser over all generated tokens ([derived]).
f falls linearly from `prefix_share` (0.5) to 0 over the first `prefix_decay` (30%) of the run's iterations.
Evaluation always runs the student alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import torch

from baselines.core.batch import Batch, Forward, MicroBatch, RowTensors
from baselines.core.losses import entropy_from_logits
from baselines.core.trainer import Advantages, Ctx, LMAlgorithm, LMConfig
from shopsim.configs import bounded
from shopsim.errors import ConfigError, ShopsimError

__all__ = ["TrOPD", "TrOPDConfig", "trust_region", "tropd_loss_tok", "check_same_tokenizer", "positions_logits",
           "PrefixGuidedAgent", "prefix_schedule", "prefix_mask", "TeacherScores", "TrOPDTokens", "StudentTopK",
           "recorded_teacher_scores"]

Objective = Literal["tropd", "opd"]
Outlier = Literal["topk_fkd", "clip", "mask"]
TauMode = Literal["fixed", "quantile", "stochastic"]


@dataclass
class TrOPDConfig(LMConfig):
    """TrOPD's options; the defaults are the card's reading of arXiv 2606.01249 (every constant [derived])."""

    teacher: str = "data/lm/sft-small"
    """Teacher checkpoint folder (model + tokenizer). It must share the student's tokenizer (same vocabulary and
    special ids), else a ConfigError is raised. A relative ``data/...`` path that does not exist from the working
    directory is looked up in the shipped data folder. Default: the shipped ``small``-size checkpoint (``make
    lm-teacher``: the shipped agent's recipe and tokenizer at 4.2M parameters against 1.4M)."""
    objective: Objective = "tropd"
    """'tropd': K1 inside the trust region plus the outlier treatment; 'opd': plain on-policy distillation, K1 on
    every generated token (no trust region, no outlier term)."""
    tau: float = bounded(1.0, gt=0, max=1)
    """τ of the trust region trust_t = min(p_T/p_S, 1) ≥ τ (tau_mode='fixed'); 1.0 = the tokens with p_T ≥ p_S."""
    tau_mode: TauMode = "fixed"
    """'fixed': τ = `tau`; 'quantile': τ = the `tau_quantile` quantile of trust over the batch's generated tokens
    (an adaptive per-batch threshold); 'stochastic': a token is in the trust region with probability trust_t."""
    tau_quantile: float = bounded(0.2, min=0, max=1)
    """Quantile of the per-batch trust values used as τ when tau_mode='quantile'."""
    outlier: Outlier = "topk_fkd"
    """Treatment of the tokens outside the trust region: 'topk_fkd' (top-k forward KL toward the teacher, the
    paper's choice), 'clip' (K1 with its per-token weight k1 clipped at `clip_k1`), 'mask' (no loss)."""
    top_k: int = bounded(16, min=1)
    """k of the teacher's top-k set kept per generated token."""
    renormalize_topk: bool = True
    """Renormalise the teacher's top-k probabilities over the top-k set (False: the unnormalised partial KL)."""
    lambda_out: float = bounded(1.0, min=0)
    """λ_out, weight of the top-k forward KL on outlier tokens."""
    clip_k1: float = bounded(1.0, min=0)
    """Upper clip of sg(k1) on outlier tokens for outlier='clip' (the reward −k1 is bounded below by −clip_k1)."""
    prefix_guidance: bool = True
    """Off-policy guidance: during training rollouts the teacher writes each turn first, the student keeps its
    first ⌈f·T_T⌉ tokens as a prefix and completes the turn; prefix tokens get the full forward KL L_off
    (False: the student writes every token, L = L_RKD + λ_out·L_FKD)."""
    lambda_off: float = bounded(1.0, min=0)
    """λ_off, weight of the full forward KL on teacher-prefix tokens."""
    prefix_share: float = bounded(0.5, min=0, max=1)
    """f at the start of training: the share of the teacher's turn kept as the prefix."""
    prefix_decay: float = bounded(0.3, gt=0, max=1)
    """Share of the run's iterations over which f falls linearly from `prefix_share` to 0 (then no prefixes)."""
    group_size: int = 1
    lr: float = 1e-6
    temperature: float = 1.0


# ---------------------------------------------------------------------------------------------- the math
def trust_region(lp_s: torch.Tensor, lp_t: torch.Tensor, mask: torch.Tensor, *, tau: float = 1.0,
             tau_mode: str = "fixed", tau_quantile: float = 0.2,
             generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
    """Per-token (k1, trust, in_trust, τ) from the student's and teacher's log-probs of the sampled tokens.

    k1 = log p_S − log p_T, trust = min(p_T/p_S, 1) = exp(min(log p_T − log p_S, 0)); a masked token is in
    the trust region when trust ≥ τ ('fixed' / 'quantile', where τ is the batch quantile of trust) or with
    probability trust ('stochastic'; τ is then reported as NaN). Everything is 0/False outside `mask`."""
    m = mask.bool()
    k1 = (lp_s - lp_t) * m
    trust = torch.exp(torch.clamp(lp_t - lp_s, max=0.0)) * m
    if tau_mode == "fixed":
        t = float(tau)
        inside = trust >= t
    elif tau_mode == "quantile":
        vals = trust[m]
        t = float(torch.quantile(vals.float(), tau_quantile)) if vals.numel() else 1.0
        inside = trust >= t
    elif tau_mode == "stochastic":
        u = torch.rand(trust.shape, generator=generator).to(trust.device)
        inside = u < trust
        t = float("nan")
    else:
        raise ConfigError(f"tau_mode must be 'fixed', 'quantile' or 'stochastic', got {tau_mode!r}")
    return k1, trust, inside & m, t


def tropd_loss_tok(logp: torch.Tensor, k1: torch.Tensor, in_trust: torch.Tensor, mask: torch.Tensor,
                   s_topk_logp: torch.Tensor | None, t_topk_logp: torch.Tensor | None, *,
                   objective: str = "tropd", outlier: str = "topk_fkd", lambda_out: float = 1.0,
                   renormalize: bool = True, clip_k1: float = 1.0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token TrOPD loss [B, S] and its parts (module docstring).

    `logp`: the student's differentiable log π_S(y_t); `k1`, `in_trust` from `trust_region` (behaviour p_S);
    `s_topk_logp` / `t_topk_logp` [B, S, k]: the student's (differentiable) and the teacher's log-probs at the
    teacher's top-k ids. Returns (loss_tok, {"rkd", "fkd", "fkd_all", "rkd_mask", "fkd_mask"}) where "fkd_all" is
    the (detached) top-k forward KL at every token, for monitoring.
    """
    m = mask.bool()
    k1 = k1.detach()
    outl = m & ~in_trust.bool()
    if objective == "opd":
        rkd_mask, weight = m, k1
    elif objective == "tropd":
        rkd_mask, weight = in_trust.bool() & m, k1
        if outlier == "clip":  # outliers keep K1 with a bounded weight: the reward −k1 ≥ −clip_k1
            rkd_mask = m
            weight = torch.where(outl, k1.clamp(max=clip_k1), k1)
        elif outlier not in ("topk_fkd", "mask"):
            raise ConfigError(f"outlier must be 'topk_fkd', 'clip' or 'mask', got {outlier!r}")
    else:
        raise ConfigError(f"objective must be 'tropd' or 'opd', got {objective!r}")
    rkd = weight * logp * rkd_mask
    loss = rkd
    fkd = torch.zeros_like(logp)
    fkd_all = torch.zeros_like(logp)
    fkd_mask = torch.zeros_like(m)
    if s_topk_logp is not None and t_topk_logp is not None:
        # tokens outside the mask may hold −inf / padding: zero them before the softmax
        t_lp = torch.where(m[..., None], t_topk_logp, torch.zeros_like(t_topk_logp))
        q_log = torch.log_softmax(t_lp, dim=-1) if renormalize else t_lp
        q = torch.exp(q_log)
        fkd_tok = (q * (q_log - s_topk_logp)).sum(-1) * m
        fkd_all = fkd_tok.detach()
        if objective == "tropd" and outlier == "topk_fkd":
            fkd_mask = outl
            fkd = fkd_tok * fkd_mask
            loss = loss + lambda_out * fkd
    return loss, {"rkd": rkd, "fkd": fkd, "fkd_all": fkd_all, "rkd_mask": rkd_mask, "fkd_mask": fkd_mask}


# ---------------------------------------------------------------------------------------------- teacher
def check_same_tokenizer(student_tok, teacher_tok, student_model, teacher_model, where: str) -> None:
    """Raise a ConfigError unless the teacher's tokenizer and output layer match the student's: TrOPD compares the
    two models' probabilities of the same token ids, which is meaningless across vocabularies."""
    problems = []
    sv, tv = student_tok.get_vocab(), teacher_tok.get_vocab()
    if sv != tv:
        only_s, only_t = len(set(sv) - set(tv)), len(set(tv) - set(sv))
        moved = sum(1 for k in set(sv) & set(tv) if sv[k] != tv[k])
        problems.append(f"vocabularies differ (student {len(sv)} tokens, teacher {len(tv)}; {only_s} only in the "
                        f"student, {only_t} only in the teacher, {moved} with another id)")
    for name in ("pad_token_id", "eos_token_id", "bos_token_id"):
        a, b = getattr(student_tok, name, None), getattr(teacher_tok, name, None)
        if a != b:
            problems.append(f"{name} differs (student {a}, teacher {b})")
    n_s = student_model.get_output_embeddings().weight.shape[0]
    n_t = teacher_model.get_output_embeddings().weight.shape[0]
    if n_s != n_t:
        problems.append(f"output layers differ (student {n_s} logits, teacher {n_t})")
    if problems:
        raise ConfigError(f"tropd: the teacher {where} does not share the student's tokenizer: {'; '.join(problems)}."
                          " Distil from a checkpoint trained with the student's tokenizer (set --set teacher=DIR).")


def resolve_teacher(path: str) -> Path:
    """The teacher folder: `path` as given, else (a relative ``data/...`` path) inside the shipped data folder."""
    from shopsim.paths import shipped_path

    p = shipped_path(path)
    if not (p / "config.json").is_file():
        raise ConfigError(f"tropd: no teacher checkpoint at {path} (no config.json); set teacher=DIR to a saved LM "
                          "checkpoint")
    return p


def positions_logits(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, positions: torch.Tensor,
                     temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits [n, V] (float32, divided by the temperature) predicting the tokens at `positions` [B, S] (bool), and
    the selection mask over ``[:, 1:]``. The output layer runs only there, as in `forward_policy`."""
    pos = (attention_mask.long().cumsum(-1) - 1).clamp_min(0)
    body = model.base_model(input_ids=input_ids, attention_mask=attention_mask, position_ids=pos, use_cache=False)
    sel = positions[:, 1:].bool()
    logits = model.get_output_embeddings()(body.last_hidden_state[:, :-1][sel])
    return logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature, sel


# ---------------------------------------------------------------------------------------------- teacher prefixes
def prefix_schedule(iteration: int, iterations: int | None, start: float = 0.5, decay: float = 0.3) -> float:
    """f at `iteration` (0-based): linear from `start` at 0 to 0 at ``decay × iterations``, then 0."""
    if not iterations:
        return start
    return max(0.0, start * (1.0 - iteration / (decay * iterations)))


def prefix_mask(batch: Batch) -> torch.Tensor:
    """[R, S] bool: the generated tokens written by the teacher (the first ``turn.extra["teacher_prefix"]``
    action ids of each turn)."""
    R, S = batch.input_ids.shape
    flat = torch.zeros(R * S, dtype=torch.bool)
    for i, tr in enumerate(batch.trajectories):
        idx = batch.traj_tok_index[i].cpu()
        j = 0
        for t in tr.turns:
            n = len(t.action_ids or [])
            p = min(int((t.extra or {}).get("teacher_prefix", 0)), n)
            if p:
                flat[idx[j:j + p]] = True
            j += n
    return flat.reshape(R, S).to(batch.gen_mask.device)


class PrefixGuidedAgent:
    """Training-rollout agent of TrOPD's off-policy guidance around the student `LMAgent`: each turn the teacher
    samples an action, the student keeps its first ⌈f·T_T⌉ ids and samples the rest of the turn (within the same
    per-turn token limit). The `Decision` holds the whole action, the student's log-probs of all of its ids
    (behaviour p_S, prefix included) and ``extra["teacher_prefix"]``. Everything else is the student's."""

    def __init__(self, student, teacher, share: float):
        self.student, self.teacher, self.share = student, teacher, float(share)

    def __getattr__(self, name):
        return getattr(self.student, name)

    @property
    def unguided(self):
        """The student as it decodes alone (what `greedy_failed_share`'s screen plays)."""
        return self.student

    @torch.no_grad()
    def act(self, observations, infos, slots):
        from agents.base import Decision
        from agents.lm.generation import sample
        from agents.lm.parsing import decode_action

        s = self.student
        prompts = []
        for obs, slot in zip(observations, slots, strict=True):
            if slot not in s.contexts:
                s.begin_episode(slot, obs, {})
            ctx = s.contexts[slot]
            if slot in s.pending:
                ctx.step(s.pending.pop(slot), obs)
            prompts.append(ctx.prompt())
        stop = set(s.fmt.stop_ids)
        limit = s.sampling.max_new_tokens
        s.model.eval()
        # each episode's own stream when the runner seeded one (`LMAgent.seed_episode`), else the student's
        gens = [s.episode_generators.get(x, s.generator) for x in slots] if s.episode_generators else None
        t_out = sample(self.teacher, prompts, stop_ids=s.fmt.stop_ids, pad_id=s.policy.pad_id, config=s.sampling,
                       generator=gens or s.generator)
        prefixes = [list(ids[: math.ceil(self.share * len(ids))]) for ids in t_out.ids]
        # the student completes the turns whose prefix has not ended it
        need = [i for i, p in enumerate(prefixes) if len(p) < limit and not (p and p[-1] in stop)]
        conts: dict[int, tuple[list[int], list[float]]] = {}
        if need:
            room = limit - min(len(prefixes[i]) for i in need)
            out = s.generate([prompts[i] + prefixes[i] for i in need], [slots[i] for i in need],
                             config=replace(s.sampling, max_new_tokens=room),
                             generator=[gens[i] for i in need] if gens else s.generator)
            for j, i in enumerate(need):
                cut = limit - len(prefixes[i])
                conts[i] = (list(out.ids[j][:cut]), list(out.logprobs[j][:cut]))
        with_prefix = [i for i, p in enumerate(prefixes) if p]
        p_lp: dict[int, list[float]] = {}
        if with_prefix:  # the student's behaviour log-probs of the teacher's ids
            lp, m = s.policy.action_logprobs([prompts[i] for i in with_prefix], [prefixes[i] for i in with_prefix],
                                             temperature=s.sampling.logprob_temperature)
            for j, i in enumerate(with_prefix):
                p_lp[i] = lp[j][m[j].bool()].tolist()
        decisions = []
        for i, slot in enumerate(slots):
            c_ids, c_lp = conts.get(i, ([], []))
            ids = prefixes[i] + c_ids
            s.pending[slot] = ids
            decisions.append(Decision(action=decode_action(s.tokenizer, ids), prompt_ids=prompts[i],
                                      action_ids=ids, action_logprobs=p_lp.get(i, []) + c_lp,
                                      extra={"teacher_prefix": len(prefixes[i]),
                                             "stopped": bool(ids and ids[-1] in stop)}))
        return decisions


# ---------------------------------------------------------------------------------------------- extensions
@dataclass
class TeacherScores(RowTensors):
    """The teacher's scores of a batch's sampled tokens: `logp` [R, S] (its log-prob of each generated token, 0
    elsewhere) and its top-k ids / log-probs [R, S, k] at the generated positions."""

    logp: torch.Tensor
    topk_ids: torch.Tensor
    topk_logp: torch.Tensor


@dataclass
class TrOPDTokens(RowTensors):
    """TrOPD's extension of `Advantages` ([R, S]; top-k ones [R, S, k]): what its forward and loss read per row."""

    k1: torch.Tensor
    """log p_S − log p_T of the sampled token (behaviour p_S), 0 outside the student's own tokens."""
    in_trust: torch.Tensor
    """The tokens that get K1 (the trust region; every student token for plain OPD)."""
    prefix: torch.Tensor
    """The teacher-written prefix tokens of off-policy guidance (they get L_off only)."""
    teacher_topk_ids: torch.Tensor
    teacher_topk_logp: torch.Tensor


@dataclass
class StudentTopK(RowTensors):
    """TrOPD's extension of the update's forward: the student's log-probs at the teacher's top-k ids [B, S, k] and,
    when the micro-batch holds prefix tokens, the full forward KL toward the teacher there [B, S]."""

    topk_logp: torch.Tensor
    offpolicy_kl: torch.Tensor | None = None


def recorded_teacher_scores(batch: Batch) -> TeacherScores | None:
    """The teacher's scores that the rollouts recorded themselves, from ``turn.extra`` (`teacher_logprobs`,
    `teacher_topk_ids`, `teacher_topk_logprobs`, one entry per action token), else None. Top-k sets shorter than
    the longest are padded with id 0 at log-prob −inf."""
    turns = [t for tr in batch.trajectories for t in tr.turns]
    if not any("teacher_logprobs" in (t.extra or {}) for t in turns):
        return None
    if not any("teacher_topk_ids" in (t.extra or {}) for t in turns):
        return None
    R, S = batch.input_ids.shape
    kk = max(len(t.extra["teacher_topk_ids"][0]) for t in turns if (t.extra or {}).get("teacher_topk_ids"))
    lp = torch.zeros(R * S)
    ids = torch.zeros(R * S, kk, dtype=torch.long)
    tlp = torch.full((R * S, kk), float("-inf"))
    for i, tr in enumerate(batch.trajectories):
        idx = batch.traj_tok_index[i].cpu()
        j = 0
        for t in tr.turns:
            n = len(t.action_ids or [])
            ex = t.extra or {}
            pos = idx[j:j + n]
            if n and "teacher_logprobs" in ex:
                lp[pos] = torch.tensor(ex["teacher_logprobs"], dtype=torch.float32)
            if n and ex.get("teacher_topk_ids"):
                ti = torch.tensor(ex["teacher_topk_ids"], dtype=torch.long)
                tl = torch.tensor(ex["teacher_topk_logprobs"], dtype=torch.float32)
                ids[pos, : ti.shape[1]] = ti
                tlp[pos, : tl.shape[1]] = tl
            j += n
    dev = batch.gen_mask.device
    return TeacherScores(logp=lp.reshape(R, S).to(dev), topk_ids=ids.reshape(R, S, kk).to(dev),
                         topk_logp=tlp.reshape(R, S, kk).to(dev))


# ---------------------------------------------------------------------------------------------- the algorithm
class TrOPD(LMAlgorithm):
    """Trust-region on-policy distillation from a teacher LM that shares the student's tokenizer."""

    name = "tropd"
    Config = TrOPDConfig
    # a row whose tokens are all outliers has zero K1 advantage but a forward-KL loss: never skip rows
    reads_zero_advantage_rows = True

    def setup(self, agent) -> None:
        """The shared setup, then the frozen teacher (checked against the student's tokenizer)."""
        super().setup(agent)
        from agents.lm.model import load_model
        from agents.lm.tokenizer import load_tokenizer

        c = self.config
        path = resolve_teacher(c.teacher)
        try:
            t_tok = load_tokenizer(path)
        except ShopsimError as exc:
            raise ConfigError(f"tropd: the teacher {path} has no tokenizer, so it cannot be checked against the "
                              "student's; save the teacher with its tokenizer") from exc
        s_tok = getattr(agent, "tokenizer", None)
        if s_tok is None:
            raise ConfigError("tropd: the student agent has no tokenizer to compare with the teacher's")
        self.teacher = load_model(path).to(c.device).eval()
        for p in self.teacher.parameters():
            p.requires_grad_(False)
        check_same_tokenizer(s_tok, t_tok, self.model, self.teacher, str(path))

    # ------------------------------------------------------------------ teacher forward
    @torch.no_grad()
    def teacher_scores(self, batch: Batch) -> TeacherScores:
        """The teacher's log-prob [R, S] of every generated token and its top-k ids / log-probs [R, S, k] there
        (one no-grad teacher forward per micro-batch; only the top-k of each distribution is kept)."""
        k = self.config.top_k
        R, S = batch.input_ids.shape
        lp = torch.zeros(R, S, device=batch.input_ids.device)
        ids = torch.zeros(R, S, k, dtype=torch.long, device=lp.device)
        tlp = torch.zeros(R, S, k, device=lp.device)

        def fn(i, a, g):
            logits, sel = positions_logits(self.teacher, i, a, g, self.temperature)
            logz = torch.log_softmax(logits, dim=-1)
            o_lp = torch.zeros(i.shape, device=i.device)
            o_lp[:, 1:][sel] = logz.gather(-1, i[:, 1:][sel].unsqueeze(-1)).squeeze(-1)
            v, top = logz.topk(min(k, logz.shape[-1]), dim=-1)
            o_ids = torch.zeros(*i.shape, k, dtype=torch.long, device=i.device)
            o_tlp = torch.zeros(*i.shape, k, device=i.device)
            o_ids[:, 1:][sel] = top
            o_tlp[:, 1:][sel] = v
            return o_lp, o_ids, o_tlp

        for r in self.micro_batches(batch, torch.arange(R, device=lp.device)):
            a, b, c = self.trimmed(fn, batch, r, batch.gen_mask[r])
            lp[r], ids[r], tlp[r] = a, b, c
        return TeacherScores(logp=lp * batch.gen_mask, topk_ids=ids, topk_logp=tlp)

    def prefix_f(self, iteration: int) -> float:
        """The prefix share f of training iteration `iteration` (0 without prefix guidance)."""
        c = self.config
        if not c.prefix_guidance:
            return 0.0
        run = getattr(self, "run", None)
        return prefix_schedule(iteration, getattr(run, "iterations", None), c.prefix_share, c.prefix_decay)

    def collect_batch(self, env_id: str, agent, iteration: int, rng, env_kwargs: dict | None = None, env_fns=None,
                      progress: bool = False):
        """The shared rollouts, by `PrefixGuidedAgent` (teacher prefixes) while f > 0."""
        f = self.prefix_f(iteration)
        if f > 0:
            agent = PrefixGuidedAgent(agent, self.teacher, f)
        trajs, m = super().collect_batch(env_id, agent, iteration, rng, env_kwargs=env_kwargs, env_fns=env_fns,
                                         progress=progress)
        return trajs, {**m, "prefix_f": f}

    # ------------------------------------------------------------------ loss
    def compute_advantages(self, batch: Batch, ctx: Ctx) -> Advantages:
        """The teacher's scores (those the rollouts recorded, else `teacher_scores`), then the trust region and K1
        per token; the advantage is the RKD reward −k1 on the tokens that get K1 (for the shared logging); the
        per-token loss itself is `policy_loss_tok`, which reads them in the extension `TrOPDTokens`."""
        c = self.config
        scores = recorded_teacher_scores(batch) or self.teacher_scores(batch)
        all_gen = batch.gen_mask
        prefix = prefix_mask(batch) if c.prefix_guidance else torch.zeros_like(all_gen)
        gen = all_gen & ~prefix  # the student's own tokens; the teacher's prefix tokens get L_off
        gen_rng = None
        if c.tau_mode == "stochastic":  # seeded from (run seed, iteration): reproducible and resume-safe
            seed = int(getattr(getattr(self, "run", None), "seed", 0) or 0)
            gen_rng = torch.Generator().manual_seed(seed * 1_000_003 + ctx.iteration + 17)
        k1, trust, inside, tau = trust_region(ctx.behav_logp, scores.logp, gen, tau=c.tau,
                                              tau_mode=c.tau_mode, tau_quantile=c.tau_quantile, generator=gen_rng)
        n = gen.sum().clamp_min(1)
        outl = gen & ~inside  # logged for plain OPD too: the tokens TrOPD would treat as outliers
        if c.objective == "opd":
            inside = gen.clone()
        ext = TrOPDTokens(k1=k1, in_trust=inside, prefix=prefix, teacher_topk_ids=scores.topk_ids,
                          teacher_topk_logp=scores.topk_logp)
        adv = torch.where(inside, -k1, torch.zeros_like(k1))
        if c.outlier == "clip" and c.objective == "tropd":
            adv = torch.where(outl, -k1.clamp(max=c.clip_k1), adv)
        k1_gen = k1[gen]
        metrics = {
            "reverse_kl_k1": float(k1.sum() / n),
            "k1_max": float(k1_gen.max()) if k1_gen.numel() else 0.0,
            "outlier_share": float(outl.sum() / n),
            "trust_mean": float(trust.sum() / n),
            "teacher_logp_mean": float((scores.logp * gen).sum() / n),
            "student_logp_mean": float((ctx.behav_logp * gen).sum() / n),
            "prefix_token_share": float(prefix.sum() / all_gen.sum().clamp_min(1)),
        }
        if c.objective == "tropd" and c.tau_mode != "stochastic":
            metrics["tau"] = tau
        return Advantages(adv=adv, metrics=metrics, extra=ext)

    def reduce_step_metrics(self, steps: dict[str, list[float]]) -> dict[str, float]:
        """The shared means, plus ``grad_norm_max``: the largest pre-clip gradient norm of the iteration's optimizer
        steps (``grad_norm`` is their mean), the quantity whose spikes the paper compares with OPD's."""
        out = super().reduce_step_metrics(steps)
        if steps.get("grad_norm"):
            out["grad_norm_max"] = max(steps["grad_norm"])
        return out

    def policy_forward(self, mb: MicroBatch[TrOPDTokens, StudentTopK], *, need_entropy: bool = False,
                       need_hidden: bool = False) -> Forward[StudentTopK]:
        """One student forward over the rows of `mb`: the sampled tokens' log-probs and, from the same logits, the
        log-probs at the teacher's top-k ids and the off-policy KL at prefix tokens (`StudentTopK`)."""
        ext = mb.ext
        if ext is None:
            raise ConfigError("tropd: policy_forward needs the micro-batch's TrOPDTokens (from compute_advantages)")
        batch, r = mb.batch, mb.rows
        k = ext.teacher_topk_ids.shape[-1]

        def fn(i, a, g, top, pre):
            logits, sel = positions_logits(self.model, i, a, g, self.temperature)
            lse = torch.logsumexp(logits, dim=-1)
            off = None
            if bool(pre.any()):  # L_off: the full forward KL toward the teacher at its prefix tokens
                with torch.no_grad():
                    t_logz = torch.log_softmax(positions_logits(self.teacher, i, a, g, self.temperature)[0], -1)
                kl = (t_logz.exp() * (t_logz - (logits - lse.unsqueeze(-1)))).sum(-1)
                off = torch.zeros(i.shape, dtype=logits.dtype, device=i.device)
                off[:, 1:][sel] = kl
                off = off * pre
            lp = torch.zeros(i.shape, dtype=logits.dtype, device=i.device)
            lp[:, 1:][sel] = logits.gather(-1, i[:, 1:][sel].unsqueeze(-1)).squeeze(-1) - lse
            klp = torch.zeros(*i.shape, k, dtype=logits.dtype, device=i.device)
            klp[:, 1:][sel] = logits.gather(-1, top[:, 1:][sel]) - lse.unsqueeze(-1)
            ent = None
            if need_entropy:
                ent = torch.zeros_like(lp)
                ent[:, 1:][sel] = entropy_from_logits(logits)
            am = None
            if self.needs_argmax:
                am = torch.zeros(i.shape, dtype=torch.bool, device=i.device)
                am[:, 1:][sel] = logits.detach().argmax(-1) == i[:, 1:][sel]
            return lp, ent, klp, off, am

        lp, ent, klp, off, am = self.trimmed(fn, batch, r, batch.gen_mask[r], ext.teacher_topk_ids, ext.prefix)
        return Forward(logp=lp, entropy=ent, is_argmax=am, extra=StudentTopK(topk_logp=klp, offpolicy_kl=off))

    def policy_loss_tok(self, mb: MicroBatch[TrOPDTokens, StudentTopK], logp: torch.Tensor, adv: torch.Tensor,
                        mask: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """L_RKD + λ_out·L_FKD on the student's own tokens and λ_off·L_off on the teacher's prefix tokens (module
        docstring), from the extensions `mb.ext` (`TrOPDTokens`) and `mb.fwd` (`StudentTopK`)."""
        c = self.config
        ext, fwd = mb.ext, mb.fwd
        if ext is None or fwd is None:
            raise ConfigError("tropd: the loss needs the micro-batch's TrOPDTokens and StudentTopK")
        pre = ext.prefix
        own = mask.bool() & ~pre
        loss, parts = tropd_loss_tok(logp, ext.k1, ext.in_trust, own, fwd.topk_logp, ext.teacher_topk_logp,
                                     objective=c.objective, outlier=c.outlier, lambda_out=c.lambda_out,
                                     renormalize=c.renormalize_topk, clip_k1=c.clip_k1)
        off = fwd.offpolicy_kl
        if off is not None:
            loss = loss + c.lambda_off * off * (mask.bool() & pre)
        m = mask.float()
        n = m.sum().clamp_min(1.0)
        with torch.no_grad():
            n_own = own.float().sum().clamp_min(1.0)
            st = {"loss_rkd_tok": (parts["rkd"] * m).sum() / n, "loss_fkd_tok": (parts["fkd"] * m).sum() / n,
                  "loss_off_tok": ((off * m).sum() / n) if off is not None else torch.zeros(()),
                  "forward_kl_topk": (parts["fkd_all"] * own).sum() / n_own}
        return loss, st
