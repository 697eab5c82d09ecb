"""A template's options (``plugins.<template>.*``) are checked as an env's and a reward's are: an option the
template does not take is the user's mistake, named with the options it does take, before anything plays."""

from __future__ import annotations

import pytest

from tests.helpers import cli_exit


@pytest.mark.parametrize(
    ("template", "option", "said"),
    [
        ("react", "plugins.react.foo=1", "template 'react' does not take options ['foo']"),
        ("tool_call", "plugins.tool_call.fmt=llama3", "template 'tool_call' does not take options ['fmt']"),
    ],
)
def test_an_option_the_template_does_not_take_exits_2_naming_the_valid_ones(tmp_path, capsys, template, option, said):
    words = ["rollout", "--env", "gridworld", "--template", template, "--expert", "--num-tasks", "1", "--model", "tiny"]
    code, stdout, stderr = cli_exit(capsys, *words, option, "-o", str(tmp_path / "out.parquet"))
    text = " ".join((stdout + stderr).split())
    assert code == 2, text
    assert said in text
    assert ("its options: (none)" if template == "react" else "its options: format") in text
    assert "bug in omrl" not in text and not (tmp_path / "out.parquet").exists()


def test_the_options_a_template_takes_still_reach_it(tmp_path, capsys):
    from omrl.data import read_episodes

    out = tmp_path / "out.parquet"
    words = [
        "rollout",
        "--env",
        "gridworld",
        "--template",
        "tool_call",
        "--expert",
        "--num-tasks",
        "1",
        "--model",
        "tiny",
    ]
    code, stdout, stderr = cli_exit(capsys, *words, "plugins.tool_call.format=llama3", "-o", str(out))
    assert code in (0, None), stdout + stderr
    (ep,) = read_episodes(out)
    reply = ep.turns[0].response
    assert '"parameters": {"direction": ' in reply and "<tool_call>" not in reply  # llama3's bare JSON
