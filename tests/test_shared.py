"""toolchain/shared/ (what stages and model code share): the WAV reader model code is given."""
from __future__ import annotations

import pytest


def test_the_projects_wav_reader_for_model_code(tmp_path):
    import wave

    import numpy as np

    from toolchain.modelkit import read_wav
    samples = (np.sin(np.arange(1600) / 10) * 16000).astype("<i2")
    with wave.open(str(tmp_path / "a.wav"), "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(np.stack([samples, samples], axis=1).tobytes())
    got = read_wav(tmp_path / "a.wav")
    assert got.dtype == np.float32 and np.allclose(got, samples / 32768.0)
    with pytest.raises(ValueError, match="a.wav: 16000 Hz; expected 8000 Hz"):
        read_wav(tmp_path / "a.wav", rate=8000)


def test_graph_feeds_that_leave_a_graph_out_is_an_error():
    """A graph graph_feeds() returns nothing for would get no per-call check at all: one line,
    naming the graph."""
    import types

    import numpy as np

    from toolchain.errors import StageFailed
    from toolchain.shared import modeldata
    module = types.SimpleNamespace(
        __file__="models/two.py",
        graph_feeds=lambda run, sample: {"encoder": [{"x": np.zeros(2, np.float32)}]},
    )
    io = {
        "encoder": {"inputs": [["x", [2], "float32"]]},
        "decoder": {"inputs": [["h", [2], "float32"]]},
    }
    with pytest.raises(
        StageFailed,
        match=r"^models/two.py: graph_feeds\(\) returned no feeds for graph\(s\) decoder",
    ):
        modeldata.feeds(module, None, None, io)
    module.graph_feeds = lambda run, sample: {
        "encoder": [{"x": np.zeros(2, np.float32)}],
        "decoder": [{}],
    }
    assert set(modeldata.feeds(module, None, None, io)) == {"encoder", "decoder"}


def test_what_a_model_file_defines_is_read_without_importing_it(tmp_path):
    from toolchain.shared import modeldata
    code = tmp_path / "m.py"
    code.write_text(
        "from x import write_tokens as wt\nexport = None\n\ndef agree(a, b, s):\n    raise "
        "SystemExit\n"
    )
    assert [modeldata.defines(str(code), n) for n in ("wt", "export", "agree", "samples")] == [
        True,
        True,
        True,
        False,
    ]
    # the step that imports it reports the syntax error, file and line
    code.write_text("def export(:\n")
    assert modeldata.defines(str(code), "export") is False
