"""build/report.html from the same grid and manifests as report.md: the model x chip grid (pass,
failed with its reason, not built), per model each check's margin to its limit, per chip the cost of
each graph (compile seconds, simulator seconds per call, binary MB), then per (model, chip) the
status, binary sizes, precision, accuracy and times, and what each graph became on the NPU. One
self-contained file: inline CSS and SVG, no script, nothing fetched."""
from __future__ import annotations

import math
from typing import cast

from toolchain.engine.files import atomic_path
from toolchain.shared import measures
from toolchain.stages.report import families as family_table


def escape(text: str) -> str:
    """html.escape, imported on the first call: doit's own process loads this module at every run,
    and html's import (its entity table) cost more than the rest of the module."""
    from html import escape as html_escape
    return html_escape(text)


WITHIN, OVER, METRIC, COST = "#2a7d2e", "#c0392b", "#999", "#2c6fbb"   # bar colours
CSS = f"""body{{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222}}
table{{border-collapse:collapse;margin:12px 0 28px}}
th,td{{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top}}
th{{background:#f0f0f0}}
td.n{{text-align:right;font-variant-numeric:tabular-nums}}
.ok{{color:#fff;background:{WITHIN};border-radius:3px;padding:0 6px}}
.bad{{color:#fff;background:{OVER};border-radius:3px;padding:0 6px}}small{{color:#666}}
.legend{{max-width:1000px;color:#444}}
figure{{display:inline-block;margin:0 24px 24px 0;vertical-align:top}}
figcaption{{font-weight:600}}table.grid td.cell{{min-width:120px;max-width:260px;font-size:12px}}
table.grid th{{white-space:nowrap}}td.pass{{background:#e3f1e4}}
td.failed{{background:#f8dcd8;border-color:{OVER}}}td.unbuilt{{color:#888;background:#f4f4f4}}"""
LOW, HIGH = 1e-3, 10.0   # the margin axis, log scale: values outside it are clipped to its ends
ROW, LABEL, AXIS = 18, 300, 400   # margin chart geometry, px: row height, label column, axis length
COLUMN, BAR = 240, 150   # cost chart geometry, px: one measure's column, its longest bar
MEASURES = (
    ("compile s", "{:.1f} s"),
    ("simulator s per call", "{:.3g} s"),
    ("binary MB", "{:.2f} MB"),
)


# the section report.after_build() writes, kept when the page is rewritten
LAST_BUILD = "<!-- last build -->"


def write(cells: list, out: str) -> None:
    """The page of these grid cells (report.Cell: a passing one carries its manifest), keeping the
    last build's section of the page it replaces."""
    text = page(cells)
    try:
        with open(out) as f:
            before = f.read()
    except OSError:
        before = ""
    if LAST_BUILD in before:
        text = text.removesuffix("</body></html>\n") + LAST_BUILD + before.split(LAST_BUILD, 1)[1]
    with atomic_path(out) as tmp:
        tmp.write_text(text)


def page(cells: list) -> str:
    records = [c.record for c in cells if c.record is not None]
    models = sorted({r["model"] for r in records})
    chips = sorted({r["chip"]["name"] for r in records})
    found = [c for r in records for c in checks(r)]
    over = sum(1 for c in found if c["margin"] is not None and c["margin"] > 1)
    judged = sum(1 for c in found if c["margin"] is None)
    margin_charts = "".join(
        f'<figure id="checks-{escape(m)}"><figcaption>{escape(m)}</figcaption>'
        f"{margins([r for r in records if r['model'] == m])}</figure>"
        for m in models
    )
    top = [max((cost[i] for r in records for cost in costs(r) if cost[i] is not None), default=0.0)
           for i in (1, 2, 3)]   # each measure's bars scaled to its largest value on any chip
    cost_charts = "".join(
        f'<figure id="cost-{escape(c)}"><figcaption>{escape(c)}</figcaption>'
        f"{cost_chart([r for r in records if r['chip']['name'] == c], top)}</figure>"
        for c in chips
    )
    heads = (
        "model",
        "chip",
        "status",
        "precision",
        "binaries",
        "parity max abs",
        "simulator max rel",
        "task metric",
        "compile s",
        "simulator s per call (not device latency)",
        "SDK",
    )
    body = "".join("<tr>" + "".join(row_cells(r)) + "</tr>" for r in records)
    failed = sum(1 for c in cells if c.state == "failed")
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>Build report</title>'
        f"<style>{CSS}</style></head><body><h1>Build report</h1>"
        f"<p>{len(cells)} (model, chip) pairs: {sum(1 for c in cells if c.state == 'pass')} pass, "
        f"<b>{failed} failed</b>, {sum(1 for c in cells if c.state == 'not built')} not built. "
        f"{len(records)} binary sets: {len(models)} model(s) on {len(chips)} chip(s); {len(found)} "
        "checks: "
        f"{len(found) - over - judged} within their limit, {over} over, {judged} judged by the "
        "task metric.</p>"
        f"{grid(cells)}"
        "<h2>Checks: share of the limit used</h2><p class=legend>One bar per check (model, chip, "
        "graph/output, "
        "and per stream clip the state loop's output): the measured error divided by its limit, "
        "at the worst "
        "call or chunk: |error| / (max_abs + max_rel &times; range), (1 &minus; cosine) / (1 "
        "&minus; min_cosine), "
        f"the larger where both are bounded. <b>Log scale</b> from {LOW:g} to {HIGH:g} (values "
        "outside are "
        f"clipped to the ends, the label keeps the value); the black line is the limit, 1.0. "
        f'<span style="color:{WITHIN}">Green: within</span> (&le; 1), <span '
        f'style="color:{OVER}">red: '
        "over</span> (&gt; 1), grey text: no numeric bound (judged by the task metric). Hover a "
        "bar for the "
        f"numbers and the bound.</p>{margin_charts}"
        "<h2>Cost per chip</h2><p class=legend>Per graph: compile seconds (its compile record), "
        "simulator "
        "seconds per call (the default tier's tensor check: the x86 simulator's mean time per "
        "call, "
        "<b>not the device's latency</b>) and the binary's size. <b>Linear scale</b>, each "
        "measure's bars relative to its largest value on any chip; the numbers are written "
        f"beside them.</p>{cost_charts}"
        f"<table><tr>{''.join(f'<th>{h}</th>' for h in heads)}</tr>{body}</table>"
        f"{qnn_graphs(records)}"
        f"{families(records)}</body></html>\n"
    )


def grid(cells: list) -> str:
    """The model x chip grid: one row per model, one column per chip; a cell green with its key
    metric and binary size, red with the failed task, its one-line reason and the file of its
    numbers, or grey: not built."""
    chips = sorted({c.chip for c in cells})
    at = {(c.model, c.chip): c for c in cells}
    head = "".join(f"<th>{escape(chip)}</th>" for chip in chips)
    rows = []
    for model in sorted({c.model for c in cells}):
        tds = []
        for chip in chips:
            c = at.get((model, chip))
            if c is None:
                tds.append("<td></td>")
            elif c.state == "pass" and c.record is not None:
                tds.append(f'<td class="cell pass"><b>pass</b><br>{escape(key_metric(c.record))}'
                           f'<br><small>{escape(binaries_mb(c.record))}</small></td>')
            elif c.state == "failed":
                # all of it on hover
                why = escape(c.reason if len(c.reason) <= 72 else c.reason[:69] + "...")
                where = f"<br><small>{escape(c.numbers)}</small>" if c.numbers else ""
                tds.append(f'<td class="cell failed" title="{escape(c.reason)}"><b>failed</b> '
                           f'<small>{escape(c.task)}</small><br>{why}{where}</td>')
            else:
                tds.append('<td class="cell unbuilt">not built</td>')
        rows.append(f"<tr><th>{escape(model)}</th>{''.join(tds)}</tr>")
    return (
        '<h2>Models and chips</h2><table '
        f'class="grid"><tr><th>model</th>{head}</tr>{"".join(rows)}</table>'
        if cells
        else ""
    )


def key_metric(record: dict) -> str:
    """A passing cell's one figure: the task metric's summary where the model has one, else
    the simulator error."""
    verify = record["verify"].get("full") or record["verify"]["default"]
    summary = verify.get("task", {}).get("summary")
    return summary.split(";")[0] if summary else f"sim max rel {sim_error(record):.2g}"


def binaries_mb(record: dict) -> str:
    return f"{sum(b['bytes'] for b in record['binaries'].values()) / 1e6:.1f} MB"


QNN = (
    "model",
    "graph",
    "QNN graph nodes",
    "ops by type (the EP's HTP lowering)",
    "tensors",
    "weights MB",
)


def qnn_rows(manifests: list[dict]) -> list[list[str]]:
    """What each graph became on the NPU, from the convert records (once per model: the recording is
    the same for every chip)."""
    rows, seen = [], set()
    for m in manifests:
        for graph, r in m.get("qnn_graph", {}).items():
            if (m["model"], graph) in seen:
                continue
            seen.add((m["model"], graph))
            ops = ", ".join(f"{op} {n}" for op, n in r["ops"].items())
            rows.append(
                [
                    m["model"],
                    graph,
                    str(r["nodes"]),
                    ops,
                    str(r["tensors"]),
                    f"{r['weight_bytes'] / 1e6:.1f}",
                ]
            )
    return rows


def qnn_graphs(records: list[dict]) -> str:
    """What each graph became on the NPU (report.md's QNN-graphs table)."""
    rows = qnn_rows(records)
    if not rows:
        return ""
    head = "".join(f"<th>{escape(h)}</th>" for h in QNN)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return ("<h2>QNN graphs (convert: what each graph became on the "
            f"NPU)</h2><table><tr>{head}</tr>{body}</table>")


def checks(record: dict) -> list[dict]:
    """Every check of one (model, chip) in its verify records, with its margin (error / limit; None:
    judged by the task metric): each output's worst call of the tensor check, each stream output's
    worst chunk; a graph of a record written before per-output checks, by its worst max_rel (and
    cosine) against the model's bounds."""
    found = []
    for tier, v in sorted(record["verify"].items()):
        for g, t in sorted(v["tensors"].items()):
            if "outputs" not in t:
                found.append(_graph_check(tier, g, t, v["checks"]))
            for o, w in sorted(t.get("outputs", {}).items()):
                found.append(_check(tier, f"{g}/{o}", w["check"], w["at_worst_call"], w["passed"],
                                    f"worst of {t['calls']} calls"))
        for g, clips in sorted(v.get("stream", {}).items()):
            for clip, s in sorted(clips.items()):
                for o, d in sorted(s["outputs"].items()):
                    found.append(
                        _check(
                            tier,
                            f"{g}/{o}, stream {clip}",
                            d["check"],
                            d["peak"],
                            d["passed"],
                            f"worst of {s['calls']} chunks",
                        )
                    )
    return found


def _check(
    tier: str, name: str, check: dict, errors: dict, passed: bool | None, where: str
) -> dict:
    if passed is None:
        return _entry(tier, name, None, f"judged by the task metric: {check.get('reason', '')}")
    # float(): a record says "inf" for an infinite error
    numbers = cast(measures.TensorErrors, {k: float(v) for k, v in errors.items()})
    detail = (
        f"max |error| {numbers['max_abs']:.3g}, cosine {numbers['cosine']:.6f}, range "
        f"{numbers['range']:.3g}; "
        f"allowed {measures.allowed(check, where)}"
    )
    return _entry(tier, name, measures.excess(numbers, cast(measures.OutputCheck, check)), detail)


def _graph_check(tier: str, graph: str, t: dict, bounds: dict) -> dict:
    """A graph's worst output against the model's max_rel and min_cosine (verify records
    before per-output checks)."""
    margin = float(t["max_rel"]) / bounds["max_rel"]
    detail = f"max rel {float(t['max_rel']):.3g} of the range, allowed {bounds['max_rel']:g}"
    if bounds.get("min_cosine"):
        margin = max(margin, (1.0 - float(t["cosine"])) / (1.0 - bounds["min_cosine"]))
        detail += f"; cosine {float(t['cosine']):.6f}, allowed {bounds['min_cosine']:g}"
    return _entry(tier, f"{graph} (all outputs)", margin, f"{detail} (worst of {t['calls']} calls)")


def _entry(tier: str, name: str, margin: float | None, detail: str) -> dict:
    return {"tier": tier, "name": name, "margin": margin, "detail": detail}


def margin_x(margin: float) -> float:
    """A margin's position on the axis, 0..AXIS px (log scale, clipped to LOW..HIGH)."""
    if margin <= LOW:
        return 0.0
    if margin >= HIGH:
        return float(AXIS)
    return AXIS * (math.log10(margin) - math.log10(LOW)) / (math.log10(HIGH) - math.log10(LOW))


def family(record: dict) -> str:
    return (record.get("qnn_runtime") or {}).get("qairt_family") or "?"


def margins(records: list[dict]) -> str:
    """One model's checks, one row each: a bar from the axis' start to the check's margin, the limit
    line at 1. A chip built with several QAIRT families names the family."""
    several = len({r["chip"]["name"] for r in records}) < len(records)
    rows = [
        (r["chip"]["name"] + (f" QAIRT {family(r)}" if several else ""), c)
        for r in sorted(records, key=lambda r: (r["chip"]["name"], family(r)))
        for c in checks(r)
    ]
    x0, top = LABEL, 20
    height = top + ROW * len(rows) + 6
    svg = []
    for k in range(round(math.log10(LOW)), round(math.log10(HIGH)) + 1):   # a tick per decade
        x = x0 + margin_x(10.0 ** k)
        svg.append(
            f'<line x1="{x:.1f}" y1="{top - 4}" x2="{x:.1f}" y2="{height - 6}" stroke="#ddd"/>'
            f'<text x="{x:.1f}" y="{top - 7}" font-size="10" text-anchor="middle">'
            f"{'1 = limit' if k == 0 else f'{10.0**k:g}'}</text>"
        )
    for i, (build, c) in enumerate(rows):
        y = top + i * ROW
        label = escape(
            f"{build} {c['name']}" + ("" if c["tier"] == "default" else f" ({c['tier']} tier)")
        )
        svg.append(
            f'<text x="{x0 - 6}" y="{y + 13}" font-size="11" text-anchor="end">{label}</text>'
        )
        if c["margin"] is None:
            svg.append(
                f'<g class="check metric" data-name="{label}"><title>{label}: '
                f'{escape(c["detail"])}</title>'
                f'<text x="{x0 + 4}" y="{y + 13}" font-size="11" fill="{METRIC}">'
                "judged by the task metric</text></g>"
            )
            continue
        state, colour = ("over", OVER) if c["margin"] > 1 else ("within", WITHIN)
        width = max(margin_x(c["margin"]), 2.0)  # a margin below the axis still shows a sliver
        svg.append(
            f'<g class="check {state}" data-name="{label}"><title>{label}: '
            f'{escape(c["detail"])}</title>'
            f'<rect x="{x0}" y="{y + 3}" width="{width:.1f}" height="{ROW - 6}" fill="{colour}"/>'
            f'<text x="{x0 + AXIS + 8}" y="{y + 13}" font-size="11" fill="{colour}">'
            f"{c['margin']:.2g} of limit, {state}</text></g>"
        )
    limit = x0 + margin_x(1.0)
    svg.append(
        f'<line x1="{limit:.1f}" y1="{top - 4}" x2="{limit:.1f}" y2="{height - 4}" stroke="#000" '
        f'stroke-width="2"/>'
    )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{x0 + AXIS + 160}" height="{height}" '
        'role="img" '
        f'aria-label="share of the limit used, per check">{"".join(svg)}</svg>'
    )


def costs(record: dict) -> list[tuple]:
    """Per graph of one (model, chip): (graph, compile seconds, simulator seconds per call or
    None, binary MB)."""
    tensors = record["verify"]["default"]["tensors"]
    return [(g, b["compile_seconds"], tensors.get(g, {}).get("seconds_per_call"), b["bytes"] / 1e6)
            for g, b in sorted(record["binaries"].items())]


def cost_chart(records: list[dict], top: list[float]) -> str:
    """One chip's graphs, one row each: a bar per measure, scaled to `top` (that measure's largest
    on any chip)."""
    several = len({r["model"] for r in records}) < len(records)
    rows = [(r["model"] + (f" QAIRT {family(r)}" if several else ""), cost)
            for r in sorted(records, key=lambda r: (r["model"], family(r))) for cost in costs(r)]
    x0, first = 280, 20
    svg = [
        f'<text x="{x0 + j * COLUMN}" y="12" font-size="11" '
        f'font-weight="600">{escape(title)}</text>'
        for j, (title, _) in enumerate(MEASURES)
    ]
    for i, (model, cost) in enumerate(rows):
        y, name = first + i * ROW, f"{model}/{cost[0]}"
        cells = [
            f'<text x="{x0 - 6}" y="{y + 13}" font-size="11" '
            f'text-anchor="end">{escape(name)}</text>'
        ]
        for j, ((_, fmt), value) in enumerate(zip(MEASURES, cost[1:])):
            x = x0 + j * COLUMN
            if value is None:
                cells.append(
                    f'<text x="{x}" y="{y + 13}" font-size="11" fill="#666">not recorded</text>'
                )
                continue
            width = BAR * value / top[j] if top[j] else 0.0
            cells.append(
                f'<rect x="{x}" y="{y + 3}" width="{width:.1f}" height="{ROW - 6}" fill="{COST}"/>'
                f'<text class="value" x="{x + width + 4:.1f}" y="{y + 13}" font-size="11">'
                f"{fmt.format(value)}</text>"
            )
        svg.append(f'<g class="cost" data-name="{escape(name)}">{"".join(cells)}</g>')
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{x0 + len(MEASURES) * COLUMN}" '
        f'height="{first + ROW * len(rows) + 6}" role="img" aria-label="cost per '
        f'graph">{"".join(svg)}</svg>'
    )


def families(records: list[dict]) -> str:
    """The report's QAIRT-family comparison (stages/report/families.py), where some model and
    chip has several."""
    rows = family_table.rows(records)
    if not rows:
        return ""
    head = "".join(f"<th>{escape(h)}</th>" for h in family_table.COLUMNS)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<h2>QAIRT families</h2><table><tr>{head}</tr>{body}</table>"


def sim_error(record: dict) -> float:
    """The worst error of the range; for a model with per-output checks (a probability judged
    absolutely), the worst call's share of its output's bound (an error relative to a near-zero
    range means nothing)."""
    tensors = record["verify"]["default"]["tensors"].values()
    if "output_checks" not in record:
        return max(t["max_rel"] for t in tensors)
    return max(
        (
            measures.excess(o["at_worst_call"], o["check"])
            for t in tensors
            for o in t["outputs"].values()
            if o["passed"] is not None
        ),
        default=0.0,
    )


def sim_limit(record: dict) -> float | None:
    return (
        1.0
        if "output_checks" in record
        else record["verify"]["default"].get("checks", {}).get("max_rel")
    )


def row_cells(r: dict) -> list[str]:
    parity = r["parity"]
    tiers = ", ".join(sorted(r["verify"]))
    passed = all(v.get("status", "passed") == "passed" for v in r["verify"].values())
    binaries = "<br>".join(
        f"{escape(g)}: {b['bytes'] / 1e6:.2f} MB" for g, b in r["binaries"].items()
    )
    parity_abs = (
        f"{max(t['max_abs'] for t in parity['tensors'].values()):.2g}"
        if parity.get("tensors")
        else "skipped"
    )
    limit = sim_limit(r)
    task = "<br>".join(metric(v.get("task")) for v in r["verify"].values() if v.get("task")) or "-"
    values = [
        (escape(r["model"]), ""),
        (
            f"{escape(r['chip']['name'])}<br><small>{escape(r['htp_arch'])}, "
            f"{escape(r['chip'].get('marketing', ''))}</small>",
            "",
        ),
        (
            f"<span class={'ok>pass' if passed else 'bad>failed'}</span> "
            f"<small>{escape(tiers)}</small>",
            "",
        ),
        (escape("/".join(sorted(set(r["precision"].values())))), ""),
        (binaries, "n"),
        (parity_abs, "n"),
        (
            f"{sim_error(r):.2g}" + (f" <small>&le; {limit}</small>" if limit is not None else ""),
            "n",
        ),
        (task, ""),
        (" + ".join(f"{b['compile_seconds']:.1f}" for b in r["binaries"].values()), "n"),
        (sim_per_call(r), "n"),
        (escape(str(r["sdk"]["build_id"] or "?")), ""),
    ]
    return [f"<td class={cls}>{v}</td>" if cls else f"<td>{v}</td>" for v, cls in values]


def sim_per_call(r: dict) -> str:
    """Each graph's simulator seconds per call of the tensor check, to 2 significant digits (never
    rounded to 0)."""
    per = [
        (g, t.get("seconds_per_call")) for g, t in sorted(r["verify"]["default"]["tensors"].items())
    ]
    return "<br>".join(f"{escape(g)}: {s:.2g}" for g, s in per if s is not None) or "-"


def metric(task: dict) -> str:
    """The model's task metric: its summary line and its numbers (WER, cosine, top-1, ...)."""
    numbers = [f"{k} {v:.4g}" for k, v in sorted(task.items())
               if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return escape(task.get("summary", "")) + (
        f" <small>({escape(', '.join(numbers))})</small>" if numbers else ""
    )
