"""The QAIRT SDK toolchain ($QNN_SDK_ROOT): its tools' argv, the converter's Python and the
preflight; the SDK's layout is qnn/sdk.py's (the phone reads it too)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from toolchain.errors import SpecError
from toolchain.qnn.layout import ANDROID, HOST, c_name, device_libraries
from toolchain.qnn.sdk import ENV_ROOT, UTILITY, Sdk, layout_problems, read_build_id
from toolchain.spec.chips import ChipRecord
from toolchain.spec.records import Model
from toolchain.stages import Compiler

NAME = "qairt"
ENV_PYTHON = "QAIRT_PYTHON"   # its default and its reading: toolchain/options.py
# Android 16 KB-page devices (LDFLAGS=-Wl,-z,max-page-size=16384, as sherpa-onnx's workflows)
PAGE_SIZE = 16384
CONVERTER_MODULES = ("onnx", "numpy", "qti.aisw.converters")   # what the converter imports first


def graph_name(cpp: str) -> str:
    """The QNN graph name the converter derives from its output file: the basename, every non-word
    character as '_' (net.b.cpp -> graph net_b)."""
    return c_name(Path(cpp).stem)


def runtime_libraries(sdk: Sdk, chip: ChipRecord) -> dict:
    """What an app ships beside this chip's binaries, taken from the same SDK that compiled them."""
    return {
        "sdk_root": sdk.root,
        "build_id": sdk.build_id,
        **device_libraries(chip["htp_arch"]),
        "bundled_here": False,
        "note": "copy these from the SDK named here; put the Skel's folder on ADSP_LIBRARY_PATH",
    }


def model_lib_targets(sdk: Sdk, android_libs: str) -> list[str]:
    """Targets the model-lib generator builds: aarch64-android only with an NDK
    (or when required)."""
    wanted = android_libs == "required" or (android_libs == "auto" and sdk.ndk_build is not None)
    return [HOST, ANDROID] if wanted else [HOST]


def env(sdk: Sdk, ldflags: bool = False) -> dict:
    """Environment the tools need (what envsetup.sh sets); path lists are prepended
    to the caller's."""
    found = {
        ENV_ROOT: sdk.root,
        "PYTHONPATH": f"{sdk.root}/lib/python",
        "LD_LIBRARY_PATH": f"{sdk.root}/lib/{HOST}",
    }
    if ldflags:
        found["LDFLAGS"] = f"-Wl,-z,max-page-size={PAGE_SIZE}"
    return found


def converter_argv(
    sdk: Sdk, onnx: str, cpp: str, input_list: str | None = None, extra: Sequence[str] = ()
) -> list[str]:
    """qnn-onnx-converter, float graph; a calibration list adds native raw inputs; `extra`: the
    graph's own converter_args ([graphs.<g>.compile]), last, so they override the defaults."""
    argv = [
        sdk.python,
        sdk.tool("qnn-onnx-converter"),
        "--input_network",
        onnx,
        "--output_path",
        cpp,
    ]
    if input_list:
        argv += ["--input_list", input_list, "--use_native_input_files"]
    return argv + ["--act_bitwidth", "16", "--bias_bitwidth", "32", *extra]


# qnn-onnx-converter flags a spec may add per graph (QAIRT 2.x `--help`); value-taking ones take
# the next word.
CONVERTER_FLAGS = {
    "--act_bitwidth": True,
    "--weights_bitwidth": True,
    "--bias_bitwidth": True,
    "--float_bitwidth": True,
    "--float_bias_bitwidth": True,
    "--act_quantizer": True,
    "--param_quantizer": True,
    "--algorithms": True,
    "--percentile_calibration_value": True,
    "--use_per_channel_quantization": False,
    "--use_per_row_quantization": False,
    "--disable_batchnorm_folding": False,
    "--keep_disconnected_nodes": False,
    "--quantization_overrides": True,
    "--float_fallback": False,
    "--preserve_io": False,
    "--define_symbol": True,
    "--apply_masked_softmax": True,
    "--restrict_quantization_steps": True,
    "--pack_4_bit_weights": False,
    "--keep_weights_quantized": False,
}
CONVERTER_MANAGED = {
    "--input_network",
    "--output_path",
    "--input_list",
    "--use_native_input_files",
    "-i",
    "-o",
}


def converter_arg_problems(args: object) -> list[str]:
    """What is wrong with a graph's converter_args (one reason per mistake)."""
    if not isinstance(args, (list, tuple)) or not all(isinstance(a, str) for a in args):
        return [f"expected a list of strings (flags and their values), got {args!r}"]
    found, expect_value = [], False
    for arg in args:
        if expect_value:
            expect_value = False
            continue
        if arg in CONVERTER_MANAGED:
            found.append(
                f"{arg} is set by the build (the graph's ONNX, outputs and calibration list)"
            )
        elif arg not in CONVERTER_FLAGS:
            import difflib  # for an error's suggestion only: not at every load
            close = difflib.get_close_matches(arg, CONVERTER_FLAGS, n=1)
            found.append(
                f"{arg}: not a qnn-onnx-converter flag"
                + (f"; did you mean '{close[0]}'?" if close else "")
            )
        else:
            expect_value = CONVERTER_FLAGS[arg]
    if expect_value:
        found.append(f"{args[-1]} takes a value")
    return found


def modellib_argv(sdk: Sdk, cpp: str, weights: str, out_dir: str, targets: list[str]) -> list[str]:
    """qnn-model-lib-generator: no -t when both targets are built, as the guide runs it."""
    argv = [
        sdk.python,
        sdk.tool("qnn-model-lib-generator"),
        "-c",
        cpp,
        "-b",
        weights,
        "-o",
        out_dir,
    ]
    return argv if set(targets) == {HOST, ANDROID} else argv + ["-t", *targets]


def context_argv(
    sdk: Sdk, model_lib: str, out_dir: str, binary_file: str, config_file: str
) -> list[str]:
    """qnn-context-binary-generator on the x86_64 lib and backend (as sherpa-onnx's
    workflows run it)."""
    return [sdk.tool("qnn-context-binary-generator"), "--backend", sdk.host_lib("libQnnHtp.so"),
            "--model", model_lib, "--output_dir", out_dir, "--binary_file", binary_file,
            "--config_file", config_file]


def utility_argv(sdk: Sdk, binary: str, json_file: str) -> list[str]:
    return [sdk.tool(UTILITY), "--context_binary", binary, "--json_file", json_file]


def netrun_argv(sdk: Sdk, binary: str, input_list: str, out_dir: str) -> list[str]:
    """qnn-net-run on a context binary with the x86_64 HTP backend (float32 raw files
    in and out)."""
    return [
        sdk.tool("qnn-net-run"),
        "--backend",
        sdk.host_lib("libQnnHtp.so"),
        "--retrieve_context",
        binary,
        "--input_list",
        input_list,
        "--output_dir",
        out_dir,
    ]


def python_problems(python: str, root: str) -> tuple[str | None, list[str]]:
    """(version, problems) of the converter's Python: it must run and find
    the converter's modules."""
    fix = (
        "install Python 3.10 with the SDK's deps (python3 "
        "$QNN_SDK_ROOT/bin/check-python-dependency), "
        f"or set {ENV_PYTHON}=/path/to/that/python"
    )
    resolved = shutil.which(python)
    if not resolved:
        return None, [f"the converter's Python {python!r} was not found: {fix}"]
    code = (
        "import importlib.util as u, json, sys\ndef ok(m):\n try: return u.find_spec(m) is not "
        "None\n"
        " except ImportError: return False\nprint(json.dumps(['%d.%d' % sys.version_info[:2], "
        f"[m for m in {list(CONVERTER_MODULES)!r} if not ok(m)]]))"
    )
    done = subprocess.run([resolved, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": f"{root}/lib/python"})
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return None, [f"the converter's Python {resolved} does not run ({tail}): {fix}"]
    version, missing = json.loads(done.stdout.strip().splitlines()[-1])
    return version, ([f"the converter's Python {resolved} (Python {version}) cannot import "
                      f"{', '.join(missing)}: {fix}"] if missing else [])


def preflight(models: list[Model], chips: dict, root: str | None, python: str) -> Sdk:
    """Check everything the QAIRT models need before any task runs: one error naming every missing
    piece. `root`: the SDK ($QNN_SDK_ROOT), `python`: the converter's ($QAIRT_PYTHON), both from
    toolchain/options.py."""
    problems, build_id, source = layout_problems(root), None, ""
    if root and not problems:   # layout_problems() names a missing root
        for arch, users in sorted(_arch_users(models, chips).items()):
            for kind in device_libraries(arch).values():
                problems += [
                    f"{root}/{rel} is missing: this SDK has no HTP v{arch} libraries for {users}; "
                    f"use a QAIRT release that supports v{arch}"
                    for rel in kind.values()
                    if not os.path.isfile(f"{root}/{rel}")
                ]
        build_id, source = read_build_id(root)
        if not build_id:
            problems.append(
                f"cannot read the SDK build id from {root}/lib/{HOST}/libQnnHtp.so ({source}) "
                f"nor from {root}/sdk.yaml: unzip the SDK again"
            )
    version, found = python_problems(python, root or "")
    problems += found
    problems += [
        f"{tool} is not on PATH (qnn-model-lib-generator builds the {HOST} lib with it): apt-get "
        "install "
        f"clang make, or run $QNN_SDK_ROOT/bin/check-linux-dependency.sh"
        for tool in ("make", "clang++")
        if not shutil.which(tool)
    ]
    ndk = shutil.which("ndk-build")
    required = [m.spec_file for m in models if m.compile["android_libs"] == "required"]
    if required and not ndk:
        problems.append(
            f"ndk-build is not on PATH, and {', '.join(required)} ask for {ANDROID} libs "
            f'(compile.android_libs = "required"): install the Android NDK (sherpa-onnx uses r29) '
            f'and export PATH=$ANDROID_NDK_ROOT:$PATH, or set android_libs = "auto"'
        )
    if problems:
        raise SpecError(
            f"QAIRT preflight failed for {', '.join(m.spec_file for m in models)} (compiler qairt):"
            + "".join(f"\n  - {p}" for p in problems)
        )
    if not ndk and any(m.compile["android_libs"] == "auto" for m in models):
        print(
            f"qairt: ndk-build is not on PATH: building {HOST} model libs only, no {ANDROID} libs "
            f"(put the Android NDK on PATH to build them)",
            file=sys.stderr,
        )
    converter = shutil.which(python)
    # else a problem above names what is missing
    assert root and build_id and converter and version
    return Sdk(
        root=root,
        build_id=build_id,
        build_id_source=source,
        python=converter,
        python_version=version,
        ndk_build=ndk,
    )


def _arch_users(models: list[Model], chips: dict) -> dict:
    """{htp_arch: 'SM8750, SM8850'} over the chips the QAIRT models target."""
    users: dict = {}
    for name in dict.fromkeys(c for m in models for c in m.chips):
        users.setdefault(chips[name].htp_arch, []).append(name)
    return {arch: ", ".join(names) for arch, names in users.items()}


def sdk_of(compiler: Compiler) -> Sdk:
    """The SDK the QAIRT compiler found at load (its preflight): what each of its stages runs."""
    sdk = getattr(compiler, "sdk", None)
    if not isinstance(sdk, Sdk):
        raise TypeError(f"{compiler.name}: no QAIRT SDK was found at load (preflight did not run)")
    return sdk
