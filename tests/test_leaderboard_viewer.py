"""The trajectory viewer: HTML from trajectories and from a Parquet dataset, checked in headless Chromium."""

import re

from shopsim.cli import main
from shopsim.datasets import write_dataset
from shopsim.leaderboard.viewer import render_viewer
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
