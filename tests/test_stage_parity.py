"""The parity stage (toolchain/stages/parity.py): PyTorch against the CPU ONNX, before anything is compiled."""
from __future__ import annotations

from conftest import ONE_CHIP, handmade


def test_a_module_without_torch_runner_fails_parity_in_one_line(project):
    handmade(project, '[h.make_node("Relu", ["x"], ["y"])]')
    project.edit("models/bad.toml", 'reference = "none"', 'reference = "torch"')
    rc, _, text = project.run("parity")
    assert rc == 1 and "models/handmade.py: no torch_runner(checkpoint) function, which the parity stage" in text, text
    assert "AttributeError" not in text


def test_a_model_failing_its_cpu_check_costs_no_compile(project):
    project.add_tiny("bad", **{**ONE_CHIP, "max_abs = 1e-4": "max_abs = 0"})
    project.add_tiny("good", seed=1, **ONE_CHIP)
    rc, executed, text = project.run("--continue")
    assert rc in (1, 2) and "parity failed" in text, text   # 2: doit also reports the unmet dependencies
    assert "UnmetDependency - taskid:compile:bad/net@SM8750" in text
    assert "compile:good/net@SM8750" in executed and not [t for t in executed if t.startswith("compile:bad")]
