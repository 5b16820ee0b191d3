"""sherpa-onnx's QNN Whisper host loop, ported to Python
(sherpa-onnx/csrc/qnn/offline-whisper-model-qnn.cc and offline-recognizer-whisper-tpl-impl.h at
k2-fsa/sherpa-onnx 634265c9).

It drives two graphs through the small interface of sherpa's QnnModel (input/output names, shapes as
the binary reports them, set_input / run / output): `toolchain.qnn.qnnrun.QnnModel` over a context
binary (the QNN C API, as the app does), or `GraphRun` over any run(graph, feeds) callback (CPU
ONNX, PyTorch) for the reference. Same code, same bookkeeping, so a difference in the transcript is
a difference of the graphs."""
from __future__ import annotations

import base64
import time
from typing import TYPE_CHECKING

# numpy is imported where used: doit's own process loads this module on every run
# (tests/test_engine_worker.py)
if TYPE_CHECKING:
    import numpy as np

# WhisperModelType names the runtime's ParseWhisperModelType accepts
# (offline-whisper-model-config.cc).
MODEL_TYPES = (
    "tiny",
    "tiny.en",
    "base",
    "base.en",
    "small",
    "small.en",
    "medium",
    "medium.en",
    "large",
)
SOT_EN, EOT_EN = (50257, 50362), 50256                       # InitSotSequence: *.en
# multilingual: sot, <|en|>, transcribe, notimestamps
SOT_MULTI, EOT_MULTI = (50258, 50259, 50359, 50363), 50257
LANGUAGE_0 = 50259                                            # <|en|>, the first language token


class ContractError(ValueError):
    """The graphs break what the runtime reads at load time (it would log and exit)."""


def parse_prefix(mel_input: str) -> tuple[str, str]:
    """ParseModelPrefix + ParseWhisperModelFromPrefix: 'tiny_en_mel' -> ('tiny_en', 'tiny.en')."""
    pos = mel_input.rfind("_mel")
    if pos < 0:
        raise ContractError(
            f"encoder input '{mel_input}' has no '_mel': the runtime parses the model prefix "
            f"from '<prefix>_mel' and exits"
        )
    prefix = mel_input[:pos]
    name = prefix.removeprefix("distil_").replace("_", ".", 1)
    if name not in MODEL_TYPES and not name.startswith("large"):
        raise ContractError(f"prefix '{prefix}' names no Whisper model type the runtime knows "
                            f"({', '.join(MODEL_TYPES)}; a first '_' becomes '.')")
    return prefix, name


class Contract:
    """What PostInitEncoder / PostInitDecoder read off the two graphs, checked as the
    runtime checks it."""

    def __init__(self, encoder, decoder):
        if not encoder.input_names:
            raise ContractError("encoder has no input tensors")
        self.prefix, self.model_type = parse_prefix(encoder.input_names[0])
        p = self.prefix
        mel = encoder.shape(f"{p}_mel") if encoder.has_tensor(f"{p}_mel") else None
        if mel is None or len(mel) != 3 or mel[0] != 1:
            raise ContractError(
                f"encoder input {p}_mel: shape {mel}, the runtime wants 3-D (1, frames, n_mels)"
            )
        self.num_frames, self.feat_dim = mel[1], mel[2]
        self.layers = len(encoder.output_names) // 2
        if not encoder.has_tensor("cross_k_0"):
            raise ContractError(
                "encoder has no output 'cross_k_0' (the runtime wants unprefixed "
                "cross_k_i/cross_v_i)"
            )
        _, self.out_frames, self.state = encoder.shape("cross_k_0")
        want = 1 + 4 * self.layers + 2
        if len(decoder.input_names) != want:
            raise ContractError(
                f"decoder has {len(decoder.input_names)} inputs, the runtime wants 1+4L+2 = {want} "
                f"for L = {self.layers}"
            )
        for name in (f"{p}_mask", f"{p}_logits"):
            if not decoder.has_tensor(name):
                raise ContractError(f"decoder has no tensor '{name}'")
        self.mask_size = decoder.shape(f"{p}_mask")[0]
        self.vocab = decoder.shape(f"{p}_logits")[-1]
        self.multilingual = not self.model_type.endswith(".en")
        self.sot, self.eot = (SOT_MULTI, EOT_MULTI) if self.multilingual else (SOT_EN, EOT_EN)


def recognize(encoder, decoder, features: np.ndarray, timings: dict | None = None) -> list[int]:
    """OfflineWhisperModelQnn::Impl::Run with the default config (task transcribe, no language
    given, so a multilingual model detects it): features (frames, n_mels), already normalised;
    returns the generated token ids (greedy search, no SOT, no EOT)."""
    import numpy as np
    c = Contract(encoder, decoder)
    p, L, D, n_ctx = c.prefix, c.layers, c.state, c.mask_size
    # longer input is truncated (the runtime warns)
    num_frames = min(len(features), c.num_frames)
    num_possible = min(int(num_frames / 100.0 * 6), n_ctx // 2)   # "at most 6 tokens per second"
    mel = np.zeros((c.num_frames, c.feat_dim), np.float32)      # padded with 0 after normalisation
    mel[:num_frames] = features[:num_frames]
    started = time.monotonic()
    encoder.set_input(f"{p}_mel", mel)
    encoder.run()
    if timings is not None:
        timings["encoder_seconds"] = time.monotonic() - started
    # encoder (1, frames, state) -> decoder (1, state, frames): the host transposes
    cross = [
        encoder.output(f"cross_{kv}_{i}").reshape(c.out_frames, D).T.copy()
        for i in range(L)
        for kv in "kv"
    ]
    # QNN layout (state, n_ctx): stride n_ctx
    self_kv = np.zeros((L, 2, D, n_ctx), np.float32)
    mask = np.ones(n_ctx, np.int32)                            # 1 = masked

    def step(token: int, offset: int) -> np.ndarray:
        decoder.set_input(f"{p}_tokens", np.array([token], np.int32))
        for i in range(L):
            decoder.set_input(f"{p}_self_k_{i}", self_kv[i, 0])
            decoder.set_input(f"{p}_self_v_{i}", self_kv[i, 1])
        for i in range(L):
            decoder.set_input(f"{p}_cross_k_{i}", cross[2 * i])
            decoder.set_input(f"{p}_cross_v_{i}", cross[2 * i + 1])
        decoder.set_input(f"{p}_offset", np.array([offset], np.int32))
        decoder.set_input(f"{p}_mask", mask)
        decoder.run()
        logits = decoder.output(f"{p}_logits").reshape(-1)
        for i in range(L):   # UpdateSelfKvCache: column `offset` of each (state, n_ctx) cache, +=
            self_kv[i, 0, :, offset] += decoder.output(f"{p}_this_self_k_{i}").reshape(-1)
            self_kv[i, 1, :, offset] += decoder.output(f"{p}_this_self_v_{i}").reshape(-1)
        mask[offset] = 0
        return logits

    # sot is never empty: logits is set
    started, calls, offset, sot = time.monotonic(), 0, 0, list(c.sot)
    # DetectLanguage: SOT alone at offset 0 on the empty cache, argmax over language ids
    if c.multilingual:
        first = step(sot[0], 0)
        self_kv[:], mask[:] = 0, 1   # the detection call leaves cache and mask as they were
        # whisper: 99 (100 for large-v3)
        languages = range(LANGUAGE_0, LANGUAGE_0 + c.vocab - 51765 - 1)
        sot[1], calls = max(languages, key=lambda i: first[i]), 1
    for token in sot:
        logits, offset, calls = step(token, offset), offset + 1, calls + 1
    tokens, idx = [], int(np.argmax(logits))
    while offset < num_possible and idx != c.eot:
        tokens.append(idx)
        logits, offset, calls = step(idx, offset), offset + 1, calls + 1
        idx = int(np.argmax(logits))
    if timings is not None:
        timings["decoder_calls"] = calls
        timings["decoder_seconds"] = time.monotonic() - started
    return tokens


def read_tokens(path: str) -> dict[int, bytes]:
    """tokens.txt as sherpa's SymbolTable reads it for Whisper: '<base64> <id>' per
    line, base64-decoded."""
    table = {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            parts = line.split()
            if len(parts) != 2:
                raise ValueError(f"{path}:{n}: expected '<symbol> <id>'")
            table[int(parts[1])] = base64.b64decode(parts[0])
    return table


def detokenize(tokens: list[int], table: dict[int, bytes]) -> str:
    """OfflineRecognizerWhisperTplImpl::Convert: ids missing from the table (special
    tokens) are skipped."""
    return b"".join(table[t] for t in tokens if t in table).decode("utf-8", "replace")


class GraphRun:
    """sherpa's QnnModel interface over a run(graph, feeds) callback, for the CPU reference.
    `io` is the graph's declared ONNX interface; `layout="onnx"` presents 3-D inputs with their
    last two axes swapped, as the QAIRT converter lays them out in the binary (and swaps them
    back for the callback)."""

    def __init__(self, run, graph: str, io: dict, layout: str = "qnn"):
        self._run, self._graph, self._layout = run, graph, layout
        self._onnx = {n: (list(s), d) for kind in ("inputs", "outputs") for n, s, d in io[kind]}
        self.input_names = [t[0] for t in io["inputs"]]
        self.output_names = [t[0] for t in io["outputs"]]
        self._feeds: dict = {}
        self._outs: dict = {}

    def _swapped(self, name: str) -> bool:
        return self._layout == "onnx" and name in self.input_names and len(self._onnx[name][0]) == 3

    def has_tensor(self, name: str) -> bool:
        return name in self._onnx

    def shape(self, name: str) -> list[int]:
        s = self._onnx[name][0]
        return [s[0], s[2], s[1]] if self._swapped(name) else s

    def dtype(self, name: str) -> str:
        return self._onnx[name][1]

    def set_input(self, name: str, data: np.ndarray) -> None:
        import numpy as np
        shape, dtype = self._onnx[name]
        a = np.asarray(data, dtype=dtype).reshape(self.shape(name))
        self._feeds[name] = (
            np.ascontiguousarray(a.transpose(0, 2, 1)) if self._swapped(name) else a.reshape(shape)
        )

    def run(self) -> None:
        self._outs = self._run(self._graph, {n: self._feeds[n] for n in self.input_names})

    def output(self, name: str) -> np.ndarray:
        import numpy as np
        return np.asarray(self._outs[name], np.float32)
