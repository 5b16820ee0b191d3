"""The engine's own files in build/ (paths are relative: doit runs in the dodo's folder). What the
stages write there, per model, graph and chip, is toolchain/artifacts.py's."""
from __future__ import annotations

BUILD = "build"
STATE_DB = f"{BUILD}/.doit.db"
LOCKS = f"{BUILD}/.locks"   # per-stage slot files (limits.py)
BUILD_LOCK = f"{BUILD}/.build.lock"   # one doit at a time (buildlock.py)
OUTPUTS_DB = f"{BUILD}/.outputs.db"   # what each task wrote (outputs.py)
TRACE = f"{BUILD}/trace.json"   # where the last build's time went (trace.py)
TRACE_SVG = f"{BUILD}/trace.svg"   # the same as a timeline picture
TRACES = f"{BUILD}/traces"   # and the last few builds'
# how long each task took last time (progress.py's estimate)
DURATIONS = f"{BUILD}/.durations.json"
# what failed and has not passed since, and what it leaves unproven (failures.py)
FAILED = f"{BUILD}/failed.json"
