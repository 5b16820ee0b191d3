"""The model file checked at load (toolchain/shared/modelcode.py): a misspelt hook, a hook the spec
needs and the file lacks, a package a top-level import names that is not installed: each one line at
load, before anything runs."""
from __future__ import annotations

import pytest
from conftest import ONE_CHIP

from toolchain import spec
from toolchain.errors import SpecError
from toolchain.shared import modelcode
from toolchain.spec import chips


def check(path):
    model = spec.load(path, chips.load())
    modelcode.check(model)
    return model


def test_the_hooks_are_the_model_code_protocols():
    from toolchain import modelkit
    assert modelcode.HOOKS == modelkit.HOOKS


def test_a_misspelt_hook_is_refused_at_load_with_did_you_mean(project, capsys):
    """graph_feedz() would never run: the tensor check would take generated inputs
    without a word."""
    tiny = project.add_tiny(**ONE_CHIP)
    check(tiny)   # the fixture's own helper make_checkpoint() is no hook's typo
    code = project.root / "models/tinynet.py"
    line = code.read_text().splitlines().index("def graph_feeds(run, sample):") + 1
    project.edit("models/tinynet.py", "def graph_feeds(", "def graph_feedz(")
    rc, executed, _ = project.run("list")
    err = capsys.readouterr().err
    assert rc == 3 and executed == []
    assert err.startswith(
        f"ERROR: models/tinynet.py:{line}: graph_feedz() is not a function the build calls, so it "
        f"would never run; did you mean 'graph_feeds'?"
    ), err
    # a helper of one's own
    project.edit("models/tinynet.py", "def graph_feedz(", "def _graph_feedz(")
    check(tiny)


DATA = {'module = "tinynet"\n': 'module = "tinynet"\ndata = "data/clips"\n'}


@pytest.mark.parametrize(
    "spec_edit, code_edit, message",
    [
        (
            {},
            ("def export(", "def _export("),
            "graphs.net: no source, so the model code exports it, but {code} has no "
            "export(checkpoint, graph, out, "
            "settings) function",
        ),
        (
            {},
            ("def torch_runner(", "def _torch_runner("),
            'parity.reference: "torch" compares the ONNX with the model code\'s '
            'torch_runner(checkpoint), which {code} '
            'does not define; write it, or declare [parity] reference = "none"',
        ),
        (DATA, None, "data: {code} has no samples(data_dir), so nothing would read"),
        (
            DATA,
            (
                "def graph_feeds(",
                "def samples(data_dir):\n    return [('a',)]\n\n\ndef _graph_feeds(",
            ),
            "data: {code} has samples() but no graph_feeds(run, sample), so the tensor check of "
            "net would run on "
            "generated inputs, not on your samples",
        ),
        (
            {},
            (
                "def graph_feeds(",
                "def evaluate(run, samples):\n    return []\n\n\ndef graph_feeds(",
            ),
            "module: {code} defines evaluate() but no agree(ref, got, settings)",
        ),
    ],
)
def test_a_hook_the_spec_needs_and_the_file_lacks_is_one_line_at_load(
    project, spec_edit, code_edit, message
):
    tiny = project.add_tiny(**ONE_CHIP, **spec_edit)
    (project.root / "models/data/clips").mkdir(parents=True)
    if code_edit:
        project.edit("models/tinynet.py", *code_edit)
    with pytest.raises(SpecError) as err:
        check(tiny)
    code = project.root / "models/tinynet.py"
    assert message.format(code=code) in str(err.value), err.value


def test_a_top_level_import_of_a_missing_package_names_pip_install_and_requires(project):
    """Said at load, in the spec's `requires` wording, not as a traceback seconds into the first
    step; a file beside the module is the model's own code, not a package."""
    tiny = project.add_tiny(**ONE_CHIP)
    (project.root / "models/helpers46.py").write_text("")
    code = project.root / "models/tinynet.py"
    code.write_text("import helpers46\nimport no_such_package_46.sub\n" + code.read_text())
    with pytest.raises(SpecError) as err:
        check(tiny)
    assert str(err.value) == (
        f"{tiny}: module: {code}:2 imports no_such_package_46, and no_such_package_46 is not "
        f"installed: pip install 'no_such_package_46', and add it to the spec: "
        f'requires = ["no_such_package_46"] (checked at load, recorded in the manifest)'
    )
