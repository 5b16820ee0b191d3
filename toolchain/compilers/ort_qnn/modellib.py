"""QNN graph recording (<graph>.c) -> model library lib<graph>.so for x86_64-linux, once per graph,
with the system's C compiler against the project's own declarations (csrc/include; no Qualcomm
header). The library reads its weights from the file the caller passes (csrc/model_lib.c), not from
the working folder. The compiler's identity and its command line are this stage's settings (Ninja's
rule): another gcc or other flags rebuild. aarch64-android libraries would need an NDK, which does
not install here: not built (docs/design-card.md)."""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

from doit.tools import config_changed

from toolchain import artifacts
from toolchain.compilers.ort_qnn import ep
from toolchain.engine.files import sha256
from toolchain.engine.run import external
from toolchain.engine.state import stamps
from toolchain.spec.records import Model
from toolchain.stages import Project, named

TARGET = "x86_64-linux"
CSRC = Path(__file__).with_name("csrc")
WRAPPER = CSRC / "model_lib.c"
# -O0: the recording is straight-line code run once per compile; -O1 took 4.7x longer to build
# it (80-node graph)
FLAGS = ("-shared", "-fPIC", "-O0", "-w", "-fvisibility=hidden")


def compiler() -> str | None:
    """$CC, else cc or gcc on PATH."""
    named = os.environ.get("CC")
    return shutil.which(named) if named else (shutil.which("cc") or shutil.which("gcc"))


@functools.cache
def compiler_identity(path: str) -> str:
    """First line of `<cc> --version` (e.g. 'gcc (Debian 12.2.0-14+deb12u1) 12.2.0'). Asked again
    only when the compiler's file changed (its stamp, stamps.py): a process started at every load
    was ~1% of a no-op `doit`."""
    real = os.path.realpath(path)
    st = os.stat(real)
    known = stamps.recall("version", real, st)
    if known is None:
        out = subprocess.run(
            [path, "--version"], capture_output=True, text=True, check=False
        ).stdout
        known = (out.splitlines() or ["unknown"])[0].strip()
        stamps.learn("version", real, st, known)
    return known


def missing_compiler_message() -> str:
    return (
        "no C compiler found ($CC, cc or gcc): the embedded toolchain builds each graph's model "
        "library with "
        "it; install one (Debian/Ubuntu: apt-get install gcc) or set CC"
    )


def argv(cc: str, source_c: str, out: str) -> list[str]:
    """The command line; the recording is included by file name from its own folder (-iquote), so no
    absolute path of this checkout enters the command or the library."""
    return [
        cc,
        *FLAGS,
        f"-I{os.path.relpath(CSRC / 'include')}",
        f"-iquote{os.path.dirname(source_c)}",
        f'-DQNC_GRAPH_SOURCE="{os.path.basename(source_c)}"',
        os.path.relpath(WRAPPER),
        "-o",
        out,
    ]


def portable(command: list[str]) -> list[str]:
    """The command line with the shipped sources' folder written `<csrc>`: the same wherever
    the toolchain is."""
    here = os.path.relpath(CSRC)
    return [arg.replace(here, "<csrc>") for arg in command]


@functools.cache
def shipped_sources() -> dict[str, str]:
    """{path under csrc/: sha256} of the sources every model library is built from."""
    return {
        p.relative_to(CSRC).as_posix(): sha256(p) for p in sorted(CSRC.rglob("*")) if p.is_file()
    }


def tasks(project: Project) -> Iterator[dict]:
    cc = compiler()
    for model in project.models_of(ep.NAME):
        for family in model.qairt or ("",):   # a family's recording is its own: so is its library
            yield from _tasks(model, family, cc)


def _tasks(model: Model, family: str, cc: str | None) -> Iterator[dict]:
    for graph in model.graphs:
        if not ep.uses_route(graph):
            continue
        source_c, lib = (
            artifacts.qnn_source(model, graph, family),
            artifacts.model_lib(model, graph, TARGET, family),
        )
        log = artifacts.stage_log(model, graph, "modellib", family=family)
        record = artifacts.stage_record(model, graph, "modellib", family=family)
        command = argv(cc or "cc", source_c, lib)
        identity = compiler_identity(cc) if cc else None
        # the settings name the shipped sources by content, not by where the
        # toolchain sits (relocatable)
        settings = {
            "argv": portable(command),
            "compiler": identity,
            "target": TARGET,
            "sources": shipped_sources(),
        }
        yield {
            **named(model, graph, family=family),
            "doc": f"{model.name}/{graph.name}: {graph.name}.c -> lib{graph.name}.so ({TARGET}, "
            f"{identity or 'no C compiler'})",
            # relative, as the command names them: the artifact cache keys on the paths
            # a task names
            "file_dep": [
                source_c,
                os.path.relpath(WRAPPER),
                os.path.relpath(CSRC / "include" / "QnnInterface.h"),
            ],
            "targets": [lib, record, log],
            "clean": True,
            "actions": [(external.action, (command, {}, log, [lib], record))],
            "uptodate": [config_changed(settings)],
        }
