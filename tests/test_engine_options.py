"""The settings mechanism (toolchain/engine/options.py): doit's own rule for `name=value` words, one
precedence rule, one error type."""
from __future__ import annotations

import pytest

from toolchain.engine.options import Option, OptionError, Options, command_line, integer, resolve


def test_the_command_line_words_are_read_by_doits_rule():
    assert command_line(
        ["list", "-n", "2", "full=SM8750", "--db-file=x", "chip:SM8750", "a=b=c"]
    ) == {"full": "SM8750", "a": "b=c"}


def test_one_rule_and_one_error():
    rows = (
        Option("runs", integer(0), 10, "runs", env="RUNS"),
        Option("quiet", integer(0), 0, "env only", env="QUIET", variable=False),
    )
    assert resolve(rows, {}, {})["runs"] == 10
    assert resolve(rows, {}, {"RUNS": "3"})["runs"] == 3
    assert resolve(rows, {"runs": "4"}, {"RUNS": "3"})["runs"] == 4
    assert resolve(rows, {"runs": "4"}, {"RUNS": "3"}).given["runs"] == "command line: runs"
    with pytest.raises(OptionError, match=r"^\$RUNS=x: expected a whole number$"):
        resolve(rows, {}, {"RUNS": "x"})
    with pytest.raises(OptionError, match=r"^command line: unknown variable quiet=1; known: runs$"):
        resolve(rows, {"quiet": "1"}, {})
    with pytest.raises(OptionError, match=r"did you mean runs=\?"):
        resolve(rows, {"run": "1"}, {})


def test_a_name_not_in_the_table_is_a_key_error_naming_it():
    with pytest.raises(KeyError, match="no option 'cahce'"):
        Options({"cache": None})["cahce"]
