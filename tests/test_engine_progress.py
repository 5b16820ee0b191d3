"""Progress (engine/run/progress.py): [n/N], durations and an ETA from the last build; plain
lines under CI."""
from __future__ import annotations

import os
import subprocess
import sys

from conftest import Project


def test_progress_shows_n_of_n_durations_and_an_eta_from_the_last_build(tmp_path):
    project = Project(tmp_path / "proj")
    project.add_tiny()
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "QNN_JOBS")}

    def doit(*args):
        done = subprocess.run([sys.executable, "-m", "doit", *args], cwd=project.root, env=env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout
    first = doit()
    total = sum(1 for line in first.splitlines() if line.startswith(".  "))
    assert f"   [1/{total}] " in first and f"   [{total}/{total}] report " in first
    # first build: no durations yet; table stays
    assert "ETA unknown" in first and "| tiny | SM8550 |" in first
    doit("clean")
    second = doit()
    assert "ETA ~" in second and "ETA unknown" not in second
    quiet = subprocess.run(
        [sys.executable, "-m", "doit", "clean"],
        cwd=project.root,
        env={**env, "CI": "true"},
        capture_output=True,
        text=True,
    )
    assert quiet.returncode == 0
    ci = subprocess.run([sys.executable, "-m", "doit"], cwd=project.root, env={**env, "CI": "true"},
                        capture_output=True, text=True, timeout=600)
    assert ci.returncode == 0 and "ETA" not in ci.stdout and ".  export:tiny/net" in ci.stdout
