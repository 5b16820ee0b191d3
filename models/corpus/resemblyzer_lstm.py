"""Resemblyzer's GE2E speaker encoder (3-layer LSTM 40 -> 256, a Linear, ReLU, L2 norm) as one static graph:
160 frames of 40-bin log-mel (a 1.6 s partial utterance) -> a 256-d embedding. The weights are the package's
pretrained.pt, loaded strictly into the same layers as resemblyzer.VoiceEncoder (whose own module needs librosa
and webrtcvad at import)."""
import os

import numpy as np
import torch
from torch import nn

from toolchain.modelkit import load_module, torch_to_onnx

# The real-speech feeds are speech.py's, shared with the corpus's other speech models (`uses` in the spec).
_speech = load_module(os.path.join(os.path.dirname(os.path.abspath(__file__)), "speech.py"))
samples, graph_feeds = _speech.samples, _speech.graph_feeds

FRAMES, MELS, HIDDEN = 160, 40, 256


class SpeakerEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(MELS, HIDDEN, num_layers=3, batch_first=True)
        self.linear = nn.Linear(HIDDEN, HIDDEN)

    def forward(self, mels: torch.Tensor) -> torch.Tensor:
        _, (hidden, _) = self.lstm(mels)
        raw = torch.relu(self.linear(hidden[-1]))
        return raw / torch.norm(raw, dim=1, keepdim=True)


def _load(checkpoint: str) -> SpeakerEncoder:
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)["model_state"]
    net = SpeakerEncoder()
    net.load_state_dict({k: v for k, v in state.items() if not k.startswith("similarity_")})   # strict otherwise
    return net.eval().requires_grad_(False)


def export(checkpoint: str, graph: str, out: str, settings: dict) -> None:
    if graph != "encoder":
        raise ValueError(f"unknown graph {graph!r} (expected 'encoder')")
    torch_to_onnx(_load(checkpoint), (torch.zeros(1, FRAMES, MELS),), out, ["mels"], ["embedding"], settings)


def torch_runner(checkpoint: str):
    net = _load(checkpoint)

    def run(graph: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        with torch.no_grad():
            return {"embedding": net(torch.from_numpy(feeds["mels"])).numpy()}

    return run
