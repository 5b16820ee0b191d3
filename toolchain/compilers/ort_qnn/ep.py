"""The embedded toolchain: onnxruntime-qnn's HTP backend (QAIRT) as offline compiler
and x86 simulator."""
from __future__ import annotations

import contextlib
import functools
import mmap
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from toolchain.engine import versions
from toolchain.engine.files import atomic_dir
from toolchain.errors import StageFailed
from toolchain.rewrites import library as rewrites
from toolchain.spec.chips import Chip, ChipRecord
from toolchain.spec.records import Graph, Model

NAME = "ort-qnn"
# Printed whenever libQnnHtp.so is loaded (the LIBNATIVE line on stdout) or a QNN session
# opens; pure noise.
NOISE = re.compile(r"# LIBNATIVE|File mapped weights|EPContext encryption config")


def version() -> dict:
    """Tool identity from package metadata, read once per process (every task's settings hold it);
    a copy each."""
    return dict(_version())


@functools.cache
def _version() -> dict:
    import onnxruntime_qnn.build_and_package_info as info
    return {"onnxruntime": versions.version("onnxruntime"),
            "onnxruntime-qnn": versions.version("onnxruntime-qnn"), "qairt": info.qnn_version}


def graph_options(model: Model, graph: Graph, chip: Chip) -> dict:
    """The EP options one graph is compiled and simulated with on `chip`."""
    return provider_options(
        chip.record(), model.compile["optimization"], graph.compile.get("ep_options")
    )


def provider_options(
    chip: Mapping, optimization: int, graph_options: Mapping[str, object] | None = None
) -> dict:
    """EP options for one chip (and one graph's own, from its [graphs.<g>.compile] ep_options).
    soc_model is always set: alone, htp_arch silently compiles fp32 with 4 MB VTCM
    (docs/compiler-options.md). Values are strings, as the EP takes them."""
    return {"soc_model": str(chip["soc_model"]), "htp_arch": str(chip["htp_arch"]),
            "vtcm_mb": str(chip["vtcm_mb"]),
            "htp_graph_finalization_optimization_mode": str(optimization),
            **option_strings(graph_options or {})}


FLAG = ("0", "1")
# The EP options a spec may set per graph (names as the QNN EP of onnxruntime-qnn 2.7 reads them;
# values as TOML writes them: true/false or 0/1 for a flag). What each did on a real model:
# docs/compiler-options.md.
EP_OPTIONS = {
    "enable_htp_monolithic_lstm": FLAG,  # an LSTM as one HTP op instead of unrolled cells
    "enable_htp_fp16_precision": FLAG,  # fp32 graphs computed in fp16 (on by default)
    "enable_htp_fp16_clamp_overflow": FLAG,  # clamp fp16 overflow instead of inf
    "htp_bf16_enable": FLAG,  # bf16 instead of fp16 (v81 and later)
    "enable_htp_spill_fill_buffer": FLAG,  # one spill-fill buffer shared by a context's graphs
    "offload_graph_io_quantization": FLAG,  # quantize/dequantize graph I/O on the HTP
    "htp_performance_mode": (
        "burst",
        "balanced",
        "default",
        "high_performance",
        "high_power_saver",
        "low_balanced",
        "low_power_saver",
        "power_saver",
        "sustained_high_performance",
        "extreme_power_saver",
    ),  # run time only: the simulator's session
    "qnn_context_priority": (
        "low",
        "normal_low",
        "normal",
        "normal_high",
        "high",
        "high_plus",
        "critical",
        "critical_plus",
    ),
    "enable_block_quant_weight_optimization": FLAG,
}
# Why a spec's options are checked here: the EP itself ignores a name it does not know and reads a
# bad flag value ("2", "yes") as 0, both silently (its verbose log only). Options the build sets
# itself from elsewhere in the spec: a graph may not override them.
MANAGED = {
    "soc_model": "the chip table (toolchain/spec/chips.toml)",
    "htp_arch": "the chip table",
    "vtcm_mb": "the chip table (vtcm_mb per chip; the read-back checks it)",
    "htp_graph_finalization_optimization_mode": "[compile] optimization",
    "backend_path": "the compiler",
    "backend_type": "the compiler",
    "device_id": "the compiler",
    "enable_htp_graph_splitting": "the build (one graph per binary, no partitions)",
    "profiling_level": "the build",
    "profiling_file_path": "the build",
}


# How the design card's route (convert -> modellib -> compile: QNN Saver recording, model library,
# per-chip replay) reproduces each option, checked by the oracle (byte-identical binaries):
# "lowering" = the EP's lowering changes and the recording holds it; "replayed" = a graph config the
# Saver drops and context.py puts back; "runtime" = not part of a compile. An option not listed here
# cannot take the route: its graph declares `route = "ep"` (the direct EP compile), and the build
# says so at load.
ROUTE = {"enable_htp_fp16_precision": "replayed", "enable_htp_monolithic_lstm": "lowering+replayed",
         "offload_graph_io_quantization": "lowering", "htp_performance_mode": "runtime",
         "qnn_context_priority": "lowering"}
# [graphs.<g>.compile] route: the design card's route (default) or the direct EP compile
ROUTES = ("saver", "ep")


def uses_route(graph: Graph) -> bool:
    """Whether a graph is built through convert -> modellib -> compile (else one direct EP
    compile per chip)."""
    return graph.compile.get("route", "saver") == "saver"


def route_problems(graph: Graph) -> list[tuple[str, str]]:
    """(field, reason) for a graph whose declared options the route cannot reproduce."""
    where = f"graphs.{graph.name}.compile"
    route = graph.compile.get("route", "saver")
    if route not in ROUTES:
        return [(f"{where}.route", f"{route!r}: expected one of {', '.join(map(repr, ROUTES))}")]
    if route != "saver":
        return []
    return [
        (
            f"{where}.ep_options.{name}",
            "the QNN Saver route cannot reproduce this option (the recording drops "
            'it and the build does not know how to put it back); declare route = "ep" in '
            f"[graphs.{graph.name}.compile] to compile this graph directly with the EP",
        )
        for name in graph.compile.get("ep_options", {})
        if name in EP_OPTIONS and name not in ROUTE
    ]


def option_strings(declared: Mapping[str, object]) -> dict:
    """Declared option values as the EP takes them (true/1 -> "1"); checked first
    by option_problems()."""
    def text(value):
        return ("1" if value else "0") if isinstance(value, bool) else str(value)
    return {name: text(value) for name, value in sorted(declared.items())}


def option_problems(declared: Mapping[str, object]) -> list[tuple[str, str]]:
    """(option, reason) for each declared EP option this EP does not take as given."""
    found = []
    for name, value in declared.items():
        if name in MANAGED:
            found.append((name, f"set by {MANAGED[name]}, not per graph"))
        elif name not in EP_OPTIONS:
            import difflib  # for an error's suggestion only: not at every load
            close = difflib.get_close_matches(name, EP_OPTIONS, n=1)
            hint = (
                f"did you mean '{close[0]}'?"
                if close
                else f"known: {', '.join(sorted(EP_OPTIONS))}"
            )
            found.append((name, f"not an option of the QNN EP; {hint}"))
        elif isinstance(value, (list, tuple, dict)) or isinstance(value, float) or (
                option_strings({name: value})[name] not in EP_OPTIONS[name]):
            allowed = (
                "true or false (1 or 0)"
                if EP_OPTIONS[name] == FLAG
                else ", ".join(EP_OPTIONS[name])
            )
            shown = list(value) if isinstance(value, tuple) else value   # as the TOML wrote it
            found.append((name, f"{shown!r}: expected {allowed}"))
    return found


def _session(model: str | bytes, options: dict, config: dict, severity: int = 3) -> Any:
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
    started = time.monotonic()
    with atomic_dir(out.parent) as tmp:
        _checked_session(src, options, {"ep.context_enable": "1", "ep.context_embed_mode": "0",
                                        "ep.context_file_path": str(tmp / out.name)}, "compile")
        binary = tmp / (out.stem + "_qnn.bin")
        if not binary.exists():
            raise StageFailed(f"{src}: the EP wrote no context binary {binary.name}")
    return {
        "seconds": round(time.monotonic() - started, 3),
        "binary": str(out.with_name(binary.name)),
    }


def compile_shared(src: str, options: dict, config: dict) -> None:
    """One graph of a shared context (share.py): `config` carries the context file path and
    the sharing options."""
    _checked_session(
        src, options, {"ep.context_enable": "1", "ep.context_embed_mode": "0", **config}, "compile"
    )


def lower(src: str, options: dict, given: str = "") -> None:
    """Create (and drop) an EP session on `src` with CPU fallback disabled and no context output:
    with `qnn_saver_path` in `options` the QNN Saver records the EP's HTP lowering in
    ./saver_output/ (convert.py). `given`: where a given ONNX came from ("" for an export), for the
    advice of a refusal."""
    _checked_session(src, options, {}, "lowering for the HTP", given)


GENERIC = ("", "Failed to add node.")   # the EP's words when it says nothing about the cause


def _checked_session(src: str, options: dict, config: dict, what: str, given: str = "") -> None:
    """An EP session on `src`'s bytes with CPU fallback disabled; a failure is one line, naming the
    nodes the HTP cannot take when that is why (the EP reports them only as an exception)."""
    config = {"session.disable_cpu_ep_fallback": "1", **config}
    if _has_external_data(src):
        # from bytes, external weights (ONNX over 2 GB) are found beside the source model;
        # only then, as the folder enters the EP's graph-name hash (same bytes in two
        # checkouts -> different names)
        config["session.model_external_initializers_file_folder_path"] = str(
            Path(src).resolve().parent
        )
    try:
        _session(Path(src).read_bytes(), options, config)
    except Exception as err:
        cpu = cpu_nodes(src, {k: v for k, v in options.items() if k != "qnn_saver_path"})
        if cpu:
            named = with_rewrites(src, cpu)
            listed = "; ".join(f"{name or '<unnamed>'} ({op}: {reason or 'the EP gives no reason'}"
                               f"{f'; the rewrite {rule!r} makes the HTP take it' if rule else ''})"
                               for name, op, reason, rule in named)
            hint = (
                "; a GELU exported at opset 18 is Erf, which the QNN EPs of QAIRT 2.47-2.49 leave "
                "on the CPU: "
                "export at opset 20 (one Gelu node, every family takes it)"
                if any(op == "Erf" for _, op, *_ in cpu)
                else ""
            )
            raise OffTheHtp(
                f"{src}: {len(cpu)} node(s) would run on the CPU, not the HTP: {listed}; "
                f"{advice(named, given)}{hint}",
                named,
            ) from None
        raise StageFailed(f"{src}: {what} failed: {str(err).strip().splitlines()[-1]}") from None


def advice(named: list, given: str) -> str:
    """The next step after a refusal: the rules that apply; for the rest, the export to fix, or, for
    a given ONNX (which has no export), what is left to the user."""
    ruled = any(rule for *_, rule in named)
    unruled = [name or op for name, op, _, rule in named if not rule]
    apply = (
        'apply the rewrites named (rewrite = [...] or "auto" in the graph\'s [graphs.<g>] table, '
        "docs/add-a-model.md)"
    )
    if not unruled:
        return apply
    if given:
        rest = (
            f"the graph is given ({given}), so there is no export to fix, and no rule of the "
            "library matches "
            f"{', '.join(unruled[:3])}{' ...' if len(unruled) > 3 else ''}: cut the graph before "
            "them (declare "
            "the tensor before as the graph's output and run the rest on the host), or bring the "
            "model in a "
            f"form without them"
        )
        return f"{apply}; {rest}" if ruled else rest
    return f"{apply} or fix the others in the export" if ruled else \
        "fix them in the export (replace or rewrite these ops)"


def with_rewrites(src: str, cpu: list) -> list[tuple[str, str, str, str]]:
    """Each CPU node with its reason (the EP's, or the HTP limit its tensors break when
    the EP gives none) and the legalizing rewrite that makes the HTP take it ("" for
    none: toolchain/rewrites)."""
    import onnx
    found = rewrites.for_nodes(onnx.load(src), [name for name, _, _ in cpu])
    return [(name, op, limit if limit and reason in GENERIC else reason, rule)
            for (name, op, reason), (rule, limit) in zip(cpu, found)]


class OffTheHtp(StageFailed):
    """Nodes the HTP cannot take: `nodes` is [(name, op_type, the EP's reason or "", the rewrite
    that helps or "")]."""

    def __init__(self, message: str, nodes: list) -> None:
        super().__init__(message)
        self.nodes = nodes


def _has_external_data(src: str) -> bool:
    """Whether the model keeps weights in side files. Every external tensor names its file under
    the key "location", so a model without that word has none: no 1.2 s parse of a 113 MB protobuf
    for the answer."""
    with open(src, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if data.find(b"location") < 0:
            return False
    import onnx
    return any(t.data_location == onnx.TensorProto.EXTERNAL
               for t in onnx.load(src, load_external_data=False).graph.initializer)


def cpu_nodes(src: str, options: dict) -> list[tuple[str, str, str]]:
    """(name, op_type, reason) of the nodes the EP leaves on the CPU, from its graph assignment
    info; the reason is the EP's own, which it states only in its verbose log (read here from a
    session at that level)."""
    with tempfile.TemporaryFile() as log:
        try:
            with _stderr_to(log):
                s = _session(
                    Path(src).read_bytes(),
                    options,
                    {
                        "session.disable_cpu_ep_fallback": "0",
                        "session.record_ep_graph_assignment_info": "1",
                    },
                    severity=0,
                )
        except Exception:
            return []
        log.seek(0)
        reasons = placement_reasons(log.read().decode(errors="replace"))
    return [
        (n.name, n.op_type, reasons.get(n.name, ""))
        for sg in s.get_provider_graph_assignment_info()
        if sg.ep_name != "QNNExecutionProvider"
        for n in sg.get_nodes()
    ]


_UNIT = re.compile(r"Validation FAILED for \d+ nodes in OrtNodeUnit")
_NODE = re.compile(r"Operator type: \S+ Node name: (.*?) Node index: \d+")
_REASON = re.compile(r"REASON : (.*)")


def placement_reasons(log: str) -> dict[str, str]:
    """{node name: the EP's reason} from its verbose log's LogNodeSupport blocks ("Validation FAILED
    for N nodes in OrtNodeUnit (…)", a line per node, then "REASON : …"); the first reason said for
    a node is kept."""
    found: dict[str, str] = {}
    for block in _UNIT.split(log)[1:]:
        reason = _REASON.search(block)
        for name in _NODE.findall(block.split("REASON :")[0]):
            found.setdefault(name, reason.group(1).strip() if reason else "")
    return found


@contextlib.contextmanager
def _stderr_to(file):
    """fd 2 (where onnxruntime's C++ logger writes) sent to `file` for the block."""
    sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(file.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def context_ops(ctx_model: str) -> list[tuple[str, str]]:
    """Nodes of an EPContext model that are not EPContext nodes: they would run on the CPU."""
    import onnx
    graph = onnx.load(ctx_model, load_external_data=False).graph
    return [(n.name, n.op_type) for n in graph.node if n.op_type != "EPContext"]


def simulator(ctx_model: str, options: dict) -> Callable[[dict], dict]:
    """Run(feeds) for a compiled EPContext model in the x86 HTP simulator."""
    session = _session(ctx_model, options, {"session.disable_cpu_ep_fallback": "1"})
    names = [o.name for o in session.get_outputs()]
    return lambda feeds: dict(zip(names, session.run(names, feeds)))


def piece_simulator(piece: str, options: dict) -> Callable[[dict], dict]:
    """Compile a cut piece of a graph beside it (as compile.build does the whole graph: no CPU
    fallback) and return run(feeds) on the simulator."""
    out = str(Path(piece).with_name(Path(piece).stem + ".ctx.onnx"))
    compile(piece, out, options)
    left = context_ops(out)
    if left:
        raise StageFailed(f"{piece}: nodes outside the HTP context: {left}")
    return simulator(out, options)


# family: a families.Family (Any: families imports this module)
def runtime_libraries(chip: ChipRecord, family: Any) -> dict:
    """What an app must ship next to this chip's binaries: QNN libraries of the compiler's
    QAIRT family or newer (`family`: families.Family; the default one's record is as it
    was before families)."""
    arch = chip["htp_arch"]
    found = {
        "qairt": family.version,
        "android_aarch64": ["libQnnHtp.so", "libQnnSystem.so", f"libQnnHtpV{arch}Stub.so"],
        "hexagon_dsp": [f"libQnnHtpV{arch}Skel.so"],
        "bundled_here": False,
        "note": (
            f"onnxruntime-qnn ships x86_64 libraries only; take these from QAIRT {family.version} "
            f"(same version family as the compiler) and put the Skel's folder on ADSP_LIBRARY_PATH"
        ),
    }
    if not family.default:
        found["built_with"] = f"onnxruntime-qnn {family.onnxruntime_qnn} (QAIRT {family.build_id})"
    return found


# The libraries that compile and simulate: their bytes are part of the tool's identity (a task
# depends on them as files), so the same package version with other libraries still rebuilds.
LIBRARIES = (
    "libQnnHtp.so",
    "libHtpPrepare.so",
    "libQnnSystem.so",
    "libonnxruntime_providers_qnn.so",
)
# the QNN Saver backend: records the QNN API calls of a session as a C program
SAVER = "libQnnSaver.so"


def saver_library() -> str:
    return str(versions.folder("onnxruntime-qnn", "onnxruntime_qnn") / SAVER)


@functools.cache
def library_files() -> list[str]:
    folder = versions.folder("onnxruntime-qnn", "onnxruntime_qnn")
    return [str(folder / name) for name in LIBRARIES if (folder / name).is_file()]


