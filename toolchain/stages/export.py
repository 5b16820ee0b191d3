"""Checkpoint -> one static-shape ONNX per graph, by the model's own export code."""
from __future__ import annotations

import collections
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from doit.tools import config_changed

from toolchain import artifacts
from toolchain.engine import versions
from toolchain.engine.files import atomic_path, sha256, write_json
from toolchain.engine.run.worker import load_module, missing_package, run
from toolchain.errors import StageFailed
from toolchain.shared import modeldata
from toolchain.shared.iorecord import io_record
from toolchain.spec.records import Graph, Model
from toolchain.stages import Project, named

if TYPE_CHECKING:   # annotations only
    from collections.abc import Callable


def tool_version() -> dict:
    return {"torch": versions.version("torch"), "onnxscript": versions.version("onnxscript")}


def tasks(project: Project) -> Iterator[dict]:
    for model in project.models:
        settings_export = dict(model.export)
        for graph in model.graphs:
            out, record = artifacts.exported(model, graph), artifacts.export_record(model, graph)
            log = artifacts.export_log(model, graph)
            if graph.source:
                yield _external_task(model, graph, out, record, log)
                continue
            settings = {"export": settings_export, "io": io_record(graph), "tool": tool_version()}
            if model.requires:   # the model code's own packages: a new version exports again
                settings["requires"] = dict(model.requires)
            kwargs = {
                "module_file": model.module_file,
                "checkpoint": artifacts.checkpoint(model),
                "graph": graph.name,
                "settings": settings_export,
                "out": out,
                "record": record,
                "io": {graph.name: settings["io"]},
            }
            yield {
                **named(model, graph),
                "doc": f"{model.name}/{graph.name}: checkpoint -> ONNX "
                       f"({settings_export['exporter']}, "
                f"opset {settings_export['opset']}), batch 1, static shapes",
                "file_dep": [artifacts.checkpoint(model), *model.code_files],
                "targets": [out, record, log],
                "clean": True,
                "actions": [(run, (export, kwargs, log))],
                "uptodate": [config_changed(settings)],
            }


# module: a torch.nn.Module, onnx_model an onnx.ModelProto (Any: imported where used)
def torch_to_onnx(
    module: Any, args: tuple, out: str, inputs: list[str], outputs: list[str], settings: dict
) -> None:
    """torch.onnx.export of `module` on `args` into one self-contained ONNX file at `out`, with the
    spec's exporter and opset. For model code (models/*.py export()). Exported in a scratch folder
    and re-saved inline, so no side-car .data file ever reaches `out`'s folder."""

    import onnx
    import torch
    exporter, opset = settings.get("exporter", "dynamo"), int(settings.get("opset", 18))
    if exporter not in ("dynamo", "legacy"):
        raise ValueError(f"unknown exporter {exporter!r} (expected 'dynamo' or 'legacy')")
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        path = os.path.join(tmp, "model.onnx")
        torch.onnx.export(
            module,
            args,
            path,
            input_names=inputs,
            output_names=outputs,
            opset_version=opset,
            dynamo=exporter == "dynamo",
            external_data=False,
            verbose=False,
        )
        proto = onnx.load(path)
    onnx.save(proto, out)


def _external_task(model: Model, graph: Graph, out: str, record: str, log: str) -> dict:
    """The ONNX from a declared command (its argv and the files it reads are the dependencies) or
    a given file."""
    kind, *rest = graph.source or ("",)
    action: Callable[..., None]
    if kind == "onnx":
        path, sha, origin = rest
        kwargs = {
            "src": path,
            "sha": sha,
            "out": out,
            "record": record,
            "io": io_record(graph),
            "origin": origin,
        }
        deps, what, action = [path], f"given ONNX {origin}, shapes pinned to the spec's", given
        settings = {"onnx": sha, "io": io_record(graph)}
    elif kind == "archive":
        path, archive_sha, member, sha, origin = rest
        kwargs = {
            "archive": path,
            "archive_sha": archive_sha,
            "member": member,
            "sha": sha,
            "out": out,
            "record": record,
            "io": io_record(graph),
            "origin": origin,
        }
        deps, what, action = (
            [path],
            f"member of an archive {origin}, shapes pinned to the spec's",
            given_member,
        )
        settings = {"archive": archive_sha, "member": member, "onnx": sha, "io": io_record(graph)}
    else:
        argv, reads, cwd = rest
        tools = {"python": sys.version.split()[0], **dict(model.requires)}
        kwargs = {"argv": list(argv), "cwd": cwd, "out": out, "record": record, "tools": tools,
                  "io": io_record(graph)}
        deps, what, action = list(reads), "command", external
        settings = {
            "command": list(argv),
            "io": io_record(graph),
            **({"tools": tools} if model.requires else {}),
        }
    return {**named(model, graph),
            "doc": f"{model.name}/{graph.name}: ONNX from the declared {what}",
            "file_dep": deps, "targets": [out, record, log], "clean": True,
            "actions": [(run, (action, kwargs, log))], "uptodate": [config_changed(settings)]}


def export(
    module_file: str, checkpoint: str, graph: str, settings: dict, out: str, record: str, io: dict
) -> None:
    module = load_module(module_file)
    if not callable(getattr(module, "export", None)):
        raise StageFailed(
            f"{module_file}: no export(checkpoint, graph, out, settings) function, which the "
            f"export stage calls (the model-code contract: docs/add-a-model.md)"
        )
    started = time.monotonic()
    with atomic_path(out) as tmp:
        try:
            # an export(..., io) gets the graph's declared interface (a window's cut
            # shapes: spec/windows.py)
            modeldata.with_io(module.export, io)(checkpoint, graph, str(tmp), settings)
        # the model code refusing its settings or checkpoint: one line, no frames
        except ValueError as err:
            raise StageFailed(f"{module_file}: export of graph '{graph}': {err}") from None
        except Exception as err:   # e.g. torch.load of a file that is not what the code expects
            raise code_failed(module_file, f"export of graph '{graph}'", checkpoint, err) from err
        if not os.path.getsize(tmp):
            raise StageFailed(f"{module_file}: export() of graph '{graph}' wrote nothing to `out`")
        onnx_or_fail(tmp, f"{module_file}: export() of graph '{graph}' wrote")
    write_json(record, {"seconds": round(time.monotonic() - started, 2), "settings": settings,
                        "tool": tool_version(), "commit": repo_commit()})


def external(
    argv: list, cwd: str, out: str, record: str, tools: dict | None = None, io: dict | None = None
) -> None:
    """Run an external exporter in the spec's folder; {out} is where it must write the ONNX,
    {python} this interpreter. Its dynamic input axes are pinned to the declared shapes as a given
    file's are. The record keeps the argv, the ONNX's sha256, what was pinned and the tools (Python,
    the spec's `requires`)."""
    started = time.monotonic()
    with atomic_path(out) as tmp:
        resolved = [
            a.replace("{out}", str(tmp.resolve())).replace("{python}", sys.executable) for a in argv
        ]
        print("$", " ".join(resolved), flush=True)
        try:
            rc = subprocess.call(resolved, cwd=cwd)
        except OSError as err:  # not installed, not executable
            raise StageFailed(
                f"export command {argv[0]!r} cannot start ({err.strerror}): {' '.join(argv)} "
                f"(cwd {cwd})"
            ) from None
        if rc != 0:
            raise StageFailed(f"export command exited with {rc}: {' '.join(argv)} (cwd {cwd})")
        if not os.path.getsize(tmp):
            raise StageFailed(f"export command wrote nothing to {{out}}: {' '.join(argv)}")
        onnx_or_fail(tmp, f"export command {' '.join(argv)} wrote")
        pinned = (
            _pinned(str(tmp), io, f"the ONNX of the export command {' '.join(argv)}") if io else {}
        )
    write_json(
        record,
        {
            "seconds": round(time.monotonic() - started, 2),
            "settings": {"command": argv, "cwd": cwd},
            "tool": tools or {},
            "onnx_sha256": sha256(out),
            "pinned": pinned,
            "commit": repo_commit(),
        },
    )


def _pinned(path: str, io: dict, where: str) -> dict:
    """A made ONNX refused for foreign ops or pinned to the declared shapes in place, like
    a given one."""
    import onnx
    model = onnx.load(path)
    refuse_foreign_ops(model, where)
    pinned = pin_shapes(model, io, where)
    if pinned:
        onnx.save(model, path)
    return pinned


# Integer ops of ONNX's own domain that only a dynamically quantised model holds (the HTP takes
# QDQ, not these)
DYNAMIC_INT8 = {"DynamicQuantizeLinear", "MatMulInteger", "ConvInteger"}


def refuse_foreign_ops(onnx_model: Any, where: str) -> None:
    """One line for a graph the HTP cannot take by construction, before any shape message: ops
    outside the ONNX domain (onnxruntime's contrib ops, custom ops; they have no ONNX shape
    inference either) or the integer ops of dynamic int8 quantisation, named with their domain and
    what to bring instead."""
    found = collections.Counter((n.domain or "ai.onnx", n.op_type) for n in onnx_model.graph.node
                                if n.domain not in ("", "ai.onnx") or n.op_type in DYNAMIC_INT8)
    # onnx UINT8, INT8
    int8 = [i.name for i in onnx_model.graph.initializer if i.data_type in (2, 3)]
    if not found and len(int8) > 1:  # one small table can be a lookup; many are quantised weights
        raise StageFailed(
            f"{where}: {len(int8)} initializers are int8/uint8 ({', '.join(int8[:3])}, ...): the "
            "ONNX "
            "is quantised, and the HTP quantises in QNN, not in the ONNX: bring the float model "
            "it was "
            'quantised from and declare precision = "w8a16" in the graph\'s table '
            '(docs/precision.md)'
        )
    if not found:
        return
    listed = ", ".join(f"{domain} {op} x{count}" for (domain, op), count in sorted(found.items()))
    quantised = any("Quantize" in op or "Integer" in op for _, op in found)
    instead = (
        "it is a dynamically quantised int8 model (onnxruntime's CPU-only int8 kernels); the HTP "
        "has none "
        "of these ops: bring the float model it was quantised from and let QNN quantise it "
        '(precision = "w8a16" in the graph\'s table, with calibration data: docs/precision.md)'
        if quantised
        else "the HTP has none of these ops (no ONNX shape inference either): bring the model in "
             "standard ONNX "
        "ops (the float export before any onnxruntime optimisation or custom op)"
    )
    raise StageFailed(
        f"{where}: the graph holds ops outside the ONNX standard set: {listed}; {instead}"
    )


def given(src: str, sha: str, out: str, record: str, io: dict, origin: str = "") -> None:
    """Take an existing ONNX file, refusing other bytes than the pinned ones; its dynamic input
    axes are fixed to the spec's declared shapes and every shape inferred again, so the result
    is fully static."""
    import onnx
    actual = sha256(src)
    if actual != sha:
        raise StageFailed(f"{src}: sha256 {actual}, the spec pins {sha}")
    onnx_or_fail(src, f"{src} is")
    model = onnx.load(src)
    refuse_foreign_ops(model, f"{origin or src} (a given ONNX)")
    pinned = pin_shapes(model, io, origin or src)
    with atomic_path(out) as tmp:
        if pinned:
            onnx.save(model, str(tmp))
        else:
            shutil.copyfile(src, tmp)
    write_json(
        record,
        {
            "seconds": 0,
            "settings": {"onnx": origin or src, "sha256": sha},
            "pinned": pinned,
            "onnx_sha256": sha256(out),
            "tool": {"onnx": versions.version("onnx")},
            "commit": repo_commit(),
        },
    )


def given_member(
    archive: str,
    archive_sha: str,
    member: str,
    sha: str,
    out: str,
    record: str,
    io: dict,
    origin: str,
) -> None:
    """A given ONNX that is a member of an archive (a package's .tar.gz or .zip): the
    archive's bytes checked, the member (a regular file) read out beside `out`, then taken as
    any given file."""
    actual = sha256(archive)
    if actual != archive_sha:
        raise StageFailed(
            f"{archive}: sha256 {actual}, the spec pins archive_sha256 = {archive_sha}"
        )
    extracted = f"{out}.member"
    with atomic_path(extracted) as tmp:
        with open(tmp, "wb") as f:
            f.write(read_member(archive, member))
    try:
        given(extracted, sha, out, record, io, origin)
    finally:
        os.remove(extracted)


def read_member(archive: str, member: str) -> bytes:
    """The bytes of one regular file inside a tar or zip archive; one line naming the archive when
    it is not there."""
    import tarfile
    import zipfile
    try:
        if archive.endswith(".zip"):
            with zipfile.ZipFile(archive) as z:
                return z.read(member)
        with tarfile.open(archive) as tar:
            info = tar.getmember(member)
            handle = tar.extractfile(info) if info.isfile() else None
            if handle is None:
                raise StageFailed(
                    f"{archive}: member {member} is not a regular file (a link or a folder)"
                )
            return handle.read()
    except KeyError:
        raise StageFailed(f"{archive}: no member {member}") from None
    except (tarfile.TarError, zipfile.BadZipFile, OSError) as err:
        raise StageFailed(f"{archive}: not a readable archive ({err})") from None


def pin_shapes(onnx_model: Any, io: dict, where: str) -> dict:
    """Set every dynamic input axis to the declared size (in place), infer all shapes again and
    check that every output is static and as declared; {input: {axis: "N -> 1"}} of what was fixed.
    A declared size that contradicts a fixed one, or an output axis no input decides, is one line
    naming the axis."""
    import onnx
    graph = onnx_model.graph
    initializers = {t.name for t in graph.initializer}
    inputs = {i.name: i for i in graph.input if i.name not in initializers}
    declared = {name: shape for name, shape, _ in io["inputs"]}
    if set(inputs) != set(declared):
        raise StageFailed(f"{where}: inputs {sorted(inputs)}, the spec declares {sorted(declared)}")
    fixed: dict[str, dict[str, str]] = {}
    for name, shape in declared.items():
        dims = inputs[name].type.tensor_type.shape.dim
        if len(dims) != len(shape):
            raise StageFailed(
                f"{where}: input {name} has {len(dims)} axes, the spec declares {shape}: a given "
                "ONNX "
                f"keeps its rank, so declare inputs.{name} with {len(dims)} axes"
            )
        for axis, (dim, size) in enumerate(zip(dims, shape)):
            if dim.HasField("dim_value") and dim.dim_value > 0:
                if dim.dim_value != size:
                    fits = [dim.dim_value if i == axis else d for i, d in enumerate(shape)]
                    raise StageFailed(
                        f"{where}: input {name} axis {axis} is fixed at {dim.dim_value} in the "
                        "model, "
                        f"the spec declares {size}: a given ONNX keeps its fixed sizes, so declare "
                        f"inputs.{name} shape = {fits}"
                    )
                continue
            fixed.setdefault(name, {})[str(axis)] = f"{dim.dim_param or '?'} -> {size}"
            dim.Clear()
            dim.dim_value = size
    if not fixed:
        return {}
    del graph.value_info[:]  # inferred for the dynamic shapes: inferred again below
    names = {
        (o.name, axis): d.dim_param
        for o in graph.output
        for axis, d in enumerate(o.type.tensor_type.shape.dim)
    }
    for output in graph.output:
        for dim in output.type.tensor_type.shape.dim:
            if not dim.HasField("dim_value") or dim.dim_value <= 0:
                dim.Clear()
    try:
        inferred = onnx.shape_inference.infer_shapes(onnx_model, strict_mode=True, data_prop=True)
    except Exception as err:   # onnx's InferenceError: a node that cannot take the pinned shapes
        raise StageFailed(f"{where}: shapes pinned to the spec's {declared} do not fit the model: "
                          f"{str(err).strip().splitlines()[0][:300]}") from None
    if any(not _static(o) for o in inferred.graph.output):
        inferred = _folded(inferred)
    wanted = {name: shape for name, shape, _ in io["outputs"]}
    for output in inferred.graph.output:
        dims = output.type.tensor_type.shape.dim
        for axis, dim in enumerate(dims):
            if not dim.HasField("dim_value") or dim.dim_value <= 0:
                raise StageFailed(
                    f"{where}: output {output.name} axis {axis} "
                    f"({names.get((output.name, axis)) or '?'}) stays "
                    f"dynamic with the inputs pinned{_first_unknown(inferred)}: it depends on "
                    "data, not "
                    "on input shapes, so no static shape can be declared for it (cut the graph "
                    "before "
                    f"the op that makes it)"
                )
        got = [d.dim_value for d in dims]
        if output.name in wanted and got != list(wanted[output.name]):
            raise StageFailed(
                f"{where}: output {output.name} is {got} with the inputs pinned, the spec declares "
                f"{wanted[output.name]}: an output's shape follows from the inputs, so declare "
                f"outputs.{output.name} shape = {got}"
            )
    onnx_model.graph.CopyFrom(inferred.graph)
    return fixed


def _static(info: Any) -> bool:
    dims = info.type.tensor_type.shape.dim
    return info.type.tensor_type.HasField("shape") and all(
        d.HasField("dim_value") and d.dim_value > 0 for d in dims
    )


def _folded(onnx_model):
    """The model with its shape arithmetic computed (onnxsim: Shape -> Slice -> Concat -> Reshape
    chains, which onnx's own inference leaves symbolic in paddle2onnx and tf2onnx graphs), or as it
    was when that fails."""
    from onnxsim import simplify
    try:
        folded, ok = simplify(onnx_model)
    except Exception:   # noqa: BLE001 - the message below names what stays dynamic either way
        return onnx_model
    if ok:
        print(
            "shapes: onnx's inference left outputs dynamic; onnxsim computed the graph's shape "
            "arithmetic"
        )
    return folded if ok else onnx_model


def _first_unknown(onnx_model: Any) -> str:
    """' (from node N, op: its inputs are static, an output is not)' for the first such
    node, or ''."""
    known = {i.name for i in onnx_model.graph.input if _static(i)} | {
        i.name for i in onnx_model.graph.initializer
    }
    known |= {v.name for v in onnx_model.graph.value_info if _static(v)}
    for node in onnx_model.graph.node:
        if all(not t or t in known for t in node.input) and not all(
            t in known for t in node.output if t
        ):
            domain = f"{node.domain} " if node.domain else ""
            return (f" (from node {node.name or '?'}, {domain}{node.op_type}: its inputs are "
                    "static, its output is not)")
    return ""


def code_failed(module_file: str, what: str, checkpoint: str | None, err: Exception) -> StageFailed:
    """One line for model code that raised while reading a checkpoint: the checkpoint it was given,
    the error, and the model code's own line (the full traceback stays in the step's log)."""
    import traceback
    traceback.print_exception(err)
    frames = [f for f in traceback.extract_tb(err.__traceback__)
              if os.path.abspath(f.filename) == os.path.abspath(module_file)]
    where = f" at {module_file}:{frames[-1].lineno}" if frames else ""
    given = f" given the checkpoint {checkpoint}" if checkpoint and not missing_package(err) else ""
    question = "; is that file the checkpoint this code reads (format, contents)?" if given else ""
    return StageFailed(
        f"{module_file}: {what}{given} failed{where}: {type(err).__name__}: {str(err)[:300]}"
        + (missing_package(err) or question)
    )


def onnx_or_fail(path: str | os.PathLike[str], what: str) -> None:
    """Refuse a file that is not an ONNX model, in one line (not onnxsim's traceback
    two stages later)."""
    import onnx
    try:
        onnx.load(str(path), load_external_data=False)
    except Exception as err:  # protobuf's DecodeError, or anything onnx trips on
        raise StageFailed(
            f"{what} not an ONNX model ({type(err).__name__}: {str(err)[:200]})"
        ) from None


def repo_commit() -> str:
    """This repository's commit (with '-dirty' for uncommitted changes): the export's provenance."""
    def git(*args):
        return subprocess.run(["git", *args], capture_output=True, text=True).stdout.strip()
    commit = git("rev-parse", "HEAD") or "unknown"
    return commit + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")
