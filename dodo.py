"""qnn-npu-compile: models/*.toml -> ONNX -> QNN HTP context binaries per chip, verified.

The table of contents is toolchain/pipeline.py: every stage in run order, one line each (`doit list`).
`doit full=SM8750` adds the full verification tier for a chip; `doit extra=1` the models of models/extra/;
`doit qairt=2.49` builds this run for another QAIRT family (docs/qairt-families.md)."""
import os
import sys

from toolchain import pipeline, project
from toolchain.engine import buildlock, checker, files, limits, paths, progress

VARIABLES = pipeline.variables()   # checked before anything runs: a bad one is one ERROR line
DOIT_CONFIG = {
    "dep_file": paths.STATE_DB,
    "backend": "sqlite3sync",          # commits per task: a killed build keeps what finished
    "check_file_uptodate": checker.MD5Checker,   # content decides, even when an mtime was kept
    "action_string_formatting": "new",
    "par_type": "thread",              # actions only wait on child processes (docs/scale.md)
    "num_process": limits.jobs(),      # parallel by default: the cores it has; per-stage slots keep it sane
    "reporter": "console" if os.environ.get("CI") else progress.ProgressReporter,   # [n/N], durations, ETA
    "default_tasks": pipeline.DEFAULT,
    "sort": "definition",              # `doit list`: the stages in pipeline order, not alphabetical
}

os.makedirs(paths.BUILD, exist_ok=True)   # doit opens the state DB before any task runs
if buildlock.hold(sys.argv):   # one build per folder: a second doit here stops, naming the first
    files.sweep(paths.BUILD)   # then no other step is running: temp files left here are a killed step's
    buildlock.on_interrupt()   # Ctrl-C / SIGTERM: one line, finished tasks kept, no traceback
PROJECT = project.load("models", full=VARIABLES["full"], extra=VARIABLES["extra"], qairt=VARIABLES["qairt"])
# task_<stage>, task_model, task_chip, in pipeline order for `doit list`
globals().update(pipeline.in_pipeline_order(pipeline.task_creators(PROJECT, VARIABLES)))
