"""The HTML leaderboard page and its charts: tiers, ranks, curves over seeds, per-family breakdown, cost charts,
descriptions, provenance, protocol notes, linkable tabs, and a 1,400 px wide window (headless Chromium)."""

import html
import re

import pytest

from shopsim.envs import RECORDS, env_record
from shopsim.leaderboard.charts import curve_of, plot_env, read_curve
from shopsim.leaderboard.page import env_text, metric_text, protocol_notes, ranks, reproduce_command, to_html
from shopsim.leaderboard.protocols import Protocol
from shopsim.leaderboard.render import group_by_env, render_all
from shopsim.leaderboard.results import find_results, make_results, write_results
from tests.fixtures.headless import dump_dom

SHOP = "shopsim/Shopping-v0"
RET = "shopsim/TwoStageRetrieval-v0"
INV = "shopsim/Replenishment-v0"


def _m(mean, lo=None, hi=None):
    ci = None if lo is None else [lo, hi]
    return {"mean": mean, "std": 0.0, "ci95": ci, "n": 3, "per_seed": [mean] * 3}


def _shop_metrics(base):
    out = {m: _m(base, max(0.0, base - 0.05), min(1.0, base + 0.05)) for m in env_record(SHOP).metrics}
    out["turns"], out["tokens"] = _m(12.3456, 11.0, 13.5), _m(1234.5, 1100.0, 1300.0)
    out["success/bundle"] = _m(base / 2, base / 2 - 0.1 if base > 0.2 else 0.0, base / 2 + 0.1)
    return out


STANDARD = {"mode": "standard", "iterations": 200, "train_seed": 0, "train_seeds": [0, 1, 2]}


def board_results(tmp_path):
    """A leaderboard like the shipped standard tier: Shopping with every column, curves over 3 seeds, an error row;
    TwoStageRetrieval with an old-style metrics.csv curve whose value is logged every 100 iterations; Replenishment
    with a random agent far above (s, S) and a second protocol."""
    shop = Protocol(env_id=SHOP, family="shopping", task_ids=tuple(range(40)), seeds=(0, 1, 2), tries=4)
    ret = Protocol(env_id=RET, family="retrieval", task_ids=tuple(range(256)), seeds=(0, 1, 2), tries=4)
    inv = Protocol(env_id=INV, family="inventory", task_ids=tuple(range(16)), seeds=(0, 1, 2), tries=4)
    inv2 = Protocol(env_id=INV, family="inventory", task_ids=tuple(range(4)), seeds=(7,), tries=1)
    run = tmp_path / "runs" / "capg"
    run.mkdir(parents=True, exist_ok=True)
    # CA-PG logs loss every iteration and the policy value only every 100 iterations (eval_every)
    lines = ["iteration,step,loss,reward,value"] + [
        f"{i},{i + 1},{1.0 / (i + 1):.4f},{5 + i / 100:.3f},{f'{6 + i / 150:.3f}' if i % 100 == 99 else ''}"
        for i in range(300)]
    (run / "metrics.csv").write_text("\n".join(lines) + "\n")
    curve = {"metric": "dev_success", "x": [0, 10, 20, 30],
             "per_seed": [[0.1, 0.2, 0.3, 0.4], [0.1, 0.25, None, 0.5], [0.05, 0.15, 0.3, 0.45]]}
    cost_curve = {"metric": "eval_cost", "x": [0, 50, 100, 150],
                  "per_seed": [[9000.0, 300.0, 160.0, 150.0], [8000.0, 320.0, 170.0, 155.0], [9500, 280, 150, 140]]}
    recs = [
        make_results(protocol=shop, entry="expert", kind="reference", metrics=_shop_metrics(0.95)),
        make_results(protocol=shop, entry="random", kind="reference", metrics=_shop_metrics(0.02)),
        make_results(protocol=shop, entry="grpo", kind="trained", algorithm="grpo", budget=STANDARD,
                     metrics=_shop_metrics(0.40), extra={"curve": curve}),
        make_results(protocol=shop, entry="mpo", kind="trained", algorithm="mpo", budget=STANDARD, metrics={},
                     status="error", error="RuntimeError: CUDA out of memory while allocating a very long tensor "
                                           "for the policy's key-value cache | details\ntraceback..."),
        make_results(protocol=ret, entry="expert", kind="reference", metrics={
            "policy_value": _m(7.6, 7.5, 7.7), "regret": _m(0.0), "recall": _m(1.0), "success_rate": _m(1.0)}),
        make_results(protocol=ret, entry="capg", kind="trained", algorithm="capg",
                     budget={"mode": "standard", "iterations": 300, "train_seed": 0},
                     curve="../../runs/capg/metrics.csv",
                     metrics={"policy_value": _m(6.4, 6.3, 6.5), "regret": _m(1.2, 1.1, 1.3),
                              "recall": _m(0.3), "success_rate": _m(0.2, 0.18, 0.22)}),
        make_results(protocol=inv, entry="s_S", kind="reference", metrics={
            "cost": _m(13000.0, 12800.0, 13200.0), "gap_to_s_S_pct": _m(0.0)}),
        make_results(protocol=inv, entry="random", kind="reference", metrics={
            "cost": _m(260000.0, 250000.0, 270000.0), "gap_to_s_S_pct": _m(1900.0, 1850.0, 1950.0)}),
        make_results(protocol=inv, entry="hpo", kind="trained", algorithm="hpo", budget=STANDARD,
                     metrics={"cost": _m(12000.0, 11800.0, 12300.0), "gap_to_s_S_pct": _m(-7.7, -9.0, -6.0)},
                     extra={"curve": cost_curve}),
        make_results(protocol=inv, entry="ppo", kind="trained", algorithm="ppo", budget=STANDARD,
                     metrics={"cost": _m(16380.0, 15000.0, 17000.0), "gap_to_s_S_pct": _m(26.0, 15.0, 31.0)}),
        make_results(protocol=inv2, entry="mine", kind="trained", algorithm="mypkg.algo:Mine",
                     budget={"mode": "quick", "iterations": 6, "train_seed": 0},
                     metrics={"cost": _m(14000.0), "gap_to_s_S_pct": _m(7.0)}),
    ]
    for r in recs:
        write_results(tmp_path / "results" / r["env_id"].split("/")[1] / f"{r['entry']}_{len(r['seeds'])}.json", r)
    return find_results(tmp_path / "results")


def _section(page: str, tab: str) -> str:
    start = page.index(f'<section class="env" id="{tab}"')
    return page[start:page.index("</section>", start)]


def _column(section: str, name: str) -> list[str]:
    """The text of column `name` of a section's leaderboard table, row by row."""
    head = re.findall(r"<th[^>]*>(.*?)</th>", section[section.index('<table class="board">'):].split("</thead>")[0])
    head = [re.sub(r"<[^>]+>", "", h) for h in head]
    i = head.index(name)
    body = section[section.index("<tbody>"):section.index("</tbody>")]
    return [re.sub(r"<[^>]+>", " ", re.findall(r"<td[^>]*>(.*?)</td>", tr)[i]).strip()
            for tr in re.findall(r"<tr[^>]*>(.*?)</tr>", body, re.S)]


def test_table_has_rank_and_tier_and_interval_under_each_value(tmp_path):
    page = to_html(board_results(tmp_path))
    inv = _section(page, "Replenishment-v0_p1")
    assert [r["entry"] for r in group_by_env(board_results(tmp_path))[f"{INV} [protocol 1]"]] == [
        "hpo", "s_S", "ppo", "random"]  # lower cost first
    assert _column(inv, "rank") == ["1", "2", "3", "4"]
    assert _column(inv, "tier") == ["standard", "—", "standard", "—"]
    assert _column(inv, "entry") == ["hpo trained", "s_S reference", "ppo trained", "random reference"]
    assert _column(inv, "budget") == ["200 it ×3 seeds", "—", "200 it ×3 seeds", "—"]
    assert _column(inv, "cost")[0] == "12,000 11,800–12,300"
    assert _column(inv, "gap_to_s_S_pct")[0] == "-7.700 -9.00 to -6.00"
    shop = _section(page, "Shopping-v0")
    assert _column(shop, "rank") == ["1", "2", "3", "—"]  # the error row has no rank
    assert _column(shop, "success_rate")[:2] == ["0.950 0.90–1.00", "0.400 0.35–0.45"]


def test_interval_text():
    from shopsim.leaderboard.page import fmt_interval

    assert fmt_interval(0.35, 0.45) == "0.35–0.45" and fmt_interval(-0.001, 0.02) == "0.00–0.02"
    assert fmt_interval(-9.0, -6.0) == "-9.00 to -6.00" and fmt_interval(11800, 12300) == "11,800–12,300"


def test_slugs_are_safe_fragments_and_demo_rows_say_so():
    from shopsim.leaderboard.charts import slug
    from shopsim.leaderboard.page import tier_of

    assert slug("shopsim/Replenishment-v0 [protocol 2]") == "Replenishment-v0_p2"
    assert slug("shopsim/Replenishment-v0 (seasonal, capacity)") == "Replenishment-v0_seasonal_capacity"
    assert tier_of({"demo": True, "budget": {"mode": "quick"}}) == "demo"
    assert tier_of({"budget": {"mode": "standard"}}) == "standard" and tier_of({"budget": None}) == "—"
    from shopsim.leaderboard.page import submit_command

    demo = {"env_id": INV, "kind": "trained", "demo": True, "budget": {"mode": "quick", "iterations": 6}}
    std = {**demo, "demo": False, "budget": {"mode": "standard", "iterations": 300}}
    assert submit_command([demo, std]) == "shopsim bench --tier standard --envs Replenishment-v0 --algo " \
                                          "mypkg.module:MyAlgo"  # the standard rows' tier, not the demo's
    assert submit_command([demo]).startswith("shopsim bench --quick ")


def test_ranks_share_ties_and_skip_rows_without_a_value():
    rows = [{"status": "ok", "metrics": {"m": {"mean": v}}} for v in (0.9, 0.5, 0.5, 0.1)]
    rows.append({"status": "error", "metrics": {}})
    assert ranks(rows, "m") == ["1", "2", "2", "4", "—"]


def test_every_env_and_shown_metric_has_a_paragraph_with_its_direction(tmp_path):
    from shopsim.envs import all_env_ids

    assert all(env_text(e) == env_record(e).description != "" for e in all_env_ids())
    for env_id, record in RECORDS.items():
        for m in record.metrics:
            text = metric_text(m)
            assert "a metric the env reports" not in text, (env_id, m)
            assert text.endswith("Lower is better." if m in ("cost", "gap_to_s_S_pct", "turns", "tokens",
                                                             "invalid_rate", "regret") else "Higher is better."), m
    page = html.unescape(to_html(board_results(tmp_path)))
    assert "<dt>gap_to_s_S_pct</dt><dd>cost relative to the (s, S) policy" in page
    assert ("<dt>success/<family></dt><dd>success rate on the tasks of one family (find_and_buy, clarify_and_buy, "
            "bundle, after_sales, personalized_buy). Higher is better.</dd>") in page
    assert "<dt>pass^k (k = 1, 2, 3, 4)</dt><dd>probability that all k tries of a task succeed" in page
    assert env_text(RET) in page


def test_provenance_and_commands_to_reproduce_or_submit(tmp_path):
    results = board_results(tmp_path)
    page = html.unescape(to_html(results))
    r = results[0]
    assert f"<code>{r['git_commit'][:12]}</code>" in page and r["package_version"] in page
    assert r["created"].replace("T", " ").replace("Z", " UTC") in page
    s_s = next(x for x in results if x["entry"] == "s_S")
    assert reproduce_command(s_s) == ("shopsim eval --env shopsim/Replenishment-v0 --agent s_S --split test "
                                      "--tasks 16 --tries 4 --seeds 0 1 2 --out results/s_S.json")
    hpo = next(x for x in results if x["entry"] == "hpo")
    assert reproduce_command(hpo) == "shopsim bench --tier standard --envs Replenishment-v0"
    mine = next(x for x in results if x["entry"] == "mine")
    assert reproduce_command(mine) == "shopsim bench --quick --envs Replenishment-v0 --algo mypkg.algo:Mine"
    assert reproduce_command({**hpo, "command": ["shopsim", "bench", "--tier", "standard"]}) == \
        "shopsim bench --tier standard"  # a command recorded in the results file wins
    assert "shopsim bench --tier standard --envs TwoStageRetrieval-v0 --algo mypkg.module:MyAlgo" in page


def test_a_note_says_what_differs_between_protocols(tmp_path):
    groups = group_by_env(board_results(tmp_path))
    notes = protocol_notes(groups)
    assert set(notes) == {f"{INV} [protocol 1]", f"{INV} [protocol 2]"}
    note = notes[f"{INV} [protocol 2]"]
    assert "differ in tasks, tries, eval seeds" in note and "this table has tasks 4, tries 1, eval seeds 7" in note
    assert "Replenishment-v0_p1: tasks 16, tries 4, eval seeds 0,1,2" in note


def test_learning_curve_is_the_mean_and_band_over_seeds(tmp_path):
    results = board_results(tmp_path)
    grpo = next(r for r in results if r["entry"] == "grpo")
    c = curve_of(grpo)
    assert c.metric == "dev_success" and c.n_seeds == 3 and c.x == [0, 10, 20, 30]
    assert c.mean[2] == pytest.approx(0.3) and (c.lo[2], c.hi[2]) == (0.3, 0.3)  # the missing value is skipped
    assert c.mean[1] == pytest.approx(0.2) and (c.lo[1], c.hi[1]) == (0.15, 0.25)
    assert curve_of({**grpo, "curve": None}) is None and curve_of({k: v for k, v in grpo.items() if k != "curve"}) \
        is None


def test_old_style_curve_plots_the_sparse_value_not_the_loss(tmp_path):
    """TwoStageRetrieval's panels were blank: its value is logged every 100 iterations, the rows between are
    empty, and a line without markers through isolated points draws nothing. The curve keeps only logged points."""
    results = board_results(tmp_path)
    capg = next(r for r in results if r["entry"] == "capg")
    key, x, y = read_curve(tmp_path / "runs" / "capg" / "metrics.csv", "retrieval")
    assert key == "value" and x == [99.0, 199.0, 299.0] and len(y) == 3
    c = curve_of(capg)
    assert c.metric == "value" and c.x == [99.0, 199.0, 299.0] and c.n_seeds == 1
    (tmp_path / "loss.csv").write_text("iteration,loss\n0,1.0\n1,0.5\n")
    assert read_curve(tmp_path / "loss.csv", "retrieval") is None  # a loss is no learning curve
    # a short run evaluated its value once: the per-iteration training reward is the curve then
    (tmp_path / "short.csv").write_text("iteration,loss,reward,value\n0,1.0,5.0,\n1,0.9,5.5,\n2,0.8,5.9,6.1\n")
    assert read_curve(tmp_path / "short.csv", "retrieval") == ("reward", [0.0, 1.0, 2.0], [5.0, 5.5, 5.9])
    (tmp_path / "one.csv").write_text("iteration,loss,value\n0,1.0,\n1,0.9,6.1\n")
    assert read_curve(tmp_path / "one.csv", "retrieval") == ("value", [1.0], [6.1])


def test_charts_per_table(tmp_path):
    results = board_results(tmp_path)
    groups = group_by_env(results)
    names = {k: [p.name for p in plot_env(k, rows, tmp_path / "plots")] for k, rows in groups.items()}
    assert names[SHOP] == ["Shopping-v0_success_rate.png", "Shopping-v0_families.png", "Shopping-v0_curves.png"]
    assert names[RET] == ["TwoStageRetrieval-v0_policy_value.png", "TwoStageRetrieval-v0_curves.png"]
    assert names[f"{INV} [protocol 1]"] == ["Replenishment-v0_p1_cost.png", "Replenishment-v0_p1_curves.png"]
    # same results, same bytes
    again = plot_env(SHOP, groups[SHOP], tmp_path / "plots2")
    assert [p.read_bytes() for p in again] == [(tmp_path / "plots" / p.name).read_bytes() for p in again]


def test_cost_chart_is_relative_to_s_S_on_a_log_axis(tmp_path, monkeypatch):
    """The random agent's cost (20x (s, S)) must not squash the trained rows: the bars are cost / (s, S)'s cost on
    a log axis, with the gap written on each bar."""
    from shopsim.leaderboard import charts

    seen = {}
    real_save = charts._save

    def spy(fig, path):
        ax = fig.axes[0]
        seen[path.name] = (ax.get_yscale(), [round(p.get_height(), 4) for p in ax.patches],
                           [t.get_text() for t in ax.texts], ax.get_ylabel())
        seen[path.name + ":lines"] = [(list(line.get_xdata()), line.get_marker()) for line in ax.get_lines()]
        return real_save(fig, path)

    monkeypatch.setattr(charts, "_save", spy)
    groups = group_by_env(board_results(tmp_path))
    charts.bar_chart(f"{INV} [protocol 1]", groups[f"{INV} [protocol 1]"], "cost", tmp_path)
    scale, heights, labels, ylabel = seen["Replenishment-v0_p1_cost.png"]
    assert scale == "log" and heights == [0.923, 1.0, 1.26, 20.0]
    assert labels == ["-8%", "+0%", "+26%", "+1900%"] and "s_S" in ylabel
    # the sparse CA-PG value (3 logged points in 300 rows) is drawn as a visible line with markers
    seen.clear()
    charts.curves_chart(RET, groups[RET], tmp_path)
    assert seen["TwoStageRetrieval-v0_curves.png:lines"] == [([99.0, 199.0, 299.0], ".")]


def test_render_all_page_works_in_chromium_with_linkable_tabs_and_fits_1400px(tmp_path):
    written = render_all(board_results(tmp_path), tmp_path / "board")
    page = written["html"].read_text()
    assert "http://" not in page and "https://" not in page and "<script src" not in page
    tabs = re.findall(r'<a href="#([^"]+)" data-tab=', page)
    assert tabs == ["Shopping-v0", "TwoStageRetrieval-v0", "Replenishment-v0_p1", "Replenishment-v0_p2"]
    for tab in tabs:  # each tab opened by its link, in a 1,400 px wide window
        dom = dump_dom(written["html"], fragment=tab, width=1400)
        assert 'data-ready="1"' in dom and "data-js-error" not in dom
        shown = re.findall(r'<section class="env" id="([^"]+)"(?! [^>]*hidden)[^>]*>', dom)
        assert shown == [tab], shown
        assert re.search(rf'<a href="#{tab}" data-tab="{tab}" class="active">', dom)
        scroll = int(re.search(r'data-scroll-width="(\d+)"', dom).group(1))
        client = int(re.search(r'data-client-width="(\d+)"', dom).group(1))
        assert client <= 1400 and scroll <= client, (tab, scroll, client)
    dom = dump_dom(written["html"], fragment="no-such-tab")
    assert re.findall(r'<section class="env" id="([^"]+)"(?! [^>]*hidden)[^>]*>', dom) == ["Shopping-v0"]


def test_shipped_scenario_and_multi_agent_tabs_work_in_chromium_and_fit_1400px(tmp_path):
    """The shipped standard tier's seasonal-scenario and MultiWarehouse-v0 tabs (the widest tables: per-warehouse
    cost columns and per-run values) open by their links and fit a 1,400 px window."""
    from shopsim.app.bench import shipped_results

    written = render_all(shipped_results(), tmp_path / "board", plots=False)
    page = written["html"].read_text()
    tabs = re.findall(r'<a href="#([^"]+)" data-tab=', page)
    assert {"Replenishment-v0", "Replenishment-v0_seasonal", "MultiWarehouse-v0"} <= set(tabs)
    for tab in ("Replenishment-v0_seasonal", "MultiWarehouse-v0"):
        dom = dump_dom(written["html"], fragment=tab, width=1400)
        assert 'data-ready="1"' in dom and "data-js-error" not in dom
        shown = re.findall(r'<section class="env" id="([^"]+)"(?! [^>]*hidden)[^>]*>', dom)
        assert shown == [tab], shown
        scroll = int(re.search(r'data-scroll-width="(\d+)"', dom).group(1))
        client = int(re.search(r'data-client-width="(\d+)"', dom).group(1))
        assert client <= 1400 and scroll <= client, (tab, scroll, client)
    assert "cost/warehouse_2" in page and "seasonal scenario" in page
