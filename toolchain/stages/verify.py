"""Compiled binaries in the x86 HTP simulator (the compiler's own runner: project.compiler(model))
against the CPU ONNX, once per (model, chip) and tier.

Tiers, because the simulator is ~100x slower than the CPU: "default" runs every chip on the samples
the spec names ([verify] clips; none named: all), "full" on all of them; either way the per-call
tensors on the first sample (the model's graph_feeds(), or its stream's calls; generated inputs
without data) and the model's own metric (agree(): transcripts, rankings, top-1, ...) on all of that
tier's samples. The record says which inputs each check used ("inputs")."""
from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NotRequired, TypedDict

from doit.tools import config_changed

from toolchain import artifacts
from toolchain.engine.files import read_json, sha256, write_json
from toolchain.engine.run.worker import load_module, run
from toolchain.errors import StageFailed
from toolchain.shared import measures, modeldata, stream
from toolchain.shared.iorecord import io_record
from toolchain.spec.records import Model
from toolchain.stages import Project, diagnose, named, parity


class Checks(TypedDict):
    """What a verify result is judged by: its task's settings (config_changed) and the step's
    `checks` (a worker gets it as JSON). The optional keys appear only when a spec declares them, so
    the results of other models stay current."""
    max_rel: float
    metric: dict
    clips: list[str]
    tier: str
    min_cosine: NotRequired[float]
    outputs: NotRequired[dict[str, dict[str, measures.OutputCheck]]]
    streams: NotRequired[dict[str, dict]]


def tasks(project: Project, tier: str) -> Iterator[dict]:
    said: dict[str, str] = {}   # inputs_said() per model: it reads the model file
    for model, chip in project.model_chips():
        # its full tier is the runtime's own loop
        if tier == "full" and project.runtime_gate(model):
            continue
        compiler, settings = project.compiler(model), model.verify
        cut = diagnose.pieces(model, compiler, chip)
        clips = () if tier == "full" else settings.clips
        graphs = {
            g.name: {
                "onnx": artifacts.simplified(model, g),
                "binary": artifacts.context_binary(model, g, chip, compiler.binary_suffix),
                "record": artifacts.compile_record(model, g, chip),
            }
            for g in model.graphs
        }
        if compiler.emits_context_model:
            for g in model.graphs:
                graphs[g.name]["context"] = artifacts.context_model(model, g, chip)
        out, log = artifacts.verified(model, chip, tier), artifacts.verify_log(model, chip, tier)
        checks = Checks(max_rel=max(g.precision.max_rel(settings) for g in model.graphs),
                        metric=dict(model.metric), clips=list(clips), tier=tier)
        # only when declared: verify results of other models stay current
        if settings.min_cosine:
            checks["min_cosine"] = settings.min_cosine
        # likewise: per-output checks and state loops when declared
        if any(g.checks for g in model.graphs):
            checks["outputs"] = {g.name: measures.output_checks(g, settings) for g in model.graphs}
        if any(g.stream for g in model.graphs):
            checks["streams"] = {g.name: stream.contract(g) for g in model.graphs if g.stream}
        kwargs = {
            "module_file": model.module_file,
            "graphs": graphs,
            "data_dir": model.data_dir,
            "simulators": {
                g.name: list(compiler.simulator(model, g, chip, tier)) for g in model.graphs
            },
            "checks": checks,
            "out": out,
            "io": {g.name: io_record(g) for g in model.graphs},
            "spec": model.spec_file,
            "outputs": {g.name: measures.output_checks(g, settings) for g in model.graphs},
            "sources": {
                g.name: {
                    o: measures.check_source(g, o, model.spec_file, c, model.verify_written)
                    for o, c in measures.output_checks(g, settings).items()
                }
                for g in model.graphs
            },
            "streams": {
                g.name: {"geometry": dict(g.stream), "state": dict(g.state)}
                for g in model.graphs
                if g.stream
            },
            # what a failure adds: the first op that departs, found now (small graphs)
            # and on demand
            "hint": f"; the first op that departs: `doit diagnose:{model.name}@{chip.tag}`"
            if cut
            else "",
            "pieces": cut,
            "precisions": {g.name: g.precision for g in model.graphs},
            "thresholds": {g.name: diagnose.threshold(model, g) for g in model.graphs},
        }
        if model.name not in said:
            said[model.name] = inputs_said(model, clips)
        what = said[model.name]
        yield {
            **named(model, chip=chip),
            "doc": f"{model.name} on {chip.tag}: {compiler.verify_runner_name()} vs CPU ONNX, "
                   f"{tier} tier ({what})",
            "file_dep": [
                *model.code_files,
                *[p for g in graphs.values() for p in g.values()],
                *project.data_files(model),
                *compiler.tool_files(chip),
            ],
            # the model's own CPU measures (task metric, stream loops) pass before the
            # simulator is paid
            "task_dep": [f"parity:{model.name}"] if parity.available(model) else [],
            "targets": [out, log],
            "clean": True,
            "actions": [(run, (check, kwargs, log))],
            "uptodate": [
                config_changed({"checks": checks, **compiler.verify_settings(model, chip, tier)})
            ],
        }


def inputs_said(model: Model, clips: tuple) -> str:
    """What a tier runs on, in words (`doit list`), from what the model file defines (read, not
    imported): the per-call tensors on the first sample, the stream loops and the model's metric on
    all (`clips`: those named)."""
    has = modeldata.outline(Path(model.module_file).read_bytes()).names.__contains__
    if not (model.data_dir and has("samples")):
        return (
            "tensors on graph_feeds() without a sample"
            if has("graph_feeds")
            else "tensors on generated inputs"
        )
    every = (
        f"clips {', '.join(clips)}"
        if clips
        else f"every sample of {os.path.basename(model.data_dir)}"
    )
    first = f"clip {clips[0]}" if clips else "the first sample"
    said = [f"tensors on {first} ({'graph_feeds()' if has('graph_feeds') else 'its stream'})"]
    if any(g.stream for g in model.graphs):
        said.append(f"stream loops on {every}")
    if has("evaluate") or has("evaluate_stream"):
        said.append(f"the model's metric (agree()) on {every}")
    return ", ".join(said)


def check(
    module_file: str,
    graphs: dict,
    data_dir: str | None,
    simulators: dict,
    checks: Checks,
    out: str,
    io: dict,
    *,
    outputs: dict,
    sources: dict,
    thresholds: dict,
    spec: str = "",
    hint: str = "",
    pieces: dict | None = None,
    streams: dict | None = None,
    precisions: dict | None = None,
) -> None:
    """Every graph's simulator run (the compiler's runner) against the CPU ONNX on the same feeds;
    each stateful graph's stream run by both, each feeding back its own state. The record is written
    either way (status "failed" with every output's numbers); a failure names the output, the call
    and the bound."""
    started = time.monotonic()
    for g in graphs.values():   # doit checks only that targets exist; flipped weights still load
        recorded = read_json(g["record"])["sha256"]
        if sha256(g["binary"]) != recorded:
            raise StageFailed(
                f"{g['binary']}: sha256 differs from the one recorded at compile "
                f"({recorded}); the file changed: run `doit clean` on its compile task"
            )
    module = load_module(module_file)
    cpu = {name: modeldata.cpu(g["onnx"]) for name, g in graphs.items()}
    sim = {name: _memo(factory(**kwargs)) for name, (factory, kwargs) in simulators.items()}
    streams = streams or {}

    def cpu_run(graph: str, feeds: dict) -> dict:
        return cpu[graph](feeds)

    def sim_run(graph: str, feeds: dict) -> dict:
        return sim[graph](feeds)

    samples = modeldata.samples(module, data_dir, checks["clips"], f"{spec}: verify.clips")
    feeds = stream.tensor_feeds(
        module, cpu_run, samples[0] if samples else None, io, streams, module_file
    )
    errors = measures.tensor_errors(cpu_run, sim_run, feeds, outputs)
    origin = stream.feeds_origin(module, samples[0] if samples else None, io, streams)
    record: dict = {"status": "failed", "tier": checks["tier"], "tensors": errors, "checks": checks,
                    "inputs": {"tensors": origin, "samples": [s[0] for s in samples]}}
    failures = []
    precisions = precisions or {}

    # a bound the graph's precision cannot hold: said first, and no op is bisected for it
    def tight(g: str, o: str) -> str:
        return measures.beyond_precision(errors[g]["outputs"][o]["check"], precisions.get(g, ""))
    for g, e in errors.items():
        for o, w in e["outputs"].items():
            if w["passed"] is False:
                at = w["at_worst_call"]
                first = f"{tight(g, o)}; measured: " if tight(g, o) else ""
                failures.append(
                    f"{g}/{o}: {first}call {w['worst_call']} of {e['calls']} on {origin[g]} "
                    "(inputs and states as the CPU run fed them): max |error| "
                    f"{at['max_abs']:.3g}, "
                    f"{at['max_rel']:.3g} of the range, cosine {at['cosine']:.5f} "
                    f"({measures.RANGE}: "
                    f"{at['range']:.3g}); allowed {measures.allowed(w['check'], sources[g][o])}"
                )
    failing = [
        (g, o, feeds[g][w["worst_call"]])
        for g, e in errors.items()
        for o, w in e["outputs"].items()
        if w["passed"] is False and not tight(g, o)
    ]
    runs: dict = {}
    if streams and samples:  # the build's own chunk loop on the CPU ONNX and on the simulator
        record["stream"], lines, worst, runs = stream.compare_runs(
            module, samples, streams, io, cpu_run, sim_run, outputs, sources, module_file
        )
        failures, failing = failures + lines, failing + worst
    ref, got = stream.task_runs(module, samples, streams, runs, io, cpu_run, sim_run)
    if ref is not None:  # the model's own task metric
        record["task"], task_failures = module.agree(
            ref, got, {**checks["metric"], "tier": checks["tier"]}
        )
        failures += [f"simulator vs CPU ONNX: {f}" for f in task_failures]
    record["seconds"] = round(time.monotonic() - started, 1)
    # a small graph: find the op now (a large one: the message names the command)
    if failing and pieces:
        failures += diagnose.after_failure(
            {g: v["onnx"] for g, v in graphs.items()}, failing, pieces, thresholds
        )
    record["status"], record["failures"] = ("failed", failures) if failures else ("passed", [])
    print(_summary(record))
    # a failed record too: every output's numbers, for the user
    write_json(out, measures.finite(record))
    if failures:
        raise StageFailed(
            f"{', '.join(g['binary'] for g in graphs.values())}: "
            + "; ".join(failures)
            + hint
            + f" (every output's numbers: {out})"
        )


def _summary(record: dict) -> str:
    """The log's line: each output's worst numbers, and each stream's peak drift."""
    lines = [f"verify {record['status']} ({record['tier']} tier, {record.get('seconds')} s)"]
    for g, e in record["tensors"].items():
        for o, w in e["outputs"].items():
            lines.append(
                f"  {g}/{o}: {e['calls']} calls, max |error| {w['max_abs']:.3g}, "
                f"{w['max_rel']:.3g} of the "
                f"range, cosine {w['cosine']:.5f}, check {w['check']}: "
                f"{'metric' if w['passed'] is None else 'ok' if w['passed'] else 'FAILED'}"
            )
    for g, clips in record.get("stream", {}).items():
        for clip, s in clips.items():
            for o, d in s["outputs"].items():
                lines.append(
                    f"  stream {g}/{o} on {clip}: {s['calls']} chunks, max |error| "
                    f"{d['max_abs']:.3g} "
                    f"(chunk {d['peak_chunk']}), p99 {d['p99_abs']:.3g}"
                )
    if "task" in record:
        lines.append(f"  task: {record['task'].get('summary', record['task'])}")
    return "\n".join(lines)


def _memo(run: Callable[[dict], dict]) -> Callable[[dict], dict]:
    """Cache simulator calls by input bytes: the tensor check and the transcript share
    the encoder run."""
    cache: dict[str, dict] = {}

    def cached(feeds: dict) -> dict:
        key = hashlib.sha1(
            b"".join(k.encode() + v.tobytes() for k, v in sorted(feeds.items()))
        ).hexdigest()
        if key in cache:
            return cache[key]
        if len(cache) >= 4:   # bounded: decoder steps carry megabytes of cache each
            cache.pop(next(iter(cache)))
        cache[key] = run(feeds)
        return cache[key]
    return cached
