"""qnn-npu-compile: PyTorch checkpoints -> ONNX -> Qualcomm HTP context binaries, as a doit graph."""
