"""The export stage (toolchain/stages/export.py): failures in the user's own model code named by
file and line; ONNX from a declared command (a tracked dependency) or a given file pinned by sha256;
a given ONNX with dynamic axes, from an installed package, pinned to the spec's shapes."""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import textwrap

import pytest
from conftest import ROOT, Project, sha256

# ---- failures in the user's own code: their file and line, one line, the traceback in the log ----

def test_a_model_module_that_does_not_import_is_named_by_file_and_line(project):
    project.add_tiny()
    code = project.root / "models/tinynet.py"
    code.write_text(code.read_text() + "\n\nraise RuntimeError('no weights here')\n")
    lines = code.read_text().count("\n")
    rc, _, text = project.run("export")
    assert rc == 1 and "Traceback" not in text, text
    assert f"models/tinynet.py:{lines} (in <module>): RuntimeError: no weights here" in text
    # the first step that imports it
    assert "full traceback: build/tiny/checkpoint/model.pt.log" in text
    assert "Traceback" in (project.root / "build/tiny/checkpoint/model.pt.log").read_text()


def test_a_syntax_error_in_the_model_module_is_its_file_and_line(project):
    project.add_tiny()
    code = project.root / "models/tinynet.py"
    code.write_text("def export(:\n" + code.read_text())
    rc, _, text = project.run("export")
    assert rc == 1 and "models/tinynet.py:1: SyntaxError" in text and "Traceback" not in text, text


def test_a_module_without_export_or_writing_nothing_says_so(project, capsys):
    project.add_tiny()
    code = project.root / "models/tinynet.py"
    original = code.read_text()
    code.write_text(original.replace("def export(", "def export_renamed("))
    # at load, before any step (toolchain/shared/modelcode.py)
    rc, executed, _ = project.run("export")
    assert rc == 3 and executed == []
    assert (
        "ERROR: models/tiny.toml: graphs.net: no source, so the model code exports it, but "
        "models/tinynet.py has "
        "no export(checkpoint, graph, out, settings) function"
    ) in capsys.readouterr().err
    code.write_text(
        original
        + "\n\ndef export(checkpoint, graph, out, settings):\n    open(out, 'wb').close()\n"
    )
    rc, _, text = project.run("export")
    assert rc == 1 and "export() of graph 'net' wrote nothing to `out`" in text, text


def test_a_package_the_model_code_imports_in_a_function_is_named_with_its_fix(project):
    """A top-level import is checked at load; one inside a function fails its step naming the
    package and the fix (the spec's `requires` wording), not the checkpoint."""
    project.add_tiny()
    project.edit("models/tinynet.py", "settings: dict) -> None:\n", "settings: dict) -> None:\n"
                 "    import no_such_package_46  # noqa: F401\n")
    rc, _, text = project.run("export")
    assert rc == 1, text
    assert (
        "ModuleNotFoundError: No module named 'no_such_package_46'; no_such_package_46 is not "
        "installed: "
        "pip install 'no_such_package_46', and add it to the spec: requires = "
        "[\"no_such_package_46\"]"
    ) in text
    assert "is that file the checkpoint" not in text and "Traceback" not in text


def test_a_command_that_is_not_installed_or_writes_no_onnx_is_one_line(project):
    project.add_tiny(
        **{
            "[graphs.net]\n": "[graphs.net]\n"
            'source = { command = ["no-such-exporter", "{out}"] }\n',
            "max_abs = 1e-4": 'reference = "none"',
        }
    )
    rc, _, text = project.run("export")
    assert (
        rc == 1
        and "export command 'no-such-exporter' cannot start (No such file or directory)" in text
    ), text
    project.edit(
        "models/tiny.toml", '["no-such-exporter", "{out}"]', '["sh", "-c", "echo not onnx > {out}"]'
    )
    rc, _, text = project.run("export")
    assert rc == 1 and "wrote not an ONNX model" in text and "Traceback" not in text, text


# ---- ONNX from a declared command or a given file ----

MAKE_ONNX = """
import sys
import numpy as np
import onnx
from onnx import helper as h, TensorProto as T, numpy_helper as nh
scale = float(sys.argv[sys.argv.index("--scale") + 1])
w = nh.from_array((np.arange(16 * 8, dtype=np.float32).reshape(16, 8) / 100 * scale), "w")
batch = "n" if "--dynamic" in sys.argv else 1   # a symbolic batch, as many exporters write it
g = h.make_graph([h.make_node("MatMul", ["x", "w"], ["m"]), h.make_node("Relu", ["m"], ["y"])], "g",
                 [h.make_tensor_value_info("x", T.FLOAT, [batch, 16])],
                 [h.make_tensor_value_info("y", T.FLOAT, [batch, 8])], [w])
onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]),
          sys.argv[sys.argv.index("--output") + 1])
"""


EXTERNAL = '''
module = "plain"
chips = ["SM8550"]
[license]
name = "Apache-2.0"
[parity]
reference = "none"
[graphs.net]
source = {source}
inputs.x = {{ shape = [1, 16], dtype = "float32" }}
outputs.y = {{ shape = [1, 8], dtype = "float32" }}
'''


@pytest.fixture
def external(project):
    models = project.root / "models"
    (models / "make_onnx.py").write_text(MAKE_ONNX)
    (models / "plain.py").write_text('"""No export code: the ONNX comes from make_onnx.py."""\n')
    source = ('{ command = ["{python}", "make_onnx.py", "--scale", "1", "--output", "{out}"], '
              'reads = ["make_onnx.py"] }')
    (models / "ext.toml").write_text(textwrap.dedent(EXTERNAL.format(source=source)))
    return project


def test_an_external_export_command_is_a_tracked_dependency(external):
    rc, executed, text = external.run()
    assert rc == 0, text
    assert "export:ext/net" in executed and not [
        t for t in executed if t.startswith(("checkpoint:", "parity:"))
    ]
    m = json.loads((external.root / "build/ext/ort-qnn/SM8550/manifest.json").read_text())
    assert m["parity"]["skipped"].startswith("no PyTorch original")
    assert m["verify"]["default"]["tensors"]["net"]["max_rel"] < 0.02
    external.edit("models/ext.toml", '"--scale", "1"', '"--scale", "2"')          # the command line
    rc, executed, _ = external.run()
    assert rc == 0 and "export:ext/net" in executed and "compile:ext/net@SM8550" in executed
    external.edit("models/make_onnx.py", "/ 100", "/ 50")                        # a file it reads
    rc, executed, _ = external.run()
    assert rc == 0 and "export:ext/net" in executed


def test_a_given_onnx_file_is_pinned_by_sha256(project):
    models = project.root / "models"
    (models / "make_onnx.py").write_text(MAKE_ONNX)
    subprocess.run(
        [sys.executable, "make_onnx.py", "--scale", "1", "--output", "given.onnx"],
        cwd=models,
        check=True,
    )
    (models / "plain.py").write_text('"""No export code: the ONNX is given."""\n')
    sha = hashlib.sha256((models / "given.onnx").read_bytes()).hexdigest()
    (models / "given.toml").write_text(
        textwrap.dedent(EXTERNAL.format(source=f'{{ onnx = "given.onnx", sha256 = "{sha}" }}')))
    rc, executed, text = project.run()
    assert rc == 0, text
    subprocess.run(
        [sys.executable, "make_onnx.py", "--scale", "3", "--output", "given.onnx"],
        cwd=models,
        check=True,
    )
    rc, _, text = project.run()
    assert rc == 1 and f"the spec pins {sha}" in text


def test_a_command_made_onnx_with_symbolic_axes_is_pinned_like_a_given_file(project):
    models = project.root / "models"
    (models / "make_onnx.py").write_text(MAKE_ONNX)
    (models / "plain.py").write_text('"""No export code: the ONNX comes from make_onnx.py."""\n')
    source = (
        '{ command = ["{python}", "make_onnx.py", "--scale", "1", "--dynamic", "--output", '
        '"{out}"], '
        'reads = ["make_onnx.py"] }'
    )
    (models / "ext.toml").write_text(textwrap.dedent(EXTERNAL.format(source=source)))
    rc, _, text = project.run("inspect")
    assert rc == 0, text
    record = json.loads((project.root / "build/ext/net/export.json").read_text())
    assert record["pinned"] == {"x": {"0": "n -> 1"}}


def _tar_of(models, members: dict) -> str:
    import io
    import tarfile
    with tarfile.open(models / "nets.tar.gz", "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return sha256(models / "nets.tar.gz")


def test_a_member_of_an_archive_is_a_given_onnx_pinned_by_both_sha256(project):
    models = project.root / "models"
    (models / "make_onnx.py").write_text(MAKE_ONNX)
    subprocess.run(
        [sys.executable, "make_onnx.py", "--scale", "1", "--dynamic", "--output", "net.onnx"],
        cwd=models,
        check=True,
    )
    data = (models / "net.onnx").read_bytes()
    (models / "net.onnx").unlink()
    archive_sha = _tar_of(models, {"nets/README": b"two nets", "nets/net.onnx": data})
    (models / "plain.py").write_text('"""No export code: the ONNX is in an archive."""\n')
    member_sha = hashlib.sha256(data).hexdigest()

    def declare(member: str, sha: str = member_sha) -> None:
        source = (
            f'{{ archive = "nets.tar.gz", member = "{member}", archive_sha256 = "{archive_sha}", '
            f'sha256 = "{sha}" }}'
        )
        (models / "arc.toml").write_text(textwrap.dedent(EXTERNAL.format(source=source)))
    declare("nets/net.onnx")
    rc, _, text = project.run("inspect")
    assert rc == 0, text
    record = json.loads((project.root / "build/arc/net/export.json").read_text())
    assert (
        record["pinned"] == {"x": {"0": "n -> 1"}}
        and record["settings"]["onnx"] == "nets.tar.gz!nets/net.onnx"
    )
    # the extracted copy does not stay
    assert not list((project.root / "build/arc/net").glob("*.member"))
    declare("nets/other.onnx")
    rc, _, text = project.run("export")
    assert rc == 1 and "nets.tar.gz: no member nets/other.onnx" in text, text
    declare("nets/README", sha="0" * 64)
    rc, _, text = project.run("export")
    assert rc == 1 and f"the spec pins {'0' * 64}" in text, text
    declare("../net.onnx")
    rc, _, _ = project.run("list")
    assert rc == 3


def test_a_dynamically_quantised_onnx_is_refused_for_its_ops_not_its_shapes(project):
    """onnxruntime's int8 contrib ops have no ONNX shape inference: the batch stays symbolic, but
    the reason to give is the ops."""
    models = project.root / "models"
    subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent("""
        import numpy as np, onnx
        from onnx import helper as h, TensorProto as T, numpy_helper as nh
        nodes = [h.make_node("DynamicQuantizeLinear", ["x"], ["q", "s", "z"]),
                 h.make_node("MatMulInteger", ["q", "w", "z"], ["acc"]),
                 h.make_node("DynamicQuantizeLSTM", ["acc"], ["y"], domain="com.microsoft")]
        g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, ["n", 16])],
                         [h.make_tensor_value_info("y", T.FLOAT, ["n", 8])],
                         [nh.from_array(np.ones((16, 8), np.uint8), "w")])
        opsets = [h.make_opsetid("", 17), h.make_opsetid("com.microsoft", 1)]
        onnx.save(h.make_model(g, opset_imports=opsets), "q.onnx")"""),
        ],
        cwd=models,
        check=True,
    )
    (models / "plain.py").write_text('"""No export code: the ONNX is given."""\n')
    (models / "q.toml").write_text(textwrap.dedent(EXTERNAL.format(
        source=f'{{ onnx = "q.onnx", sha256 = "{sha256(models / "q.onnx")}" }}')))
    rc, _, text = project.run("export")
    line = next(li for li in text.splitlines() if "outside the ONNX standard set" in li)
    assert (
        rc == 1
        and (
            "q.onnx (a given ONNX): the graph holds ops outside the ONNX standard set: ai.onnx "
            "DynamicQuantizeLinear x1, ai.onnx MatMulInteger x1, com.microsoft DynamicQuantizeLSTM "
            "x1; "
            "it is a dynamically quantised int8 model"
        )
        in line
    ), line
    assert (
        "bring the float model" in line
        and "dynamic" not in line.split("int8 model")[0].split("set:")[0]
    )
    assert "stays dynamic" not in text


# ---- a given ONNX with dynamic axes, from an installed package
# -----------------------------------------------

def ppocr(project: Project, shape=(64, 64)) -> Project:
    """models/extra/ppocr-det.toml for one chip, at the given H, W."""
    models = project.root / "models"
    shutil.copy(ROOT / "models/ppocr_det.py", models)
    text = (
        (ROOT / "models/extra/ppocr-det.toml")
        .read_text()
        .replace('module = "../ppocr_det"', 'module = "ppocr_det"')
    )
    text = text.replace(
        'chips = ["SM8550", "SM8650", "SM8750", "SM8850", "QCS9100"]', 'chips = ["SM8750"]'
    )
    text = text.replace("[1, 3, 64, 64]", f"[1, 3, {shape[0]}, {shape[1]}]").replace(
        "[1, 1, 64, 64]", f"[1, 1, {shape[0]}, {shape[1]}]"
    )
    (models / "ppocr-det.toml").write_text(text)
    return project


def test_a_dynamic_axis_onnx_from_an_installed_package_builds_from_the_toml_alone(project):
    rc, executed, text = ppocr(project).run()
    assert rc == 0, text
    assert {
        "export:ppocr-det/det",
        "compile:ppocr-det/det@SM8750",
        "verify:ppocr-det@SM8750",
    } <= set(executed)
    record = json.loads((project.root / "build/ppocr-det/det/export.json").read_text())
    assert record["pinned"] == {
        "x": {
            "0": "p2o.DynamicDimension.0 -> 1",
            "2": "p2o.DynamicDimension.1 -> 64",
            "3": "p2o.DynamicDimension.2 -> 64",
        }
    }
    assert record["settings"]["onnx"].startswith("pypi:rapidocr-onnxruntime==1.4.4/")
    assert record["onnx_sha256"] == sha256(project.root / "build/ppocr-det/det/export.onnx")
    manifest = json.loads(
        (project.root / "build/ppocr-det/ort-qnn/SM8750/manifest.json").read_text()
    )
    assert manifest["verify"]["default"]["tensors"]["det"]["cosine"] > 0.999


def test_a_shape_the_model_cannot_take_is_one_line(project):
    rc, _, text = ppocr(project, shape=(48, 64)).run("export")
    assert (
        rc == 1 and "shapes pinned to the spec's {'x': [1, 3, 48, 64]} do not fit the model" in text
    ), text


def test_an_output_axis_that_depends_on_data_is_named(project):
    """NonZero's output length depends on the values: no input shape fixes it."""
    models = project.root / "models"
    subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent("""
        import onnx
        from onnx import helper as h, TensorProto as T
        g = h.make_graph([h.make_node("NonZero", ["x"], ["y"])], "g",
                         [h.make_tensor_value_info("x", T.FLOAT, ["n", 4])],
                         [h.make_tensor_value_info("y", T.INT64, [2, "k"])])
        onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), "nz.onnx")"""),
        ],
        cwd=models,
        check=True,
    )
    (models / "plain.py").write_text('"""No export code: the ONNX is given."""\n')
    (models / "nz.toml").write_text(textwrap.dedent(f'''
        module = "plain"
        chips = ["SM8750"]
        [license]
        name = "Apache-2.0"
        [parity]
        reference = "none"
        [graphs.net]
        source = {{ onnx = "nz.onnx", sha256 = "{sha256(models / 'nz.onnx')}" }}
        inputs.x = {{ shape = [1, 4], dtype = "float32" }}
        outputs.y = {{ shape = [2, 4], dtype = "int32", batch_axis = -1 }}
        '''))
    rc, _, text = project.run("export")
    assert rc == 1 and "output y axis 1 (k) stays dynamic with the inputs pinned" in text, text
    # the node that makes it so, and why: its inputs are static, its output is not
    assert (
        "(from node NonZero_0, NonZero: its inputs are static, its output is not): it depends on "
        "data"
        in text
    ), text


def test_a_given_onnxs_fixed_size_or_output_mismatch_says_what_to_declare():
    """A given ONNX is not changed to fit the spec: the message says the spec's line
    that fits it."""
    from onnx import TensorProto as T
    from onnx import helper as h

    from toolchain.errors import StageFailed
    from toolchain.stages import export

    def relu(shape):
        graph = h.make_graph(
            [h.make_node("Relu", ["x"], ["y"])],
            "g",
            [h.make_tensor_value_info("x", T.FLOAT, shape)],
            [h.make_tensor_value_info("y", T.FLOAT, shape)],
        )
        return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    io = {"inputs": [["x", [1, 8], "float32"]], "outputs": [["y", [1, 8], "float32"]]}
    with pytest.raises(
        StageFailed,
        match=r"input x axis 1 is fixed at 4 in the model, the spec declares 8: a given "
        r"ONNX keeps its fixed sizes, so declare inputs.x shape = \[1, 4\]$",
    ):
        export.pin_shapes(relu(["n", 4]), io, "m.onnx")
    io = {"inputs": [["x", [1, 4], "float32"]], "outputs": [["y", [2, 4], "float32"]]}
    with pytest.raises(
        StageFailed,
        match=r"output y is \[1, 4\] with the inputs pinned, the spec declares \[2, 4\]: "
        r"an output's shape follows from the inputs, so declare outputs.y shape = "
        r"\[1, 4\]$",
    ):
        export.pin_shapes(relu(["n", 4]), io, "m.onnx")
