"""Opt-in, per model, on the attached phone: choose the build by ro.soc.model (or record the
CPU fallback), push binaries + runtime libraries, run, compare with the CPU reference, and
record speed, CPU load, battery and thermal state next to the manifest. Never run on real
hardware yet: see docs/phone.md."""
from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from toolchain import artifacts
from toolchain.deploy import chip_index
from toolchain.deploy.runtime import family
from toolchain.engine.files import read_json, write_json
from toolchain.engine.run.worker import load_module
from toolchain.errors import StageFailed
from toolchain.phone import adb, devrun, probe
from toolchain.phone.phonetask import run_logged
from toolchain.qnn import sdk as sdk_layout
from toolchain.qnn.layout import ANDROID, device_libraries
from toolchain.shared import measures, modeldata
from toolchain.spec.chips import Chip
from toolchain.spec.records import Model
from toolchain.stages import Compiler, Project

SERIAL = "@SERIAL@"   # the record's path depends on the phone, known only when the task runs


def tasks(project: Project):
    # `doit device:<m> sdk=... runs=20 minutes=30`
    settings = {name: project.options[name] for name in SETTINGS}
    for model in project.models:
        verify = model.verify
        chips = {c: _chip(model, project.compiler(model), project.chips[c]) for c in model.chips}
        kwargs = {
            "model": model.name,
            "module_file": model.module_file,
            "data_dir": model.data_dir,
            "clips": list(verify.clips),
            "max_rel": max(g.precision.max_rel(verify) for g in model.graphs),
            "index": artifacts.INDEX,
            "chips": chips,
            "fallback": artifacts.device_record(model, None, SERIAL),
            "settings": settings,
        }
        yield {
            "name": model.name,
            "doc": f"{model.name} on the attached phone: choose by ro.soc.model, push, run, "
            f"compare, measure (opt-in; needs adb and sdk=<QAIRT root>)",
            "file_dep": [artifacts.INDEX],
            "actions": [(run_logged, (measure, kwargs, artifacts.device_log(model)))],
            "uptodate": [False],
            "verbosity": 2,
        }   # a measurement: rerun whenever asked


def _chip(model: Model, compiler: Compiler, chip: Chip) -> dict:
    return {
        "arch": chip.htp_arch,
        "manifest": artifacts.manifest(model, chip),
        "record": artifacts.device_record(model, chip, SERIAL),
        "graphs": {
            g.name: {
                "binary": artifacts.context_binary(model, g, chip, compiler.binary_suffix),
                "onnx": artifacts.simplified(model, g),
                "compiled": artifacts.compile_record(model, g, chip),
                "context": artifacts.context_model(model, g, chip)
                if compiler.emits_context_model
                else None,
                "android_lib": artifacts.model_lib(model, g, ANDROID),
            }
            for g in model.graphs
        },
    }


def measure(model, module_file, data_dir, clips, max_rel, index, chips, fallback, settings):
    serial = adb.choose()
    phone = adb.Adb(serial)
    clk, clk_source = probe.clock_ticks(phone)
    record = {
        "serial": serial,
        "device": probe.device_info(phone),
        "clk_tck": clk,
        "clk_tck_source": clk_source,
        "settings": settings,
        "before": probe.state(phone),
    }
    pick = chip_index.select(
        record["device"]["soc_model"] or "", True, index, model_name=model, kind=settings["kind"]
    )
    if not pick.npu:
        return _done(record, pick, fallback.replace(SERIAL, serial))
    chip = chips[pick.chip]
    man, sdk = read_json(chip["manifest"]), settings["sdk"]
    libs, tool = _runtime_files(sdk, chip["arch"], man["sdk"]["build_id"], settings)
    folder = f"{devrun.REMOTE}/{model}/{pick.chip}"
    graphs = chip["graphs"]
    if settings["ort_perf"] and any(g["context"] is None for g in graphs.values()):
        raise StageFailed(
            f"ort_perf= runs EPContext models; {model} is built with QAIRT and has none: "
            f"leave ort_perf out"
        )
    files = {**libs, **{Path(g["binary"]).name: g["binary"] for g in graphs.values()}}
    if settings["ort_perf"]:
        files.update({f"{name}.onnx": g["context"] for name, g in graphs.items()})
        files.update({f"{name}.cpu.onnx": g["onnx"] for name, g in graphs.items()})
    cpu_files = {f"lib{n}.so": g["android_lib"] for n, g in graphs.items()}
    cpu_path = (
        not settings["ort_perf"]
        and os.path.isfile(f"{sdk}/lib/{ANDROID}/libQnnCpu.so")
        and all(os.path.isfile(f) for f in cpu_files.values())
    )
    # QAIRT models with aarch64-android model libs: the same graph on the SDK's CPU backend
    if cpu_path:
        files.update({**cpu_files, "libQnnCpu.so": f"{sdk}/lib/{ANDROID}/libQnnCpu.so"})
    settings = {**settings, "cpu_path": bool(settings["ort_perf"] or cpu_path)}
    devrun.push_all(phone, folder, files, executables=[tool])
    record.update(
        chip=pick.chip, bundle=pick.bundle, sdk_build_id=man["sdk"]["build_id"], graphs={}
    )
    module = load_module(module_file)
    cpu = {name: modeldata.cpu(g["onnx"]) for name, g in graphs.items()}
    samples = modeldata.samples(module, data_dir, clips)
    feeds = module.graph_feeds(lambda g, f: cpu[g](f), samples[0] if samples else None)
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, g in graphs.items():
            result = _graph(
                phone,
                folder,
                name,
                g,
                man["graphs"][name]["io"],
                feeds[name],
                cpu[name],
                Path(tmp),
                settings,
                clk,
                tool,
            )
            if result.get("libraries_loaded") is False:
                pick = chip_index.select(
                    record["device"]["soc_model"],
                    False,
                    index,
                    model_name=model,
                    kind=settings["kind"],
                )
                record["graphs"][name] = result
                return _done(record, pick, chip["record"].replace(SERIAL, serial))
            record["graphs"][name] = result
            failures += (
                [f"{name}: max error {result['max_rel']:.3g} of the output range > {max_rel}"]
                if result.get("max_rel", 0) > max_rel
                else []
            )
    record["after"] = probe.state(phone)
    _done(record, pick, chip["record"].replace(SERIAL, serial))
    if failures:
        raise StageFailed(
            f"{model} on {serial} ({pick.chip}): phone vs CPU ONNX: " + "; ".join(failures)
        )


def _graph(phone, folder, name, g, io, feeds, cpu_run, tmp: Path, settings, clk, tool) -> dict:
    """One graph: 1 inference (first-output latency), then `runs` sampled; outputs vs
    the CPU reference."""
    runs, qnn = max(2, settings["runs"]), read_json(g["compiled"])["info"]["graphs"][0]
    remote = f"{folder}/{name}-in"
    lines = devrun.write_inputs(feeds, qnn["inputs"], io["inputs"], tmp / name, remote).splitlines()
    (tmp / f"{name}-first.txt").write_text(lines[0] + "\n")
    (tmp / f"{name}-all.txt").write_text("".join(lines[i % len(lines)] + "\n" for i in range(runs)))
    devrun.push_all(phone, remote, {p.name: str(p) for p in sorted((tmp / name).iterdir())})
    devrun.push_all(
        phone, folder, {f"{name}-{k}.txt": str(tmp / f"{name}-{k}.txt") for k in ("first", "all")}
    )
    command = _command(tool, folder, name, Path(g["binary"]).name, settings)
    first = devrun.run_sampled(phone, folder, f"{name}-first", command(f"{name}-first.txt", 1),
                               settings["interval"], clk)
    if first["rc"] != 0:
        if devrun.LOAD_FAILURE.search(first["log"]):
            return {"libraries_loaded": False, "log_tail": first["log"][-2000:]}
        raise StageFailed(
            f"{tool} on the phone exited with {first['rc']} for {name}:\n{first['log'][-2000:]}"
        )
    steady = devrun.run_sampled(phone, folder, f"{name}-all", command(f"{name}-all.txt", runs),
                                settings["interval"], clk)
    if steady["rc"] != 0:
        raise StageFailed(
            f"{tool} on the phone exited with {steady['rc']} for {name} ({runs} runs):\n"
            f"{steady['log'][-2000:]}"
        )
    per = (steady["wall_s"] - first["wall_s"]) / (runs - 1)
    result = {
        "libraries_loaded": True,
        "runs": runs,
        "first_output_s": round(first["wall_s"], 4),
        "wall_s": round(steady["wall_s"], 4),
        "per_inference_s": round(per, 4),
        "rtf": round(per / settings["input_seconds"], 4) if settings["input_seconds"] else None,
        "cpu": steady["cpu"],
        "samples": steady["samples"],
    }
    if settings["ort_perf"]:
        result["perf_test"] = devrun.perf_numbers(steady["log"])
        result["outputs"] = (
            "not compared: onnxruntime_perf_test feeds random inputs and writes no outputs"
        )
    else:
        phone.pull(f"{folder}/{name}-all/out", str(tmp / f"{name}-out"))
        errors = [
            measures.tensor_errors(
                lambda _, f: cpu_run(f),
                lambda _, f, i=i: devrun.read_outputs(
                    tmp / f"{name}-out", i, io["outputs"], qnn["outputs"]
                ),
                {name: [feed]},
            )[name]
            for i, feed in enumerate(feeds)
        ]
        result.update(
            max_abs=max(e["max_abs"] for e in errors), max_rel=max(e["max_rel"] for e in errors)
        )
    cpu_command = _command(tool, folder, name, Path(g["binary"]).name, settings, cpu=True)
    if not settings["cpu_path"]:
        result["cpu_path"] = {
            "measured": False,
            "reason": "no CPU runner on the phone: give ort_perf="
            "<onnxruntime_perf_test> or build aarch64-android model "
            "libs (QAIRT + NDK)",
        }
    else:
        base = devrun.run_sampled(
            phone,
            folder,
            f"{name}-cpu",
            cpu_command(f"{name}-all.txt", runs),
            settings["interval"],
            clk,
        )
        result["cpu_path"] = {
            "measured": base["rc"] == 0,
            "rc": base["rc"],
            "wall_s": round(base["wall_s"], 4),
            "per_inference_s": round(base["wall_s"] / runs, 4),
            "cpu": base["cpu"],
        }
        ok = base["rc"] == 0 and steady["wall_s"]
        result["npu_speedup"] = round(base["wall_s"] / steady["wall_s"], 2) if ok else None
    if settings["minutes"]:
        npu = devrun.drain(
            phone, folder, name, command(f"{name}-all.txt", runs), settings["minutes"]
        )
        result["drain"] = {"npu": npu}
        if settings["cpu_path"]:
            result["drain"]["cpu"] = devrun.drain(
                phone,
                folder,
                f"{name}-cpu",
                cpu_command(f"{name}-all.txt", runs),
                settings["minutes"],
            )
    return result


def _command(
    tool: str, folder: str, name: str, binary: str, settings, cpu: bool = False
) -> Callable[[str, int], str]:
    """(input list, runs) -> the phone-side command line, NPU or the CPU path."""
    if tool == "qnn-net-run" and not cpu:
        return lambda lst, n: (
            f"./qnn-net-run --backend {folder}/libQnnHtp.so --retrieve_context {folder}/{binary} "
            f"--input_list {folder}/{lst} --output_dir {folder}/{lst[:-4]}/out"
        )
    if tool == "qnn-net-run":
        return lambda lst, n: (
            f"./qnn-net-run --backend {folder}/libQnnCpu.so --model {folder}/lib{name}.so "
            f"--input_list {folder}/{lst} --output_dir {folder}/{lst[:-4]}/cpu-out"
        )
    ep = "-e cpu" if cpu else f"-e qnn -i \"backend_path|{folder}/libQnnHtp.so\""
    return lambda lst, n: (
        f"./onnxruntime_perf_test {ep} -m times -r {n} {folder}/{name}{'.cpu' if cpu else ''}.onnx"
    )


def _runtime_files(sdk: str | None, arch: int, build_id: str, settings) -> tuple[dict, str]:
    """The four libraries (+ the runner) from an SDK of the binaries' version family, or
    a clear stop."""
    if not sdk or sdk_layout.layout_problems(sdk):
        raise StageFailed(
            "device runs need the Android QNN libraries and qnn-net-run: sdk=<QAIRT "
            f"{family(build_id)} "
            f"root> or $QNN_SDK_ROOT ({'; '.join(sdk_layout.layout_problems(sdk))})"
        )
    got, _ = sdk_layout.read_build_id(sdk)
    if family(got) != family(build_id):
        raise StageFailed(
            f"the SDK at {sdk} is QAIRT {got}, the binaries were built with {build_id}: use a "
            f"{family(build_id)} SDK (libraries of another family fail at load)"
        )
    libs = {
        Path(rel).name: f"{sdk}/{rel}"
        for kind in device_libraries(arch).values()
        for rel in kind.values()
    }
    missing = [p for p in libs.values() if not os.path.isfile(p)]
    if missing:
        raise StageFailed(f"the SDK at {sdk} lacks {', '.join(missing)}")
    if settings["ort_perf"]:
        return {**libs, "onnxruntime_perf_test": settings["ort_perf"]}, "onnxruntime_perf_test"
    return {**libs, "qnn-net-run": f"{sdk}/bin/{ANDROID}/qnn-net-run"}, "qnn-net-run"


def _done(record: dict, pick, out: str) -> None:
    record["choice"] = {
        "bundle": pick.bundle,
        "npu": pick.npu,
        "reason": pick.reason,
        "chip": pick.chip,
    }
    write_json(out, record)
    print(
        f"{record['serial']} ({record['device']['model']}, "
        f"ro.soc.model={record['device']['soc_model']}, Android "
        f"{record['device']['android']}): {'NPU' if pick.npu else 'CPU fallback'}: {pick.reason} "
        f"-> {out}"
    )


# of toolchain/options.py
SETTINGS = ("sdk", "ort_perf", "runs", "interval", "minutes", "input_seconds", "kind")
