"""A stand-in QAIRT SDK tree for the tests: the real names and layout, executables that check their
arguments strictly, record their argv and write outputs of the right names and kinds.

The same file is every tool: each executable is a shebang script that calls
tool_main(), which dispatches on the script's name. Knobs live in <root>/standin.json;
calls go to <root>/calls.jsonl."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

HOST, ANDROID = "x86_64-linux-clang", "aarch64-android"
TOOLS = ("qnn-onnx-converter", "qnn-model-lib-generator", "qnn-context-binary-generator",
         "qnn-context-binary-utility", "qnn-net-run")
ARCHES = (68, 69, 73, 75, 79, 81)
MAGIC = b"QNN-STANDIN-CONTEXT\n"
EM_AARCH64 = 183
ONNX_DTYPES = {1: "float32", 10: "float16", 6: "int32", 7: "int64"}
QNN_DTYPES = {
    "float32": "QNN_DATATYPE_FLOAT_32",
    "float16": "QNN_DATATYPE_FLOAT_16",
    "int32": "QNN_DATATYPE_INT_32",
    "ufixed16": "QNN_DATATYPE_UFIXED_POINT_16",
}

# libQnnHtp.so: QnnInterface_getProviders with backendGetBuildId at slot 4 of the function table,
# the layout toolchain/qnn/qnnbin.py reads (QnnInterface_t: id, name, two versions, function table).
HTP_SOURCE = r"""
#include <stdint.h>
typedef struct { uint32_t major, minor, patch; } Ver;
typedef struct {
    uint32_t backendId; const char* providerName; Ver coreApi; Ver backendApi; void* fns[5];
} Iface;
static uint64_t get_build_id(const char** id) { *id = BUILD_ID; return 0; }
static Iface iface = {6, "HTP_QTI_AISW", {2, 40, 0}, {5, 40, 0}, {0, 0, 0, 0, (void*)get_build_id}};
static const Iface* providers[] = {&iface};
uint64_t QnnInterface_getProviders(const Iface*** out, uint32_t* n) {
    *out = providers; *n = 1; return 0;
}
"""


# ---- building the tree (test side) ----
def make_sdk(root: Path, build_id: str = "v2.40.0.251030-standin", arches=ARCHES) -> Path:
    """The SDK tree: tools, x86_64 libs (libQnnHtp.so a real ELF with a build id),
    device libs, python."""
    bin_dir = root / "bin" / HOST
    bin_dir.mkdir(parents=True)
    (root / "bin" / "envsetup.sh").write_text("export QNN_SDK_ROOT=...  # stand-in\n")
    for tool in TOOLS:
        script = bin_dir / tool
        script.write_text(
            f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\n"
            f"import sdk_standin\nsys.exit(sdk_standin.tool_main())\n"
        )
        script.chmod(0o755)
    for lib in ("libQnnSystem.so", "libQnnHtpNetRunExtensions.so"):
        _placeholder(root / "lib" / HOST / lib)
    for arch in arches:
        for lib in ("libQnnHtp.so", "libQnnSystem.so", f"libQnnHtpV{arch}Stub.so"):
            _placeholder(root / "lib" / ANDROID / lib)
        _placeholder(root / "lib" / f"hexagon-v{arch}" / "unsigned" / f"libQnnHtpV{arch}Skel.so")
    converters = root / "lib" / "python" / "qti" / "aisw" / "converters"
    converters.mkdir(parents=True)
    for folder in (converters, converters.parent, converters.parent.parent):
        (folder / "__init__.py").write_text("")
    (root / "sdk.yaml").write_text(f"name: qairt\nversion: {build_id.lstrip('v').split('-')[0]}\n")
    set_build_id(root, build_id)
    return root


def set_build_id(root: Path, build_id: str) -> None:
    """(Re)build lib/x86_64-linux-clang/libQnnHtp.so so that
    backendGetBuildId returns `build_id`."""
    src = root / "standin-htp.c"
    src.write_text(HTP_SOURCE)
    subprocess.run(["gcc", "-shared", "-fPIC", f'-DBUILD_ID="{build_id}"', "-o",
                    str(root / "lib" / HOST / "libQnnHtp.so"), str(src)], check=True)
    configure(root, build_id=build_id)


def configure(root: Path, **knobs) -> None:
    """Change the stand-in's behaviour: fail={tool: message},
    page_size={target: bytes}, build_id=..."""
    path = root / "standin.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data.update(knobs)
    path.write_text(json.dumps(data))


def calls(root: Path, tool: str | None = None) -> list[dict]:
    """Every recorded call (argv, env), oldest first."""
    path = root / "calls.jsonl"
    found = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [c for c in found if tool is None or c["tool"] == tool]


def make_bin(folder: Path, ndk: bool = True) -> Path:
    """Host tools the SDK wants on PATH: python3.10 (this Python), clang++ (g++), ndk-build."""
    folder.mkdir(parents=True, exist_ok=True)
    shims = {"python3.10": f'exec {sys.executable} "$@"', "clang++": 'exec g++ "$@"'}
    if ndk:
        shims["ndk-build"] = 'echo "stand-in ndk-build"'
    for name, body in shims.items():
        (folder / name).write_text(f"#!/bin/sh\n{body}\n")
        (folder / name).chmod(0o755)
    return folder


def _placeholder(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"stand-in " + path.name.encode())


# ---- the tools (run as executables) ----
def tool_main() -> int:
    tool = Path(sys.argv[0]).name
    root = Path(sys.argv[0]).resolve().parents[2]
    knobs = json.loads((root / "standin.json").read_text())
    with open(root / "calls.jsonl", "a") as f:
        f.write(
            json.dumps(
                {
                    "tool": tool,
                    "argv": sys.argv[1:],
                    "cwd": os.getcwd(),
                    "env": {k: os.environ.get(k) for k in ("LDFLAGS", "QNN_SDK_ROOT")},
                    "pythonpath": os.environ.get("PYTHONPATH", "").split(os.pathsep)[0],
                }
            )
            + "\n"
        )
    args = PARSERS[tool]().parse_args(sys.argv[1:])
    if tool in knobs.get("fail", {}):
        for i in range(30):
            print(f"{tool}: step {i}", flush=True)
        print(f"ERROR: {knobs['fail'][tool]}", file=sys.stderr)
        return 1
    return RUNNERS[tool](args, root, knobs) or 0


def _parser(tool: str) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(prog=tool, allow_abbrev=False)


def converter_parser():
    p = _parser("qnn-onnx-converter")
    p.add_argument("--input_network", required=True)
    p.add_argument("--output_path", required=True)
    p.add_argument("--input_list")
    p.add_argument("--use_native_input_files", action="store_true")
    p.add_argument("--act_bitwidth", type=int, choices=(8, 16))
    p.add_argument("--bias_bitwidth", type=int, choices=(8, 32))
    p.add_argument("--float_bitwidth", type=int, choices=(16, 32))
    p.add_argument("--out_node", action="append")
    p.add_argument("--input_dtype", nargs=2, action="append")
    p.add_argument("--input_layout", nargs=2, action="append")
    return p


def modellib_parser():
    p = _parser("qnn-model-lib-generator")
    p.add_argument("-c", required=True)
    p.add_argument("-b", required=True)
    p.add_argument("-o", required=True)
    p.add_argument("-t", nargs="+", choices=(HOST, ANDROID))
    p.add_argument("-l")
    return p


def context_parser():
    p = _parser("qnn-context-binary-generator")
    for flag in ("--backend", "--model", "--output_dir", "--binary_file"):
        p.add_argument(flag, required=True)
    p.add_argument("--config_file")
    p.add_argument("--log_level")
    return p


def utility_parser():
    p = _parser("qnn-context-binary-utility")
    p.add_argument("--context_binary", required=True)
    p.add_argument("--json_file", required=True)
    return p


def netrun_parser():
    p = _parser("qnn-net-run")
    p.add_argument("--backend", required=True)
    model = p.add_mutually_exclusive_group(required=True)
    model.add_argument("--retrieve_context")
    model.add_argument("--model")
    p.add_argument("--input_list", required=True)
    p.add_argument("--output_dir", required=True)
    p.add_argument("--config_file")
    p.add_argument("--log_level")
    return p


def convert(args, root, knobs):
    """Reads the ONNX, writes <out> (C source with the graph record), <stem>.bin (the ONNX as
    weights), <stem>_net.json. As the real one does: 3-D inputs get their last two axes swapped, 4-D
    inputs NHWC; tensor and graph names get every non-word character as '_'; with --input_list
    (calibration) it opens every listed raw file from where it runs, and a float graph I/O becomes
    UFIXED_POINT_16 with a scale and offset."""
    import importlib
    import re

    import onnx
    # fails without the SDK's lib/python on PYTHONPATH
    importlib.import_module("qti.aisw.converters")
    if args.use_native_input_files and not args.input_list:
        sys.exit("--use_native_input_files needs --input_list")
    if args.input_list:
        for line in Path(args.input_list).read_text().splitlines():
            for raw in line.split():
                if not Path(raw.split(":=")[-1]).is_file():
                    sys.exit(f"ERROR: cannot open calibration input {raw} (from {os.getcwd()})")
    model = onnx.load(args.input_network)
    out = Path(args.output_path)
    name = re.sub(r"\W", "_", out.stem)

    def tensors(values, permute):
        found = []
        for v in values:
            dims = [d.dim_value for d in v.type.tensor_type.shape.dim]
            perm = {3: [0, 2, 1], 4: [0, 2, 3, 1]}.get(len(dims)) if permute else None
            dtype = ONNX_DTYPES[v.type.tensor_type.elem_type]
            quantized = args.input_list and dtype == "float32"
            found.append(
                {
                    "name": re.sub(r"\W", "_", v.name),
                    "onnx_name": v.name,
                    "onnx_dtype": dtype,
                    "dtype": "ufixed16" if quantized else dtype,
                    **({"scale": 0.0001, "offset": -32768} if quantized else {}),
                    "dims": [dims[i] for i in perm] if perm else dims,
                    "onnx_dims": dims,
                }
            )
        return found

    graph = {
        "name": name,
        "inputs": tensors(model.graph.input, True),
        "outputs": tensors(model.graph.output, False),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        f"/* stand-in qnn-onnx-converter output, graph {name} */\n"
        '#ifdef __cplusplus\nextern "C" {\n#endif\n'
        f"const char standin_graph[] = {json.dumps(json.dumps(graph))};\n"
        "int QnnModel_composeGraphs(void) { return 0; }\nint QnnModel_freeGraphsInfo(void) { "
        "return 0; }\n"
        "#ifdef __cplusplus\n}\n#endif\n"
    )
    out.with_name(out.stem + ".bin").write_bytes(Path(args.input_network).read_bytes())
    out.with_name(out.stem + "_net.json").write_text(json.dumps({"graph": graph}, indent=1))
    print(f"converted {args.input_network} -> {out} (graph {name})")


def modellib(args, root, knobs):
    """Compiles the converter's C source + weights into lib<stem>.so per target with the system gcc,
    honouring $LDFLAGS (a page_size knob overrides it, to make a 4 KiB lib)."""
    import shlex
    cpp, weights = Path(args.c), Path(args.b)
    for path in (cpp, weights):
        if not path.is_file():
            sys.exit(f"ERROR: no such file {path}")
    if not shutil.which("clang++"):
        sys.exit("ERROR: clang++ not found")
    for target in args.t or (ANDROID, HOST):
        if target == ANDROID and not shutil.which("ndk-build"):
            sys.exit("ERROR: ndk-build not found on PATH: cannot build aarch64-android")
        folder = Path(args.o) / target
        folder.mkdir(parents=True, exist_ok=True)
        glue = folder / "standin_weights.c"
        glue.write_text(
            f'__asm__(".section .rodata\\n.global standin_weights\\nstandin_weights:\\n.incbin \\"'
            f'{weights.resolve()}\\"\\n.global standin_weights_end\\n'
            'standin_weights_end:\\n.previous\\n");\n'
            "extern const char standin_weights[], standin_weights_end[];\n"
            "long standin_weights_size(void) { return standin_weights_end - standin_weights; }\n"
            "const char* standin_weights_data(void) { return standin_weights; }\n"
        )
        lib = folder / f"lib{cpp.stem}.so"
        page = knobs.get("page_size", {}).get(target)
        flags = shlex.split(os.environ.get("LDFLAGS", "")) + (
            [f"-Wl,-z,max-page-size={page}"] if page else []
        )
        subprocess.run(
            ["gcc", "-shared", "-fPIC", "-x", "c", str(cpp), str(glue), "-o", str(lib), *flags],
            check=True,
        )
        glue.unlink()
        if target == ANDROID:   # no cross compiler here: mark the ELF as AArch64 code
            data = bytearray(lib.read_bytes())
            data[18:20] = EM_AARCH64.to_bytes(2, "little")
            lib.write_bytes(bytes(data))
        print(f"built {lib}")


def context(args, root, knobs):
    """Loads the x86_64 model lib, reads the HTP config, writes <output_dir>/<binary_file>.bin."""
    import ctypes
    if Path(args.backend) != root / "lib" / HOST / "libQnnHtp.so":
        sys.exit(f"ERROR: --backend {args.backend} is not this SDK's x86_64 HTP backend")
    lib = ctypes.CDLL(str(Path(args.model).resolve()))
    lib.QnnModel_composeGraphs  # a model lib, or AttributeError
    graph = json.loads(
        ctypes.string_at(ctypes.addressof(ctypes.c_char.in_dll(lib, "standin_graph")))
    )
    lib.standin_weights_size.restype = ctypes.c_long
    lib.standin_weights_data.restype = ctypes.c_void_p
    weights = ctypes.string_at(lib.standin_weights_data(), lib.standin_weights_size())
    header = {"buildId": knobs["build_id"], "graphs": [graph]}
    if args.config_file:
        ext = json.loads(Path(args.config_file).read_text())["backend_extensions"]
        if not Path(ext["shared_library_path"]).is_file():
            sys.exit(f"ERROR: backend extension {ext['shared_library_path']} not found")
        config = json.loads(Path(ext["config_file_path"]).read_text())
        if graph["name"] not in config["graphs"][0]["graph_names"]:
            sys.exit(f"ERROR: graph {graph['name']!r} of the model is not in graph_names "
                     f"{config['graphs'][0]['graph_names']} (the config would not apply)")
        device = config["devices"][0]
        header.update(socModel=device["soc_id"], dspArch=device["dsp_arch"],
                      vtcmMb=config["graphs"][0]["vtcm_mb"], O=config["graphs"][0]["O"])
    out = Path(args.output_dir) / f"{args.binary_file}.bin"
    out.write_bytes(MAGIC + json.dumps(header).encode() + b"\n" + weights)
    print(f"wrote {out}")


def _read_binary(path: str) -> tuple[dict, bytes]:
    data = Path(path).read_bytes()
    if not data.startswith(MAGIC):
        sys.exit(f"ERROR: {path} is not a context binary")
    header, _, onnx_bytes = data[len(MAGIC):].partition(b"\n")
    return json.loads(header), onnx_bytes


def utility(args, root, knobs):
    """Writes the binary's info in the JSON shape of the real tool
    (info.graphs[].info.graphInputs...)."""
    header, _ = _read_binary(args.context_binary)

    def tensors(items):
        return [
            {
                "info": {
                    "id": i + 1,
                    "name": t["name"],
                    "dataType": QNN_DTYPES[t["dtype"]],
                    "dimensions": t["dims"],
                    "quantizeParams": {
                        "definition": "QNN_DEFINITION_DEFINED",
                        "quantizationEncoding": "QNN_QUANTIZATION_ENCODING_SCALE_OFFSET",
                        "scaleOffset": {"scale": t["scale"], "offset": t["offset"]},
                    }
                    if "scale" in t
                    else {"definition": "QNN_DEFINITION_UNDEFINED"},
                }
            }
            for i, t in enumerate(items)
        ]
    info = {"buildId": header["buildId"], "socModel": header.get("socModel"),
            "graphs": [{"info": {"graphName": g["name"], "graphInputs": tensors(g["inputs"]),
                                 "graphOutputs": tensors(g["outputs"])}} for g in header["graphs"]]}
    Path(args.json_file).write_text(json.dumps({"info": info, "version": "stand-in"}, indent=4))


def netrun(args, root, knobs):
    """Runs the graph kept in the binary on onnxruntime's CPU: float32 raw files in the QNN-side
    layout in (quantized I/O too: qnn-net-run converts), <output_dir>/Result_<i>/<name>.raw
    (float32) out, named as the converter named the tensor."""
    import numpy as np
    import onnxruntime as ort
    if Path(args.backend) != root / "lib" / HOST / "libQnnHtp.so":
        sys.exit(f"ERROR: --backend {args.backend} is not this SDK's x86_64 HTP backend")
    header, onnx_bytes = _read_binary(args.retrieve_context)
    graph = header["graphs"][0]
    session = ort.InferenceSession(onnx_bytes, providers=["CPUExecutionProvider"])
    for i, line in enumerate(
        text for text in Path(args.input_list).read_text().splitlines() if text.strip()
    ):
        feeds = {}
        for t, path in zip(graph["inputs"], line.split()):
            data = np.fromfile(path.split(":=")[-1], np.float32).reshape(t["dims"])
            back = {3: [0, 2, 1], 4: [0, 3, 1, 2]}.get(len(t["dims"]))
            feeds[t.get("onnx_name", t["name"])] = (data.transpose(back) if back else data).astype(
                t.get("onnx_dtype", t["dtype"]))
        result = Path(args.output_dir) / f"Result_{i}"
        result.mkdir(parents=True, exist_ok=True)
        for t, value in zip(
            graph["outputs"],
            session.run([t.get("onnx_name", t["name"]) for t in graph["outputs"]], feeds),
        ):
            np.asarray(value, np.float32).tofile(result / f"{t['name']}.raw")
    print(f"ran {args.retrieve_context}")


PARSERS = {
    "qnn-onnx-converter": converter_parser,
    "qnn-model-lib-generator": modellib_parser,
    "qnn-context-binary-generator": context_parser,
    "qnn-context-binary-utility": utility_parser,
    "qnn-net-run": netrun_parser,
}
RUNNERS = {
    "qnn-onnx-converter": convert,
    "qnn-model-lib-generator": modellib,
    "qnn-context-binary-generator": context,
    "qnn-context-binary-utility": utility,
    "qnn-net-run": netrun,
}
