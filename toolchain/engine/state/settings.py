"""What decides a step's output, as the dict doit's config_changed compares: made from the
arguments its action is handed, so a chip, a precision or an I/O record is written once per task,
not once for the action and again for the settings; a value equal to its declared default is left
out, so a setting added with a default keeps every older result current (nothing rebuilds until a
spec declares it)."""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def task_settings(
    arguments: Mapping[str, Any],
    keys: Iterable[str] = (),
    defaults: Mapping[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """`keys` of the step's `arguments` (a key it lacks is left out) and `extra`, without any value
    equal to its entry in `defaults`."""
    defaults = defaults or {}
    found = {k: arguments[k] for k in keys if k in arguments}
    found.update(extra)
    return {k: v for k, v in found.items() if k not in defaults or v != defaults[k]}
