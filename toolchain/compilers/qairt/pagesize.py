"""Model libs -> page-size record: every LOAD segment of an aarch64-android lib aligned to >= 16
KiB, read from the ELF program headers (sherpa-onnx only prints `readelf -lW`); once per graph."""
from __future__ import annotations

import struct
from collections.abc import Iterator

from doit.tools import config_changed

from toolchain import artifacts
from toolchain.compilers.qairt import tools
from toolchain.engine.files import atomic_path, sha256, write_json
from toolchain.engine.run.worker import in_process
from toolchain.errors import StageFailed
from toolchain.stages import Project, named

PT_LOAD = 1
MACHINES = {62: "x86-64", 183: "AArch64"}
EXPECTED = {tools.HOST: "x86-64", tools.ANDROID: "AArch64"}


def tasks(project: Project) -> Iterator[dict]:
    for model in project.models_of(tools.NAME):
        compiler = project.compiler(model)
        sdk = tools.sdk_of(compiler)
        targets = tools.model_lib_targets(sdk, model.compile["android_libs"])
        for graph in model.graphs:
            libs = {t: artifacts.model_lib(model, graph, t) for t in targets}
            out, log = (
                artifacts.stage_record(model, graph, "pagesize"),
                artifacts.stage_log(model, graph, "pagesize"),
            )
            checked = [t for t in targets if t == tools.ANDROID]
            yield {
                **named(model, graph),
                "doc": f"{model.name}/{graph.name}: assert LOAD p_align >= {tools.PAGE_SIZE:#x} on "
                       "the "
                f"{tools.ANDROID} lib" + ("" if checked else f" (none built: {tools.HOST} only)"),
                "file_dep": list(libs.values()),
                "targets": [out, log],
                "clean": True,
                "actions": [(in_process, (check, libs, tools.PAGE_SIZE, out, log))],
                "uptodate": [
                    config_changed(
                        {"min_align": tools.PAGE_SIZE, "checked": checked, "sdk": sdk.record()}
                    )
                ],
            }


def load_segments(path: str) -> tuple[str, list[dict]]:
    """(machine, LOAD segments) of a 64-bit little-endian ELF file."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError(f"{path}: not a 64-bit little-endian ELF file")
    machine, = struct.unpack_from("<H", data, 18)
    phoff, = struct.unpack_from("<Q", data, 32)
    phentsize, phnum = struct.unpack_from("<HH", data, 54)
    segments = []
    for i in range(phnum):
        p_type, _, offset, vaddr, _, filesz, memsz, align = struct.unpack_from(
            "<IIQQQQQQ", data, phoff + i * phentsize
        )
        if p_type == PT_LOAD:
            segments.append(
                {"offset": offset, "vaddr": vaddr, "filesz": filesz, "memsz": memsz, "align": align}
            )
    return MACHINES.get(machine, f"e_machine {machine}"), segments


def check(libs: dict, min_align: int, out: str, log: str) -> None:
    """Record every lib's LOAD alignment; fail on an aarch64-android lib below `min_align` or
    of another arch."""
    record: dict = {"min_align": min_align, "libs": {}}
    lines, problems = [], []
    for target, path in libs.items():
        try:
            machine, segments = load_segments(path)
        except ValueError as err:
            problems.append(str(err))
            continue
        smallest = min((s["align"] for s in segments), default=0)
        record["libs"][target] = {
            "file": path,
            "sha256": sha256(path),
            "machine": machine,
            "load_align": [s["align"] for s in segments],
            "min_align": smallest,
        }
        lines += [f"{path}: {machine}"] + [
            f"  LOAD offset {s['offset']:#x} vaddr {s['vaddr']:#x} "
            f"filesz {s['filesz']:#x} memsz {s['memsz']:#x} align {s['align']:#x}"
            for s in segments
        ]
        if machine != EXPECTED[target]:
            problems.append(f"{path}: {machine} code in the {target} folder")
        if target == tools.ANDROID and (not segments or smallest < min_align):
            problems.append(
                f"{path}: LOAD segments aligned to {smallest:#x} < {min_align:#x}: Android 16 "
                "KB-page "
                "devices cannot load it; the lib must be linked with "
                f"LDFLAGS=-Wl,-z,max-page-size={min_align}"
            )
    if tools.ANDROID not in libs:
        record["note"] = (
            f'no {tools.ANDROID} lib built (no ndk-build on PATH or android_libs = "off")'
        )
    with atomic_path(log) as tmp:
        tmp.write_text("\n".join(lines + [f"FAILED: {p}" for p in problems]) + "\n")
    if problems:
        raise StageFailed("; ".join(problems))
    write_json(out, record)
