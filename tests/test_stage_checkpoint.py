"""The checkpoint stage (toolchain/stages/checkpoint.py): the pinned sha256 refuses other bytes
naming both hashes, and any declared format reaches the model code's prepare_checkpoint."""
from __future__ import annotations

import hashlib

from conftest import ONE_CHIP, handmade


def test_a_checkpoint_with_other_bytes_is_refused_with_both_hashes(project):
    handmade(project, '[h.make_node("Relu", ["x"], ["y"])]')
    (project.root / "models/handmade.bin").write_bytes(b"someone else's weights")
    rc, _, text = project.run("checkpoint:bad")
    assert rc == 1
    pinned = hashlib.sha256(b"weights live in the export code").hexdigest()
    actual = hashlib.sha256(b"someone else's weights").hexdigest()
    assert "models/bad.toml: checkpoint.sha256: " in text and pinned in text and actual in text


def test_any_checkpoint_format_reaches_the_model_code(project):
    project.add_tiny(**{**ONE_CHIP, 'format = "torch"': 'format = "tinynet-v1"'})
    rc, executed, text = project.run("checkpoint")
    assert rc == 0 and executed == ["checkpoint:tiny"], text
    project.edit(
        "models/tinynet.py",
        "def make_checkpoint",
        "def prepare_checkpoint(src, out, fmt):\n"
        '    raise ValueError(f"format {fmt!r} is not one this code reads")\n\n\ndef '
        'make_checkpoint',
    )
    rc, _, text = project.run("checkpoint")
    assert (
        rc == 1
        and "checkpoint.format = 'tinynet-v1': " in text
        and "is not one this code reads" in text
    ), text
    assert "Traceback" not in text


def test_a_checkpoint_the_model_code_cannot_load_is_named_in_one_line(project):
    """A garbage file pinned by its own hash passes the pin; the code that reads it (torch.load)
    is what fails."""
    project.add_tiny(**ONE_CHIP)
    (project.root / "models/tiny.pt").write_bytes(b"not a checkpoint at all")
    spec = (project.root / "models/tiny.toml").read_text()
    pinned = next(line for line in spec.splitlines() if line.startswith("sha256"))
    project.edit(
        "models/tiny.toml",
        pinned,
        f'sha256 = "{hashlib.sha256(b"not a checkpoint at all").hexdigest()}"',
    )
    rc, executed, text = project.run("export")
    assert rc == 1 and executed == ["checkpoint:tiny", "export:tiny/net"], text
    line = next(li for li in text.splitlines() if "failed at" in li)
    assert line.startswith(
        "models/tinynet.py: export of graph 'net' given the checkpoint "
        "build/tiny/checkpoint/model.pt failed at models/tinynet.py:26: UnpicklingError: "
    ), line
    assert "is that file the checkpoint this code reads" in line
