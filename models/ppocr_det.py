"""PP-OCRv4 text detector (PaddleOCR, via rapidocr-onnxruntime): an ONNX given with dynamic axes
[N,3,H,W], pinned by the build to the spec's static shape. No PyTorch original, so no export() and no
parity; this module only gives the verify stage a real input: a rendered line of text, normalised as
rapidocr's config.yaml says ((pixel/255 - 0.5) / 0.5, RGB, CHW)."""
import numpy as np
from PIL import Image, ImageDraw


def text_image(height: int, width: int, text: str = "QNN 42") -> np.ndarray:
    """Dark text on a light background, [1, 3, H, W] float32 as the detector takes it."""
    image = Image.new("RGB", (width, height), (235, 235, 225))
    ImageDraw.Draw(image).text((4, height // 2 - 6), text, fill=(20, 20, 30))
    pixels = np.asarray(image, np.float32) / 255.0
    return ((pixels - 0.5) / 0.5).transpose(2, 0, 1)[None].copy()


def graph_feeds(run, sample, io):
    """One rendered text line per declared input shape (random noise gives a map of ~1e-6 everywhere,
    where a relative error means nothing)."""
    feeds = {}
    for graph, spec in io.items():
        (name, shape, _), = spec["inputs"]
        feeds[graph] = [{name: text_image(shape[2], shape[3], text)} for text in ("QNN 42", "HTP v79")]
    return feeds
