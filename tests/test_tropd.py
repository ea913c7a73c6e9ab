"""TrOPD (baselines/tropd.py, docs/algorithms/tropd.md): the trust region, the loss and its gradient on hand
examples, the teacher's tokenizer check, the teacher scores carried by the batch, and two training iterations on
the real Shopping-v0 env with tiny random student and teacher LMs."""

import math
import pathlib

import pytest
import torch

import baselines
from baselines.tropd import TrOPD, tropd_loss_tok, trust_region
from shopsim.errors import ConfigError

ENV = "shopsim/Shopping-v0"


# ---------------------------------------------------------------------------------------------- trust region
def test_trust_region_is_exactly_the_tokens_where_the_teacher_agrees():
    p_s = [0.5, 0.2, 0.4, 0.1, 0.3, 0.7]
    p_t = [0.5, 0.4, 0.1, 0.09, 0.15, 0.7]
    mask = torch.tensor([[1, 1, 1, 1, 1, 0]], dtype=torch.bool)
    lp_s, lp_t = torch.tensor([p_s]).log(), torch.tensor([p_t]).log()
    k1, trust, inside, tau = trust_region(lp_s, lp_t, mask, tau=1.0)
    # trust = min(p_T/p_S, 1): 1, 1 (2 capped), 0.25, 0.9, 0.5; the masked token is neither
    assert trust[0, :5].tolist() == pytest.approx([1.0, 1.0, 0.25, 0.9, 0.5])
    assert k1[0, :5].tolist() == pytest.approx([math.log(a / b) for a, b in zip(p_s[:5], p_t[:5], strict=True)])
    assert k1[0, 5] == 0 and trust[0, 5] == 0
    # τ = 1: exactly the tokens with p_T ≥ p_S (equality included); the others are outliers
    assert inside[0].tolist() == [True, True, False, False, False, False]
    assert tau == 1.0
    _, _, inside_half, _ = trust_region(lp_s, lp_t, mask, tau=0.5)
    assert inside_half[0].tolist() == [True, True, False, True, True, False]


def test_quantile_and_stochastic_trust_regions():
    lp_s = torch.tensor([[0.5, 0.2, 0.4, 0.1, 0.3]]).log()
    lp_t = torch.tensor([[0.5, 0.4, 0.1, 0.09, 0.15]]).log()
    mask = torch.ones(1, 5, dtype=torch.bool)
    _, trust, inside, tau = trust_region(lp_s, lp_t, mask, tau_mode="quantile", tau_quantile=0.25)
    assert tau == pytest.approx(float(torch.quantile(trust[0], 0.25)))  # 0.5: the lowest trust values are outliers
    assert inside[0].tolist() == [True, True, False, True, True]
    # stochastic: a token joins with probability trust (trust 1 always, 0.25 about a quarter of the time)
    lp_s2 = torch.tensor([[0.4, 0.4]]).log().expand(20000, 2)
    lp_t2 = torch.tensor([[0.8, 0.1]]).log().expand(20000, 2)
    g = torch.Generator().manual_seed(0)
    _, _, ins, _ = trust_region(lp_s2, lp_t2, torch.ones(20000, 2, dtype=torch.bool), tau_mode="stochastic",
                                generator=g)
    assert bool(ins[:, 0].all())
    assert float(ins[:, 1].float().mean()) == pytest.approx(0.25, abs=0.02)


# ---------------------------------------------------------------------------------------------- loss and gradient
Z_S = [[1.0, 0.0, -1.0, 0.5], [0.2, 0.1, 2.0, -0.5], [0.0, 1.5, 0.3, 0.3]]
Z_T = [[2.0, 0.1, -1.0, 0.0], [0.1, 0.0, -0.3, 1.0], [1.0, 0.2, 0.0, -2.0]]  # no ties in the top-2
Y = [0, 2, 1]
K = 2


def _softmax(z):
    e = [math.exp(v) for v in z]
    s = sum(e)
    return [v / s for v in e]


def _example(**kw):
    """Three generated tokens of one row with a 4-token vocabulary; returns (loss.sum(), z, parts, inside)."""
    z = torch.tensor(Z_S, requires_grad=True)
    zt = torch.tensor(Z_T)
    y = torch.tensor(Y)
    lz = torch.log_softmax(z, -1)
    logp = lz.gather(-1, y[:, None]).squeeze(-1)[None]
    lzt = torch.log_softmax(zt, -1)
    lp_t = lzt.gather(-1, y[:, None]).squeeze(-1)[None]
    tv, ti = lzt.topk(K, -1)
    s_topk = lz.gather(-1, ti)[None]
    mask = torch.ones(1, 3, dtype=torch.bool)
    k1, _, inside, _ = trust_region(logp.detach(), lp_t, mask, tau=1.0)
    loss, parts = tropd_loss_tok(logp, k1, inside, mask, s_topk, tv[None], **kw)
    return loss.sum(), z, parts, inside


def _hand():
    """Per token: p_S, p_T of the sampled token, k1, the teacher's top-2 (ids, renormalised probs), softmax(z)."""
    out = []
    for zs, zt, y in zip(Z_S, Z_T, Y, strict=True):
        ps, pt = _softmax(zs), _softmax(zt)
        top = sorted(range(4), key=lambda v: -pt[v])[:K]
        q = [pt[v] / sum(pt[u] for u in top) for v in top]
        out.append({"ps": ps, "pt": pt, "y": y, "k1": math.log(ps[y]) - math.log(pt[y]), "top": top, "q": q,
                    "ptop": [pt[v] for v in top]})
    return out


def test_trust_membership_of_the_hand_example():
    h = _hand()
    _, _, _, inside = _example()
    # token 0: p_T(0)=0.749 ≥ p_S(0)=0.474 (trust); token 1: p_T(2)=0.133 < p_S(2)=0.716; token 2: 0.241 < 0.548
    assert [t["pt"][t["y"]] >= t["ps"][t["y"]] for t in h] == [True, False, False]
    assert inside[0].tolist() == [True, False, False]


def test_loss_value_and_gradient_match_the_hand_computation():
    h = _hand()
    loss, z, parts, _ = _example()
    # RKD on the trust token 0: sg(k1)·log p_S; FKD on outliers 1, 2: Σ_top q·(log q − log π_S)
    rkd0 = h[0]["k1"] * math.log(h[0]["ps"][h[0]["y"]])
    fkd = [sum(qv * (math.log(qv) - math.log(t["ps"][v])) for qv, v in zip(t["q"], t["top"], strict=True))
           for t in h[1:]]
    assert parts["rkd"][0].tolist() == pytest.approx([rkd0, 0.0, 0.0], abs=1e-6)
    assert parts["fkd"][0].tolist() == pytest.approx([0.0, *fkd], abs=1e-6)
    assert float(loss.detach()) == pytest.approx(rkd0 + sum(fkd), abs=1e-6)
    loss.backward()
    # closed forms: RKD token: k1·(e_y − softmax); FKD token: Σ_top q·(softmax − e_v) = softmax − q (on the top-k)
    want = []
    for i, t in enumerate(h):
        if i == 0:
            want.append([t["k1"] * ((v == t["y"]) - t["ps"][v]) for v in range(4)])
        else:
            qfull = [t["q"][t["top"].index(v)] if v in t["top"] else 0.0 for v in range(4)]
            want.append([t["ps"][v] - qfull[v] for v in range(4)])
    assert z.grad.tolist() == [pytest.approx(w, abs=1e-6) for w in want]


def test_outlier_treatments_and_plain_opd():
    h = _hand()
    # unnormalised top-k: the partial KL with the raw teacher probabilities
    loss_u, _, parts_u, _ = _example(renormalize=False)
    fkd_u = [sum(p * (math.log(p) - math.log(t["ps"][v])) for p, v in zip(t["ptop"], t["top"], strict=True))
             for t in h[1:]]
    assert parts_u["fkd"][0, 1:].tolist() == pytest.approx(fkd_u, abs=1e-6)
    # mask: outliers get no gradient at all
    loss_m, z_m, _, _ = _example(outlier="mask")
    loss_m.backward()
    assert z_m.grad[1:].abs().max() == 0 and z_m.grad[0].abs().max() > 0
    # clip: outliers keep K1 with the weight min(k1, c)
    c = 0.3
    loss_c, z_c, _, _ = _example(outlier="clip", clip_k1=c)
    loss_c.backward()
    for i in (1, 2):
        w = min(h[i]["k1"], c)
        assert h[i]["k1"] > c  # the clip is active on both outliers
        assert z_c.grad[i].tolist() == pytest.approx([w * ((v == h[i]["y"]) - h[i]["ps"][v]) for v in range(4)],
                                                     abs=1e-6)
    # plain OPD: K1 on every token, no forward KL
    loss_o, z_o, parts_o, _ = _example(objective="opd")
    loss_o.backward()
    assert float(parts_o["fkd"].abs().sum()) == 0
    for i, t in enumerate(h):
        assert z_o.grad[i].tolist() == pytest.approx([t["k1"] * ((v == t["y"]) - t["ps"][v]) for v in range(4)],
                                                     abs=1e-6)


def test_minimising_the_rkd_term_lowers_the_reverse_kl():
    """E_{y~π_S}[∇ sg(k1(y))·log π_S(y)] equals ∇ KL(π_S ‖ π_T): the sign makes descent lower the reverse KL."""
    z = torch.tensor([0.3, -0.2, 1.0, 0.0], requires_grad=True)
    lt = torch.log_softmax(torch.tensor([1.0, 0.5, -1.0, 0.2]), -1)
    ls = torch.log_softmax(z, -1)
    exact = (ls.exp() * (ls - lt)).sum()
    (g_exact,) = torch.autograd.grad(exact, z, retain_graph=True)
    g_est = torch.zeros(4)
    for y in range(4):
        logp = ls[y].reshape(1, 1)
        k1 = (ls[y] - lt[y]).detach().reshape(1, 1)
        loss, _ = tropd_loss_tok(logp, k1, torch.ones(1, 1, dtype=torch.bool), torch.ones(1, 1, dtype=torch.bool),
                                 None, None, objective="opd")
        (g,) = torch.autograd.grad(loss.sum(), z, retain_graph=True)
        g_est += ls[y].exp().detach() * g
    assert g_est.tolist() == pytest.approx(g_exact.tolist(), abs=1e-6)
    # and one small step along −gradient lowers the exact reverse KL
    with torch.no_grad():
        z2 = z - 0.1 * g_est
        ls2 = torch.log_softmax(z2, -1)
        assert float((ls2.exp() * (ls2 - lt)).sum()) < float(exact)


# ---------------------------------------------------------------------------------------------- the teacher
def _tok():
    from agents.lm.tokenizer import load_tokenizer

    return load_tokenizer()


def _student(tok):
    from agents.lm.agent import LMAgent
    from agents.lm.model import build_model

    return LMAgent(env_id=ENV, model=build_model(tok, size="tiny", seed=0), tokenizer=tok, context_mode="window",
                   max_new_tokens=6)


def _save_teacher(path, tok, seed=1):
    from agents.lm.model import build_model

    model = build_model(tok, size="tiny", seed=seed)
    model.save_pretrained(str(path))
    tok.save_pretrained(str(path))
    return path


def test_teacher_with_another_vocabulary_is_refused(tmp_path):
    tok = _tok()
    other = _tok()
    other.add_tokens(["<|zzz|>"])
    bad = _save_teacher(tmp_path / "bad", other)
    algo = baselines.make("tropd", env_id=ENV, teacher=str(bad))
    with pytest.raises(ConfigError, match="does not share the student's tokenizer"):
        algo.setup(_student(tok))
    # the same tokenizer is accepted
    good = _save_teacher(tmp_path / "good", tok)
    ok = baselines.make("tropd", env_id=ENV, teacher=str(good))
    ok.setup(_student(tok))
    assert ok.teacher is not None and not any(p.requires_grad for p in ok.teacher.parameters())


def test_missing_teacher_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="prefix_share"):
        baselines.make("tropd", env_id=ENV, prefix_share=1.5)
    algo = baselines.make("tropd", env_id=ENV, teacher=str(tmp_path / "nothing"))
    with pytest.raises(ConfigError, match="no teacher checkpoint"):
        algo.setup(_student(_tok()))


def test_the_default_teacher_is_the_shipped_larger_checkpoint(tmp_path, monkeypatch):
    """`data/lm/sft-small` is found from any working directory, is larger than the shipped student and shares its
    tokenizer; a relative path that exists where the user runs is taken as given."""
    from agents.lm.model import load_model, num_parameters
    from agents.lm.tokenizer import load_tokenizer
    from baselines.tropd import TrOPDConfig, check_same_tokenizer, resolve_teacher
    from shopsim.paths import data_dir

    monkeypatch.chdir(tmp_path)
    teacher = resolve_teacher(TrOPDConfig().teacher)
    assert teacher == data_dir() / "lm" / "sft-small"
    student = data_dir() / "lm" / "sft"
    s_model, t_model = load_model(student), load_model(teacher)
    assert num_parameters(t_model) > 2 * num_parameters(s_model)
    check_same_tokenizer(load_tokenizer(student), load_tokenizer(teacher), s_model, t_model, str(teacher))
    (tmp_path / "data" / "lm" / "sft-small").mkdir(parents=True)
    (tmp_path / "data" / "lm" / "sft-small" / "config.json").write_text("{}")
    assert resolve_teacher("data/lm/sft-small") == pathlib.Path("data/lm/sft-small")


def test_prefix_schedule_is_linear_to_zero_over_the_first_30_percent():
    from baselines.tropd import prefix_schedule

    assert [prefix_schedule(i, 10) for i in range(5)] == pytest.approx([0.5, 0.5 * 2 / 3, 0.5 / 3, 0.0, 0.0])
    assert prefix_schedule(0, 100, 0.5, 0.3) == 0.5 and prefix_schedule(15, 100) == pytest.approx(0.25)
    assert prefix_schedule(30, 100) == 0.0 and prefix_schedule(99, 100) == 0.0


def test_prefix_guided_agent_keeps_the_teachers_first_tokens(tmp_path):
    from agents.lm.generation import sample
    from baselines.tropd import PrefixGuidedAgent

    tok = _tok()
    teacher = _save_teacher(tmp_path / "t", tok)
    algo = baselines.make("tropd", env_id=ENV, teacher=str(teacher))
    student = _student(tok)
    algo.setup(student)
    student.sampling.greedy = True  # deterministic: the teacher's turn can be re-sampled for the comparison
    agent = PrefixGuidedAgent(student, algo.teacher, 0.3)  # ceil(0.3·T) ≠ floor for T = 6 (the token limit)
    agent.reset(1, seed=0)
    from shopsim.rollout import collect

    trajs = collect(ENV, agent, episodes=2, seeds=[0, 1], split="train", num_envs=2, env_kwargs={"max_turns": 2},
                    progress=False)
    checked = 0
    for tr in trajs:
        for t in tr.turns:
            ref = sample(algo.teacher, [t.prompt_ids], stop_ids=student.fmt.stop_ids, pad_id=student.policy.pad_id,
                         config=student.sampling).ids[0]
            p = t.extra["teacher_prefix"]
            assert p == math.ceil(0.3 * len(ref))
            assert t.action_ids[:p] == list(ref[:p])
            assert len(t.action_logprobs) == len(t.action_ids)
            # the recorded log-probs are the student's (behaviour p_S), prefix included
            lp, m = student.policy.action_logprobs([t.prompt_ids], [t.action_ids])
            assert lp[0][m[0].bool()].tolist() == pytest.approx(t.action_logprobs, abs=1e-4)
            checked += 1
    assert checked >= 2
    # sampled at another temperature, every recorded log-prob (prefix and continuation) is at that temperature
    student.sampling.greedy, student.sampling.temperature = False, 0.5
    trajs = collect(ENV, agent, episodes=1, seeds=[2], split="train", num_envs=1, env_kwargs={"max_turns": 2},
                    progress=False)
    for t in trajs[0].turns:
        assert t.extra["teacher_prefix"] > 0
        lp, m = student.policy.action_logprobs([t.prompt_ids], [t.action_ids], temperature=0.5)
        assert lp[0][m[0].bool()].tolist() == pytest.approx(t.action_logprobs, abs=1e-4)


def test_teacher_scores_and_the_extensions_reach_the_loss(tmp_path):
    """The teacher's log-probs and top-k at the generated tokens (`teacher_scores`), carried to the loss in TrOPD's
    typed extensions (`TrOPDTokens` as ``mb.ext``, `StudentTopK` as ``mb.fwd``); recorded scores are read back."""
    from baselines.core.batch import MicroBatch, build_batch
    from baselines.core.trainer import forward_policy
    from baselines.tropd import recorded_teacher_scores

    tok = _tok()
    teacher = _save_teacher(tmp_path / "t", tok)
    algo = baselines.make("tropd", env_id=ENV, teacher=str(teacher), tasks_per_iter=2, num_envs=2,
                          env_kwargs={"max_turns": 2}, top_k=5, micro_batch_tokens=64)
    agent = _student(tok)
    algo.setup(agent)
    import numpy as np

    trajs, _ = algo.collect_batch(ENV, agent, 0, np.random.default_rng(0), env_kwargs={"max_turns": 2})
    batch = build_batch(trajs, pad_id=algo.pad_id)
    assert recorded_teacher_scores(batch) is None
    scores = algo.teacher_scores(batch)
    gen = batch.gen_mask
    assert scores.topk_ids.shape == (*gen.shape, 5) and scores.topk_logp.shape == (*gen.shape, 5)
    with torch.no_grad():  # a full-vocabulary teacher forward over the whole batch, as the reference
        lp_full, _, _ = forward_policy(algo.teacher, batch.input_ids, batch.attention_mask)
        pos = (batch.attention_mask.cumsum(-1) - 1).clamp_min(0)
        logits = algo.teacher(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                              position_ids=pos).logits.float()
        top = torch.log_softmax(logits[:, :-1], -1).topk(5, -1)
    assert torch.allclose(scores.logp[gen], lp_full[gen], atol=1e-4)
    assert torch.allclose(scores.topk_logp[:, 1:][gen[:, 1:]], top.values[gen[:, 1:]], atol=1e-4)
    assert torch.equal(scores.topk_ids[:, 1:][gen[:, 1:]], top.indices[gen[:, 1:]])
    # scores the rollouts recorded in turn.extra are read back at the same positions
    for i, tr in enumerate(trajs):
        idx = batch.traj_tok_index[i]
        j = 0
        for t in tr.turns:
            at = idx[j:j + len(t.action_ids)]
            t.extra["teacher_logprobs"] = scores.logp.reshape(-1)[at].tolist()
            t.extra["teacher_topk_ids"] = scores.topk_ids.reshape(-1, 5)[at].tolist()
            t.extra["teacher_topk_logprobs"] = scores.topk_logp.reshape(-1, 5)[at].tolist()
            j += len(t.action_ids)
    rec = recorded_teacher_scores(build_batch(trajs, pad_id=algo.pad_id))
    assert torch.equal(rec.logp, scores.logp) and torch.equal(rec.topk_ids[gen], scores.topk_ids[gen])
    assert torch.equal(rec.topk_logp[gen], scores.topk_logp[gen])
    for tr in trajs:
        for t in tr.turns:
            del t.extra["teacher_logprobs"], t.extra["teacher_topk_ids"], t.extra["teacher_topk_logprobs"]
    # without a run, f = prefix_share: the rollouts carry teacher prefixes, and L_off at those tokens is the full
    # forward KL(π_T ‖ π_S) over the vocabulary
    from baselines.tropd import prefix_mask

    pre = prefix_mask(batch)
    assert bool(pre.any()) and bool((pre <= gen).all()) and bool((gen & ~pre).any())
    first = [t.extra["teacher_prefix"] for tr in trajs for t in tr.turns]
    assert int(pre.sum()) == sum(min(p, len(t.action_ids)) for p, t in zip(first, [t for tr in trajs
                                                                                   for t in tr.turns], strict=True))
    ctx = algo.prepare(batch)
    advs = algo.compute_advantages(batch, ctx)
    rows = torch.arange(batch.num_rows)
    with torch.no_grad():
        mb = MicroBatch.of_rows(batch, rows, ext=advs.extra.rows(rows))
        fwd = algo.policy_forward(mb)
        mb.fwd = fwd.extra
        # on the teacher's prefix tokens the loss is λ_off·L_off only (no K1, no top-k forward KL)
        loss_tok, _ = algo.policy_loss_tok(mb, fwd.logp, None, batch.gen_mask.float())
        off = fwd.extra.offpolicy_kl
        assert torch.allclose(loss_tok[pre], off[pre]) and not bool(advs.extra.in_trust[pre].any())
        assert torch.equal(advs.extra.teacher_topk_ids, scores.topk_ids)
        s_logits = algo.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                              position_ids=pos).logits.float()
        ls, lt = torch.log_softmax(s_logits[:, :-1], -1), torch.log_softmax(logits[:, :-1], -1)
        kl = (lt.exp() * (lt - ls)).sum(-1)
    assert torch.allclose(off[:, 1:][pre[:, 1:]], kl[pre[:, 1:]], atol=1e-4)
    assert float(off[~pre].abs().sum()) == 0
    # `argmax_negative_scale` reads the arg-max from TrOPD's own student forward
    import dataclasses

    assert fwd.is_argmax is None
    algo.config = dataclasses.replace(algo.config, argmax_negative_scale=0.0)
    with torch.no_grad():
        am = algo.policy_forward(mb).is_argmax
    g1 = gen[:, 1:].bool()
    assert torch.equal(am[:, 1:][g1], (s_logits[:, :-1].argmax(-1) == batch.input_ids[:, 1:])[g1])
    assert not bool(am[:, 1:][~g1].any())
    algo.config = dataclasses.replace(algo.config, argmax_negative_scale=1.0, success_anchor_coef=0.5)
    with torch.no_grad():  # the success anchor reads the same mask
        assert torch.equal(algo.policy_forward(mb).is_argmax, am)


# ---------------------------------------------------------------------------------------------- training
def test_two_iterations_on_shopping(tmp_path):
    import agents

    tok = _tok()
    teacher = _save_teacher(tmp_path / "teacher", tok)
    before = {k: v.clone() for k, v in agents.lm.model.load_model(teacher).state_dict().items()}
    algo = baselines.make("tropd", env_id=ENV, teacher=str(teacher), group_size=1, tasks_per_iter=2,
                          eval_episodes=2, num_envs=2, max_new_tokens=6, lr=1e-4, env_kwargs={"max_turns": 2},
                          task_families=("find_and_buy", "clarify_and_buy"), checkpoint_every=0)
    out = tmp_path / "run"
    res = algo.train(ENV, iterations=2, seed=0, out_dir=out, agent=_student(tok), progress=False)
    assert len(res.history) == 2
    last = res.history[-1]
    assert math.isfinite(last["loss"]) and math.isfinite(last["grad_norm"]) and last["gen_tokens"] > 0
    assert 0.0 <= last["outlier_share"] <= 1.0 and 0.0 < last["trust_mean"] <= 1.0
    # two unrelated random models disagree: some tokens are outliers, and those get the forward-KL term
    assert last["outlier_share"] > 0 and last["loss_fkd_tok"] > 0
    assert last["forward_kl_topk"] >= 0 and math.isfinite(last["reverse_kl_k1"]) and last["tau"] == 1.0
    assert "dev_success" in last and "train_success" in last
    # teacher prefixes in the first iteration (f = 0.5), none once f reached 0 (30% of 2 iterations)
    first = res.history[0]
    assert first["prefix_f"] == 0.5 and first["prefix_token_share"] > 0 and first["loss_off_tok"] > 0
    assert last["prefix_f"] == 0.0 and last["prefix_token_share"] == 0 and last["loss_off_tok"] == 0
    # the teacher is frozen, the checkpoint reloads
    assert all(torch.equal(before[k], v) for k, v in algo.teacher.state_dict().items())
    assert agents.load_checkpoint(out / "checkpoint").model is not None
    assert isinstance(algo, TrOPD)


def test_reproduction_check_refuses_a_finished_run_of_other_settings(tmp_path):
    """benchmarks.repro_tropd reuses a finished run only when its recorded config is the one it would train
    (another teacher in the same folder stops the check instead of entering its table)."""
    import json

    from benchmarks.repro_tropd import check_same_settings

    run_dir = tmp_path / "tropd" / "seed0"
    run_dir.mkdir(parents=True)
    mini = baselines.make("tropd", env_id=ENV, teacher="data/lm/sft")
    (run_dir / "run.json").write_text(json.dumps({"config": mini.run_identity(ENV, 0)["config"]}, default=str))
    check_same_settings(run_dir, baselines.make("tropd", env_id=ENV, teacher="data/lm/sft"), 0)
    with pytest.raises(SystemExit, match=r"other settings \(teacher\)"):
        check_same_settings(run_dir, baselines.make("tropd", env_id=ENV, teacher="data/lm/sft-small"), 0)
    (run_dir / "run.json").unlink()
    with pytest.raises(SystemExit, match="no run.json"):
        check_same_settings(run_dir, mini, 0)
