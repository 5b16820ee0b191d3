"""The shape of toolchain/ (tests/architecture.py measures it): wings that import only downwards, no
cycles, stages that never name or import a compiler, one list of the stages, functions passed as functions."""
from __future__ import annotations

from pathlib import Path

from architecture import measure

ROOT = Path(__file__).parents[1]
SHAPE = measure(ROOT)


def test_no_import_cycle_inside_the_toolchain():
    assert SHAPE["cycles"] == []


def test_wings_import_only_downwards_and_stages_never_import_a_compiler():
    assert SHAPE["upward_imports"] == []
    stage_to_backend = [e for e in SHAPE["upward_imports"] if e.startswith("toolchain.stages.") and ".backends." in e]
    assert stage_to_backend == []


def test_no_import_is_hidden_in_a_function():
    assert SHAPE["function_level_imports"] == []


def test_no_stage_or_deploy_code_branches_on_a_compiler_name():
    assert SHAPE["compiler_name_branches"] == 0, SHAPE["compiler_name_branch_files"]


def test_the_stages_are_listed_in_one_place():
    assert SHAPE["places_listing_the_stages"] == ["toolchain/pipeline.py"]


def test_the_worker_is_given_functions_not_strings_that_name_them():
    assert SHAPE["functions_named_by_strings"] == []


def test_the_measures_can_fail(tmp_path):
    """The same script finds each fault in a tree that has it."""
    pkg = tmp_path / "toolchain"
    for wing in ("stages", "backends", "spec"):
        (pkg / wing).mkdir(parents=True)
        (pkg / wing / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "stages" / "verify.py").write_text(
        "from toolchain.backends import ort\n"
        "def tasks(model):\n    from toolchain.spec import x\n"
        "    return model.toolchain == 'qairt', 'toolchain.stages.verify:check'\n")
    (pkg / "backends" / "ort.py").write_text("from toolchain.stages import verify\n")
    (pkg / "spec" / "x.py").write_text("STAGES = " + repr(["export", "simplify", "inspect", "parity", "calibrate",
                                                           "compile", "verify", "manifest"]) + "\n")
    (tmp_path / "dodo.py").write_text("")
    shape = measure(tmp_path)
    assert shape["cycles"] == [["toolchain.backends.ort", "toolchain.stages.verify"]]
    assert shape["upward_imports"] == ["toolchain.stages.verify -> toolchain.backends.ort"]
    assert shape["function_level_imports"] == ["toolchain.stages.verify -> toolchain.spec.x"]
    assert shape["compiler_name_branches"] == 1
    assert shape["functions_named_by_strings"] == ["toolchain.stages.verify: toolchain.stages.verify:check"]
    assert shape["places_listing_the_stages"] == ["toolchain/spec/x.py"]
