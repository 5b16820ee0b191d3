"""build/report.html's check margins and cost panel from a synthetic record holding every kind of check verify
writes (per output, per stream output, judged by the metric, a record from before per-output checks). The page of
a real build, rendered in headless Chromium, is tested in test_scale.py (test_the_html_report_*)."""
from __future__ import annotations

import math
import re

import pytest

from toolchain.stages import report_html


def record() -> dict:
    """A manifest as report_html reads it: one stream graph (default tier) and one old-style graph (full tier)."""
    vad = {"calls": 6, "max_abs": 0.01, "max_rel": 0.2, "cosine": 0.99, "seconds_per_call": 0.034,
           "outputs": {"prob": {"check": {"max_abs": 0.02}, "passed": True,
                                "at_worst_call": {"max_abs": 0.005, "max_rel": 0.2, "cosine": 1.0, "range": 0.8}},
                       "state": {"check": {"judged_by": "metric", "reason": "its own loop"}, "passed": None,
                                 "at_worst_call": {"max_abs": 9.0, "max_rel": 1.0, "cosine": 0.0, "range": 9.0}}}}
    stream = {"clip": {"calls": 100, "outputs": {"prob": {"check": {"max_abs": 0.02}, "passed": False, "peak": {
        "max_abs": "inf", "max_rel": "inf", "cosine": -1.0, "range": 0.5}}}}}   # an fp16 overflow, as recorded
    old = {"calls": 1, "max_abs": 0.3, "max_rel": 0.03, "cosine": 0.999}   # no outputs, no seconds_per_call
    return {"model": "m", "chip": {"name": "SM8750", "marketing": "8 Elite"}, "htp_arch": "v79",
            "precision": {"vad": "fp16", "enc": "fp16"}, "sdk": {"build_id": "v2.51.0"}, "parity": {"tensors": {}},
            "output_checks": {"vad": {"prob": {"max_abs": 0.02}}},
            "binaries": {"vad": {"bytes": 765_952, "compile_seconds": 0.3},
                         "enc": {"bytes": 20_869_120, "compile_seconds": 11.2}},
            "verify": {"default": {"status": "failed", "seconds": 4.0, "checks": {"max_rel": 0.05},
                                   "tensors": {"vad": vad}, "stream": {"vad": stream}},
                       "full": {"status": "passed", "seconds": 9.0, "tensors": {"enc": old},
                                "checks": {"max_rel": 0.02, "min_cosine": 0.99}}}}


def test_every_kind_of_check_gets_its_margin_to_its_limit():
    found = [(c["tier"], c["name"], c["margin"]) for c in report_html.checks(record())]
    assert found == [("default", "vad/prob", pytest.approx(0.25)), ("default", "vad/state", None),
                     ("default", "vad/prob, stream clip", math.inf),
                     ("full", "enc (all outputs)", pytest.approx(1.5))]   # max(0.03 / 0.02, 0.001 / 0.01)


def test_the_page_draws_within_over_and_metric_checks_and_the_cost_per_graph():
    html = report_html.page([record()])
    assert html.count('<g class="check within"') == 1 and html.count('<g class="check over"') == 2
    for state, name, label in (("within", "SM8750 vad/prob", "0.25"), ("over", "SM8750 vad/prob, stream clip", "inf"),
                               ("over", "SM8750 enc (all outputs) (full tier)", "1.5")):
        colour = report_html.WITHIN if state == "within" else report_html.OVER
        assert re.search(rf'<g class="check {state}" data-name="{re.escape(name)}"><title>[^<]*</title><rect [^>]*'
                         rf'fill="{colour}"/><text [^>]*>{label} of limit, {state}</text></g>', html), name
    assert f'width="{report_html.AXIS:.1f}" height="12" fill="{report_html.OVER}"' in html   # inf: clipped to the end
    assert re.search(r'<g class="check metric" data-name="SM8750 vad/state">.*?judged by the task metric', html)
    assert "4 checks: 1 within their limit, 2 over, 1 judged by the task metric" in html
    assert '<g class="cost" data-name="m/enc">' in html and ">11.2 s</text>" in html and ">20.87 MB</text>" in html
    assert html.count("not recorded") == 1 and ">0.034 s</text>" in html and ">0.77 MB</text>" in html
    assert html.count("<span class=bad>failed</span>") == 1


def test_the_margin_axis_is_logarithmic_and_clipped():
    assert report_html.margin_x(1.0) == pytest.approx(0.75 * report_html.AXIS)   # 0.001 .. 10: 1 at 3 of 4 decades
    assert report_html.margin_x(0.01) == pytest.approx(0.25 * report_html.AXIS)
    assert report_html.margin_x(0.0) == report_html.margin_x(1e-9) == 0.0
    assert report_html.margin_x(math.inf) == report_html.margin_x(50.0) == report_html.AXIS
