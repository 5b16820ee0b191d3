"""A spec's TOML table that knows its file and dotted location (every mistake one line naming file
and field), and the read-only Settings records are made of."""
from __future__ import annotations

import json
import math
import os
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from toolchain.errors import SpecError


class Settings(Mapping):
    """A read-only table of a model's settings ([export], [compile], ...):
    model.compile["optimization"]."""

    def __init__(self, items):
        self._items = dict(items)

    def __getitem__(self, key):
        return self._items[key]

    def __iter__(self):
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(json.dumps(self._items, sort_keys=True, default=str))

    def __repr__(self) -> str:
        return f"Settings({self._items!r})"


def plain(value):
    """Settings (and tuples) inside a value as plain JSON data, for records and task settings."""
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    return [plain(v) for v in value] if isinstance(value, (list, tuple)) else value


class Table:
    """A TOML table that knows its file and dotted location, for one-line error messages."""

    def __init__(self, data: dict, file: str, where: str = "") -> None:
        self.data, self.file, self.where = data, file, where
        self.used: set[str] = set()

    def loc(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where and key else self.where or key

    def fail(self, key: str, message: str) -> None:
        raise SpecError(f"{self.file}: {self.loc(key)}: {message}")

    def req(
        self, key: str, kind: type | tuple[type, ...], choices: Collection[Any] | None = None
    ) -> Any:
        if key not in self.data:
            hint = f" (one of {', '.join(choices)})" if choices else ""
            self.fail(key, f"missing required field{hint}")
        return self.opt(key, kind, None, choices)

    def opt(
        self,
        key: str,
        kind: type | tuple[type, ...],
        default: Any,
        choices: Collection[Any] | None = None,
    ) -> Any:
        self.used.add(key)
        if key not in self.data:
            return default
        value = self.data[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if not isinstance(value, kind) or (isinstance(value, bool) and bool not in kinds):
            names = (
                kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            )
            self.fail(key, f"expected {names}, got {value!r}")
        if choices is not None and value not in choices:
            self.fail(key, f"expected one of {', '.join(map(str, choices))}, got {value!r}")
        return value

    def number(self, key: str, default: float, minimum: float = 0.0) -> float:
        """A finite number >= minimum (a threshold: NaN would let everything pass, and JSON
        cannot hold it)."""
        value = float(self.opt(key, (int, float), default))
        if not math.isfinite(value) or value < minimum:
            self.fail(key, f"expected a finite number >= {minimum:g}, got {self.data[key]!r}")
        return value

    def sub(self, key: str, required: bool = True) -> "Table":
        value = self.req(key, dict) if required else self.opt(key, dict, {})
        return Table(value, self.file, self.loc(key))

    def done(self) -> None:
        """Reject unknown keys (a typo must not be silently ignored)."""
        for key in self.data:
            if key not in self.used:
                import difflib  # for an error's suggestion only: not at every load
                close = difflib.get_close_matches(key, self.used, n=1)
                hint = (
                    f"; did you mean '{close[0]}'?"
                    if close
                    else f"; known: {', '.join(sorted(self.used))}"
                )
                self.fail(key, f"unknown key{hint}")


def near(here: Path, written: str) -> str:
    """'; did you mean "data/photos"?' for a path a spec writes (relative to `here`) that does not
    exist, or ''."""
    guess = closest_path(here, written)
    return f'; did you mean "{guess}"?' if guess else ""


def closest_path(here: Path, written: str) -> str:
    """The path a spec meant by one that does not exist: its first missing part replaced by the
    closest name in the folder that holds it (the rest kept), when that path exists; '' when
    nothing is close."""
    import difflib  # for an error's suggestion only: not at every load
    parts = Path(written).parts
    for i, part in enumerate(parts):
        folder = here.joinpath(*parts[:i])
        if (folder / part).exists():
            continue
        try:
            names = [p.name for p in folder.iterdir() if not p.name.startswith((".", "__"))]
        except OSError:
            return ""
        for name in difflib.get_close_matches(part, names, n=3):
            if here.joinpath(*parts[:i], name, *parts[i + 1:]).exists():
                return os.path.join(*parts[:i], name, *parts[i + 1:])
        return ""
    return ""
