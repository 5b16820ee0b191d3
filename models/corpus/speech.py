"""Real speech for the corpus's given speech graphs (data and nothing else: the graphs are as their packages ship
them). Random inputs say little of a VAD (its probability is ~0 on noise, so a relative error means nothing), of
an enhancer's caches or of a speaker encoder (Gaussian "mels" are negative half the time); these feed a real 16 kHz clip of models/data/speech-en, each call's state or caches as the
CPU run of the clip so far left them (the verify then runs that call on the CPU and on the HTP)."""
import wave

import numpy as np

CLIP = "librivox-0870.wav"   # 16 kHz mono PCM16, read speech (models/data/speech-en/PROVENANCE.md)
CALLS = 3


def audio(data_dir: str, clip: str = CLIP) -> np.ndarray:
    with wave.open(f"{data_dir}/{clip}", "rb") as w:
        if w.getframerate() != 16000 or w.getnchannels() != 1 or w.getsampwidth() != 2:
            raise ValueError(f"{data_dir}/{clip}: expected 16 kHz mono 16-bit PCM")
        return np.frombuffer(w.readframes(w.getnframes()), np.int16).astype(np.float32) / 32768.0


def samples(data_dir: str) -> list[tuple]:
    return [(CLIP.removesuffix(".wav"), audio(data_dir))]


def graph_feeds(run, sample, io):
    """A few calls of each graph on the clip, inside speech, with the state (or caches) the CPU left."""
    if sample is None:
        raise ValueError("the speech feeds need the clip (data = \"../data/speech-en\" in the spec)")
    x = sample[1]
    kinds = {"state": _vad, "mix": _enhancer, "mels": _speaker}
    return {graph: next(kinds[n] for n, _, _ in spec["inputs"] if n in kinds)(run, graph, x)
            for graph, spec in io.items()}


def _vad(run, graph: str, x: np.ndarray) -> list[dict]:
    """Silero's step: 64 samples of context + 512 new ones, state [2, 1, 128] fed back."""
    state, feeds = np.zeros((2, 1, 128), np.float32), []
    first = 16000 // 512   # calls from 1 s on: speech
    for i in range(first + CALLS):
        chunk = x[max(0, i * 512 - 64): i * 512 + 512]
        chunk = np.pad(chunk, (576 - len(chunk), 0))[None].astype(np.float32)
        feed = {"input": chunk, "state": state}
        if i >= first:
            feeds.append(feed)
        state = run(graph, feed)["stateN"]
    return feeds


def _speaker(run, graph: str, x: np.ndarray) -> list[dict]:
    """Resemblyzer's partials: 160 frames of a 40-bin mel power spectrogram (25 ms Hann window, 10 ms hop, as its
    audio.py asks librosa for; the triangular filters written out here: HTK mel scale, 0-8 kHz)."""
    n_fft, hop, bins = 400, 160, 40
    frames = np.lib.stride_tricks.sliding_window_view(x, n_fft)[::hop] * np.hanning(n_fft)
    power = np.abs(np.fft.rfft(frames, axis=-1)) ** 2
    mel = 2595 * np.log10(1 + np.linspace(0, 8000, n_fft // 2 + 1) / 700)
    edges = np.linspace(0, mel[-1], bins + 2)
    filters = np.clip(np.minimum((mel - edges[:-2, None]) / (edges[1:-1, None] - edges[:-2, None]),
                                 (edges[2:, None] - mel) / (edges[2:, None] - edges[1:-1, None])), 0, None)
    mels = (power @ filters.T).astype(np.float32)
    return [{"mels": mels[start: start + 160][None]} for start in (100, 180, 260)]   # from 1 s on, 50 % overlap


def _enhancer(run, graph: str, x: np.ndarray) -> list[dict]:
    """GTCRN's step: one STFT frame (n_fft 512, hop 256, sqrt-Hann, as its package computes it) and its caches."""
    window = np.hanning(512).astype(np.float32) ** 0.5
    caches = {"conv_cache": np.zeros((2, 1, 16, 16, 33), np.float32),
              "tra_cache": np.zeros((2, 3, 1, 1, 16), np.float32), "inter_cache": np.zeros((2, 1, 33, 16), np.float32)}
    feeds, first = [], 62   # frames from 1 s on
    for i in range(first + CALLS):
        spectrum = np.fft.rfft(x[i * 256: i * 256 + 512] * window)
        mix = np.stack([spectrum.real, spectrum.imag], -1).astype(np.float32)[None, :, None, :]
        feed = {"mix": mix, **caches}
        if i >= first:
            feeds.append(feed)
        out = run(graph, feed)
        caches = {name: out[f"{name}_out"] for name in caches}
    return feeds
