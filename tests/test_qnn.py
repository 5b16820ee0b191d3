"""The QNN wing (toolchain/qnn): qnnrun drives a context binary through the raw QNN API
(sherpa-onnx's sequence) in the x86 HTP simulator, against onnxruntime CPU and the EP's own
simulator run of the same binary; qnnbin reads the HTP config string from a binary's header."""
import ctypes
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from toolchain.compilers.ort_qnn import ep as ort_qnn
from toolchain.qnn import qnnbin
from toolchain.qnn.qnnbin import Tensor
from toolchain.qnn.qnnrun import QnnModel
from toolchain.shared import modeldata
from toolchain.spec import chips

OPTIONS = ort_qnn.provider_options(chips.load()["SM8750"].record(), 3)
# the chip compiles float graphs with relaxed (fp16) precision
FP16 = {"rtol": 1e-2, "atol": 2e-2}


def _save(graph, path, opset=17, ir=8):
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", opset)])
    model.ir_version = ir
    onnx.checker.check_model(model)
    onnx.save(model, path)


@pytest.fixture(scope="module")
def net(tmp_path_factory):
    """float32 x[1,4,8] and int32 ids[1,4] -> y[1,4,6] = x@w + emb[ids], z[1,4] = sum(y,
    -1) + ids."""
    d = tmp_path_factory.mktemp("qnnrun")
    rng = np.random.default_rng(0)
    init = [nh.from_array(rng.standard_normal((8, 6)).astype(np.float32), "w"),
            nh.from_array(rng.standard_normal((10, 6)).astype(np.float32), "emb"),
            nh.from_array(np.array([2], np.int64), "axes")]
    nodes = [h.make_node("MatMul", ["x", "w"], ["m"]),
             h.make_node("Gather", ["emb", "ids"], ["e"], axis=0),
             h.make_node("Add", ["m", "e"], ["y"]),
             h.make_node("Cast", ["ids"], ["idf"], to=T.FLOAT),
             h.make_node("ReduceSum", ["y", "axes"], ["s"], keepdims=0),
             h.make_node("Add", ["s", "idf"], ["z"])]
    graph = h.make_graph(nodes, "net",
                         [h.make_tensor_value_info("x", T.FLOAT, [1, 4, 8]),
                          h.make_tensor_value_info("ids", T.INT32, [1, 4])],
                         [h.make_tensor_value_info("y", T.FLOAT, [1, 4, 6]),
                          h.make_tensor_value_info("z", T.FLOAT, [1, 4])], init)
    src = str(d / "net.onnx")
    _save(graph, src)
    out = ort_qnn.compile(src, str(d / "net_ctx.onnx"), OPTIONS)
    return {
        "onnx": src,
        "ctx": str(d / "net_ctx.onnx"),
        "bin": out["binary"],
        "cpu": modeldata.cpu(src),
    }


def _feeds(seed):
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((1, 4, 8)).astype(np.float32),
            "ids": rng.integers(0, 10, (1, 4)).astype(np.int32)}


def _run(model, feeds):
    for name, value in feeds.items():
        model.set_input(name, value)
    model.run()
    return {name: model.output(name) for name in model.output_names}


def test_io_as_the_binary_reports(net):
    with QnnModel(net["bin"]) as m:
        assert m.input_names == ["x", "ids"] and m.output_names == ["y", "z"]
        assert [m.shape(n) for n in ("x", "ids", "y", "z")] == [
            [1, 4, 8],
            [1, 4],
            [1, 4, 6],
            [1, 4],
        ]
        assert [m.dtype(n) for n in ("x", "ids", "y", "z")] == [
            "float32",
            "int32",
            "float32",
            "float32",
        ]
        assert m.has_tensor("ids") and not m.has_tensor("m")
        # one buffer for all I/O, sized as sherpa's AllocateBuffer: the sum of the tensors' bytes
        g = qnnbin.binary_info(net["bin"])["graphs"][0]
        assert (
            m.buffer_bytes
            == sum(4 * int(np.prod(t["shape"])) for t in g["inputs"] + g["outputs"])
            == 256
        )


def test_matches_cpu_and_the_ep_simulator(net):
    feeds = _feeds(1)
    ref = net["cpu"](feeds)
    sim = ort_qnn.simulator(net["ctx"], OPTIONS)(feeds)
    with QnnModel(net["bin"]) as m:
        got = _run(m, feeds)
    for name in ("y", "z"):
        assert got[name].dtype == np.float32 and got[name].shape == ref[name].shape
        np.testing.assert_allclose(got[name], ref[name], **FP16)
        # same binary, same simulator
        np.testing.assert_allclose(got[name], sim[name], rtol=0, atol=1e-6)


def test_second_run_reads_the_new_inputs(net):
    a, b = _feeds(2), _feeds(3)
    with QnnModel(net["bin"]) as m:
        first = _run(m, a)
        second = _run(m, b)
        again = _run(m, a)
    for name in ("y", "z"):
        assert not np.allclose(first[name], second[name])
        np.testing.assert_allclose(second[name], net["cpu"](b)[name], **FP16)
        # outputs are copies, runs repeatable
        np.testing.assert_array_equal(again[name], first[name])


def test_wrong_element_count_names_the_tensor(net):
    with QnnModel(net["bin"]) as m:
        with pytest.raises(ValueError, match="'x' expects 32 elements"):
            m.set_input("x", np.zeros((1, 4, 7), np.float32))
        with pytest.raises(ValueError, match="'ids' expects 4 elements"):
            m.set_input("ids", [1, 2, 3])
        with pytest.raises(ValueError, match="'y' is an output"):
            m.set_input("y", np.zeros(24, np.float32))
        with pytest.raises(KeyError, match="no tensor 'nope'"):
            m.set_input("nope", [0])
        # any layout of the right count, converted
        m.set_input("x", np.arange(32, dtype=np.float64))
        m.set_input("ids", np.array([[0, 1, 2, 3]], np.int64))
        m.run()


def test_not_a_binary(tmp_path):
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"not a context binary" * 64)
    with pytest.raises(ValueError, match="not a QNN context binary"):
        QnnModel(str(junk))


def test_explicit_libraries_close_and_qnn_errors(net):
    lib = qnnbin._qnn_dir()
    m = QnnModel(net["bin"], backend_lib=f"{lib}/libQnnHtp.so", system_lib=f"{lib}/libQnnSystem.so")
    # graphExecute's own error path: hand it one input instead of two
    full = m._in
    m._in = (Tensor * 1)(full[0])
    with pytest.raises(RuntimeError, match=r"graphExecute failed: QNN error 6\d\d\d"):
        m.run()
    m._in = full
    np.testing.assert_allclose(_run(m, _feeds(4))["z"], net["cpu"](_feeds(4))["z"], **FP16)
    m.close()
    m.close()
    with pytest.raises(RuntimeError, match="closed"):
        m.run()


def test_ufixed16_io_is_quantized_and_dequantized(tmp_path):
    """uint16 Q/DQ at the graph edges compiles to ufixed16 I/O with scale/offset (value = (q +
    offset) * scale)."""
    init = [
        nh.from_array(np.array(0.01, np.float32), "s_in"),
        nh.from_array(np.array(30000, np.uint16), "z_in"),
        nh.from_array(np.array(0.02, np.float32), "s_out"),
        nh.from_array(np.array(1000, np.uint16), "z_out"),
    ]
    nodes = [
        h.make_node("DequantizeLinear", ["xq", "s_in", "z_in"], ["x"]),
        h.make_node("Relu", ["x"], ["r"]),
        h.make_node("QuantizeLinear", ["r", "s_out", "z_out"], ["yq"]),
    ]
    graph = h.make_graph(nodes, "q", [h.make_tensor_value_info("xq", T.UINT16, [1, 2, 8])],
                         [h.make_tensor_value_info("yq", T.UINT16, [1, 2, 8])], init)
    src = str(tmp_path / "q.onnx")
    _save(graph, src, opset=21, ir=10)
    binary = ort_qnn.compile(src, str(tmp_path / "q_ctx.onnx"), OPTIONS)["binary"]
    x = np.linspace(-3, 3, 16, dtype=np.float32).reshape(1, 2, 8)
    with QnnModel(binary) as m:
        assert m.dtype("xq") == m.dtype("yq") == "ufixed16"
        m.set_input("xq", x)                                  # real values in
        assert m._inputs[0].view[0, 0, 0] == 30000 - 300      # x / scale - offset, offset = -30000
        m.run()
        y = m.output("yq")
    xq = np.clip(np.rint(x / 0.01 + 30000), 0, 65535).astype(np.uint16)
    yq = modeldata.cpu(src)({"xq": xq})["yq"]
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, (yq.astype(np.float64) - 1000) * 0.02, atol=1e-5)
    np.testing.assert_allclose(y, np.maximum(x, 0), atol=0.011)   # within half a step of 0.02


def test_struct_layout_matches_the_headers():
    """Qnn_Tensor_t is 8 + Qnn_TensorV2_t (136 bytes, LP64); clientBuf sits at +96 in
    the V1/V2 body."""
    assert ctypes.sizeof(Tensor) == 144
    from toolchain.qnn.qnnbin import _TensorV2

    assert (
        _TensorV2.buf.offset == 96
        and _TensorV2.dims.offset == 80
        and _TensorV2.memType.offset == 88
    )


def test_the_config_string_is_read_from_the_header_and_found_anywhere(tmp_path):
    config = b"\x00soc_type=69;arch=79;vtcm_size=8388608;relaxed_precision_flag=true;\x00"
    head = tmp_path / "head.bin"
    head.write_bytes(b"\x01" * 30000 + config + os.urandom(3 << 20))
    # (random bytes after it may look like more key=value; pairs)
    found = qnnbin.config_fields(str(head))
    assert {k: found[k] for k in ("soc_type", "arch", "vtcm_size", "relaxed_precision_flag")} == {
        "soc_type": 69, "arch": 79, "vtcm_size": 8388608, "relaxed_precision_flag": True}
    late = tmp_path / "late.bin"   # not in the header: the whole file is searched, as before
    late.write_bytes(b"\x01" * (qnnbin.HEAD + 10) + config)
    assert qnnbin.config_fields(str(late))["arch"] == 79
    (tmp_path / "none.bin").write_bytes(b"\x01" * 100)
    with pytest.raises(ValueError, match="no HTP config string"):
        qnnbin.config_fields(str(tmp_path / "none.bin"))
