"""A graph's declared interface as plain JSON: what a task's settings, a record, a bundle and the
phone compare against the ONNX, the compiled binary and the runtime's view."""
from __future__ import annotations


def io_record(graph) -> dict:
    """The declared graph interface, as plain JSON."""
    def tensors(ts):
        return [[t.name, list(t.shape), t.dtype] for t in ts]
    return {"inputs": tensors(graph.inputs), "outputs": tensors(graph.outputs)}
