"""Test harness: a throw-away project (the real dodo.py + small models) and doit run in-process."""
from __future__ import annotations

import hashlib
import io
import os
import runpy
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The tests compare executed-task lists in order: serial unless a test asks for `-n` itself.
os.environ.setdefault("QNN_JOBS", "1")
FIXTURES = Path(__file__).parent / "fixtures"
DODO = ROOT / "dodo.py"


class Project:
    """A temp folder laid out like the repo: dodo.py, models/, build/."""

    def __init__(self, root: Path):
        self.root = root
        (root / "models").mkdir(parents=True, exist_ok=True)
        shutil.copy(DODO, root / "dodo.py")

    def add_tiny(self, name: str = "tiny", seed: int = 0, **replace: str) -> Path:
        """models/<name>.toml + the tinynet export code + a seeded checkpoint, sha256 pinned."""
        models = self.root / "models"
        shutil.copy(FIXTURES / "tinynet.py", models / "tinynet.py")
        ckpt = models / f"{name}.pt"
        subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(models)!r}); "
                        f"import tinynet; tinynet.make_checkpoint({str(ckpt)!r}, {seed})"], check=True)
        text = (FIXTURES / "tiny.toml").read_text()
        text = text.replace("@SHA256@", sha256(ckpt)).replace('path = "tiny.pt"', f'path = "{name}.pt"')
        for old, new in replace.items():
            assert old in text, old
            text = text.replace(old, new)
        spec = models / f"{name}.toml"
        spec.write_text(text)
        return spec

    def edit(self, rel: str, old: str, new: str) -> None:
        path = self.root / rel
        text = path.read_text()
        assert old in text, f"{old!r} not in {rel}"
        path.write_text(text.replace(old, new, 1))

    def run(self, *args: str) -> tuple[int, list[str], str]:
        """doit in this process; returns (exit code, executed task names, reporter output)."""
        import doit.doit_cmd
        from doit.cmd_base import ModuleTaskLoader
        from doit.doit_cmd import DoitMain
        from doit.exceptions import InvalidDodoFile

        from toolchain.engine import buildlock
        cwd = os.getcwd()
        handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}   # the dodo sets its own
        os.chdir(self.root)
        try:
            doit.doit_cmd.reset_vars()
            for arg in args:
                if "=" in arg and not arg.startswith("-"):
                    doit.doit_cmd.set_var(*arg.split("=", 1))
            out = io.StringIO()
            argv, sys.argv = sys.argv, ["doit", *args]   # what the dodo reads its command from
            try:
                members = runpy.run_path(str(self.root / "dodo.py"))
            except InvalidDodoFile as err:   # as doit prints a mistake found while loading the dodo
                sys.stderr.write(f"ERROR: {err}\n")
                return 3, [], ""
            finally:
                sys.argv = argv
            rc = DoitMain(ModuleTaskLoader(members), config_filenames=(),
                          extra_config={"GLOBAL": {"outfile": out}}).run(list(args))
        finally:
            os.chdir(cwd)
            doit.doit_cmd.reset_vars()   # no variable leaks into the next load
            buildlock.release()          # a doit process ends here: its build lock goes
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
        text = out.getvalue()
        return rc or 0, [line[3:] for line in text.splitlines() if line.startswith(".  ")], text

    def doit_cli(self, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
        """doit as a user runs it (separate process, real exit code and messages)."""
        return subprocess.run([sys.executable, "-m", "doit", *args], cwd=self.root, capture_output=True,
                              text=True, timeout=timeout)

    def build_state(self) -> dict[str, str]:
        """sha256 of every file under build/ except the engine's own books (state DB, outputs record, locks)."""
        build = self.root / "build"
        return {str(p.relative_to(build)): sha256(p) for p in sorted(build.rglob("*"))
                if p.is_file() and not p.relative_to(build).parts[0].startswith(".")}


def sha256(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.fixture
def project(tmp_path) -> Project:
    return Project(tmp_path / "proj")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Project:
    """Two tiny models built once for a whole test module (each test may change it, in order)."""
    p = Project(tmp_path_factory.mktemp("built") / "proj")
    p.add_tiny("tiny")
    p.add_tiny("tiny2", seed=1)
    rc, executed, text = p.run()
    assert rc == 0, text
    return p
