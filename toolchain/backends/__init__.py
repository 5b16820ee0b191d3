"""The compilers a spec's `toolchain =` can name, behind one surface (base.Backend).
A new compiler: one folder here implementing base.Backend, plus one line in REGISTRY."""
from __future__ import annotations

import os

from toolchain.backends import ort_qnn, qairt
from toolchain.backends.base import Backend
from toolchain.qnn import sdk

REGISTRY: dict[str, type[Backend]] = {
    ort_qnn.NAME: ort_qnn.Backend,   # embedded: onnxruntime-qnn's compiler and simulator (the default)
    qairt.NAME: qairt.Backend,       # the QAIRT SDK at $QNN_SDK_ROOT, as sherpa-onnx's CI runs it
}
DEFAULT = ort_qnn.NAME


def choose_auto() -> tuple[str, str]:
    """(compiler, why) for toolchain = "auto": the QAIRT SDK when $QNN_SDK_ROOT is a complete one."""
    root = os.environ.get(sdk.ENV_ROOT)
    if not root:
        return DEFAULT, f"${sdk.ENV_ROOT} is not set"
    problems = sdk.layout_problems(root)
    if problems:
        return DEFAULT, f"${sdk.ENV_ROOT}={root} is not a complete SDK ({problems[0]})"
    return qairt.NAME, f"${sdk.ENV_ROOT}={root} is a complete SDK"
