"""Real calibration inputs for a w8a16 graph, once per graph (chip-independent).

The model's own samples go through the float ONNX graphs on the CPU (so a decoder is calibrated on
the inputs the encoder really produces); each sample becomes one headerless raw file per graph
input, in the tensor's native dtype, and one line of input_list.txt listing them in graph-input
order (the qnn-onnx-converter --input_list --use_native_input_files format). The layout is the one
the model's toolchain reads: ONNX for the embedded one, QNN's native layout for the converter (3-D
last two axes swapped, 4-D NHWC; qairt.native_permutation). calibration.json records each input's
axes order, so read() gives ONNX-layout feeds back from either. The samples the default
verification tier checks ([verify] clips) are held out, so that check always runs on data the
quantizer never saw."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from doit.tools import config_changed

from toolchain import artifacts
from toolchain.engine.files import atomic_dir, write_json
from toolchain.engine.run.worker import load_module, run
from toolchain.errors import StageFailed
from toolchain.qnn.layout import native_permutation
from toolchain.shared import modeldata
from toolchain.shared.iorecord import io_record
from toolchain.stages import Project, named

# numpy is imported where used: doit's own process loads this module on every run
# (tests/test_engine_worker.py)
if TYPE_CHECKING:
    import numpy as np



def tasks(project: Project) -> Iterator[dict]:
    for model in project.models:
        onnx_files = {g.name: artifacts.simplified(model, g) for g in model.graphs}
        # the model code finds a [windows] copy's window in it
        io = {g.name: io_record(g) for g in model.graphs}
        for graph in model.graphs:
            if not graph.precision.quantized:
                continue
            folder, log = (
                artifacts.calibration(model, graph),
                artifacts.calibration_log(model, graph),
            )
            inputs = io[graph.name]["inputs"]
            raws = [
                artifacts.calibration_raw(model, graph, i, t[0])
                for i in range(graph.calibration)
                for t in inputs
            ]
            layout = project.compiler(model).calibration_layout
            kwargs = {
                "module_file": model.module_file,
                "onnx_files": onnx_files,
                "data_dir": model.data_dir,
                "graph": graph.name,
                "inputs": inputs,
                "count": graph.calibration,
                "folder": folder,
                "layout": layout,
                "held_out": list(model.verify.clips),
                "field": f"{model.spec_file}: graphs.{graph.name}.calibration",
                "io": io,
            }
            yield {
                **named(model, graph),
                "doc": f"{model.name}/{graph.name}: {graph.calibration} real calibration inputs "
                       "(raw + input list)",
                "file_dep": [*model.code_files, *onnx_files.values(), *project.data_files(model)],
                "targets": [
                    artifacts.calibration_list(model, graph),
                    artifacts.calibration_record(model, graph),
                    *raws,
                    log,
                ],
                "clean": True,
                "actions": [(run, (write, kwargs, log))],
                "uptodate": [
                    config_changed(
                        {k: kwargs[k] for k in ("count", "inputs", "layout", "held_out")}
                    )
                ],
            }


def permutation(layout: str, shape: list) -> list[int]:
    return list(native_permutation(len(shape)) if layout == "qnn" else range(len(shape)))


def write(
    module_file: str,
    onnx_files: dict,
    data_dir: str | None,
    graph: str,
    inputs: list,
    count: int,
    folder: str,
    layout: str = "onnx",
    held_out: list | tuple = (),
    field: str = "",
    io: dict | None = None,
) -> None:
    import numpy as np
    module = load_module(module_file)
    cpu = {g: modeldata.cpu(p) for g, p in onnx_files.items()}
    every = modeldata.samples(module, data_dir)
    samples = [s for s in every if s[0] not in held_out]
    if every and not samples:
        raise StageFailed(f"{data_dir}: every sample is a held-out verify clip ({list(held_out)}); "
                          f"calibration needs samples the default verification tier does not check")
    samples = samples or [None]
    # graph_feeds() and calibration_feeds() get every graph's interface when they ask for `io`
    # (modeldata.with_io); generated inputs stay per graph, so their seeded values are the ones this
    # graph always had
    if hasattr(module, "calibration_feeds"):   # decided once, not per sample
        feeds_of = modeldata.with_io(module.calibration_feeds, io or {})
    else:
        wanted = io if io and hasattr(module, "graph_feeds") else {graph: {"inputs": inputs}}
        # the model's graph_feeds(), or seeded generated inputs
        def feeds_of(run, sample):
            return modeldata.feeds(module, run, sample, wanted, count)
    feeds, used = [], []
    for sample in samples:
        got = feeds_of(lambda g, f: cpu[g](f), sample).get(graph)
        # e.g. a [windows] copy (encoder_5s) from code that knows only the declared graphs
        if got is None:
            raise StageFailed(
                f"{module_file}: calibration_feeds() returned no inputs for graph '{graph}'"
                + (f" ({field})" if field else "")
                + ": return them for every w8a16 graph; a "
                "[windows] copy's shapes come in `io` when the function takes it "
                "(calibration_feeds(run, sample, io))"
            )
        feeds += got
        used += [sample[0] if sample else "generated"] * len(got)
        if len(feeds) >= count:
            break
    if len(feeds) < count:
        raise StageFailed(
            f"{field or data_dir}: {count} asked, but the samples of {data_dir} give "
            f"{len(feeds)} calibration inputs for graph '{graph}' (without the held-out verify "
            "clips "
            f"{list(held_out)}): lower it to {len(feeds)} or add data"
        )
    with atomic_dir(folder) as tmp:
        for old in Path(folder).glob("*.raw"):   # a smaller count must not leave stale samples
            old.unlink()
        lines = []
        for i, sample in enumerate(feeds[:count]):
            files = []
            for name, shape, dtype in inputs:
                array = np.ascontiguousarray(sample[name], dtype=dtype)
                if list(array.shape) != shape:
                    raise StageFailed(
                        f"calibration input '{name}' has shape {list(array.shape)}, graph takes "
                        f"{shape}"
                    )
                array.transpose(permutation(layout, shape)).tofile(
                    tmp / artifacts.calibration_raw_name(i, name)
                )
                files.append(artifacts.calibration_raw_name(i, name))
            lines.append(" ".join(files))
        (tmp / "input_list.txt").write_text("\n".join(lines) + "\n")
    write_json(
        f"{folder}/calibration.json",
        {
            "count": count,
            "samples": used[:count],
            "held_out": list(held_out),
            "inputs": inputs,
            "layout": layout,
            "axes": {name: permutation(layout, shape) for name, shape, _ in inputs},
        },
    )


def read(folder: str, inputs: list) -> list[dict[str, np.ndarray]]:
    """The calibration set back as ONNX-layout feeds, from input_list.txt and the recorded axes."""
    import json

    import numpy as np
    record = Path(folder, "calibration.json")
    # none: ONNX layout
    axes = json.loads(record.read_text()).get("axes", {}) if record.exists() else {}
    feeds = []
    for line in Path(folder, "input_list.txt").read_text().splitlines():
        feed = {}
        for f, (name, shape, dtype) in zip(line.split(), inputs):
            perm = axes.get(name, list(range(len(shape))))
            stored = np.fromfile(Path(folder, f), dtype=dtype).reshape([shape[i] for i in perm])
            feed[name] = stored.transpose(np.argsort(perm))
        feeds.append(feed)
    return feeds
