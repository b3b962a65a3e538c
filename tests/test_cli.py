"""The command line: every usage error is one line naming the argument, with exit status 2."""

import pytest

from glassformer.cli import main


@pytest.mark.parametrize("argv,named", [
    (["translate", "--beam", "0", "x"], "--beam"),
    (["explain"], "sentence"),
    (["evaluate", "--split", "bogus"], "--split"),
    (["no-such-command"], "no-such-command"),
    (["trace"], "spec"),
])
def test_usage_errors_are_one_line_and_exit_2(argv, named, capsys):
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "error" in err[0] and named in err[0].lower()


def test_no_command_prints_help_and_exits_2(capsys):
    assert main([]) == 2
    assert "trace" in capsys.readouterr().out
