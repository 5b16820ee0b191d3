"""The one table of settings (toolchain/options.py): every row resolved by the one precedence rule,
a bad value one error naming it, the docs' table made from it."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from toolchain import options, pipeline
from toolchain.engine.options import OptionError, table_markdown

ROWS = {row.name: row for row in options.TABLE}
DOCS = Path(__file__).resolve().parents[1] / "docs/usage.md"


@pytest.mark.parametrize("name", sorted(ROWS))
def test_each_row_takes_the_command_line_over_the_environment_over_its_default(name):
    row = ROWS[name]
    first, second = (row.parse(text) for text in row.examples)
    assert first != second, "examples that tell the sources apart"
    assert (first if row.env else second) != row.default
    assert options.resolve_given({}, {})[name] == row.default
    environment = {row.env: row.examples[0]} if row.env else {}
    given = {name: row.examples[1]} if row.variable else {}
    if row.env:
        assert options.resolve_given({}, environment)[name] == first
        assert options.resolve_given({}, {row.env: ""})[name] == row.default   # empty: not given
    if row.variable:
        assert options.resolve_given(given, {})[name] == second
        assert options.resolve_given({name: ""}, environment)[name] == (
            first if row.env else row.default
        )
        assert options.resolve_given(given, environment)[name] == second   # the command line wins
    else:
        with pytest.raises(OptionError, match=f"unknown variable {name}="):
            options.resolve_given({name: row.examples[1]}, {})


BAD = {
    "full": "SM1",
    "corpus": "maybe",
    "extra": "yes",
    "qairt": "2.40",
    "jobs": "0",
    "limits": "compile=2",
    "workers": "spawn",
    "rehash": "true",
    "cache": "http://:8080/",
    "cache_upload": "no",
    "cache_timeout": "soon",
    "cache_retry": "-1",
    "cache_max_blob": "big",
    "cache_ca": "/no/such/ca.pem",
    "cache_trust": "ci-1:c2hvcnQ=",
    "kind": "tflite",
    "runs": "x",
    "interval": "fast",
    "minutes": "nan",
    "input_seconds": "-3",
    "pid": "x",
    "seconds": "a",
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_bad_value_is_one_option_error_naming_the_variable(name):
    row = ROWS[name]
    if row.variable:
        with pytest.raises(OptionError, match=rf"^command line: {name}={re.escape(BAD[name])}: \S"):
            options.resolve_given({name: BAD[name]}, {})
    if row.env:
        with pytest.raises(OptionError, match=rf"^\${row.env}={re.escape(BAD[name])}: \S"):
            options.resolve_given({}, {row.env: BAD[name]})


def test_every_row_that_can_be_wrong_is_tried():
    # any text is a value
    plain = {name for name, row in ROWS.items() if row.parse.__name__ == "text"}
    assert set(ROWS) - plain == set(BAD)


def test_a_secret_is_never_in_a_message_or_a_repr():
    resolved = options.resolve_given(
        {},
        {
            "QNN_CACHE_TOKEN": "s3cret-token",
            "QNN_CACHE_PASSWORD": "s3cret-pw",
            "QNN_CACHE": "https://cache.example.com/",
        },
    )
    settings = pipeline.cache_settings(resolved)
    assert settings.token == "s3cret-token" and settings.password == "s3cret-pw"
    assert "s3cret" not in repr(resolved) and "s3cret" not in repr(settings)


def test_the_engine_gets_the_resolved_values_in_each_task():
    """QNN_REHASH=0 once turned rehashing on in the pipeline while the checker left it off:
    one value now."""
    resolved = options.resolve_given(
        {"workers": "fresh"}, {"QNN_REHASH": "0", "QNN_CACHE": "/tmp/qnn-cache-x"}
    )
    assert resolved["rehash"] is False and resolved["workers"] == "fresh"
    settings = pipeline.cache_settings(resolved)
    assert (
        str(settings.where) == "/tmp/qnn-cache-x"
        and settings.upload is True
        and settings.timeout == 5.0
    )


def test_the_docs_carry_the_table():
    """docs/usage.md's "Settings" holds the table as `python -m toolchain.options` prints it."""
    assert table_markdown(options.TABLE) in DOCS.read_text()


def test_a_path_that_cannot_be_expanded_or_read_is_one_line():
    """~nobody/ and a CA file that is not there: the row's one line at load, not a traceback in
    a task later."""
    with pytest.raises(OptionError, match=r"^command line: cache=~no-such-user-here/c: "):
        options.resolve_given({"cache": "~no-such-user-here/c"}, {})
    with pytest.raises(OptionError, match=r"^\$QNN_CACHE_CA=/no/such/ca.pem: no such file$"):
        options.resolve_given({}, {"QNN_CACHE_CA": "/no/such/ca.pem"})
