"""Bad specs: one clear message naming the file and the field; nothing already built is touched."""
import pytest

from toolchain.spec import chips
from toolchain import spec
from toolchain.spec import SpecError


@pytest.fixture
def tiny_spec(project):
    return project.add_tiny("tiny")


def load(path):
    return spec.load(path, chips.load())


def test_the_fixture_spec_loads(tiny_spec):
    model = load(tiny_spec)
    assert model.name == "tiny" and model.chips == ("SM8550", "SM8750")
    assert model.graph("net").inputs[0].shape == (1, 4, 16)


@pytest.mark.parametrize("old,new,expected", [
    ('module = "tinynet"', 'module = "tinynet', "TOML syntax error"),
    ("[parity]", "[parity]\nmax_abss = 1", "parity.max_abss: unknown key; did you mean 'max_abs'?"),
    ('module = "tinynet"\n', "", "module: missing required field"),
    ('chips = ["SM8550", "SM8750"]', 'chips = ["SM8550", "SM9999"]', "chips: unknown chip 'SM9999'"),
    ("shape = [1, 4, 16]", 'shape = [1, 4, "T"]', "graphs.net.inputs.x.shape: expected a list of positive integers"),
    ("shape = [1, 4, 16]", "shape = [2, 4, 16]", "graphs.net.inputs.x.shape: batch (axis 0) must be 1"),
    ('inputs.x = { shape = [1, 4, 16], dtype = "float32" }', 'inputs.x = { shape = [1, 4, 16], dtype = "int64" }',
     "graphs.net.inputs.x.dtype: int64 is not allowed at graph I/O"),
    ('path = "tiny.pt"', 'path = "missing.pt"', "checkpoint.path: checkpoint not found"),
    ('sha256 = "', 'sha256 = "zz', "checkpoint.sha256: expected 64 lower-case hex digits"),
    ('chips = ["SM8550", "SM8750"]', 'chips = ["SM8550", "SM8350"]',
     'chips: SM8350 (HTP v68) has no fp16, but graph \'net\' has precision = "fp16"'),
    ('precision = "fp16"', 'precision = "int4"', "graphs.net.precision: expected one of"),
])
def test_bad_spec_names_file_and_field(project, tiny_spec, old, new, expected):
    project.edit("models/tiny.toml", old, new)
    with pytest.raises(SpecError) as err:
        load(tiny_spec)
    assert str(err.value).startswith(str(tiny_spec) + ": ")
    assert expected in str(err.value)


def test_a_bad_spec_stops_doit_with_exit_3_and_damages_nothing(project):
    project.add_tiny("tiny")
    rc, _, text = project.run()
    assert rc == 0, text
    before = project.build_state()
    project.edit("models/tiny.toml", 'chips = ["SM8550", "SM8750"]', 'chips = ["SM8550", "SM8765"]')
    result = project.doit_cli()
    assert result.returncode == 3
    assert "ERROR: models/tiny.toml: chips: unknown chip 'SM8765'; did you mean 'SM8750'?" in result.stderr
    assert "Traceback" not in result.stderr
    assert project.build_state() == before
