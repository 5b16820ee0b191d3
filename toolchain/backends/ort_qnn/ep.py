"""The embedded toolchain: onnxruntime-qnn's HTP backend (QAIRT) as offline compiler and x86 simulator."""
from __future__ import annotations

import functools
import mmap
import os
import re
import time
from importlib import metadata
from pathlib import Path

from toolchain.engine.files import atomic_dir
from toolchain.engine.worker import StageFailed

NAME = "ort-qnn"
# Printed on stdout whenever libQnnHtp.so is loaded; pure noise (ort-qnn.md §7).
NOISE = re.compile(r"# LIBNATIVE|File mapped weights|EPContext encryption config")


def version() -> dict:
    """Tool identity from package metadata: cheap enough for every `doit` start."""
    import onnxruntime_qnn.build_and_package_info as info
    return {"onnxruntime": metadata.version("onnxruntime"),
            "onnxruntime-qnn": metadata.version("onnxruntime-qnn"), "qairt": info.qnn_version}


def provider_options(chip: dict, optimization: int) -> dict:
    """EP options for one chip. soc_model is always set: alone, htp_arch silently compiles fp32 with
    4 MB VTCM (ort-qnn.md §1.1). Values are strings, as the EP takes them."""
    return {"soc_model": str(chip["soc_model"]), "htp_arch": str(chip["htp_arch"]),
            "vtcm_mb": str(chip["vtcm_mb"]),
            "htp_graph_finalization_optimization_mode": str(optimization)}


def _session(model, options: dict, config: dict, severity: int = 3):
    import onnxruntime as ort
    import onnxruntime_qnn as oq
    if oq.EP_NAME not in {d.ep_name for d in ort.get_ep_devices()}:
        ort.register_execution_provider_library(oq.EP_NAME, oq.get_library_path())
    devices = [d for d in ort.get_ep_devices() if d.ep_name == oq.EP_NAME]
    so = ort.SessionOptions()
    so.log_severity_level = severity
    so.add_provider_for_devices(devices, {"backend_path": oq.get_qnn_htp_path(), **options})
    for key, value in config.items():
        so.add_session_config_entry(key, value)
    return ort.InferenceSession(model, sess_options=so)


def compile(src: str, out_model: str, options: dict) -> dict:
    """ONNX -> EPContext model + context binary (`<stem>_qnn.bin`), CPU fallback disabled.
    From model bytes, so the QNN graph name depends on content, not on the path. Built in a temp
    folder: the EP writes the binary even when the session then fails, and refuses to overwrite."""
    out = Path(out_model)
    config = {"session.disable_cpu_ep_fallback": "1", "ep.context_enable": "1", "ep.context_embed_mode": "0"}
    if _has_external_data(src):
        # from bytes, external weights (ONNX over 2 GB) are found beside the source model; only then, as
        # the folder enters the EP's graph-name hash (same bytes in two checkouts -> different names)
        config["session.model_external_initializers_file_folder_path"] = str(Path(src).resolve().parent)
    started = time.monotonic()
    with atomic_dir(out.parent) as tmp:
        try:
            _session(Path(src).read_bytes(), options, {**config, "ep.context_file_path": str(tmp / out.name)})
        except Exception as err:  # the EP reports unsupported nodes only as an exception
            cpu = cpu_nodes(src, options)
            if cpu:
                listed = ", ".join(f"{name or '<unnamed>'} ({op})" for name, op in cpu)
                raise StageFailed(f"{src}: {len(cpu)} node(s) would run on the CPU, not the HTP: {listed}; "
                                  f"fix them in the export (replace or rewrite these ops)") from None
            raise StageFailed(f"{src}: compile failed: {str(err).strip().splitlines()[-1]}") from None
        binary = tmp / (out.stem + "_qnn.bin")
        if not binary.exists():
            raise StageFailed(f"{src}: the EP wrote no context binary {binary.name}")
    return {"seconds": round(time.monotonic() - started, 3), "binary": str(out.with_name(binary.name))}


def _has_external_data(src: str) -> bool:
    """Whether the model keeps weights in side files. Every external tensor names its file under the key
    "location", so a model without that word has none: no 1.2 s parse of a 113 MB protobuf for the answer."""
    with open(src, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if data.find(b"location") < 0:
            return False
    import onnx
    return any(t.data_location == onnx.TensorProto.EXTERNAL
               for t in onnx.load(src, load_external_data=False).graph.initializer)


def cpu_nodes(src: str, options: dict) -> list[tuple[str, str]]:
    """(name, op_type) of the nodes the EP leaves on the CPU, from its graph assignment info."""
    try:
        s = _session(Path(src).read_bytes(), options,
                     {"session.disable_cpu_ep_fallback": "0", "session.record_ep_graph_assignment_info": "1"})
    except Exception:
        return []
    return [(n.name, n.op_type) for sg in s.get_provider_graph_assignment_info()
            if sg.ep_name != "QNNExecutionProvider" for n in sg.get_nodes()]


def context_ops(ctx_model: str) -> list[tuple[str, str]]:
    """Nodes of an EPContext model that are not EPContext nodes: they would run on the CPU."""
    import onnx
    graph = onnx.load(ctx_model, load_external_data=False).graph
    return [(n.name, n.op_type) for n in graph.node if n.op_type != "EPContext"]


def simulator(ctx_model: str, options: dict):
    """Run(feeds) for a compiled EPContext model in the x86 HTP simulator."""
    session = _session(ctx_model, options, {"session.disable_cpu_ep_fallback": "1"})
    names = [o.name for o in session.get_outputs()]
    return lambda feeds: dict(zip(names, session.run(names, feeds)))


def runtime_libraries(chip: dict) -> dict:
    """What an app must ship next to this chip's binaries (same QAIRT version as the compiler)."""
    import onnxruntime_qnn.build_and_package_info as info
    arch = chip["htp_arch"]
    return {"qairt": info.qnn_version,
            "android_aarch64": ["libQnnHtp.so", "libQnnSystem.so", f"libQnnHtpV{arch}Stub.so"],
            "hexagon_dsp": [f"libQnnHtpV{arch}Skel.so"],
            "bundled_here": False,
            "note": (f"onnxruntime-qnn ships x86_64 libraries only; take these from QAIRT {info.qnn_version} "
                     f"(same version family as the compiler) and put the Skel's folder on ADSP_LIBRARY_PATH")}


def library_dir() -> str:
    import onnxruntime_qnn as oq
    return os.path.dirname(oq.get_qnn_htp_path())


# The libraries that compile and simulate: their bytes are part of the tool's identity (a task depends on
# them as files), so the same package version with other libraries still rebuilds.
LIBRARIES = ("libQnnHtp.so", "libHtpPrepare.so", "libQnnSystem.so", "libonnxruntime_providers_qnn.so")


@functools.cache
def library_files() -> list[str]:
    folder = Path(metadata.distribution("onnxruntime-qnn").locate_file("onnxruntime_qnn"))
    return [str(folder / name) for name in LIBRARIES if (folder / name).is_file()]


