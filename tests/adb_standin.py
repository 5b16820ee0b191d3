"""A scripted `adb` for the tests: one phone (or none, or an unauthorized one) that answers in the
formats real phones print (getprop, /proc/<pid>/stat, toybox `top -H`, `dumpsys battery`, `dumpsys
thermalservice`) and fails with adb's own words. The samples are realistic, written for these tests:
not captured from a device. The phone's /data lives in <state>/fs; other shell commands run locally
with that path mapped, so the pushed runner really runs. Knobs: <state>/config.json; every call is
appended to <state>/calls.jsonl."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

PROPS = {
    "ro.build.fingerprint":
        "samsung/pa3qxxx/pa3q:15/AP3A.240905.015.A2/S938BXXU1AYA5:user/release-keys",
    "ro.build.version.release": "15",
    "ro.build.version.sdk": "35",
    "ro.product.manufacturer": "samsung",
    "ro.product.model": "SM-S938B",
    "ro.soc.manufacturer": "QTI",
    "ro.soc.model": "SM8750",
}
BATTERY = """Current Battery Service state:
  AC powered: false
  USB powered: {usb}
  Wireless powered: false
  Dock powered: false
  Max charging current: 0
  Max charging voltage: 0
  Charge counter: {counter}
  status: {status}
  health: 2
  present: true
  level: {level}
  scale: 100
  voltage: 4213
  temperature: 301
  technology: Li-ion
"""
THERMAL = """IsStatusOverride: false
ThermalEventListeners:
\tcallbacks: 2
\tkilled: false
\tbroadcasts count: -1
ThermalStatusListeners:
\tcallbacks: 2
\tkilled: false
\tbroadcasts count: -1
Thermal Status: {status}
Cached temperatures:
\tTemperature{{mValue=30.1, mType=3, mName=skin-therm, mStatus=0}}
HAL Ready: true
HAL connection:
\tThermalHAL AIDL 1  connected: yes
Current temperatures from HAL:
\tTemperature{{mValue=31.5, mType=2, mName=battery, mStatus=0}}
\tTemperature{{mValue=38.2, mType=0, mName=cpu-0-0-0, mStatus=0}}
\tTemperature{{mValue=30.1, mType=3, mName=skin-therm, mStatus=0}}
Current cooling devices from HAL:
\tCoolingDevice{{mValue=0, mType=2, mName=cpu-cluster0}}
"""
TOP_HEAD = """Threads: {n} total,   1 running,   {idle} sleeping,   0 stopped,   0 zombie
  Mem:  11374640K total, 10712780K used,   661860K free,    10240K buffers
 Swap:  8388604K total,  1946220K used,  6442384K free,  4116416K cached
800%cpu 210%user   0%nice  32%sys 552%idle   0%iow   6%irq   0%sirq   0%host
  TID USER         PR  NI VIRT  RES  SHR S[%CPU] %MEM     TIME+ THREAD          PROCESS
"""
STAT = (
    "{pid} ({comm}) S 1093 1093 0 0 -1 1077936448 51234 0 12 0 {utime} {stime} 0 0 10 -10 "
    "{threads} 0 123456 "
    "7318474752 61234 18446744073709551615 0 0 0 0 0 0 4612 1 1073775864 0 0 0 17 6 0 0 0 0 0 0 0 "
    "0 0 0 0 0 0"
)
NO_DEVICE = "adb: no devices/emulators found\n"
UNAUTHORIZED = ("adb: device unauthorized.\nThis adb server's $ADB_VENDOR_KEYS is not set\n"
                "Try 'adb kill-server' if that seems wrong.\n"
                "Otherwise check for a confirmation dialog on your device.\n")


def install(bin_dir: Path, state: Path, **config) -> Path:
    """Put `adb` on bin_dir, its state in `state`; config: devices [[serial, state]], props,
    push_error, usb_powered, processes {pid: {comm, threads: [[tid, name, pct]], calls, ticks}}."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    (state / "fs").mkdir(parents=True, exist_ok=True)
    script = bin_dir / "adb"
    script.write_text(
        f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        f"import adb_standin\nsys.exit(adb_standin.main({str(state)!r}, sys.argv[1:]))\n"
    )
    script.chmod(0o755)
    configure(
        state,
        **{"devices": [["R5CY71ABCDE", "device"]], "props": PROPS, "usb_powered": True, **config},
    )
    return script


def configure(state: Path, **changes) -> None:
    path = state / "config.json"
    config = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps({**config, **changes}))


def calls(state: Path) -> list[list[str]]:
    path = state / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def main(state: str, argv: list[str]) -> int:
    root = Path(state)
    config = json.loads((root / "config.json").read_text())
    with open(root / "calls.jsonl", "a") as f:
        f.write(json.dumps(argv) + "\n")
    if argv == ["devices"]:
        rows = "".join(f"{s}\t{st}\n" for s, st in config["devices"])
        sys.stdout.write(f"List of devices attached\n{rows}\n")
        return 0
    serial = argv[1] if argv[:1] == ["-s"] else os.environ.get("ANDROID_SERIAL")
    args = argv[2:] if argv[:1] == ["-s"] else argv
    states = dict(config["devices"])
    if serial is None and len(states) != 1:
        return _fail(NO_DEVICE if not states else "adb: more than one device/emulator\n")
    serial = serial or next(iter(states))
    if serial not in states:
        return _fail(f"adb: device '{serial}' not found\n")
    if states[serial] == "unauthorized":
        return _fail(UNAUTHORIZED)
    if states[serial] == "offline":
        return _fail("adb: device offline\n")
    fs = root / "fs"
    if args[0] == "push":
        return _push(config, fs, args[1], args[2])
    if args[0] == "pull":
        return _pull(fs, args[1], args[2])
    if args[0] == "shell":
        return _shell(root, config, fs, " ".join(args[1:]))
    return _fail(f"adb: unknown command {args[0]}\n")


def _fail(text: str, rc: int = 1) -> int:
    sys.stderr.write(text)
    return rc


def _push(config, fs: Path, local: str, remote: str) -> int:
    if config.get("push_error"):
        return _fail(
            f"adb: error: failed to copy '{local}' to '{remote}': {config['push_error']}\n"
        )
    if not os.path.exists(local):
        return _fail(f"adb: error: cannot stat '{local}': No such file or directory\n")
    target = fs / remote.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(local, target)
    size = os.path.getsize(local)
    print(f"{local}: 1 file pushed, 0 skipped. 38.1 MB/s ({size} bytes in 0.001s)")
    return 0


def _pull(fs: Path, remote: str, local: str) -> int:
    source = fs / remote.lstrip("/")
    if not source.exists():
        return _fail(
            f"adb: error: failed to stat remote object '{remote}': No such file or directory\n"
        )
    target = Path(local) / source.name if Path(local).is_dir() else Path(local)   # adb's cp -r rule
    shutil.copytree(source, target) if source.is_dir() else shutil.copy(source, target)
    print(f"{remote}/: 1 file pulled, 0 skipped. 21.3 MB/s")
    return 0


def _shell(root: Path, config, fs: Path, command: str) -> int:
    counter = _bump(root, command) if command.startswith("dumpsys") else 0
    if command == "getprop":
        print("".join(f"[{k}]: [{v}]\n" for k, v in sorted(config["props"].items())), end="")
    elif command.startswith("getprop "):
        print(config["props"].get(command.split()[1], ""))
    elif command == "getconf CLK_TCK":
        print(100)
    elif command == "dumpsys battery":  # 0.5 % and 18 mAh per call, so a drain is visible
        print(
            BATTERY.format(
                usb=str(config["usb_powered"]).lower(),
                status=2 if config["usb_powered"] else 3,
                level=90 - counter // 2,
                counter=3822000 - 18000 * counter,
            ),
            end="",
        )
    elif command == "dumpsys thermalservice":
        print(THERMAL.format(status=min(counter // 4, 2)), end="")
    elif command.startswith("pidof "):
        pids = [
            p
            for p, proc in config.get("processes", {}).items()
            if proc["comm"] == command.split()[1]
        ]
        print(" ".join(pids)) if pids else None
        return 0 if pids else 1
    elif m := re.fullmatch(r"cat /proc/(\d+)/stat( && top -H -b -n 1 -p \d+)?", command):
        return _proc(root, config, m.group(1), bool(m.group(2)))
    else:
        mapped = command.replace("/data/", f"{fs}/data/")
        return subprocess.call(["sh", "-c", mapped], cwd=fs)
    return 0


def _proc(root: Path, config, pid: str, top: bool) -> int:
    """A scripted process (config 'processes') for `calls` samples, or a real local
    one (the runner)."""
    fake = config.get("processes", {}).get(pid)
    if fake:
        n = _bump(root, f"proc-{pid}")
        if n >= fake["calls"]:
            return _fail(f"cat: /proc/{pid}/stat: No such file or directory\n")
        ticks = n * fake["ticks"]
        print(STAT.format(pid=pid, comm=fake["comm"], utime=ticks * 4 // 5, stime=ticks // 5,
                          threads=len(fake["threads"])))
        threads = fake["threads"]
    else:
        try:
            print(Path(f"/proc/{pid}/stat").read_text().strip())
        except OSError:
            return _fail(f"cat: /proc/{pid}/stat: No such file or directory\n")
        threads = [[int(pid), "qnn-net-run", 99.0]]
    if top:
        print(TOP_HEAD.format(n=len(threads), idle=len(threads) - 1), end="")
        for tid, name, pct in threads:
            print(
                f"{tid:>5} u0_a312      10 -10 6.8G 239M 118M R {pct:4.1f}   2.1   1:02.11 "
                f"{name:<15} "
                f"{fake['comm'] if fake else 'qnn-net-run'}"
            )
    return 0


def _bump(root: Path, key: str) -> int:
    """How often `key` was asked before (state kept between the adb processes)."""
    path = root / "counters.json"
    counts = json.loads(path.read_text()) if path.exists() else {}
    counts[key] = counts.get(key, -1) + 1
    path.write_text(json.dumps(counts))
    return counts[key]
