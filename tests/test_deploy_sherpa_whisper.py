"""Whisper in sherpa-onnx's QNN contract (toolchain/deploy/sherpa_whisper.py): a reduced real
Whisper (tiny.en's weights, 3 s window, 64 cache slots) through the contract export, the read-back,
the sherpa bundle and sherpa-onnx's own host loop driving the unpacked bundle's binaries through the
QNN C API; the loop's bookkeeping against Whisper's own full-sequence decoder; the prefix and
contract checks the runtime makes at load time."""
import hashlib
import json
import shutil
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT, Project, sdk_env, sha256

from toolchain.deploy import sherpa_whisper, tarball
from toolchain.engine.run.worker import load_module
from toolchain.shared import modeldata

sys.path.insert(0, str(Path(__file__).parent / "fixtures"))
import reduced_whisper  # noqa: E402

SPEECH = ROOT / "models/data/speech-en"
CHIP = "build/whisper-tiny.en/ort-qnn/SM8750"
BUNDLE = f"{CHIP}/bundle/sherpa-onnx-qnn-SM8750-binary-whisper-tiny.en.tar.bz2"


@pytest.fixture(scope="module")
def reduced(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("reduced") / "reduced.pt"
    reduced_whisper.make(str(out))
    return out


def _project(root: Path, ckpt: Path, **kw) -> Project:
    p = Project(root)
    models = p.root / "models"
    for name in ("whisper_sherpa.py", "whisper_npu.py"):
        shutil.copy(ROOT / "models" / name, models / name)
    shutil.copy(ckpt, models / "reduced.pt")
    (models / "speech").mkdir()
    shutil.copy(SPEECH / "goforward.wav", models / "speech/goforward.wav")
    refs = [
        line
        for line in (SPEECH / "refs.tsv").read_text().splitlines()
        if line.startswith("goforward\t")
    ]
    (models / "speech/refs.tsv").write_text("\n".join(refs) + "\n")
    (models / "whisper-tiny.en.toml").write_text(reduced_whisper.spec(sha256(ckpt), **kw))
    return p


@pytest.fixture(scope="module")
def whisper_bundled(tmp_path_factory, reduced) -> Project:
    p = _project(tmp_path_factory.mktemp("sherpa") / "proj", reduced)
    rc, executed, text = p.run("sherpa", "chip_index")
    assert rc == 0, text
    assert {"compile:whisper-tiny.en/decoder@SM8750", "bundle:whisper-tiny.en@SM8750",
            "sherpa:whisper-tiny.en@SM8750"} <= set(executed)
    return p


def test_binary_read_back_matches_the_contract(whisper_bundled):
    """Names, dtypes and the shapes libQnnSystem reports for the compiled contexts."""
    enc = json.loads((whisper_bundled.root / CHIP / "encoder.compile.json").read_text())["info"][
        "graphs"
    ][0]
    dec = json.loads((whisper_bundled.root / CHIP / "decoder.compile.json").read_text())["info"][
        "graphs"
    ][0]
    assert [(t["name"], t["shape"], t["dtype"]) for t in enc["inputs"]] == [
        ("tiny_en_mel", [1, 300, 80], "float32")
    ]
    assert [t["name"] for t in enc["outputs"]] == [
        f"cross_{kv}_{i}" for i in range(4) for kv in "kv"
    ]
    assert all(t["shape"] == [1, 150, 384] for t in enc["outputs"])
    ins = {t["name"]: (t["shape"], t["dtype"]) for t in dec["inputs"]}
    assert len(ins) == 1 + 4 * 4 + 2
    assert ins["tiny_en_tokens"] == ([1, 1], "int32") and ins["tiny_en_offset"] == ([1], "int32")
    assert ins["tiny_en_mask"] == ([64], "int32")
    assert (ins["tiny_en_self_k_3"] == ([1, 384, 64], "float32")
            and ins["tiny_en_cross_v_0"] == ([1, 384, 150], "float32"))
    outs = {t["name"]: t["shape"] for t in dec["outputs"]}
    assert outs["tiny_en_logits"] == [1, 1, 51864] and outs["tiny_en_this_self_v_3"] == [1, 1, 384]


def test_sherpa_bundle_layout_and_tokens(whisper_bundled):
    names = tarball.names(whisper_bundled.root / BUNDLE)
    top = "sherpa-onnx-qnn-SM8750-binary-whisper-tiny.en"
    assert {
        f"{top}/{n}"
        for n in (
            "encoder.bin",
            "decoder.bin",
            "tokens.txt",
            "test_wavs/goforward.wav",
            "test_wavs/refs.tsv",
            "info.txt",
            "LICENSE",
            "runtime-libraries.json",
            "manifest.json",
        )
    } <= set(names)
    unpacked = tarball.extract(
        whisper_bundled.root / BUNDLE, whisper_bundled.root.parent / "unpacked"
    )
    table = sherpa_whisper.read_tokens(str(unpacked / "tokens.txt"))
    assert len(table) == 50256 and table[1514] == b" Go"   # gpt2 ranks, base64 in the file
    record = json.loads((whisper_bundled.root / CHIP / "bundle.json").read_text())
    assert (
        record["bundles"]["sherpa-onnx"]["shipped"]
        and record["bundles"]["sherpa-onnx"]["kind"] == "whisper"
    )
    index = json.loads((whisper_bundled.root / "build/chip-index.json").read_text())
    entry = index["models"]["whisper-tiny.en"]["SM8750"]["bundles"]["sherpa-onnx"]
    assert entry["path"] == BUNDLE[len("build/") :] and entry["sha256"] == sha256(
        whisper_bundled.root / BUNDLE
    )


def test_the_imported_model_code_is_a_dependency(whisper_bundled):
    """whisper_sherpa.py imports whisper_npu.py (`uses`): editing it reruns the tasks
    running model code."""
    p = whisper_bundled
    npu = p.root / "models/whisper_npu.py"
    saved = npu.read_text()
    try:
        npu.write_text(saved + "\n# edited\n")
        done = p.doit_cli("list", "--all", "--status")
        assert done.returncode == 0, done.stderr
        stale = {line.split()[1] for line in done.stdout.splitlines() if line.startswith("R ")}
        assert {
            "checkpoint:whisper-tiny.en",
            "export:whisper-tiny.en/encoder",
            "parity:whisper-tiny.en",
            "verify:whisper-tiny.en@SM8750",
            "sherpa:whisper-tiny.en@SM8750",
        } <= stale
        assert "compile:whisper-tiny.en/encoder@SM8750" not in stale   # compile reads only the ONNX
    finally:
        npu.write_text(saved)


def test_runtime_loop_on_the_unpacked_bundle_matches_the_cpu(whisper_bundled):
    record = json.loads((whisper_bundled.root / CHIP / "sherpa-run.json").read_text())
    task = record["task"]
    assert task["identical"] == 1 and task["clips"] == ["goforward"], task
    text = task["transcripts"]["goforward"]
    # real weights: the words come out even at 3 s and 4 layers
    assert "forward" in text.lower(), text
    cost = record["cost"]
    # sherpa's QnnModel buffer: self K/V 2*4*384*64 + cross 2*4*384*150 floats + mask + ints +
    # logits + new K/V
    want = 4 * (2 * 4 * 384 * 64 + 2 * 4 * 384 * 150 + 51864 + 2 * 4 * 384) + 4 * (64 + 2)
    assert cost["decoder_io_bytes_per_call"] == want
    assert cost["sim_seconds_per_decoder_call"] > 0 and cost["decoder_calls"] >= 3


def test_a_changed_binary_is_never_packed(whisper_bundled):
    p = whisper_bundled
    binary = p.root / CHIP / "decoder_qnn.bin"
    saved = binary.read_bytes()
    try:
        data = bytearray(saved)
        data[-100] ^= 0xFF
        binary.write_bytes(bytes(data))
        rc, executed, text = p.run("bundle:whisper-tiny.en@SM8750")
        # rebuilt, then packed
        assert rc == 0 and "compile:whisper-tiny.en/decoder@SM8750" in executed, text
        rebuilt = binary.read_bytes()
        # the compiler's bytes again, never the changed ones (compared with the compile's own
        # record and the bundle's member: this graph's binary is not byte-reproducible across
        # compile processes, see docs/design-card.md, so a fresh compile may differ from the first
        # one in a few bytes)
        assert rebuilt != bytes(data)
        record = json.loads((p.root / CHIP / "decoder.compile.json").read_text())
        assert record["sha256"] == hashlib.sha256(rebuilt).hexdigest()
        with tarfile.open(p.root / BUNDLE) as tar:
            member = next(m for m in tar.getmembers() if m.name.endswith("/decoder.bin"))
            assert tar.extractfile(member).read() == rebuilt
    finally:
        binary.write_bytes(saved)


def test_loop_bookkeeping_against_whispers_own_decoder(reduced):
    """The host loop (mask, offset, cache columns, transposed cross K/V, token cap) over the CPU
    graphs gives the tokens of openai-whisper's full-sequence decoder on the same mel, greedy."""
    module = load_module(str(ROOT / "models/whisper_sherpa.py"))
    settings = {"exporter": "dynamo", "opset": 18, "args": {"prefix": "tiny_en", "layout": "qnn"}}
    folder = reduced.parent
    for g in ("encoder", "decoder"):
        module.export(str(reduced), g, str(folder / f"{g}.onnx"), settings)
    cpu = {g: modeldata.cpu(str(folder / f"{g}.onnx")) for g in ("encoder", "decoder")}
    text = reduced_whisper.spec("0" * 64)
    io = _io(text)
    enc, dec = (
        sherpa_whisper.GraphRun(lambda g, f: cpu[g](f), g, io[g]) for g in ("encoder", "decoder")
    )
    masks, offsets = [], []
    real_set = dec.set_input

    def spy(name, data):
        if name == "tiny_en_mask":
            masks.append(np.array(data))
        if name == "tiny_en_offset":
            offsets.append(int(np.asarray(data)[0]))
        real_set(name, data)
    dec.set_input = spy
    feats = module.features(str(SPEECH / "goforward.wav"))
    tokens = sherpa_whisper.recognize(enc, dec, feats)
    # mask: before call n, exactly slots 0..n-1 are open; offsets 0, 1, 2, ...
    assert offsets == list(range(len(offsets)))
    for n, m in enumerate(masks):
        assert m.tolist() == [0] * n + [1] * (64 - n)
    # cap: "at most 6 tokens per second" of the unpadded clip, positions of the 2
    # SOT tokens included
    cap = min(int(min(len(feats), 300) / 100.0 * 6), 64 // 2)
    assert len(offsets) <= cap and len(tokens) == len(offsets) - 2
    # Whisper's own decoder, whole sequence at each step, same padded mel
    model = module._load(str(reduced))
    mel = np.zeros((300, 80), np.float32)
    mel[:min(len(feats), 300)] = feats[:300]
    with torch.no_grad():
        audio = model.encoder(torch.from_numpy(mel.T[None].copy()))
        seq, want = [50257, 50362], []
        while True:
            logits = model.decoder(torch.tensor([seq]), audio)[0, -1]
            idx = int(torch.argmax(logits))
            if len(seq) >= cap or idx == 50256:
                break
            want.append(idx)
            seq.append(idx)
    assert tokens == want


def test_prefix_parsing_as_the_runtime_does():
    assert sherpa_whisper.parse_prefix("tiny_en_mel") == ("tiny_en", "tiny.en")
    assert sherpa_whisper.parse_prefix("distil_small_en_mel") == ("distil_small_en", "small.en")
    assert sherpa_whisper.parse_prefix("base_mel") == ("base", "base")
    for bad in ("medium_aishell_mel", "tiny.en-mel", "mel_input"):
        with pytest.raises(sherpa_whisper.ContractError):
            sherpa_whisper.parse_prefix(bad)


def test_a_prefix_the_runtime_rejects_is_refused_before_compiling(tmp_path, reduced):
    p = _project(tmp_path / "proj", reduced)
    p.edit("models/whisper-tiny.en.toml", 'prefix = "tiny_en"', 'prefix = "medium_aishell"')
    rc, executed, text = p.run("compile:whisper-tiny.en/encoder@SM8750")
    assert rc != 0 and "medium_aishell" in text and "names no Whisper model type" in text
    assert "Traceback" not in text and "whisper_sherpa.py: export of graph" in text
    assert not [t for t in executed if t.startswith("compile:")]


def test_contract_check_names_the_tensor(reduced):
    io = _io(reduced_whisper.spec("0" * 64))
    io["decoder"]["inputs"] = [t for t in io["decoder"]["inputs"] if t[0] != "tiny_en_self_v_2"]
    enc, dec = (sherpa_whisper.GraphRun(None, g, io[g]) for g in ("encoder", "decoder"))
    with pytest.raises(sherpa_whisper.ContractError, match=r"18 inputs.*1\+4L\+2 = 19"):
        sherpa_whisper.Contract(enc, dec)


def _io(text: str) -> dict:
    import tomllib
    graphs = tomllib.loads(text)["graphs"]
    return {g: {kind: [[n, t["shape"], t["dtype"]] for n, t in graphs[g][kind].items()]
                for kind in ("inputs", "outputs")} for g in graphs}


def test_read_back_mismatch_names_the_tensor_expected_and_found():
    from toolchain.compilers.ort_qnn.compile import io_problems
    want = [["tiny_en_mel", [1, 3000, 80], "float32"]]
    assert io_problems("inputs", [["tiny_en_mel", [1, 3000, 80], "float32"]], want) == []
    found = io_problems("inputs", [["tiny_en_mel", [1, 80, 3000], "float32"]], want)
    assert found == [
        "input tiny_en_mel: expected [1, 3000, 80] float32, found [1, 80, 3000] float32"
    ]
    found = io_problems("inputs", [["tiny.en-mel", [1, 3000, 80], "float32"]], want)
    assert found == ["input tiny_en_mel: expected [1, 3000, 80] float32, not in the binary",
                     "input tiny.en-mel: in the binary, not declared"]


def test_qairt_binaries_read_back_in_the_contract_and_ship(tmp_path, reduced, monkeypatch):
    """compiler = "qairt": sherpa's ONNX layout, the converter (stand-in SDK, tests/sdk_standin.py)
    swaps 3-D inputs; the read-back shows the runtime's layout and the sherpa bundle ships."""
    sdk_env(monkeypatch, tmp_path)
    p = _project(tmp_path / "proj", reduced, layout="onnx", toolchain="qairt")
    rc, executed, text = p.run("bundle:whisper-tiny.en@SM8750")
    assert rc == 0, text
    chip = p.root / "build/whisper-tiny.en/qairt/SM8750"
    enc = json.loads((chip / "encoder.compile.json").read_text())["info"]["graphs"][0]
    dec = json.loads((chip / "decoder.compile.json").read_text())["info"]["graphs"][0]
    assert [(t["name"], t["shape"]) for t in enc["inputs"]] == [("tiny_en_mel", [1, 300, 80])]
    assert {t["name"]: t["shape"] for t in enc["outputs"]}["cross_v_3"] == [1, 150, 384]
    ins = {t["name"]: t["shape"] for t in dec["inputs"]}
    assert ins["tiny_en_self_k_0"] == [1, 384, 64] and ins["tiny_en_cross_k_0"] == [1, 384, 150]
    assert ins["tiny_en_mask"] == [64]
    record = json.loads((chip / "bundle.json").read_text())
    assert record["bundles"]["sherpa-onnx"]["shipped"], record
    onnx_in = json.loads((p.root / "build/whisper-tiny.en/encoder/inspect.json").read_text())["io"][
        "inputs"
    ]
    assert onnx_in[0][1] == [1, 80, 300]   # sherpa's own ONNX layout went into the converter
