"""models/silero_vad_npu.py (Silero VAD 6.2.3, 16 kHz): our plain module against the package's
TorchScript, the build's own chunk loop (toolchain/shared/stream.py, as the spec declares it)
against silero's own stateful wrapper, the segmenter and agree(). No simulator."""
import copy
import hashlib
import tomllib
from importlib import metadata

import numpy as np
import pytest
import torch
from conftest import ROOT

from toolchain import spec as specs
from toolchain.engine.run.worker import load_module
from toolchain.shared import stream as streams
from toolchain.shared.iorecord import io_record
from toolchain.spec import chips

SPEC = ROOT / "models/silero-vad.toml"
DATA = str(ROOT / "models/data/speech-en")


@pytest.fixture(scope="module")
def vad():
    return load_module(str(ROOT / "models/silero_vad_npu.py"))


@pytest.fixture(scope="module")
def jit():
    return str(metadata.distribution("silero-vad").locate_file("silero_vad/data/silero_vad.jit"))


@pytest.fixture(scope="module")
def short(vad):
    return {s[0]: s for s in vad.samples(DATA)}["pauses-short"]


@pytest.fixture(scope="module")
def run(vad, jit):
    return vad.torch_runner(jit)


@pytest.fixture(scope="module")
def graph():
    return specs.load(SPEC, chips.load()).graph("vad")


def loop(vad, graph, run, sample=None, audio=None):
    """The build's own loop over a clip (or given audio): (feeds, outputs) of every call."""
    io = io_record(graph)
    if audio is None:
        pieces = streams.pieces(vad, sample, dict(graph.stream), io, "silero_vad_npu.py")
    else:
        pieces = streams.cut(audio, dict(graph.stream), (1, 576), "float32", "test")
    return streams.loop(run, "vad", pieces, dict(graph.stream), dict(graph.state), io["inputs"])


def evaluate(vad, graph, run, sample):
    return {sample[0]: vad.evaluate_stream(run, sample, loop(vad, graph, run, sample))}


def test_the_spec_pins_the_installed_torchscript_and_names_the_short_clip(vad, jit):
    spec = tomllib.loads(SPEC.read_text())
    assert spec["checkpoint"]["package"] == f"silero-vad=={metadata.version('silero-vad')}"
    with open(jit, "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == spec["checkpoint"]["sha256"]
    assert spec["verify"]["clips"] == ["pauses-short"]
    model = specs.load(SPEC, chips.load())
    (graph,) = model.graphs
    assert dict(graph.stream) == {"input": "input", "axis": 1, "chunk": vad.CHUNK, "hop": vad.CHUNK,
                                  "context": vad.CONTEXT}
    assert dict(graph.state) == {"stateN": "state"} and set(graph.checks) == {"output", "stateN"}


def test_the_plain_module_equals_the_torchscript_16k_branch_on_real_chunks(
    vad, jit, run, short, graph
):
    scripted = torch.jit.load(jit)._model
    calls = loop(vad, graph, run, short)
    probs = [float(out["output"][0, 0]) for _, out in calls]
    assert max(probs) > 0.9 and min(probs) < 0.05  # the chunks cover speech and pauses
    extra = [
        {"input": (16 * f["input"]).astype(np.float32), "state": f["state"]}
        for f, _ in calls[40:44]
    ]
    # digital silence
    extra.append({"input": np.zeros((1, 576), np.float32), "state": calls[50][0]["state"]})
    worst_p = worst_s = 0.0
    for feeds in [f for f, _ in calls] + extra:
        ours = run("vad", feeds)
        with torch.no_grad():
            p, s = scripted(torch.from_numpy(feeds["input"]), torch.from_numpy(feeds["state"]))
        worst_p = max(worst_p, float(np.abs(ours["output"] - p.numpy()).max()))
        # the cell state grows to ~25 here: its error is fp32 rounding relative to that
        worst_s = max(
            worst_s,
            float((np.abs(ours["stateN"] - s.numpy()) / np.maximum(1, np.abs(s.numpy()))).max()),
        )
    assert worst_p < 1e-5, worst_p
    assert worst_s < 1e-5, worst_s


def test_the_builds_loop_is_silero_s_own_wrapper_convention(vad, jit, run, short, graph):
    """The declared geometry (call i reads [i*512 - 64, i*512 + 512), stateN fed back) is what
    silero's stateful model does with 512-sample chunks (its context and state kept inside)."""
    model = torch.jit.load(jit)
    model.reset_states()
    audio = vad.stream(short)[:, :60 * vad.CHUNK]
    ours = [float(out["output"][0, 0]) for _, out in loop(vad, graph, run, audio=audio)]
    with torch.no_grad():
        theirs = [float(model(torch.from_numpy(audio[:, i:i + vad.CHUNK].copy()), 16000)[0, 0])
                  for i in range(0, audio.shape[1], vad.CHUNK)]
    assert np.abs(np.asarray(ours) - theirs).max() < 1e-5


def test_the_declared_geometry_cuts_the_stream_with_zeros_outside(graph):
    audio = np.arange(1, 1201, dtype=np.float32)[None]      # 1200 samples: 3 calls
    pieces = streams.cut(audio, dict(graph.stream), (1, 576), "float32", "test")
    assert len(pieces) == 3 and all(p.shape == (1, 576) for p in pieces)
    # zeros before the start
    assert not pieces[0][0, :64].any() and pieces[0][0, 64] == 1
    assert pieces[1][0, 0] == 512 - 64 + 1 and pieces[2][0, 64 + 1200 - 1024 - 1] == 1200
    # zeros after the end
    assert not pieces[2][0, 64 + 1200 - 1024:].any()


def test_the_segmenter_merges_short_gaps_drops_short_speech_and_pads(vad):
    probs = [0.0] * 10 + [0.9] * 20 + [0.1] * 2 + [0.9] * 20 + [0.0] * 30 + [0.9] * 5 + [0.0] * 20
    n = len(probs) * vad.CHUNK
    pad = 480    # 30 ms
    # a 64 ms gap (< min_silence 100 ms) is bridged; 160 ms of speech (< min_speech 250
    # ms) is dropped
    assert vad.segments(probs, n) == [(10 * 512 - pad, 52 * 512 + pad)]
    # a probability between neg_threshold and threshold neither opens nor closes a segment
    assert vad.segments([0.0] * 5 + [0.4] * 20 + [0.0] * 10, 35 * 512) == []
    assert vad.segments([0.9] * 20 + [0.4] * 30 + [0.0] * 10, 60 * 512) == [(0, 50 * 512 + pad)]
    # speech to the end of the stream ends there
    assert vad.segments([0.0] * 5 + [0.9] * 20, 25 * 512 - 100) == [(5 * 512 - pad, 25 * 512 - 100)]
    # two segments one chunk (32 ms, < two pads) apart split the gap between them
    two = [0.0] * 5 + [0.9] * 10 + [0.0] + [0.9] * 10 + [0.0] * 10
    assert vad.segments(two, len(two) * 512, min_silence_ms=0) == [(5 * 512 - pad, 15 * 512 + 256),
                                                                  (15 * 512 + 256, 26 * 512 + pad)]


@pytest.mark.parametrize("clip", ["pauses-short", "pauses-tight"])
def test_the_segmenter_finds_the_speech_where_the_clips_were_placed(vad, run, clip, graph):
    sample = {s[0]: s for s in vad.samples(DATA)}[clip]
    found = evaluate(vad, graph, run, sample)[clip]["segments"]
    placed = vad.placements(sample)
    assert len(placed) >= 2 and found
    # each segment inside one clip, within a chunk (the clips keep their own short silences)
    for seg in found:
        inside = [
            c for c, a, b in placed if seg["start"] >= a - vad.CHUNK and seg["end"] <= b + vad.CHUNK
        ]
        assert len(inside) == 1, (seg, placed)
    for c, a, b in placed:   # and every clip is found
        assert any(seg["start"] < b and seg["end"] > a for seg in found), (c, found)


def test_the_tensor_check_takes_a_few_calls_of_the_builds_loop_with_its_states(
    vad, run, short, graph
):
    """No graph_feeds in the module: the per-call check's feeds are 6 calls spread over
    the CPU loop."""
    io = {"vad": io_record(graph)}
    declared = {"vad": {"geometry": dict(graph.stream), "state": dict(graph.state)}}
    feeds = streams.tensor_feeds(vad, run, short, io, declared, "silero_vad_npu.py")["vad"]
    assert len(feeds) == 6
    assert not feeds[0]["state"].any() and feeds[-1]["state"].any()
    probs = [float(run("vad", f)["output"][0, 0]) for f in feeds]
    assert max(probs) > vad.THRESHOLD and min(probs) < vad.NEG_THRESHOLD


def test_agree_names_a_moved_boundary_a_missing_segment_and_a_probability(vad, run, short, graph):
    metric = {"max_boundary_chunks": 1, "max_prob_abs": 0.02, "tier": "default"}
    ref = evaluate(vad, graph, run, short)
    assert len(ref["pauses-short"]["segments"]) == 3
    record, failures = vad.agree(ref, copy.deepcopy(ref), metric)
    assert failures == [] and record["summary"].startswith("segments same count 1/1")

    within = copy.deepcopy(ref)
    within["pauses-short"]["segments"][1]["start"] += vad.CHUNK      # exactly one chunk: allowed
    assert vad.agree(ref, within, metric)[1] == []

    moved = copy.deepcopy(ref)
    moved["pauses-short"]["segments"][1]["start"] += 3 * vad.CHUNK
    (failure,) = vad.agree(ref, moved, metric)[1]
    assert (
        failure.startswith("pauses-short: segment 2 start") and "moved 3.00 chunks > 1" in failure
    )

    missing = copy.deepcopy(ref)
    gone = missing["pauses-short"]["segments"].pop(0)
    (failure,) = vad.agree(ref, missing, metric)[1]
    assert failure.startswith("pauses-short: 2 speech segments, reference 3")
    assert f"missing {gone['start'] / 16000:.2f}-{gone['end'] / 16000:.2f} s" in failure

    off = copy.deepcopy(ref)
    off["pauses-short"]["probs"][17] += 0.05
    (failure,) = vad.agree(ref, off, metric)[1]
    assert (
        "pauses-short: speech probability differs by 0.05 at call 17" in failure
        and "max_prob_abs 0.02" in failure
    )
    # the parity tier holds PyTorch and the CPU ONNX to their own, tighter bound
    slight = copy.deepcopy(ref)
    slight["pauses-short"]["probs"][17] += 1e-3
    assert vad.agree(ref, slight, {**metric, "tier": "parity", "parity_max_prob_abs": 1e-4})[1]
    assert not vad.agree(ref, slight, metric)[1]
