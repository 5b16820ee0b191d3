"""Streaming and state (toolchain/shared/stream.py): the streaming transducer family (encoder /
decoder / joiner, like Zipformer2 as sherpa-onnx builds it for QNN) through the external-export
path. No real transducer weights install offline, so the model is the seeded fixture in
tests/fixtures/streaming/; it is copied into a temp project and built by the real pipeline: export
by command -> simplify -> inspect -> parity -> compile for two chips -> verify (several chunks,
states fed back, CPU ONNX vs HTP simulator, every output compared) -> manifest."""
import json
import shutil
import types

import numpy as np
import pytest
from conftest import FIXTURES, Project

from toolchain import spec
from toolchain.engine.run.worker import load_module
from toolchain.shared import measures, stream
from toolchain.shared.iorecord import io_record
from toolchain.spec import chips
from toolchain.spec.records import Verify

FIXTURE = FIXTURES / "streaming"
CHIPS = ("SM8550", "SM8750")
GRAPHS = ("encoder", "decoder", "joiner")
MODEL = "streaming"


@pytest.fixture(scope="module")
def streaming():
    """The fixture's model module, imported by path as the build does."""
    return load_module(str(FIXTURE / "streaming.py"))


@pytest.fixture(scope="module")
def streaming_built(tmp_path_factory):
    """The fixture copied into a temp project's models/ and built once (tests below
    run in order)."""
    p = Project(tmp_path_factory.mktemp("streaming") / "proj")
    shutil.copytree(
        FIXTURE, p.root / "models", dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__")
    )
    rc, executed, text = p.run()
    assert rc == 0, text
    p.first_executed = executed
    return p


def manifest(project, chip: str) -> dict:
    return json.loads((project.root / f"build/{MODEL}/ort-qnn/{chip}/manifest.json").read_text())


def test_the_spec_follows_sherpa_onnx_online_transducer_contract():
    """The online-zipformer contract (docs/streaming.md): x (1, 80, T), every other input a state s
    with output new_s; decoder one int32 input (1, context_size) -> decoder_out (1, D); joiner (1,
    C), (1, D) -> logit (1, V)."""
    model = spec.load(FIXTURE / "streaming.toml", chips.load())
    assert model.checkpoint is None and all(g.source[0] == "command" for g in model.graphs)
    enc, dec, joi = (model.graph(g) for g in GRAPHS)
    assert enc.inputs[0].name == "x" and enc.inputs[0].shape[:2] == (1, 80)
    states = [t.name for t in enc.inputs[1:]]
    assert [t.name for t in enc.outputs] == ["encoder_out", *[f"new_{s}" for s in states]]
    assert {t.name: t.shape for t in enc.inputs[1:]} == {
        t.name[4:]: t.shape for t in enc.outputs[1:]
    }
    assert [t.dtype for t in enc.inputs[1:]].count("int32") == 1 and enc.inputs[
        -1
    ].name == "processed_lens"
    assert [(t.name, t.shape, t.dtype) for t in dec.inputs] == [("y", (1, 2), "int32")]
    assert [t.name for t in joi.inputs] == ["encoder_out", "decoder_out"] and joi.outputs[
        0
    ].name == "logit"
    assert all(len(t.shape) == 2 for t in (*dec.outputs, *joi.inputs, *joi.outputs))
    for g in model.graphs:   # the icefall export flags the HTP path needs
        argv = g.source[1]
        for flag, value in (
            ("--use-int32-inputs", "1"),
            ("--dynamic-batch", "0"),
            ("--enable-int8-quantization", "0"),
        ):
            assert argv[argv.index(flag) + 1] == value


def test_streaming_with_states_fed_back_equals_the_whole_utterance(streaming):
    """The caches are right: chunk by chunk (new_* fed back) gives the frames of one offline pass,
    and every state input changes the result (none is ignored or folded away)."""
    run = streaming.torch_runner(None)
    utt, seed, chunks = streaming.samples(str(FIXTURE / "data"))[0]
    calls = streaming.decode(run, seed, chunks)["calls"]["encoder"]
    assert len(calls) == chunks >= 3
    chunked = np.concatenate([out["encoder_out"] for _, out in calls], axis=1)
    offline = streaming.offline_encoder_out(
        streaming.build(), streaming.features(seed, chunks), chunks
    )
    assert chunked.shape == offline.shape == (1, chunks * streaming.CHUNK, streaming.JOINER_DIM)
    assert np.max(np.abs(chunked - offline)) < 1e-5
    feeds, out = calls[2]
    for name, zero in streaming.initial_states().items():
        changed = run("encoder", {**feeds, name: zero})["encoder_out"]
        assert np.max(np.abs(changed - out["encoder_out"])) > 1e-2, f"state {name} has no effect"


def _loop(streaming, run, sample):
    """The build's own chunk loop (toolchain/shared/stream.py) over one utterance, as the
    spec declares it."""
    g = spec.load(FIXTURE / "streaming.toml", chips.load()).graph("encoder")
    io = io_record(g)
    pieces = stream.pieces(streaming, sample, dict(g.stream), io, "streaming.py")
    return g, io, stream.loop(run, "encoder", pieces, dict(g.stream), dict(g.state), io["inputs"])


def test_the_builds_loop_cuts_the_stream_as_the_model_code_decodes_it(streaming):
    """The declared geometry (chunk 35 frames, hop 32) gives exactly the calls of the module's own
    decode: same feeds, same states fed back, same outputs."""
    run = streaming.torch_runner(None)
    sample = streaming.samples(str(FIXTURE / "data"))[0]
    _, _, calls = _loop(streaming, run, sample)
    own = streaming.decode(run, sample[1], sample[2])["calls"]["encoder"]
    assert len(calls) == len(own) == sample[2]
    for (feeds, out), (want_feeds, want_out) in zip(calls, own):
        assert all(np.array_equal(feeds[k], want_feeds[k]) for k in want_feeds)
        assert all(np.array_equal(out[k], want_out[k]) for k in want_out)


def test_drift_names_the_output_and_chunk_where_a_fed_back_state_departs(streaming):
    """A candidate whose one state output is off by 0.2 from chunk 3 on: the build's loop feeds it
    back, the drift record peaks at chunk 3 for that state, and the failure line names output, clip,
    chunk and bound."""
    run = streaming.torch_runner(None)
    sample = streaming.samples(str(FIXTURE / "data"))[0]
    count = {"n": 0}

    def bent(graph, feeds):
        out = run(graph, feeds)
        if graph == "encoder":
            count["n"] += 1
            if count["n"] == 4:
                out = {**out, "new_cached_conv_1": out["new_cached_conv_1"] + 0.2}
        return out
    g, io, _ = _loop(streaming, run, sample)
    checks = {
        "encoder": measures.output_checks(
            g, Verify(clips=(), max_rel=0.02, max_rel_w8a16=0.1, min_cosine=0.0, full_chips=())
        )
    }
    sources = {
        "encoder": {
            o.name: measures.check_source(g, o.name, "streaming.toml", written=("max_rel",))
            for o in g.outputs
        }
    }
    streams = {"encoder": {"geometry": dict(g.stream), "state": dict(g.state)}}
    record, failures, failing, _ = stream.compare_runs(
        streaming, [sample], streams, {"encoder": io}, run, bent, checks, sources, "streaming.py"
    )
    drift = record["encoder"][sample[0]]["outputs"]
    assert (
        drift["new_cached_conv_1"]["peak_chunk"] == 3
        and drift["new_cached_conv_1"]["passed"] is False
    )
    # before the bent call: identical
    assert drift["new_cached_key_0"]["per_chunk_max_abs"][:4] == [0.0] * 4
    assert drift["new_processed_lens"]["max_abs"] == 0
    line = next(f for f in failures if f.startswith("encoder/new_cached_conv_1:"))
    assert f"free-running stream of clip {sample[0]}, chunk 3 of 5" in line, line
    assert "allowed |error| <= 0.02 x range (streaming.toml: verify.max_rel)" in line, line
    assert "range = the largest |value| of the CPU output in that call" in line
    assert ("encoder", "new_cached_conv_1") in [(f[0], f[1]) for f in failing]


def test_agree_names_a_changed_joiner_output_and_a_changed_token(streaming):
    """The module's comparison itself, on the build's loop: an error in one joiner call, a different
    greedy token are each a failure that names what differs."""
    import copy
    run = streaming.torch_runner(None)
    sample = streaming.samples(str(FIXTURE / "data"))[0]
    utt = sample[0]
    ref = {utt: streaming.evaluate_stream(run, sample, _loop(streaming, run, sample)[2])}
    assert streaming.agree(ref, copy.deepcopy(ref), {"tier": "default"})[1] == []
    got = copy.deepcopy(ref)
    logit = np.asarray(got[utt]["outputs"]["joiner"][0]["logit"])
    got[utt]["outputs"]["joiner"][0]["logit"] = (logit + 0.2).tolist()
    got[utt]["tokens"] = got[utt]["tokens"][:-1] + [got[utt]["tokens"][-1] + 1]
    record, failures = streaming.agree(
        ref, got, {"tier": "default", "max_abs": 0.05, "max_rel": 0.02}
    )
    assert len(failures) == 2, failures
    assert failures[0].startswith("joiner/logit: error above 0.05"), failures
    assert failures[1].startswith(f"greedy tokens differ for {utt}")
    assert record["tokens_differ"]


def test_built_by_command_compiled_for_two_chips_and_verified_chunk_by_chunk(streaming_built):
    executed = streaming_built.first_executed
    assert not [t for t in executed if t.startswith("checkpoint:")]
    for g in GRAPHS:
        assert {f"export:{MODEL}/{g}", f"simplify:{MODEL}/{g}", f"inspect:{MODEL}/{g}"} <= set(
            executed
        )
        assert {f"compile:{MODEL}/{g}@{c}" for c in CHIPS} <= set(executed)
    assert {
        f"parity:{MODEL}",
        *[f"verify:{MODEL}@{c}" for c in CHIPS],
        *[f"manifest:{MODEL}@{c}" for c in CHIPS],
    } <= set(executed)
    log = (streaming_built.root / f"build/{MODEL}/encoder/export.log").read_text()
    assert "export_streaming.py --graph encoder --use-int32-inputs 1" in log

    parity = json.loads((streaming_built.root / f"build/{MODEL}/parity.json").read_text())
    assert set(parity["tensors"]) == set(GRAPHS)
    assert all(e["max_abs"] < 1e-4 for e in parity["tensors"].values()), parity["tensors"]
    assert parity["task"]["utterances"] == 2 and not parity["task"]["tokens_differ"]

    tokens = parity["task"]["tokens"]
    # real decisions, not all blank
    assert all(len(t) >= 5 and len(set(t)) >= 2 for t in tokens.values()), tokens
    outputs = [f"encoder/{o}" for o in ("encoder_out", *[f"new_{s[0]}" for s in _states()])] + \
        ["decoder/decoder_out", "joiner/logit"]
    for chip in CHIPS:
        m = manifest(streaming_built, chip)
        assert m["checkpoint"]["origin"] == "the graphs' declared sources"
        for g in GRAPHS:
            assert m["binaries"][g]["config"]["soc_type"] == chip and m["binaries"][g]["bytes"] > 0
            assert m["binaries"][g]["config"]["relaxed_precision_flag"] is True   # fp16 on the HTP
            assert m["export"][g]["settings"]["command"][1] == "export_streaming.py"
        assert m["graphs"]["decoder"]["io"]["inputs"] == [["y", [1, 2], "int32"]]
        assert m["graphs"]["encoder"]["io"]["inputs"][-1] == ["processed_lens", [1], "int32"]

        verify = m["verify"]["default"]
        # per call, on the feeds of a CPU streaming run: every call of utterance 1 (5 chunks)
        calls = {g: e["calls"] for g, e in verify["tensors"].items()}
        assert calls["encoder"] == 5 and calls["joiner"] == 5 * 8 and calls["decoder"] >= 2, calls
        assert all(e["max_rel"] < 0.02 for e in verify["tensors"].values()), verify["tensors"]
        # free-running, the build's own loop: each backend feeds its own states back, every
        # encoder output of every chunk compared; decoder and joiner by the module's greedy search
        # on that loop
        drift = verify["stream"]["encoder"]
        assert sorted(drift) == sorted(tokens) and all(d["calls"] == 5 for d in drift.values())
        for d in drift.values():
            assert sorted(f"encoder/{o}" for o in d["outputs"]) == sorted(outputs[:-2])
            assert all(
                w["passed"] and len(w["per_chunk_max_abs"]) == 5 for w in d["outputs"].values()
            ), d
            assert d["outputs"]["new_processed_lens"]["max_abs"] == 0
            assert all(w["max_rel"] < 0.02 for w in d["outputs"].values()), d["outputs"]
        task = verify["task"]
        assert sorted(task["outputs"]) == sorted(outputs[-2:])
        assert all(w["max_rel"] < 0.02 for w in task["outputs"].values()), task["outputs"]
        assert verify["status"] == "passed" and verify["failures"] == []
        assert m["state_contract"]["encoder"]["state"]["new_processed_lens"] == "processed_lens"
        assert m["state_contract"]["encoder"]["stream"] == {
            "input": "x",
            "axis": 2,
            "chunk": 35,
            "hop": 32,
            "context": 0,
        }
        assert task["tokens"] == tokens and not task["tokens_differ"], task["summary"]
        assert task["decision_margin_min"] > 0   # every greedy decision agreed, with room to spare
        print(
            f"{chip}: tensors {verify['tensors']}; task {task['summary']}; reference margin "
            f"{task['reference_margin_min']:.3f}, closest simulator decision "
            f"{task['decision_margin_min']:.3f}; "
            f"joiner max abs {task['outputs']['joiner/logit']['max_abs']:.3g}; "
            f"verify {verify['seconds']} s"
        )


def test_a_change_to_the_export_script_reruns_export_and_what_follows(streaming_built):
    streaming_built.edit("models/export_streaming.py", '"comment": "seeded test model',
                         '"comment": "seeded test model (v2)')
    rc, executed, text = streaming_built.run()
    assert rc == 0, text
    # every graph's command reads the script: all three re-export
    assert {f"export:{MODEL}/{g}" for g in GRAPHS} <= set(executed)
    # only the encoder's ONNX changed (its metadata): its chain reruns on both chips, the others
    # stop at export
    assert {
        f"simplify:{MODEL}/encoder",
        f"inspect:{MODEL}/encoder",
        f"parity:{MODEL}",
        *[f"compile:{MODEL}/encoder@{c}" for c in CHIPS],
        *[f"verify:{MODEL}@{c}" for c in CHIPS],
        *[f"manifest:{MODEL}@{c}" for c in CHIPS],
    } <= set(executed), executed
    assert not [
        t for t in executed if t.startswith(("simplify:", "compile:")) and "/encoder" not in t
    ], executed
    rc, executed, text = streaming_built.run()
    assert rc == 0 and executed == [], executed   # nothing left to do


def _states():
    return load_module(str(FIXTURE / "streaming.py")).state_specs()


# ---- a stream through two graphs: analysis -> host step (inverse FFT) -> postfilter
# (tests/fixtures/twostage) ----

TWO = FIXTURES / "twostage"


@pytest.fixture(scope="module")
def twostage_built(tmp_path_factory):
    import subprocess
    import sys

    from conftest import sha256
    p = Project(tmp_path_factory.mktemp("twostage") / "proj")
    shutil.copytree(
        TWO, p.root / "models", dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__")
    )
    models = p.root / "models"
    subprocess.run(
        [
            sys.executable,
            "-c",
            f"import sys; sys.path.insert(0, {str(models)!r}); import twostage; "
            f"twostage.make_checkpoint({str(models / 'twostage.pt')!r})",
        ],
        check=True,
    )
    spec_file = models / "twostage.toml"
    spec_file.write_text(spec_file.read_text().replace("@SHA256@", sha256(models / "twostage.pt")))
    rc, executed, text = p.run()
    assert rc == 0, text
    return p


def test_the_second_graphs_stream_is_made_from_the_same_backends_first_graph():
    """compare_runs feeds the host step each backend's OWN run of the first graph: a candidate whose
    first graph is off by 1 makes the second graph's stream off too (the step sees the candidate's
    outputs, not the reference's)."""
    module = types.SimpleNamespace(
        stream=lambda sample: np.arange(8, dtype=np.float32)[None],
        twice=lambda calls, sample: (
            np.concatenate([np.asarray(o["y"]) for _, o in calls], axis=1) * 2
        ),
    )
    io = {"first": {"inputs": [["x", [1, 2], "float32"], ["s", [1, 1], "float32"]],
                    "outputs": [["y", [1, 2], "float32"], ["new_s", [1, 1], "float32"]]},
          "second": {"inputs": [["z", [1, 2], "float32"], ["t", [1, 1], "float32"]],
                     "outputs": [["w", [1, 2], "float32"], ["new_t", [1, 1], "float32"]]}}
    geometry = {"axis": 1, "chunk": 2, "hop": 2, "context": 0}
    streams = {"first": {"geometry": {**geometry, "input": "x"}, "state": {"new_s": "s"}},
               "second": {"geometry": {**geometry, "input": "z", "from": "first", "step": "twice"},
                          "state": {"new_t": "t"}}}

    def backend(offset):
        def run(graph, feeds):
            # y = x + state (+ offset on the candidate); the state counts calls
            if graph == "first":
                return {"y": feeds["x"] + feeds["s"] + offset, "new_s": feeds["s"] + 1}
            return {"w": feeds["z"] + feeds["t"], "new_t": feeds["t"] + 1}
        return run
    checks = {g: {o[0]: {"max_abs": 0.5} for o in io[g]["outputs"]} for g in io}
    sources = {g: {o[0]: "spec" for o in io[g]["outputs"]} for g in io}
    record, failures, _, calls = stream.compare_runs(
        module, [("clip",)], streams, io, backend(0.0), backend(1.0), checks, sources, "models/m.py"
    )
    second = calls["candidate"]["clip"]["second"]
    assert [c[0]["z"].tolist() for c in second] == [
        [[2.0, 4.0]],
        [[8.0, 10.0]],
        [[14.0, 16.0]],
        [[20.0, 22.0]],
    ]
    assert [c[0]["z"].tolist() for c in calls["reference"]["clip"]["second"]][0] == [[0.0, 2.0]]
    assert (
        record["second"]["clip"]["outputs"]["w"]["max_abs"] == 2.0
        and record["second"]["clip"]["calls"] == 4
    )
    assert any(f.startswith("second/w: free-running stream of clip clip") for f in failures)
    assert not any(f.startswith("first/new_s") or f.startswith("second/new_t") for f in failures)


@pytest.mark.parametrize(
    "stream_line, message",
    [
        (
            'stream = { from = "nope", step = "resynthesize", input = "y", axis = 1, chunk = 64, '
            'hop = 64, context = 0 }',
            "graphs.postfilter.stream.from: 'nope' is not a graph declared before this one with a "
            "stream of its own "
            "(streaming graphs: analysis, postfilter)",
        ),
        (
            'stream = { from = "analysis", input = "y", axis = 1, chunk = 64, hop = 64, context = '
            '0 }',
            "graphs.postfilter.stream.step: missing required field",
        ),
        (
            'stream = { from = "analysis", step = "re-synth", input = "y", axis = 1, chunk = 64, '
            'hop = 64, context = 0 }',
            "graphs.postfilter.stream.step: 're-synth': the name of a function in the model's "
            "module",
        ),
    ],
)
def test_a_stream_from_another_graph_is_checked_at_load(tmp_path, stream_line, message):
    text = (TWO / "twostage.toml").read_text().replace("@SHA256@", "0" * 64)
    text = "\n".join(
        stream_line if line.startswith("stream = { from") else line for line in text.splitlines()
    )
    shutil.copytree(TWO, tmp_path / "models")
    (tmp_path / "models" / "twostage.pt").write_bytes(b"")
    (tmp_path / "models" / "twostage.toml").write_text(text)
    with pytest.raises(spec.SpecError) as raised:
        spec.load(tmp_path / "models" / "twostage.toml", chips.load())
    assert str(raised.value).endswith(message) and "twostage.toml: " in str(raised.value)


def test_two_stateful_graphs_with_a_host_step_between_them_build_with_both_states_in_every_record(
    twostage_built,
):
    p = twostage_built
    for chip in CHIPS:
        m = json.loads((p.root / f"build/twostage/ort-qnn/{chip}/manifest.json").read_text())
        contract = m["state_contract"]
        assert set(contract) == {"analysis", "postfilter"}
        assert (
            contract["postfilter"]["state"] == {"new_c": "c"}
            and contract["postfilter"]["stream"]["from"] == "analysis"
            and "host step resynthesize() makes from graph analysis's outputs"
            in contract["postfilter"]["calls"]
        )
        verify = m["verify"]["default"]
        assert verify["status"] == "passed" and set(verify["stream"]) == {"analysis", "postfilter"}
        for graph, state in (("analysis", "new_h"), ("postfilter", "new_c")):
            # per-chunk drift and a gate for every state
            for clip, drift in verify["stream"][graph].items():
                d = drift["outputs"][state]
                assert d["passed"] is True and len(d["per_chunk_max_abs"]) == drift["calls"] >= 9, (
                    graph,
                    clip,
                )
        assert verify["stream"]["postfilter"]["tone-3"]["outputs"]["new_c"]["check"] == {
            "max_abs": 0.02
        }
        assert verify["task"]["snr_db"]["tone-3"] > 30
    # PyTorch through the same chain
    parity = json.loads((p.root / "build/twostage/parity.json").read_text())
    assert (
        set(parity["stream"]) == {"analysis", "postfilter"}
        and parity["task"]["snr_db"]["tone-7"] > 60
    )
    report = (p.root / "build/report.md").read_text()
    assert (
        "| twostage | SM8750 | postfilter | 64 / 64 / 0, made by resynthesize() from analysis |"
        in report
    )
    assert "| twostage | SM8750 | analysis | 64 / 64 / 64 |" in report
    rc, _, text = p.run("bundle:twostage@SM8750")
    assert rc == 0, text
    import tarfile
    bundle = p.root / "build/twostage/ort-qnn/SM8750/bundle/onnxruntime-qnn-SM8750-twostage.tar.bz2"
    with tarfile.open(bundle) as tar:
        files = {
            m.name.rsplit("/", 1)[-1]: tar.extractfile(m).read().decode()
            for m in tar.getmembers()
            if m.name.endswith(("info.txt", "README.md"))
        }
    assert (
        "state_analysis=new_h->h" in files["info.txt"]
        and "state_postfilter=new_c->c" in files["info.txt"]
    )
    assert (
        "stream_postfilter=axis=1,chunk=64,context=0,from=analysis,hop=64,input=y,step=resynthesize"
        in files["info.txt"]
    )
    assert "## `postfilter`: a stateful chunk step" in files["README.md"]
    assert "the model code's host step resynthesize()" in files["README.md"]
