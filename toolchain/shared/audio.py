"""Audio for model code (models/*.py: toolchain.modelkit.read_wav): WAV files read with the standard
library. Not soundfile/libsndfile: used in a process that has loaded the QNN HTP libraries (every
verify step: the simulator) it segfaults, and the step dies with SIGSEGV and no Python traceback."""
from __future__ import annotations

import wave

import numpy as np

# dtype, offset, scale
WIDTHS = {1: ("u1", 128.0, 128.0), 2: ("<i2", 0.0, 32768.0), 4: ("<i4", 0.0, 2147483648.0)}


def read_wav(path: str, rate: int | None = 16000) -> np.ndarray:
    """Mono float32 samples in [-1, 1) of a PCM WAV (8, 16 or 32 bit; channels averaged). `rate`:
    the sample rate the file must have (a ValueError naming the file otherwise); None takes any."""
    with wave.open(str(path), "rb") as w:
        if rate is not None and w.getframerate() != rate:
            raise ValueError(
                f"{path}: {w.getframerate()} Hz; expected {rate} Hz (resample it first)"
            )
        if w.getsampwidth() not in WIDTHS:
            raise ValueError(
                f"{path}: {8 * w.getsampwidth()}-bit samples; expected 8, 16 or 32-bit PCM"
            )
        dtype, offset, scale = WIDTHS[w.getsampwidth()]
        data = np.frombuffer(w.readframes(w.getnframes()), dtype).reshape(-1, w.getnchannels())
    return ((data.astype(np.float32) - offset) / scale).mean(axis=1)
