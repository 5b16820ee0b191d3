"""The QAIRT verify runner: context binaries in qnn-net-run (x86_64 HTP backend) against the CPU ONNX.
verify.py owns the checks; this module supplies the task for QAIRT models and the runner."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from doit.tools import config_changed

from toolchain import compare, external, paths, qairt
from toolchain.export import io_record
from toolchain.files import read_json
from toolchain.worker import StageFailed, run


def verify_task(project, model, chip, checks: dict) -> dict:
    """verify:<model>@<chip> for a QAIRT model: verify.py's checks and record, another runner."""
    sdk, tier, clips = project.qairt_sdk, checks["tier"], checks["clips"]
    graphs = {g.name: {"onnx": paths.simplified(model, g), "binary": paths.context_binary(model, g, chip),
                       "record": paths.compile_record(model, g, chip)} for g in model.graphs}
    runner = {}
    for g in model.graphs:
        work = f"{paths.chip_dir(model, chip)}/netrun-{tier}/{g.name}"   # scratch, removed after each call
        runner[g.name] = {"argv": qairt.netrun_argv(sdk, graphs[g.name]["binary"], f"{work}/input_list.txt",
                                                    f"{work}/output"),
                          "env": qairt.env(sdk), "work": work, "io": io_record(g), "record": graphs[g.name]["record"]}
    out, log = paths.verified(model, chip, tier), paths.verify_log(model, chip, tier)
    kwargs = {"module_file": model.module_file, "graphs": graphs, "data_dir": model.data_dir, "options": {},
              "checks": checks, "out": out, "runner": runner,
              "io": {g.name: io_record(g) for g in model.graphs}}
    what = "all clips, WER" if tier == "full" else f"clips {', '.join(clips) or '(generated inputs)'}"
    return {"name": f"{model.name}@{chip.name}",
            "doc": f"{model.name} on {chip.name}: qnn-net-run (x86_64 HTP) vs CPU ONNX, {tier} tier ({what}) "
                   f"[qairt {sdk.build_id}]",
            "file_dep": [*model.code_files, *[p for g in graphs.values() for p in g.values()],
                         *compare.data_files(model.data_dir)],
            "targets": [out, log], "clean": True,
            "actions": [(run, ("toolchain.verify:check", kwargs, log))],
            "uptodate": [config_changed({"checks": checks, "runner": {g: r["argv"] for g, r in runner.items()},
                                         "env": qairt.env(sdk), "sdk": sdk.record(), "chip": chip.record()})]}


def simulator(spec: dict):
    """run(feeds) -> outputs for one graph, one qnn-net-run per call; float32 raw files in the QNN-side
    layout the read-back found (the converter permutes 3-D/4-D inputs, sherpa-qnn.md §4.3)."""
    import numpy as np
    qnn = read_json(spec["record"])["info"]["graphs"][0]
    work = Path(spec["work"])

    def run_once(feeds: dict) -> dict:
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        files = []
        for i, ((name, shape, _), q) in enumerate(zip(spec["io"]["inputs"], qnn["inputs"])):
            files.append(f"{work}/input_{i}.raw")
            perm = qairt.layout_permutation(shape, q["shape"])
            np.ascontiguousarray(feeds[name].reshape(shape).transpose(perm), dtype=np.float32).tofile(files[-1])
        (work / "input_list.txt").write_text(" ".join(files) + "\n")   # one line per inference (§1 S3)
        print("$", " ".join(spec["argv"]), flush=True)
        done = subprocess.run(spec["argv"], env=external.environ(spec["env"]), capture_output=True, text=True)
        print(done.stdout + done.stderr, flush=True)
        if done.returncode:
            tail = "\n".join((done.stdout + done.stderr).splitlines()[-external.TAIL:])
            raise StageFailed(f"qnn-net-run exited with {done.returncode} (inputs kept in {work}):\n{tail}")
        outputs = {}
        for (name, shape, dtype), q in zip(spec["io"]["outputs"], qnn["outputs"]):
            raw = _result(work / "output" / "Result_0", name)
            perm = qairt.layout_permutation(shape, q["shape"])
            outputs[name] = np.fromfile(raw, np.float32).reshape(q["shape"]).transpose(np.argsort(perm)).astype(dtype)
        shutil.rmtree(work.parent, ignore_errors=True)   # scratch only: nothing is left beside the targets
        return outputs
    return run_once


def _result(folder: Path, name: str) -> Path:
    """qnn-net-run's output file for a tensor: <name>.raw (non-word characters as '_' if so written)."""
    for candidate in (folder / f"{name}.raw", folder / (re.sub(r"\W", "_", name) + ".raw")):
        if candidate.is_file():
            return candidate
    found = sorted(p.name for p in folder.glob("*")) if folder.is_dir() else []
    raise StageFailed(f"qnn-net-run wrote no {folder}/{name}.raw; found {found}")
