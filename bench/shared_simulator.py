#!/usr/bin/env python3
"""Can a QAIRT family's x86 HTP simulator run a context whose weights are shared between
graphs? (issue 34)

Two tiny graphs that hold the same 256x256 weight ([1, 8, 256] and [1, 16, 256] inputs: two
"windows") are compiled into one context by the EP's own sharing (`ep.share_ep_contexts`, as `doit
share` does), and, as the control, each graph alone into a plain context of its own. Each graph is
then loaded and run on the simulator from each context in a fresh process (the EP's bytes and state
depend on what its process did before) and compared with numpy. Per family: the shared binary's size
against the two plain ones, and how each load ended (ran, an error, or the signal that killed the
process). The child repeats the EP session set-up of toolchain/compilers/ort_qnn/ep.py because a
family's interpreter does not have the toolchain.

    python bench/shared_simulator.py [--python PY ...] [--chip SM8750] [--out FILE]

--python: the interpreters to try, each with onnxruntime-qnn installed (default: this one and every
family environment `doit qairt_env` made, build/qairt/<family>/venv/bin/python). The ONNX models are
made here; the interpreters need only onnxruntime, onnxruntime-qnn and numpy. Writes
bench/results/shared-simulator.json."""
from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from toolchain.spec import chips as chip_table  # noqa: E402

SIZES = (8, 16)   # the two graphs' sequence lengths; the weight is the same tensor in both

# Runs in the interpreter under test: `compile <dir> <models> <options json> <shared 0|1> <sizes
# json>` or `run <dir> <models> <options json> <n>`; <models>: the folder of the source ONNX, the
# weight and the input.
CHILD = r'''
import json, os, sys
import numpy as np
import onnxruntime as ort, onnxruntime_qnn as oq
import onnxruntime_qnn.build_and_package_info as info
what, folder, models, options = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
def session(src, options, config):
    if oq.EP_NAME not in {d.ep_name for d in ort.get_ep_devices()}:
        ort.register_execution_provider_library(oq.EP_NAME, oq.get_library_path())
    so = ort.SessionOptions(); so.log_severity_level = 3
    so.add_provider_for_devices([d for d in ort.get_ep_devices() if d.ep_name == oq.EP_NAME],
                                {"backend_path": oq.get_qnn_htp_path(), **options})
    for key, value in {"session.disable_cpu_ep_fallback": "1", **config}.items():
        so.add_session_config_entry(key, value)
    return ort.InferenceSession(src, sess_options=so)
print("QAIRT", info.qnn_version, flush=True)
if what == "compile":
    shared, sizes = sys.argv[5] == "1", json.loads(sys.argv[6])
    for i, n in enumerate(sizes):
        config = {"ep.context_enable": "1", "ep.context_embed_mode": "0",
                  "ep.context_file_path": os.path.join(folder, f"g{n}.onnx")}
        if shared:
            config["ep.share_ep_contexts"] = "1"
            if i == len(sizes) - 1:
                config["ep.stop_share_ep_contexts"] = "1"
        session(os.path.join(models, f"src{n}.onnx"), options, config)
else:
    n = int(sys.argv[5])
    x = np.load(os.path.join(models, "x.npy"))[:, :n]
    y = session(os.path.join(folder, f"g{n}.onnx"), options, {}).run(None, {f"x{n}": x})[0]
    ref = np.maximum(x @ np.load(os.path.join(models, "w.npy")), 0)
    print("RESULT", json.dumps({"max_rel": float(abs(y - ref).max() / abs(ref).max())}), flush=True)
'''


def make_models(folder: Path) -> int:
    """The two source ONNX models and the test input; returns the weight's bytes in fp16."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    w = rng.standard_normal((256, 256)).astype(np.float32)
    np.save(folder / "w.npy", w)
    np.save(folder / "x.npy", rng.standard_normal((1, max(SIZES), 256)).astype(np.float32))
    for n in SIZES:
        x = helper.make_tensor_value_info(f"x{n}", TensorProto.FLOAT, [1, n, 256])
        y = helper.make_tensor_value_info(f"y{n}", TensorProto.FLOAT, [1, n, 256])
        graph = helper.make_graph([helper.make_node("MatMul", [f"x{n}", "w"], [f"h{n}"]),
                                   helper.make_node("Relu", [f"h{n}"], [f"y{n}"])],
                                  f"window{n}", [x], [y], [numpy_helper.from_array(w, "w")])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        onnx.save(model, folder / f"src{n}.onnx")
    return w.size * 2


def child(python: str, *args: str) -> dict:
    """One fresh process of `python`; how it ended."""
    done = subprocess.run([python, "-c", CHILD, *args], capture_output=True, text=True, timeout=600)
    lines = (done.stdout + done.stderr).splitlines()
    found = {"rc": done.returncode}
    if done.returncode < 0:
        found["signal"] = signal.Signals(-done.returncode).name
    for line in lines:
        if line.startswith("QAIRT "):
            found["qairt"] = line.split()[1]
        elif line.startswith("RESULT "):
            found.update(json.loads(line[len("RESULT "):]))
    errors = [x for x in lines if "Error" in x or "error" in x]
    if done.returncode and errors:
        found["error"] = errors[-1].split("Error: ")[-1].strip()[-240:]
    return found


def family(python: str, options: dict, models: Path, work: Path, weight_bytes: int) -> dict:
    row: dict = {"python": python}
    for kind, shared in (("plain", "0"), ("shared", "1")):
        folder = work / kind
        folder.mkdir()
        common = (str(folder), str(models), json.dumps(options))
        # shared: both graphs in one process, one context; plain: each graph alone, in
        # a fresh process
        batches = [list(SIZES)] if shared == "1" else [[n] for n in SIZES]
        compiled = [
            child(python, "compile", *common, shared, json.dumps(sizes)) for sizes in batches
        ]
        row.setdefault("qairt", compiled[0].get("qairt"))
        binaries = sorted(folder.glob("*_qnn.bin"))
        row[kind] = {"compile": compiled, "binaries": [b.name for b in binaries],
                     "bytes": sum(b.stat().st_size for b in binaries),
                     "runs": {n: child(python, "run", *common, str(n)) for n in SIZES}}
    row["weights_fp16_bytes"] = weight_bytes
    row["shared_simulates"] = all(r["rc"] == 0 for r in row["shared"]["runs"].values())
    row["plain_simulates"] = all(r["rc"] == 0 for r in row["plain"]["runs"].values())
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", nargs="*", help="interpreters with onnxruntime-qnn")
    parser.add_argument("--chip", default="SM8750")
    parser.add_argument("--out", default=str(ROOT / "bench/results/shared-simulator.json"))
    args = parser.parse_args()
    pythons = args.python or [
        sys.executable,
        *sorted(str(p) for p in ROOT.glob("build/qairt/*/venv/bin/python")),
    ]
    chip = chip_table.load()[args.chip]
    options = {
        "soc_model": str(chip.soc_model),
        "htp_arch": str(chip.htp_arch),
        "vtcm_mb": str(chip.vtcm_mb),
    }
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        weight_bytes = make_models(Path(scratch))
        for i, python in enumerate(pythons):
            work = Path(scratch) / f"f{i}"
            work.mkdir()
            row = family(python, options, Path(scratch), work, weight_bytes)
            rows.append(row)
            runs = [
                r.get("signal") or r.get("error", "ran") for r in row["shared"]["runs"].values()
            ]
            print(
                f"QAIRT {row['qairt']}: two plain contexts {row['plain']['bytes']} B, "
                f"{'both run' if row['plain_simulates'] else 'FAIL'}; the shared context "
                f"{row['shared']['bytes']} B "
                f"(the weight: {weight_bytes} B in fp16): {runs}",
                flush=True,
            )
    Path(args.out).write_text(
        json.dumps({"chip": args.chip, "options": options, "families": rows}, indent=1) + "\n"
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
