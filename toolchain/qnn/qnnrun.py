"""Run a QNN HTP context binary (.bin) through the raw QNN C API, via ctypes.

A port of how sherpa-onnx's C++ runtime drives a context binary
(sherpa-onnx/csrc/qnn/qnn-backend.cc, qnn-model.cc, utils.cc): dlopen the backend ->
QnnInterface_getProviders -> backendCreate -> deviceCreate -> binary info via libQnnSystem ->
contextCreateFromBinary -> graphRetrieve (first graph) -> RAW client buffers, all carved out of one
heap buffer -> graphExecute. On the x86 host the wheel's libQnnHtp.so runs the graph in its HTP
simulator; on a phone the same calls run on the NPU.

Struct layouts and the function table follow the QNN SDK headers (QnnInterface.h, QnnTypes.h,
QnnCommon.h; LP64). The binary-info structs and library loading are shared with
toolchain.qnn.qnnbin. """
from __future__ import annotations

import ctypes as C
import os
from typing import TYPE_CHECKING

from toolchain.qnn.qnnbin import (
    DTYPES,
    ENCODING_BW_SCALE_OFFSET,
    ENCODING_SCALE_OFFSET,
    QNN_DEFINITION_DEFINED,
    BinaryInfo,
    ErrorHandle,
    GetBinaryInfoFn,
    GetMetadataFn,
    Interface,
    SystemContextCreateFn,
    SystemContextFreeFn,
    SystemInterface,
    Tensor,
    dlopen_quiet,
    htp_lib,
    system_interface,
)

# numpy is imported where used: doit's own process loads this module on every run
# (tests/test_engine_worker.py)
if TYPE_CHECKING:
    import numpy as np

_P = C.c_void_p
# Signatures from QnnInterface.h; handles are void*, Qnn_ContextBinarySize_t is passed as uint64 (it
# is uint64_t in current SDKs; in a register either way). Only the functions used here.
_SIGS = {
    "backendCreate": (_P, _P, C.POINTER(_P)),                 # (logger, const config**, backend*)
    "backendFree": (_P,),
    "deviceCreate": (_P, _P, C.POINTER(_P)),                  # (logger, const config**, device*)
    "deviceFree": (_P,),
    "contextCreateFromBinary": (_P, _P, _P, _P, C.c_uint64, C.POINTER(_P), _P),
    # (backend, device, const config**, const void* buf, size, context*, profile)
    "contextFree": (_P, _P),                                  # (context, profile)
    "graphRetrieve": (_P, C.c_char_p, C.POINTER(_P)),         # (context, name, graph*)
    "graphExecute": (_P, C.POINTER(Tensor), C.c_uint32, C.POINTER(Tensor), C.c_uint32, _P, _P),
    # (graph, const Qnn_Tensor_t* in, n_in, Qnn_Tensor_t* out, n_out, profile, signal)
}

_QNN_TENSORMEMTYPE_RAW = 0
# Qnn_DataType_t short name -> numpy storage type (by name: numpy takes it wherever a dtype goes)
_NP = {"int8": "int8", "int16": "int16", "int32": "int32", "int64": "int64",
       "uint8": "uint8", "uint16": "uint16", "uint32": "uint32", "uint64": "uint64",
       "float16": "float16", "float32": "float32", "float64": "float64", "bool": "uint8",
       "sfixed8": "int8", "sfixed16": "int16", "sfixed32": "int32",
       "ufixed8": "uint8", "ufixed16": "uint16", "ufixed32": "uint32"}


def _check(rc: int, what: str) -> None:
    """Raise on a QNN error handle (the code is its low 16 bits, QnnCommon.h)."""
    code = rc & 0xFFFF
    if code:
        raise RuntimeError(f"{what} failed: QNN error {code}")


class _Io:
    """One graph input or output: our own copy of its Qnn_Tensor_t plus a numpy view into
    the I/O buffer."""

    def __init__(self, src: Tensor):
        import numpy as np
        self.tensor = Tensor()
        C.pointer(self.tensor)[0] = src        # struct copy; the pointers in it are replaced below
        v = self.tensor.v2                      # V1 is a prefix of V2
        self.name = (v.name or b"").decode()
        self.dtype = DTYPES.get(v.dataType, "0x%04x" % v.dataType)
        self.shape = [int(v.dims[i]) for i in range(v.rank)] if v.dims else []
        if self.dtype not in _NP:
            raise ValueError(f"tensor '{self.name}': unsupported data type {self.dtype}")
        # The source tensor lives in the system context, freed once the binary is open:
        # own every pointer.
        self._name = C.create_string_buffer(self.name.encode())
        self._dims = (C.c_uint32 * max(len(self.shape), 1))(*self.shape)
        v.name = C.cast(self._name, C.c_char_p)
        # NULL when rank is 0
        v.dims = C.cast(self._dims, C.POINTER(C.c_uint32)) if self.shape else None
        # static shapes only; for a V1 tensor this field is not part of it (the union is
        # sized by V2)
        v.isDynamicDimensions = None
        self.scale: float | None = None   # set for a quantized tensor: real = (q + offset) * scale
        self.offset = 0
        q = v.quant
        if q.encodingDefinition == QNN_DEFINITION_DEFINED:
            if q.encoding == ENCODING_SCALE_OFFSET:
                self.scale, self.offset = float(q.u.so.scale), int(q.u.so.offset)
            elif q.encoding == ENCODING_BW_SCALE_OFFSET:
                self.scale, self.offset = float(q.u.bw.scale), int(q.u.bw.offset)
            elif self.dtype.startswith(("ufixed", "sfixed")):
                # per-axis/block encodings hold pointers into the freed system context
                raise ValueError(
                    f"tensor '{self.name}': quantization encoding {q.encoding} not supported"
                )
        self.count = int(np.prod(self.shape)) if self.shape else 1
        self.nbytes = self.count * np.dtype(_NP[self.dtype]).itemsize
        self.view: np.ndarray | None = None

    def bind(self, buf: np.ndarray, offset: int) -> None:
        """Point clientBuf at buf[offset:offset+nbytes] (memType RAW), as
        sherpa's SetupPointers does."""
        v = self.tensor.v2
        v.memType = _QNN_TENSORMEMTYPE_RAW
        v.buf[0] = buf.ctypes.data + offset     # Qnn_ClientBuffer_t.data
        # Qnn_ClientBuffer_t.dataSize (uint32; upper half is padding)
        v.buf[1] = self.nbytes
        self.view = buf[offset:offset + self.nbytes].view(_NP[self.dtype]).reshape(self.shape)

    def array(self) -> np.ndarray:
        """The tensor's view into the I/O buffer."""
        if self.view is None:
            raise RuntimeError(f"tensor '{self.name}' is not bound to the I/O buffer")
        return self.view


class QnnModel:
    """One QNN context binary opened on the HTP backend; runs its first graph."""

    def __init__(self, binary: str, backend_lib: str | None = None, system_lib: str | None = None):
        # QNN handles, None until created and after close()
        self._backend: C.c_void_p | None = None
        self._device: C.c_void_p | None = None
        self._context: C.c_void_p | None = None
        self._graph: C.c_void_p | None = None
        # the binary's bytes, until the context holds its own copy
        self._blob: C.Array[C.c_char] | None = None
        self._fn: dict = {}
        # backend: the wheel's libQnnHtp.so (cached by qnnbin) or an app's own copy
        self._lib = htp_lib() if backend_lib is None else dlopen_quiet(os.path.abspath(backend_lib))
        self._iface = self._interface()
        try:
            self._open(binary, system_lib)
        except BaseException:
            self.close()
            raise

    def _interface(self) -> Interface:
        provs, n = C.POINTER(C.POINTER(Interface))(), C.c_uint32()
        self._lib.QnnInterface_getProviders.restype = ErrorHandle
        _check(
            self._lib.QnnInterface_getProviders(C.byref(provs), C.byref(n)),
            "QnnInterface_getProviders",
        )
        if n.value == 0:
            raise RuntimeError("QnnInterface_getProviders: no interface providers")
        iface = provs[0].contents               # sherpa takes the first provider
        for name, args in _SIGS.items():
            addr = getattr(iface, name)
            if not addr:
                raise RuntimeError(f"the backend does not implement {name}")
            self._fn[name] = C.CFUNCTYPE(ErrorHandle, *args)(addr)
        return iface

    def _open(self, binary: str, system_lib: str | None) -> None:
        import numpy as np
        fn = self._fn
        # sherpa: logCreate -> backendCreate -> deviceCreate. No logger here (NULL is allowed).
        self._backend = backend = _P()
        _check(fn["backendCreate"](None, None, C.byref(backend)), "backendCreate")
        self._device = device = _P()
        _check(fn["deviceCreate"](None, None, C.byref(device)), "deviceCreate")

        with open(binary, "rb") as f:
            data = f.read()
        size = len(data)
        self._blob = blob = C.create_string_buffer(data, max(size, 1))
        del data
        graph_name, inputs, outputs = self._graph_info(binary, blob, size, system_lib)

        self._context = context = _P()
        _check(fn["contextCreateFromBinary"](backend, device, None, C.cast(blob, _P),
                                             size, C.byref(context), None),
               f"contextCreateFromBinary({binary})")
        self._graph = graph = _P()
        _check(fn["graphRetrieve"](context, graph_name, C.byref(graph)),
               f"graphRetrieve({graph_name.decode()})")
        self._blob = None   # the context holds its own copy: sherpa frees the file buffer here too

        # one heap buffer for all inputs then all outputs (sherpa's AllocateBuffer + SetupPointers)
        self._inputs, self._outputs = inputs, outputs
        self.buffer_bytes = sum(t.nbytes for t in inputs + outputs)
        self._buffer = np.zeros(max(self.buffer_bytes, 1), np.uint8)
        offset = 0
        for t in inputs + outputs:
            t.bind(self._buffer, offset)
            offset += t.nbytes
        self._in = (Tensor * len(inputs))(*[t.tensor for t in inputs])
        self._out = (Tensor * len(outputs))(*[t.tensor for t in outputs])
        self._by_name = {t.name: t for t in inputs + outputs}
        self.input_names = [t.name for t in inputs]
        self.output_names = [t.name for t in outputs]

    def _graph_info(self, binary: str, data: C.Array[C.c_char], size: int,
                    system_lib: str | None) -> tuple[bytes, list, list]:
        """First graph's name and I/O tensors, read from the binary through
        libQnnSystem (then freed)."""
        sys_iface = (
            system_interface()[1] if system_lib is None else self._system_interface(system_lib)
        )
        create, free = (
            SystemContextCreateFn(sys_iface.fns[0]),
            SystemContextFreeFn(sys_iface.fns[3]),
        )
        handle = _P()
        _check(create(C.byref(handle)), "QnnSystemContext_create")
        try:
            info = C.POINTER(BinaryInfo)()
            blob = C.cast(data, _P)
            if sys_iface.fns[1]:  # systemContextGetBinaryInfo, as sherpa
                rc = GetBinaryInfoFn(sys_iface.fns[1])(
                    handle, blob, size, C.byref(info), C.byref(C.c_uint64())
                )
            else:                       # builds without it have systemContextGetMetadata
                rc = GetMetadataFn(sys_iface.fns[2])(handle, blob, size, C.byref(info))
            if rc & 0xFFFF or not info:
                raise ValueError(
                    f"{binary}: not a QNN context binary (QnnSystem error {rc & 0xFFFF})"
                )
            b = info.contents
            if b.version not in (1, 2, 3):
                raise ValueError(
                    f"{binary}: unsupported QnnSystemContext_BinaryInfo version {b.version}"
                )
            b = b.u.v3 if b.version == 3 else b.u.v1
            if b.numGraphs < 1:
                raise ValueError(f"{binary}: the binary holds no graph")
            g = b.graphs[0]             # sherpa uses only the first graph
            if g.version not in (1, 2, 3):
                raise ValueError(
                    f"{binary}: unknown QnnSystemContext_GraphInfo version {g.version}"
                )
            v = g.v3
            return (bytes(v.name), [_Io(v.inputs[i]) for i in range(v.numInputs)],
                    [_Io(v.outputs[i]) for i in range(v.numOutputs)])
        finally:
            free(handle)

    def _system_interface(self, path: str) -> SystemInterface:
        """First provider of an explicitly named libQnnSystem (an app's own copy, any file name)."""
        self._syslib = dlopen_quiet(os.path.abspath(path))   # kept: the provider table lives in it
        provs, n = C.POINTER(C.POINTER(SystemInterface))(), C.c_uint32()
        self._syslib.QnnSystemInterface_getProviders.restype = ErrorHandle
        _check(self._syslib.QnnSystemInterface_getProviders(C.byref(provs), C.byref(n)),
               "QnnSystemInterface_getProviders")
        if n.value == 0:
            raise RuntimeError(f"{path}: no system interface providers")
        return provs[0].contents

    # ---- tensors ----
    def _tensor(self, name: str) -> _Io:
        if name not in self._by_name:
            raise KeyError(
                f"no tensor '{name}' (inputs {self.input_names}, outputs {self.output_names})"
            )
        return self._by_name[name]

    def has_tensor(self, name: str) -> bool:
        return name in self._by_name

    def shape(self, name: str) -> list[int]:
        return list(self._tensor(name).shape)

    def dtype(self, name: str) -> str:
        return self._tensor(name).dtype

    def set_input(self, name: str, data) -> None:
        """Copy `data` into the input's slice of the I/O buffer, converted to the
        tensor's type. Quantized inputs take real values: q = round(x / scale - offset),
        clipped (sherpa's FillData)."""
        import numpy as np
        t = self._tensor(name)
        view = t.array()
        if name not in self.input_names:
            raise ValueError(f"tensor '{name}' is an output, not an input")
        a = np.asarray(data)
        if a.size != t.count:
            raise ValueError(
                f"tensor '{name}' expects {t.count} elements {t.shape}, got {a.size} "
                f"{list(a.shape)}"
            )
        a = a.reshape(t.shape)
        if t.scale is not None and t.dtype.startswith(("ufixed", "sfixed")):
            info = np.iinfo(view.dtype)
            q = np.rint(a.astype(np.float64) / t.scale - t.offset)
            view[...] = np.clip(q, info.min, info.max)
        else:
            view[...] = a.astype(view.dtype)

    def run(self) -> None:
        """graphExecute on the bound buffers (inputs read from, outputs written to
        the I/O buffer)."""
        if not self._graph:
            raise RuntimeError("the model is closed")
        _check(
            self._fn["graphExecute"](
                self._graph, self._in, len(self._in), self._out, len(self._out), None, None
            ),
            "graphExecute",
        )

    def output(self, name: str) -> np.ndarray:
        """A copy of a tensor, shaped as reported: float32 for float and quantized tensors
        (value = (q + offset) * scale, sherpa's GetData), else its integer type."""
        import numpy as np
        t = self._tensor(name)
        view = t.array()
        if t.scale is not None and t.dtype.startswith(("ufixed", "sfixed")):
            return ((view.astype(np.float64) + t.offset) * t.scale).astype(np.float32)
        if t.dtype.startswith("float"):
            return view.astype(np.float32)
        return view.copy()

    # ---- lifetime ----
    def close(self) -> None:
        """Free in reverse order of creation (sherpa: contextFree, deviceFree,
        backendFree). Idempotent."""
        fn = self._fn
        if self._context:
            fn["contextFree"](self._context, None)
        if self._device:
            fn["deviceFree"](self._device)
        if self._backend:
            fn["backendFree"](self._backend)
        self._graph = self._context = self._device = self._backend = None

    def __enter__(self) -> "QnnModel":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
