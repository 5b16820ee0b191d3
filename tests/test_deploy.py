"""Deploy (toolchain/deploy): phone bundles from the tiny model through the real pipeline: layout,
licenses, byte-reproducibility, the onnxruntime bundle running in the QNN EP simulator after
unpacking; sherpa-onnx's contract; the chip index and the selector's NPU-or-CPU decisions; the
runtime-library list from an SDK."""
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import sdk_standin as standin
from conftest import ONE_CHIP, Project

from toolchain.compilers.ort_qnn import ep as ort_qnn
from toolchain.deploy import bundle, chip_index, runtime, sherpa_contract, tarball
from toolchain.engine.files import sha256
from toolchain.errors import StageFailed
from toolchain.shared import modeldata

CHIP = "build/tiny/ort-qnn/SM8750"
ORT = f"{CHIP}/bundle/onnxruntime-qnn-SM8750-tiny.tar.bz2"
TOP = "onnxruntime-qnn-SM8750-tiny"


@pytest.fixture(scope="module")
def bundled(tmp_path_factory) -> Project:
    p = Project(tmp_path_factory.mktemp("bundle") / "proj")
    p.add_tiny("tiny", **ONE_CHIP)
    rc, executed, text = p.run("bundle", "chip_index")
    assert rc == 0, text
    assert {
        "runtime:ort-qnn@SM8750",
        "manifest:tiny@SM8750",
        "bundle:tiny@SM8750",
        "chip_index",
    } <= set(executed)
    return p


def test_onnxruntime_bundle_layout_and_licenses(bundled):
    names = tarball.names(bundled.root / ORT)
    assert names[0] == TOP and names[1:] == sorted(names[1:])  # the folder, then members sorted
    assert {
        f"{TOP}/{n}"
        for n in (
            "LICENSE",
            "QNN-RUNTIME-LICENSE.txt",
            "README.md",
            "info.txt",
            "manifest.json",
            "net.onnx",
            "net_qnn.bin",
            "runtime-libraries.json",
        )
    } <= set(names)
    # Qualcomm's terms are referenced, not copied
    assert not [n for n in names if n.endswith(".pdf")]
    top = tarball.extract(bundled.root / ORT, bundled.root.parent / "unpacked-layout")
    assert "License: Apache-2.0" in (top / "LICENSE").read_text()
    qnn = (top / "QNN-RUNTIME-LICENSE.txt").read_text()
    assert "Qualcomm_LICENSE.pdf" in qnn and "libQnnHtpV79Skel.so" in qnn and "';'" in qnn
    assert (
        "soc=SM8750\n" in (top / "info.txt").read_text()
        and "arch=v79\n" in (top / "info.txt").read_text()
    )
    record = json.loads((bundled.root / CHIP / "bundle.json").read_text())
    assert record["bundles"]["onnxruntime"]["sha256"] == sha256(bundled.root / ORT)
    assert record["license"]["name"] == "Apache-2.0"
    assert (
        record["runtime_libraries"]["available"] is False
        and record["runtime_libraries"]["family"] == "2.51"
    )


def test_onnxruntime_bundle_loads_and_runs_in_the_qnn_ep_after_unpacking(bundled, tmp_path):
    # another folder: relative binary paths must hold
    top = tarball.extract(bundled.root / ORT, tmp_path)
    chip = json.loads((top / "manifest.json").read_text())["chip"]
    run = ort_qnn.simulator(str(top / "net.onnx"), ort_qnn.provider_options(chip, 3))
    x = np.random.default_rng(7).standard_normal((1, 4, 16)).astype(np.float32)
    want = modeldata.cpu(str(bundled.root / "build/tiny/net/net.onnx"))({"x": x})["y"]
    got = run({"x": x})["y"]
    assert np.max(np.abs(got - want)) / np.max(np.abs(want)) < 0.02


def test_bundles_are_byte_reproducible(bundled, tmp_path):
    before = sha256(bundled.root / ORT)
    (bundled.root / ORT).unlink()   # a missing target reruns the task, with the same inputs
    rc, executed, _ = bundled.run("bundle")
    assert rc == 0 and executed == ["bundle:tiny@SM8750"]
    assert sha256(bundled.root / ORT) == before
    members = {"b.txt": b"b", "a/c.bin": bundled.root / CHIP / "net_qnn.bin"}
    tarball.write(tmp_path / "1.tar.bz2", "x", members)
    # a newer mtime on disk changes nothing in the archive
    (bundled.root / CHIP / "net_qnn.bin").touch()
    tarball.write(tmp_path / "2.tar.bz2", "x", dict(reversed(members.items())))
    assert sha256(tmp_path / "1.tar.bz2") == sha256(tmp_path / "2.tar.bz2")


def test_second_run_executes_nothing(bundled):
    rc, executed, _ = bundled.run("bundle", "chip_index")
    assert rc == 0 and executed == []


def test_no_sherpa_bundle_when_the_contract_is_not_met_and_the_reason_is_recorded(bundled):
    record = json.loads((bundled.root / CHIP / "bundle.json").read_text())
    assert record["bundles"]["sherpa-onnx"]["shipped"] is False
    reasons = record["bundles"]["sherpa-onnx"]["reasons"]
    assert "match no sherpa-onnx QNN kind of model" in reasons[0]
    assert not list((bundled.root / CHIP / "bundle").glob("sherpa-onnx-*"))
    index = json.loads((bundled.root / "build/chip-index.json").read_text())
    assert index["models"]["tiny"]["SM8750"]["bundles"]["sherpa-onnx"]["path"] is None


WHISPER = {
    "encoder": {
        "inputs": [["mel", [1, 80, 3000], "float32"]],
        "outputs": [
            ["cross_k", [4, 1, 1500, 384], "float32"],
            ["cross_v", [4, 1, 1500, 384], "float32"],
        ],
    },
    "decoder": {
        "inputs": [
            ["token", [1, 1], "int32"],
            ["index", [1], "int32"],
            ["k_cache", [4, 1, 448, 384], "float32"],
            ["v_cache", [4, 1, 448, 384], "float32"],
            ["cross_k", [4, 1, 1500, 384], "float32"],
            ["cross_v", [4, 1, 1500, 384], "float32"],
        ],
        "outputs": [
            ["logits", [1, 1, 51864], "float32"],
            ["k_cache_out", [4, 1, 448, 384], "float32"],
            ["v_cache_out", [4, 1, 448, 384], "float32"],
        ],
    },
}


def sherpa_whisper(p: str, layers: int) -> dict:
    """A decoder/encoder pair in the layout sherpa-onnx's Whisper runtime loads
    (docs/phone.md, the contract)."""
    kv = lambda n, s: [[f"{n}_{k}_{i}", s, "float32"] for i in range(layers) for k in "kv"]  # noqa: E731
    return {
        "encoder": {
            "inputs": [[f"{p}_mel", [1, 3000, 80], "float32"]],
            "outputs": kv("cross", [1, 1500, 384]),
        },
        "decoder": {
            "inputs": [[f"{p}_tokens", [1, 1], "int32"]]
            + [
                t
                for i in range(layers)
                for t in (
                    [
                        [f"{p}_self_k_{i}", [1, 384, 448], "float32"],
                        [f"{p}_self_v_{i}", [1, 384, 448], "float32"],
                        [f"{p}_cross_k_{i}", [1, 384, 1500], "float32"],
                        [f"{p}_cross_v_{i}", [1, 384, 1500], "float32"],
                    ]
                )
            ]
            + [[f"{p}_offset", [1], "int32"], [f"{p}_mask", [448], "int32"]],
            "outputs": [[f"{p}_logits", [1, 1, 51864], "float32"]]
            + kv(f"{p}_this_self", [1, 384, 1]),
        },
    }


def test_sherpa_whisper_contract_names_every_difference_of_our_whisper_graphs():
    kind, found = sherpa_contract.problems("whisper-tiny.en", WHISPER, tokens=False)
    text = "\n".join(found)
    assert kind == "whisper"
    for expected in (
        "does not end in '_mel'",
        "(1, frames, n_mels)",
        "1+4L+2 = 19 for L=4",
        "updated in the graph",
        "this_self_k_0",
        "no tokens.txt",
    ):
        assert expected in text, expected
    # the runtime does not check it
    assert not [f for f in found if "QNNExecutionProvider" in f or "graph name" in f]
    assert sherpa_contract.problems(
        "whisper-tiny.en", sherpa_whisper("tiny_en", 4), tokens=True
    ) == ("whisper", [])
    _, bad = sherpa_contract.problems("w", sherpa_whisper("medium_aishell", 4), tokens=True)
    assert len(bad) == 1 and "names no Whisper model type" in bad[0]


def test_a_sherpa_bundle_ships_only_when_the_binaries_meet_the_contract(bundled, tmp_path):
    """The build step itself, on the tiny binary presented as a zipformer-CTC 'model' graph."""
    root, chip_dir = bundled.root, bundled.root / CHIP
    record = json.loads((chip_dir / "net.compile.json").read_text())
    manifest = json.loads((chip_dir / "manifest.json").read_text())
    manifest["binaries"], manifest["precision"] = (
        {"model": manifest["binaries"]["net"]},
        {"model": "fp16"},
    )
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    module = tmp_path / "ctc.py"
    module.write_text("def write_tokens(path):\n    open(path, 'w').write('<blk> 0\\na 1\\n')\n")
    (tmp_path / "data").mkdir()
    (tmp_path / "data/0.wav").write_bytes(b"RIFF")
    kwargs = {
        "model": "ctc",
        "chip": manifest["chip"],
        "compiler": "ort-qnn",
        "manifest": str(tmp_path / "manifest.json"),
        "runtime": str(root / "build/runtime/ort-qnn/SM8750.json"),
        "module_file": str(module),
        "data_dir": str(tmp_path / "data"),
        "ort_out": None,
        "out": str(tmp_path / "bundle.json"),
        "sherpa_out": str(tmp_path / "sherpa-onnx-qnn-SM8750-binary-ctc.tar.bz2"),
        "plan": {
            "tokens": True,
            "kind": "zipformer-ctc",
            "sherpa_reasons": [],
            "ort_reason": "n/a",
        },
    }
    (tmp_path / "wrong.json").write_text(json.dumps(record))  # as compiled: x [1, 4, 16] -> y
    kwargs["graphs"] = {
        "model": {
            "binary": str(chip_dir / "net_qnn.bin"),
            "record": str(tmp_path / "wrong.json"),
            "context": None,
        }
    }
    with pytest.raises(StageFailed, match="log_probs"):
        bundle.build(**kwargs)
    assert not Path(kwargs["sherpa_out"]).exists()
    record["info"]["graphs"][0]["outputs"][0]["name"] = "log_probs"
    record["info"]["graphs"][0]["outputs"][0]["shape"] = [1, 4, 10]
    (tmp_path / "right.json").write_text(json.dumps(record))
    kwargs["graphs"]["model"]["record"] = str(tmp_path / "right.json")
    bundle.build(**kwargs)
    top = "sherpa-onnx-qnn-SM8750-binary-ctc"
    assert tarball.names(kwargs["sherpa_out"]) == [top, f"{top}/test_wavs"] + [
        f"{top}/{n}"
        for n in (
            "LICENSE",
            "QNN-RUNTIME-LICENSE.txt",
            "README.md",
            "info.txt",
            "manifest.json",
            "model.bin",
            "runtime-libraries.json",
            "test_wavs/0.wav",
            "tokens.txt",
        )
    ]
    shipped = json.loads((tmp_path / "bundle.json").read_text())["bundles"]["sherpa-onnx"]
    assert shipped["shipped"] and shipped["kind"] == "zipformer-ctc"


def test_selector_never_assumes(bundled, tmp_path):
    index = bundled.root / "build/chip-index.json"
    pick = chip_index.select("SM8750\n", True, str(index))
    assert (
        pick.npu
        and pick.bundle.endswith("onnxruntime-qnn-SM8750-tiny.tar.bz2")
        and pick.chip == "SM8750"
    )
    assert pick.sha256 == sha256(bundled.root / ORT)
    cases = {
        ("SM8650", True): "matches no chip built for tiny",
        ("sm8750", True): "matches no chip",
        ("MT6989", True): "matches no chip",
        ("", True): "matches no chip",
        ("SM8750", False): "did not load",
    }
    for (soc, loaded), why in cases.items():
        pick = chip_index.select(soc, loaded, str(index))
        assert pick.bundle == chip_index.CPU and why in pick.reason, (soc, pick)
    assert (
        "no sherpa-onnx bundle"
        in chip_index.select("SM8750", True, str(index), kind="sherpa-onnx").reason
    )
    assert (
        "not in the index"
        in chip_index.select("SM8750", True, str(index), model_name="whisper").reason
    )
    copy = tmp_path / "build"
    shutil.copytree(
        bundled.root / "build", copy, ignore=shutil.ignore_patterns("*.onnx", "*.bin", ".doit*")
    )
    # relative paths travel
    assert chip_index.select("SM8750", True, str(copy / "chip-index.json")).npu
    with open(copy / ORT.removeprefix("build/"), "ab") as f:
        f.write(b"\0")
    assert "sha256" in chip_index.select("SM8750", True, str(copy / "chip-index.json")).reason
    (copy / ORT.removeprefix("build/")).unlink()
    assert "missing" in chip_index.select("SM8750", True, str(copy / "chip-index.json")).reason
    two = json.loads(index.read_text())
    two["models"]["other"] = two["models"]["tiny"]
    assert (
        "holds 2 models"
        in chip_index.select("SM8750", True, two, root=str(bundled.root / "build")).reason
    )


def test_runtime_libraries_from_an_sdk_with_versions_and_a_family_check(tmp_path):
    root = standin.make_sdk(tmp_path / "qairt", build_id="v2.51.0.260929181845")
    for lib in ("lib/aarch64-android/libQnnHtp.so", "lib/hexagon-v79/unsigned/libQnnHtpV79Skel.so"):
        (root / lib).write_bytes(b"\x7fELF...QnnHtp build v2.51.0.260929181845\0...")
    (root / "LICENSE.pdf").write_bytes(b"%PDF terms")
    sdk = {"root": str(root), "build_id": "v2.51.0.260929181845", "build_id_source": "test"}
    chip = {"name": "SM8750", "htp_arch": 79, "soc_model": 69, "vtcm_mb": 8, "fp16": True}
    rec = runtime.record("qairt", chip, sdk, sdk["build_id"])
    assert rec["available"] is True and rec["family"] == "2.51"
    assert [lib["name"] for lib in rec["libraries"]] == [
        "libQnnHtp.so",
        "libQnnSystem.so",
        "libQnnHtpV79Stub.so",
        "libQnnHtpV79Skel.so",
    ]
    assert (
        rec["libraries"][0]["version"] == "v2.51.0.260929181845" and rec["libraries"][0]["sha256"]
    )
    assert rec["license"]["reference"][0]["file"].endswith("LICENSE.pdf")
    (root / "lib/aarch64-android/libQnnSystem.so").write_bytes(b"v2.40.0.251030")
    rec = runtime.record("qairt", chip, sdk, sdk["build_id"])
    assert rec["available"] is False and rec["version_mismatch"] == ["libQnnSystem.so"]
