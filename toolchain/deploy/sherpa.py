"""The runtime's loop as the gate: per (model, chip), unpack the sherpa-onnx bundle and transcribe
its test_wavs/ with sherpa-onnx's QNN Whisper host loop (sherpa_whisper.py) driving the bundle's own
encoder.bin / decoder.bin through the QNN C API (qnnrun.py: libQnnHtp, here the x86 HTP simulator,
and libQnnSystem), against the same loop on the CPU float ONNX. Tiers as verify: "default" on the
spec's [verify] clips, every chip; "full" on every clip of the bundle (WER), opt-in chips."""
from __future__ import annotations

import tempfile

from doit.tools import config_changed

from toolchain import artifacts
from toolchain.deploy import bundle, sherpa_whisper, tarball
from toolchain.engine.files import write_json
from toolchain.engine.run.worker import load_module, run
from toolchain.errors import StageFailed
from toolchain.qnn import qnnrun
from toolchain.shared import modeldata
from toolchain.shared.iorecord import io_record
from toolchain.spec.records import Model
from toolchain.stages import Compiler, Project, named

STAGES = {"default": "sherpa", "full": "sherpa_full"}


def wanted(model: Model, compiler: Compiler) -> bool:
    """Models whose sherpa-onnx bundle is Whisper's (the one kind whose host loop is ported)."""
    p = bundle.plan(model, compiler)
    return not p["sherpa_reasons"] and p["kind"] == "whisper"


def tasks(project: Project, tier: str):
    for model, chip in project.model_chips():
        if not project.runtime_gate(model) or (
            tier == "full" and not project.wants_full_tier(model, chip)
        ):
            continue
        # the host loop loads the build's own QNN libraries in the step's process;
        if chip.family:
            # another family's binaries are gated by their own simulator (verify)
            continue
        settings = model.verify
        checks = {"tier": tier, "clips": [] if tier == "full" else list(settings.clips),
                  "metric": dict(model.metric)}
        onnx = {g.name: artifacts.simplified(model, g) for g in model.graphs}
        out, log = (
            artifacts.sherpa_run(model, chip, tier),
            artifacts.sherpa_run_log(model, chip, tier),
        )
        # The runtime libraries of the SDK that built the binaries (same family for
        # build and runtime): the wheel's for the embedded compiler, the SDK's x86_64
        # ones for QAIRT-built binaries.
        compiler = project.compiler(model)
        libs = compiler.host_libraries()
        kwargs = {
            "bundle": artifacts.sherpa_bundle(model, chip),
            "module_file": model.module_file,
            "onnx": onnx,
            "io": {g.name: io_record(g) for g in model.graphs},
            "checks": checks,
            "libs": libs,
            "out": out,
        }
        what = "all test_wavs, WER" if tier == "full" else f"clips {', '.join(checks['clips'])}"
        yield {
            **named(model, chip=chip),
            "doc": f"{model.name} on {chip.name}: sherpa-onnx's Whisper loop on the unpacked "
                   "bundle through "
            f"the QNN C API (HTP simulator) vs CPU ONNX, {tier} tier ({what})",
            "file_dep": [
                kwargs["bundle"],
                *model.code_files,
                *onnx.values(),
                *compiler.tool_files(),
            ],
            "targets": [out, log],
            "clean": True,
            "actions": [(run, (check, kwargs, log))],
            "uptodate": [config_changed({"checks": checks, "tool": compiler.identity()})],
        }


def check(
    bundle: str,
    module_file: str,
    onnx: dict,
    io: dict,
    checks: dict,
    out: str,
    libs: dict | None = None,
):
    module = load_module(module_file)
    with tempfile.TemporaryDirectory() as tmp:
        # as an app gets it: the bundle's own files, nothing else
        top = tarball.extract(bundle, tmp)
        clips = module.samples(str(top / "test_wavs"))
        if checks["clips"]:
            clips = [c for c in clips if c[0] in checks["clips"]]
            missing = set(checks["clips"]) - {c[0] for c in clips}
            if missing:
                raise StageFailed(f"{bundle}: test_wavs/ has no clip(s) {sorted(missing)}")
        table = sherpa_whisper.read_tokens(str(top / "tokens.txt"))
        cpu = {g: modeldata.cpu(p) for g, p in onnx.items()}
        with qnnrun.QnnModel(str(top / "encoder.bin"), **(libs or {})) as enc, \
                qnnrun.QnnModel(str(top / "decoder.bin"), **(libs or {})) as dec:
            try:
                sherpa_whisper.Contract(enc, dec)   # what the runtime checks at load time
            except sherpa_whisper.ContractError as err:
                raise StageFailed(
                    f"{bundle}: sherpa-onnx would refuse these binaries: {err}"
                ) from None
            ref = module.transcribe(*module.graphs(lambda g, f: cpu[g](f), io), clips, table)
            got = module.transcribe(enc, dec, clips, table)
            cost = {
                "encoder_io_bytes": enc.buffer_bytes,
                "decoder_io_bytes_per_call": dec.buffer_bytes,
                "binary_bytes": {
                    "encoder": (top / "encoder.bin").stat().st_size,
                    "decoder": (top / "decoder.bin").stat().st_size,
                },
            }
    record, failures = module.agree(ref, got, {**checks["metric"], "tier": checks["tier"]})
    calls = sum(t["decoder_calls"] for t in got["timings"].values())
    cost.update(
        {
            "sim_seconds_per_encoder_call": _mean(
                t["encoder_seconds"] for t in got["timings"].values()
            ),
            "sim_seconds_per_decoder_call": round(
                sum(t["decoder_seconds"] for t in got["timings"].values()) / max(calls, 1), 3
            ),
            "decoder_calls": calls,
        }
    )
    record = {
        "tier": checks["tier"],
        "bundle": bundle,
        "runtime": "sherpa-onnx QNN Whisper host loop (Python port) over the QNN C API",
        "task": record,
        "cost": cost,
        "tokens": {c: v["tokens"] for c, v in got["clips"].items()},
    }
    print(record)
    if failures:
        raise StageFailed(
            f"{bundle}: the runtime loop on the binaries vs on the CPU ONNX: " + "; ".join(failures)
        )
    write_json(out, record)


def _mean(values) -> float:
    values = list(values)
    return round(sum(values) / max(len(values), 1), 3)

