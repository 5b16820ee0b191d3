"""What failed and has not passed since, and what it leaves unproven (build/failed.json): for each
task that failed (it ran and did not succeed), its one-line reason, its own targets (a failed
check's record holds its numbers) and the targets of every task that depends on it, directly or not.
Kept across builds until the task succeeds, so a later build of another part still knows, and
written only by a build that ran something (a no-op reads nothing). What to do about it is the
stages' (the report shows it; what claimed the old result is removed there)."""
from __future__ import annotations

import json
import os

from toolchain.engine import paths
from toolchain.engine.files import atomic_path


def load() -> dict[str, dict]:
    try:
        with open(paths.FAILED) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def reason(fail) -> str:
    """A failure's first line (a StageFailed's message; doit's own for an error)."""
    lines = [
        line.strip() for line in str(getattr(fail, "message", "") or fail.get_msg()).splitlines()
    ]
    return next((line for line in lines if line), fail.get_name())


def downstream(deps: dict[str, set[str]], failed: str) -> set[str]:
    """The tasks that read, directly or not, what `failed` makes (deps: each
    task's dependencies)."""
    users: dict[str, set[str]] = {}
    for name, needs in deps.items():
        for need in needs:
            users.setdefault(need, set()).add(name)
    found, todo = set(), [failed]
    while todo:
        for user in users.get(todo.pop(), ()):
            if user not in found:
                found.add(user)
                todo.append(user)
    return found


def update(
    tasks: dict, deps: dict[str, set[str]], succeeded: set[str], failed: dict[str, str]
) -> dict[str, dict]:
    """The record after a build: this build's failures added, the tasks that succeeded (or no
    longer exist) dropped."""
    before = load()
    record = {name: entry for name, entry in before.items()
              if name in tasks and name not in succeeded and name not in failed}
    for name, why in failed.items():
        blocked = downstream(deps, name)
        record[name] = {"reason": why, "targets": sorted(tasks[name].targets),
                        "blocked": sorted({t for user in blocked for t in tasks[user].targets})}
    if record != before:
        if record:
            with atomic_path(paths.FAILED) as tmp:
                tmp.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
        elif os.path.exists(paths.FAILED):
            os.remove(paths.FAILED)
    return record
