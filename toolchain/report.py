"""Summary table of every (model, chip) manifest: printed and written to build/report.md (and, with a
chart, to build/report.html by report_html.py)."""
from __future__ import annotations

from toolchain import paths, report_html
from toolchain.files import atomic_path, read_json

COLUMNS = ("model", "chip", "arch", "precision", "binaries MB", "compile s", "parity max abs",
           "parity task", "sim max rel", "sim task (default)", "sim task (full)", "verify s", "SDK")


def tasks(project):
    manifests = [paths.manifest(m, c) for m, c in project.model_chips()]
    return {"doc": "summary table of all manifests -> build/report.md (and stdout), build/report.html",
            "file_dep": manifests, "targets": [paths.REPORT, paths.REPORT_HTML], "clean": True, "verbosity": 2,
            "actions": [(write, (manifests, paths.REPORT)), (report_html.write, (manifests, paths.REPORT_HTML))]}


def row(m: dict) -> list[str]:
    parity, verify = m["parity"], m["verify"]["default"]
    full = m["verify"].get("full", {}).get("task", {}).get("summary", "-")
    return [m["model"], m["chip"]["name"], m["htp_arch"], "/".join(sorted(set(m["precision"].values()))),
            f"{sum(b['bytes'] for b in m['binaries'].values()) / 1e6:.1f}",
            " + ".join(f"{b['compile_seconds']:.1f}" for b in m["binaries"].values()),
            f"{max(t['max_abs'] for t in parity['tensors'].values()):.2g}" if parity["tensors"] else "skipped",
            parity.get("task", {}).get("summary", "-"),
            f"{max(t['max_rel'] for t in verify['tensors'].values()):.2g}",
            verify.get("task", {}).get("summary", "-"), full,
            f"{verify['seconds']:.0f}", m["sdk"]["build_id"] or "?"]


def table(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows]) + "\n"


def write(manifests: list[str], out: str):
    text = "# Build report\n\n" + table([row(read_json(p)) for p in manifests])
    with atomic_path(out) as tmp:
        tmp.write_text(text)
    print(text)
