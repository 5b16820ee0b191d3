"""`python -m toolchain docs [topic]`: the user docs, shipped with the tool. The checkout's
docs/*.md are the one source; the package holds them as `docs` beside this file (in a checkout a
link to the top-level docs folder, in a wheel the pages themselves: pyproject.toml's package-data),
so one path serves both."""
from __future__ import annotations

import difflib
from pathlib import Path

PAGES = Path(__file__).with_name("docs")


class UnknownTopic(Exception):
    """A topic that names no page."""


def topics() -> dict[str, Path]:
    """{topic: page}: every docs/<topic>.md, in name order."""
    return {page.stem: page for page in sorted(PAGES.glob("*.md"))}


def title(page: Path) -> str:
    """The page's first heading, its one-line summary."""
    for line in page.read_text().splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    return ""


def listing() -> list[str]:
    """One line per topic: its name and its title."""
    found = topics()
    width = max(map(len, found), default=0)
    return [f"{topic:<{width}}  {title(page)}" for topic, page in found.items()]


def page(topic: str) -> Path:
    """The page of a topic; "docs/add-a-model.md" (how messages cite it) names the
    topic "add-a-model" too."""
    found = topics()
    name = topic.removeprefix("docs/").removesuffix(".md")
    if name in found:
        return found[name]
    close = difflib.get_close_matches(name, found, n=1)
    hint = f"did you mean '{close[0]}'?" if close else f"topics: {', '.join(found)}"
    raise UnknownTopic(
        f"unknown docs topic {topic!r}; {hint} (python -m toolchain docs lists them)"
    )
