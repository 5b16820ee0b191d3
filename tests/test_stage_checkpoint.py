"""The checkpoint stage (toolchain/stages/checkpoint.py): the pinned sha256 refuses other bytes naming both hashes, and
any declared format reaches the model code's prepare_checkpoint."""
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
    project.edit("models/tinynet.py", "def make_checkpoint", 'def prepare_checkpoint(src, out, fmt):\n'
                 '    raise ValueError(f"format {fmt!r} is not one this code reads")\n\n\ndef make_checkpoint')
    rc, _, text = project.run("checkpoint")
    assert rc == 1 and "checkpoint.format = 'tinynet-v1': " in text and "is not one this code reads" in text, text
    assert "Traceback" not in text
