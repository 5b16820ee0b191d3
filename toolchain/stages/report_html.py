"""build/report.html from the same manifests as report.md: per (model, chip) the status, binary sizes,
precision, accuracy and times, and per model a chart of simulator error and binary size per chip. One
self-contained file: inline CSS and SVG, no script, nothing fetched."""
from __future__ import annotations

from html import escape

from toolchain.engine.files import atomic_path, read_json
from toolchain.stages import compare
from toolchain.stages import families as family_table

CSS = """body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222}
table{border-collapse:collapse;margin:12px 0 28px}th,td{border:1px solid #ccc;padding:4px 8px;text-align:left;
vertical-align:top}th{background:#f0f0f0}td.n{text-align:right;font-variant-numeric:tabular-nums}
.ok{color:#fff;background:#2a7d2e;border-radius:3px;padding:0 6px}small{color:#666}
figure{display:inline-block;margin:0 24px 24px 0}figcaption{font-weight:600}"""
BAR, GAP, HEIGHT = 40, 14, 150   # chart geometry, px


def write(manifests: list[str], out: str):
    with atomic_path(out) as tmp:
        tmp.write_text(page([read_json(p) for p in manifests]))


def page(records: list[dict]) -> str:
    models = sorted({r["model"] for r in records})
    charts = "".join(f"<figure><figcaption>{escape(m)}</figcaption>"
                     f"{chart([r for r in records if r['model'] == m])}</figure>" for m in models)
    heads = ("model", "chip", "status", "precision", "binaries", "parity max abs", "simulator max rel",
             "task metric", "compile s", "simulator s", "SDK")
    body = "".join("<tr>" + "".join(cells(r)) + "</tr>" for r in records)
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>Build report</title>"
            f"<style>{CSS}</style></head><body><h1>Build report</h1>"
            f"<p>{len(records)} binary sets: {len(models)} model(s) on "
            f"{len({r['chip']['name'] for r in records})} chip(s). Every row passed its checks "
            f"(a failed check leaves no manifest).</p>{charts}"
            f"<table><tr>{''.join(f'<th>{h}</th>' for h in heads)}</tr>{body}</table>{families(records)}"
            "</body></html>\n")


def families(records: list[dict]) -> str:
    """The report's QAIRT-family comparison (stages/families.py), where some model and chip has several."""
    rows = family_table.rows(records)
    if not rows:
        return ""
    head = "".join(f"<th>{escape(h)}</th>" for h in family_table.COLUMNS)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<h2>QAIRT families</h2><table><tr>{head}</tr>{body}</table>"


def sim_error(record: dict) -> float:
    """The worst error of the range; for a model with per-output checks (a probability judged absolutely),
    the worst call's share of its output's bound (an error relative to a near-zero range means nothing)."""
    tensors = record["verify"]["default"]["tensors"].values()
    if "output_checks" not in record:
        return max(t["max_rel"] for t in tensors)
    return max((compare.excess(o["at_worst_call"], o["check"]) for t in tensors for o in t["outputs"].values()
                if o["passed"] is not None), default=0.0)


def sim_limit(record: dict):
    return 1.0 if "output_checks" in record else record["verify"]["default"].get("checks", {}).get("max_rel")


def cells(r: dict) -> list[str]:
    verify, parity = r["verify"]["default"], r["parity"]
    tiers = ", ".join(sorted(r["verify"]))
    binaries = "<br>".join(f"{escape(g)}: {b['bytes'] / 1e6:.2f} MB" for g, b in r["binaries"].items())
    parity_abs = (f"{max(t['max_abs'] for t in parity['tensors'].values()):.2g}" if parity.get("tensors")
                  else "skipped")
    limit = sim_limit(r)
    task = "<br>".join(metric(v.get("task")) for v in r["verify"].values() if v.get("task")) or "-"
    values = [(escape(r["model"]), ""), (f"{escape(r['chip']['name'])}<br><small>{escape(r['htp_arch'])}, "
                                         f"{escape(r['chip'].get('marketing', ''))}</small>", ""),
              (f"<span class=ok>pass</span> <small>{escape(tiers)}</small>", ""),
              (escape("/".join(sorted(set(r["precision"].values())))), ""), (binaries, "n"), (parity_abs, "n"),
              (f"{sim_error(r):.2g}" + (f" <small>&le; {limit}</small>" if limit is not None else ""), "n"),
              (task, ""), (" + ".join(f"{b['compile_seconds']:.1f}" for b in r["binaries"].values()), "n"),
              (f"{verify['seconds']:.0f}", "n"), (escape(str(r["sdk"]["build_id"] or "?")), "")]
    return [f"<td class={cls}>{v}</td>" if cls else f"<td>{v}</td>" for v, cls in values]


def metric(task: dict) -> str:
    """The model's task metric: its summary line and its numbers (WER, cosine, top-1, ...)."""
    numbers = [f"{k} {v:.4g}" for k, v in sorted(task.items())
               if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return escape(task.get("summary", "")) + (f" <small>({escape(', '.join(numbers))})</small>" if numbers else "")


def chart(records: list[dict]) -> str:
    """Two bar panels over the model's chips: simulator error (with its limit) and total binary size."""
    panels = [("simulator max rel error", [sim_error(r) for r in records], "#c0392b",
               sim_limit(records[0]), ".2g"),
              ("binary size, MB", [sum(b["bytes"] for b in r["binaries"].values()) / 1e6 for r in records],
               "#2c6fbb", None, ".3g")]
    width = len(records) * (BAR + GAP) + GAP
    svg = []
    for i, (title, values, colour, limit, fmt) in enumerate(panels):
        x0, top = 40 + i * (width + 60), 24
        scale = 1.15 * max(values) or 1.0   # the limit line only when it falls inside the panel
        svg.append(f'<text x="{x0}" y="14" font-size="12">{escape(title)}</text>'
                   f'<line x1="{x0}" y1="{top + HEIGHT}" x2="{x0 + width}" y2="{top + HEIGHT}" stroke="#444"/>')
        for j, (r, v) in enumerate(zip(records, values)):
            h, x = HEIGHT * v / scale, x0 + GAP + j * (BAR + GAP)
            svg.append(f'<rect x="{x}" y="{top + HEIGHT - h:.1f}" width="{BAR}" height="{h:.1f}" fill="{colour}">'
                       f'<title>{escape(r["chip"]["name"])}: {v:.4g}</title></rect>'
                       f'<text x="{x + BAR / 2}" y="{top + HEIGHT - h - 3:.1f}" font-size="10" '
                       f'text-anchor="middle">{v:{fmt}}</text>'
                       f'<text x="{x + BAR / 2}" y="{top + HEIGHT + 14}" font-size="10" '
                       f'text-anchor="middle">{escape(r["chip"]["name"])}</text>')
        if limit and limit > scale:
            svg.append(f'<text x="{x0}" y="{top + HEIGHT + 30}" font-size="10" fill="#c0392b">limit {limit}: '
                       f'{limit / max(values):.0f}x the worst chip</text>' if max(values) else "")
        elif limit:
            y = top + HEIGHT - HEIGHT * limit / scale
            svg.append(f'<line x1="{x0}" y1="{y:.1f}" x2="{x0 + width}" y2="{y:.1f}" stroke="#c0392b" '
                       f'stroke-dasharray="4 3"/><text x="{x0 + width + 2}" y="{y + 4:.1f}" font-size="10" '
                       f'fill="#c0392b">limit {limit}</text>')
    total = 2 * (width + 60) + 40
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{total}" height="{HEIGHT + 64}" '
            f'role="img" aria-label="simulator error and binary size per chip">{"".join(svg)}</svg>')
