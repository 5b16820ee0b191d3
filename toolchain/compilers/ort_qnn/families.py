"""QAIRT families (families.toml): which onnxruntime-qnn wheel carries which QAIRT, which
runtime loads which binary, and where each family's isolated environment is (qairt_env.py, the
stage, makes it).

The load rule, measured (docs/qairt-families.md, tests/test_compiler_families.py): a QNN runtime
loads binaries built with its own QAIRT or an older one and refuses any built with a newer one, even
one release newer. So the user states the runtime the app ships (`[compile] runtime_qairt`) and the
build picks the newest family at or below it."""
from __future__ import annotations

import functools
import os
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from toolchain import artifacts
from toolchain.compilers.ort_qnn import ep
from toolchain.engine import versions
from toolchain.qnn import compat

TABLE = Path(__file__).with_name("families.toml")
# What a family's environment holds besides its wheel pair: what the build's steps import there
# (no torch), at the versions of the build's own environment, so a step's Python code runs the
# same on every family.
SHARED = ("onnx", "numpy", "doit", "packaging")


@dataclass(frozen=True)
class Family:
    """One QAIRT family (families.toml): the onnxruntime-qnn that carries it and what
    its binaries say."""

    name: str                 # "2.49": QAIRT major.minor
    onnxruntime_qnn: str
    onnxruntime: str
    # what the family's libQnnHtp.so reports (and every binary it makes carries)
    build_id: str
    device_config_offset: int
    # how the family's EP writes its EPContext wrapper (context.py WRAPPER)
    wrapper: dict
    default: bool = False     # the wheel of the build's own environment

    @property
    def version(self) -> str:
        """'2.49.40': the QAIRT version without the build stamp (onnxruntime_qnn's qnn_version)."""
        return ".".join(self.build_id.lstrip("v").split(".")[:3])

    def identity(self) -> dict:
        """The tool identity of the family's steps, as ep.version() gives the default's."""
        return {
            "onnxruntime": self.onnxruntime,
            "onnxruntime-qnn": self.onnxruntime_qnn,
            "qairt": self.version,
        }

    def packages(self) -> list[str]:
        return [f"onnxruntime-qnn=={self.onnxruntime_qnn}", f"onnxruntime=={self.onnxruntime}",
                *[f"{name}=={versions.version(name)}" for name in SHARED]]

    def replay(self) -> dict:
        """What the design card's per-chip step does differently for this family
        (compile.py, context.py)."""
        return {"device_config_offset": self.device_config_offset, "wrapper": dict(self.wrapper)}

    def record(self) -> dict:
        """What a deployer needs first (toolchain/qnn/compat.py), as every manifest and bundle
        leads with it."""
        return compat.requirement(self.build_id)


@functools.cache
def table() -> dict[str, Family]:
    data = tomllib.loads(TABLE.read_text())
    found = {}
    for name, row in data.items():
        if compat.family(name) != name:
            raise ValueError(f"{TABLE}: [{name!r}]: a family is named major.minor")
        found[name] = Family(name=name, **row)
    if [f.name for f in found.values() if f.default] != [max(found, key=key)]:
        raise ValueError(f"{TABLE}: the default family must be the newest, marked default = true")
    return found


key = compat.key   # families are compared by major.minor


def default() -> Family:
    return next(f for f in table().values() if f.default)


def for_runtime(runtime: str, where: str) -> Family:
    """The newest family whose binaries a runtime of `runtime` loads; a runtime older than every
    family is one line naming the ways out (after `where`, when given)."""
    prefix = f"{where}: " if where else ""
    try:
        wanted = key(runtime)
    except ValueError as err:
        raise ValueError(f"{prefix}{err}") from None
    usable = [f for f in table().values() if key(f.name) <= wanted]
    if not usable:
        oldest = min(table(), key=key)
        raise ValueError(
            f"{prefix}{runtime}: a QNN runtime of QAIRT {runtime} refuses binaries of every QAIRT "
            "this build has "
            f"({', '.join(table())}: the onnxruntime-qnn wheels; a runtime loads only binaries of "
            "its own or an older "
            f"QAIRT); ways out: ship QNN runtime libraries of QAIRT >= {oldest} with the app, or "
            "build with a real "
            f'QAIRT SDK of {runtime} (compiler = "qairt", QNN_SDK_ROOT)'
        )
    return max(usable, key=lambda f: key(f.name))


def resolve(runtime: str | None, listed: Sequence[str] | None, where: str) -> tuple[str, ...]:
    """The families one model builds: `runtime_qairt` (one runtime) or `qairt` (several, each a
    runtime version or a family); () = the default family only (today's build, nothing extra).
    Raises ValueError naming the field."""
    if runtime is not None and listed is not None:
        raise ValueError(
            f"{where}.runtime_qairt / {where.rsplit(': ', 1)[-1]}.qairt: give one (runtime_qairt = "
            "the "
            "runtime the app ships; qairt = a list of families to build)"
        )
    if runtime is not None:
        names = [for_runtime(runtime, f"{where}.runtime_qairt").name]
    elif listed is not None:
        if not listed or not all(isinstance(v, str) for v in listed):
            raise ValueError(
                f'{where}.qairt: expected a list of QAIRT versions, e.g. ["2.49", "2.51"]'
            )
        names = [for_runtime(v, f"{where}.qairt").name for v in listed]
    else:
        return ()
    unique = tuple(dict.fromkeys(names))
    return () if unique == (default().name,) else unique


def parse_var(value: str, where: str = "") -> tuple[str, ...] | None:
    """`qairt=2.49,2.51` / `qairt=all` on the command line (toolchain/options.py): this run's
    families (None: not given)."""
    if not value:
        return None
    if value == "all":
        return tuple(table())
    return tuple(dict.fromkeys(for_runtime(v, where).name for v in value.split(",")))


# ---- one environment per family
# ----------------------------------------------------------------------------

def interpreter(family: Family) -> str:
    return f"{artifacts.qairt_env_dir(family.name)}/venv/bin/python"


def project_root() -> str:
    """The folder holding the toolchain package: what a family's interpreter imports
    it from (PYTHONPATH)."""
    return str(Path(__file__).resolve().parents[3])


def environ(family: Family) -> dict:
    """The environment of a step in the family's interpreter: nothing of the
    build's own site-packages."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
    }
    return {**env, "PYTHONPATH": project_root(), "PYTHONNOUSERSITE": "1"}


def step_meta(name: str) -> dict:
    """A task's meta for a step of family `name`: its own interpreter and environment
    (worker.run), so nothing of the fork server's QAIRT (the default's) is in its process; {} for
    the build's own."""
    if not name:
        return {}
    family = table()[name]
    return {"python": interpreter(family), "python_env": environ(family)}


def tool(name: str) -> dict:
    """The tool identity a family's tasks are keyed on (the default's: the installed wheel's)."""
    return table()[name].identity() if name else ep.version()


def tool_files(name: str) -> list[str]:
    """What a family's tasks depend on as files: its environment's record (the default's:
    the wheel's libraries)."""
    return [artifacts.qairt_env(name)] if name else ep.library_files()
