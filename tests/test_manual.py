"""The docs that ship with the tool (toolchain/manual.py, `python -m toolchain docs`): the topics a
user needs, one line each, a page by its topic, a near miss answered with the topic meant, and every
page the tool's messages cite (`docs/<page>.md` in a string the toolchain prints or writes) is a
topic, so `python -m toolchain docs <page>` opens it from a wheel install too (tests/test_init.py
runs that from a wheel)."""
from __future__ import annotations

import ast
import re

import pytest
from conftest import ROOT

from toolchain import __main__ as cli
from toolchain import manual

CITED = re.compile(r"docs/([\w.-]+)\.md")


def test_the_user_docs_are_topics_with_one_line_each(capsys):
    assert {"add-a-model", "usage", "outputs", "precision", "models"} <= set(manual.topics())
    # the checkout's docs/, as is
    assert manual.topics().keys() == {p.stem for p in (ROOT / "docs").glob("*.md")}
    assert cli.main(["docs"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(manual.topics())
    assert any(re.fullmatch(r"add-a-model +Add your own model", line) for line in lines), lines


def test_a_topic_prints_its_page_and_path(capsys):
    assert cli.main(["docs", "add-a-model"]) == 0
    assert capsys.readouterr().out == (ROOT / "docs/add-a-model.md").read_text()
    assert cli.main(["docs", "usage", "--path"]) == 0
    assert capsys.readouterr().out.strip() == str((ROOT / "docs/usage.md").resolve())
    # as the messages cite a page
    assert manual.page("docs/precision.md") == manual.page("precision")


def test_an_unknown_topic_is_one_line_with_did_you_mean(capsys):
    assert cli.main(["docs", "add-model"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == ("error: unknown docs topic 'add-model'; did you mean 'add-a-model'? "
                            "(python -m toolchain docs lists them)\n")
    with pytest.raises(manual.UnknownTopic, match="topics: add-a-model, architecture"):
        manual.page("zzzz")


def _message_strings(path) -> list[str]:
    """The string constants of a module that are not docstrings: what it prints,
    raises or writes."""
    tree = ast.parse(path.read_text())
    docs = {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and n.body
        and isinstance(n.body[0], ast.Expr)
        and isinstance(n.body[0].value, ast.Constant)
    }
    return [
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
    ]


def test_every_page_the_tool_cites_to_a_user_is_a_topic():
    cited = {page for path in (ROOT / "toolchain").rglob("*.py") for text in _message_strings(path)
             for page in CITED.findall(text)}
    cited |= {
        page
        for path in (ROOT / "toolchain/template").iterdir()
        for page in CITED.findall(path.read_text())
    }
    assert cited, "no message cites a page: the check would prove nothing"
    assert not cited - set(manual.topics()), cited - set(manual.topics())
    planted = "see docs/no-such-page.md"
    # the check can fail
    assert set(CITED.findall(planted)) - set(manual.topics()) == {"no-such-page"}
