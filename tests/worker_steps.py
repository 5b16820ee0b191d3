"""Steps for the worker tests (test_engine_worker.py): module-level functions a forked or fresh
step can find."""
from __future__ import annotations

import ctypes
import os
import random
import sys


def segfault() -> None:
    ctypes.string_at(0)   # reads address 0: SIGSEGV in native code


def leak(megabytes: int) -> None:
    """What a careless step leaves behind in its process: patched modules,
    environment, memory, sys.path."""
    import onnx
    onnx.LEAKED = True
    os.environ["QNN_TEST_LEAK"] = "1"
    sys.path.insert(0, "/leaked")
    sys.modules["leaked_module"] = sys
    globals()["_hoard"] = bytearray(megabytes << 20)


def clean(marker: str) -> None:
    """Fails unless this process shows nothing of leak(); writes to `marker` its pid, whether onnx
    was imported before it ran, and a random number (forks must not share unseeded randomness)."""
    import onnx
    left = [what for what, there in (("onnx.LEAKED", hasattr(onnx, "LEAKED")),
                                     ("environment", "QNN_TEST_LEAK" in os.environ),
                                     ("sys.path", "/leaked" in sys.path),
                                     ("sys.modules", "leaked_module" in sys.modules),
                                     ("memory", "_hoard" in globals())) if there]
    assert not left, f"left over from an earlier step: {left}"
    with open(marker, "w") as f:
        f.write(f"{os.getpid()} {'onnx' in sys.modules} {random.random()}\n")
