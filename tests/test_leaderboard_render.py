"""Rendering: Markdown/CSV contents, plots, and the HTML page checked in headless Chromium."""

import csv
import io
import re

from shopsim.leaderboard.protocols import Protocol
from shopsim.leaderboard.render import group_by_env, render_all, to_csv, to_markdown
from shopsim.leaderboard.results import find_results, make_results, write_results
from tests.fixtures.headless import dump_dom


def _m(mean, half=None):
    return {"mean": mean, "std": 0.0, "ci95": None if half is None else [mean - half, mean + half], "n": 3,
            "per_seed": [mean] * 3}


def sample_results(tmp_path):
    shop = Protocol(env_id="shopsim/Shopping-v0", family="shopping", task_ids=(1, 2, 3), seeds=(0, 1, 2), tries=4)
    inv = Protocol(env_id="shopsim/Replenishment-v0", family="inventory", task_ids=(5,), seeds=(0, 1, 2), tries=4)
    curve = tmp_path / "runs" / "metrics.csv"
    curve.parent.mkdir(parents=True)
    curve.write_text("iteration,loss,success_rate\n0,1.0,0.1\n1,0.8,0.3\n2,0.5,0.4\n")
    recs = [
        make_results(protocol=shop, entry="random", kind="reference", metrics={
            "success_rate": _m(0.05, 0.02), "score": _m(0.2), "pass^1": _m(0.05), "pass^4": _m(0.0)}),
        make_results(protocol=shop, entry="expert", kind="reference", metrics={
            "success_rate": _m(0.95, 0.01), "score": _m(0.97), "pass^1": _m(0.95), "pass^4": _m(0.81)}),
        make_results(protocol=shop, entry="grpo", kind="trained", budget={"mode": "quick", "iterations": 3},
                     metrics={"success_rate": _m(0.4, 0.1), "score": _m(0.6), "success/bundle": _m(0.25)},
                     curve="../../runs/metrics.csv"),
        make_results(protocol=shop, entry="mpo", kind="trained", metrics={}, status="error",
                     error="RuntimeError: boom | pipe"),
        make_results(protocol=inv, entry="s_S", kind="reference", metrics={"cost": _m(100.0, 5.0),
                                                                            "gap_to_s_S_pct": _m(0.0)}),
        make_results(protocol=inv, entry="hpo", kind="trained", metrics={"cost": _m(90.0, 4.0),
                                                                          "gap_to_s_S_pct": _m(-10.0, 1.0)}),
    ]
    for r in recs:
        write_results(tmp_path / "results" / r["env_id"].split("/")[1] / f"{r['entry']}.json", r)
    return find_results(tmp_path / "results")


def test_tables_sorted_best_first_with_intervals(tmp_path):
    results = sample_results(tmp_path)
    groups = group_by_env(results)
    assert [r["entry"] for r in groups["shopsim/Shopping-v0"]] == ["expert", "grpo", "random", "mpo"]
    assert [r["entry"] for r in groups["shopsim/Replenishment-v0"]] == ["hpo", "s_S"]  # lower cost first
    md = to_markdown(results)
    assert "## shopsim/Shopping-v0" in md and "## shopsim/Replenishment-v0" in md
    assert "| expert | reference | 0.950 ± 0.010 | — | 0.970 |" in md
    assert "success/bundle" in md and "| grpo | trained | 0.400 ± 0.100 | 0.250 | 0.600 |" in md
    assert "error: RuntimeError: boom \\| pipe" in md  # pipes escaped inside a cell
    rows = list(csv.DictReader(io.StringIO(to_csv(results))))
    hpo = next(r for r in rows if r["entry"] == "hpo")
    assert float(hpo["cost"]) == 90.0 and float(hpo["cost_ci_lo"]) == 86.0 and hpo["success_rate"] == ""


def test_render_all_writes_plots_and_a_working_html_page(tmp_path):
    results = sample_results(tmp_path)
    written = render_all(results, tmp_path / "board")
    pngs = sorted(p.name for p in (tmp_path / "board" / "plots").glob("*.png"))
    assert pngs == ["Replenishment-v0_cost.png", "Shopping-v0_curves.png", "Shopping-v0_families.png",
                    "Shopping-v0_success_rate.png"]
    page = written["html"].read_text()
    assert page.count("data:image/png;base64,") == 4 and "http" not in page.replace("http-equiv", "")
    dom = dump_dom(written["html"])
    assert 'data-ready="1"' in dom, "the page script did not finish"
    assert "data-js-error" not in dom, re.findall(r'data-js-error="[^"]*"', dom)
    assert 'data-rows="6"' in dom
    for entry in ("expert", "grpo", "random", "mpo", "s_S", "hpo"):
        assert f'data-entry="{entry}"' in dom
    # the first tab is shown, the second hidden, by the script
    assert re.search(r'<section class="env" id="Shopping-v0"[^>]*data-env="shopsim/Shopping-v0"', dom)
    assert re.search(r'id="Replenishment-v0"[^>]*hidden', dom) and not re.search(r'id="Shopping-v0"[^>]*hidden', dom)


def test_entries_from_different_protocols_get_separate_tables(tmp_path):
    results = sample_results(tmp_path)
    other = Protocol(env_id="shopsim/Replenishment-v0", family="inventory", task_ids=(5, 6), seeds=(7,), tries=1)
    results.append(make_results(protocol=other, entry="ppo", kind="trained", metrics={"cost": _m(80.0)}))
    groups = group_by_env(results)
    assert [r["entry"] for r in groups["shopsim/Replenishment-v0 [protocol 1]"]] == ["hpo", "s_S"]
    assert [r["entry"] for r in groups["shopsim/Replenishment-v0 [protocol 2]"]] == ["ppo"]
    assert "2 tasks × 1 tries per eval seed, seeds 7" in to_markdown(results)


def test_scenario_rows_get_their_own_table_and_per_agent_costs_their_columns(tmp_path):
    from shopsim.leaderboard.page import to_html

    results = sample_results(tmp_path)
    seasonal = Protocol(env_id="shopsim/Replenishment-v0", family="inventory", task_ids=(5,), seeds=(0, 1, 2),
                        tries=4, env_kwargs={"seasonality": 0.7}, scenario="seasonal")
    multi = Protocol(env_id="shopsim/MultiWarehouse-v0", family="inventory", task_ids=(9,), seeds=(0,), tries=1)
    per_wh = {f"cost/warehouse_{w}": _m(10.0 + w) for w in (10, 2, 0, 1)}
    results += [make_results(protocol=seasonal, entry="hpo", kind="trained", metrics={"cost": _m(50.0)}),
                make_results(protocol=seasonal, entry="s_S", kind="reference", metrics={"cost": _m(70.0)}),
                make_results(protocol=multi, entry="s_S", kind="reference", metrics={"cost": _m(33.0), **per_wh})]
    groups = group_by_env(results)
    # the seasonal rows are not ranked with the default scenario's (same task ids and seeds, other env options)
    assert list(groups)[-3:] == ["shopsim/Replenishment-v0", "shopsim/Replenishment-v0:seasonal",
                                 "shopsim/MultiWarehouse-v0"]
    assert [r["entry"] for r in groups["shopsim/Replenishment-v0:seasonal"]] == ["hpo", "s_S"]
    assert [r["entry"] for r in groups["shopsim/Replenishment-v0"]] == ["hpo", "s_S"]
    md = to_markdown(results)
    head = next(line for line in md.split("## shopsim/MultiWarehouse-v0")[1].splitlines() if line.startswith("| rank"))
    assert "| cost | cost/warehouse_0 | cost/warehouse_1 | cost/warehouse_2 | cost/warehouse_10 |" in head
    page = to_html(results)
    assert 'id="Replenishment-v0_seasonal"' in page and "seasonal scenario" in page
    assert 'id="MultiWarehouse-v0"' in page and "the cost of warehouse_0 alone" in page


def test_entry_names_are_markdown_text_not_markup(tmp_path):
    """leaderboard.md took entry names as they were, so a name could inject HTML or links (index.html escaped
    them); every markup character is now escaped, in the tables and the heading."""
    shop = Protocol(env_id="shopsim/Shopping-v0", family="shopping", task_ids=(1,), seeds=(0,), tries=1)
    names = ["<img src=x onerror=alert(1)>", "[click](http://evil.example)", "**bold**", "`code`", "&#x202E;x",
             "_under_", "a|b", "s_S"]
    recs = [make_results(protocol=shop, entry=n, kind="reference", metrics={"success_rate": _m(0.1 * i)})
            for i, n in enumerate(names)]
    for i, r in enumerate(recs):
        write_results(tmp_path / f"{i}.json", r)
    md = to_markdown(find_results(tmp_path))
    for raw in ("<img", "[click]", "**bold**", "`code`", "&#x202E;", "_under_"):  # never without its backslash
        assert not re.search(r"(?<!\\)" + re.escape(raw), md), raw
    for escaped in ("\\<img src=x onerror=alert(1)\\>", "\\[click\\](http://evil.example)", "\\*\\*bold\\*\\*",
                    "\\`code\\`", "\\&#x202E;x", "\\_under\\_", "a\\|b", "| s_S |"):
        assert escaped in md, escaped
    rows = list(csv.DictReader(io.StringIO(to_csv(find_results(tmp_path)))))
    assert sorted(r["entry"] for r in rows) == sorted(names)  # the CSV holds the names as they are
