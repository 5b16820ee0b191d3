"""What the embedded compiler accepts: the largest fp16 graph (one context) it compiles, measured.

Builds chains of `layers` MatMul+Relu blocks [1,K]x[K,K] (K=4096, 16.8 M fp32 parameters each,
weights in ONNX external data) and compiles each with onnxruntime-qnn for one chip (fp16 where the
chip has it), each in its own process under /usr/bin/time: success or the compiler's last error
line, binary size, compile wall time and peak memory. A measurement, not a test.

    python bench/size_limit.py --params 0.25e9 0.5e9 1e9 1.2e9 [--chip SM8750] [--out bench/results]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
K = 4096

BUILD_AND_COMPILE = r"""
import json, sys, time, numpy as np, onnx
from onnx import helper as h, TensorProto as T, numpy_helper as nh
from toolchain.spec import chips
from toolchain.compilers.ort_qnn import ep as ort_qnn
layers, K, folder, chip = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
rng = np.random.default_rng(0)
nodes, inits, x = [], [], "x"
for i in range(layers):
    weights = rng.standard_normal((K, K), dtype=np.float32) * K ** -0.5
    inits.append(nh.from_array(weights, f"w{i}"))
    nodes += [h.make_node("MatMul", [x, f"w{i}"], [f"m{i}"]),
              h.make_node("Relu", [f"m{i}"], [f"r{i}"])]
    x = f"r{i}"
g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [1, K])],
                 [h.make_tensor_value_info(x, T.FLOAT, [1, K])], inits)
m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
onnx.save(m, folder + "/m.onnx", save_as_external_data=True, location="m.weights")
del m, g, inits
record = chips.load()[chip].record()
started = time.monotonic()
result = ort_qnn.compile(folder + "/m.onnx", folder + "/out/m.onnx",
                         ort_qnn.provider_options(record, 3))
print("RESULT " + json.dumps({"seconds": round(time.monotonic() - started, 1),
                              "binary_bytes": __import__("os").path.getsize(result["binary"])}))
"""


def measure(params: float, chip: str) -> dict:
    layers = max(1, round(params / (K * K)))
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as folder:
        started = time.monotonic()
        run = subprocess.run(
            [
                "/usr/bin/time",
                "-v",
                sys.executable,
                "-c",
                BUILD_AND_COMPILE,
                str(layers),
                str(K),
                folder,
                chip,
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        wall = time.monotonic() - started
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", run.stderr)
    row = {
        "params": layers * K * K,
        "layers": layers,
        "chip": chip,
        "fp32_onnx_bytes": layers * K * K * 4,
        "wall_seconds": round(wall, 1),
        "peak_rss_gb": round(int(rss.group(1)) / 2**20, 2) if rss else None,
    }
    line = [text for text in run.stdout.splitlines() if text.startswith("RESULT ")]
    if line:
        row.update(json.loads(line[0][len("RESULT "):]), ok=True)
    else:
        errors = [
            text
            for text in (run.stdout + run.stderr).splitlines()
            if "rror" in text or "fail" in text.lower()
        ]
        row.update(ok=False, error=(errors or ["(no error line)"])[-1][-400:])
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=float, nargs="+", default=[0.25e9, 0.5e9, 1e9, 1.2e9])
    ap.add_argument("--chip", default="SM8750")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args()
    rows = []
    for params in args.params:
        rows.append(measure(params, args.chip))
        print(json.dumps(rows[-1]), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "size_limit.json").write_text(
        json.dumps({"K": K, "rows": rows, "load": os.getloadavg()}, indent=1) + "\n"
    )


if __name__ == "__main__":
    main()
