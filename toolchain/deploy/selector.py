"""The chip index (what was built: chip -> soc id -> arch -> bundle -> sha256) and the app-side choice
NPU bundle or CPU fallback, which never assumes: anything unproven is a fallback with its reason."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from toolchain.engine import paths
from toolchain.engine.files import read_json, sha256, write_json
from toolchain.engine.worker import in_process

CPU = "CPU fallback"
KINDS = ("onnxruntime", "sherpa-onnx")


@dataclass(frozen=True)
class Choice:
    bundle: str           # a bundle path, or CPU
    reason: str
    chip: str | None = None
    sha256: str | None = None

    @property
    def npu(self) -> bool:
        return self.bundle != CPU


def tasks(project):
    records = [paths.bundle_record(m, c) for m, c in project.model_chips()]
    manifests = [paths.manifest(m, c) for m, c in project.model_chips()]
    return {"doc": f"chip index of every bundle -> {paths.INDEX} (chip -> soc id -> arch -> bundle -> sha256)",
            "file_dep": manifests + records, "targets": [paths.INDEX], "clean": True,
            "actions": [(in_process, (write, records, paths.INDEX))]}


def write(records: list[str], out: str):
    """Paths in the index are relative to its own folder, so build/ can be copied as one piece."""
    base = os.path.dirname(out)
    index = {"format": 1, "models": {}}
    for path in records:
        r = read_json(path)
        bundles = {k: ({"path": os.path.relpath(b["file"], base), "sha256": b["sha256"], "bytes": b["bytes"]}
                       if b["shipped"] else {"path": None, "why_not": b.get("reason") or b.get("reasons")})
                   for k, b in r["bundles"].items()}
        index["models"].setdefault(r["model"], {})[r["chip"]] = {
            "soc_model": r["soc_model"], "htp_arch": r["htp_arch"], "toolchain": r["toolchain"],
            "sdk_build_id": r["sdk_build_id"], "runtime_family": r["runtime_libraries"]["family"], "bundles": bundles}
    write_json(out, index)


def select(ro_soc_model: str, libraries_loaded: bool, index: dict | str, model: str | None = None,
           kind: str = "onnxruntime", root: str | None = None) -> Choice:
    """The bundle for this phone, or CPU with the reason. `index` is the JSON or its path; bundle paths are
    relative to `root` (default: the index's folder). The sha256 is checked on the file itself."""
    if isinstance(index, (str, Path)):
        root = root or os.path.dirname(str(index))
        index = read_json(index)
    models = index.get("models", {})
    if model is None:
        if len(models) != 1:
            return Choice(CPU, f"the index holds {len(models)} models ({', '.join(sorted(models))}): name one")
        model = next(iter(models))
    if model not in models:
        return Choice(CPU, f"model {model!r} is not in the index")
    soc = (ro_soc_model or "").strip()   # getprop prints a newline; nothing else is normalised
    chips = models[model]
    if soc not in chips:
        return Choice(CPU, f"ro.soc.model {soc!r} matches no chip built for {model} ({', '.join(sorted(chips))})")
    entry = chips[soc].get("bundles", {}).get(kind)
    if kind not in KINDS or not entry or not entry.get("path"):
        why = entry.get("why_not") if entry else None
        return Choice(CPU, f"no {kind} bundle for {model} on {soc}" + (f": {why}" if why else ""), soc)
    if not libraries_loaded:
        return Choice(CPU, f"the QNN runtime libraries (QAIRT {chips[soc]['runtime_family']}) did not load", soc)
    path = os.path.join(root or ".", entry["path"])
    if not os.path.isfile(path):
        return Choice(CPU, f"bundle {path} is missing", soc)
    got = sha256(path)
    if got != entry["sha256"]:
        return Choice(CPU, f"bundle {path} sha256 {got[:12]}... is not the index's {entry['sha256'][:12]}...", soc)
    return Choice(path, f"{soc} = {chips[soc]['htp_arch']} build, sha256 verified, libraries loaded", soc, got)
