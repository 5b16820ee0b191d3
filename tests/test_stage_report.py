"""The report (stages/report/: __init__.py, page.py): each check's margin to its limit and the cost
per chip, from a synthetic record holding every kind of check verify writes (per output, per stream
output, judged by the metric, a record from before per-output checks), and a real build's page
rendered in headless Chromium."""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from toolchain.shared import measures
from toolchain.stages import report
from toolchain.stages.report import page as report_html

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def record() -> dict:
    """A manifest as report_html reads it: one stream graph (default tier) and one old-style
    graph (full tier)."""
    vad = {
        "calls": 6,
        "max_abs": 0.01,
        "max_rel": 0.2,
        "cosine": 0.99,
        "seconds_per_call": 0.034,
        "outputs": {
            "prob": {
                "check": {"max_abs": 0.02},
                "passed": True,
                "at_worst_call": {"max_abs": 0.005, "max_rel": 0.2, "cosine": 1.0, "range": 0.8},
            },
            "state": {
                "check": {"judged_by": "metric", "reason": "its own loop"},
                "passed": None,
                "at_worst_call": {"max_abs": 9.0, "max_rel": 1.0, "cosine": 0.0, "range": 9.0},
            },
        },
    }
    stream = {
        "clip": {
            "calls": 100,
            "outputs": {
                "prob": {
                    "check": {"max_abs": 0.02},
                    "passed": False,
                    "peak": {
                        # an fp16 overflow, as recorded
                        "max_abs": "inf",
                        "max_rel": "inf",
                        "cosine": -1.0,
                        "range": 0.5,
                    },
                }
            },
        }
    }
    # no outputs, no seconds_per_call
    old = {"calls": 1, "max_abs": 0.3, "max_rel": 0.03, "cosine": 0.999}
    return {
        "model": "m",
        "chip": {"name": "SM8750", "marketing": "8 Elite"},
        "htp_arch": "v79",
        "precision": {"vad": "fp16", "enc": "fp16"},
        "sdk": {"build_id": "v2.51.0"},
        "parity": {"tensors": {}},
        "output_checks": {"vad": {"prob": {"max_abs": 0.02}}},
        "binaries": {
            "vad": {"bytes": 765_952, "compile_seconds": 0.3},
            "enc": {"bytes": 20_869_120, "compile_seconds": 11.2},
        },
        "verify": {
            "default": {
                "status": "failed",
                "seconds": 4.0,
                "checks": {"max_rel": 0.05},
                "tensors": {"vad": vad},
                "stream": {"vad": stream},
            },
            "full": {
                "status": "passed",
                "seconds": 9.0,
                "tensors": {"enc": old},
                "checks": {"max_rel": 0.02, "min_cosine": 0.99},
            },
        },
    }


def test_every_kind_of_check_gets_its_margin_to_its_limit():
    found = [(c["tier"], c["name"], c["margin"]) for c in report_html.checks(record())]
    assert found == [("default", "vad/prob", pytest.approx(0.25)), ("default", "vad/state", None),
                     ("default", "vad/prob, stream clip", math.inf),
                     # max(0.03 / 0.02, 0.001 / 0.01)
                     ("full", "enc (all outputs)", pytest.approx(1.5))]


def test_the_page_draws_within_over_and_metric_checks_and_the_cost_per_graph():
    html = report_html.page([report.Cell("m", "SM8750", "failed", record())])
    assert html.count('<g class="check within"') == 1 and html.count('<g class="check over"') == 2
    for state, name, label in (
        ("within", "SM8750 vad/prob", "0.25"),
        ("over", "SM8750 vad/prob, stream clip", "inf"),
        ("over", "SM8750 enc (all outputs) (full tier)", "1.5"),
    ):
        colour = report_html.WITHIN if state == "within" else report_html.OVER
        assert re.search(
            rf'<g class="check {state}" data-name="{re.escape(name)}"><title>[^<]*</title><rect '
            r'[^>]*'
            rf'fill="{colour}"/><text [^>]*>{label} of limit, {state}</text></g>',
            html,
        ), name
    # inf: clipped to the end
    assert f'width="{report_html.AXIS:.1f}" height="12" fill="{report_html.OVER}"' in html
    assert re.search(
        r'<g class="check metric" data-name="SM8750 vad/state">.*?judged by the task metric', html
    )
    assert "4 checks: 1 within their limit, 2 over, 1 judged by the task metric" in html
    assert (
        '<g class="cost" data-name="m/enc">' in html
        and ">11.2 s</text>" in html
        and ">20.87 MB</text>" in html
    )
    assert (
        html.count("not recorded") == 1 and ">0.034 s</text>" in html and ">0.77 MB</text>" in html
    )
    assert html.count("<span class=bad>failed</span>") == 1


def test_the_margin_axis_is_logarithmic_and_clipped():
    # 0.001 .. 10: 1 at 3 of 4 decades
    assert report_html.margin_x(1.0) == pytest.approx(0.75 * report_html.AXIS)
    assert report_html.margin_x(0.01) == pytest.approx(0.25 * report_html.AXIS)
    assert report_html.margin_x(0.0) == report_html.margin_x(1e-9) == 0.0
    assert report_html.margin_x(math.inf) == report_html.margin_x(50.0) == report_html.AXIS


def render(page: Path, folder: Path, size: str = "1400,900") -> tuple[Path, str]:
    """A page in headless Chromium: (its screenshot, its DOM)."""
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={folder / 'profile'}",
    ]
    shot = folder / "report.png"
    subprocess.run(
        [CHROMIUM, *flags, f"--window-size={size}", f"--screenshot={shot}", page.as_uri()],
        capture_output=True,
        timeout=120,
        check=True,
    )
    dom = subprocess.run(
        [CHROMIUM, *flags, "--dump-dom", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    return shot, dom


def drawn(dom: str, figure: str, kind: str, name: str) -> tuple[str, str]:
    """(its state class, its markup) of one row ("check" or "cost") of the figure with that id."""
    inside = dom.split(f'<figure id="{figure}">', 1)[1].split("</figure>", 1)[0]
    found = re.search(rf'<g class="{kind}( \w+)?" data-name="{re.escape(name)}">(.*?)</g>', inside)
    assert found, f"{figure}: no {kind} row {name!r}"
    return (found.group(1) or "").strip(), found.group(2)


def built_manifests(ref: Path) -> list[dict]:
    found = [json.loads(p.read_text()) for p in sorted((ref / "build").glob("*/*/*/manifest.json"))]
    assert len(found) == 4
    return found


def colour_pixels(shot: Path, colour: str) -> int:
    rgb = tuple(int(colour[i:i + 2], 16) for i in (1, 3, 5))
    return sum(n for n, c in Image.open(shot).convert("RGB").getcolors(1 << 24) if c == rgb)


@pytest.mark.skipif(
    not CHROMIUM,
    reason="no chromium binary on PATH (Debian: apt-get install chromium): "
    "build/report.html cannot be rendered here",
)
def test_the_html_report_renders_in_headless_chromium(reference, tmp_path):
    ref, _ = reference
    page = ref / "build/report.html"
    text = page.read_text()
    # nothing fetched
    assert "<svg" in text and "http" not in text.replace('xmlns="http://www.w3.org/2000/svg"', "")
    shot, dom = render(page, tmp_path)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    dom, last_build = dom.split("<h2>Last build</h2>")   # the page, then the last build (trace.py)
    # a box per task that ran
    assert "critical path " in last_build and last_build.count("<rect") >= 10
    assert dom.count("<rect") == 16   # 4 checks + 4 graphs x 3 costs
    # the grid (2 models), the table (4 pairs), the QNN graphs (2)
    assert dom.count("<tr>") == 3 + 5 + 3
    assert (
        dom.count('<td class="cell pass">') == 4
        and "4 (model, chip) pairs: 4 pass, <b>0 failed</b>" in dom
    )
    assert dom.count('<g class="check within"') == 4 and 'class="check over"' not in dom
    for m in built_manifests(ref):
        chip, y = m["chip"]["name"], m["verify"]["default"]["tensors"]["net"]["outputs"]["y"]
        state, markup = drawn(dom, f"checks-{m['model']}", "check", f"{chip} net/y")
        margin = measures.excess(y["at_worst_call"], y["check"])
        assert state == "within" and re.search(f'<rect [^>]*fill="{report_html.WITHIN}"', markup)
        assert f">{margin:.2g} of limit, within</text>" in markup
        # the records' numbers, as written
        _, costs = drawn(dom, f"cost-{chip}", "cost", f"{m['model']}/net")
        assert re.findall(r'<text class="value"[^>]*>([^<]*)</text>', costs) == [
            f"{m['binaries']['net']['compile_seconds']:.1f} s",
            f"{m['verify']['default']['tensors']['net']['seconds_per_call']:.3g} s",
            f"{m['binaries']['net']['bytes'] / 1e6:.2f} MB"]
    # 4 green bars at least a few px wide, 12 high
    assert colour_pixels(shot, report_html.WITHIN) > 4 * 200


@pytest.mark.skipif(not CHROMIUM, reason="no chromium binary on PATH (Debian: apt-get install "
                                         "chromium): "
                                         "build/report.html cannot be rendered here")
def test_the_html_report_draws_a_check_over_its_limit_red(reference, tmp_path):
    # The build's manifests, one of them with its output 3x over its bound (as a failed
    # verify records it)
    ref, _ = reference
    copies = []
    for i, m in enumerate(built_manifests(ref)):
        if (m["model"], m["chip"]["name"]) == ("tiny", "SM8750"):
            y = m["verify"]["default"]["tensors"]["net"]["outputs"]["y"]
            at = y["at_worst_call"]
            at["max_abs"] = 3 * (
                y["check"].get("max_abs", 0.0) + y["check"].get("max_rel", 0.0) * at["range"]
            )
            y["passed"], m["verify"]["default"]["status"] = False, "failed"
        copies.append(tmp_path / f"{i}.json")
        copies[-1].write_text(json.dumps(m))
    page = tmp_path / "report.html"
    found = [report.Pair(m["model"], m["chip"]["name"], str(c), ()) for m, c in
             ((json.loads(c.read_text()), c) for c in copies)]
    report_html.write(report.grid(found, {}), str(page))
    (tmp_path / "over").mkdir()
    shot, dom = render(page, tmp_path / "over")
    state, markup = drawn(dom, "checks-tiny", "check", "SM8750 net/y")
    assert state == "over" and re.search(f'<rect [^>]*fill="{report_html.OVER}"', markup)
    assert ">3 of limit, over</text>" in markup
    assert drawn(dom, "checks-tiny", "check", "SM8550 net/y")[0] == "within"
    assert dom.count('<g class="check within"') == 3 and dom.count('<g class="check over"') == 1
    assert dom.count('<span class="bad">failed</span>') == 1
    (tmp_path / "passing").mkdir()
    # the same page, every check within
    passing, _ = render(ref / "build/report.html", tmp_path / "passing")
    bar = (report_html.ROW - 6) * report_html.margin_x(3.0)  # px of the red bar
    assert (
        colour_pixels(shot, report_html.OVER) - colour_pixels(passing, report_html.OVER) > 0.9 * bar
    )
    assert colour_pixels(passing, report_html.WITHIN) > colour_pixels(shot, report_html.WITHIN) > 0


def test_the_windows_table_reads_the_full_tier_where_the_chip_ran_it():
    # the default tier checks one clip per window; where a chip also ran the full tier, the windows
    # table says what all clips gave (the figures issue 34 asks for), and a chip without it keeps
    # the default tier's row
    from toolchain.stages import report
    io = {"inputs": [["x", [1, 4], "float32"]], "outputs": [["y", [1, 4], "float32"]]}

    def manifest(tiers: dict) -> dict:
        return {
            "model": "w",
            "chip": {"name": "SM8750"},
            "graphs": {"enc_2f": {"io": io}, "enc": {"io": io}},
            "windows": {
                "unit": "f",
                "graphs": {"2": {"encoder": "enc_2f"}, "4": {"encoder": "enc"}},
            },
            "binaries": {"enc_2f": {"bytes": 1e6}, "enc": {"bytes": 2e6}},
            "verify": {
                tier: {
                    "tensors": {"enc_2f": {}, "enc": {}},
                    "task": {
                        "windows": {
                            "2": {"summary": summary, "same_as_30s": same, "clips": ["c"] * n}
                        }
                    },
                }
                for tier, (summary, same, n) in tiers.items()
            },
        }
    default = ("1/1 same text, WER 0.000", 1, 1)
    full = ("12/12 same text, WER 0.070", 9, 12)
    rows = report.window_rows([manifest({"default": default, "full": full})])
    assert rows[0][-2:] == ["12/12 same text, WER 0.070", "9/12"] and rows[1][-2] == "(largest)"
    assert report.window_rows([manifest({"default": default})])[0][-2:] == [
        "1/1 same text, WER 0.000",
        "1/1",
    ]


# ---- a failed check reaches the report (build/failed.json, report.after_build) ----

@pytest.mark.skipif(not CHROMIUM, reason="no chromium binary on PATH (Debian: apt-get install "
                                         "chromium): "
                                         "build/report.html cannot be rendered here")
def test_a_failed_verify_shows_red_in_the_report_and_leaves_no_stale_manifest_or_bundle(tmp_path):
    from conftest import ONE_CHIP, Project
    project = Project(tmp_path / "proj")
    project.add_tiny(**ONE_CHIP)
    green = doit_cli(project)
    assert green.returncode == 0, green.stdout + green.stderr
    assert green.stdout.splitlines()[-1].endswith(" ran, 0 up to date, 0 failed"), green.stdout[
        -500:
    ]
    pair = project.root / "build/tiny/ort-qnn/SM8750"
    claimed = [
        p
        for p in (
            "manifest.json",
            "bundle.json",
            *[b.name for b in (pair / "bundle").glob("*.tar.bz2")],
        )
        if (pair / p).is_file() or (pair / "bundle" / p).is_file()
    ]
    # (tiny ships no bundle: a bundle is a model's declared contract)
    assert "manifest.json" in claimed, claimed
    measured = json.loads((pair / "verify.json").read_text())["tensors"]["net"]["max_rel"]
    # half what fp16 reached
    project.edit("models/tiny.toml", "max_rel = 0.02", f"max_rel = {measured / 2:.3g}")

    failed = doit_cli(project)
    assert failed.returncode == 1
    assert failed.stdout.splitlines()[-1].endswith(
        " failed (verify:tiny@SM8750; build/failed.json)"
    ), failed.stdout[-800:]
    verify = json.loads((pair / "verify.json").read_text())
    # the failed check's own record stays: it holds the numbers
    assert verify["status"] == "failed"
    for name in claimed:   # the old manifest and bundle said the previous binary passed: gone
        assert not (pair / name).exists() and not (pair / "bundle" / name).exists(), name
    text = (project.root / "build/report.md").read_text()
    assert "1 (model, chip) pairs: 0 pass, 1 failed, 0 not built." in text
    assert (
        "| tiny | **FAILED** verify:tiny@SM8750: " in text
        and "(build/tiny/ort-qnn/SM8750/verify.json) |" in text
    )
    assert "| tiny | SM8750 | v79" not in text   # no row of the old manifest
    assert "## Last build" in text and "critical path " in text
    shot, dom = render(project.root / "build/report.html", tmp_path)
    cell = dom.split('<td class="cell failed"', 1)[1].split("</td>", 1)[0]
    assert (
        "verify:tiny@SM8750" in cell
        and verify["failures"][0][:40]
        in cell.replace("&gt;", ">").replace("&lt;", "<").replace("&amp;", "&")
        and "build/tiny/ort-qnn/SM8750/verify.json" in cell
    )
    assert 'class="cell pass"' not in dom and "<b>1 failed</b>" in dom
    assert colour_pixels(shot, "#f8dcd8") > 120 * 40   # the red cell, at least 120 x 40 px of it

    again = doit_cli(project)   # the failed record it wrote is no damage: said as what it is
    assert again.returncode == 1 and "verify:tiny@SM8750 failed in an earlier build" in again.stdout
    assert "changed since" not in again.stdout

    project.edit("models/tiny.toml", f"max_rel = {measured / 2:.3g}", "max_rel = 0.02")
    fixed = doit_cli(project)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert (pair / "manifest.json").is_file() and not (project.root / "build/failed.json").exists()
    assert (
        "1 (model, chip) pairs: 1 pass, 0 failed, 0 not built."
        in (project.root / "build/report.md").read_text()
    )
    quiet = doit_cli(project)   # a no-op: one line, the first build's tasks all up to date
    ran = int(green.stdout.splitlines()[-1].split(" ran, ")[0])
    assert quiet.stdout.strip().splitlines() == [f"nothing to do: {ran} tasks up to date"], (
        quiet.stdout
    )


def doit_cli(project) -> subprocess.CompletedProcess:
    """doit as a user runs it at a terminal (not under CI's plain reporter, whatever
    this run's environment)."""
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "QNN_JOBS", "QNN_CACHE")}
    return subprocess.run(
        [sys.executable, "-m", "doit"],
        cwd=project.root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
