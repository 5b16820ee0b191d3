"""The pipeline through the real dodo.py on two small real models: the first build runs every stage,
then exactly what a change makes stale reruns (the tests below change one shared build, in order);
chip groups, clean, and command-line variables refused before anything runs."""
import dataclasses
import json
import os
import subprocess
import time
import types

import pytest
from conftest import ONE_CHIP, Project

from toolchain.compilers.ort_qnn import ep as ort_qnn

CHAIN = [
    "checkpoint:{m}",
    "export:{m}/net",
    "simplify:{m}/net",
    "inspect:{m}/net",
    "parity:{m}",
    "compile:{m}/net@SM8550",
    "compile:{m}/net@SM8750",
    "verify:{m}@SM8550",
    "verify:{m}@SM8750",
    "manifest:{m}@SM8550",
    "manifest:{m}@SM8750",
]


def chain(model):
    return [t.format(m=model) for t in CHAIN]


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory) -> Project:
    """Two tiny models built once for a whole test module (each test may change it, in order)."""
    p = Project(tmp_path_factory.mktemp("built") / "proj")
    p.add_tiny("tiny")
    p.add_tiny("tiny2", seed=1)
    rc, executed, text = p.run()
    assert rc == 0, text
    return p


def test_first_build_runs_every_stage_and_records_manifests(tiny_pair):
    manifest = json.loads((tiny_pair.root / "build/tiny/ort-qnn/SM8750/manifest.json").read_text())
    assert manifest["chip"]["soc_model"] == 69 and manifest["htp_arch"] == "v79"
    assert manifest["binaries"]["net"]["config"]["soc_type"] == "SM8750"
    assert manifest["binaries"]["net"]["config"]["relaxed_precision_flag"] is True
    assert manifest["sdk"]["build_id"].startswith("v2.")
    assert manifest["license"]["name"] == "Apache-2.0"
    binary = tiny_pair.root / manifest["binaries"]["net"]["file"]
    assert (
        manifest["binaries"]["net"]["sha256"]
        == __import__("hashlib").sha256(binary.read_bytes()).hexdigest()
    )
    assert manifest["verify"]["default"]["tensors"]["net"]["max_rel"] < 0.02
    assert manifest["parity"]["tensors"]["net"]["max_abs"] < 1e-4
    assert "| tiny2 | SM8550 |" in (tiny_pair.root / "build/report.md").read_text()


def test_second_run_executes_nothing(tiny_pair):
    rc, executed, _ = tiny_pair.run()
    assert rc == 0 and executed == []


def test_touch_without_change_rebuilds_nothing(tiny_pair):
    for rel in (
        "models/tiny.toml",
        "models/tinynet.py",
        "models/tiny.pt",
        "build/tiny/net/net.onnx",
    ):
        os.utime(tiny_pair.root / rel, (time.time() + 5, time.time() + 5))
    rc, executed, _ = tiny_pair.run()
    assert rc == 0 and executed == []


def test_editing_one_models_toml_rebuilds_only_that_model(tiny_pair):
    tiny_pair.edit("models/tiny.toml", "max_rel = 0.02", "max_rel = 0.03")
    rc, executed, _ = tiny_pair.run()
    assert rc == 0
    assert sorted(executed) == sorted(
        [
            "verify:tiny@SM8550",
            "verify:tiny@SM8750",
            "manifest:tiny@SM8550",
            "manifest:tiny@SM8750",
            "report",
        ]
    )


def test_changing_a_compile_setting_rebuilds_compile_and_after(tiny_pair):
    tiny_pair.edit("models/tiny.toml", "[verify]", "[compile]\noptimization = 2\n\n[verify]")
    rc, executed, _ = tiny_pair.run()
    assert rc == 0
    assert sorted(executed) == sorted(["compile:tiny/net@SM8550", "compile:tiny/net@SM8750",
                                       "verify:tiny@SM8550", "verify:tiny@SM8750",
                                       "manifest:tiny@SM8550", "manifest:tiny@SM8750", "report"])
    cfg = json.loads((tiny_pair.root / "build/tiny/ort-qnn/SM8550/net.compile.json").read_text())[
        "config"
    ]
    assert cfg["OpO"] == 2


def test_adding_a_chip_builds_only_that_chip(tiny_pair):
    tiny_pair.edit(
        "models/tiny2.toml",
        'chips = ["SM8550", "SM8750"]',
        'chips = ["SM8550", "SM8750", "SM8850"]',
    )
    rc, executed, _ = tiny_pair.run()
    assert rc == 0
    assert sorted(executed) == ["compile:tiny2/net@SM8850", "manifest:tiny2@SM8850", "report",
                                "verify:tiny2@SM8850"]


def test_same_bytes_from_a_rebuilt_stage_stop_the_rebuild(tiny_pair):
    # A comment in the export code reruns what reads that code; the ONNX comes out byte-identical,
    # so simplify, inspect and compile (which read only the ONNX) do not run.
    before = tiny_pair.build_state()["tiny/net/export.onnx"]
    tiny_pair.edit("models/tinynet.py", '"""A small real model', '"""(edited) A small real model')
    rc, executed, _ = tiny_pair.run()
    assert rc == 0
    assert tiny_pair.build_state()["tiny/net/export.onnx"] == before
    assert "export:tiny/net" in executed and "checkpoint:tiny" in executed
    assert not [t for t in executed if t.split(":")[0] in ("simplify", "inspect", "compile")]


def test_a_new_tool_version_rebuilds_exactly_the_stages_it_affects(tiny_pair, monkeypatch):
    real = ort_qnn.version()
    monkeypatch.setattr(ort_qnn, "version", lambda: {**real, "onnxruntime-qnn": "9.9.9"})
    rc, executed, _ = tiny_pair.run()
    assert rc == 0
    stages = {t.split(":")[0] for t in executed}
    # the recording keeps its bytes: no modellib
    assert stages == {"convert", "compile", "verify", "manifest", "report"}
    # every binary of both models
    assert len([t for t in executed if t.startswith("compile:")]) == 5


def test_one_chip_can_be_cleaned_and_rebuilt_alone(tiny_pair):
    before = tiny_pair.build_state()
    rc, _, _ = tiny_pair.run("clean", "*@SM8750")
    assert rc == 0
    after_clean = tiny_pair.build_state()
    assert not [f for f in after_clean if "/SM8750/" in f]
    assert {f: h for f, h in before.items() if "/SM8750/" not in f} == after_clean
    rc, executed, _ = tiny_pair.run("chip:SM8750")
    assert rc == 0
    # convert (chip-independent) reruns only because the test before put the tool version back
    executed = [t for t in executed if not t.startswith("convert:")]
    assert sorted(executed) == sorted(["compile:tiny/net@SM8750", "compile:tiny2/net@SM8750",
                                       "verify:tiny@SM8750", "verify:tiny2@SM8750",
                                       "manifest:tiny@SM8750", "manifest:tiny2@SM8750",
                                       # its report of what it built (build/report-SM8750.md)
                                       "chip:SM8750"])


def test_a_misspelt_chip_group_fails(tiny_pair):
    rc, executed, _ = tiny_pair.run("chip:SM8751")
    assert rc == 3 and executed == []


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["model:tny"],
            "command line: model:tny: no model named 'tny'; did you mean 'model:tiny'?",
        ),
        (
            ["list", "model:nothing-like-it"],
            "command line: model:nothing-like-it: no model named 'nothing-like-it'; "
            "models: other, tiny",
        ),
        (
            ["chip:SM8751"],
            "command line: chip:SM8751: unknown chip 'SM8751'; did you mean 'SM8750'?",
        ),
        (
            ["chip:Snapdragon 8 Elite"],
            "command line: chip:Snapdragon 8 Elite: unknown chip 'Snapdragon 8 Elite'; "
            'that is SM8750\'s marketing name (Snapdragon 8 Elite): write "SM8750" (chips are '
            "named by SoC id)",
        ),
        (
            ["chip:SM8550"],
            "command line: chip:SM8550: no model builds for SM8550; the chips models list: SM8750 "
            "(a model's `chips` in its spec)",
        ),
    ],
)
def test_an_unknown_model_or_chip_task_name_gets_the_name_meant(project, capsys, argv, message):
    """doit alone says 'Invalid parameter'; the dodo sees the command line first (sys.argv) and
    names the one meant. Wildcards stay doit's."""
    project.add_tiny("tiny", **ONE_CHIP)
    project.add_tiny("other", seed=1, **ONE_CHIP)
    rc, executed, _ = project.run(*argv)
    assert rc == 3 and executed == []
    assert capsys.readouterr().err == f"ERROR: {message}\n"
    from toolchain import pipeline

    pipeline.unknown_aliases(
        ["model:t*", "chip:SM87?0", "verify:tny@SM8750"], types.SimpleNamespace(models=[], chips={})
    )


@pytest.mark.parametrize(
    "variables, message",
    [
        (
            ["full=Snapdragon 8 Gen 2"],
            'that is SM8550\'s marketing name (Snapdragon 8 Gen 2): write "SM8550"',
        ),
        (
            ["limits=compile=2"],
            "command line: limits=compile=2: 'compile=2' is not <stage>:<slots>",
        ),
        (["limits=compil:2"], "no stage 'compil'; did you mean 'compile'?"),
        (["limit=compile:2"], "unknown variable limit=compile:2; did you mean limits=?"),
        (["extra=yes"], "extra=yes: expected 1"),
    ],
)
def test_a_bad_command_line_variable_is_one_error_line_before_anything_runs(
    tmp_path, variables, message
):
    project = Project(tmp_path / "proj")
    project.add_tiny()
    done = subprocess.run(
        ["doit", "list", *variables], cwd=project.root, capture_output=True, text=True
    )
    assert done.returncode == 3 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("ERROR: ") and message in done.stderr, done.stderr


def test_doit_list_shows_the_stages_in_pipeline_order(tmp_path):
    """`doit list` as a newcomer runs it: checkpoint first, then every stage in STAGES' order, the
    aliases last; `--all` keeps each stage's tasks together in that order too."""
    from toolchain import pipeline
    project = Project(tmp_path)
    project.add_tiny()
    done = project.doit_cli("list")
    assert done.returncode == 0, done.stdout + done.stderr
    listed = [line.split()[0] for line in done.stdout.splitlines() if line.strip()]
    assert listed == [s.name for s in pipeline.STAGES] + ["model", "chip"]
    assert listed[0] == "checkpoint"
    every = project.doit_cli("list", "--all")
    stages = [line.split()[0].split(":")[0] for line in every.stdout.splitlines() if line.strip()]
    assert list(dict.fromkeys(stages)) == listed and stages == sorted(stages, key=listed.index)


def test_one_model_builds_alone_and_leaves_a_report_of_what_it_built(project):
    """`doit model:<name>` builds that model only and ends with build/<name>/report.md
    (build/report.md, the whole build's, would build every model first); `doit chip:<CHIP>` the same
    for a chip."""
    project.add_tiny("tiny", **ONE_CHIP)
    project.add_tiny("other", seed=1, **ONE_CHIP)
    rc, executed, text = project.run("model:tiny")
    assert rc == 0, text
    assert executed[-1] == "model:tiny" and not [t for t in executed if "other" in t]
    report = (project.root / "build/tiny/report.md").read_text()
    assert (
        report.startswith("# Build report")
        and "| tiny | SM8750 |" in report
        and "| other |" not in report
    )
    # written from what is true now (report.after_build)
    whole = (project.root / "build/report.md").read_text()
    assert (
        "2 (model, chip) pairs: 1 pass, 0 failed, 1 not built." in whole
        and "| other | not built |" in whole
    )
    assert project.run("model:tiny")[1] == []   # incremental: the report too
    rc, executed, _ = project.run("chip:SM8750")
    assert rc == 0 and "model:tiny" not in executed and executed[-1] == "chip:SM8750"
    chip_report = (project.root / "build/report-SM8750.md").read_text()
    assert "| tiny | SM8750 |" in chip_report and "| other | SM8750 |" in chip_report


def test_a_tasks_name_and_owner_are_made_together_from_its_records():
    """stages.named: the name doit shows and the owner the aliases, trace and matrix read."""
    from toolchain import stages
    from toolchain.spec import chips

    model = types.SimpleNamespace(name="tiny")
    chip = chips.load()["SM8750"]
    other = dataclasses.replace(chip, family="2.49")
    graph = types.SimpleNamespace(name="net")
    assert stages.named(model) == {"name": "tiny", "owner": {"model": "tiny"}}
    assert stages.named(model, graph, other) == {
        "name": "tiny/net@SM8750+qairt2.49",
        "owner": {"model": "tiny", "graph": "net", "chip": "SM8750", "family": "2.49"},
    }
    assert stages.named(model, "enc+dec", family="2.49")["name"] == "tiny/enc+dec+qairt2.49"
    assert stages.named(model, chip=chip)["owner"] == {"model": "tiny", "chip": "SM8750"}
    assert stages.named("ort-qnn", chip=other) == {
        "name": "ort-qnn@SM8750+qairt2.49",
        "owner": {"compiler": "ort-qnn", "chip": "SM8750", "family": "2.49"},
    }
