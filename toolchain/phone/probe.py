"""What the phone reports, parsed (getprop, /proc/<pid>/stat, toybox `top -H`, `dumpsys battery`,
`dumpsys thermalservice`), and a process sampled every few seconds."""
from __future__ import annotations

import re
import time

PROPS = {
    "model": "ro.product.model",
    "manufacturer": "ro.product.manufacturer",
    "soc_model": "ro.soc.model",
    "soc_manufacturer": "ro.soc.manufacturer",
    "android": "ro.build.version.release",
    "sdk": "ro.build.version.sdk",
    "fingerprint": "ro.build.fingerprint",
}
# PowerManager.THERMAL_STATUS_*
THERMAL = ("none", "light", "moderate", "severe", "critical", "emergency", "shutdown")


def parse_getprop(text: str) -> dict[str, str]:
    """`getprop` lines '[key]: [value]'."""
    return dict(re.findall(r"^\[([^\]]+)\]: \[(.*)\]\s*$", text, re.M))


def device_info(adb) -> dict:
    props = parse_getprop(adb.shell("getprop"))
    return {key: props.get(prop) for key, prop in PROPS.items()}


def parse_stat(line: str) -> dict:
    """/proc/<pid>/stat: the name is in parentheses and may hold spaces, so split after
    the last ')'."""
    head, _, rest = line.strip().rpartition(")")
    pid, _, comm = head.partition(" (")
    fields = rest.split()  # fields[0] is field 3 (state) of proc(5)
    return {
        "pid": int(pid),
        "comm": comm,
        "state": fields[0],
        "utime": int(fields[11]),
        "stime": int(fields[12]),
        "threads": int(fields[17]),
        "starttime": int(fields[19]),
    }


def parse_top_threads(text: str) -> list[dict]:
    """Rows of toybox `top -H -b -n 1 -p <pid>`: header 'TID USER PR NI VIRT RES SHR S[%CPU] %MEM
    TIME+ THREAD PROCESS' (the brackets mark the sort column); thread names may hold spaces."""
    lines = text.splitlines()
    at = next(
        (i for i, line in enumerate(lines) if "%CPU" in line and ("TID" in line or "PID" in line)),
        None,
    )
    if at is None:
        return []
    header = lines[at].replace("[", " ").replace("]", " ").split()
    cpu, thread = header.index("%CPU"), header.index("THREAD")
    rows = []
    for line in lines[at + 1:]:
        cells = line.split()
        if len(cells) < len(header) or not cells[0].isdigit():
            continue
        name_and_process = line.split(None, thread)[thread].rsplit(None, 1)
        rows.append({"tid": int(cells[0]), "cpu": float(cells[cpu]), "thread": name_and_process[0]})
    return rows


def parse_battery(text: str) -> dict:
    """`dumpsys battery`: level/scale in %, temperature in 0.1 degC, voltage in mV, charge
    counter in uAh."""
    kv = dict(re.findall(r"^\s*([A-Za-z][A-Za-z ]*?):\s*(\S.*?)\s*$", text, re.M))

    def number(key: str) -> int | None:
        return int(kv[key]) if key in kv and re.fullmatch(r"-?\d+", kv[key]) else None

    return {
        "level": number("level"),
        "scale": number("scale"),
        "temperature_c": (number("temperature") or 0) / 10,
        "voltage_mv": number("voltage"),
        "charge_counter_uah": number("Charge counter"),
        "status": number("status"),
        "powered": [
            k for k in ("AC powered", "USB powered", "Wireless powered") if kv.get(k) == "true"
        ],
    }


def parse_thermal(text: str) -> dict:
    """`dumpsys thermalservice`: the status (0 none .. 6 shutdown) and the HAL's
    current temperatures."""
    m = re.search(r"Thermal Status:\s*(\d+)", text)
    status = int(m.group(1)) if m else None
    current = (
        text.split("Current temperatures from HAL:")[-1]
        if "Current temperatures from HAL:" in text
        else ""
    )
    temps = {
        name: float(value)
        for value, name in re.findall(r"mValue=([-\d.]+), mType=-?\d+, mName=([^,]+),", current)
    }
    return {
        "status": status,
        "status_name": THERMAL[status] if status is not None and status < len(THERMAL) else None,
        "temperatures_c": temps,
    }


def clock_ticks(adb) -> tuple[int, str]:
    """USER_HZ of the phone's kernel, as /proc/<pid>/stat counts; (100, why) if the
    phone cannot say."""
    rc, out = adb.try_shell("getconf CLK_TCK")
    if rc == 0 and out.strip().isdigit():
        return int(out.strip()), "getconf CLK_TCK"
    return 100, "assumed: getconf failed"


def sample(adb, pid: int, interval: float, done=lambda: False, limit: float = 1e9) -> list[dict]:
    """Every `interval` s: the process's ticks and its threads' %CPU, until it exits, done()
    or `limit` s."""
    found, started = [], time.monotonic()
    while time.monotonic() - started < limit:
        at = time.monotonic() - started
        rc, out = adb.try_shell(f"cat /proc/{pid}/stat && top -H -b -n 1 -p {pid}")
        if rc != 0 or not out.strip():
            break   # the process is gone
        first, _, rest = out.partition("\n")
        found.append({"t": round(at, 3), **parse_stat(first), "top": parse_top_threads(rest)})
        if done():
            break
        time.sleep(max(0.0, interval - (time.monotonic() - started - at)))
    return found


def summary(samples: list[dict], clk_tck: int) -> dict:
    """Cores kept busy (ticks / USER_HZ / wall), its spread, and each thread's mean
    %CPU from top."""
    if len(samples) < 2:
        return {
            "samples": len(samples),
            "note": "fewer than 2 samples: the process ended too soon to measure",
        }
    first, last = samples[0], samples[-1]
    wall = last["t"] - first["t"]
    ticks = lambda s: s["utime"] + s["stime"]   # noqa: E731
    steps = [(ticks(b) - ticks(a)) / clk_tck / (b["t"] - a["t"])
             for a, b in zip(samples, samples[1:]) if b["t"] > a["t"]]
    threads: dict = {}
    for s in samples:
        for row in s["top"]:
            threads.setdefault(row["tid"], {"thread": row["thread"], "cpu": []})["cpu"].append(
                row["cpu"]
            )
    per_thread = sorted(
        (
            {
                "tid": tid,
                "thread": t["thread"],
                "mean_cpu_pct": round(sum(t["cpu"]) / len(samples), 1),
            }
            for tid, t in threads.items()
        ),
        key=lambda r: -r["mean_cpu_pct"],
    )
    mean = sum(steps) / len(steps) if steps else 0.0
    spread = (sum((x - mean) ** 2 for x in steps) / len(steps)) ** 0.5 / mean if mean else 0.0
    return {"samples": len(samples), "wall_s": round(wall, 3),
            "cpu_s": round((ticks(last) - ticks(first)) / clk_tck, 3),
            "mean_cores": round(mean, 3), "cores_spread": round(spread, 3), "threads": per_thread}


def state(adb) -> dict:
    """Battery and thermal state now."""
    return {"battery": parse_battery(adb.shell("dumpsys battery")),
            "thermal": parse_thermal(adb.shell("dumpsys thermalservice"))}
