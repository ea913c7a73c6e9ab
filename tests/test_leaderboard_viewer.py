"""The trajectory viewer: HTML from trajectories and from a Parquet dataset, checked in headless Chromium."""

import html
import math
import re

from shopsim.app.cli import main
from shopsim.datasets import write_dataset
from shopsim.leaderboard.viewer import inventory_series, read_dataset, render_viewer, rounded
from shopsim.rollout import collect
from shopsim.testing import COUNT_ID, CountRandom, make_count_env
from shopsim.trajectory import Trajectory, Turn
from tests.fixtures.headless import dump_dom


def test_viewer_shows_turns_flags_and_escapes_text():
    t = Trajectory(env_id="shopsim/Shopping-v0", task_id=3, seed=7, strategy="ask-first", agent="lm", turns=[
        Turn(observation="<b>page</b> & more", action="search[red shoes]", reward=0.0,
             info={"invalid_action": "no such button"}),
        Turn(observation="x" * 50, action="click[buy]", reward=1.0, terminated=True,
             info={"success": True, "score": 1.0, "episode_metrics": {"success": 1.0}}),
    ])
    page = render_viewer([t], max_chars=20)
    assert "&lt;b&gt;page&lt;/b&gt; &amp; more" in page and "<b>page</b>" not in page
    assert "no such button" in page and "search[red shoes]" in page and "ask-first" in page
    assert "[30 more characters]" in page and "terminated" in page


def test_viewer_page_from_a_dataset_runs_in_chromium(tmp_path):
    trajs = collect(COUNT_ID, CountRandom(), env_fns=[make_count_env] * 2, num_envs=2, episodes=5, seed=3,
                    progress=False)
    data = write_dataset(tmp_path / "d.parquet", trajs)
    out = tmp_path / "view.html"
    assert main(["view", str(data), "--out", str(out)]) == 0
    dom = dump_dom(out)
    assert 'data-ready="1"' in dom and "data-js-error" not in dom
    assert 'data-episodes="5"' in dom
    # exactly one episode section is shown after the script ran
    shown = re.findall(r'<section class="episode" data-i="(\d+)">', dom)
    assert shown == ["0"], shown
    n_invalid = sum(1 for t in trajs for turn in t.turns if turn.info.get("invalid_action"))
    assert dom.count('class="invalid"') == n_invalid > 0


def test_view_missing_dataset_is_a_clear_error(tmp_path, capsys):
    assert main(["view", str(tmp_path / "none.parquet"), "--out", str(tmp_path / "v.html")]) == 2
    assert "no such dataset" in capsys.readouterr().err


# ------------------------------------------------------------------------ issue 19: what the viewer shows
def _list_rows(page: str) -> list[list[str]]:
    """The cells of each row of the episode list."""
    rows = re.findall(r'<tr class="ep[^"]*" data-i="\d+">(.*?)</tr>', page)
    return [re.findall(r"<td[^>]*>(.*?)</td>", r) for r in rows]


def _header(page: str) -> list[str]:
    head = re.search(r'<div id="list">.*?<thead><tr>(.*?)</tr>', page).group(1)
    return re.findall(r"<th>(.*?)</th>", head)


def test_family_and_strategy_columns_from_a_rollout_with_strategies(tmp_path):
    data = tmp_path / "shop.parquet"
    assert main(["rollout", "--env", "shopsim/Shopping-v0", "--agent", "expert", "--episodes", "4", "--strategy",
                 "ask_first", "compare_two", "--family", "find_and_buy", "bundle", "--out", str(data),
                 "--no-progress"]) == 0
    page = render_viewer(read_dataset(data))
    head = _header(page)
    rows = [dict(zip(head, cells, strict=True)) for cells in _list_rows(page)]
    assert [r["strategy"] for r in rows] == ["ask_first", "compare_two", "ask_first", "compare_two"]
    assert [r["family"] for r in rows] == ["find_and_buy", "bundle", "find_and_buy", "bundle"]
    # a rollout without --strategy ran free: the column says so instead of staying blank
    t = Trajectory(env_id="shopsim/Shopping-v0", task_id=1, turns=[Turn(observation="Task: x", action="a")])
    assert dict(zip(_header(render_viewer([t])), _list_rows(render_viewer([t]))[0], strict=True))["strategy"] == "none"


def test_rollout_rejects_an_unknown_strategy_and_strategies_off_shopping(tmp_path, capsys):
    out = str(tmp_path / "d.parquet")
    assert main(["rollout", "--env", "shopsim/Shopping-v0", "--agent", "expert", "--episodes", "1",
                 "--strategy", "be_nice", "--out", out]) == 2
    assert "not a Shopping strategy; choose from recommend_directly" in capsys.readouterr().err
    assert main(["rollout", "--env", "shopsim/Replenishment-v0", "--agent", "s_S", "--episodes", "1",
                 "--strategy", "ask_first", "--out", out]) == 2
    assert "has no strategies" in capsys.readouterr().err


def test_task_is_shown_once_per_episode_not_on_every_turn():
    task = "Task: find me red shoes, size 9"
    t = Trajectory(env_id="shopsim/Shopping-v0", task_id=3, strategy="ask_first", turns=[
        Turn(observation=f"{task}\nStrategy: Ask first.\nPage: search", action="search[red shoes]"),
        Turn(observation=f"{task}\nStrategy: Ask first.\nPage: results\n[B1] Red Shoe $9", action="click[B1]"),
        Turn(observation=f"{task}\nStrategy: Ask first.\nPage: product", action="buy", terminated=True,
             info={"success": True}),
    ])
    page = render_viewer([t])
    assert page.count(task) == 1 and page.count("Strategy: Ask first.") == 1
    assert re.search(r'<p class="task">Task: find me red shoes, size 9\nStrategy: Ask first.</p>', page)
    assert "Page: results\n[B1] Red Shoe $9" in page  # the rest of each observation stays


def test_numbers_are_rounded_not_raw_floats():
    t = Trajectory(env_id="shopsim/ProactiveRec-v0", task_id=1, turns=[
        Turn(observation={"scores": [0.123456789012345, 2.0]}, action=[3, 24], reward=0.14149901270866394,
             info={"CTR": 0.14149901270866394, "IoR": -164.0, "success": False, "ids": [5000, 12]}),
    ])
    page = html.unescape(render_viewer([t]))
    assert "0.123456789012345" not in page and "0.14149901270866394" not in page
    assert '"scores": [0.1235, 2]' in page and '"CTR": 0.1415' in page and '"IoR": -164' in page
    assert '"ids": [5000, 12]' in page  # integers stay exact
    r = rounded({"a": [1.23456e-7, float("nan")], "b": 123456.7})
    assert r["a"][0] == 1.235e-7 and math.isnan(r["a"][1]) and r["b"] == 123500 and isinstance(r["b"], int)


def _replenishment_trajectory(episodes=1):
    import agents

    env_id = "shopsim/Replenishment-v0"
    return collect(env_id, agents.make("s_S", env_id), episodes=episodes, seed=0, num_envs=1, progress=False)


def test_replenishment_episode_is_a_chart_of_stock_orders_and_demand():
    [t] = _replenishment_trajectory()
    s = inventory_series(t)
    obs = [turn.observation for turn in t.turns]
    # the env's flow identity: on_hand(t+1) = on_hand(t) + arrivals(t) - demand(t), summed over SKUs (backlog mode)
    for j in range(len(obs) - 1):
        arrivals = sum(row[0] for row in obs[j]["pipeline"])
        assert abs(s["demand"][j] - (sum(obs[j]["on_hand"]) + arrivals - sum(obs[j + 1]["on_hand"]))) < 1e-3
    assert math.isnan(s["demand"][-1])
    assert s["ordered"] == [sum(o * q for o, q in zip(turn.action["order"], turn.action["quantity"], strict=True))
                            for turn in t.turns]
    assert s["cost"] == [turn.info["cost"] for turn in t.turns] and sum(s["ordered"]) > 0
    page = render_viewer([t])
    section = page[page.index('<section class="episode"'):]
    assert section.count("<svg") == 1 and "stock (on hand" in section and "demand" in section
    assert '"on_hand"' not in section and '"past_demand"' not in section  # no raw observation arrays
    assert len(re.findall(r"<tr><td>\d+</td>", section)) == t.num_turns  # one table row per period
    # --max-charts bounds the matplotlib work; the table stays
    capped = render_viewer([t], max_charts=0)
    assert "<svg" not in capped and "chart left out" in capped
    assert render_viewer([t]) == page  # same episode, same bytes (stable SVG ids, no date)


def test_cost_env_shows_no_success_and_no_failure():
    t = Trajectory(env_id="shopsim/Replenishment-v0", task_id=5, turns=[
        # a vector env fills a missing info key with a default: success False must still not read as a failure
        Turn(observation="o", action="a", reward=-10.0, terminated=True, info={"success": False, "cost": 10.0}),
    ])
    page = render_viewer([t])
    [cells] = _list_rows(page)
    assert dict(zip(_header(page), cells, strict=True))["success"] == "—"
    assert 'class="ep fail"' not in page and "success no" not in page
    shop = Trajectory(env_id="shopsim/Shopping-v0", task_id=5, turns=[
        Turn(observation="o", action="a", terminated=True, info={"success": False})])
    assert 'class="ep fail"' in render_viewer([shop]) and "success no" in render_viewer([shop])


def test_replenishment_page_runs_in_chromium(tmp_path):
    trajs = _replenishment_trajectory(episodes=2)
    data = write_dataset(tmp_path / "inv.parquet", trajs)
    out = tmp_path / "inv.html"
    assert main(["view", str(data), "--out", str(out)]) == 0
    dom = dump_dom(out)
    assert 'data-ready="1"' in dom and "data-js-error" not in dom and 'data-episodes="2"' in dom
    assert dom.count("<svg") == 2
