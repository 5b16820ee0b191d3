"""What a rewrite rule reads and edits of an ONNX graph: constants, static shapes,
consumers, fresh names, and the replacement of one node by several at its place (so the node
order stays topological)."""
from __future__ import annotations

# numpy and onnx are imported where used: the build's task list loads this module without them (a
# cheap no-op `doit`; tests/test_engine_worker.py)


class GraphView:
    def __init__(self, onnx_model):
        import onnx
        onnx_model.CopyFrom(onnx.shape_inference.infer_shapes(onnx_model))
        self.model = onnx_model
        self._names = {
            n for node in self.graph.node for n in (*node.input, *node.output, node.name)
        }
        self._names |= {i.name for i in self.graph.initializer}

    @property
    def graph(self):
        return self.model.graph

    def label(self, node) -> str:
        """How a record names a node: its name, or op type and position for an unnamed one."""
        return node.name or f"{node.op_type}#{list(self.graph.node).index(node)}"

    def constant(self, name: str):
        """The value of an initializer (or a Constant node's output) as numpy; None for
        a computed tensor."""
        from onnx import numpy_helper
        for init in self.graph.initializer:
            if init.name == name:
                return numpy_helper.to_array(init)
        for node in self.graph.node:
            if node.op_type == "Constant" and node.output[0] == name:
                return numpy_helper.to_array(next(a.t for a in node.attribute if a.name == "value"))
        return None

    def shape(self, name: str) -> tuple[int, ...] | None:
        """A tensor's static shape, None when shape inference left any dim unknown."""
        for info in (*self.graph.input, *self.graph.value_info, *self.graph.output):
            if info.name == name and info.type.tensor_type.HasField("shape"):
                dims = [
                    d.dim_value if d.HasField("dim_value") else None
                    for d in info.type.tensor_type.shape.dim
                ]
                return tuple(dims) if all(d is not None for d in dims) else None
        value = self.constant(name)
        return tuple(value.shape) if value is not None else None

    def dtype(self, name: str) -> int | None:
        """A tensor's onnx element type (TensorProto enum), None when unknown."""
        for info in (*self.graph.input, *self.graph.value_info, *self.graph.output):
            if info.name == name:
                return info.type.tensor_type.elem_type or None
        return next((i.data_type for i in self.graph.initializer if i.name == name), None)

    def consumers(self, name: str) -> list:
        return [n for n in self.graph.node if name in n.input]

    def is_output(self, name: str) -> bool:
        return any(o.name == name for o in self.graph.output)

    def fresh(self, base: str) -> str:
        """A tensor or node name the graph does not use yet."""
        name, i = base, 0
        while name in self._names:
            i += 1
            name = f"{base}_{i}"
        self._names.add(name)
        return name

    def add_constant(self, base: str, value) -> str:
        import numpy as np
        from onnx import numpy_helper
        name = self.fresh(base)
        self.graph.initializer.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(self, op_type: str, inputs: list, outputs: list, base: str, **attrs):
        from onnx import helper
        return helper.make_node(op_type, inputs, outputs, name=self.fresh(base), **attrs)

    def replace(self, node, new_nodes: list) -> None:
        """Put `new_nodes` where `node` stands (a rewrite's nodes read only what
        exists before it)."""
        nodes = list(self.graph.node)
        at = nodes.index(node)
        del self.graph.node[:]
        self.graph.node.extend(nodes[:at] + new_nodes + nodes[at + 1:])

    def finish(self) -> None:
        """Drop initializers nothing reads any more and infer every shape again (the rewritten
        graph must check)."""
        import onnx
        read = _read(self.graph) | {o.name for o in self.graph.output}
        kept = [i for i in self.graph.initializer if i.name in read]
        del self.graph.initializer[:]
        self.graph.initializer.extend(kept)
        # shapes of replaced tensors may have changed: all inferred anew
        del self.graph.value_info[:]
        self.model.CopyFrom(onnx.shape_inference.infer_shapes(self.model, strict_mode=True))
        onnx.checker.check_model(self.model)


def _read(graph) -> set[str]:
    """Every tensor name the graph's nodes read, inside subgraphs too: an If or Loop body may read
    an initializer of the outer graph by name (openWakeWord's hey_jarvis model does), and dropping
    it breaks the model."""
    from onnx import AttributeProto
    read = set()
    for node in graph.node:
        read.update(node.input)
        for a in node.attribute:
            bodies = [a.g] if a.type == AttributeProto.GRAPH else list(a.graphs)
            for body in bodies:
                read |= _read(body)
    return read


def attribute(node, name: str, default=None):
    from onnx import helper
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default
