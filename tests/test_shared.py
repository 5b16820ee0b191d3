"""toolchain/shared/ (what stages and model code share): the WAV reader model code is given."""
from __future__ import annotations

import pytest


def test_the_projects_wav_reader_for_model_code(tmp_path):
    import wave

    import numpy as np

    import toolchain.audio
    samples = (np.sin(np.arange(1600) / 10) * 16000).astype("<i2")
    with wave.open(str(tmp_path / "a.wav"), "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(np.stack([samples, samples], axis=1).tobytes())
    got = toolchain.audio.read_wav(tmp_path / "a.wav")
    assert got.dtype == np.float32 and np.allclose(got, samples / 32768.0)
    with pytest.raises(ValueError, match="a.wav: 16000 Hz; expected 8000 Hz"):
        toolchain.audio.read_wav(tmp_path / "a.wav", rate=8000)
