"""Per (model, chip): phone bundles as reproducible .tar.bz2 (onnxruntime EPContext; sherpa-onnx
where its runtime contract holds) and a bundle record of what was shipped, what was not, and why."""
from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from doit.tools import config_changed

from toolchain import artifacts
from toolchain.deploy import sherpa_contract, tarball
from toolchain.engine.files import read_json, sha256, write_json
from toolchain.engine.run.worker import load_module, run
from toolchain.errors import StageFailed
from toolchain.qnn import compat
from toolchain.shared import modeldata
from toolchain.shared.iorecord import io_record
from toolchain.spec.records import Model
from toolchain.spec.table import plain
from toolchain.spec.windows import by_size, routed
from toolchain.stages import Compiler, Project, named

# bump when a bundle's layout changes: every bundle rebuilds
FORMAT = 3
KINDS = {"ort_out": "onnxruntime", "sherpa_out": "sherpa-onnx"}


def plan(model: Model, compiler: Compiler) -> dict:
    """What can ship, decided from the spec (so targets are known before anything runs)."""
    # models/<m>.py may write a tokens.txt
    tokens = modeldata.defines(model.module_file, "write_tokens")
    graphs = {g.name: compiler.runtime_view(g) for g in model.graphs}
    kind, reasons = sherpa_contract.problems(model.name, graphs, tokens)
    ort = (
        None
        if compiler.emits_context_model
        else (
            f"{model.compiler}-built context binaries come without an EPContext ONNX model; "
            "wrapping them "
            "(onnxruntime's gen_qnn_ctx_onnx_model.py) is not done here, since no real QAIRT "
            "binary could be tested"
        )
    )
    return {"tokens": tokens, "kind": kind, "sherpa_reasons": reasons, "ort_reason": ort}


def tasks(project: Project):
    plans: dict[str, dict] = {}   # one per model, whatever its chips
    for model, chip in project.model_chips():
        compiler = project.compiler(model)
        if model.name not in plans:
            plans[model.name] = plan(model, compiler)
        p = dict(plans[model.name])
        graphs = {
            g.name: {
                "binary": artifacts.context_binary(model, g, chip, compiler.binary_suffix),
                "record": artifacts.compile_record(model, g, chip),
                "context": artifacts.context_model(model, g, chip)
                if compiler.emits_context_model
                else None,
            }
            for g in model.graphs
        }
        kwargs: dict[str, Any] = {
            "model": model.name,
            "chip": chip.record(),
            "compiler": model.compiler,
            "graphs": graphs,
            "manifest": artifacts.manifest(model, chip),
            "runtime": artifacts.runtime_record(model.compiler, chip),
            "module_file": model.module_file,
            "data_dir": model.data_dir,
            "plan": p,
            "io": {g.name: io_record(g) for g in model.graphs},
            "ort_out": None if p["ort_reason"] else artifacts.ort_bundle(model, chip),
            "sherpa_out": None if p["sherpa_reasons"] else artifacts.sherpa_bundle(model, chip),
            "out": artifacts.bundle_record(model, chip),
        }
        deps = []
        # the loop's windows; "auto" routing reads parity's record (spec/windows.py routed())
        if model.windows:
            kwargs["windows"] = {
                "record": plain(model.windows),
                "graphs": by_size(model.windows),
                # no parity (reference "none"): nothing measured, so only the
                # largest is routed
                "parity": artifacts.parity(model)
                if model.windows["route"] == "auto" and model.parity.reference != "none"
                else None,
            }
            deps = [kwargs["windows"]["parity"]] if kwargs["windows"]["parity"] else []
        shipped = [k for k in ("ort_out", "sherpa_out") if kwargs[k]]
        settings = {
            "format": FORMAT,
            "plan": p,
            "chip": chip.record(),
            "bundles": [kwargs[k] for k in shipped],
        }
        if model.windows:
            settings["windows"] = kwargs["windows"]["record"]
        log = artifacts.bundle_log(model, chip)
        yield {
            **named(model, chip=chip),
            "doc": f"{model.name} on {chip.tag}: phone bundles "
            f"({', '.join(KINDS[k] for k in shipped) or 'none'}) + bundle record"
            + ("" if kwargs["sherpa_out"] else " [no sherpa-onnx bundle: see bundle.json]"),
            "file_dep": [
                kwargs["manifest"],
                kwargs["runtime"],
                *model.code_files,
                *[p for g in graphs.values() for p in g.values() if p],
                *project.data_files(model),
                *deps,
            ],
            "targets": [kwargs["out"], log] + [kwargs[k] for k in shipped],
            "clean": True,
            "actions": [(run, (build, kwargs, log))],
            "uptodate": [config_changed(settings)],
        }


def build(
    model,
    chip,
    compiler,
    graphs,
    manifest,
    runtime,
    module_file,
    data_dir,
    plan,
    ort_out,
    sherpa_out,
    out,
    io=None,
    windows=None,
):
    """Check the binaries against the manifest, then write the bundles and the record."""
    man, libs = read_json(manifest), read_json(runtime)
    for g, b in man["binaries"].items():   # never ship a binary that changed after it was verified
        if sha256(graphs[g]["binary"]) != b["sha256"]:
            raise StageFailed(
                f"{graphs[g]['binary']}: sha256 differs from the manifest's; rebuild it"
            )
    data = (
        {str(p.relative_to(data_dir)): str(p) for p in map(Path, modeldata.data_files(data_dir))}
        if data_dir
        else {}
    )
    common = {
        "LICENSE": license_text(man).encode(),
        "QNN-RUNTIME-LICENSE.txt": runtime_license_text(libs).encode(),
        "runtime-libraries.json": (json.dumps(libs, indent=2, sort_keys=True) + "\n").encode(),
    }
    if plan["tokens"]:
        common["tokens.txt"] = _tokens(module_file, io)
    if windows:   # sizes come back as strings from the step's JSON kwargs
        windows = {**windows, "graphs": {int(s): g for s, g in windows["graphs"].items()}}
    record = {
        "qnn_runtime": compat.requirement(man["sdk"]["build_id"]),
        "model": model,
        "chip": chip["name"],
        "soc_model": chip["soc_model"],
        "htp_arch": f"v{chip['htp_arch']}",
        "toolchain": compiler,
        "sdk_build_id": man["sdk"]["build_id"],
        "license": man["license"],
        "runtime_libraries": {
            k: libs[k] for k in ("family", "available", "app_must_ship", "license")
        },
        "bundles": {},
    }
    if ort_out:
        route = window_route(windows) if windows else None
        # a window the loop never picks is not shipped: its graphs would only weigh on the app
        left_out = {g for s in (route[1] if route else {}) for g in windows["graphs"][s].values()}
        shipped = {g: files for g, files in graphs.items() if g not in left_out}
        members = {
            **common,
            "info.txt": (_info(man, list(shipped)) + window_info(windows, route)).encode(),
            "README.md": (
                ORT_README
                + state_readme(man.get("state_contract", {}))
                + window_readme(windows, route)
            ).encode(),
            "manifest.json": manifest,
            **{f"test_data/{k}": v for k, v in data.items()},
        }
        for g, files in shipped.items():
            _check_epcontext(files["context"], Path(files["binary"]).name)
            members[f"{g}.onnx"], members[Path(files["binary"]).name] = (
                files["context"],
                files["binary"],
            )
        record["bundles"]["onnxruntime"] = _write(ort_out, members)
        if route:
            record["bundles"]["onnxruntime"]["windows"] = {
                "routed": route[0],
                "not_shipped": {str(s): why for s, why in route[1].items()},
            }
    else:
        record["bundles"]["onnxruntime"] = {"shipped": False, "reason": plan["ort_reason"]}
    if sherpa_out:
        views = {g: read_json(f["record"])["info"] for g, f in graphs.items()}
        kind, found = sherpa_problems(model, views, plan["tokens"])
        # the spec said yes, the binaries say no: a bundle that fails to load must not ship
        if found:
            raise StageFailed(
                f"{model}@{chip['name']}: the binaries break sherpa-onnx's {kind} contract: "
                + "; ".join(found)
            )
        order = sherpa_contract.ORDER[kind]
        members = {**common, "info.txt": _info(man, list(order), sherpa_apps=True).encode(),
                   "README.md": sherpa_readme(order, man["sdk"]["build_id"]).encode(),
                   "manifest.json": manifest, **{f"{g}.bin": graphs[g]["binary"] for g in order},
                   **{f"test_wavs/{Path(k).name}": v for k, v in data.items()
                      if k.endswith((".wav", "refs.tsv", "PROVENANCE.md"))}}
        record["bundles"]["sherpa-onnx"] = {**_write(sherpa_out, members), "kind": kind}
        if not compat.loads(compat.SHERPA_APPS, man["sdk"]["build_id"]):
            record["bundles"]["sherpa-onnx"]["released_apps"] = compat.sherpa_note(
                man["sdk"]["build_id"]
            )
    else:
        record["bundles"]["sherpa-onnx"] = {"shipped": False, "kind": plan["kind"],
                                            "reasons": plan["sherpa_reasons"]}
    write_json(out, record)


def sherpa_problems(model_name: str, infos: dict, tokens: bool) -> tuple:
    """The contract checked on the binaries' own read-back: binary-info v3,
    names, shapes, dtypes."""
    views = {g: sherpa_contract.binary_view(i) for g, i in infos.items()}
    kind, found = sherpa_contract.problems(model_name, views, tokens)
    found += [
        f"{g}: binary-info version {i.get('infoVersion')}, the runtime takes 3"
        for g, i in infos.items()
        if i.get("infoVersion", 3) != 3
    ]
    return kind, found


def _write(out: str, members: dict) -> dict:
    top = Path(out).name[:-len(".tar.bz2")]
    tarball.write(out, top, members)
    return {
        "shipped": True,
        "file": out,
        "sha256": sha256(out),
        "bytes": Path(out).stat().st_size,
        "top": top,
        "members": sorted(members),
    }


def _check_epcontext(context: str, binary: str) -> None:
    """Every EPContext node must name its binary relatively, beside it: the bundle
    is unpacked elsewhere."""
    import onnx
    for node in onnx.load(context, load_external_data=False).graph.node:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        beside = attrs.get("embed_mode") == 0 and attrs.get("ep_cache_context") == binary.encode()
        if node.op_type != "EPContext" or not beside:
            raise StageFailed(
                f"{context}: node {node.name} ({node.op_type}) does not point at {binary} beside it"
            )


def _tokens(module_file: str, io: dict) -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        modeldata.with_io(load_module(module_file).write_tokens, io)(f"{tmp}/tokens.txt")
        return Path(f"{tmp}/tokens.txt").read_bytes()


def _info(man: dict, order: list[str], sherpa_apps: bool = False) -> str:
    """key=value, as sherpa-onnx's info.txt; what the app checks before it loads anything: first the
    build id and the QNN runtime it needs."""
    need = compat.requirement(man["sdk"]["build_id"])
    lead = {
        "qnn_build_id": man["sdk"]["build_id"],
        "needs_qnn_runtime": f"QAIRT>={need['qairt_family']}",
    }
    if sherpa_apps and "sherpa_onnx_apps" in need:
        lead["sherpa_onnx_released_apps"] = (
            f"refuse (they ship QNN {compat.SHERPA_APPS}); see README.md"
        )
    fields = {**lead, "model": man["model"], "soc": man["chip"]["name"], "soc_id": man["soc_id"],
              "arch": man["htp_arch"], "toolchain": man["toolchain"], "graphs": ",".join(order),
              "precision": ",".join(man["precision"][g] for g in order)}
    # a stateful graph: what the app feeds back, and the cut
    for g, c in man.get("state_contract", {}).items():
        fields[f"state_{g}"] = ",".join(f"{o}->{i}" for o, i in c["state"].items())
        fields[f"state_initial_{g}"] = c["initial"]
        fields[f"stream_{g}"] = ",".join(f"{k}={v}" for k, v in c["stream"].items())
    return "".join(f"{k}={v}\n" for k, v in fields.items())


def window_route(windows: dict) -> tuple[list[int], dict[int, str]]:
    task = read_json(windows["parity"]).get("task") if windows["parity"] else None
    return routed(windows["record"], task)


def window_info(windows: dict | None, route: tuple | None) -> str:
    """info.txt lines of a model with [windows]: the windows, their graphs, which the loop picks,
    and the rule."""
    if not windows or route is None:
        return ""
    unit = windows["record"]["unit"]
    fields = {
        "windows": ",".join(f"{s}{unit}" for s in windows["graphs"]),
        "window_graphs": ";".join(
            f"{s}{unit}:{'+'.join(g.values())}"
            for s, g in windows["graphs"].items()
            if s in route[0]
        ),
        "windows_routed": ",".join(f"{s}{unit}" for s in route[0]),
        "window_rule": "the smallest routed window that holds the input, padded inside it; longer: "
                       "the largest",
    }
    return "".join(f"{k}={v}\n" for k, v in fields.items())


def window_readme(windows: dict | None, route: tuple | None) -> str:
    if not windows or route is None:
        return ""
    unit, largest = windows["record"]["unit"], max(windows["graphs"])
    rows = "".join(f"| {s}{unit} | {', '.join(f'`{g}`' for g in graphs.values())} | "
                   f"{'yes' if s in route[0] else 'no, not shipped: ' + route[1][s]} |\n"
                   for s, graphs in windows["graphs"].items())
    return (
        "\n## Windows: one graph pair per input length\n\nPick the smallest *routed* window that "
        "holds the input "
        f"and pad inside it as at {largest}{unit}; an input longer than every window goes to the "
        f"{largest}{unit} "
        "one. Every window was verified on the HTP simulator against the CPU at its own "
        "length.\n\n"
        f"| window | graphs | routed |\n|---|---|---|\n{rows}\nThe same windows, weights stored "
        "once, are "
        "built as one context binary per chip (`build/.../shared/`, `shared.json`) but not "
        "shipped here: the x86 "
        "HTP simulator cannot load a shared-weights context, so that binary is read back, not "
        "verified.\n"
    )


def license_text(man: dict) -> str:
    lic = man["license"]
    lines = [f"Model: {man['model']} ({man['description']})", f"License: {lic['name']}"]
    lines += [f"URL: {lic['url']}"] * bool(lic.get("url")) + [f"Note: {lic['note']}"] * bool(
        lic.get("note")
    )
    return "\n".join(
        lines
        + [
            "",
            "This bundle holds a compiled form of the model (QNN HTP context binaries).",
            "Distributing it is distributing the model: keep this notice with it.",
            "",
        ]
    )


def runtime_license_text(libs: dict) -> str:
    lic = libs["license"]
    refs = lic["reference"] if isinstance(lic["reference"], str) else \
        "; ".join(f"{r['file']} (sha256 {r['sha256']})" for r in lic["reference"])
    return "\n".join(
        [
            f"This bundle does not contain the QNN runtime libraries it needs: "
            f"{', '.join(lib['name'] for lib in libs['libraries'])} (QAIRT {libs['family']}).",
            f"They are {lic['holder']} software. {lic['terms']}",
            f"Terms: {refs}.",
            *([lic["note"]] if lic.get("note") else []),
            "",
            f"What to ship: {libs['app_must_ship']}",
            "",
        ]
    )


def state_readme(contracts: dict) -> str:
    """The state contract of each stateful graph, in words (manifest.json "state_contract" has
    it as data)."""
    text = ""
    for g, c in contracts.items():
        pairs = ", ".join(f"`{o}` -> `{i}`" for o, i in c["state"].items())
        text += (
            f"\n## `{g}`: a stateful chunk step\n\nStart every state input at {c['initial']}; "
            "after each call "
            f"feed each state output into its input ({pairs}). "
            f"{c['calls'][0].upper()}{c['calls'][1:]}. "
            "The build verified exactly this loop on the HTP simulator against the CPU "
            "(manifest.json: "
            f"verify.default.stream).\n"
        )
    return text


ORT_README = """# onnxruntime QNN EP bundle

Each `<graph>.onnx` is an EPContext model pointing at `<graph>_qnn.bin` beside it: keep them in one
folder (copy them out of the APK's assets first). Open it with onnxruntime's QNN execution provider,
`backend_path` = the app's `libQnnHtp.so`, session option `session.disable_cpu_ep_fallback=1`, and
ADSP_LIBRARY_PATH prepended with the Skel's folder (';' separators). `runtime-libraries.json` names
the libraries and their QAIRT version family; `info.txt` the chip this was compiled for (it runs on
no other).
"""


def sherpa_readme(order, build_id: str | None = None) -> str:
    binaries = ",".join(f"$dir/{g}.bin" for g in order)
    text = (
        '# sherpa-onnx QNN binary bundle\n\n`QnnConfig(backendLib = "libQnnHtp.so", contextBinary '
        '= '
        f'"{binaries}", systemLib = "libQnnSystem.so")`, provider = "qnn"; the Skel\'s folder '
        'prepended to '
        f"ADSP_LIBRARY_PATH (';'). Runs only on the chip in `info.txt`.\n"
    )
    need = compat.requirement(build_id)
    text += f"\nBuilt with QAIRT {build_id}: needs {need['needs']}.\n"
    if "sherpa_onnx_apps" in need:
        text += f"\n**{need['sherpa_onnx_apps']}.**\n"
    return text
