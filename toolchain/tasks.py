"""What a project's dodo.py hands doit: its configuration and every task creator, for the
models/*.toml of the folder doit runs in. A project of its own (`python -m toolchain init`) and this
repository have the same two lines:

    from toolchain.tasks import for_doit
    globals().update(for_doit())

`doit full=SM8750` adds the full verification tier for a chip; `doit extra=1` the models of
models/extra/; `doit qairt=2.49` builds this run for another QAIRT family
(docs/qairt-families.md). The table of contents is toolchain/pipeline.py: every stage in run
order, one line each (`doit list`)."""
from __future__ import annotations

import atexit
import gc
import os
import sys

from toolchain import options as settings
from toolchain import pipeline, project
from toolchain.engine import files, paths
from toolchain.engine.run import buildlock, progress, trace
from toolchain.engine.state import checker
from toolchain.stages import report


def for_doit(models_dir: str = "models") -> dict:
    """DOIT_CONFIG and the task creators (task_<stage>, task_model, task_chip) in pipeline order;
    made anew on every call, as doit loads a dodo.py once per run (and the tests load it many times
    in one process)."""
    # every variable, read once before anything runs: a bad one is one ERROR line
    options = settings.resolve()
    config = {
        "dep_file": paths.STATE_DB,
        "backend": "sqlite3sync",          # commits per task: a killed build keeps what finished
        # content decides, even when an mtime was kept
        "check_file_uptodate": checker.for_run(options["rehash"]),
        "action_string_formatting": "new",
        "par_type": "thread",              # actions only wait on child processes (docs/scale.md)
        # parallel by default: the cores it has; per-stage slots keep it sane
        "num_process": options["jobs"],
        "default_tasks": pipeline.DEFAULT,
        # `doit list`: the stages in pipeline order, not alphabetical
        "sort": "definition",
    }
    # doit ends holding ~40k objects; the interpreter's collections at exit scanned them all (a
    # tenth of a no-op). Frozen at exit, they are freed by their reference counts alone. Registered
    # once per process.
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)
    os.makedirs(paths.BUILD, exist_ok=True)   # doit opens the state DB before any task runs
    # one build per folder: a second doit here stops, naming the first
    if buildlock.hold(sys.argv):
        # then no other step is running: temp files left here are a killed step's
        files.sweep(paths.BUILD)
        buildlock.on_interrupt()   # Ctrl-C / SIGTERM: one line, finished tasks kept, no traceback
    # The tasks are made without the collector and then frozen: what loading allocates lives until
    # doit ends, so the collections it set off found nothing, and each object was scanned again as
    # it aged (~2 ms of a no-op).
    collecting = gc.isenabled()
    gc.disable()
    try:
        loaded = project.load(models_dir, options)
        # [n/N], durations, ETA; a CI log gets doit's own lines; and after a build that ran
        # something, its trace, critical path and the report written again from what is true now
        # (failed checks included)
        after = (report.after(loaded),)
        config["reporter"] = (
            trace.console(progress.requested_jobs(sys.argv, options["jobs"]), after)
            if os.environ.get("CI")
            else progress.for_run(options["jobs"], after)
        )
        return {"DOIT_CONFIG": config, **pipeline.in_pipeline_order(pipeline.task_creators(loaded))}
    finally:
        gc.freeze()
        if collecting:
            gc.enable()
