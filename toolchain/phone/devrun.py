"""Running one graph on the phone: push, start in the background, sample it, collect times and
outputs. Raw tensors cross in the QNN-side layout the binary's read-back names (as the
simulator runner does)."""
from __future__ import annotations

import re
import shlex
import time
from pathlib import Path

from toolchain.deploy.runtime import ADSP_DEFAULTS
from toolchain.errors import StageFailed
from toolchain.phone import probe
from toolchain.qnn.layout import permutation_or_fail

# numpy is imported where used: doit's own process loads this module on every run
# (tests/test_engine_worker.py)

REMOTE = "/data/local/tmp/qnn-npu-compile"
# What a runtime prints when its QNN libraries or Skel do not load (version, ADSP_LIBRARY_PATH): a
# fallback, not a bug.
LOAD_FAILURE = re.compile(
    r"dlopen|cannot locate symbol|Failed to create device|QnnDevice_create|error 1008|1008|"
    r"14001|Transport layer|Unable to load|Stub lib id mismatch|err 500[05]",
    re.I,
)
PERF = {"session_s": r"Session creation time cost:\s*([\d.]+)\s*s",
        "first_ms": r"First inference time cost:\s*([\d.]+)\s*ms",
        "average_ms": r"Average inference time cost:\s*([\d.]+)\s*ms"}


def env_prefix(folder: str) -> str:
    """The runtime libraries beside the binaries; the Skel's folder first on
    ADSP_LIBRARY_PATH, ';'-separated."""
    return f'export LD_LIBRARY_PATH={folder}; export ADSP_LIBRARY_PATH="{folder};{ADSP_DEFAULTS}"; '


def push_all(adb, folder: str, files: dict[str, str], executables=()) -> None:
    """files: remote name -> local path, all into `folder`."""
    adb.shell(f"mkdir -p {folder}")
    for name, local in sorted(files.items()):
        adb.push(local, f"{folder}/{name}")
    if executables:
        adb.shell("chmod 755 " + " ".join(f"{folder}/{n}" for n in executables))


def write_inputs(
    feeds: list[dict], qnn_inputs: list[dict], declared: list, local: Path, remote: str
) -> str:
    """One raw file per input per inference (float32 or int32, QNN layout); returns the
    input list text."""
    import numpy as np
    local.mkdir(parents=True, exist_ok=True)
    lines = []
    for i, feed in enumerate(feeds):
        files = []
        for (name, shape, dtype), q in zip(declared, qnn_inputs):
            perm = permutation_or_fail(shape, q["shape"], name)
            kind = np.int32 if dtype == "int32" else np.float32
            np.ascontiguousarray(feed[name].transpose(perm), dtype=kind).tofile(
                local / f"{name}-{i}.raw"
            )
            files.append(f"{remote}/{name}-{i}.raw")
        lines.append(" ".join(files))
    return "\n".join(lines) + "\n"


def read_outputs(folder: Path, index: int, declared: list, qnn_outputs: list[dict]) -> dict:
    """qnn-net-run's Result_<i>/<name>.raw back into the ONNX layout."""
    import numpy as np
    found = {}
    for (name, shape, dtype), q in zip(declared, qnn_outputs):
        raw = folder / f"Result_{index}" / f"{name}.raw"
        if not raw.is_file():
            raw = folder / f"Result_{index}" / (re.sub(r"\W", "_", name) + ".raw")
        if not raw.is_file():
            raise StageFailed(f"the phone's run wrote no {raw}")
        perm = permutation_or_fail(shape, q["shape"], name)
        found[name] = (
            np.fromfile(raw, np.float32)
            .reshape(q["shape"])
            .transpose(np.argsort(perm))
            .astype(dtype)
        )
    return found


def launch(adb, folder: str, tag: str, command: str) -> int:
    """Start `command` in `folder` detached from adb; returns its pid. Times come from
    the phone's clock."""
    work = f"{folder}/{tag}"
    script = (
        f"cd {folder}; {env_prefix(folder)}date +%s%N > {work}/t0; {command} > {work}/run.log 2>&1 "
        "& "
        f"echo $! > {work}/pid; wait $!; echo $? > {work}/rc; date +%s%N > {work}/t1"
    )
    adb.shell(
        f"rm -rf {work}; mkdir -p {work}; sh -c {shlex.quote(script)} </dev/null >/dev/null 2>&1 &"
    )
    for _ in range(200):
        rc, out = adb.try_shell(f"cat {work}/pid")
        if rc == 0 and out.strip().isdigit():
            return int(out.strip())
        time.sleep(0.05)
    raise StageFailed(f"the phone never started {command.split()[0]} in {folder} (no {work}/pid)")


def finish(adb, folder: str, tag: str, timeout: float = 3600) -> dict:
    """Exit status, wall time (phone clock) and log of a launched command."""
    work, started = f"{folder}/{tag}", time.monotonic()
    while time.monotonic() - started < timeout:
        rc, out = adb.try_shell(f"cat {work}/rc {work}/t0 {work}/t1")
        values = out.split()
        if rc == 0 and len(values) == 3:
            break
        time.sleep(0.1)
    else:
        raise StageFailed(f"{work}: the run did not finish within {timeout:.0f} s")
    if not all(v.isdigit() for v in values[1:]):
        raise StageFailed(
            f"the phone's `date +%s%N` printed {values[1]!r}: no nanosecond clock, cannot time runs"
        )
    _, log = adb.try_shell(f"cat {work}/run.log")
    return {"rc": int(values[0]), "wall_s": (int(values[2]) - int(values[1])) / 1e9, "log": log}


def run_sampled(adb, folder: str, tag: str, command: str, interval: float, clk_tck: int) -> dict:
    """Launch, sample CPU ticks and threads every `interval` s while it runs, then collect."""
    pid = launch(adb, folder, tag, command)
    samples = probe.sample(adb, pid, interval)
    return {
        **finish(adb, folder, tag),
        "pid": pid,
        "cpu": probe.summary(samples, clk_tck),
        "samples": samples,
    }


def perf_numbers(log: str) -> dict:
    """onnxruntime_perf_test's summary lines, in seconds."""
    found = {k: float(m.group(1)) for k, p in PERF.items() if (m := re.search(p, log))}
    return {
        k.replace("_ms", "_s"): (v / 1000 if k.endswith("_ms") else v) for k, v in found.items()
    }


def drain(phone, folder: str, name: str, command: str, minutes: float) -> dict:
    """Battery and thermal state over a fixed task of `minutes`: `command` repeated back to back."""
    before, seconds = probe.state(phone), max(1, round(minutes * 60))
    loop = f"( end=$(( $(date +%s) + {seconds} )); n=0; while [ $(date +%s) -lt $end ]; " \
           f"do {command} >/dev/null 2>&1; " \
           f"n=$((n+1)); done; echo $n )"
    launch(phone, folder, f"{name}-drain", loop)
    done = finish(phone, folder, f"{name}-drain", timeout=seconds + 600)
    after = probe.state(phone)
    b0, b1 = before["battery"], after["battery"]
    return {
        "minutes": minutes,
        "iterations": int(done["log"].split()[-1]) if done["log"].split() else 0,
        "wall_s": round(done["wall_s"], 1),
        "before": before,
        "after": after,
        "level_drop_pct": (b0["level"] - b1["level"])
        if None not in (b0["level"], b1["level"])
        else None,
        "charge_drop_uah": (b0["charge_counter_uah"] - b1["charge_counter_uah"])
        if None not in (b0["charge_counter_uah"], b1["charge_counter_uah"])
        else None,
        "valid": not b0["powered"],
        "why_not_valid": f"the phone was powered ({', '.join(b0['powered'])}): it "
        f"charges, drain says nothing"
        if b0["powered"]
        else None,
    }
