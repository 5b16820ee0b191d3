"""The chip index (what was built: chip -> soc id -> arch -> bundle -> sha256) and the
app-side choice NPU bundle or CPU fallback, which never assumes: anything unproven is a
fallback with its reason."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from toolchain import artifacts
from toolchain.engine.files import read_json, sha256, write_json
from toolchain.engine.run.worker import in_process
from toolchain.qnn import compat
from toolchain.stages import Project

CPU = "CPU fallback"
KINDS = ("onnxruntime", "sherpa-onnx")


@dataclass(frozen=True)
class Choice:
    """What the runtime selector picked for a device: a bundle (or the CPU), and why."""

    bundle: str           # a bundle path, or CPU
    reason: str
    chip: str | None = None
    sha256: str | None = None

    @property
    def npu(self) -> bool:
        return self.bundle != CPU


def tasks(project: Project):
    records = [artifacts.bundle_record(m, c) for m, c in project.model_chips()]
    manifests = [artifacts.manifest(m, c) for m, c in project.model_chips()]
    return {
        "doc": f"chip index of every bundle -> {artifacts.INDEX} (chip -> soc id -> arch -> bundle "
               "-> sha256)",
        "file_dep": manifests + records,
        "targets": [artifacts.INDEX],
        "clean": True,
        "actions": [(in_process, (write, records, artifacts.INDEX))],
    }


def write(records: list[str], out: str):
    """Paths in the index are relative to its own folder, so build/ can be copied as one piece.
    Each chip's entry leads with the build id and the runtime it needs; builds of other QAIRT
    families of the same chip are under `other_qairt` (family -> the same fields), the newest
    family's build on top."""
    base = os.path.dirname(out)
    index: dict = {"format": 2, "models": {}}
    builds: dict[tuple[str, str], tuple[dict, list[dict]]] = {}
    for path in records:
        r = read_json(path)
        bundles = {
            k: (
                {
                    "path": os.path.relpath(b["file"], base),
                    "sha256": b["sha256"],
                    "bytes": b["bytes"],
                }
                if b["shipped"]
                else {"path": None, "why_not": b.get("reason") or b.get("reasons")}
            )
            for k, b in r["bundles"].items()
        }
        build = {
            "qnn_runtime": compat.requirement(r["sdk_build_id"]),
            "sdk_build_id": r["sdk_build_id"],
            "toolchain": r["toolchain"],
            "runtime_family": r["runtime_libraries"]["family"],
            "bundles": bundles,
        }
        builds.setdefault((r["model"], r["chip"]), (r, []))[1].append(build)
    for (model, chip), (r, found) in builds.items():
        found.sort(
            key=lambda b: (
                compat.key(b["sdk_build_id"]) if compat.family(b["sdk_build_id"]) else (0, 0)
            ),
            reverse=True,
        )
        entry = {"soc_model": r["soc_model"], "htp_arch": r["htp_arch"], **found[0]}
        if found[1:]:
            entry["other_qairt"] = {b["qnn_runtime"]["qairt_family"]: b for b in found[1:]}
        index["models"].setdefault(model, {})[chip] = entry
    write_json(out, index)


def builds_of(entry: dict) -> list[dict]:
    """A chip entry's builds, newest QAIRT family first."""
    return [entry, *entry.get("other_qairt", {}).values()]


def select(
    ro_soc_model: str,
    libraries_loaded: bool,
    index: dict | str | Path,
    model_name: str | None = None,
    kind: str = "onnxruntime",
    root: str | None = None,
    runtime_qairt: str | None = None,
) -> Choice:
    """The bundle for this phone, or CPU with the reason. `index` is the JSON or its path; bundle
    paths are relative to `root` (default: the index's folder). The sha256 is checked on the file
    itself. `runtime_qairt`: the QAIRT version of the QNN libraries the app loaded; a binary of a
    newer family is refused here, with that reason, instead of failing at context creation on the
    device (the load rule: toolchain/qnn/compat.py)."""
    if isinstance(index, dict):
        data = index
    else:
        root, data = root or os.path.dirname(str(index)), read_json(index)
    models = data.get("models", {})
    if model_name is None:
        if len(models) != 1:
            return Choice(
                CPU, f"the index holds {len(models)} models ({', '.join(sorted(models))}): name one"
            )
        model_name = next(iter(models))
    if model_name not in models:
        return Choice(CPU, f"model {model_name!r} is not in the index")
    soc = (ro_soc_model or "").strip()   # getprop prints a newline; nothing else is normalised
    chips = models[model_name]
    if soc not in chips:
        return Choice(
            CPU,
            f"ro.soc.model {soc!r} matches no chip built for {model_name} "
            f"({', '.join(sorted(chips))})",
        )
    chosen = chips[soc]
    if runtime_qairt:
        try:
            loadable = [
                b for b in builds_of(chosen) if compat.loads(runtime_qairt, b["sdk_build_id"])
            ]
        except ValueError as err:
            return Choice(CPU, f"runtime_qairt: {err}", soc)
        if not loadable:
            newest = chosen["sdk_build_id"]
            oldest = builds_of(chosen)[-1]["sdk_build_id"]
            return Choice(
                CPU,
                f"the app's QNN runtime (QAIRT {runtime_qairt}) would refuse every {model_name} "
                "binary "
                f"for {soc}: built with {newest if newest == oldest else f'{oldest} to {newest}'}, "
                f"which needs a runtime of QAIRT >= {compat.family(oldest)}",
                soc,
            )
        chosen = {**chips[soc], **loadable[0]}
    entry = chosen.get("bundles", {}).get(kind)
    if kind not in KINDS or not entry or not entry.get("path"):
        why = entry.get("why_not") if entry else None
        return Choice(
            CPU, f"no {kind} bundle for {model_name} on {soc}" + (f": {why}" if why else ""), soc
        )
    if not libraries_loaded:
        return Choice(
            CPU, f"the QNN runtime libraries (QAIRT {chosen['runtime_family']}) did not load", soc
        )
    path = os.path.join(root or ".", entry["path"])
    if not os.path.isfile(path):
        return Choice(CPU, f"bundle {path} is missing", soc)
    got = sha256(path)
    if got != entry["sha256"]:
        return Choice(
            CPU,
            f"bundle {path} sha256 {got[:12]}... is not the index's {entry['sha256'][:12]}...",
            soc,
        )
    built = f", QAIRT {compat.family(chosen.get('sdk_build_id'))} build" if runtime_qairt else ""
    return Choice(
        path,
        f"{soc} = {chips[soc]['htp_arch']} build{built}, sha256 verified, libraries loaded",
        soc,
        got,
    )
