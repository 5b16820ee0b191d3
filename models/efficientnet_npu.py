"""EfficientNet-Lite0 (ImageNet) as one static-shape HTP graph: normalised RGB image -> 1000 class logits."""
import os

import numpy as np
import torch

from toolchain.modelkit import torch_to_onnx

ARCH = "efficientnet-lite0"
IMAGE_SIZE = 224  # the 'same' padding of every conv is computed for this size, so it is fixed at export
INPUTS, OUTPUTS = ["image"], ["logits"]


def _load(checkpoint: str) -> torch.nn.Module:
    """The checkpoint (a plain EfficientNet-Lite0 state dict) in efficientnet_lite_pytorch's model, eval mode."""
    from efficientnet_lite_pytorch import EfficientNet
    net = EfficientNet.from_name(ARCH, image_size=IMAGE_SIZE)
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    net.load_state_dict(state)  # strict: a different architecture's weights must not load silently
    return net.eval().requires_grad_(False)


def export(checkpoint: str, graph: str, out: str, settings: dict) -> None:
    """Export graph "classifier" to one self-contained ONNX file at `out`."""
    if graph != "classifier":
        raise ValueError(f"unknown graph {graph!r} (expected 'classifier')")
    image = torch.zeros(1, 3, IMAGE_SIZE, IMAGE_SIZE)
    torch_to_onnx(_load(checkpoint), (image,), out, INPUTS, OUTPUTS, settings)


def torch_runner(checkpoint: str):
    """run(graph, feeds) -> {"logits"} with the PyTorch model."""
    net = _load(checkpoint)

    def run(graph: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        with torch.no_grad():
            return {"logits": net(torch.from_numpy(feeds["image"])).numpy()}

    return run


def crop_resize(path: str, size: int = IMAGE_SIZE):
    """A photo as a size x size RGB PIL image: centre square crop, then bilinear resize."""
    from PIL import Image
    with Image.open(path) as im:
        im = im.convert("RGB")
    w, h = im.size
    side = min(w, h)
    left, top = (w - side) // 2, (h - side) // 2
    return im.crop((left, top, left + side, top + side)).resize((size, size), Image.BILINEAR)


def preprocess(path: str) -> np.ndarray:
    """A photo -> float32 [1,3,S,S] scaled as the Lite models were trained: (x - 127) / 128."""
    x = np.asarray(crop_resize(path), np.float32)
    return ((x - 127.0) / 128.0).transpose(2, 0, 1)[None].copy()


def samples(data_dir: str) -> list[tuple]:
    """<data_dir>/labels.tsv -> [(id, image path, acceptable ImageNet class ids)] in file order."""
    items = []
    with open(os.path.join(data_dir, "labels.tsv"), encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip() or line.startswith("#"):
                continue
            parts = line.rstrip("\n").split("\t")
            if len(parts) != 4:
                raise ValueError(f"{data_dir}/labels.tsv:{n}: expected 'id<TAB>file<TAB>classes<TAB>note'")
            classes = tuple(int(c) for c in parts[2].split(",") if c.strip() and c != "-")
            items.append((parts[0], os.path.join(data_dir, parts[1]), classes))
    return items


def graph_feeds(run, sample) -> dict[str, list[dict[str, np.ndarray]]]:
    """The classifier feed of one photo (None: a fixed seeded noise image)."""
    if sample is None:
        rng = np.random.default_rng(0)
        return {"classifier": [{"image": rng.uniform(-1, 1, (1, 3, IMAGE_SIZE, IMAGE_SIZE)).astype(np.float32)}]}
    return {"classifier": [{"image": preprocess(sample[1])}]}


def evaluate(run, samples: list) -> dict:
    """Logits and top-5 classes per photo, and how many top-1 classes are among the photo's labels."""
    images, correct, labelled = {}, 0, 0
    for image_id, path, classes in samples:
        logits = run("classifier", {"image": preprocess(path)})["logits"][0].astype(np.float64)
        top5 = [int(i) for i in np.argsort(logits)[::-1][:5]]
        images[image_id] = {"top5": top5, "logits": [float(x) for x in logits]}
        if classes:
            labelled += 1
            correct += top5[0] in classes
    return {"images": images, "top1_correct": correct, "labelled": labelled}


def agree(ref: dict, got: dict, settings: dict) -> tuple[dict, list[str]]:
    """Top-1 identical, top-5 overlap >= min_top5_overlap, max |logit error| <= max_logit_abs."""
    min_overlap = int(settings.get("min_top5_overlap", 4))
    max_logit = float(settings.get("max_logit_abs", 0.5))
    per_image, failures = {}, []
    for image_id, r in ref["images"].items():
        g = got["images"][image_id]
        err = float(np.max(np.abs(np.asarray(r["logits"]) - np.asarray(g["logits"]))))
        per_image[image_id] = {"top1": [r["top5"][0], g["top5"][0]], "top5_overlap": len(set(r["top5"]) & set(g["top5"])),
                               "max_logit_abs": err, "top5": g["top5"]}
    top1_diff = [i for i, p in per_image.items() if p["top1"][0] != p["top1"][1]]
    overlap = min(p["top5_overlap"] for p in per_image.values())
    err = max(p["max_logit_abs"] for p in per_image.values())
    n = len(per_image)
    record = {"summary": f"top-1 same {n - len(top1_diff)}/{n}, top-5 overlap min {overlap}/5, "
                         f"logit err {err:.3g}, top-1 correct {got['top1_correct']}/{got['labelled']}",
              "images": per_image, "top1_differ": top1_diff, "top5_overlap_min": overlap, "max_logit_abs": err,
              "top1_correct": got["top1_correct"], "labelled": got["labelled"],
              "settings": {"min_top5_overlap": min_overlap, "max_logit_abs": max_logit}}
    if top1_diff:
        failures.append("top-1 class differs on " + ", ".join(f"{i} ({per_image[i]['top1'][0]} -> "
                                                             f"{per_image[i]['top1'][1]})" for i in top1_diff))
    if overlap < min_overlap:
        failures.append(f"top-5 overlap {overlap} < {min_overlap}")
    if err > max_logit:
        failures.append(f"max logit error {err:.3g} > {max_logit}")
    return record, failures
