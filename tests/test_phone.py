"""The phone (toolchain/phone): device tasks against a scripted adb (tests/adb_standin.py) and a
stand-in device SDK whose qnn-net-run really runs the graph: choice by ro.soc.model, push,
ADSP_LIBRARY_PATH, outputs vs the CPU reference, timing, CPU samples, battery and thermal state;
adb's failures; step 0's verdicts; the parsers."""
import json
import os
import sys
from pathlib import Path

import adb_standin
import pytest
import sdk_standin
from conftest import Project

from toolchain.phone import adb, probe

SERIAL = "R5CY71ABCDE"
# the embedded toolchain's QAIRT: the device SDK must be this family
BUILD_ID = "v2.51.0.260929181845"
RECORD = f"build/tiny/ort-qnn/SM8750/device-{SERIAL}.json"
FAST = ("interval=0.1", "runs=3")
RUNNER = '''#!{python}
"""Stand-in qnn-net-run (aarch64-android): runs the graph's ONNX on the CPU, writes
Result_<i>/<name>.raw."""
import json, os, sys, time
import numpy as np
knobs = json.load(open({knobs!r})) if os.path.exists({knobs!r}) else {{}}
with open({envlog!r}, "a") as f:
    f.write(json.dumps({{"argv": sys.argv[1:], "cwd": os.getcwd(),
                        "adsp": os.environ.get("ADSP_LIBRARY_PATH"),
                        "ld": os.environ.get("LD_LIBRARY_PATH")}}) + "\\n")
args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
if knobs.get("fail_load") or not os.path.exists(args["--backend"]):
    print("qnn-net-run: Failed to create device: QnnDevice_create returned 1008 "
          "(Unable to load Skel)")
    sys.exit(15)
import onnxruntime as ort
s = ort.InferenceSession({onnx!r}[os.path.basename(args["--retrieve_context"])],
                         providers=["CPUExecutionProvider"])
for i, line in enumerate(l for l in open(args["--input_list"]).read().split("\\n") if l.strip()):
    # the input list names paths as the phone sees them
    phone = lambda p: os.getcwd().split("/data/")[0] + p
    feeds = {{t.name: np.fromfile(phone(p), np.float32).reshape(t.shape)
             for t, p in zip(s.get_inputs(), line.split())}}
    out = os.path.join(args["--output_dir"], f"Result_{{i}}")
    os.makedirs(out, exist_ok=True)
    for o, v in zip(s.get_outputs(), s.run(None, feeds)):
        (v * (1 + 1e-4)).astype(np.float32).tofile(os.path.join(out, o.name + ".raw"))
time.sleep(0.4)
'''


@pytest.fixture(scope="module")
def chip_indexed(tmp_path_factory) -> Project:
    p = Project(tmp_path_factory.mktemp("device") / "proj")
    p.add_tiny("tiny", **{'chips = ["SM8550", "SM8750"]': 'chips = ["SM8750"]'})
    rc, _, text = p.run("chip_index")
    assert rc == 0, text
    return p


def device_sdk(root: Path, chip_indexed: Project, build_id: str = BUILD_ID) -> Path:
    sdk = sdk_standin.make_sdk(root, build_id=build_id)
    runner = sdk / "bin/aarch64-android/qnn-net-run"
    runner.parent.mkdir(parents=True)
    runner.write_text(
        RUNNER.format(
            python=sys.executable,
            knobs=str(root / "runner.json"),
            envlog=str(root / "runner.jsonl"),
            onnx={"net_qnn.bin": str(chip_indexed.root / "build/tiny/net/net.onnx")},
        )
    )
    runner.chmod(0o755)
    return sdk


@pytest.fixture(scope="module")
def sdk(chip_indexed, tmp_path_factory) -> Path:
    return device_sdk(tmp_path_factory.mktemp("sdk") / "qairt", chip_indexed)


@pytest.fixture
def phone(tmp_path, monkeypatch) -> Path:
    state = tmp_path / "phone"
    adb_standin.install(tmp_path / "bin", state)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("ANDROID_SERIAL", raising=False)
    monkeypatch.delenv("QNN_SDK_ROOT", raising=False)
    return state


def device(chip_indexed, sdk, *extra):
    return chip_indexed.run("device:tiny", f"sdk={sdk}", *FAST, *extra)


@pytest.mark.parametrize("devices, message", [
    ([], "no phone: adb sees no device"),
    ([[SERIAL, "unauthorized"]], "has not authorized this computer"),
    ([[SERIAL, "offline"]], "the phone is offline"),
    ([[SERIAL, "device"], ["emulator-5554", "device"]], "several phones are attached"),
])
def test_adb_failures_are_one_line_and_write_no_record(chip_indexed, sdk, phone, devices, message):
    adb_standin.configure(phone, devices=devices)
    rc, executed, text = device(chip_indexed, sdk)
    assert rc == 1 and message in text and "Traceback" not in text, text
    assert not (chip_indexed.root / RECORD).exists()


def test_android_serial_picks_the_phone_and_a_wrong_one_says_so(
    chip_indexed, sdk, phone, monkeypatch
):
    adb_standin.configure(phone, devices=[[SERIAL, "device"], ["emulator-5554", "device"]],
                          props={**adb_standin.PROPS, "ro.soc.model": "SM7675"})
    monkeypatch.setenv("ANDROID_SERIAL", "0123456789")
    rc, _, text = device(chip_indexed, sdk)
    assert rc == 1 and "ANDROID_SERIAL names no attached device" in text
    monkeypatch.setenv("ANDROID_SERIAL", "emulator-5554")
    (phone / "calls.jsonl").unlink()
    rc, _, text = device(chip_indexed, sdk)
    assert rc == 0, text
    assert all(
        call[:2] == ["-s", "emulator-5554"]
        for call in adb_standin.calls(phone)
        if call != ["devices"]
    )


def test_an_unknown_chip_is_a_recorded_cpu_fallback(chip_indexed, sdk, phone):
    adb_standin.configure(phone, props={**adb_standin.PROPS, "ro.soc.model": "MT6989"})
    rc, _, text = device(chip_indexed, sdk)
    assert rc == 0, text
    record = json.loads((chip_indexed.root / f"build/tiny/device-{SERIAL}.json").read_text())
    assert (
        record["choice"]["npu"] is False
        and "'MT6989' matches no chip built for tiny" in record["choice"]["reason"]
    )
    assert record["device"]["model"] == "SM-S938B" and record["device"]["android"] == "15"
    assert not [c for c in adb_standin.calls(phone) if "push" in c]


def test_a_push_error_fails_with_adbs_words(chip_indexed, sdk, phone):
    adb_standin.configure(phone, push_error="remote couldn't create file: Read-only file system")
    rc, _, text = device(chip_indexed, sdk)
    assert rc == 1 and "Read-only file system" in text and "adb push" in text


def test_matching_phone_runs_compares_and_measures(chip_indexed, sdk, phone):
    # e.g. adb over Wi-Fi: a drain that means something
    adb_standin.configure(phone, usb_powered=False)
    rc, executed, text = device(chip_indexed, sdk, "minutes=0.02", "input_seconds=0.16")
    assert rc == 0 and executed == ["device:tiny"], text
    record = json.loads((chip_indexed.root / RECORD).read_text())
    assert record["choice"] == {"bundle": record["bundle"], "npu": True, "chip": "SM8750",
                                "reason": "SM8750 = v79 build, sha256 verified, libraries loaded"}
    assert record["device"]["soc_model"] == "SM8750" and record["sdk_build_id"] == BUILD_ID
    net = record["graphs"]["net"]
    assert net["libraries_loaded"] and net["max_rel"] < 1e-3 and net["runs"] == 3
    assert 0 < net["first_output_s"] < 30
    assert net["rtf"] == pytest.approx(net["per_inference_s"] / 0.16, rel=1e-2, abs=1e-3)
    assert net["cpu"]["samples"] >= 2 and net["cpu"]["threads"][0]["thread"] == "qnn-net-run"
    assert net["cpu_path"]["measured"] is False and "ort_perf" in net["cpu_path"]["reason"]
    drain = net["drain"]["npu"]
    assert drain["valid"] and drain["iterations"] >= 1 and drain["level_drop_pct"] >= 0
    assert (
        drain["after"]["battery"]["charge_counter_uah"]
        < drain["before"]["battery"]["charge_counter_uah"]
    )
    assert record["after"]["thermal"]["status_name"] in ("none", "light", "moderate")
    pushed = {Path(c[-1]).name for c in adb_standin.calls(phone) if c[2:3] == ["push"]}
    assert {
        "libQnnHtp.so",
        "libQnnSystem.so",
        "libQnnHtpV79Stub.so",
        "libQnnHtpV79Skel.so",
        "qnn-net-run",
        "net_qnn.bin",
        "x-0.raw",
        "net-all.txt",
    } <= pushed
    env = json.loads((sdk / "runner.jsonl").read_text().splitlines()[-1])
    adsp = env["adsp"].split(";")
    # ';' separators, ours first
    assert adsp[0] == env["cwd"] == env["ld"] and "/vendor/lib/rfsa/adsp" in adsp


def test_libraries_that_do_not_load_are_a_recorded_cpu_fallback(chip_indexed, sdk, phone):
    (sdk / "runner.json").write_text(json.dumps({"fail_load": True}))
    try:
        rc, _, text = device(chip_indexed, sdk)
    finally:
        (sdk / "runner.json").unlink()
    assert rc == 0, text
    record = json.loads((chip_indexed.root / RECORD).read_text())
    assert record["choice"]["npu"] is False and "did not load" in record["choice"]["reason"]
    assert "1008" in record["graphs"]["net"]["log_tail"]


def test_an_sdk_of_another_version_family_is_refused(chip_indexed, phone, tmp_path):
    old = device_sdk(tmp_path / "qairt-2.40", chip_indexed, build_id="v2.40.0.251030")
    rc, _, text = device(chip_indexed, old)
    assert rc == 1 and "use a 2.51 SDK" in text


def test_step0_says_whether_the_npu_is_likely_worth_it(chip_indexed, phone, capsys):
    heavy = [
        [4251, "onnx-worker-0", 96.6],
        [4252, "onnx-worker-1", 93.3],
        [4253, "onnx-worker-2", 91.0],
        [4260, "Jit thread pool", 0.0],
    ]
    adb_standin.configure(
        phone,
        processes={
            "4242": {"comm": "com.example.asr", "calls": 6, "ticks": 150, "threads": heavy},
            "5151": {
                "comm": "com.example.kws",
                "calls": 6,
                "ticks": 8,
                "threads": [[5151, "kws-infer", 61.0]],
            },
        },
    )
    rc, _, text = chip_indexed.run("step0", "process=com.example.asr", "interval=0.3")
    assert rc == 0, text
    record = json.loads(
        (chip_indexed.root / f"build/step0/{SERIAL}-com.example.asr.json").read_text()
    )
    assert record["verdict"] == "likely worth it" and record["numbers"]["mean_cores"] >= 1.5
    printed = capsys.readouterr().out
    assert (
        record["numbers"]["threads"][0]["thread"] == "onnx-worker-0"
        and "Jit thread pool" in printed
    )
    assert "NPU: likely worth it: " in printed
    rc, _, text = chip_indexed.run("step0", "pid=5151", "interval=0.3")
    assert rc == 0 and "NPU: small gain likely" in capsys.readouterr().out, text
    rc, _, text = chip_indexed.run("step0", "process=com.example.none")
    assert rc == 1 and "no process named 'com.example.none'" in text
    rc, _, text = chip_indexed.run("step0", "pid=x")
    assert (
        rc == 3 and "ERROR: command line: pid=x: expected a whole number" in capsys.readouterr().err
    )


def test_device_tasks_are_opt_in(chip_indexed, monkeypatch):
    import runpy
    # doit loads a dodo.py in its folder: build/ and its lock are there
    monkeypatch.chdir(chip_indexed.root)
    assert not {"device", "step0"} & set(runpy.run_path("dodo.py")["DOIT_CONFIG"]["default_tasks"])


def test_parsers_read_the_phone_formats():
    stat = probe.parse_stat(
        "4242 (Thread (1) x) R 1 2 0 0 -1 0 0 0 0 0 170 30 0 0 20 0 9 0 777 0 0"
    )
    assert (stat["comm"], stat["utime"], stat["stime"], stat["threads"], stat["starttime"]) == \
        ("Thread (1) x", 170, 30, 9, 777)
    top = adb_standin.TOP_HEAD.format(n=2, idle=1) + (
        " 4251 u0_a312      10 -10 6.8G 239M 118M R 96.6   2.1   1:02.11 onnx-worker-0   "
        "com.example.asr\n"
        " 4260 u0_a312      16  -4 6.8G 239M 118M S  0.3   2.1   0:00.31 Jit thread pool "
        "com.example.asr\n"
    )
    assert probe.parse_top_threads(top) == [{"tid": 4251, "cpu": 96.6, "thread": "onnx-worker-0"},
                                            {"tid": 4260, "cpu": 0.3, "thread": "Jit thread pool"}]
    battery = probe.parse_battery(
        adb_standin.BATTERY.format(usb="true", status=2, level=87, counter=3822000)
    )
    assert (
        battery["level"],
        battery["temperature_c"],
        battery["charge_counter_uah"],
        battery["powered"],
    ) == (87, 30.1, 3822000, ["USB powered"])
    thermal = probe.parse_thermal(adb_standin.THERMAL.format(status=2))
    assert thermal["status_name"] == "moderate" and thermal["temperatures_c"]["cpu-0-0-0"] == 38.2
    assert "skin-therm" in thermal["temperatures_c"]
    assert probe.parse_getprop("[ro.soc.model]: [SM8650]\n[ro.x]: []\n") == {
        "ro.soc.model": "SM8650",
        "ro.x": "",
    }
    assert "accept the 'Allow USB debugging?'" in adb.explain(adb_standin.UNAUTHORIZED, "adb shell")
    assert adb.explain("error: no devices/emulators found\n", "x").endswith(
        "no phone: adb sees no device; connect one with USB debugging on (`adb devices`)")
