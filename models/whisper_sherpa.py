"""Whisper in sherpa-onnx's QNN runtime contract (sherpa-onnx/csrc/qnn/offline-whisper-model-qnn.cc and
scripts/whisper/rknn/export_onnx.py at k2-fsa/sherpa-onnx 634265c9), so `QnnConfig(contextBinary =
"encoder.bin,decoder.bin")` loads our binaries:

- encoder: `<p>_mel` -> unprefixed `cross_k_i`, `cross_v_i` (1, frames, state) per decoder layer;
- decoder, one token per call: `<p>_tokens` int32 (1,1), `<p>_self_k_i`/`<p>_self_v_i` (full cache),
  `<p>_cross_k_i`/`<p>_cross_v_i` (host-transposed), `<p>_offset` int32 (1), `<p>_mask` int32 (n_ctx,
  1 = masked) -> `<p>_logits`, `<p>_this_self_k_i`/`<p>_this_self_v_i` (the new token's K/V only: the
  host writes it into the cache at `offset`; no ScatterND in the graph).

`[export] args.layout` says in which layout the ONNX takes its 3-D inputs: "qnn" (default) is the layout
the runtime reads from the binary, (1, frames, n_mels) and (1, state, n_ctx), for the embedded compiler,
which keeps ONNX layouts; "onnx" is sherpa's own ONNX layout, (1, n_mels, frames) and (1, n_ctx, state),
for the QAIRT converter, which swaps a 3-D input's last two axes. The prefix comes from the declared
input names (`tiny_en_mel` -> `tiny_en`): sanitised already, so the converter's renaming leaves them."""
import os
import shutil

import numpy as np
import torch
import torch.nn.functional as F

from toolchain.modelkit import load_module, read_wav, sherpa_whisper, torch_to_onnx

# The weights, the checkpoint conversion and the clips are whisper_npu's: one source of truth.
_npu = load_module(os.path.join(os.path.dirname(os.path.abspath(__file__)), "whisper_npu.py"))
prepare_checkpoint, samples, agree, _load = _npu.prepare_checkpoint, _npu.samples, _npu.agree, _npu._load
MASKED = -60000.0   # the runtime's own export: masked_fill(mask, -60000), fp16-safe


def _layout(mel_shape) -> str:
    """'qnn' when the mel input is (1, frames, n_mels), 'onnx' when it is (1, n_mels, frames)."""
    return "qnn" if mel_shape[2] in (80, 128) else "onnx"


class Encoder(torch.nn.Module):
    """mel -> cross_k_0, cross_v_0, cross_k_1, ...: the audio encoder, then each decoder layer's cross K/V."""

    def __init__(self, model, layout: str):
        super().__init__()
        self.enc, self.layout, self.n_head = model.encoder, layout, model.dims.n_audio_head
        self.cross = torch.nn.ModuleList(b.cross_attn for b in model.decoder.blocks)

    def forward(self, mel):
        if self.layout == "qnn":   # (1, frames, n_mels) -> the conv stem's (1, n_mels, frames)
            mel = mel.transpose(1, 2)
        x = F.gelu(self.enc.conv2(F.gelu(self.enc.conv1(mel)))).permute(0, 2, 1)
        x = x + self.enc.positional_embedding[:x.shape[1]]   # shorter windows use the first positions
        for blk in self.enc.blocks:
            h = blk.attn_ln(x)
            x = x + blk.attn.out(_npu._attend(blk.attn.query(h), blk.attn.key(h), blk.attn.value(h), self.n_head))
            x = x + blk.mlp(blk.mlp_ln(x))
        x = self.enc.ln_post(x)
        return tuple(t for a in self.cross for t in (a.key(x), a.value(x)))


class Decoder(torch.nn.Module):
    """One token: attention over the masked cache plus the token's own K/V (sherpa's qk / qk1 split)."""

    def __init__(self, model, layout: str, masked: float = MASKED):
        super().__init__()
        self.dec, self.layout, self.masked = model.decoder, layout, masked
        self.n_head, self.layers = model.dims.n_text_head, model.dims.n_text_layer

    def _heads(self, x, channels_first: bool):
        """(1, T, D) or, channels first, (1, D, T) -> (1, H, hd, T) keys/values per head."""
        if not channels_first:
            x = x.transpose(1, 2)
        return x.reshape(1, self.n_head, x.shape[1] // self.n_head, x.shape[2])

    def forward(self, tokens, *rest):
        L = self.layers
        self_kv, cross_kv, offset, mask = rest[:2 * L], rest[2 * L:4 * L], rest[4 * L], rest[4 * L + 1]
        first = self.layout == "qnn"   # caches come (1, state, n_ctx) / (1, state, frames)
        x = self.dec.token_embedding(tokens) + torch.index_select(self.dec.positional_embedding, 0, offset)
        valid = (mask == 0).reshape(1, 1, 1, -1)
        this = []
        for i, blk in enumerate(self.dec.blocks):
            h = blk.attn_ln(x)
            q, k1, v1 = blk.attn.query(h), blk.attn.key(h), blk.attn.value(h)
            this += [k1, v1]
            x = x + blk.attn.out(self._self_attend(q, k1, v1, self_kv[2 * i], self_kv[2 * i + 1], valid, first))
            h = blk.cross_attn_ln(x)
            q = blk.cross_attn.query(h)
            x = x + blk.cross_attn.out(self._attend(q, cross_kv[2 * i], cross_kv[2 * i + 1], first))
            x = x + blk.mlp(blk.mlp_ln(x))
        x = self.dec.ln(x)
        d = x.shape[-1]
        logits = (self.dec.token_embedding.weight @ x.reshape(1, d).transpose(0, 1)).reshape(1, 1, -1)
        return (logits, *this)

    def _scores(self, q, k, first):
        hd = q.shape[-1] // self.n_head
        qh = q.reshape(1, 1, self.n_head, hd).transpose(1, 2) * hd ** -0.5   # (1, H, 1, hd)
        return qh, qh @ self._heads(k, first)                                 # (1, H, 1, T)

    def _attend(self, q, k, v, first):
        qh, s = self._scores(q, k, first)
        w = F.softmax(s, dim=-1)
        out = w @ self._heads(v, first).transpose(-1, -2)                    # (1, H, 1, hd)
        return out.transpose(1, 2).reshape(1, 1, -1)

    def _self_attend(self, q, k1, v1, k_cache, v_cache, valid, first):
        qh, s = self._scores(q, k_cache, first)
        s = torch.where(valid, s, self.masked)
        hd = qh.shape[-1]
        s1 = qh @ k1.reshape(1, 1, self.n_head, hd).permute(0, 2, 3, 1)       # (1, H, 1, 1)
        w = F.softmax(torch.cat([s, s1], dim=-1), dim=-1)
        out = w[..., :-1] @ self._heads(v_cache, first).transpose(-1, -2)
        out = out + w[..., -1:] * v1.reshape(1, 1, self.n_head, hd).transpose(1, 2)
        return out.transpose(1, 2).reshape(1, 1, -1)


def _names(prefix: str, graph: str, layers: int) -> tuple[list[str], list[str]]:
    """Input and output names in the order sherpa's export script gives them."""
    if graph == "encoder":
        return [f"{prefix}_mel"], [f"cross_{kv}_{i}" for i in range(layers) for kv in "kv"]
    caches = [f"{prefix}_{kind}_{kv}_{i}" for kind in ("self", "cross") for i in range(layers) for kv in "kv"]
    return ([f"{prefix}_tokens", *caches, f"{prefix}_offset", f"{prefix}_mask"],
            [f"{prefix}_logits"] + [f"{prefix}_this_self_{kv}_{i}" for i in range(layers) for kv in "kv"])


def _example(model, graph: str, layout: str) -> tuple:
    dims = model.dims
    D, n_ctx, frames = dims.n_text_state, dims.n_text_ctx, dims.n_audio_ctx
    swap = (lambda a, b: (1, b, a)) if layout == "qnn" else (lambda a, b: (1, a, b))
    if graph == "encoder":
        return (torch.zeros(swap(dims.n_mels, 2 * frames)),)
    L = dims.n_text_layer
    self_kv = [torch.zeros(swap(n_ctx, D)) for _ in range(2 * L)]
    cross = [torch.zeros(swap(frames, D)) for _ in range(2 * L)]
    mask = torch.ones(n_ctx, dtype=torch.int32)
    return (torch.zeros(1, 1, dtype=torch.int32), *self_kv, *cross, torch.zeros(1, dtype=torch.int32), mask)


def torch_graph(checkpoint: str, graph: str, layout: str = "qnn", masked: float = MASKED) -> torch.nn.Module:
    model = _load(checkpoint)
    if graph == "encoder":
        return Encoder(model, layout).eval()
    if graph == "decoder":
        return Decoder(model, layout, masked).eval()
    raise ValueError(f"unknown graph {graph!r} (expected 'encoder' or 'decoder')")


def export(checkpoint: str, graph: str, out: str, settings: dict) -> None:
    """One graph to one ONNX file, named and laid out for the runtime's contract."""
    args = settings.get("args", {})
    prefix, layout = args.get("prefix"), args.get("layout", "qnn")
    if not prefix:
        raise ValueError("[export] args.prefix is required: the runtime parses the model type from '<prefix>_mel'")
    sherpa_whisper.parse_prefix(f"{prefix}_mel")   # refused here, before anything is compiled
    if layout not in ("qnn", "onnx"):
        raise ValueError(f"[export] args.layout = {layout!r}: expected 'qnn' (embedded compiler) or 'onnx' (QAIRT)")
    module = torch_graph(checkpoint, graph, layout, float(args.get("masked", MASKED)))
    inputs, outputs = _names(prefix, graph, module_layers(module))
    torch_to_onnx(module, _example(_load(checkpoint), graph, layout), out, inputs, outputs, settings)


def module_layers(module) -> int:
    return len(module.cross) if isinstance(module, Encoder) else module.layers


def torch_runner(checkpoint: str):
    """run(graph, feeds) over the PyTorch wrappers; names, layout and order taken from the feeds."""
    graphs = {}

    def run(graph: str, feeds: dict) -> dict:
        first = next(iter(feeds))
        if graph not in graphs:
            model = _load(checkpoint)
            shape = feeds[first].shape if graph == "encoder" else feeds[list(feeds)[1]].shape   # mel, self_k_0
            if graph == "encoder":
                layout = "qnn" if shape[2] == model.dims.n_mels else "onnx"
            else:
                layout = "qnn" if shape[1] == model.dims.n_text_state else "onnx"
            graphs[graph] = torch_graph(checkpoint, graph, layout)
        module = graphs[graph]
        prefix = first[:first.rfind("_")] if graph == "encoder" else first[:-len("_tokens")]
        with torch.no_grad():
            outs = module(*(torch.from_numpy(np.asarray(v)) for v in feeds.values()))
        return dict(zip(_names(prefix, graph, module_layers(module))[1], (o.numpy() for o in outs)))

    return run


def features(wav: str | None) -> np.ndarray:
    """Normalised log-mel (frames, 80) of the clip, unpadded: what sherpa's Whisper front end hands the
    model (NormalizeWhisperFeatures: log10, max-8 floor, (x+4)/4); the model pads with 0 to 30 s."""
    from whisper.audio import log_mel_spectrogram
    audio = read_wav(wav) if wav else np.zeros(16000, np.float32)
    return log_mel_spectrogram(torch.from_numpy(audio)).numpy().T.astype(np.float32)


def graphs(run, io: dict) -> tuple:
    """(encoder, decoder) with sherpa's QnnModel interface over run(graph, feeds), for the runtime's loop."""
    layout = _layout(io["encoder"]["inputs"][0][1])
    return (sherpa_whisper.GraphRun(run, "encoder", io["encoder"], layout),
            sherpa_whisper.GraphRun(run, "decoder", io["decoder"], layout))


def tokens_file(vocab: int) -> str:
    """The tiktoken ranks sherpa's export writes as tokens.txt ('<base64> <id>' per line)."""
    import whisper
    name = "gpt2.tiktoken" if vocab < 51865 else "multilingual.tiktoken"
    return os.path.join(os.path.dirname(whisper.__file__), "assets", name)


def write_tokens(path: str, io: dict) -> None:
    shutil.copyfile(tokens_file(io["decoder"]["outputs"][0][1][-1]), path)


def evaluate(run, clips: list, io: dict) -> dict:
    """Transcribe each clip with sherpa-onnx's own host loop over `run`; pooled normalised WER."""
    table = sherpa_whisper.read_tokens(tokens_file(io["decoder"]["outputs"][0][1][-1]))
    return transcribe(*graphs(run, io), clips, table)


def transcribe(encoder, decoder, clips: list, table: dict) -> dict:
    """The runtime's loop over two graphs (QnnModel or GraphRun) for each clip: texts, tokens, the pooled
    normalised WER and per-clip timings."""
    import jiwer
    from whisper.normalizers import EnglishTextNormalizer
    norm, result, timings, refs, hyps = EnglishTextNormalizer(), {}, {}, [], []
    for clip_id, wav, ref in clips:
        timings[clip_id] = {}
        tokens = sherpa_whisper.recognize(encoder, decoder, features(wav), timings[clip_id])
        text = sherpa_whisper.detokenize(tokens, table).strip()
        result[clip_id] = {"text": text, "tokens": tokens}
        refs.append(norm(ref))
        hyps.append(norm(text))
    return {"clips": result, "wer": float(jiwer.wer(refs, hyps)), "timings": timings}


class _Enough(Exception):
    """Stops the loop once the calls wanted are recorded."""


class _Recorder(sherpa_whisper.GraphRun):
    """A GraphRun that keeps the feeds of its first `limit` calls, then stops the loop."""

    def __init__(self, run, graph: str, io: dict, layout: str, limit: int):
        super().__init__(run, graph, io, layout)
        self.limit, self.calls = limit, []

    def run(self) -> None:
        if len(self.calls) == self.limit:
            raise _Enough
        self.calls.append({n: self._feeds[n].copy() for n in self.input_names})
        super().run()


def graph_feeds(run, sample, io: dict, steps: int = 3) -> dict:
    """The clip's encoder feeds and the first `steps` decoder calls of the runtime's loop."""
    layout = _layout(io["encoder"]["inputs"][0][1])
    enc = _Recorder(run, "encoder", io["encoder"], layout, 1)
    dec = _Recorder(run, "decoder", io["decoder"], layout, steps)
    try:
        sherpa_whisper.recognize(enc, dec, features(sample[1] if sample else None))
    except _Enough:
        pass
    return {"encoder": enc.calls, "decoder": dec.calls}
