"""The QAIRT SDK's layout ($QNN_SDK_ROOT): where its tools and host libraries are, whether a tree is
complete, and its build id. The QAIRT compiler (compilers/qairt) and the phone (phone/device.py)
both read it."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from toolchain.qnn.layout import HOST

ENV_ROOT = "QNN_SDK_ROOT"
TOOLS = (
    "qnn-onnx-converter",
    "qnn-model-lib-generator",
    "qnn-context-binary-generator",
    "qnn-net-run",
)
# optional: read-back falls back to libQnnSystem through qnnbin
UTILITY = "qnn-context-binary-utility"
HOST_LIBS = ("libQnnHtp.so", "libQnnSystem.so", "libQnnHtpNetRunExtensions.so")
ACTIVATE = ("unzip the QAIRT SDK and source qairt/<version>/bin/envsetup.sh "
            "(or export QNN_SDK_ROOT=/path/to/qairt/2.40.0.251030)")


@dataclass(frozen=True)
class Sdk:
    """A QAIRT SDK found at $QNN_SDK_ROOT: its build id, the converter's Python and the
    NDK, resolved once."""

    root: str
    build_id: str
    build_id_source: str      # which part of the SDK the build id was read from
    python: str               # the converter's Python, resolved
    python_version: str
    ndk_build: str | None     # None: no aarch64-android libs can be built

    def tool(self, name: str) -> str:
        return f"{self.root}/bin/{HOST}/{name}"

    def host_lib(self, name: str) -> str:
        return f"{self.root}/lib/{HOST}/{name}"

    def has_utility(self) -> bool:
        return os.access(self.tool(UTILITY), os.X_OK)

    def record(self) -> dict:
        """What identifies this SDK in every QAIRT stage's settings."""
        return {
            "root": self.root,
            "build_id": self.build_id,
            "build_id_source": self.build_id_source,
        }


def layout_problems(root: str | None) -> list[str]:
    """Missing pieces of the SDK tree itself, each with how to fix it."""
    if not root:
        return [f"{ENV_ROOT} is not set: {ACTIVATE}"]
    if not os.path.isdir(root):
        return [f"{ENV_ROOT}={root} is not a folder: {ACTIVATE}"]
    found = [
        f"{root}/bin/{HOST}/{t} is missing or not executable: {ENV_ROOT} must be the unzipped "
        f"qairt/<version> folder"
        for t in TOOLS
        if not os.access(f"{root}/bin/{HOST}/{t}", os.X_OK)
    ]
    found += [f"{root}/lib/{HOST}/{lib} is missing: incomplete SDK, unzip it again"
              for lib in HOST_LIBS if not os.path.isfile(f"{root}/lib/{HOST}/{lib}")]
    if not os.path.isdir(f"{root}/lib/python"):
        found.append(
            f"{root}/lib/python is missing (the converter's Python modules): unzip the SDK again"
        )
    return found


def read_build_id(root: str) -> tuple[str | None, str]:
    """(build id, source): libQnnHtp.so's backendGetBuildId through the QNN API, in a child
    process (a broken library cannot take doit down); only if that fails, sdk.yaml's
    version, labelled so."""
    lib_dir = f"{root}/lib/{HOST}"
    code = ("import json, sys; from toolchain.qnn import qnnbin; "
            "print(json.dumps(qnnbin.htp_build_id(sys.argv[1])))")
    done = subprocess.run([sys.executable, "-c", code, lib_dir], capture_output=True, text=True)
    if done.returncode == 0 and done.stdout.strip():
        build_id = json.loads(done.stdout.strip().splitlines()[-1]).get("buildId")
        if build_id:
            return build_id, f"{lib_dir}/libQnnHtp.so backendGetBuildId"
    why = (done.stderr.strip().splitlines() or ["no build id returned"])[-1]
    yaml = Path(root, "sdk.yaml")
    version = re.search(r"^\s*version:\s*(\S+)", yaml.read_text(), re.M) if yaml.is_file() else None
    if version:
        return version.group(
            1
        ), f"FALLBACK {yaml} version (libQnnHtp.so did not give a build id: {why})"
    return None, why
