"""sherpa-onnx's QNN runtime contract (docs/phone.md; k2-fsa/sherpa-onnx sherpa-onnx/csrc/qnn/):
which kind a model's binaries fit, or why not.

Checked on the names, shapes and dtypes the runtime sees in the binary. Not checked because the
runtime does not check them either: the QNN graph name (it retrieves the first graph under whatever
name the binary-info reports: sherpa-onnx/csrc/qnn/qnn-model.cc), so the EP's
`QNNExecutionProvider_…` is no bar."""
from __future__ import annotations

QNN_DTYPES = ("float32", "float16", "ufixed16", "int32")   # anything else is rejected at load
WHISPER_TYPES = (
    "tiny",
    "tiny.en",
    "base",
    "base.en",
    "small",
    "small.en",
    "medium",
    "medium.en",
    "large",
)
# Component order in QnnConfig.contextBinary, per kind of model, as sherpa-onnx's QNN
# runtime reads it.
ORDER = {"whisper": ("encoder", "decoder"), "moonshine": ("encoder", "decoder"),
         "zipformer-ctc": ("model",), "sense-voice": ("model",)}


def binary_view(info: dict) -> dict:
    """The same view from a binary's read-back (compile record 'info')."""
    g = info["graphs"][0]
    return {
        kind: [[t["name"], list(t["shape"]), t["dtype"]] for t in g[kind]]
        for kind in ("inputs", "outputs")
    }


def kind(model_name: str, graphs: dict) -> str | None:
    """The sherpa-onnx kind of model (whisper, zipformer-ctc, ...) a model's components
    name, or None."""
    names = tuple(graphs)
    if set(names) == {"encoder", "decoder"}:
        mel = any(t[0].endswith("_mel") for t in graphs["encoder"]["inputs"])
        return "whisper" if mel or "whisper" in model_name else "moonshine"
    if names == ("model",):
        return (
            "sense-voice"
            if [t[0] for t in graphs["model"]["inputs"]] == ["x", "prompt"]
            else "zipformer-ctc"
        )
    return None


def problems(model_name: str, graphs: dict, tokens: bool) -> tuple[str | None, list[str]]:
    """(kind, reasons the sherpa-onnx runtime would refuse these binaries); no
    reasons = loadable."""
    found_kind = kind(model_name, graphs)
    if found_kind is None:
        return None, [
            f"graphs ({', '.join(graphs)}) match no sherpa-onnx QNN kind of model checked here "
            "(whisper and "
            f"moonshine: encoder, decoder; zipformer-CTC, parakeet-CTC, SenseVoice: model); "
            "transducer and Paraformer contracts are not implemented in "
            "toolchain/deploy/sherpa_contract.py"
        ]
    found = [
        f"{g}.{kind[:-1]} {t[0]}: dtype {t[2]} (the runtime takes {', '.join(QNN_DTYPES)})"
        for g, io in graphs.items()
        for kind in ("inputs", "outputs")
        for t in io[kind]
        if t[2] not in QNN_DTYPES
    ]
    if not tokens:
        found.append(
            "no tokens.txt: the model module has no write_tokens(path) (sherpa-onnx needs the "
            "vocabulary)"
        )
    if found_kind in ("whisper", "moonshine"):
        found += _encoder_decoder(found_kind, graphs["encoder"], graphs["decoder"])
    elif found_kind == "sense-voice":
        found += _single(graphs["model"], ["x", "prompt"], "logits", {"x": 3, "prompt": 1})
    else:
        found += _single(graphs["model"], ["x"], "log_probs", {"x": 3})
    return found_kind, found


def _single(io: dict, inputs: list[str], output: str, ranks: dict) -> list[str]:
    found = []
    names = [t[0] for t in io["inputs"]]
    if names != inputs:
        found.append(f"model inputs {names}, the runtime wants exactly {inputs} (§4.4)")
    for name, shape, _ in io["inputs"]:
        if name in ranks and (len(shape) != ranks[name] or (ranks[name] == 3 and shape[0] != 1)):
            found.append(
                f"model input {name} {shape}: the runtime wants {ranks[name]}-D (batch 1 first)"
            )
    if [t[0] for t in io["outputs"]] != [output]:
        found.append(
            f"model outputs {[t[0] for t in io['outputs']]}, the runtime wants ['{output}']"
        )
    return found


def _encoder_decoder(found_kind: str, enc: dict, dec: dict) -> list[str]:
    """Whisper (prefixed '<p>_') and Moonshine (no prefix): per-layer cross K/V, 1+4L+2 decoder
    inputs, the caller writing each new token's K/V at `offset` (no in-graph cache update, as
    sherpa-onnx exports Whisper)."""
    found, prefix = [], ""
    first = enc["inputs"][0][0] if enc["inputs"] else ""
    if found_kind == "whisper":
        if not first.endswith("_mel"):
            found.append(
                f"encoder input '{first}' does not end in '_mel': the runtime parses the model "
                "prefix <p> "
                f"from '<p>_mel' (e.g. 'tiny_en_mel') and exits otherwise"
            )
            prefix = "<p>_"
        else:
            prefix = first[:-len("_mel")] + "_"
            kind = prefix[:-1].removeprefix("distil_").replace("_", ".", 1)
            if kind not in WHISPER_TYPES and not kind.startswith("large"):
                found.append(
                    f"prefix '{prefix[:-1]}' names no Whisper model type the runtime knows "
                    f"({', '.join(WHISPER_TYPES)})"
                )
        shape = enc["inputs"][0][1] if enc["inputs"] else []
        if len(shape) != 3 or shape[0] != 1 or shape[2] not in (80, 128):
            found.append(
                f"encoder input {first} {shape}: the runtime reads it as (1, frames, n_mels) with "
                "80 or 128 "
                f"mel bins (the layout the QAIRT converter gives an ONNX (1, n_mels, frames) input)"
            )
    elif first != "audio":
        found.append(f"encoder input '{first}': Moonshine's runtime wants 'audio'")
    outs = [t[0] for t in enc["outputs"]]
    layers = len(outs) // 2
    want = [f"cross_{kv}_{i}" for i in range(layers) for kv in "kv"]
    if sorted(outs) != sorted(want) or not layers:
        found.append(
            f"encoder outputs {outs}: the runtime wants unprefixed per-layer cross_k_<i>, "
            "cross_v_<i> "
            f"(2 per decoder layer), each (1, frames, state)"
        )
    stacked = [s for _, s, _ in enc["outputs"] if len(s) == 4]
    # [L, 1, frames, state]: all layers in one tensor, where the runtime wants one per layer
    if stacked:
        layers = stacked[0][0]
        found.append(
            f"encoder outputs stack {layers} layers in one 4-D tensor {stacked[0]}: the runtime "
            "wants one "
            f"3-D (1, frames, state) tensor per layer"
        )
    layers = max(layers, 1)
    want_in = (
        [f"{prefix}tokens"]
        + [
            f"{prefix}{kind}_{kv}_{i}"
            for i in range(layers)
            for kind in ("self", "cross")
            for kv in "kv"
        ]
        + [f"{prefix}offset", f"{prefix}mask"]
    )
    got_in = [t[0] for t in dec["inputs"]]
    if len(got_in) != len(want_in) or sorted(got_in) != sorted(want_in):
        found.append(
            f"decoder inputs {got_in}: the runtime wants exactly 1+4L+2 = {len(want_in)} for "
            f"L={layers}: "
            f"{', '.join(want_in)}"
        )
    want_out = [f"{prefix}logits"] + [
        f"{prefix}this_self_{kv}_{i}" for i in range(layers) for kv in "kv"
    ]
    got_out = [t[0] for t in dec["outputs"]]
    if sorted(got_out) != sorted(want_out):
        found.append(f"decoder outputs {got_out}: the runtime wants {', '.join(want_out)}")
    in_shapes = {tuple(t[1]) for t in dec["inputs"] if len(t[1]) > 2}
    updated = [t[0] for t in dec["outputs"] if tuple(t[1]) in in_shapes]
    if updated:
        found.append(
            f"decoder outputs {updated} have a cache input's full shape: the cache is updated in "
            "the "
            "graph, while the runtime expects only the new token's K/V and writes it at offset "
            "itself"
        )
    mask = [t for t in dec["inputs"] if t[0] == f"{prefix}mask"]
    if mask and (len(mask[0][1]) != 1 or mask[0][2] != "int32"):
        found.append(
            f"decoder input {prefix}mask {mask[0][1]} {mask[0][2]}: the runtime wants 1-D int32 "
            f"(length = context)"
        )
    return found
