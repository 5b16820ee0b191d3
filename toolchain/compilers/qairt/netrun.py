"""The QAIRT simulator runner: a context binary in qnn-net-run (x86_64 HTP backend), one
call per feed. stages/verify.py owns the checks and the task; the backend hands it this
runner (Backend.simulator)."""
from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from toolchain.engine.files import read_json
from toolchain.engine.run import external
from toolchain.errors import StageFailed
from toolchain.qnn.layout import c_name, permutation_or_fail


def simulator(argv: list, env: dict, work: str, io: dict, record: str) -> Callable[[dict], dict]:
    """run(feeds) -> outputs for one graph, one qnn-net-run per call; float32 raw files in the
    QNN-side layout the read-back found (the converter permutes 3-D/4-D inputs: docs/qairt.md)."""
    import numpy as np
    qnn = read_json(record)["info"]["graphs"][0]
    folder = Path(work)

    def run_once(feeds: dict) -> dict:
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        files = []
        for i, ((name, shape, _), q) in enumerate(zip(io["inputs"], qnn["inputs"])):
            files.append(f"{folder}/input_{i}.raw")
            perm = permutation_or_fail(shape, q["shape"], name)
            np.ascontiguousarray(
                feeds[name].reshape(shape).transpose(perm), dtype=np.float32
            ).tofile(files[-1])
        (folder / "input_list.txt").write_text(" ".join(files) + "\n")   # one line per inference
        print("$", " ".join(argv), flush=True)
        done = subprocess.run(argv, env=external.environ(env), capture_output=True, text=True)
        print(done.stdout + done.stderr, flush=True)
        if done.returncode:
            tail = "\n".join((done.stdout + done.stderr).splitlines()[-external.TAIL:])
            raise StageFailed(
                f"qnn-net-run exited with {done.returncode} (inputs kept in {folder}):\n{tail}"
            )
        outputs = {}
        for (name, shape, dtype), q in zip(io["outputs"], qnn["outputs"]):
            raw = _result(folder / "output" / "Result_0", name)
            perm = permutation_or_fail(shape, q["shape"], name)
            outputs[name] = (
                np.fromfile(raw, np.float32)
                .reshape(q["shape"])
                .transpose(np.argsort(perm))
                .astype(dtype)
            )
        # scratch only: nothing is left beside the targets
        shutil.rmtree(folder.parent, ignore_errors=True)
        return outputs
    return run_once


def _result(folder: Path, name: str) -> Path:
    """qnn-net-run's output file for a tensor: <name>.raw (non-word characters as '_'
    if so written)."""
    for candidate in (folder / f"{name}.raw", folder / f"{c_name(name)}.raw"):
        if candidate.is_file():
            return candidate
    found = sorted(p.name for p in folder.glob("*")) if folder.is_dir() else []
    raise StageFailed(f"qnn-net-run wrote no {folder}/{name}.raw; found {found}")
