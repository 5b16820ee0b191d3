"""adb, the one way to the phone: which device, shell/push/pull, and adb's failures
as one-line messages."""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess

from toolchain.errors import StageFailed

# adb's own words (platform-tools 29 to 35 prefix them "error:" or "adb:") -> what the
# user should do.
FAILURES = (
    (
        r"no devices/emulators found",
        "no phone: adb sees no device; connect one with USB debugging on (`adb devices`)",
    ),
    (
        r"unauthorized",
        "the phone has not authorized this computer: unlock it, accept the 'Allow USB debugging?' "
        "dialog, then retry",
    ),
    (r"offline", "the phone is offline: reconnect the cable (or `adb reconnect`)"),
    (
        r"device '([^']*)' not found",
        "ANDROID_SERIAL names no attached device: `adb devices` lists the serials",
    ),
    (r"more than one device", "several phones are attached: set ANDROID_SERIAL to one of them"),
)
PUSH_FAILURES = (
    r"failed to copy|cannot stat|stat failed|Read-only file system|No space left|Permission denied"
)
TIMEOUT = 600


class AdbError(StageFailed):
    """adb could not reach the phone or do what was asked: one line that says what to do."""


def executable() -> str:
    found = shutil.which("adb")
    if not found:
        raise AdbError("adb is not on PATH: install it (Debian/Ubuntu: apt-get install adb)")
    return found


def explain(output: str, what: str) -> str:
    """adb's failure text -> one line; unknown failures keep adb's last line."""
    for pattern, message in FAILURES:
        if re.search(pattern, output):
            return f"{what}: {message}"
    last = [line for line in output.strip().splitlines() if line.strip()][-1:] or ["(no output)"]
    return f"{what}: {last[0].strip()}"


def devices() -> list[tuple[str, str]]:
    """(serial, state) from `adb devices`: state is device, unauthorized, offline, ..."""
    done = subprocess.run(
        [executable(), "devices"], capture_output=True, text=True, timeout=TIMEOUT
    )
    if done.returncode:
        raise AdbError(explain(done.stdout + done.stderr, "adb devices"))
    rows = [
        line.split(None, 1)
        for line in done.stdout.splitlines()[1:]
        if line.strip() and not line.startswith("*")
    ]
    # state may be "no permissions (...)"
    return [(r[0], r[1].strip()) for r in rows if len(r) == 2]


def choose(environ=os.environ) -> str:
    """ANDROID_SERIAL, else the one attached device; never a guess among several."""
    serial = environ.get("ANDROID_SERIAL")
    if serial:
        return serial
    found = devices()
    if not found:
        raise AdbError(
            "adb devices: no phone: adb sees no device; connect one with USB debugging on"
        )
    if len(found) > 1:
        listed = ", ".join(f"{s} ({state})" for s, state in found)
        raise AdbError(
            f"adb devices: several phones are attached ({listed}): set ANDROID_SERIAL to one of "
            "them"
        )
    serial, state = found[0]
    if state != "device":
        raise AdbError(explain(state, f"adb devices: {serial} is '{state}'"))
    return serial


class Adb:
    """One phone, by serial; every command and the tail of its output are printed
    (the task's log)."""

    def __init__(self, serial: str):
        self.serial = serial

    def _run(self, args: list[str], what: str, check: bool = True) -> subprocess.CompletedProcess:
        argv = [executable(), "-s", self.serial, *args]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT)
        print(
            f"$ {shlex.join(argv)}\n{done.stdout[-2000:]}{done.stderr[-2000:]}# exit "
            f"{done.returncode}",
            flush=True,
        )
        if check and done.returncode:
            raise AdbError(explain(done.stdout + done.stderr, what))
        return done

    def shell(self, command: str, check: bool = True) -> str:
        """Run `command` in the phone's shell; adb (>= 1.0.36) returns the command's exit status."""
        return self._run(["shell", command], f"adb shell {command.split()[0]}", check).stdout

    def try_shell(self, command: str) -> tuple[int, str]:
        done = self._run(["shell", command], "adb shell", check=False)
        if done.returncode and re.search("|".join(p for p, _ in FAILURES), done.stderr):
            # the phone went away, not the command failing
            raise AdbError(explain(done.stderr, "adb shell"))
        return done.returncode, done.stdout

    def push(self, local: str, remote: str) -> None:
        done = self._run(["push", local, remote], f"adb push {local} {remote}", check=False)
        if done.returncode or re.search(PUSH_FAILURES, done.stderr):
            raise AdbError(explain(done.stdout + done.stderr, f"adb push {local} -> {remote}"))

    def pull(self, remote: str, local: str) -> None:
        self._run(["pull", remote, local], f"adb pull {remote}")

    def getprop(self, name: str) -> str:
        return self.shell(f"getprop {name}").strip()
