"""Step 0 as a tool (the guide's step 0): sample a phone process running today's CPU path over a
fixed task and say, with the numbers, whether moving it to the NPU is likely worth it."""
from __future__ import annotations

from toolchain import artifacts
from toolchain.engine.files import write_json
from toolchain.errors import StageFailed
from toolchain.phone import adb, probe
from toolchain.phone.phonetask import run_logged
from toolchain.stages import Project

# Our reading of the guide's criteria, as thresholds (heuristics, stated in every verdict).
BUSY_THREAD_PCT = 50.0     # a thread that keeps half a core busy on average does real work
HEAVY_CORES = 1.5          # sustained load beyond one core: large matrix work spread over threads
# per-interval load varies less than this (relative): stable work, not bursts
STABLE_SPREAD = 0.5


def task(project: Project) -> dict:
    """`doit step0 pid=<pid>` or `process=<name>`, optional `seconds=` (fixed task
    length) and `interval=`."""
    settings = {name: project.options[name] for name in SETTINGS}
    return {
        "doc": "step 0 on the phone: pid=<pid> or process=<name> [seconds=<fixed task length>]: "
               "CPU load per "
        "thread and wall time of today's CPU path -> is the NPU likely worth it? (opt-in; needs "
        "adb)",
        "actions": [(run_logged, (measure, {"settings": settings}, artifacts.step0_log()))],
        "uptodate": [False],
        "verbosity": 2,
    }


def measure(settings: dict):
    serial = adb.choose()
    phone = adb.Adb(serial)
    pid = settings["pid"] or _pid_of(phone, settings["process"])
    clk, clk_source = probe.clock_ticks(phone)
    rc, line = phone.try_shell(f"cat /proc/{pid}/stat")
    if rc:
        raise StageFailed(
            f"no process {pid} on {serial}: start the CPU-path task first, then run step0"
        )
    name = settings["process"] or probe.parse_stat(line)["comm"]
    samples = probe.sample(phone, pid, settings["interval"], limit=settings["seconds"] or 1e9)
    numbers = probe.summary(samples, clk)
    verdict, why = judge(numbers)
    record = {
        "serial": serial,
        "device": probe.device_info(phone),
        "pid": pid,
        "process": name,
        "clk_tck": clk,
        "clk_tck_source": clk_source,
        "settings": settings,
        "numbers": numbers,
        "verdict": verdict,
        "why": why,
        "not_judged": "whether the work is matrix work with static shapes (read the model), and "
                      "energy "
        "(run device:<model> minutes=<n> for battery drain NPU vs CPU)",
        "samples": samples,
    }
    out = artifacts.step0_record(serial, name.replace("/", "_"))
    write_json(out, record)
    print(
        f"{name} (pid {pid}) on {record['device']['model']} ({record['device']['soc_model']}): "
        f"{numbers.get('wall_s')} s wall, {numbers.get('cpu_s')} s CPU, "
        f"{numbers.get('mean_cores')} cores busy on "
        f"average (spread {numbers.get('cores_spread')})"
    )
    for row in numbers.get("threads", [])[:8]:
        print(f"  {row['tid']:>7} {row['thread']:<20} {row['mean_cpu_pct']:6.1f} %CPU")
    print(f"NPU: {verdict}: {why}\n-> {out}")


def judge(numbers: dict) -> tuple[str, str]:
    """'likely worth it' / 'small gain likely' / 'unclear', with the reason in numbers."""
    if numbers.get("samples", 0) < 2:
        return "unclear", numbers.get("note", "too few samples")
    busy = [t for t in numbers["threads"] if t["mean_cpu_pct"] >= BUSY_THREAD_PCT]
    cores, spread = numbers["mean_cores"], numbers["cores_spread"]
    said = (
        f"{cores} cores busy on average, {len(busy)} thread(s) >= {BUSY_THREAD_PCT:.0f}% of a "
        "core, "
        f"load spread {spread}"
    )
    if cores >= HEAVY_CORES and len(busy) >= 3 and spread <= STABLE_SPREAD:
        return (
            "likely worth it",
            f"{said}: sustained, stable work over several threads, the kind the NPU takes over",
        )
    if cores < HEAVY_CORES and len(busy) <= 2:
        return (
            "small gain likely",
            f"{said}: a model on 1-2 threads; the NPU's gain can be small (guide §0)",
        )
    return "unclear", (f"{said}: neither clearly heavy and stable nor clearly small; "
                       f"measure the NPU build (device:<model>)")


def _pid_of(phone, process: str | None) -> int:
    if not process:
        raise StageFailed(
            "step0 needs pid=<pid> or process=<name> of the app running today's CPU path"
        )
    rc, out = phone.try_shell(f"pidof {process}")
    pids = out.split()
    if rc or not pids:
        raise StageFailed(
            f"no process named {process!r} on the phone (pidof found none): start the task first"
        )
    if len(pids) > 1:
        raise StageFailed(
            f"{len(pids)} processes named {process!r} ({', '.join(pids)}): give pid=<one of them>"
        )
    return int(pids[0])


SETTINGS = ("pid", "process", "seconds", "interval")   # of toolchain/options.py
