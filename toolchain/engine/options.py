"""The build's settings as data (doit's own `opt_*` dicts are the model): each row a
command-line variable (`doit name=value`) and/or its environment twin, with its parser, default
and doc. `resolve()` reads them once, when dodo.py loads, into one frozen Options that the
stages and the engine are given; nothing reads a variable or its twin anywhere else
(tests/architecture.py counts it).

One precedence rule for every row: the command line, else the environment, else the default; an
empty value is not given. One error for a bad value: OptionError, one `ERROR:` line naming the
variable (doit prints InvalidDodoFile so). """
from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from doit.exceptions import InvalidDodoFile


class OptionError(InvalidDodoFile):
    """A bad command-line variable or environment value: one line naming it."""


@dataclass(frozen=True)
class Option:
    """One `doit` variable and its environment twin: name, parser, default and one line of doc."""

    # the key of Options; also the command-line name when `variable`
    name: str
    # the text given -> the value; raises ValueError("expected ...")
    parse: Callable[[str], Any]
    default: Any
    doc: str
    env: str | None = None             # its environment twin
    variable: bool = True              # settable as `doit name=value` (False: environment only)
    # two valid texts for the per-row precedence test: [0] as the environment's (not the
    # default, when there is a twin), [1] as the command line's (not the default, for a variable
    # without a twin)
    examples: tuple[str, str] = ("", "")
    secret: bool = False               # never repeated in a message or a repr
    shown_default: str = ""            # the docs' words for a default that depends on the machine

    def spelled(self) -> str:
        """How a user sets it: `name=` and/or `$ENV`."""
        return " / ".join(
            [*([f"{self.name}="] if self.variable else []), *([f"${self.env}"] if self.env else [])]
        )


@dataclass(frozen=True)
class Options:
    """The resolved settings of one doit run: options["cache"]. A name not in the table is a
    KeyError naming it."""
    values: Mapping[str, Any]
    # where each value came from: "command line", "$ENV"
    given: Mapping[str, str] = field(default_factory=dict)

    def __getitem__(self, name: str) -> Any:
        if name not in self.values:
            raise KeyError(f"no option {name!r}; known: {', '.join(self.values)}")
        return self.values[name]

    def __repr__(self) -> str:   # the values of secret rows stay out of every log
        return f"Options({', '.join(sorted(self.values))})"


def command_line(argv: Iterable[str]) -> dict[str, str]:
    """The `name=value` words of doit's command line, by doit's own rule (DoitMain.process_args: a
    word not starting with '-' that holds '='); doit keeps them only in a private global, so they
    are read from argv."""
    found = {}
    for word in argv:
        if word and word[0] != "-" and "=" in word:
            name, value = word.split("=", 1)
            found[name] = value
    return found


def resolve(
    table: Iterable[Option], given: Mapping[str, str], environ: Mapping[str, str] = os.environ
) -> Options:
    """Every row's value: `given` (the command line) over `environ` over the
    default. Raises OptionError."""
    rows = list(table)
    variables = [r.name for r in rows if r.variable]
    for name, value in given.items():
        if name not in variables:
            import difflib  # for an error's suggestion only: not at every load
            close = difflib.get_close_matches(name, variables, n=1)
            hint = f"did you mean {close[0]}=?" if close else f"known: {', '.join(variables)}"
            raise OptionError(f"command line: unknown variable {name}={value}; {hint}")
    values, sources = {}, {}
    for row in rows:
        text, where = _given(row, given, environ)
        if not text:
            values[row.name] = row.default
            continue
        try:
            values[row.name] = row.parse(text)
        except ValueError as err:
            shown = "…" if row.secret else text
            raise OptionError(f"{where}={shown}: {err}") from None
        sources[row.name] = where
    return Options(values, sources)


def _given(row: Option, given: Mapping[str, str], environ: Mapping[str, str]) -> tuple[str, str]:
    if row.variable and given.get(row.name):
        return given[row.name], f"command line: {row.name}"
    if row.env and environ.get(row.env):
        return environ[row.env], f"${row.env}"
    return "", ""


# ---- parsers: each takes the text and returns the value, or raises ValueError("expected ...") ----

def flag(text: str) -> bool:
    if text not in ("0", "1"):
        raise ValueError("expected 1 or 0")
    return text == "1"


def choice(*allowed: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in allowed:
            raise ValueError(f"expected {' or '.join(allowed)}")
        return text
    return parse


def integer(minimum: int | None = None) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ValueError("expected a whole number") from None
        if minimum is not None and value < minimum:
            raise ValueError(f"expected a whole number of at least {minimum}")
        return value
    return parse


def number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError("expected a number") from None
    if value != value or value < 0:
        raise ValueError("expected a number of at least 0")
    return value


def text(value: str) -> str:
    return value


def table_markdown(table: Iterable[Option]) -> str:
    """The rows as the Markdown table the docs carry (tests/test_docs.py holds the docs to it)."""
    lines = ["| setting | default | what it does |", "|---|---|---|"]
    for row in table:
        default = row.shown_default or (
            "—" if row.default in (None, "", (), {}) else f"`{_shown(row.default)}`"
        )
        lines.append(f"| {row.spelled()} | {default} | {row.doc} |")
    return "\n".join(lines)


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)
