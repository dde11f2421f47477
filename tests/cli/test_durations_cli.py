"""Every duration flag of the CLI reads the one grammar: `calque ramp --ttl 1h30m` and `1h 30m` both work."""

from __future__ import annotations

import click
import pytest
from calque.cli.main import cli
from click.testing import CliRunner

FLAGS = [
    ("ramp", "--ttl"),
    ("ramp", "--rung-timeout"),
    ("ramp", "--wait-timeout"),
    ("pool stage-runtime", "--ttl"),
    ("pool submit", "--timeout"),
    ("pool worker", "--idle-timeout"),
    ("session checkout", "--wait-timeout"),
]


def _option(path: str, flag: str) -> click.Option:
    cmd: click.Command = cli
    for name in path.split():  # groups load their commands lazily: ask, as click does
        assert isinstance(cmd, click.Group)
        sub = cmd.get_command(click.Context(cmd), name)
        assert sub is not None, name
        cmd = sub
    (opt,) = [p for p in cmd.params if isinstance(p, click.Option) and flag in p.opts]
    return opt


@pytest.mark.parametrize(("path", "flag"), FLAGS)
@pytest.mark.parametrize("text", ["5400", "90m", "1h30m", "1h 30m", "1.5h"])
def test_every_duration_flag_reads_every_spelling(path: str, flag: str, text: str) -> None:
    opt = _option(path, flag)
    assert opt.type.convert(text, opt, None) == 5400


@pytest.mark.parametrize(("path", "flag"), FLAGS)
def test_a_bad_duration_is_a_usage_error_with_examples(path: str, flag: str) -> None:
    # the flag given on the command line is converted before click looks for missing required options
    result = CliRunner().invoke(cli, [*path.split(), flag, "forever"])
    assert result.exit_code == 2
    assert f"{flag} 'forever' is not a duration: write e.g. 90, 90s, 30m, 1.5h, 1h30m, '1h 30m' or 2d" in result.output
