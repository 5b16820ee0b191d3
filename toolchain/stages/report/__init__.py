"""Summary of every (model, chip) of the project: printed and written to build/report.md (and, with
a chart, to build/report.html by stages/report/page.py). It opens with the model x chip grid: pass
(its key metric and binary size), failed (its one-line reason and the file that holds its numbers)
or not built; then the tables of the manifests.

The report tells what is true now, failed checks included: the report task cannot run when a check
it depends on failed (doit skips it, under --continue too), so after every build that ran something,
after_build() writes it again from the manifests on disk and the engine's record of what failed
(engine/state/failures.py), and first removes what still claims a result the failure overturned
(claims(): the old manifest, verify records and bundles downstream)."""
from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from html import escape

from toolchain import artifacts
from toolchain.engine import paths
from toolchain.engine.files import atomic_path, read_json
from toolchain.engine.run.worker import in_process
from toolchain.engine.state import failures, outputs
from toolchain.spec.chips import Chip
from toolchain.spec.records import Model
from toolchain.stages import Project, manifest
from toolchain.stages.report import families, page

COLUMNS = ("model", "chip", "arch", "precision", "binaries MB", "compile s", "parity max abs",
           "parity task", "sim max rel", "sim task (default)", "sim task (full)", "verify s", "SDK")


def tasks(project: Project) -> dict:
    manifests, runs = sources(project, project.model_chips())
    return {
        "doc": "summary table of all manifests -> build/report.md (and stdout), build/report.html",
        "file_dep": manifests + runs,
        "targets": [artifacts.REPORT, artifacts.REPORT_HTML],
        "clean": True,
        "verbosity": 2,
        "actions": [(in_process, (write_all, pairs(project, project.model_chips()), runs))],
    }


def sources(
    project: Project, model_chips: Iterable[tuple[Model, Chip]]
) -> tuple[list[str], list[str]]:
    """The manifests of these (model, chip) pairs, and the runtime-loop records of
    the runtime-gated ones."""
    found = list(model_chips)
    return ([artifacts.manifest(m, c) for m, c in found],
            [artifacts.sherpa_run(m, c, tier) for m, c in found if project.runtime_gate(m)
             for tier in ("default", "full") if tier == "default" or project.wants_full_tier(m, c)])


def of_part(project: Project, model_chips: Iterable[tuple[Model, Chip]], out: str) -> dict:
    """What `doit model:<name>` and `doit chip:<CHIP>` add to their tasks: the report of what that
    part of the build made (the same tables as build/report.md), without building the rest."""
    manifests, runs = sources(project, model_chips)
    return {"file_dep": manifests + runs, "targets": [out], "clean": True, "verbosity": 2,
            "actions": [(in_process, (write, pairs(project, model_chips), out, runs))]}


@dataclass(frozen=True)
class Pair:
    """One (model, chip) of the project, as the report finds it: its manifest and what claims a
    result for it."""
    model: str
    chip: str
    manifest: str
    claims: tuple[str, ...]


def pairs(project: Project, model_chips: Iterable[tuple[Model, Chip]]) -> list[Pair]:
    return [
        Pair(m.name, c.name, artifacts.manifest(m, c), tuple(artifacts.claims(m, c)))
        for m, c in model_chips
    ]


@dataclass(frozen=True)
class Cell:
    """One (model, chip) of the grid: "pass", "failed" or "not built"; a passing cell's manifest, a
    failed one's reason, the task that failed and the file that holds its numbers."""
    model: str
    chip: str
    state: str
    record: dict | None = None
    reason: str = ""
    task: str = ""
    numbers: str = ""


def grid(found: list[Pair], standing: dict[str, dict]) -> list[Cell]:
    """Each pair's state now: failed where a standing failure made or overturned its manifest (the
    failure furthest upstream named), else passed where its manifest is, else not built."""
    cells = []
    for p in found:
        hits = [
            (name, f)
            for name, f in standing.items()
            if p.manifest in f["blocked"] or p.manifest in f["targets"]
        ]
        if hits:
            name, f = max(hits, key=lambda hit: (len(hit[1]["blocked"]), hit[0]))
            cells.append(
                Cell(
                    p.model, p.chip, "failed", reason=f["reason"], task=name, numbers=numbers_of(f)
                )
            )
        elif os.path.isfile(p.manifest):
            record = read_json(p.manifest)
            passed = all(v.get("status", "passed") == "passed" for v in record["verify"].values())
            cells.append(
                Cell(p.model, p.chip, "pass", record)
                if passed
                else Cell(
                    p.model,
                    p.chip,
                    "failed",
                    record,
                    "a check in its manifest is over its limit",
                    numbers=p.manifest,
                )
            )
        else:
            cells.append(Cell(p.model, p.chip, "not built"))
    return cells


def numbers_of(failure: dict) -> str:
    """The failed task's record that holds its numbers (a failed verify's verify.json),
    else its log."""
    there = [t for t in failure["targets"] if os.path.isfile(t)]
    return next(
        (t for t in there if t.endswith(".json")),
        next((t for t in there if t.endswith(".log")), ""),
    )


def overturned(found: list[Pair], standing: dict[str, dict]) -> list[str]:
    """Remove what still claims a result a standing failure overturned: a pair's old manifest,
    verify records, bundles and runtime-loop records downstream of the failed task (the failed
    task's own record stays: it holds the numbers). The binaries and everything upstream stay (a fix
    rebuilds only what it touches)."""
    removed = []
    for f in standing.values():
        blocked, own = set(f["blocked"]), set(f["targets"])
        for p in found:
            for path in p.claims:
                if path in blocked and path not in own and os.path.isfile(path):
                    os.remove(path)
                    removed.append(path)
    return removed


def row(m: dict) -> list[str]:
    parity, verify = m["parity"], m["verify"]["default"]
    full = m["verify"].get("full", {}).get("task", {}).get("summary", "-")
    return [
        m["model"],
        m["chip"]["name"],
        m["htp_arch"],
        "/".join(sorted(set(m["precision"].values()))),
        f"{sum(b['bytes'] for b in m['binaries'].values()) / 1e6:.1f}",
        " + ".join(f"{b['compile_seconds']:.1f}" for b in m["binaries"].values()),
        f"{max(t['max_abs'] for t in parity['tensors'].values()):.2g}"
        if parity["tensors"]
        else "skipped",
        parity.get("task", {}).get("summary", "-"),
        _sim_error(m, verify),
        verify.get("task", {}).get("summary", "-"),
        full,
        f"{verify['seconds']:.3g}",
        m["sdk"]["build_id"] or "?",
    ]


def _sim_error(m: dict, verify: dict) -> str:
    """page.sim_error, said in words for a model with per-output checks."""
    return f"{page.sim_error(m):.2g}" + (" of bound" if "output_checks" in m else "")


def table(rows: list[list[str]], columns: Sequence[str] = COLUMNS) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows]) + "\n"


COST = (
    "model",
    "chip",
    "graph I/O MB per call (enc / dec)",
    "binaries MB (enc / dec)",
    "runtime loop",
    "sim s per encoder call",
    "sim s per decoder call",
    "loop vs CPU ONNX",
)


def cost_rows(manifests: list[dict], runs: dict) -> list[list[str]]:
    """Per encoder/decoder model and chip: I/O volume per call, sizes, and the
    runtime loop's timings."""
    rows = []
    for m in manifests:
        # a model with windows: its 30 s pair here
        if not {"encoder", "decoder"} <= set(m["graphs"]):
            continue
        run = runs.get((m["model"], m["chip"]["name"]))

        def mb(b):
            return f"{b / 1e6:.1f}"

        rows.append(
            [
                m["model"],
                m["chip"]["name"],
                " / ".join(
                    mb(manifest.io_bytes(m["graphs"][g]["io"])) for g in ("encoder", "decoder")
                ),
                " / ".join(mb(m["binaries"][g]["bytes"]) for g in ("encoder", "decoder")),
                "sherpa-onnx (QNN C API)" if run else "onnxruntime EP (verify)",
                f"{run['cost']['sim_seconds_per_encoder_call']:.1f}"
                if run
                else _per_call(m, "encoder", 1),
                f"{run['cost']['sim_seconds_per_decoder_call']:.2f}"
                if run
                else _per_call(m, "decoder", 2),
                run["task"]["summary"] if run else "-",
            ]
        )
    return rows


def _per_call(m: dict, graph: str, digits: int) -> str:
    """Simulator seconds per call of the verify stage's tensor check (onnxruntime's QNN EP), to
    `digits` significant digits (a 0.02 s call is not rounded to 0)."""
    t = m["verify"]["default"]["tensors"][graph].get("seconds_per_call")
    return "-" if t is None else f"{t:.{max(digits, 2)}g}"


STREAM = ("model", "chip", "graph", "chunk / hop / context", "I/O bytes per call", "sim s per call",
          "chunks checked", "largest drift (output: max abs, chunk)")


def stream_rows(manifests: list[dict]) -> list[list[str]]:
    """Per stateful graph and chip: what one call costs, and how far the simulator's
    own-state loop drifted."""
    rows = []
    for m in manifests:
        verify = m["verify"]["default"]
        for graph, contract in m.get("state_contract", {}).items():
            g = contract["stream"]
            clips = verify.get("stream", {}).get(graph, {})
            worst = max(
                ((o, d, clip) for clip, c in clips.items() for o, d in c["outputs"].items()),
                key=lambda x: x[1]["max_abs"],
                default=None,
            )
            # a stream through two graphs
            made = f", made by {g['step']}() from {g['from']}" if "from" in g else ""
            rows.append(
                [
                    m["model"],
                    m["chip"]["name"],
                    graph,
                    f"{g['chunk']} / {g['hop']} / {g['context']}{made}",
                    str(manifest.io_bytes(m["graphs"][graph]["io"])),
                    _per_call(m, graph, 4),
                    str(sum(c["calls"] for c in clips.values())),
                    f"{worst[0]}: {worst[1]['max_abs']:.2g}, chunk {worst[1]['peak_chunk']} of "
                    f"{worst[2]}"
                    if worst
                    else "-",
                ]
            )
    return rows


WINDOWS = (
    "model",
    "chip",
    "window",
    "graphs",
    "binaries MB (each graph)",
    "I/O MB per call (each graph)",
    "sim s per call (each graph)",
    "simulator vs CPU",
    "as at the largest window (simulator)",
)


def window_rows(manifests: list[dict]) -> list[list[str]]:
    """Per [windows] model, chip and window: sizes, data moved, simulator time, and the task metric
    against the CPU at the same window and against the largest window (the verify record's "windows"
    rows from agree(): the full tier's, all clips, where the chip ran it); then the shared context
    against the windows' own binaries."""
    rows = []
    for m in manifests:
        windows = m.get("windows")
        if not windows:
            continue
        verified = m["verify"].get("full") or m["verify"]["default"]
        task = verified.get("task", {}).get("windows", {})
        for size, graphs in sorted(windows["graphs"].items(), key=lambda item: int(item[0])):
            pair = list(graphs.values())
            row = task.get(size, {})
            mb = " / ".join(f"{m['binaries'][g]['bytes'] / 1e6:.1f}" for g in pair)
            io = " / ".join(f"{manifest.io_bytes(m['graphs'][g]['io']) / 1e6:.1f}" for g in pair)
            sim = " / ".join(_per_call(m, g, 2) for g in pair)
            same = (
                f"{row['same_as_30s']}/{len(row.get('clips', []))}" if "same_as_30s" in row else "-"
            )
            rows.append(
                [
                    m["model"],
                    m["chip"]["name"],
                    f"{size}{windows['unit']}",
                    ", ".join(pair),
                    mb,
                    io,
                    sim,
                    row.get("summary", "(largest)" if not row else "-").split(";")[0],
                    same,
                ]
            )
        shared = m.get("shared_context", {}).get("record")
        if shared:
            rows.append(
                [
                    m["model"],
                    m["chip"]["name"],
                    "all, one context",
                    f"{len(shared['graphs'])} graphs",
                    f"{shared['bytes'] / 1e6:.1f} "
                    f"(separately {shared['separate_total'] / 1e6:.1f})",
                    "-",
                    "-",
                    "not simulated (the simulator cannot load shared weights)",
                    "-",
                ]
            )
    return rows


def write_all(found: list[Pair], runs: list[str], show: bool = True) -> None:
    """build/report.md and report.html (the report task's action, and after_build's,
    which prints nothing)."""
    cells = grid(found, failures.load())
    write(found, artifacts.REPORT, runs, cells, show)
    page.write(cells, artifacts.REPORT_HTML)


def write(
    found: list[Pair],
    out: str,
    runs: tuple[str, ...] | list[str] = (),
    cells: list[Cell] | None = None,
    show: bool = True,
) -> None:
    cells = grid(found, failures.load()) if cells is None else cells
    records = [c.record for c in cells if c.record is not None]
    by_chip = {}
    for path in runs:   # the default tier's record, replaced by the full tier's where it ran
        if os.path.exists(path):
            r = read_json(path)
            key = (path.split("/")[1], path.split("/")[3])
            if key not in by_chip or r["tier"] == "full":
                by_chip[key] = r
    text = "# Build report\n\n" + grid_table(cells) + "\n" + table([row(r) for r in records])
    costs = cost_rows(records, by_chip)
    if costs:
        text += ("\n## Encoder/decoder cost per call (simulator seconds, not device latency)\n\n"
                 + table(costs, COST))
    streams = stream_rows(records)
    if streams:
        text += (
            "\n## Stateful graphs: cost per call and drift (each backend feeding back its own "
            "state)\n\n"
            + table(streams, STREAM)
        )
    windows = window_rows(records)
    if windows:
        text += ("\n## Windows (one graph pair per input length; docs/whisper-windows.md)\n\n"
                 + table(windows, WINDOWS))
    graphs = page.qnn_rows(records)
    if graphs:
        text += "\n## QNN graphs (convert: what each graph became on the NPU)\n\n" + table(
            graphs, page.QNN
        )
    builds = families.rows(records)
    if builds:
        text += (
            "\n## QAIRT families (one model and chip built with several; a runtime loads its own "
            "family's "
            "binaries and older ones)\n\n" + table(builds, families.COLUMNS)
        )
    with atomic_path(out) as tmp:
        tmp.write_text(text + last_build(out))
    if show:
        print(text)


def grid_table(cells: list[Cell]) -> str:
    """The model x chip grid in Markdown: one row per model, one column per chip."""
    chips = sorted({c.chip for c in cells})
    models = sorted({c.model for c in cells})
    at = {(c.model, c.chip): c for c in cells}
    failed = sum(1 for c in cells if c.state == "failed")
    lines = [
        f"{len(cells)} (model, chip) pairs: {sum(1 for c in cells if c.state == 'pass')} pass, "
        f"{failed} failed, "
        f"{sum(1 for c in cells if c.state == 'not built')} not built.\n",
        "| model | " + " | ".join(chips) + " |",
        "|---|" + "---|" * len(chips),
    ]
    for m in models:
        lines.append(
            f"| {m} | " + " | ".join(_grid_cell(at.get((m, chip))) for chip in chips) + " |"
        )
    return "\n".join(lines) + "\n"


def _grid_cell(cell: Cell | None) -> str:
    if cell is None:
        return ""
    if cell.state == "pass" and cell.record is not None:
        metric, size = page.key_metric(cell.record), page.binaries_mb(cell.record)
        return f"pass · {metric} · {size}".replace("|", "/")
    if cell.state == "failed":
        where = f" ({cell.numbers})" if cell.numbers else ""
        return f"**FAILED** {cell.task}: {cell.reason}{where}".replace("|", "/")
    return "not built"


LAST_BUILD = "\n## Last build\n\n"   # the section after_build() rewrites


def last_build(out: str) -> str:
    """The section of the last build's critical path and timeline, as the report held it
    (after_build wrote it)."""
    try:
        with open(out) as f:
            before = f.read()
    except OSError:
        return ""
    return before[before.index(LAST_BUILD):] if LAST_BUILD in before else ""


def after(project: Project) -> Callable[[str], None]:
    """What the build calls after it ran something (engine/run/trace.py's `after`): after_build
    for this project."""
    def then(summary_line: str) -> None:  # the pairs found only then: a no-op pays nothing
        after_build(
            summary_line,
            pairs(project, project.model_chips()),
            sources(project, project.model_chips())[1],
        )
    return then


def after_build(summary_line: str, found: list[Pair], runs: list[str]) -> None:
    """After a build that ran something: what a standing failure overturned is removed,
    build/report.md and report.html are written from what is true now (the report task is skipped
    when a check failed) and end with the build's critical path and timeline (build/trace.svg),
    recorded as the report task's own bytes."""
    standing = failures.load()
    for path in overturned(found, standing):
        print(f"removed {path}: it claimed a result that a failed step overturned ({paths.FAILED})")
    write_all(found, runs, show=False)
    section = (f"{LAST_BUILD}{summary_line}\n\n![timeline of the last build, one row per lane]"
               f"({os.path.relpath(paths.TRACE_SVG, os.path.dirname(artifacts.REPORT))})\n"
               f"Trace: {paths.TRACE} (opens in Perfetto or chrome://tracing)\n")
    if os.path.isfile(artifacts.REPORT):
        with open(artifacts.REPORT) as f:
            text = f.read()
        with atomic_path(artifacts.REPORT) as tmp:
            tmp.write_text(text.split(LAST_BUILD)[0] + section)
        outputs.rewritten("report", artifacts.REPORT)
    if os.path.isfile(artifacts.REPORT_HTML) and os.path.isfile(paths.TRACE_SVG):
        with open(artifacts.REPORT_HTML) as f:
            html = f.read()
        with open(paths.TRACE_SVG) as f:
            svg = f.read()
        html = html.split(page.LAST_BUILD)[0].removesuffix("</body></html>\n")
        with atomic_path(artifacts.REPORT_HTML) as tmp:
            tmp.write_text(
                f"{html}{page.LAST_BUILD}<h2>Last build</h2><p>{escape(summary_line)}</p>"
                f"<figure>{svg}</figure></body></html>\n"
            )
        outputs.rewritten("report", artifacts.REPORT_HTML)
