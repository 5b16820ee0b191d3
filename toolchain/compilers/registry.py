"""The compilers a spec's `compiler =` can name, behind one surface (stages.Compiler): a new
compiler is one folder beside this module implementing stages.Compiler, plus one line in REGISTRY.
Its own module, not the package's __init__: importing one compiler (`toolchain.compilers.qairt`)
loads that compiler's modules, not every compiler's; what needs them all (the pipeline lists every
compiler's stages for `doit list`, the loader resolves `compiler =`) imports this."""
from __future__ import annotations

from toolchain.compilers import ort_qnn, qairt
from toolchain.qnn import sdk
from toolchain.stages import Compiler

REGISTRY: dict[str, type[Compiler]] = {
    # embedded: onnxruntime-qnn's compiler and simulator (the default)
    ort_qnn.NAME: ort_qnn.Compiler,
    qairt.NAME: qairt.Compiler,      # the QAIRT SDK at $QNN_SDK_ROOT, as sherpa-onnx's CI runs it
}
DEFAULT = ort_qnn.NAME


def check_families(value: str) -> str:
    """`qairt=` (toolchain/options.py): every version named is one a compiler here builds for
    (ValueError if not); each model's compiler reads the text (Compiler.families)."""
    ort_qnn.families.parse_var(value)
    return value


def choose_auto(root: str | None) -> tuple[str, str]:
    """(compiler, why) for compiler = "auto": the QAIRT SDK when `root` ($QNN_SDK_ROOT) is
    a complete one."""
    if not root:
        return DEFAULT, f"${sdk.ENV_ROOT} is not set"
    problems = sdk.layout_problems(root)
    if problems:
        return DEFAULT, f"${sdk.ENV_ROOT}={root} is not a complete SDK ({problems[0]})"
    return qairt.NAME, f"${sdk.ENV_ROOT}={root} is a complete SDK"
