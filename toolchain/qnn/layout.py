"""How QNN lays out a graph's tensors and names, and which runtime libraries a device needs
(docs/qairt.md, docs/phone.md). Facts of the SDK family, shared by the compilers, the bundles
and the phone."""
from __future__ import annotations

import re

from toolchain.errors import StageFailed

HOST, ANDROID = "x86_64-linux-clang", "aarch64-android"
NON_WORD = re.compile(r"\W")


def c_name(name: str) -> str:
    """A tensor or graph name as qnn-onnx-converter writes it into the C++ graph: every character
    that is not a word character becomes '_' (tiny.en-mel -> tiny_en_mel, net.b -> net_b)."""
    return NON_WORD.sub("_", name)


def layout_permutation(onnx_shape, qnn_shape) -> tuple[int, ...] | None:
    """Axes order the converter gives a tensor without --input_layout (docs/qairt.md): same, 3-D
    last two swapped, or 4-D NCHW -> NHWC; None if `qnn_shape` is none of these."""
    onnx_shape, rank = list(onnx_shape), len(onnx_shape)
    candidates = (
        [tuple(range(rank))]
        + ([(0, 2, 1)] if rank == 3 else [])
        + ([(0, 2, 3, 1)] if rank == 4 else [])
    )
    return next((p for p in candidates if [onnx_shape[i] for i in p] == list(qnn_shape)), None)


def permutation_or_fail(onnx_shape, qnn_shape, name: str) -> tuple[int, ...]:
    """layout_permutation(), or StageFailed naming the tensor when QNN's shape is none of those
    layouts: its raw file would be written or read in the wrong axes order (numpy's transpose(None)
    reverses them all)."""
    found = layout_permutation(onnx_shape, qnn_shape)
    if found is None:
        raise StageFailed(
            f"tensor {name!r}: QNN's shape {list(qnn_shape)} is no layout of the ONNX shape "
            f"{list(onnx_shape)} this build knows (docs/qairt.md)"
        )
    return found


def native_permutation(rank: int) -> tuple[int, ...]:
    """The axes order a graph input has on the QNN side when the converter gets no --input_layout
    (docs/qairt.md): 3-D last two axes swapped, 4-D NCHW -> NHWC, others as in ONNX. Raw files given
    with --use_native_input_files must already be in it. From sherpa-onnx's observations; not run
    against a real SDK here."""
    return {3: (0, 2, 1), 4: (0, 2, 3, 1)}.get(rank, tuple(range(rank)))


def device_libraries(arch: int) -> dict:
    """{kind: {library: SDK-relative path}} an app needs on a v<arch> device (docs/phone.md)."""
    return {
        "android_aarch64": {
            name: f"lib/{ANDROID}/{name}"
            for name in ("libQnnHtp.so", "libQnnSystem.so", f"libQnnHtpV{arch}Stub.so")
        },
        "hexagon_dsp": {
            f"libQnnHtpV{arch}Skel.so": f"lib/hexagon-v{arch}/unsigned/libQnnHtpV{arch}Skel.so"
        },
    }
