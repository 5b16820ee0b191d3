"""The pipeline: every stage in run order, the one list `dodo.py`, `doit`'s default tasks,
the `model:` / `chip:` aliases and the concurrency slots are made from. A new stage is one
module plus one line here (or in its compiler's `stages`, compilers/<name>/__init__.py,
placed where COMPILERS stands)."""
from __future__ import annotations

import dataclasses
import functools
import sys
import types
from inspect import Signature, isfunction, signature

from toolchain import artifacts
from toolchain.compilers import registry
from toolchain.deploy import bundle, chip_index, runtime, sherpa
from toolchain.engine import cache
from toolchain.engine.cache import sign
from toolchain.engine.options import OptionError
from toolchain.engine.run import limits
from toolchain.engine.state import outputs
from toolchain.errors import SpecError
from toolchain.phone import device, step0
from toolchain.spec import chips as chip_table
from toolchain.stages import (
    Project,
    Stage,
    calibrate,
    checkpoint,
    diagnose,
    export,
    inspect,
    manifest,
    parity,
    report,
    rewrite_check,
    simplify,
    verify,
)


def _compiler_stages() -> tuple:
    """Each compiler's own stages in run order; a stage two compilers both have (the design card's
    `convert` and `modellib`) is one doit stage whose tasks are both compilers' (task names hold the
    model, so they never clash)."""
    merged: dict[str, Stage] = {}
    for compiler in registry.REGISTRY.values():
        for stage in compiler.stages:
            known = merged.get(stage.name)
            if known is None:
                merged[stage.name] = stage
                continue
            if (known.scope, known.default, known.output_kind) != (
                stage.scope,
                stage.default,
                stage.output_kind,
            ):
                raise ValueError(
                    f"stage {stage.name}: two compilers declare it with another scope, default or "
                    "output kind"
                )
            merged[stage.name] = dataclasses.replace(
                known,
                tasks=functools.partial(_both, known.tasks, stage.tasks),
                doc=f"{known.doc} | {stage.doc}",
                threads=max(known.threads, stage.threads),
                memory_gb=max(known.memory_gb, stage.memory_gb),
            )
    return tuple(merged.values())


def _both(first, second, project):
    return [*first(project), *second(project)]


COMPILERS = _compiler_stages()
# Every stage that runs the x86 HTP simulator holds a slot of one pool: a full-tier verify beside
# a default one, or the sherpa gate beside a verify, would be two ~2-thread simulators fighting
# over 2 cores.
SIMULATOR = "simulator"
# What the heavy steps import: the fork server imports them once, before its first
# fork (engine/run/zygote.py).
PRELOAD = ("numpy", "onnx", "onnxruntime", "torch", "onnxsim")
RESULT = "result"   # a stage whose outputs no later step checks (stages.OUTPUT_KINDS)
STAGES = (
    Stage(
        "checkpoint",
        checkpoint.tasks,
        "Pinned original checkpoint -> PyTorch checkpoint, per model.",
        "model",
    ),
    Stage("export", export.tasks, "Checkpoint -> static-shape ONNX, per graph.", "graph"),
    Stage("simplify", simplify.tasks, "ONNX -> onnxsim ONNX, per graph.", "graph"),
    Stage(
        "inspect",
        inspect.tasks,
        "Hard I/O check of the simplified ONNX, per graph.",
        "graph",
        output_kind=RESULT,
    ),
    Stage(
        "parity",
        parity.tasks,
        "ONNX on CPU vs the model's reference on real inputs: per call for each group "
        "of graphs judged together (gates their compiles), then the model's own measures.",
        "model",
        output_kind=RESULT,
    ),
    Stage(
        "rewrite_check",
        rewrite_check.tasks,
        "Rewritten graphs vs unrewritten on the CPU, per model that declares rewrites.",
        "model",
        output_kind=RESULT,
    ),
    Stage(
        "calibrate",
        calibrate.tasks,
        "Real calibration inputs (raw files + input list), per w8a16 graph.",
        "graph",
    ),
    *COMPILERS,  # each compiler's own stages: graph -> context binary per chip, read back
    Stage(
        "verify",
        functools.partial(verify.tasks, tier="default"),
        "HTP simulator vs CPU ONNX, default tier, per model and chip.",
        "model@chip",
        threads=2,
        pool=SIMULATOR,
        output_kind=RESULT,
    ),
    Stage(
        "verify_full",
        functools.partial(verify.tasks, tier="full"),
        "HTP simulator vs CPU ONNX on every sample (the model's own metric), per model and chip; "
        "opt-in.",
        "model@chip",
        default=False,
        threads=2,
        pool=SIMULATOR,
        output_kind=RESULT,
    ),
    Stage(
        "diagnose",
        diagnose.tasks,
        "The first op whose simulator output departs from the CPU, per model and "
        "chip; on demand (a failed verify names it).",
        "model@chip",
        default=False,
        threads=2,
        pool=SIMULATOR,
        output_kind=RESULT,
    ),
    Stage(
        "manifest",
        manifest.tasks,
        "JSON record next to each chip's binaries, per model and chip.",
        "model@chip",
        output_kind=RESULT,
    ),
    Stage(
        "runtime",
        runtime.tasks,
        "QNN runtime libraries an app ships (names, versions, license terms), "
        "per compiler and chip.",
        "compiler@chip",
        default=False,
    ),
    Stage(
        "bundle",
        bundle.tasks,
        "Phone bundles (.tar.bz2: onnxruntime EPContext; sherpa-onnx where its contract "
        "holds), per model and chip.",
        "model@chip",
        default=False,
        output_kind=RESULT,
    ),
    Stage(
        "sherpa",
        functools.partial(sherpa.tasks, tier="default"),
        "sherpa-onnx's Whisper loop on the unpacked sherpa bundle via the QNN C API, default tier, "
        "per model and chip.",
        "model@chip",
        threads=2,
        pool=SIMULATOR,
        output_kind=RESULT,
    ),
    Stage(
        "sherpa_full",
        functools.partial(sherpa.tasks, tier="full"),
        "sherpa-onnx's Whisper loop on every clip of the bundle (WER), per model and chip; opt-in.",
        "model@chip",
        threads=2,
        pool=SIMULATOR,
        output_kind=RESULT,
    ),
    Stage("report", report.tasks, "Summary table of the whole build.", "build", output_kind=RESULT),
    Stage(
        "chip_index",
        chip_index.tasks,
        "build/chip-index.json: chip -> soc id -> arch -> bundle -> sha256, for the "
        "app's NPU-or-CPU choice.",
        "build",
        default=False,
        output_kind=RESULT,
    ),
    Stage(
        "device",
        device.tasks,
        "Attached phone (opt-in): choose by ro.soc.model, push, run, compare, measure; per model.",
        "phone",
        default=False,
        output_kind=RESULT,
    ),
    Stage(
        "step0",
        step0.task,
        "Attached phone (opt-in): is the NPU "
        "likely worth it for a process running today's CPU path?",
        "phone",
        default=False,
        output_kind=RESULT,
    ),
)
NAMES = tuple(s.name for s in STAGES)
DEFAULT = [s.name for s in STAGES if s.default]
ALIASED = {"model", "graph", "graph@chip", "model@chip"}   # scopes whose tasks belong to one model


def default_slots(jobs: int, memory: float | None = None) -> dict[str, int]:
    """Each stage's slots on a machine of `jobs` steps at once, from its threads and measured peak
    memory (limits.slots_for)."""
    memory = memory or limits.memory_gb()
    found = {s.name: limits.slots_for(s.threads, s.memory_gb, jobs, memory) for s in STAGES}
    return {name: n for name, n in found.items() if n}


def slots(options) -> dict[str, int]:
    """Each stage's slots this run: the measured defaults for options["jobs"], overridden
    by options["limits"]."""
    return {**default_slots(options["jobs"]), **options["limits"]}


def task_creators(project: Project) -> dict:
    """{"task_<stage>": creator} for dodo.py, every stage's tasks made once, plus the aliases. What
    the engine adds to each task (its slots, worker mode, cache, rehash) comes from the run's
    options (project.options)."""
    options, made = project.options, {}
    given = {
        "workers": options["workers"],
        "preload": PRELOAD,
        cache.SETTINGS: cache_settings(options),
    }
    per_stage = slots(options)
    for stage in STAGES:
        tasks = stage.tasks(project)
        meta = {**given, "slots": per_stage.get(stage.name, 0), "pool": stage.pool or stage.name,
                cache.KIND: stage.output_kind}
        made[stage.name] = _engine(tasks, meta, options["rehash"]) if isinstance(tasks, dict) else \
            [_engine(t, meta, options["rehash"]) for t in tasks]
    creators = {f"task_{s.name}": _creator(made[s.name], s.doc) for s in STAGES}
    # the aliases end with a report of what they built (data, as the report stage's)
    meta = {**given, "slots": 0, "pool": "report", cache.KIND: "data"}
    creators["task_model"] = _creator(
        [_engine(t, meta, options["rehash"]) for t in model_aliases(project, made)],
        "All tasks of one model.",
    )
    creators["task_chip"] = _creator(
        [_engine(t, meta, options["rehash"]) for t in chip_aliases(project, made)],
        "All tasks of one chip, across models.",
    )
    unknown_aliases(sys.argv[1:], project)
    return creators


def unknown_aliases(argv: list[str], project: Project) -> None:
    """`doit model:<x>` or `chip:<x>` naming no model or chip of this build: one line with the name
    meant. doit reads its task names only after loading the dodo and would say just 'Invalid
    parameter'; this is the last point where the tool sees them (sys.argv, as doit was started).
    Wildcards and other tasks are doit's."""
    models = [m.name for m in project.models]
    built = [name for name in project.chips if any(name in m.chips for m in project.models)]
    for arg in argv:
        kind, colon, name = arg.partition(":")
        if not colon or kind not in ("model", "chip") or not name or any(c in name for c in "*?[="):
            continue
        if name in (models if kind == "model" else built):
            continue
        import difflib  # for an error's suggestion only: not at every load
        if kind == "model":
            close = difflib.get_close_matches(name, models, n=1)
            hint = (
                f"did you mean 'model:{close[0]}'?"
                if close
                else f"models: {', '.join(models) or 'none'}"
            )
            raise SpecError(f"command line: {arg}: no model named {name!r}; {hint}")
        if name in project.chips:
            raise SpecError(
                f"command line: {arg}: no model builds for {name}; the chips models list: "
                f"{', '.join(built)} (a model's `chips` in its spec)"
            )
        raise SpecError(f"command line: {arg}: {chip_table.unknown(name, project.chips)}")


def cache_settings(options) -> cache.Settings:
    """What the engine's cache is given (task meta), from this run's options. The signing key's file
    is read here, when the build loads (one line if it is no key; never its content), not by the
    first step that stores."""
    key = options["cache_sign_key"]
    if key:
        try:
            sign.check_secret(key)
        except ValueError as err:
            raise OptionError(f"{options.given['cache_sign_key']}={key}: {err}") from None
    return cache.Settings(
        where=options["cache"],
        upload=options["cache_upload"],
        max_blob=options["cache_max_blob"],
        timeout=options["cache_timeout"],
        retry=options["cache_retry"],
        ca=options["cache_ca"],
        token=options["cache_token"],
        user=options["cache_user"],
        password=options["cache_password"],
        sign_key=options["cache_sign_key"],
        trust=options["cache_trust"],
    )


def _engine(task: dict, meta: dict, rehash: bool) -> dict:
    """What the engine adds to every task: its slot count and worker mode, and its outputs as part
    of its state (recorded after it succeeds; a target changed since makes it stale: outputs.py)."""
    task = dict(task)
    # No capture: under `doit -n N` (threads) doit swaps the one sys.stdout per python-action, and
    # overlapping swaps leave it pointing at a finished task's buffer (the summary table vanished).
    # A step's own output goes to its log (worker.py); what a task prints in doit's process is meant
    # for the console.
    task.setdefault("io", {"capture": False})
    own = task.get("meta", {})
    # whom it is built for (stages.named), read by the aliases, the trace and the CI matrix
    owner = {"owner": task.pop("owner")} if "owner" in task else {}
    task["meta"] = {**own, **owner, **meta}
    # a task may narrow what a cache may give it, never widen it (a converted checkpoint no
    # later step checks)
    kinds = [k for k in (own.get(cache.KIND), meta.get(cache.KIND)) if k in cache.KINDS]
    if kinds:
        task["meta"][cache.KIND] = max(kinds, key=cache.KINDS.index)
    if task.get("targets") and task.get("actions"):
        task["actions"] = [*task["actions"], outputs.record]
        task["uptodate"] = [*task.get("uptodate", []), (outputs.intact, (), {"rehash": rehash})]
    if task.get("uptodate"):
        task["uptodate"] = [_signed(check) for check in task["uptodate"]]
    return task


_SIGNATURES: dict[type, Signature] = {}


def _signed(check):
    """An uptodate check with its signature attached (`__signature__`, which inspect.signature
    returns as it is):
    doit asks for the signature of every check of every task on every run, to pass it `task` and
    `values`, and building them cost a no-op `doit` of 20 models x 10 chips 60 ms. A check object's
    (config_changed) is its class's, the same for all its instances."""
    function = check[0] if isinstance(check, tuple) else check
    if isfunction(function):
        if "__signature__" not in function.__dict__:
            function.__signature__ = signature(function)
    elif callable(function) and hasattr(function, "__dict__") and not isinstance(function, type):
        kind = type(function)
        if kind not in _SIGNATURES:
            _SIGNATURES[kind] = signature(function)
        function.__signature__ = _SIGNATURES[kind]
    return check


def _creator(tasks, doc: str):
    def create():
        # doit takes a generator
        return tasks if isinstance(tasks, dict) else (task for task in tasks)
    create.__doc__ = doc
    return create


def in_pipeline_order(creators: dict) -> dict:
    """dodo.py's namespace: the creators of task_creators() under names that sort in pipeline order.
    doit orders creators by name (inspect.getmembers), then by the line they are defined on; one
    `def` makes all of them, so only the name can keep checkpoint first in `doit list`. The task's
    name is the object's `basename`."""
    found = {}
    for number, (key, create) in enumerate(creators.items()):
        create.basename = key.removeprefix("task_")
        found[f"stage_{number:02d}_{create.basename}"] = types.SimpleNamespace(
            create_doit_tasks=create
        )
    return found


def _default_tasks(made: dict):
    for stage in STAGES:
        if stage.default and stage.scope in ALIASED:
            for task in made[stage.name]:
                yield stage.name, task


def _owned(made: dict, part: str) -> dict[str | None, list[str]]:
    """The default tasks ("<stage>:<name>") by their owner's `part` ("model" or "chip"), in
    pipeline order: one pass over the tasks (one per model or chip made a no-op `doit` of 20 models
    x 10 chips 75 ms slower)."""
    found: dict[str | None, list[str]] = {}
    for stage, task in _default_tasks(made):
        owner = task["meta"].get("owner")
        if owner is None:   # the stage's own mistake, never a user's
            raise ValueError(f"{stage}:{task['name']}: a model's task has no owner (stages.named)")
        found.setdefault(owner.get(part), []).append(f"{stage}:{task['name']}")
    return found


def model_aliases(project: Project, made: dict):
    """`model:<name>`: every default task of one model (a misspelt name fails, where a wildcard
    matching nothing would silently succeed)."""
    owned = _owned(made, "model")
    for model in project.models:
        deps = owned.get(model.name, [])
        yield {
            "name": model.name,
            "doc": f"every task of {model.name} (compiler {model.compiler}), then "
            f"{artifacts.model_report(model)}",
            "task_dep": deps,
            **report.of_part(
                project,
                [(m, c) for m, c in project.model_chips() if m is model],
                artifacts.model_report(model),
            ),
        }


def chip_aliases(project: Project, made: dict):
    """`chip:<CHIP>`: every default per-chip task, across models."""
    owned = _owned(made, "chip")
    for chip in project.chips.values():
        if any(chip.name in m.chips for m in project.models):
            deps = owned.get(chip.name, [])
            yield {
                "name": chip.name,
                "doc": f"every model's tasks for {chip.name}, then "
                f"{artifacts.chip_report(chip.name)}",
                "task_dep": deps,
                **report.of_part(
                    project,
                    [(m, c) for m, c in project.model_chips() if c.name == chip.name],
                    artifacts.chip_report(chip.name),
                ),
            }

