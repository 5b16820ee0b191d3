"""Test harness: a throw-away project (the real dodo.py + small models) and doit run in-process;
what several test files share: spec edits, hand-made ONNX models, separate checkouts and the cache
they share, the stand-in QAIRT SDK."""
from __future__ import annotations

import hashlib
import io
import json
import os
import runpy
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import nginx_cache
import pytest
import sdk_standin as standin

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
        subprocess.run(
            [
                sys.executable,
                "-c",
                f"import sys; sys.path.insert(0, {str(models)!r}); "
                f"import tinynet; tinynet.make_checkpoint({str(ckpt)!r}, {seed})",
            ],
            check=True,
        )
        text = (FIXTURES / "tiny.toml").read_text()
        text = text.replace("@SHA256@", sha256(ckpt)).replace(
            'path = "tiny.pt"', f'path = "{name}.pt"'
        )
        for old, new in replace.items():
            assert old in text, old
            text = text.replace(old, new)
        spec = models / f"{name}.toml"
        spec.write_text(text)
        return spec

    def add_windowed(self) -> Path:
        """tests/fixtures/windowed.toml ([windows] of one graph at 16, 32, 64 frames) in models/,
        with its model code and a seeded checkpoint, sha256 pinned."""
        models = self.root / "models"
        shutil.copy(FIXTURES / "windowed.py", models / "windowed.py")
        ckpt = models / "windowed.pt"
        subprocess.run(
            [
                sys.executable,
                "-c",
                f"import sys; sys.path.insert(0, {str(models)!r}); import windowed; "
                f"windowed.make_checkpoint({str(ckpt)!r})",
            ],
            check=True,
        )
        spec = models / "windowed.toml"
        spec.write_text((FIXTURES / "windowed.toml").read_text().replace("@SHA256@", sha256(ckpt)))
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

        from toolchain.engine.run import buildlock
        cwd = os.getcwd()
        # the dodo sets its own
        handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
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
        return subprocess.run(
            [sys.executable, "-m", "doit", *args],
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def build_state(self) -> dict[str, str]:
        """sha256 of every file under build/ except the engine's own books (state DB,
        outputs record, locks)."""
        build = self.root / "build"
        return {str(p.relative_to(build)): sha256(p) for p in sorted(build.rglob("*"))
                if p.is_file() and not engine_book(p.relative_to(build))}


def engine_book(rel: Path) -> bool:
    """The engine's own files under build/ (state, records, locks, the trace of each build, what
    failed: engine/paths.py)."""
    return rel.parts[0].startswith(".") or rel.parts[0] in (
        "trace.json",
        "trace.svg",
        "traces",
        "failed.json",
    )


def sha256(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.fixture
def project(tmp_path) -> Project:
    return Project(tmp_path / "proj")


# ---- spec edits several test files make (old text -> new text in tiny.toml) ----

ONE_CHIP = {'chips = ["SM8550", "SM8750"]': 'chips = ["SM8750"]'}
NET = "[graphs.net]\n"


# max_rel_w8a16: uint8 per-tensor weights of a tiny random net on Gaussian inputs measure ~0.11.
W8A16 = {
    'precision = "fp16"': 'precision = "w8a16"\ncalibration = 8',
    "max_rel = 0.02": "max_rel_w8a16 = 0.2",
    'chips = ["SM8550", "SM8750"]': 'chips = ["SM8350", "SM8750"]',
}


LSTM = '''
description = "speaker LSTM: mels -> 128-d embedding"
module = "lstmnet"
chips = ["SM8750"]
[license]
name = "Apache-2.0"
[checkpoint]
path = "lstm.pt"
sha256 = "{sha}"
format = "torch"
[export]
exporter = "legacy"
opset = 17
[verify]
max_rel = 0.02
min_cosine = 0.999
[graphs.embedder]
inputs.mels = {{ shape = [1, 100, 40], dtype = "float32" }}
outputs.embed = {{ shape = [1, 128], dtype = "float32" }}
'''


# ---- a model whose graph is written by hand with onnx.helper ----

HANDMADE_MODULE = '''
import onnx
from onnx import helper as h, TensorProto as T


def export(checkpoint, graph, out, settings):
    x = h.make_tensor_value_info("x", T.{in_type}, {in_shape})
    y = h.make_tensor_value_info("y", T.FLOAT, {out_shape})
    nodes = {nodes}
    model = h.make_model(h.make_graph(nodes, "g", [x], [y]), opset_imports=[h.make_opsetid("", 17)])
    onnx.save(model, out)
'''


HANDMADE_SPEC = '''
module = "handmade"
chips = ["SM8750"]
[license]
name = "Apache-2.0"
[checkpoint]
path = "handmade.bin"
sha256 = "{sha}"
format = "torch"
[parity]
reference = "none"   # no PyTorch code: the graphs are written by hand
[graphs.net]
inputs.x = {{ shape = [1, 4, 4], dtype = "float32" }}
outputs.y = {{ shape = {out_shape}, dtype = "float32" }}
'''


def handmade(project, nodes, in_type="FLOAT", in_shape="[1, 4, 4]", out_shape="[1, 4, 4]"):
    """models/bad.toml + models/handmade.py whose export() writes the given onnx.helper
    nodes (no PyTorch)."""
    models = project.root / "models"
    (models / "handmade.py").write_text(
        HANDMADE_MODULE.format(nodes=nodes, in_type=in_type, in_shape=in_shape, out_shape=out_shape)
    )
    (models / "handmade.bin").write_bytes(b"weights live in the export code")
    sha = hashlib.sha256(b"weights live in the export code").hexdigest()
    (models / "bad.toml").write_text(
        textwrap.dedent(HANDMADE_SPEC.format(sha=sha, out_shape=out_shape))
    )


# ---- separate checkouts of one project and the cache they share (`python -m doit` in its
# own process) ----

# the only fields that may differ between builds
TIMES = ("seconds", "compile_seconds", "seconds_per_call")
RESTORED = "# restored from cache"


def sources(project: Project) -> Project:
    shutil.copytree(
        ROOT / "toolchain", project.root / "toolchain", ignore=shutil.ignore_patterns("__pycache__")
    )
    return project


def checkout(src: Path, dst: Path) -> Path:
    """Another checkout of the same sources: dodo.py, models/, toolchain/, no build/."""
    dst.mkdir(parents=True)
    shutil.copy(src / "dodo.py", dst / "dodo.py")
    for name in ("models", "toolchain"):
        shutil.copytree(src / name, dst / name)
    return dst


def doit(
    root: Path, *args: str, cache_dir: Path | None = None, passes: bool = True
) -> tuple[list[str], str]:
    """`python -m doit` in root (cache from $QNN_CACHE if given); (executed tasks, output); must
    pass (or, with passes=False, fail)."""
    env = {k: v for k, v in os.environ.items() if k not in ("QNN_CACHE", "QNN_LIMITS")}
    if cache_dir:
        env["QNN_CACHE"] = str(cache_dir)
    done = subprocess.run(
        [sys.executable, "-m", "doit", *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert (done.returncode == 0) == passes, done.stdout + done.stderr
    return [
        line[3:] for line in done.stdout.splitlines() if line.startswith(".  ")
    ], done.stdout + done.stderr


UNSIGNED = "no cache_trust (an unsigned cache)"   # the one notice of a build on an unsigned cache


def cache_lines(output: str) -> list[str]:
    """The lines where a cache says what went wrong: every `cache: ` line but the unsigned cache's
    notice, which a build says at most once."""
    lines = [line for line in output.splitlines() if line.startswith("cache: ")]
    assert sum(UNSIGNED in line for line in lines) <= 1, output
    return [line for line in lines if UNSIGNED not in line]


def tool_logs(root: Path) -> dict[str, str]:
    """{path under build/: text} of every log of a heavy step (worker or external tool: '#
    exit N after')."""
    build = root / "build"
    return {str(p.relative_to(build)): p.read_text() for p in sorted(build.rglob("*.log"))
            if "\n# exit " in p.read_text()}


def cacheable(logs: dict[str, str], signed: bool = False) -> dict[str, str]:
    """tool_logs() of the steps a cache may restore: not those of a stage whose outputs are code
    (convert, modellib: rebuilt on every machine, never taken from a cache), nor, unless the cache
    is `signed` by a key the build trusts, those of a stage whose outputs are results (a check's
    record: parity, verify), which run here."""
    from toolchain import pipeline
    code = tuple(f".{s.name}.log" for s in pipeline.STAGES if s.output_kind == "code")
    results = {_module(s.tasks) for s in pipeline.STAGES if s.output_kind == "result"}
    return {rel: text for rel, text in logs.items() if not rel.endswith(code)
            and (signed or text.partition(":")[0].removeprefix("# ") not in results)}


def _module(tasks) -> str:
    return getattr(tasks, "func", tasks).__module__


def untimed(path: Path):
    """A JSON record without its timings."""
    def strip(value):
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in TIMES}
        return [strip(v) for v in value] if isinstance(value, list) else value
    return strip(json.loads(path.read_text()))


def assert_same_outputs(a: Path, b: Path) -> None:
    """Same files under build/; byte-identical but for logs (times), the reports (times) and JSON
    records, which must be identical once their timings are removed."""
    def files(root):
        return {str(p.relative_to(root / "build")) for p in (root / "build").rglob("*")
                if p.is_file() and not engine_book(p.relative_to(root / "build"))}
    assert files(a) == files(b)
    for rel in sorted(files(a)):
        if rel.endswith(".log") or rel in ("report.md", "report.html"):
            continue
        if rel.endswith(".json") and sha256(a / "build" / rel) != sha256(b / "build" / rel):
            assert untimed(a / "build" / rel) == untimed(b / "build" / rel), rel
            continue
        assert sha256(a / "build" / rel) == sha256(b / "build" / rel), rel


@pytest.fixture(scope="session")
def reference(tmp_path_factory):
    """2 models x 2 chips built serially from scratch, filling a cache: (project root, cache
    folder). Built once per run for the cache, limits, worker, matrix and report tests; none of them
    changes it (each works on a checkout)."""
    base = tmp_path_factory.mktemp("scale")
    project = sources(Project(base / "ref"))
    project.add_tiny("tiny")
    project.add_tiny("tiny2", seed=1)
    doit(project.root, f"cache={base / 'cache'}")   # the cache as a doit variable
    return project.root, base / "cache"


# ---- the stand-in QAIRT SDK (tests/sdk_standin.py) ----

def add_qnet(project: Project, **replace) -> None:
    """models/qnet.toml (compiler = "qairt", graph 'net-a') + its onnx.helper export code
    + a checkpoint."""
    models = project.root / "models"
    shutil.copy(FIXTURES / "qnet.py", models / "qnet.py")
    (models / "qnet.ckpt").write_bytes(b"qnet checkpoint\n")
    text = (FIXTURES / "qnet.toml").read_text().replace(
        "@SHA256@", hashlib.sha256(b"qnet checkpoint\n").hexdigest())
    for old, new in replace.items():
        text = text.replace(old, new)
    (models / "qnet.toml").write_text(text)


def sdk_env(mp: pytest.MonkeyPatch, tmp: Path, ndk: bool = True, **make) -> Path:
    """A stand-in SDK and host tools under `tmp`, selected through the environment as
    a user would."""
    sdk = standin.make_sdk(tmp / "qairt" / "2.40.0.251030", **make)
    tools = standin.make_bin(tmp / "hostbin", ndk=ndk)
    mp.setenv("QNN_SDK_ROOT", str(sdk))
    # no pyenv shims, no stray NDK
    mp.setenv("PATH", f"{tools}{os.pathsep}/usr/bin{os.pathsep}/bin")
    mp.delenv("QAIRT_PYTHON", raising=False)
    return sdk


# ---- the shared cache on a real server (tests/nginx_cache.py) ----

TOKEN = "s3cret-token-4711"


def need_nginx() -> None:
    """Skip without nginx, saying why; fail instead where .ci/run requires it
    (QNN_TEST_NGINX=required)."""
    if not nginx_cache.available():
        if os.environ.get("QNN_TEST_NGINX") == "required":
            pytest.fail("nginx is not installed, and .ci/run requires it (apt-get install nginx)")
        pytest.skip(
            "nginx is not installed (apt-get install nginx): the remote-cache tests need a real "
            "server"
        )


@pytest.fixture
def server(tmp_path):
    """nginx on a loopback port (the CI installs it; elsewhere the test says it cannot
    run without it)."""
    need_nginx()
    started = nginx_cache.Server(tmp_path / "nginx", token=TOKEN)
    yield started
    started.stop()


def build(tmp_path: Path, name: str, **replace: str) -> Project:
    project = sources(Project(tmp_path / name))
    project.add_tiny("tiny", **replace)
    return project
