"""A user's own given ONNX built from its TOML alone: `rewrite = "auto"` legalizes every pattern
(toolchain/rewrites), the rewrite stage proves it on the CPU, verify passes on two chips and the
manifest lists what was rewritten; without the rewrites the build fails in one line naming node,
reason and rewrite; a rewrite that changes outputs is named."""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import textwrap

import onnx
import pytest
from conftest import FIXTURES, sha256

from toolchain.errors import StageFailed
from toolchain.rewrites import library
from toolchain.stages import rewrite_check, simplify

SPEC = """
description = "a speech-enhancer-shaped graph given as ONNX, with every pattern a rewrite is for"
module = "plain"
chips = ["SM8550", "SM8750"]
[license]
name = "Apache-2.0"
[graphs.net]
source = {{ onnx = "denoiser.onnx", sha256 = "{sha}" }}
{rewrite}
inputs.x = {{ shape = [1, 16, 64], dtype = "float32" }}
outputs.y = {{ shape = [1, 16, 8], dtype = "float32" }}
"""


def _legalize():
    spec = importlib.util.spec_from_file_location("legalize", FIXTURES / "legalize.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def denoiser(project):
    models = project.root / "models"
    onnx.save(_legalize().denoiser(), models / "denoiser.onnx")
    (models / "plain.py").write_text('"""No model code: the graph is given as a file."""\n')

    def declare(rewrite_line: str):
        (models / "den.toml").write_text(
            textwrap.dedent(SPEC.format(sha=sha256(models / "denoiser.onnx"), rewrite=rewrite_line))
        )
    project.declare = declare
    return project


def test_a_given_onnx_builds_from_its_toml_with_rewrite_auto(denoiser):
    denoiser.declare('rewrite = "auto"')
    rc, executed, text = denoiser.run()
    assert rc == 0, text
    # no reference: the rewrites still proven
    assert "rewrite_check:den" in executed and "parity:den" not in executed
    proof = json.loads((denoiser.root / "build/den/rewrite.json").read_text())
    assert proof["tensors"]["net"]["max_abs"] < 1e-5 and proof["tensors"]["net"]["calls"] == 3
    applied = [
        "lstm-default-activations",
        "high-rank-fold",
        "convtranspose-as-conv",
        "pow-square-as-mul",
        "conv-dilated-polyphase",
    ]
    for chip in ("SM8550", "SM8750"):
        manifest = json.loads(
            (denoiser.root / f"build/den/ort-qnn/{chip}/manifest.json").read_text()
        )
        assert [a["rewrite"] for a in manifest["rewrites"]["net"]["applied"]] == applied
        assert manifest["rewrites"]["net"]["applied"][3]["nodes"] == ["/norm/Pow"]
        assert manifest["rewrite_check"]["cpu"]["tensors"]["net"]["max_abs"] < 1e-5
        assert manifest["verify"]["default"]["tensors"]["net"]["max_rel"] < 0.02
    record = json.loads((denoiser.root / "build/den/net/export.json").read_text())
    # a given file stays one
    assert record["settings"]["sha256"] == sha256(denoiser.root / "models/denoiser.onnx")
    assert denoiser.run()[1] == []


def test_without_the_rewrites_the_build_names_node_reason_and_rewrite(denoiser):
    denoiser.declare("")
    rc, executed, text = denoiser.run("compile:den/net@SM8750")
    assert rc == 1 and "inspect:den/net" in executed and "convert:den/net" not in executed, text
    line = next(li for li in text.splitlines() if "computed wrong on the HTP" in li)
    assert (
        "/tcn/Conv (Conv) is computed wrong on the HTP: a dilated 1-D Conv with the same padding "
        "of 33"
        in line
    )
    assert "apply the rewrite 'conv-dilated-polyphase'" in line
    assert (
        "/norm/Pow (Pow) is computed wrong on the HTP: Pow(x, 2) returns -4.0 for x = -0.0" in line
    )
    # the others stay off the HTP
    denoiser.declare('rewrite = ["pow-square-as-mul", "conv-dilated-polyphase"]')
    rc, executed, text = denoiser.run("compile:den/net@SM8750")
    assert rc == 1 and "convert:den/net" in executed, text
    line = next(li for li in text.splitlines() if "would run on the CPU" in li)
    assert (
        "/up/ConvTranspose (ConvTranspose: QNN EP: QNN's TransposeConv2d operator only supports "
        "default "
        "dilation values of 1.; the rewrite 'convtranspose-as-conv' makes the HTP take it)"
    ) in line
    assert (
        "/unfold/Gather (Gather: output frames has rank 6 > 5, the HTP's most; the rewrite "
        "'high-rank-fold' "
        "makes"
    ) in line
    # a given file: the rules are the way, not an export it does not have
    assert "export" not in line
    assert (
        "/rnn/LSTM (LSTM: QNN EP doesn't support non-default activations for LSTM.; the rewrite "
        "'lstm-default-activations' makes"
    ) in line
    record = json.loads((denoiser.root / "build/den/ort-qnn/net/net.convert.json").read_text())
    assert {n["node"]: n["rewrite"] for n in record["cpu_nodes"]} == {
        "/up/ConvTranspose": "convtranspose-as-conv", "/unfold/Gather": "high-rank-fold",
        "/unfold/Reshape": "high-rank-fold",
        "/rnn/LSTM": "lstm-default-activations"}


def _careless(view, node) -> None:
    """Pow(x, 2) as Abs(x): right for |x| = 1 only."""
    view.replace(node, [view.node("Abs", [node.input[0]], list(node.output), node.name)])


def test_a_rewrite_that_changes_the_outputs_fails_naming_it(tmp_path, monkeypatch):
    rules = tuple(dataclasses.replace(r, apply=_careless) if r.name == "pow-square-as-mul" else r
                  for r in library.RULES)
    monkeypatch.setattr(library, "RULES", rules)
    onnx.save(_legalize().square(), tmp_path / "export.onnx")
    files = {
        "rewritten": str(tmp_path / "net.onnx"),
        "unrewritten": str(tmp_path / "net.unrewritten.onnx"),
        "applied": str(tmp_path / "net.rewrites.json"),
    }
    simplify.simplify(
        str(tmp_path / "export.onnx"),
        files["rewritten"],
        "auto",
        files["unrewritten"],
        files["applied"],
    )
    (tmp_path / "plain.py").write_text("")
    io = {"net": {"inputs": [["x", [1, 64], "float32"]], "outputs": [["y", [1, 64], "float32"]]}}
    with pytest.raises(StageFailed) as failed:
        rewrite_check.check(
            str(tmp_path / "plain.py"),
            {"net": files},
            None,
            {"max_abs": 1e-3, "metric": {}},
            str(tmp_path / "rewrite.json"),
            io,
            "models/x.toml",
            {},
        )
    message = str(failed.value)
    assert message.startswith(
        "models/x.toml: the rewrites change what the model computes (CPU, unrewritten vs "
        "rewritten): net: max abs error "
    ), message
    assert "rewrite 'pow-square-as-mul' on graph net (nodes /norm/Pow): max abs error" in message
    assert not (tmp_path / "rewrite.json").exists()


@pytest.mark.parametrize(
    "value, message",
    [
        ('["pow-squar"]', "unknown rewrite 'pow-squar'; did you mean 'pow-square-as-mul'?"),
        (
            '"all"',
            'expected "auto" or a list of rewrite names (if-as-where, lstm-default-activations, ',
        ),
        ("true", "graphs.net.rewrite: expected str or list, got True"),
    ],
)
def test_a_rewrite_the_library_does_not_have_is_refused_at_load(denoiser, capsys, value, message):
    denoiser.declare(f"rewrite = {value}")
    rc, _, _ = denoiser.run("list")
    err = capsys.readouterr().err
    assert rc == 3 and "models/den.toml: graphs.net.rewrite: " in err and message in err, err
