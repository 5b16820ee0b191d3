"""Variants (one spec, one model per axis value) and ONNX from a declared command or a given file."""
import hashlib
import json
import subprocess
import sys
import textwrap

import pytest

from conftest import FIXTURES
from toolchain.spec import chips
from toolchain import spec
from toolchain.spec import SpecError

VARIANTS = '''
module = "seqnet"
chips = ["SM8750"]
[license]
name = "Apache-2.0"
[checkpoint]
path = "seq.pt"
sha256 = "{sha}"
format = "torch"
[export]
exporter = "legacy"
opset = 17
[graphs.net]
inputs.x = {{ shape = [1, 4, 16], dtype = "float32" }}
outputs.y = {{ shape = [1, 10], dtype = "float32" }}

[variants.len16]
export.args.length = 16

[variants.len48]
export.args.length = 48
graphs.net.inputs.x.shape = [1, 4, 48]
'''

MAKE_ONNX = '''
import sys
import numpy as np
import onnx
from onnx import helper as h, TensorProto as T, numpy_helper as nh
scale = float(sys.argv[sys.argv.index("--scale") + 1])
w = nh.from_array((np.arange(16 * 8, dtype=np.float32).reshape(16, 8) / 100 * scale), "w")
g = h.make_graph([h.make_node("MatMul", ["x", "w"], ["m"]), h.make_node("Relu", ["m"], ["y"])], "g",
                 [h.make_tensor_value_info("x", T.FLOAT, [1, 16])], [h.make_tensor_value_info("y", T.FLOAT, [1, 8])], [w])
onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), sys.argv[sys.argv.index("--output") + 1])
'''

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
def variants(project):
    models = project.root / "models"
    (models / "seqnet.py").write_text((FIXTURES / "seqnet.py").read_text())
    subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(models)!r}); import seqnet; "
                    f"seqnet.make_checkpoint({str(models / 'seq.pt')!r})"], check=True)
    sha = hashlib.sha256((models / "seq.pt").read_bytes()).hexdigest()
    (models / "seq.toml").write_text(VARIANTS.format(sha=sha))
    return project


def test_variants_fan_out_into_models_with_their_own_outputs_and_rows(variants):
    models = spec.load_file(variants.root / "models/seq.toml", chips.load())
    assert [m.name for m in models] == ["seq-len16", "seq-len48"]
    assert models[1].graph("net").inputs[0].shape == (1, 4, 48)
    rc, executed, text = variants.run()
    assert rc == 0, text
    for name, length in (("seq-len16", 16), ("seq-len48", 48)):
        m = json.loads((variants.root / f"build/{name}/ort-qnn/SM8750/manifest.json").read_text())
        assert m["binaries"]["net"]["config"]["soc_type"] == "SM8750"
        assert m["graphs"]["net"]["io"]["inputs"] == [["x", [1, 4, length], "float32"]]
        assert f"| {name} | SM8750 |" in (variants.root / "build/report.md").read_text()
    variants.edit("models/seq.toml", "export.args.length = 48", "export.args.length = 40")
    variants.edit("models/seq.toml", "graphs.net.inputs.x.shape = [1, 4, 48]", "graphs.net.inputs.x.shape = [1, 4, 40]")
    rc, executed, _ = variants.run()
    assert rc == 0 and executed and all("seq-len48" in t or t == "report" for t in executed)


def test_a_variant_with_a_bad_override_names_the_variant(variants):
    variants.edit("models/seq.toml", "graphs.net.inputs.x.shape = [1, 4, 48]", "graphs.net.inputs.x.shape = [2, 4, 48]")
    with pytest.raises(SpecError, match=r"seq.toml \[variants.len48\]: graphs.net.inputs.x.shape: batch"):
        spec.load_file(variants.root / "models/seq.toml", chips.load())


@pytest.fixture
def external(project):
    models = project.root / "models"
    (models / "make_onnx.py").write_text(MAKE_ONNX)
    (models / "plain.py").write_text('"""No export code: the ONNX comes from make_onnx.py."""\n')
    source = '{ command = ["{python}", "make_onnx.py", "--scale", "1", "--output", "{out}"], reads = ["make_onnx.py"] }'
    (models / "ext.toml").write_text(textwrap.dedent(EXTERNAL.format(source=source)))
    return project


def test_an_external_export_command_is_a_tracked_dependency(external):
    rc, executed, text = external.run()
    assert rc == 0, text
    assert "export:ext/net" in executed and not [t for t in executed if t.startswith(("checkpoint:", "parity:"))]
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
    subprocess.run([sys.executable, "make_onnx.py", "--scale", "1", "--output", "given.onnx"], cwd=models, check=True)
    (models / "plain.py").write_text('"""No export code: the ONNX is given."""\n')
    sha = hashlib.sha256((models / "given.onnx").read_bytes()).hexdigest()
    (models / "given.toml").write_text(textwrap.dedent(EXTERNAL.format(source=f'{{ onnx = "given.onnx", sha256 = "{sha}" }}')))
    rc, executed, text = project.run()
    assert rc == 0, text
    subprocess.run([sys.executable, "make_onnx.py", "--scale", "3", "--output", "given.onnx"], cwd=models, check=True)
    rc, _, text = project.run()
    assert rc == 1 and f"the spec pins {sha}" in text
