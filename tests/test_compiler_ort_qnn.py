"""The embedded toolchain (toolchain/compilers/ort_qnn). The design card's middle nodes (issue 20):
convert (QNN Saver recording of the EP's HTP lowering -> <graph>.c + .bin) -> modellib
(lib<graph>.so) -> compile (context binary per chip), the oracle (byte-identical to the EP's direct
compile) for fp16, w8a16 and per-graph options, and the card's incremental rules. Then a per-graph
EP option, an op that would fall back to the CPU (refused by convert), w8a16's tied embedding in 8
bits, and external weights."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile

import onnx
import pytest
from conftest import FIXTURES, LSTM, NET, ONE_CHIP, W8A16, Project, handmade, sha256
from onnx import TensorProto, helper, numpy_helper

from toolchain.compilers.ort_qnn import ep
from toolchain.errors import SpecError

CHIPS = ("SM8550", "SM8750")


def oracle(project: Project, model: str, graph: str, chips=CHIPS) -> list[dict]:
    """Run the oracle stage for each chip; the records it wrote."""
    rc, _, text = project.run("oracle")
    assert rc == 0, text
    return [
        json.loads((project.root / f"build/{model}/ort-qnn/{chip}/{graph}.oracle.json").read_text())
        for chip in chips
    ]


@pytest.fixture(scope="module")
def routed(tmp_path_factory) -> Project:
    p = Project(tmp_path_factory.mktemp("card") / "proj")
    p.add_tiny("tiny")
    rc, executed, text = p.run()
    assert rc == 0, text
    assert executed.index("convert:tiny/net") < executed.index("modellib:tiny/net") < \
        executed.index("compile:tiny/net@SM8550")
    return p


def test_the_six_nodes_are_files_and_the_recording_stays_a_build_output(routed):
    graph = routed.root / "build/tiny/ort-qnn/net"
    source = (graph / "net.c").read_text()
    # its banner is kept, and it lives under build/
    assert "Qualcomm Technologies" in source.splitlines()[2]
    # the recording opens its weights from the cwd ...
    assert 'fopen("params.bin"' in source
    record = json.loads((graph / "net.convert.json").read_text())
    assert record["graphs"] == 1 and record["nodes"] == sum(record["ops"].values()) > 0
    # the Saver writes each weight twice
    assert record["weights_file_bytes"] == 2 * record["weight_bytes"] > 0
    lib = graph / "model_libs/x86_64-linux/libnet.so"
    symbols = subprocess.run(
        ["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True
    ).stdout
    assert "qnc_compose" in symbols and "main" not in symbols.split()
    for chip in CHIPS:
        compiled = json.loads(
            (routed.root / f"build/tiny/ort-qnn/{chip}/net.compile.json").read_text()
        )
        assert (
            compiled["route"] == "saver"
            and compiled["info"]["graphs"][0]["name"] == record["qnn_graph"]
        )
        assert compiled["config"]["soc_type"] == chip
    manifest = json.loads((routed.root / "build/tiny/ort-qnn/SM8750/manifest.json").read_text())
    # what the model became, recorded
    assert manifest["qnn_graph"]["net"]["ops"] == record["ops"]
    assert "QNN graph" in (routed.root / "build/report.md").read_text()


def test_the_model_library_does_not_read_from_the_working_folder(routed, tmp_path):
    """... but the library takes the weights path it is given: run from an empty
    folder, same binary."""
    lib = routed.root / "build/tiny/ort-qnn/net/model_libs/x86_64-linux/libnet.so"
    weights = routed.root / "build/tiny/ort-qnn/net/net.bin"
    script = ("import sys, hashlib; from toolchain.compilers.ort_qnn import context, ep; "
              "from toolchain.spec import chips; c = chips.load()['SM8750'].record(); "
              f"r = context.compose({str(lib)!r}, {str(weights)!r}, c, "
              "context.graph_settings(ep.provider_options(c, 3))); "
              "print(hashlib.sha256(r.binary).hexdigest(), r.errors)")
    env = {**os.environ, "PYTHONPATH": str(FIXTURES.parents[1])}
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, env=env
    ).stdout
    assert out.splitlines()[-1].split()[0] == sha256(
        routed.root / "build/tiny/ort-qnn/SM8750/net_qnn.bin"
    ), out


def test_the_route_is_byte_identical_to_the_ep_on_two_chips(routed):
    for found in oracle(routed, "tiny", "net"):
        assert found["identical"] and found["wrapper_identical"], found


def test_finalization_settings_rerun_only_the_per_chip_step(routed):
    routed.edit("models/tiny.toml", "[parity]", "[compile]\noptimization = 2\n\n[parity]")
    rc, executed, text = routed.run()
    assert rc == 0, text
    assert "compile:tiny/net@SM8550" in executed and "compile:tiny/net@SM8750" in executed
    assert not any(t.startswith(("convert:", "modellib:", "export:")) for t in executed), executed
    for found in oracle(routed, "tiny", "net"):
        assert found["identical"], found
    # a new chip: only its own steps
    routed.edit("models/tiny.toml", '"SM8750"]', '"SM8750", "SM8650"]')
    rc, executed, text = routed.run()
    assert rc == 0, text
    assert "compile:tiny/net@SM8650" in executed and not any(
        "@SM8550" in t or "@SM8750" in t for t in executed
    )
    assert not any(t.startswith(("convert:", "modellib:")) for t in executed), executed


def test_the_same_recording_stops_the_rebuild_at_modellib(routed):
    """A graph option the Saver drops (fp16 off, put back per chip) reruns convert; its .c
    is the same bytes, so modellib does not run, and each chip's compile reruns for its
    own changed settings."""
    before = sha256(routed.root / "build/tiny/ort-qnn/net/net.c")
    routed.edit("models/tiny.toml", "[graphs.net]\n",
                "[graphs.net]\ncompile.ep_options = { enable_htp_fp16_precision = false }\n")
    rc, executed, text = routed.run("compile")
    assert rc == 0, text
    assert "convert:tiny/net" in executed and "modellib:tiny/net" not in executed, executed
    assert "compile:tiny/net@SM8750" in executed
    assert sha256(routed.root / "build/tiny/ort-qnn/net/net.c") == before
    for found in oracle(routed, "tiny", "net"):          # the option put back as the EP sets it
        assert found["identical"] and found["options"]["enable_htp_fp16_precision"] == "0", found


def test_w8a16_goes_through_the_route_byte_identical(tmp_path):
    p = Project(tmp_path / "proj")
    p.add_tiny("tiny", **W8A16)
    rc, executed, text = p.run("compile")
    assert rc == 0, text
    assert "quantize:tiny/net" in executed and executed.index("quantize:tiny/net") < executed.index(
        "convert:tiny/net"
    )
    ops = json.loads((p.root / "build/tiny/ort-qnn/net/net.convert.json").read_text())["ops"]
    # graph I/O stays float: the Q/DQ are inside the HTP graph
    assert "Quantize" in ops and "Dequantize" in ops
    for found in oracle(p, "tiny", "net", ("SM8350", "SM8750")):
        assert found["identical"], found


def _lstm(project: Project, extra: str = "") -> None:
    models = project.root / "models"
    shutil.copy(FIXTURES / "lstmnet.py", models)
    subprocess.run(
        [
            sys.executable,
            "-c",
            f"import sys; sys.path.insert(0, {str(models)!r}); import lstmnet; "
            f"lstmnet.make_checkpoint({str(models / 'lstm.pt')!r})",
        ],
        check=True,
    )
    (models / "lstm.toml").write_text(
        LSTM.format(sha=sha256(models / "lstm.pt")).replace(
            "[graphs.embedder]\n",
            f"[graphs.embedder]\ncompile.ep_options = {{ enable_htp_monolithic_lstm = true "
            f"}}\n{extra}",
        )
    )


def test_a_graph_option_that_changes_the_lowering_goes_through_the_route(project):
    _lstm(project)
    rc, executed, text = project.run("verify")
    assert rc == 0, text
    ops = json.loads(
        (project.root / "build/lstm/ort-qnn/embedder/embedder.convert.json").read_text()
    )["ops"]
    assert ops.get("Lstm") == 1          # one monolithic LSTM op in the recording
    found = oracle(project, "lstm", "embedder", ("SM8750",))[0]
    assert found["identical"], found  # and its graph config put back: the EP's own bytes
    errors = json.loads((project.root / "build/lstm/ort-qnn/SM8750/verify.json").read_text())[
        "tensors"
    ]["embedder"]
    assert errors["max_rel"] < 0.02
    project.edit(
        "models/lstm.toml",
        "enable_htp_monolithic_lstm = true",
        "enable_htp_monolithic_lstm = false",
    )
    rc, executed, text = project.run("compile")
    assert rc == 0, text
    assert {
        "convert:lstm/embedder",
        "modellib:lstm/embedder",
        "compile:lstm/embedder@SM8750",
    } <= set(executed)


def test_an_option_the_route_cannot_reproduce_is_refused_and_route_ep_compiles_it(project):
    project.add_tiny("tiny", **{'[graphs.net]\n': '[graphs.net]\n'
                                'compile.ep_options = { enable_htp_spill_fill_buffer = true }\n'})
    from toolchain import options
    from toolchain import project as loader

    with pytest.raises(
        SpecError,
        match=r"graphs\.net\.compile\.ep_options\.enable_htp_spill_fill_buffer: the QNN "
        r"Saver route cannot reproduce this option.*route = \"ep\"",
    ):
        loader.load(project.root / "models", options.resolve_given({}, {}))
    project.edit(
        "models/tiny.toml", "compile.ep_options", 'compile.route = "ep"\ncompile.ep_options'
    )
    rc, executed, text = project.run()
    assert rc == 0, text
    assert "compile:tiny/net@SM8750" in executed and not any(
        t.startswith(("convert:", "modellib:")) for t in executed
    )
    record = json.loads((project.root / "build/tiny/ort-qnn/SM8750/net.compile.json").read_text())
    assert record["route"] == "ep"
    project.edit("models/tiny.toml", 'compile.route = "ep"', 'compile.route = "direct"')
    with pytest.raises(
        SpecError, match=r"graphs\.net\.compile\.route: 'direct': expected one of 'saver', 'ep'"
    ):
        loader.load(project.root / "models", options.resolve_given({}, {}))


def test_no_c_compiler_is_one_line_at_load(project, monkeypatch):
    project.add_tiny("tiny")
    monkeypatch.setenv("CC", "no-such-cc")
    from toolchain import options
    from toolchain import project as loader
    with pytest.raises(SpecError, match=r"tiny\.toml: no C compiler found .*apt-get install gcc"):
        loader.load(project.root / "models", options.resolve_given({}, {}))


def test_a_differing_binary_is_named_by_the_oracle(routed):
    """Damage the route's binary after the fact: the oracle names the graph and chip in one line."""
    binary = routed.root / "build/tiny/ort-qnn/SM8750/net_qnn.bin"
    data = bytearray(binary.read_bytes())
    data[-1] ^= 0xFF
    binary.write_bytes(bytes(data))
    from toolchain.compilers.ort_qnn import oracle as stage
    from toolchain.errors import StageFailed
    ctx = routed.root / "build/tiny/ort-qnn/SM8750/net.onnx"
    options = json.loads((routed.root / "build/tiny/ort-qnn/SM8750/net.compile.json").read_text())[
        "options"
    ]
    try:
        with pytest.raises(
            StageFailed,
            match=r"tiny/net@SM8750: the route's binary differs from the EP's direct "
            r"compile \(md5 \w+ != \w+, which the EP reproduces\); "
            r"declare route = \"ep\"",
        ):
            stage.check(
                str(routed.root / "build/tiny/net/net.onnx"),
                str(ctx),
                str(binary),
                options,
                str(routed.root / "build/oracle-test.json"),
                "tiny/net@SM8750",
            )
    finally:
        data[-1] ^= 0xFF
        binary.write_bytes(bytes(data))


def test_bundles_never_carry_the_recording(routed):
    rc, _, text = routed.run("bundle")
    assert rc == 0, text
    for bundle in (routed.root / "build/tiny/ort-qnn").glob("*/bundle/*.tar.bz2"):
        with tarfile.open(bundle) as tar:
            names = tar.getnames()
        assert names and not any(n.endswith((".c", "params.bin", ".so")) for n in names), names


# ---- per-graph options, quantized and external weights, convert's refusals ----

def test_an_ep_option_recompiles_that_graph_only_and_is_recorded(project):
    project.add_tiny("tiny", **ONE_CHIP)
    project.add_tiny("other", seed=1, **ONE_CHIP)
    rc, _, text = project.run()
    assert rc == 0, text
    # an option the Saver route cannot reproduce: the graph compiles with the EP
    # directly (docs/design-card.md)
    project.edit("models/tiny.toml", NET, f'{NET}compile.route = "ep"\n'
                 f"compile.ep_options = {{ enable_htp_fp16_clamp_overflow = true }}\n")
    rc, executed, text = project.run()
    assert rc == 0, text
    assert {"compile:tiny/net@SM8750", "verify:tiny@SM8750", "manifest:tiny@SM8750"} <= set(
        executed
    )
    assert not [
        t for t in executed if "other" in t or t.split(":")[0] in ("export", "simplify", "parity")
    ], executed
    compiled = json.loads((project.root / "build/tiny/ort-qnn/SM8750/net.compile.json").read_text())
    assert compiled["options"]["enable_htp_fp16_clamp_overflow"] == "1"
    manifest = json.loads((project.root / "build/tiny/ort-qnn/SM8750/manifest.json").read_text())
    assert manifest["compile_options"] == {
        "net": {"route": "ep", "ep_options": {"enable_htp_fp16_clamp_overflow": True}}
    }
    assert manifest["binaries"]["net"]["options"]["enable_htp_fp16_clamp_overflow"] == "1"
    assert project.run()[1] == []


def test_an_op_that_would_fall_back_to_the_cpu_fails_convert_naming_it(project):
    handmade(
        project,
        '[h.make_node("Constant", [], ["axes"], value=h.make_tensor("a", T.INT64, [1], [1])),'
        ' h.make_node("Relu", ["x"], ["r"], name="relu"), h.make_node("Det", ["r"], ["d"], '
        'name="det"),'
        ' h.make_node("Unsqueeze", ["d", "axes"], ["y"], name="unsq")]',
        out_shape="[1, 1]",
    )
    rc, executed, text = project.run("compile:bad/net@SM8750")
    assert rc == 1, text
    assert "inspect:bad/net" in executed
    assert (
        "build/bad/net/net.onnx: 1 node(s) would run on the CPU, not the HTP: det (Det: Operators "
        "of type `Det` "
        "are not supported by QNN EP."
    ) in text   # the EP's own reason, from its verbose log
    record = json.loads((project.root / "build/bad/ort-qnn/net/net.convert.json").read_text())
    assert record["status"] == "failed" and [n["node"] for n in record["cpu_nodes"]] == ["det"]
    assert "not supported by QNN EP" in record["cpu_nodes"][0]["reason"]
    # the lowering found it
    assert "convert:bad/net" in executed and "modellib:bad/net" not in executed
    assert not (project.root / "build/bad/ort-qnn/SM8750/net_qnn.bin").exists()
    assert not (project.root / "build/bad/ort-qnn/net/net.c").exists()
    assert (project.root / "build/bad/ort-qnn/net/net.convert.log").exists()   # kept for reading


TIED_EMBEDDING = r"""
import json, sys, numpy as np, onnx, onnxruntime as ort
from onnx import helper as h, TensorProto as T, numpy_helper as nh
from toolchain import artifacts
from toolchain.stages import calibrate
from toolchain.compilers.ort_qnn import ep as ort_qnn, quantize
out, V, D = sys.argv[1], 8000, 128
rng = np.random.default_rng(0)
# Whisper's tied token embedding: one table read by a Gather (lookup) and by MatMul(W, x^T)
# (logits).
g = h.make_graph([h.make_node("Gather", ["W", "token"], ["e"]),
                  h.make_node("Reshape", ["e", "shape"], ["e2"]),
                  h.make_node("Add", ["e2", "x"], ["s"]),
                  h.make_node("Transpose", ["s"], ["st"], perm=[1, 0]),
                  h.make_node("MatMul", ["W", "st"], ["logits"])], "g",
                 [h.make_tensor_value_info("token", T.INT32, [1, 1]),
                  h.make_tensor_value_info("x", T.FLOAT, [1, D])],
                 [h.make_tensor_value_info("logits", T.FLOAT, [V, 1])],
                 [nh.from_array((rng.standard_normal((V, D)) * 0.05).astype(np.float32), "W"),
                  nh.from_array(np.array([1, D], np.int64), "shape")])
model = h.make_model(g, opset_imports=[h.make_opsetid("", 18)])
model.ir_version = 9
onnx.save(model, out + "/m.onnx")
rewritten = onnx.load(out + "/m.onnx")
tables = quantize.place_weights(rewritten)
inputs = [["token", [1, 1], "int32"], ["x", [1, D], "float32"]]
feeds = [{"token": np.array([[i * 97]], np.int32),
          "x": rng.standard_normal((1, D)).astype(np.float32)} for i in range(8)]
lines = []
for i, f in enumerate(feeds):
    for name, _, _ in inputs:
        f[name].tofile(f"{out}/{artifacts.calibration_raw_name(i, name)}")
    lines.append(" ".join(artifacts.calibration_raw_name(i, name) for name, _, _ in inputs))
open(out + "/input_list.txt", "w").write("\n".join(lines) + "\n")
quantize.quantize(out + "/m.onnx", out, inputs, out + "/q.onnx")
ort_qnn.compile(out + "/q.onnx", out + "/q_ctx.onnx",
                ort_qnn.provider_options({"soc_model": 69, "htp_arch": 79, "vtcm_mb": 8}, 3))
ref = ort.InferenceSession(out + "/m.onnx")
same = ort.InferenceSession(rewritten.SerializeToString())
chip = {"soc_model": 69, "htp_arch": 79, "vtcm_mb": 8}
sim = ort_qnn.simulator(out + "/q_ctx.onnx", ort_qnn.provider_options(chip, 3))
want = ref.run(None, feeds[0])[0]
print("RESULT " + json.dumps({
    "tables": tables, "table_bytes": V * D,
    "binary": __import__("os").path.getsize(out + "/q_ctx_qnn.bin"),
    "rewrite_err": float(np.abs(same.run(None, feeds[0])[0] - want).max()),
    "htp_rel": float(np.abs(sim(feeds[0])["logits"] - want).max() / np.ptp(want))}))
"""


def test_w8a16_stores_a_tied_embedding_in_8_bits(tmp_path):
    # Without quantize.place_weights the binary holds the table in 8 bits for the Gather and in 16
    # bits for MatMul(W, x^T): 3x the table size (measured); with it, two 8-bit copies.
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, "-c", TIED_EMBEDDING, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    line = [ln for ln in run.stdout.splitlines() if ln.startswith("RESULT ")]
    assert line, run.stdout + run.stderr
    got = json.loads(line[0][len("RESULT "):])
    assert got["tables"] == ["W"]
    assert got["rewrite_err"] < 1e-5                              # the rewrite is the same product
    assert got["binary"] < 2.4 * got["table_bytes"], got          # 8-bit: ~2x table, not 3x
    # and the HTP result still matches float
    assert got["htp_rel"] < 0.05, got
    q = onnx.load(tmp_path / "q.onnx")
    assert {i.name: i.data_type for i in q.graph.initializer}[
        "W_quantized"
    ] == onnx.TensorProto.UINT8


EXTERNAL_DATA = r"""
import sys, numpy as np, onnx
from onnx import helper as h, TensorProto as T, numpy_helper as nh
from toolchain.compilers.ort_qnn import ep as ort_qnn
out = sys.argv[1]
w = nh.from_array(np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32), "w")
g = h.make_graph([h.make_node("MatMul", ["x", "w"], ["y"])], "g",
                 [h.make_tensor_value_info("x", T.FLOAT, [1, 256])],
                 [h.make_tensor_value_info("y", T.FLOAT, [1, 256])], [w])
onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), out + "/m.onnx",
          save_as_external_data=True, location="m.weights", size_threshold=0)
ort_qnn.compile(out + "/m.onnx", out + "/ctx/m.onnx",
                ort_qnn.provider_options({"soc_model": 69, "htp_arch": 79, "vtcm_mb": 8}, 3))
print("RESULT ok")
"""


def test_a_graph_with_external_weights_compiles(tmp_path):
    # ONNX over 2 GB must keep its weights in a side file (bench/size_limit.py compiles
    # 1.2 B parameters).
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, "-c", EXTERNAL_DATA, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "RESULT ok" in run.stdout, run.stdout + run.stderr
    assert (tmp_path / "m.weights").stat().st_size == 256 * 256 * 4 and (
        tmp_path / "ctx/m_qnn.bin"
    ).exists()


def test_external_data_is_answered_without_a_parse_and_still_right(tmp_path, monkeypatch):
    weights = numpy_helper.from_array(__import__("numpy").ones((64, 64), "float32"), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
        [weights],
    )
    model = helper.make_model(graph)
    onnx.save(model, tmp_path / "inline.onnx")
    onnx.save(
        model,
        tmp_path / "external.onnx",
        save_as_external_data=True,
        location="external.data",
        size_threshold=0,
    )
    parsed = []
    real_load = onnx.load
    monkeypatch.setattr(onnx, "load", lambda *a, **k: parsed.append(a[0]) or real_load(*a, **k))
    # no parse
    assert ep._has_external_data(str(tmp_path / "inline.onnx")) is False and parsed == []
    assert ep._has_external_data(str(tmp_path / "external.onnx")) is True


def test_the_eps_reason_for_each_node_it_leaves_on_the_cpu(tmp_path):
    """The EP states why only in its verbose log: an LSTM whose `activations` restate the defaults
    is refused for 'non-default activations' (issue 31); a block naming two nodes gives both its
    reason; a node the log does not name gets none (the message then says the EP gave none)."""
    import numpy as np
    from onnx import TensorProto as T
    from onnx import helper as h

    from toolchain.compilers.ort_qnn import ep
    hidden, size = 8, 4
    weights = [
        h.make_tensor(n, T.FLOAT, [1, 4 * hidden, k], np.ones(4 * hidden * k, np.float32) / k)
        for n, k in (("W", size), ("R", hidden))
    ]
    lstm = h.make_node("LSTM", ["x", "W", "R"], ["y"], name="/rnn/LSTM", hidden_size=hidden,
                       activations=["Sigmoid", "Tanh", "Tanh"])
    graph = h.make_graph(
        [lstm],
        "g",
        [h.make_tensor_value_info("x", T.FLOAT, [5, 1, size])],
        [h.make_tensor_value_info("y", T.FLOAT, [5, 1, 1, hidden])],
        initializer=weights,
    )
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]), tmp_path / "lstm.onnx")
    assert ep.cpu_nodes(str(tmp_path / "lstm.onnx"), {"htp_arch": "79", "soc_model": "69"}) == [
        ("/rnn/LSTM", "LSTM", "QNN EP doesn't support non-default activations for LSTM.")]
    log = (
        "x [V:onnxruntime:, qnn_execution_provider.cc:1713 LogNodeSupport] Validation FAILED for 2 "
        "nodes in "
        "OrtNodeUnit (Gather) :\n\tOperator type: Gather Node name: /g1 Node index: 3\n"
        "\tOperator type: Reshape Node name: /r1 Node index: 4\n\tREASON : Failed to add node.\n"
        "y [V:onnxruntime:, x] Validation FAILED for 1 nodes in OrtNodeUnit (Det) :\n"
        "\tOperator type: Det Node name: det Node index: 0\n"
    )
    assert ep.placement_reasons(log) == {
        "/g1": "Failed to add node.",
        "/r1": "Failed to add node.",
        "det": "",
    }


def test_windows_compile_into_one_shared_context_and_ship_with_their_route(project):
    """[windows]: every window compiled and verified from its own binary, and all of them in one
    context binary whose weights are stored once (read back: graph count and each graph's renamed
    I/O), smaller than the windows' own binaries together; the bundle names the windows, their
    graphs and the route."""
    project.add_windowed()
    rc, executed, text = project.run("bundle:windowed@SM8750", "share:windowed@SM8750")
    assert rc == 0, text
    assert {"verify:windowed@SM8750", "share:windowed@SM8750"} <= set(executed)
    chip = project.root / "build/windowed/ort-qnn/SM8750"
    shared = json.loads((chip / "shared.json").read_text())
    assert sorted(g["inputs"][0] for g in shared["graphs"]) == [
        "x__net",
        "x__net_16f",
        "x__net_32f",
    ]
    assert shared["bytes"] < shared["separate_total"], shared   # the weights once, not three times
    assert shared["simulated"] is False
    assert (chip / "shared/net_qnn.bin").stat().st_size == shared["bytes"]
    verify = json.loads((chip / "verify.json").read_text())
    assert set(verify["tensors"]) == {"net", "net_16f", "net_32f"} and verify["status"] == "passed"
    manifest = json.loads((chip / "manifest.json").read_text())
    assert manifest["windows"]["graphs"] == {
        "16": {"net": "net_16f"},
        "32": {"net": "net_32f"},
        "64": {"net": "net"},
    }
    assert manifest["shared_context"]["record"]["bytes"] == shared["bytes"]
    record = json.loads((chip / "bundle.json").read_text())
    with tarfile.open(project.root / record["bundles"]["onnxruntime"]["file"]) as tar:
        top = record["bundles"]["onnxruntime"]["top"]
        info = tar.extractfile(f"{top}/info.txt").read().decode()
        readme = tar.extractfile(f"{top}/README.md").read().decode()
        shipped = {m.name.split("/", 1)[1] for m in tar.getmembers() if "/" in m.name}
    assert "windows=16f,32f,64f\n" in info and "windows_routed=16f,64f\n" in info
    assert "window_graphs=16f:net_16f;64f:net\n" in info and "graphs=net,net_16f\n" in info
    assert "| 32f | `net_32f` | no, not shipped: not in the spec's route |" in readme
    # the routed windows only
    assert {"net_16f.onnx", "net_16f_qnn.bin", "net.onnx", "net_qnn.bin"} <= shipped
    assert not {"net_32f.onnx", "net_32f_qnn.bin"} & shipped
    assert record["bundles"]["onnxruntime"]["windows"] == {
        "routed": [16, 64],
        "not_shipped": {"32": "not in the spec's route"},
    }
    rc, executed, _ = project.run("bundle:windowed@SM8750", "share:windowed@SM8750")
    assert rc == 0 and executed == []
    rc, _, text = project.run("report")
    assert rc == 0, text
    table = (project.root / "build/report.md").read_text().split("## Windows")[1].split("\n## ")[0]
    rows = [
        line.split(" | ")[2:4]
        for line in table.splitlines()
        if line.startswith("| windowed | SM8750 |")
    ]
    assert rows == [
        ["16f", "net_16f"],
        ["32f", "net_32f"],
        ["64f", "net"],
        ["all, one context", "3 graphs"],
    ]
