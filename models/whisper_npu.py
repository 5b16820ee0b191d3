"""Whisper (openai-whisper layout) as two static-shape graphs for the HTP: encoder and one-token decoder, at 30 s
and at each shorter encoder window the spec declares ([windows]: encoder_5s, decoder_5s, ...; the mel frames and the
positional embedding cut to the window, the decoder's cross-attention reading as many keys)."""
import os
import struct

import numpy as np
import torch
import torch.nn.functional as F

from toolchain.modelkit import StageFailed, read_wav, torch_to_onnx

N_CTX = 448  # decoder self-attention cache slots (Whisper's n_text_ctx)
# Score of a masked key: finite and fp16-representable, unlike -inf / -1e9. A w8a16 graph declares a
# small one ([export] args.masked): the masked scores set the 16-bit quantization range of the attention
# scores, and -60000 there makes a step of 0.92 (measured), rounding every score.
MASKED = -60000.0
INPUTS = {"encoder": ["mel"], "decoder": ["token", "index", "k_cache", "v_cache", "cross_k", "cross_v"]}
OUTPUTS = {"encoder": ["cross_k", "cross_v"], "decoder": ["logits", "k_cache_out", "v_cache_out"]}
DIM_KEYS = ["n_mels", "n_audio_ctx", "n_audio_state", "n_audio_head", "n_audio_layer",
            "n_vocab", "n_text_ctx", "n_text_state", "n_text_head", "n_text_layer"]
# CTranslate2 DataType enum ids -> numpy dtype (bfloat16 is handled separately)
CT2_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16, 5: np.uint16}


def _read_ct2(path: str) -> dict[str, np.ndarray]:
    """Parse a CTranslate2 model.bin into {variable name: array}, aliases resolved."""
    with open(path, "rb") as f:
        buf, pos = f.read(), 0

    def take(fmt: str) -> tuple:
        nonlocal pos
        vals = struct.unpack_from("<" + fmt, buf, pos)
        pos += struct.calcsize("<" + fmt)
        return vals

    def text() -> str:
        nonlocal pos
        (n,) = take("H")
        pos += n
        return buf[pos - n:pos].rstrip(b"\0").decode()

    try:
        (version,) = take("I")
        if not 4 <= version <= 6:  # versions < 4 store item sizes instead of dtypes
            raise ValueError(f"{path}: not a supported CTranslate2 model.bin (binary version {version})")
        spec, _revision, (n_vars,) = text(), take("I"), take("I")
        if spec != "WhisperSpec":
            raise ValueError(f"{path}: CTranslate2 spec is {spec!r}, expected 'WhisperSpec'")
        out = {}
        for _ in range(n_vars):
            name, (rank,) = text(), take("B")
            dims, (dtype_id,), (nbytes,) = take("I" * rank), take("B"), take("I")
            if pos + nbytes > len(buf):
                raise ValueError(f"{path}: truncated CTranslate2 model file (variable {name})")
            arr = np.frombuffer(buf, CT2_DTYPES[dtype_id], nbytes // np.dtype(CT2_DTYPES[dtype_id]).itemsize, pos)
            if dtype_id == 5:  # bfloat16 = upper half of a float32
                arr = (arr.astype(np.uint32) << 16).view(np.float32)
            out[name] = arr.reshape(dims)
            pos += nbytes
        (n_alias,) = take("I")
        for _ in range(n_alias):
            alias, target = text(), text()
            out[alias] = out[target]
    except (struct.error, KeyError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: malformed CTranslate2 model file ({e!r})") from e
    if pos != len(buf):
        raise ValueError(f"{path}: {len(buf) - pos} trailing bytes after the CTranslate2 variables")
    return out


def _ct2_to_openai(v: dict[str, np.ndarray]) -> dict:
    """Map CT2 Whisper variables onto openai-whisper names, splitting CT2's fused q|k|v and k|v projections."""
    if any(k.endswith("weight_scale") for k in v):
        raise ValueError("int8-quantized CTranslate2 models are not supported (need float weights)")
    sd, n_enc, n_dec = {}, 0, 0
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))  # fp16 -> fp32 is exact

    def lin(dst: str, src: str) -> None:
        sd[dst + ".weight"], sd[dst + ".bias"] = t(v[src + "/weight"]), t(v[src + "/bias"])

    def ln(dst: str, src: str) -> None:
        sd[dst + ".weight"], sd[dst + ".bias"] = t(v[src + "/gamma"]), t(v[src + "/beta"])

    def split(dst: str, names: list[str], src: str) -> None:
        w, b = np.split(v[src + "/weight"], len(names)), np.split(v[src + "/bias"], len(names))
        for name, wi, bi in zip(names, w, b):
            sd[f"{dst}.{name}.weight"], sd[f"{dst}.{name}.bias"] = t(wi), t(bi)
        # Whisper's key projection has no bias; CT2 stores zeros, anything else would be lost
        if sd.pop(f"{dst}.key.bias").any():
            raise ValueError(f"{src}: non-zero key bias cannot be represented in openai-whisper")

    def block(dst: str, src: str, cross: bool) -> None:
        ln(dst + ".attn_ln", src + "/self_attention/layer_norm")
        split(dst + ".attn", ["query", "key", "value"], src + "/self_attention/linear_0")
        lin(dst + ".attn.out", src + "/self_attention/linear_1")
        if cross:
            ln(dst + ".cross_attn_ln", src + "/attention/layer_norm")
            lin(dst + ".cross_attn.query", src + "/attention/linear_0")
            split(dst + ".cross_attn", ["key", "value"], src + "/attention/linear_1")
            lin(dst + ".cross_attn.out", src + "/attention/linear_2")
        ln(dst + ".mlp_ln", src + "/ffn/layer_norm")
        lin(dst + ".mlp.0", src + "/ffn/linear_0")
        lin(dst + ".mlp.2", src + "/ffn/linear_1")

    try:
        lin("encoder.conv1", "encoder/conv1")
        lin("encoder.conv2", "encoder/conv2")
        sd["encoder.positional_embedding"] = t(v["encoder/position_encodings/encodings"])
        while f"encoder/layer_{n_enc}/ffn/linear_0/weight" in v:
            block(f"encoder.blocks.{n_enc}", f"encoder/layer_{n_enc}", cross=False)
            n_enc += 1
        ln("encoder.ln_post", "encoder/layer_norm")
        sd["decoder.token_embedding.weight"] = t(v["decoder/embeddings/weight"])
        sd["decoder.positional_embedding"] = t(v["decoder/position_encodings/encodings"])
        while f"decoder/layer_{n_dec}/ffn/linear_0/weight" in v:
            block(f"decoder.blocks.{n_dec}", f"decoder/layer_{n_dec}", cross=True)
            n_dec += 1
        ln("decoder.ln", "decoder/layer_norm")
        conv1, emb = sd["encoder.conv1.weight"], sd["decoder.token_embedding.weight"]
        dims = {"n_mels": conv1.shape[1], "n_audio_ctx": len(sd["encoder.positional_embedding"]),
                "n_audio_state": conv1.shape[0], "n_audio_head": v["encoder/num_heads"], "n_audio_layer": n_enc,
                "n_vocab": emb.shape[0], "n_text_ctx": len(sd["decoder.positional_embedding"]),
                "n_text_state": emb.shape[1], "n_text_head": v["decoder/num_heads"], "n_text_layer": n_dec}
    except KeyError as e:
        raise ValueError(f"CTranslate2 Whisper model lacks variable {e}") from e
    return {"dims": {k: int(x) for k, x in dims.items()}, "model_state_dict": sd}


def prepare_checkpoint(source: str, out: str, fmt: str) -> None:
    """Write an openai-whisper checkpoint {'dims', 'model_state_dict'} to `out` from a "ctranslate2"/"openai-whisper" source."""
    if fmt == "ctranslate2":
        ckpt = _ct2_to_openai(_read_ct2(source))
    elif fmt == "openai-whisper":
        try:
            ckpt = torch.load(source, map_location="cpu", weights_only=True)
        except Exception as e:  # torch raises assorted pickle/zip errors for non-checkpoints
            raise ValueError(f"{source}: cannot load as a torch checkpoint ({e})") from e
        if not isinstance(ckpt, dict) or not isinstance(ckpt.get("model_state_dict"), dict) \
                or not set(DIM_KEYS) <= set(ckpt.get("dims") or {}):
            raise ValueError(f"{source}: not an openai-whisper checkpoint (needs 'dims' and 'model_state_dict')")
    else:
        raise ValueError(f"unknown checkpoint format {fmt!r} (expected 'ctranslate2' or 'openai-whisper')")
    torch.save(ckpt, out)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_head: int,
            valid: torch.Tensor | None = None, masked: float = MASKED) -> torch.Tensor:
    """Multi-head attention [1,Tq,D] x [1,Tk,D] -> [1,Tq,D]; `valid` [Tk] bool masks keys fp16-safely."""
    d = q.shape[-1]
    heads = lambda x: x.reshape(1, x.shape[1], n_head, d // n_head).transpose(1, 2)
    s = heads(q) @ heads(k).transpose(-1, -2) * (d // n_head) ** -0.5
    if valid is not None:
        s = torch.where(valid, s, masked)
    return (F.softmax(s, dim=-1) @ heads(v)).transpose(1, 2).reshape(1, q.shape[1], d)


class EncoderStatic(torch.nn.Module):
    """mel [1,80,2*P] -> cross_k, cross_v [L,1,P,D]: the audio encoder plus every decoder layer's cross K/V, for
    P = n_positions (1500: 30 s; fewer: a shorter window, whisper.cpp's --audio-ctx)."""

    def __init__(self, model, n_positions: int | None = None):
        super().__init__()
        self.dims, self.enc, self.n_head = model.dims, model.encoder, model.dims.n_audio_head
        self.cross = torch.nn.ModuleList(b.cross_attn for b in model.decoder.blocks)
        # A window's own cut copy of the embedding, so its ONNX holds only the rows it adds (30 s: the original)
        n_positions = n_positions or model.dims.n_audio_ctx
        self.register_buffer("window_positions", model.encoder.positional_embedding[:n_positions].clone(),
                             persistent=False)
        self.windowed = n_positions != model.dims.n_audio_ctx

    def forward(self, mel: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        positions = self.window_positions if self.windowed else self.enc.positional_embedding
        x = F.gelu(self.enc.conv2(F.gelu(self.enc.conv1(mel)))).permute(0, 2, 1) + positions
        for blk in self.enc.blocks:
            h = blk.attn_ln(x)
            x = x + blk.attn.out(_attend(blk.attn.query(h), blk.attn.key(h), blk.attn.value(h), self.n_head))
            x = x + blk.mlp(blk.mlp_ln(x))
        x = self.enc.ln_post(x)
        return (torch.stack([a.key(x) for a in self.cross]), torch.stack([a.value(x) for a in self.cross]))


class DecoderStatic(torch.nn.Module):
    """One decoder step with a fixed 448-slot self-attention cache updated by a one-hot mask."""

    def __init__(self, model, masked: float = MASKED):
        super().__init__()
        self.dims, self.dec, self.n_head, self.masked = model.dims, model.decoder, model.dims.n_text_head, masked
        # int32 positions so comparing with the int32 `index` input needs no int64 cast
        self.register_buffer("slots", torch.arange(model.dims.n_text_ctx, dtype=torch.int32), persistent=False)

    def forward(self, token, index, k_cache, v_cache, cross_k, cross_v):
        dec, d = self.dec, k_cache.shape[-1]
        # index_select exports as Gather (int32 ok); tensor[index] would become an invalid GatherND
        x = dec.token_embedding(token) + torch.index_select(dec.positional_embedding, 0, index)
        hot = (self.slots == index).to(x.dtype).reshape(1, -1, 1)  # [1,448,1]
        valid = self.slots <= index  # causal: slots after `index` are empty/stale
        k_out, v_out = [], []
        for i, blk in enumerate(dec.blocks):
            h = blk.attn_ln(x)
            k = k_cache[i] * (1 - hot) + blk.attn.key(h) * hot
            v = v_cache[i] * (1 - hot) + blk.attn.value(h) * hot
            k_out.append(k)
            v_out.append(v)
            x = x + blk.attn.out(_attend(blk.attn.query(h), k, v, self.n_head, valid, self.masked))
            h = blk.cross_attn_ln(x)
            x = x + blk.cross_attn.out(_attend(blk.cross_attn.query(h), cross_k[i], cross_v[i], self.n_head))
            x = x + blk.mlp(blk.mlp_ln(x))
        x = dec.ln(x)
        # W_emb @ x^T: the legacy exporter folds x @ W.t() into a second, transposed copy of W_emb
        logits = (dec.token_embedding.weight @ x.reshape(1, d).transpose(0, 1)).reshape(1, 1, -1)
        return logits, torch.stack(k_out), torch.stack(v_out)


def _load(checkpoint: str):
    """Load a checkpoint into a float32 eval-mode whisper.model.Whisper."""
    from whisper.model import ModelDimensions, Whisper
    ckpt = torch.load(checkpoint, map_location="cpu", weights_only=True)
    model = Whisper(ModelDimensions(**ckpt["dims"]))
    model.load_state_dict(ckpt["model_state_dict"])  # copies fp16 checkpoints into fp32 params
    return model.float().eval().requires_grad_(False)


def torch_graph(checkpoint: str, graph: str, masked: float = MASKED, n_positions: int | None = None) -> torch.nn.Module:
    """The static-shape wrapper for graph "encoder" or "decoder" (eval mode, float32); n_positions: the encoder's
    window (None: 30 s). The decoder takes any cross-attention length."""
    if graph == "encoder":
        return EncoderStatic(_load(checkpoint), n_positions).eval()
    if graph == "decoder":
        return DecoderStatic(_load(checkpoint), masked).eval()
    raise ValueError(f"unknown graph {graph!r} (expected 'encoder' or 'decoder')")


def example_feeds(graph: str, dims: dict, n_positions: int | None = None) -> dict[str, np.ndarray]:
    """Zero/simple feeds with the right names, shapes, dtypes (used for export tracing)."""
    L, D, P = dims["n_text_layer"], dims["n_text_state"], n_positions or dims["n_audio_ctx"]
    if graph == "encoder":
        return {"mel": np.zeros((1, dims["n_mels"], 2 * P), np.float32)}
    if graph == "decoder":
        cross = np.zeros((L, 1, P, D), np.float32)
        return _step_feeds(0, 0, {"cross_k": cross, "cross_v": cross.copy()}, n_ctx=dims["n_text_ctx"])
    raise ValueError(f"unknown graph {graph!r} (expected 'encoder' or 'decoder')")


def windows(io: dict | None) -> dict[int, dict[str, str]]:
    """{encoder positions: {"encoder": graph, "decoder": graph}} of the declared graphs, smallest window first: a
    window's graphs are told apart by their declared inputs and lengths (the spec names them; [windows]).
    Without `io`, the 30 s pair."""
    if not io:
        return {1500: {"encoder": "encoder", "decoder": "decoder"}}
    found: dict[int, dict[str, str]] = {}
    for graph, record in io.items():
        shapes = {name: shape for name, shape, _ in record["inputs"]}
        if "mel" in shapes:
            found.setdefault(shapes["mel"][2] // 2, {})["encoder"] = graph
        elif "cross_k" in shapes:
            found.setdefault(shapes["cross_k"][2], {})["decoder"] = graph
    for positions, pair in found.items():
        if len(pair) != 2:
            raise StageFailed(f"whisper_npu: the window of {positions} positions has only {pair} (an encoder and a "
                              f"decoder per window)")
    return dict(sorted(found.items()))


def _graph_of(graph: str, io: dict | None) -> tuple[str, int | None]:
    """("encoder" | "decoder", encoder positions) of a declared graph, from its own declared inputs (a window copy
    such as encoder_5s is named by the spec); without its record, the graph name itself and 30 s."""
    record = (io or {}).get(graph)
    if record is None:
        return graph, None
    shapes = {name: shape for name, shape, _ in record["inputs"]}
    if "mel" in shapes:
        return "encoder", shapes["mel"][2] // 2
    if "cross_k" in shapes:
        return "decoder", shapes["cross_k"][2]
    raise StageFailed(f"whisper_npu: graph {graph!r} has neither a 'mel' nor a 'cross_k' input")


def export(checkpoint: str, graph: str, out: str, settings: dict, io: dict | None = None) -> None:
    """Export one graph to a single self-contained ONNX file at `out` (no external data file left behind)."""
    kind, positions = _graph_of(graph, io)
    model = torch_graph(checkpoint, kind, float(settings.get("args", {}).get("masked", MASKED)), positions)
    args = tuple(torch.from_numpy(a) for a in example_feeds(kind, vars(model.dims), positions).values())
    torch_to_onnx(model, args, out, INPUTS[kind], OUTPUTS[kind], settings)


def _mel(wav: str | None, positions: int = 1500) -> np.ndarray:
    """Whisper log-mel [1,80,2*positions] of a 16 kHz PCM16 wav (None: silence): the 30 s log-mel (padded/trimmed
    as Whisper does) cut to the window, so the padding inside a window is the one Whisper was trained with."""
    from whisper.audio import log_mel_spectrogram, pad_or_trim
    audio = read_wav(wav) if wav else np.zeros(1, np.float32)
    mel = log_mel_spectrogram(torch.from_numpy(pad_or_trim(audio)))
    return np.ascontiguousarray(mel.numpy()[None, :, :2 * positions], np.float32)


def seconds(positions: int) -> float:
    """The audio an encoder window of `positions` holds (50 positions a second)."""
    return positions / 50


def duration(wav: str) -> float:
    return len(read_wav(wav)) / 16000


def _step_feeds(token: int, pos: int, enc: dict, k=None, v=None, n_ctx: int = N_CTX) -> dict[str, np.ndarray]:
    """Decoder feeds for one token at position `pos`; k/v None means an empty [L,1,n_ctx,D] cache."""
    L, _, _, D = enc["cross_k"].shape
    k = np.zeros((L, 1, n_ctx, D), np.float32) if k is None else k
    v = np.zeros((L, 1, n_ctx, D), np.float32) if v is None else v
    return {"token": np.array([[token]], np.int32), "index": np.array([pos], np.int32),
            "k_cache": k, "v_cache": v, "cross_k": enc["cross_k"], "cross_v": enc["cross_v"]}


def _tokenizer(run, enc: dict, decoder: str = "decoder"):
    """Pick the tokenizer from the decoder's vocabulary size (one probe call; `run` is a black box)."""
    from whisper.tokenizer import get_tokenizer
    n_vocab = run(decoder, _step_feeds(0, 0, enc))["logits"].shape[-1]
    if n_vocab >= 51865:  # same rule as whisper.model.Whisper.is_multilingual
        return get_tokenizer(True, num_languages=n_vocab - 51765 - 1, language="en", task="transcribe")
    return get_tokenizer(False)


def _greedy(run, enc: dict, tok, max_tokens: int, max_calls: int = N_CTX, record: list | None = None,
            decoder: str = "decoder") -> list[int]:
    """Plain-argmax decode after the no-timestamps prompt; returns the generated tokens (no prompt, no eot)."""
    prompt, k, v = list(tok.sot_sequence_including_notimestamps), None, None
    seq = list(prompt)
    for pos in range(min(N_CTX, max_calls)):
        feeds = _step_feeds(seq[pos], pos, enc, k, v)
        if record is not None:
            record.append(feeds)
        out = run(decoder, feeds)
        k, v = out["k_cache_out"], out["v_cache_out"]
        if pos + 1 < len(seq):  # still feeding the prompt
            continue
        nxt = int(np.argmax(out["logits"][0, -1]))
        if nxt == tok.eot:
            break
        seq.append(nxt)
        if len(seq) - len(prompt) >= max_tokens or len(seq) >= N_CTX:
            break
    return seq[len(prompt):]


def samples(data_dir: str) -> list[tuple[str, str, str]]:
    """Parse <data_dir>/refs.tsv -> [(clip_id, wav_path, transcript)], in file order."""
    clips = []
    with open(os.path.join(data_dir, "refs.tsv"), encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            parts = line.rstrip("\n").split("\t")
            if len(parts) != 3:
                raise ValueError(f"{data_dir}/refs.tsv:{n}: expected 'id<TAB>file<TAB>transcript'")
            clips.append((parts[0], os.path.join(data_dir, parts[1]), parts[2]))
    return clips


def evaluate(run, clips: list[tuple[str, str, str]], max_tokens: int = 224, io: dict | None = None) -> dict:
    """Greedy-transcribe each clip with `run` at 30 s: per-clip text/tokens and the pooled normalized WER; with
    shorter windows declared, the same per window over the clips that fit it ("windows": {seconds: ...})."""
    pairs = windows(io)
    full = max(pairs)
    result = transcribe_window(run, clips, pairs[full], full, max_tokens)
    smaller = {f"{seconds(p):g}": transcribe_window(run, [c for c in clips if duration(c[1]) <= seconds(p)], pair, p,
                                                    window_tokens(max_tokens, p))
               for p, pair in pairs.items() if p != full}
    return {**result, "windows": smaller} if smaller else result


def window_tokens(max_tokens: int, positions: int) -> int:
    """A window's token budget: Whisper's 224 for 30 s, in proportion to the window (37 at 5 s), so a window that
    loops (docs/whisper-windows.md) costs its share of decoder calls, not 30 s worth."""
    return max(1, max_tokens * positions // 1500)


def transcribe_window(run, clips: list[tuple[str, str, str]], pair: dict[str, str], positions: int,
                      max_tokens: int = 224) -> dict:
    """Greedy-transcribe each clip with the window's encoder and decoder (`pair`); per-clip text/tokens and the
    pooled normalized WER (None without clips)."""
    import jiwer
    from whisper.normalizers import EnglishTextNormalizer
    norm, tok, result, refs, hyps = EnglishTextNormalizer(), None, {}, [], []
    for clip_id, wav, ref in clips:
        enc = run(pair["encoder"], {"mel": _mel(wav, positions)})
        tok = _tokenizer(run, enc, pair["decoder"]) if tok is None else tok
        tokens = _greedy(run, enc, tok, max_tokens, decoder=pair["decoder"])
        text = tok.decode(tokens).strip()
        result[clip_id] = {"text": text, "tokens": tokens}
        refs.append(norm(ref))
        hyps.append(norm(text))
    return {"clips": result, "wer": float(jiwer.wer(refs, hyps)) if refs else None}


def pick_window(duration_s: float, routed: list[float]) -> float:
    """The bundle's rule: the smallest routed window (seconds) that holds the utterance; longer than every window:
    the largest (Whisper's 30 s: the audio is cut there, as pad_or_trim does)."""
    return min((w for w in routed if w >= duration_s), default=max(routed))


def recognize(run, wav: str, io: dict | None = None, routed: list[float] | None = None,
               max_tokens: int = 224) -> dict:
    """The host loop over one utterance: pick its window (pick_window over `routed`, default every declared
    window), encode it padded inside that window, decode greedily. {"text", "window_s", "graphs"}."""
    pairs = {seconds(p): (p, pair) for p, pair in windows(io).items()}
    window = pick_window(duration(wav), sorted(routed or pairs))
    positions, pair = pairs[window]
    enc = run(pair["encoder"], {"mel": _mel(wav, positions)})
    tok = _tokenizer(run, enc, pair["decoder"])
    text = tok.decode(_greedy(run, enc, tok, window_tokens(max_tokens, positions), decoder=pair["decoder"])).strip()
    return {"text": text, "window_s": window, "graphs": [pair["encoder"], pair["decoder"]]}


def graph_feeds(run, sample: tuple | None, steps: int = 3,
                io: dict | None = None) -> dict[str, list[dict[str, np.ndarray]]]:
    """Real inputs for tensor-level comparisons, per window: the clip's encoder feeds and the first `steps` decoder
    feeds."""
    # sample None (the framework passes it when a model has no clips) decodes 30 s of silence
    feeds, tok = {}, None
    for positions, pair in windows(io).items():
        mel = {"mel": _mel(sample[1] if sample else None, positions)}
        enc = run(pair["encoder"], mel)
        tok = _tokenizer(run, enc, pair["decoder"]) if tok is None else tok
        record: list = []
        _greedy(run, enc, tok, N_CTX, max_calls=steps, record=record, decoder=pair["decoder"])
        feeds[pair["encoder"]], feeds[pair["decoder"]] = [mel], record
    return feeds


# Decoder calls per clip, spread over its greedy decode. All calls of one clip left the cache and
# logits ranges short of other clips' (goforward: logits error 0.28 of the max, measured): more clips.
CALIBRATION_CALLS = 4


def calibration_feeds(run, sample: tuple | None) -> dict[str, list[dict[str, np.ndarray]]]:
    """w8a16 calibration inputs from one clip: its mel, and CALIBRATION_CALLS decoder calls spread
    evenly over its greedy decode (first and last included)."""
    feeds = graph_feeds(run, sample, steps=N_CTX)
    calls = feeds["decoder"]
    picked = sorted({round(i * (len(calls) - 1) / max(CALIBRATION_CALLS - 1, 1)) for i in range(CALIBRATION_CALLS)})
    return {**feeds, "decoder": [calls[i] for i in picked]}


def agree(ref: dict, got: dict, settings: dict) -> tuple[dict, list[str]]:
    """Compare two evaluate() results: identical transcripts (same_text) and WER within wer_delta, at 30 s and at
    each shorter window; how many of `got`'s window transcripts equal its own 30 s ones is recorded per window
    (what decides whether a window is safe to route to: docs/whisper-windows.md)."""
    record, failures = _agree_pair(ref, got, settings)
    rows = {}
    for size, window in (ref.get("windows") or {}).items():
        row, problems = _agree_pair(window, got["windows"][size], settings)
        full = {c: got["clips"][c]["text"] for c in window["clips"] if c in got["clips"]}
        changed = {c: [full[c], got["windows"][size]["clips"][c]["text"]] for c in full
                   if full[c] != got["windows"][size]["clips"][c]["text"]}
        # safe to route to: every clip that fits this window reads as at 30 s (spec/windows.py routed())
        row.update({"same_as_30s": len(full) - len(changed), "changed_from_30s": changed,
                    "safe": bool(full) and not changed,
                    "summary": f"{row['summary']}; {len(full) - len(changed)}/{len(full)} as at 30 s"})
        rows[size] = row
        failures += [f"{size} s window: {p}" for p in problems]
    if rows:
        record["windows"] = rows
        record["summary"] += "".join(f"; {s} s: {r['summary']}" for s, r in rows.items())
    return record, failures


def _agree_pair(ref: dict, got: dict, settings: dict) -> tuple[dict, list[str]]:
    differ = [c for c in ref["clips"] if ref["clips"][c]["text"] != got["clips"][c]["text"]]
    n = len(ref["clips"])
    record = {"clips": list(ref["clips"]), "identical": n - len(differ), "wer_ref": ref["wer"], "wer": got["wer"],
              "differ": {c: [ref["clips"][c]["text"], got["clips"][c]["text"]] for c in differ},
              "transcripts": {c: v["text"] for c, v in got["clips"].items()},
              "summary": f"{n - len(differ)}/{n} same text" + (f", WER {got['wer']:.3f} (ref {ref['wer']:.3f})"
                                                               if ref["wer"] is not None else "")}
    failures = []
    if differ and settings.get("same_text", True):
        failures.append(f"transcripts differ on {differ}: {record['differ']}")
    if ref["wer"] is not None and abs(got["wer"] - ref["wer"]) > settings.get("wer_delta", 0.01):
        failures.append(f"WER {got['wer']:.4f} vs {ref['wer']:.4f} (reference) differ by more than "
                        f"{settings.get('wer_delta', 0.01)}")
    return record, failures


def torch_runner(checkpoint: str, io: dict | None = None):
    """Return run(graph, feeds)->dict for the PyTorch wrappers (each graph loaded once; numpy outputs)."""
    graphs = {}

    def run(graph: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        kind, positions = _graph_of(graph, io)
        if graph not in graphs:
            graphs[graph] = torch_graph(checkpoint, kind, n_positions=positions)
        with torch.no_grad():
            outs = graphs[graph](*(torch.from_numpy(np.asarray(feeds[n])) for n in INPUTS[kind]))
        return {n: o.numpy() for n, o in zip(OUTPUTS[kind], outs)}

    return run
