"""The report's QAIRT-family comparison: where one model and chip were built with several QAIRT
families (their manifests), one row per family with sizes, times and numerics, and a flag on a
family worse than the best."""
from __future__ import annotations

COLUMNS = (
    "model",
    "chip",
    "QAIRT",
    "build id",
    "binaries MB",
    "compile s",
    "sim s per call",
    "sim max rel",
    "min cosine",
    "task (default tier)",
    "flags",
)
# flagged beyond these ratios to the best family (simulator time, not the phone's)
SLOWER, BIGGER = 1.5, 1.10


def rows(manifests: list[dict]) -> list[list[str]]:
    """One row per QAIRT family where a (model, chip) was built with several: sizes, times,
    numerics, and a flag on a family worse than the best one by more than the model's own thresholds
    (tensor error: its max_rel; cosine: its min_cosine's margin), or slower / bigger than SLOWER /
    BIGGER times the best."""
    groups: dict = {}
    for m in manifests:
        groups.setdefault((m["model"], m["chip"]["name"]), []).append(m)
    rows = []
    for (model, chip), found in groups.items():
        if len(found) < 2:
            continue
        stats = [_family_stats(m) for m in found]
        best = {k: min(s[k] for s in stats) for k in ("bytes", "per_call", "max_rel")}
        best["cosine"] = max(s["cosine"] for s in stats)
        for m, s in sorted(zip(found, stats), key=lambda pair: pair[1]["family"]):
            checks = m["verify"]["default"]["checks"]
            flags = []
            if s["max_rel"] - best["max_rel"] > checks["max_rel"]:
                flags.append(
                    f"tensor error +{s['max_rel'] - best['max_rel']:.3g} over the best (> max_rel)"
                )
            if checks.get("min_cosine") and best["cosine"] - s["cosine"] > 1 - checks["min_cosine"]:
                flags.append(f"cosine {s['cosine']:.5f} vs best {best['cosine']:.5f}")
            if s["per_call"] > SLOWER * best["per_call"]:
                flags.append(f"simulator {s['per_call'] / best['per_call']:.1f}x the best")
            if s["bytes"] > BIGGER * best["bytes"]:
                flags.append(f"binaries {s['bytes'] / best['bytes']:.2f}x the best")
            rows.append(
                [
                    model,
                    chip,
                    s["family"],
                    m["sdk"]["build_id"] or "?",
                    f"{s['bytes'] / 1e6:.2f}",
                    ", ".join(f"{g} {b['compile_seconds']:.1f}" for g, b in m["binaries"].items()),
                    ", ".join(f"{g} {t:.3g}" for g, t in s["calls"].items()),
                    f"{s['max_rel']:.3g}",
                    f"{s['cosine']:.6f}",
                    m["verify"]["default"].get("task", {}).get("summary", "-"),
                    "; ".join(flags) or "ok",
                ]
            )
    return rows


def _family_stats(m: dict) -> dict:
    tensors = m["verify"]["default"]["tensors"]
    calls = {g: t.get("seconds_per_call") or 0.0 for g, t in tensors.items()}
    return {
        "family": (m.get("qnn_runtime") or {}).get("qairt_family") or "?",
        "bytes": sum(b["bytes"] for b in m["binaries"].values()),
        "calls": calls,
        "per_call": sum(calls.values()),
        "max_rel": max(t["max_rel"] for t in tensors.values()),
        "cosine": min(t.get("cosine", 1.0) for t in tensors.values()),
    }
