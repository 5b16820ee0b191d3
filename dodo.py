"""qnn-npu-compile's own examples: models/*.toml -> ONNX -> QNN HTP context binaries per chip,
verified. A project of your own has the same two lines (`python -m toolchain init`); what they hand
doit: toolchain/tasks.py."""
from toolchain.tasks import for_doit

globals().update(for_doit())   # DOIT_CONFIG and every task creator, in pipeline order (`doit list`)
