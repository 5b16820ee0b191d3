"""Silero VAD 6.2.3, 16 kHz branch, as ONE static chunk step for the HTP: 64 samples of left context + 512 new
samples and the LSTM state -> the speech probability of the chunk and the next state.

The network is our own plain torch module (`Vad16k`) that loads the weights of the package's TorchScript
(`_model`, the 16 kHz branch); the TorchScript itself is the PyTorch reference the tests hold it to. The host
keeps the stream: it prepends the previous call's last 64 samples (zeros at the start), as silero's own ONNX
wrapper does, and feeds `stateN` back as `state`. The build itself cuts the stream into calls and feeds
`stateN` back (models/silero-vad.toml: graphs.vad.state and .stream; toolchain/shared/stream.py); this module
gives each clip's whole audio (`stream`) and judges the loop's probabilities (`evaluate_stream`, `agree`). The
segmenter (probabilities -> speech segments) is ours, with silero's documented default parameters."""
import os
import zlib

import numpy as np
import torch
import torch.nn.functional as F

from toolchain.modelkit import read_wav, torch_to_onnx

RATE = 16000
CHUNK = 512                 # new samples per call (silero's window at 16 kHz)
CONTEXT = 64                # samples of the previous call in front of them (silero's context_size_samples)
HIDDEN = 128                # LSTM width; state = [h, c] stacked: (2, 1, 128)
HOP, FILTER = 128, 256      # the STFT's conv1d: stride and taps (stft.hop_length / filter_length)
REFLECT = 64                # stft.padding: ReflectionPad1d((0, 64)) on the right
ENCODER_STRIDES = (1, 2, 2, 1)   # encoder.<i>.reparam_conv: kernel 3, padding 1 each, these strides
# fp16 and the STFT magnitude: sqrt(re^2 + im^2) is computed in fp16 on the HTP, and squaring doubles the
# dynamic range (in dB) that fp16 must hold. The top end is not where it bites: the basis rows are Hann-windowed
# cos/sin of 256 taps whose |taps| sum to 128, so for |x| <= 1 a square is at most 128^2 = 16384 (DC at full
# scale; a full-scale sine gives 4096), and the composites' speech, clipped at full scale in cards-004, reaches
# 531: 123x below fp16's 65504. The bottom end bites: in the quietest chunks of the composites even the largest
# square is 2.4e-5, below fp16's smallest normal number (6.1e-5), so the squares of the pauses lose their bits
# (subnormal) or vanish, and the LSTM state carries that error on. Folding a scale of 1/16 into the basis (and 16
# into the first encoder conv) for headroom, the obvious guard, makes it 256x worse: over pauses-short on SM8750
# (each backend on its own states) the probability drifted 0.119 from the CPU, against 0.0057 unscaled. So each
# chunk is normalised instead: magnitude = a * |STFT(x / a)|, a = max|x| of the chunk (at least NORM_FLOOR). The
# same function (the STFT is linear, the magnitude homogeneous: 7e-7 from the TorchScript), its squares are
# <= 16384 at ANY input level (no inf, however loud), and a quiet chunk is lifted into fp16's normal range.
# Measured drift (max abs probability error, pauses-short, SM8750), normalised / unscaled / scaled 1/16:
# as recorded 0.0043 / 0.0057 / 0.119; the clip x0.03 (-30 dB) 0.025 / 0.057 / 0.213; x0.01 0.011 / 0.031;
# x16 (+24 dB, squares up to 136000 unscaled) 0.010 / 0.025 (the HTP saturated instead of giving inf).
NORM_FLOOR = 1e-4           # a floor for a (digital silence: x / a = 0); an fp16 normal number
INPUTS, OUTPUTS = ["input", "state"], ["output", "stateN"]
WEIGHTS = ("stft.forward_basis_buffer", "encoder.0.reparam_conv.weight", "encoder.0.reparam_conv.bias",
           "encoder.1.reparam_conv.weight", "encoder.1.reparam_conv.bias", "encoder.2.reparam_conv.weight",
           "encoder.2.reparam_conv.bias", "encoder.3.reparam_conv.weight", "encoder.3.reparam_conv.bias",
           "decoder.rnn.weight_ih", "decoder.rnn.weight_hh", "decoder.rnn.bias_ih", "decoder.rnn.bias_hh",
           "decoder.decoder.2.weight", "decoder.decoder.2.bias")

# The segmenter: silero's documented defaults (get_speech_timestamps)
THRESHOLD = 0.5
NEG_THRESHOLD = THRESHOLD - 0.15
MIN_SPEECH_MS, MIN_SILENCE_MS, SPEECH_PAD_MS = 250, 100, 30

# The VAD clips: real speech clips of data/speech-en with pauses between them. ("silence", s) is s seconds of
# seeded gaussian noise at SILENCE_DBFS (a quiet room, not digital zeros). "pauses-short" is the default
# tier's clip (every chip); the others, longer, librivox reading with pauses of 0.3-1.5 s, the full tier's.
SILENCE_DBFS = -60.0
COMPOSITES = (
    ("pauses-short", [("silence", 0.6), "cards-004", ("silence", 0.7), "goforward", ("silence", 0.6)]),
    ("pauses-reading", [("silence", 1.0), "librivox-0870", ("silence", 0.8), "librivox-0880", ("silence", 1.2),
                        "cards-005", ("silence", 1.0)]),
    ("pauses-mixed", [("silence", 0.5), "librivox-0890", ("silence", 0.4), "forever", ("silence", 1.5),
                      "librivox-0930", ("silence", 0.8)]),
    ("pauses-tight", [("silence", 1.2), "librivox-0920", ("silence", 0.3), "cards-002", ("silence", 0.9),
                      "cards-001", ("silence", 1.0)]),
)


# ---------------------------------------------------------------------------------------------- the network

def _weights(checkpoint: str) -> dict[str, torch.Tensor]:
    """The 16 kHz branch's weights from the package's TorchScript (silero_vad.jit: `_model`)."""
    try:
        scripted = torch.jit.load(checkpoint, map_location="cpu")
        state = scripted._model.state_dict()
    except (RuntimeError, AttributeError) as err:
        raise ValueError(f"{checkpoint}: not silero-vad's TorchScript with a 16 kHz `_model` ({err})") from None
    missing = [k for k in WEIGHTS if k not in state]
    if missing or set(state) != set(WEIGHTS):
        raise ValueError(f"{checkpoint}: weights differ from silero-vad 6's 16 kHz branch "
                         f"(missing {missing}, unexpected {sorted(set(state) - set(WEIGHTS))})")
    return {k: state[k].detach().float().clone() for k in WEIGHTS}


class Vad16k(torch.nn.Module):
    """input (1, 576), state (2, 1, 128) -> output (1, 1) speech probability, stateN (2, 1, 128).

    STFT magnitude (reflect pad, conv1d with the fixed basis; the chunk normalised, see NORM_FLOOR) ->
    4 x (conv1d k3 + ReLU) -> LSTM cell -> ReLU -> 1x1 conv -> sigmoid. Every op is plain: the LSTM cell is
    two matmuls and its gate functions."""

    def __init__(self, w: dict[str, torch.Tensor]):
        super().__init__()
        self.register_buffer("basis", w["stft.forward_basis_buffer"])                     # (258, 1, 256)
        for i in range(4):
            self.register_buffer(f"conv{i}_w", w[f"encoder.{i}.reparam_conv.weight"])
            self.register_buffer(f"conv{i}_b", w[f"encoder.{i}.reparam_conv.bias"])
        self.register_buffer("w_ih", w["decoder.rnn.weight_ih"])                          # (512, 128): i f g o
        self.register_buffer("w_hh", w["decoder.rnn.weight_hh"])
        self.register_buffer("b_gates", w["decoder.rnn.bias_ih"] + w["decoder.rnn.bias_hh"])
        self.register_buffer("head_w", w["decoder.decoder.2.weight"][:, :, 0])            # (1, 128)
        self.register_buffer("head_b", w["decoder.decoder.2.bias"])

    def forward(self, input: torch.Tensor, state: torch.Tensor):
        a = torch.clamp(input.abs().amax(dim=1, keepdim=True), min=NORM_FLOOR)          # (1, 1)
        x = F.pad(input / a, (0, REFLECT), mode="reflect").unsqueeze(1)                  # (1, 1, 640)
        spec = F.conv1d(x, self.basis, stride=HOP)                                       # (1, 258, 4)
        bins = FILTER // 2 + 1
        re, im = spec[:, :bins], spec[:, bins:]
        x = torch.sqrt(re * re + im * im) * a.unsqueeze(-1)                              # (1, 129, 4)
        for i, stride in enumerate(ENCODER_STRIDES):
            x = F.relu(F.conv1d(x, getattr(self, f"conv{i}_w"), getattr(self, f"conv{i}_b"),
                                stride=stride, padding=1))
        x = x[:, :, 0]          # (1, 128): one frame is left of the 4 (silero squeezes it, then means over it)
        h, c = state[0], state[1]
        gates = F.linear(x, self.w_ih) + F.linear(h, self.w_hh) + self.b_gates
        i, f, g, o = torch.split(gates, HIDDEN, dim=1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        output = torch.sigmoid(F.linear(F.relu(h), self.head_w, self.head_b))           # (1, 1)
        return output, torch.stack([h, c])


def load(checkpoint: str) -> Vad16k:
    return Vad16k(_weights(checkpoint)).eval().requires_grad_(False)


def export(checkpoint: str, graph: str, out: str, settings: dict) -> None:
    """Export graph "vad" to one self-contained ONNX file at `out`."""
    if graph != "vad":
        raise ValueError(f"unknown graph {graph!r} (expected 'vad')")
    example = (torch.zeros(1, CONTEXT + CHUNK), torch.zeros(2, 1, HIDDEN))
    torch_to_onnx(load(checkpoint), example, out, INPUTS, OUTPUTS, settings)


def torch_runner(checkpoint: str):
    """run(graph, feeds) -> {"output", "stateN"} with our plain module (the tests hold it to the TorchScript)."""
    net = load(checkpoint)

    def run(graph: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        with torch.no_grad():
            output, state = net(torch.from_numpy(feeds["input"]), torch.from_numpy(feeds["state"]))
        return {"output": output.numpy(), "stateN": state.numpy()}

    return run


# ------------------------------------------------------------------------------------------------- the data

def samples(data_dir: str) -> list[tuple]:
    """[(id, data_dir, parts, {clip id: file})] for COMPOSITES; the clips are looked up in <data_dir>/refs.tsv."""
    with open(os.path.join(data_dir, "refs.tsv"), encoding="utf-8") as f:
        files = dict(line.split("\t")[:2] for line in f if line.strip() and not line.startswith("#"))
    found = []
    for clip_id, parts in COMPOSITES:
        unknown = [p for p in parts if isinstance(p, str) and p not in files]
        if unknown:
            raise ValueError(f"{data_dir}/refs.tsv: composite {clip_id} names unknown clips {unknown}")
        found.append((clip_id, data_dir, tuple(parts), {p: files[p] for p in parts if isinstance(p, str)}))
    return found


def _pieces(sample: tuple) -> list[tuple[str, np.ndarray]]:
    """(name, audio) of each part in order: the clip id, or "silence" with its seeded noise."""
    clip_id, data_dir, parts, files = sample
    rng = np.random.default_rng(zlib.crc32(clip_id.encode()))   # one fixed seed per composite
    sigma = 10 ** (SILENCE_DBFS / 20)
    found = []
    for part in parts:
        if isinstance(part, str):
            found.append((part, read_wav(os.path.join(data_dir, files[part]))))
        else:
            kind, seconds = part
            if kind != "silence":
                raise ValueError(f"composite {clip_id}: unknown part {part!r}")
            found.append(("silence", (sigma * rng.standard_normal(round(seconds * RATE))).astype(np.float32)))
    return found


def stream(sample: tuple) -> np.ndarray:
    """The composite's whole audio, float32 (1, N)."""
    return np.concatenate([a for _, a in _pieces(sample)])[None].astype(np.float32)


def placements(sample: tuple) -> list[tuple[str, int, int]]:
    """(clip id, first sample, end sample) of each speech clip in the composite's stream."""
    found, at = [], 0
    for name, audio in _pieces(sample):
        if name != "silence":
            found.append((name, at, at + len(audio)))
        at += len(audio)
    return found


# --------------------------------------------------------------------------------------------- the segmenter

def segments(probs, n_samples: int, threshold: float = THRESHOLD, neg_threshold: float = NEG_THRESHOLD,
             min_speech_ms: int = MIN_SPEECH_MS, min_silence_ms: int = MIN_SILENCE_MS,
             speech_pad_ms: int = SPEECH_PAD_MS) -> list[tuple[int, int]]:
    """[(start, end)] in samples: speech opens at a chunk >= threshold and closes once the probability has
    stayed below neg_threshold for min_silence_ms (a chunk back at >= threshold cancels the closing); segments
    of min_speech_ms or less are dropped; each side is padded by speech_pad_ms, a gap shorter than two pads
    being split between its neighbours."""
    min_speech, min_silence = RATE * min_speech_ms // 1000, RATE * min_silence_ms // 1000
    pad = RATE * speech_pad_ms // 1000
    found, start, quiet_from = [], None, None
    for i, p in enumerate(probs):
        at = i * CHUNK
        if p >= threshold:
            quiet_from = None
            if start is None:
                start = at
        elif start is not None and p < neg_threshold:
            quiet_from = at if quiet_from is None else quiet_from
            if at - quiet_from >= min_silence:
                if quiet_from - start > min_speech:
                    found.append([start, quiet_from])
                start = quiet_from = None
    if start is not None and n_samples - start > min_speech:
        found.append([start, n_samples])
    for k, seg in enumerate(found):
        if k == 0:
            seg[0] = max(0, seg[0] - pad)
        if k + 1 < len(found):
            gap = found[k + 1][0] - seg[1]
            grow = gap // 2 if gap < 2 * pad else pad
            seg[1] += grow
            found[k + 1][0] = max(0, found[k + 1][0] - grow)
        else:
            seg[1] = min(n_samples, seg[1] + pad)
    return [tuple(s) for s in found]


# --------------------------------------------------------------------------------------- evaluation, checks

def evaluate_stream(run, sample: tuple, calls: list) -> dict:
    """The per-call speech probabilities of one backend's loop over the clip and the segments found in them."""
    n = stream(sample).shape[1]
    probs = [float(np.asarray(out["output"]).ravel()[0]) for _, out in calls]
    found = segments(probs, n)
    return {"samples": n, "calls": len(calls), "probs": probs,
            "segments": [{"start": s, "end": e, "start_s": round(s / RATE, 3), "end_s": round(e / RATE, 3)}
                         for s, e in found]}


def agree(ref: dict, got: dict, metric: dict) -> tuple[dict, list[str]]:
    """Per clip: the same number of segments, each start/end within max_boundary_chunks chunks of the
    reference's, every call's probability within max_prob_abs (parity_max_prob_abs for the parity tier:
    PyTorch vs CPU ONNX, fp32 both). The record also gives how close the reference came to a threshold
    (threshold_margin: a probability error that large could move a boundary)."""
    max_chunks = int(metric.get("max_boundary_chunks", 1))
    parity = metric.get("tier") == "parity" and "parity_max_prob_abs" in metric
    key = "parity_max_prob_abs" if parity else "max_prob_abs"
    max_prob = float(metric.get(key, 0.05))
    clips, failures = {}, []
    for clip_id, r in ref.items():
        g = got.get(clip_id)
        if g is None or len(g["probs"]) != len(r["probs"]):
            what = "no result" if g is None else f"{len(g['probs'])} calls"
            failures.append(f"{clip_id}: {what}, reference {len(r['probs'])} calls")
            continue
        diff = np.abs(np.asarray(r["probs"]) - np.asarray(g["probs"]))
        peak = int(np.argmax(diff))
        rs, gs = [(s["start"], s["end"]) for s in r["segments"]], [(s["start"], s["end"]) for s in g["segments"]]
        probs = np.asarray(r["probs"])
        rec = {"segments": [len(rs), len(gs)], "max_prob_abs": float(diff[peak]), "peak_call": peak,
               "p99_prob_abs": float(np.percentile(diff, 99)),
               "threshold_margin": float(np.abs(probs[:, None] - [THRESHOLD, NEG_THRESHOLD]).min())}
        if len(rs) != len(gs):
            unmatched = [f"{a / RATE:.2f}-{b / RATE:.2f} s" for a, b in rs
                         if not any(a < d and c < b for c, d in gs)]
            extra = [f"{c / RATE:.2f}-{d / RATE:.2f} s" for c, d in gs if not any(a < d and c < b for a, b in rs)]
            failures.append(f"{clip_id}: {len(gs)} speech segments, reference {len(rs)}"
                            + (f"; missing {', '.join(unmatched)}" if unmatched else "")
                            + (f"; extra {', '.join(extra)}" if extra else ""))
        else:
            shifts = [abs(x - y) for a, b in zip(rs, gs) for x, y in zip(a, b)]
            worst = max(shifts, default=0)
            rec["max_boundary_chunks"] = worst / CHUNK
            if worst > max_chunks * CHUNK:
                k = shifts.index(worst)
                side, seg = ("start", "end")[k % 2], k // 2
                failures.append(f"{clip_id}: segment {seg + 1} {side} at {gs[seg][k % 2] / RATE:.3f} s, reference "
                                f"{rs[seg][k % 2] / RATE:.3f} s: moved {worst / CHUNK:.2f} chunks > {max_chunks}")
        if diff[peak] > max_prob:
            failures.append(f"{clip_id}: speech probability differs by {diff[peak]:.3g} at call {peak} "
                            f"({r['probs'][peak]:.4f} -> {g['probs'][peak]:.4f}; > {key} {max_prob})")
        clips[clip_id] = rec
    n = len(clips)
    same = sum(1 for c in clips.values() if c["segments"][0] == c["segments"][1])
    err = max((c["max_prob_abs"] for c in clips.values()), default=0.0)
    shift = max((c.get("max_boundary_chunks", 0.0) for c in clips.values()), default=0.0)
    margin = min((c["threshold_margin"] for c in clips.values()), default=0.0)
    record = {"summary": f"segments same count {same}/{n}, boundary shift max {shift:g} chunks, prob err {err:.3g}",
              "clips": clips, "max_prob_abs": err, "max_boundary_chunks": shift, "threshold_margin_min": margin,
              "settings": {key: max_prob, "max_boundary_chunks": max_chunks, "tier": metric.get("tier")}}
    return record, failures
