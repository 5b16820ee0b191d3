"""The `qairt_env` stage: one isolated Python environment per QAIRT family a build uses
besides its own (onnxruntime-qnn wheel pair, no torch), its libQnnHtp.so's build id checked
against the family table."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TextIO

from doit.tools import config_changed

from toolchain import artifacts
from toolchain.compilers.ort_qnn.families import TABLE, Family, environ, interpreter, table
from toolchain.engine.files import write_json
from toolchain.engine.run.worker import in_process
from toolchain.errors import StageFailed
from toolchain.stages import Project


def tasks(project: Project) -> Iterator[dict]:
    for family in in_use(project):
        folder, record = artifacts.qairt_env_dir(family.name), artifacts.qairt_env(family.name)
        settings = {
            "family": family.record(),
            "packages": family.packages(),
            "python": sys.version.split()[0],
        }
        yield {
            "name": family.name,
            "owner": {"family": family.name},
            "doc": f"QAIRT {family.name}: its own Python environment (onnxruntime-qnn "
                   f"{family.onnxruntime_qnn}, "
            f"onnxruntime {family.onnxruntime}; no torch) under {folder}, build id checked",
            "targets": [record],
            "clean": [(shutil.rmtree, (folder, True))],
            "actions": [(in_process, (make_env, family.name, folder, record))],
            "uptodate": [_env_intact(family), config_changed(settings)],
        }


def _env_intact(family: Family) -> Callable[..., bool]:
    """A removed or damaged environment is rebuilt (its record alone does not make it usable)."""
    def check(task: object, values: object) -> bool:
        return os.access(interpreter(family), os.X_OK) and os.path.isfile(
            artifacts.qairt_env(family.name)
        )
    return check


def in_use(project: Project) -> list[Family]:
    """The non-default families some model builds (the default one is the
    build's own environment)."""
    names = dict.fromkeys(f for m in project.models for f in m.qairt if f)   # "": the build's own
    return [table()[n] for n in names]


PROBE = (
    "import json, onnxruntime_qnn, onnxruntime_qnn.build_and_package_info as info, onnxruntime as "
    "ort\n"
    # ctypes in a process that never makes a session (the pitfall)
    "from toolchain.qnn import qnnbin\n"
    "print(json.dumps({'onnxruntime_qnn': info.__version__, 'qnn_version': info.qnn_version, "
    "'onnxruntime': ort.__version__, 'htp': qnnbin.htp_build_id(), 'library': "
    "onnxruntime_qnn.__file__}))"
)


def make_env(name: str, folder: str, record: str) -> None:
    """A fresh venv with the family's pinned packages, then proof that its libQnnHtp.so
    is the family's."""
    family = table()[name]
    venv = Path(folder, "venv")
    shutil.rmtree(venv, ignore_errors=True)
    if os.path.exists(record):
        os.unlink(record)
    Path(folder).mkdir(parents=True, exist_ok=True)
    log = Path(folder, "env.log")
    with open(log, "w") as out:
        _step(
            [sys.executable, "-m", "venv", str(venv)], out, f"QAIRT {name}: python -m venv failed"
        )
        pip = [
            str(venv / "bin/python"),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-input",
            *family.packages(),
        ]
        _step(
            pip,
            out,
            f"QAIRT {name}: pip could not install {' '.join(family.packages()[:2])} (is the "
            "package "
            "registry reachable?)",
            log,
        )
    probe = subprocess.run(
        [interpreter(family), "-c", PROBE], capture_output=True, text=True, env=environ(family)
    )
    if probe.returncode:
        raise StageFailed(f"QAIRT {name}: the new environment cannot load its wheel: "
                          f"{(probe.stderr.strip().splitlines() or ['?'])[-1]} (log {log})")
    found = json.loads(probe.stdout.strip().splitlines()[-1])
    if found["htp"]["buildId"] != family.build_id:
        raise StageFailed(
            f"QAIRT {name}: {found['library']}'s libQnnHtp.so reports {found['htp']['buildId']}, "
            "the "
            f"family table ({TABLE.name}) says {family.build_id}"
        )
    if not found["library"].startswith(str(venv.resolve())) and not found["library"].startswith(
        str(venv)
    ):
        raise StageFailed(
            f"QAIRT {name}: the environment imports onnxruntime_qnn from {found['library']}, not "
            "its own"
        )
    write_json(
        record,
        {
            "family": family.record(),
            "packages": family.packages(),
            "python": interpreter(family),
            "probe": found,
            "libraries": _libraries(found["library"]),
        },
    )


def _step(argv: list[str], out: TextIO, failure: str, log: Path | None = None) -> None:
    out.write(f"$ {' '.join(argv)}\n")
    out.flush()
    rc = subprocess.call(argv, stdout=out, stderr=subprocess.STDOUT)
    if rc:
        out.flush()
        last = [
            line for line in Path(out.name).read_text(errors="replace").splitlines() if line.strip()
        ]
        raise StageFailed(
            f"{failure}: {last[-1] if last else f'exit {rc}'} (log {log or out.name})"
        )


def _libraries(package_init: str) -> dict:
    """Sizes of the family's QNN libraries: the environment's record changes when they do."""
    folder = Path(package_init).parent
    return {p.name: p.stat().st_size for p in sorted(folder.glob("lib*.so"))}
