"""The QNN runtime libraries an app ships with one chip's binaries, from the compiler
that built them."""
from __future__ import annotations

import os
import re
from pathlib import Path

from doit.tools import config_changed

from toolchain import artifacts
from toolchain.engine import versions
from toolchain.engine.files import sha256, write_json
from toolchain.engine.run.worker import in_process
from toolchain.qnn.layout import ANDROID, device_libraries
from toolchain.spec.chips import ChipRecord
from toolchain.stages import Project, named

# A QAIRT build id as the libraries carry it in clear text (docs/phone.md): v2.51.0.260929181845.
BUILD_ID = re.compile(rb"v(\d+)\.(\d+)\.(\d+)\.(\d{6,})")
ADSP_DEFAULTS = "/vendor/lib/rfsa/adsp;/vendor/dsp/cdsp;/vendor/dsp;/system/lib/rfsa/adsp;/dsp"


def tasks(project: Project):
    wanted = {(m.compiler, c.tag): (project.compiler(m), c) for m, c in project.model_chips()}
    for (name, _), (compiler, chip) in sorted(wanted.items(), key=lambda item: item[0]):
        # an SDK folder holds the device libraries
        sdk = compiler.identity() if compiler.sdk_root() else None
        files = [f"{sdk['root']}/{rel}" for rel in _layout(chip.htp_arch).values()] if sdk else []
        kwargs = {"compiler": name, "chip": chip.record(), "sdk": sdk,
                  "out": artifacts.runtime_record(name, chip)}
        # another QAIRT family's wheel pair
        own = {"wheel": compiler.identity(chip)} if chip.family else {}
        yield {
            **named(name, chip=chip),
            "doc": f"QNN runtime libraries for {chip.name} (v{chip.htp_arch}) from the {name} "
                   "compiler"
            + (f", QAIRT {chip.family}" if chip.family else ""),
            "file_dep": [f for f in files if os.path.isfile(f)],
            "targets": [kwargs["out"]],
            "clean": True,
            "actions": [
                (in_process, (write,), {**kwargs, "version": compiler.sdk_version(chip), **own})
            ],
            "uptodate": [config_changed({**kwargs, "tool": compiler.identity(chip)})],
        }


def _layout(arch: int) -> dict[str, str]:
    """Library -> SDK-relative path: the app process loads the first three, the DSP the
    Skel (docs/phone.md)."""
    return {**device_libraries(arch)["android_aarch64"], **device_libraries(arch)["hexagon_dsp"]}


def family(build_id: str | None) -> str | None:
    """'v2.51.0.260929181845' or '2.51.0' -> '2.51': binaries and runtime libraries must
    agree on it."""
    m = re.match(r"v?(\d+)\.(\d+)", build_id or "")
    return f"{m.group(1)}.{m.group(2)}" if m else None


def version_of(path: str) -> str | None:
    """The QAIRT build id a library carries in clear text, if any."""
    m = BUILD_ID.search(Path(path).read_bytes())
    return m.group(0).decode() if m else None


def record(
    compiler: str, chip: ChipRecord, sdk: dict | None, version: str, wheel: dict | None = None
) -> dict:
    """What the app ships for `chip`: files with versions when the compiler came with an SDK folder
    (`sdk`), else exact names, of the QAIRT `version` family the compiler is."""
    arch = chip["htp_arch"]
    if sdk:
        libs = [_sdk_file(sdk["root"], name, rel) for name, rel in _layout(arch).items()]
        found = [lib for lib in libs if lib["sha256"]]
        wrong = [
            lib["name"]
            for lib in found
            if lib["version"] and family(lib["version"]) != family(sdk["build_id"])
        ]
        return {
            "toolchain": compiler,
            "chip": chip["name"],
            "htp_arch": arch,
            "build_id": sdk["build_id"],
            "family": family(sdk["build_id"]),
            "available": len(found) == len(libs) and not wrong,
            "libraries": libs,
            "version_mismatch": wrong,
            "app_must_ship": _ship_text(
                arch, f"the QAIRT SDK at {sdk['root']} (build id {sdk['build_id']})"
            ),
            "device_tool": _sdk_file(sdk["root"], "qnn-net-run", f"bin/{ANDROID}/qnn-net-run"),
            "license": license_terms(sdk["root"]),
        }
    libs = [{"name": name, "sdk_path": rel, "version": f"QAIRT {family(version)}.x", "sha256": None}
            for name, rel in _layout(arch).items()]
    wheel = wheel or {"onnxruntime": versions.version("onnxruntime"),
                      "onnxruntime-qnn": versions.version("onnxruntime-qnn")}
    return {
        "toolchain": compiler,
        "chip": chip["name"],
        "htp_arch": arch,
        "build_id": None,
        "family": family(version),
        "available": False,
        "libraries": libs,
        "why_not_available": f"onnxruntime-qnn {wheel['onnxruntime-qnn']} ships x86_64 libraries "
        f"only (the simulator); it has no Android or Hexagon builds",
        "app_must_ship": _ship_text(
            arch, f"a QAIRT {family(version)}.x SDK (this build used QAIRT {version})"
        ),
        "onnxruntime": {
            "libraries": [
                f"libonnxruntime.so (onnxruntime {wheel['onnxruntime']}, Android arm64-v8a)",
                f"libonnxruntime_providers_qnn.so (onnxruntime-qnn "
                f"{wheel['onnxruntime-qnn']} QNN EP, Android arm64-v8a)",
            ],
            "note": "only for the onnxruntime bundle; whatever build you use must load QAIRT "
            f"{family(version)}.x libraries, the family the EPContext's ep_sdk_version names",
        },
        "license": license_terms(None),
    }


def _sdk_file(root: str, name: str, rel: str) -> dict:
    path = f"{root}/{rel}"
    there = os.path.isfile(path)
    return {
        "name": name,
        "sdk_path": rel,
        "file": path,
        "sha256": sha256(path) if there else None,
        "bytes": os.path.getsize(path) if there else None,
        "version": version_of(path) if there else None,
    }


def _ship_text(arch: int, source: str) -> str:
    return (
        f"From {source}: lib/{ANDROID}/libQnnHtp.so, libQnnSystem.so and libQnnHtpV{arch}Stub.so "
        "into "
        "the app's native libraries (jniLibs/arm64-v8a), and "
        f"lib/hexagon-v{arch}/unsigned/libQnnHtpV{arch}Skel.so "
        f"into a folder that is prepended to ADSP_LIBRARY_PATH with ';' separators (e.g. "
        f'"<nativeLibraryDir>;{ADSP_DEFAULTS}"). All four from one SDK, the family the binaries '
        'were built '
        f"with: another family fails at load (error 1008/5000/5005)."
    )


def license_terms(sdk_root: str | None) -> dict:
    """Who licenses the QNN runtime libraries and where their terms are (referenced, not copied)."""
    base = {
        "holder": "Qualcomm Technologies, Inc.",
        "terms": "Licensed under Qualcomm's terms, not under the model's license; read those terms "
        "before you redistribute these libraries in an app.",
    }
    if sdk_root:
        found = sorted(
            p
            for p in Path(sdk_root).glob("*")
            if p.is_file() and re.search(r"licen[cs]e", p.name, re.I)
        )
        return {
            **base,
            "reference": [{"file": str(p), "sha256": sha256(p)} for p in found]
            or f"the license that came with the QAIRT SDK at {sdk_root} (no LICENSE file at its "
               "top level)",
        }
    import onnxruntime_qnn
    pdf = Path(onnxruntime_qnn.__file__).with_name("Qualcomm_LICENSE.pdf")
    return {
        **base,
        "reference": [
            {
                "file": f"onnxruntime-qnn=={versions.version('onnxruntime-qnn')}: "
                f"onnxruntime_qnn/{pdf.name}",
                "sha256": sha256(pdf) if pdf.is_file() else None,
            }
        ],
        "note": "Android builds of these libraries come from a QAIRT SDK, under the license that "
                "ships with it.",
    }


def write(
    compiler: str,
    chip: ChipRecord,
    sdk: dict | None,
    version: str,
    out: str,
    wheel: dict | None = None,
):
    write_json(out, record(compiler, chip, sdk, version, wheel))
