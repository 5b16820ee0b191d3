"""Inspect QNN HTP context binaries (.bin) and the bundled QNN HTP backend, via ctypes and
the clear-text config.

It also holds the ctypes declarations of the QNN C API (structs, function types, the interface
table; LP64, from the documented headers) that qnnrun.py and compilers/ort_qnn/context.py share."""
from __future__ import annotations

import ctypes as C
import functools
import os
import re
import sys

DTYPES = {
    0x0008: "int8", 0x0016: "int16", 0x0032: "int32", 0x0064: "int64",
    0x0108: "uint8", 0x0116: "uint16", 0x0132: "uint32", 0x0164: "uint64",
    0x0216: "float16", 0x0226: "bfloat16", 0x0232: "float32", 0x0264: "float64",
    0x0304: "sfixed4", 0x0308: "sfixed8", 0x0316: "sfixed16", 0x0332: "sfixed32",
    0x0404: "ufixed4", 0x0408: "ufixed8", 0x0416: "ufixed16", 0x0432: "ufixed32",
    0x0508: "bool", 0x0608: "string",
}
"""Qnn_DataType_t (QnnTypes.h) -> short name; anything else is reported as "0x%04x"."""
QNN_DEFINITION_DEFINED = 1
"""Qnn_Definition_t QNN_DEFINITION_DEFINED: a tensor's quantization parameters are set."""
ENCODING_SCALE_OFFSET, ENCODING_BW_SCALE_OFFSET = 0, 2
"""Qnn_QuantizationEncoding_t of the two per-tensor encodings read here (scale/offset,
bitwidth/scale/offset)."""


# ---- QNN API structs (x86_64 / aarch64 LP64 layout, natural alignment) ----
class Version(C.Structure):
    """Qnn_Version_t (Qnn_ApiVersion_t's parts): major, minor, patch."""
    _fields_ = [("major", C.c_uint32), ("minor", C.c_uint32), ("patch", C.c_uint32)]


class _ScaleOffset(C.Structure):
    _fields_ = [("scale", C.c_float), ("offset", C.c_int32)]


class _BwScaleOffset(C.Structure):
    _fields_ = [("bitwidth", C.c_uint32), ("scale", C.c_float), ("offset", C.c_int32)]


class _QuantUnion(C.Union):
    # the largest member (Qnn_BwAxisScaleOffset_t) is 32 bytes with 8-byte alignment
    _fields_ = [("so", _ScaleOffset), ("bw", _BwScaleOffset), ("raw", C.c_uint64 * 4)]


class _Quant(C.Structure):
    _fields_ = [("encodingDefinition", C.c_uint32), ("encoding", C.c_uint32), ("u", _QuantUnion)]


class _TensorV2(C.Structure):
    _fields_ = [("id", C.c_uint32), ("name", C.c_char_p), ("type", C.c_uint32),
                ("dataFormat", C.c_uint32), ("dataType", C.c_uint32), ("quant", _Quant),
                ("rank", C.c_uint32), ("dims", C.POINTER(C.c_uint32)), ("memType", C.c_uint32),
                ("buf", C.c_uint64 * 2), ("isDynamicDims", C.c_void_p),
                ("sparse", C.c_uint32 * 3), ("isProduced", C.c_uint8)]


class Tensor(C.Structure):
    """Qnn_Tensor_t: a version, then the V2 layout (V1 is a prefix of V2, and the union is
    sized by V2)."""
    _fields_ = [("version", C.c_uint32), ("v2", _TensorV2)]


class _GraphInfoV3(C.Structure):
    # V1 and V2 are prefixes of V3
    _fields_ = [("name", C.c_char_p), ("numInputs", C.c_uint32), ("inputs", C.POINTER(Tensor)),
                ("numOutputs", C.c_uint32), ("outputs", C.POINTER(Tensor)),
                ("numUpdateable", C.c_uint32), ("updateable", C.POINTER(Tensor)),
                ("blobInfoSize", C.c_uint32), ("blobInfo", C.c_void_p),
                ("startOpIndex", C.c_uint32), ("endOpIndex", C.c_uint32)]


class _GraphInfo(C.Structure):
    _fields_ = [("version", C.c_uint32), ("v3", _GraphInfoV3)]


class _BinInfoV1(C.Structure):
    # V2 only appends platformInfo
    _fields_ = [
        ("backendId", C.c_uint32),
        ("buildId", C.c_char_p),
        ("coreApi", Version),
        ("backendApi", Version),
        ("socVersion", C.c_char_p),
        ("hwInfoBlobVersion", Version),
        ("ctxBlobVersion", Version),
        ("hwInfoBlobSize", C.c_uint32),
        ("hwInfoBlob", C.c_void_p),
        ("ctxBlobSize", C.c_uint64),
        ("numCtxTensors", C.c_uint32),
        ("ctxTensors", C.c_void_p),
        ("numGraphs", C.c_uint32),
        ("graphs", C.POINTER(_GraphInfo)),
        ("platformInfo", C.c_void_p),
    ]


class _BinInfoV3(C.Structure):
    _fields_ = [
        ("backendId", C.c_uint32),
        ("buildId", C.c_char_p),
        ("coreApi", Version),
        ("backendApi", Version),
        ("socVersion", C.c_char_p),
        ("ctxBlobVersion", Version),
        ("ctxBlobSize", C.c_uint64),
        ("numCtxTensors", C.c_uint32),
        ("ctxTensors", C.c_void_p),
        ("numGraphs", C.c_uint32),
        ("graphs", C.POINTER(_GraphInfo)),
        ("platformInfo", C.c_void_p),
        ("metadataSize", C.c_uint32),
        ("metadata", C.c_void_p),
        ("socModel", C.c_uint32),
    ]


class _BinInfoU(C.Union):
    _fields_ = [("v1", _BinInfoV1), ("v3", _BinInfoV3)]


class BinaryInfo(C.Structure):
    """QnnSystemContext_BinaryInfo_t: a version, then the V1 or V3 layout (V2 only
    appends to V1)."""
    _fields_ = [("version", C.c_uint32), ("u", _BinInfoU)]


class SystemInterface(C.Structure):
    """QnnSystemInterface_t, its table's first four: systemContextCreate,
    GetBinaryInfo, GetMetaData, Free."""
    _fields_ = [("backendId", C.c_uint32), ("providerName", C.c_char_p), ("apiVersion", Version),
                ("fns", C.c_void_p * 4)]


INTERFACE_FUNCTIONS = (
    "propertyHasCapability",
    "backendCreate",
    "backendSetConfig",
    "backendGetApiVersion",
    "backendGetBuildId",
    "backendRegisterOpPackage",
    "backendGetSupportedOperations",
    "backendValidateOpConfig",
    "backendFree",
    "contextCreate",
    "contextSetConfig",
    "contextGetBinarySize",
    "contextGetBinary",
    "contextCreateFromBinary",
    "contextFree",
    "graphCreate",
    "graphCreateSubgraph",
    "graphSetConfig",
    "graphAddNode",
    "graphFinalize",
    "graphRetrieve",
    "graphExecute",
    "graphExecuteAsync",
    "tensorCreateContextTensor",
    "tensorCreateGraphTensor",
    "logCreate",
    "logSetLogLevel",
    "logFree",
    "profileCreate",
    "profileSetConfig",
    "profileGetEvents",
    "profileGetSubEvents",
    "profileGetEventData",
    "profileGetExtendedEventData",
    "profileFree",
    "memRegister",
    "memDeRegister",
    "deviceGetPlatformInfo",
    "deviceFreePlatformInfo",
    "deviceGetInfrastructure",
    "deviceCreate",
    "deviceSetConfig",
    "deviceGetInfo",
    "deviceFree",
    "signalCreate",
    "signalSetConfig",
    "signalTrigger",
    "signalFree",
)
"""QNN_INTERFACE_VER_TYPE's functions (QnnInterface.h), in order; newer SDKs only append entries
after signalFree."""


class Interface(C.Structure):
    """QnnInterface_t: backendId, providerName, Qnn_ApiVersion_t, then the function table (a
    union of one)."""
    _fields_ = [("backendId", C.c_uint32), ("providerName", C.c_char_p), ("coreApi", Version),
                ("backendApi", Version)] + [(name, C.c_void_p) for name in INTERFACE_FUNCTIONS]


ErrorHandle = C.c_uint64
"""Qnn_ErrorHandle_t: what every QNN function returns; the error code is its low 16 bits."""
SystemContextCreateFn = C.CFUNCTYPE(ErrorHandle, C.POINTER(C.c_void_p))
"""QnnSystemContext_create(context*)."""
GetBinaryInfoFn = C.CFUNCTYPE(
    ErrorHandle,
    C.c_void_p,
    C.c_void_p,
    C.c_uint64,
    C.POINTER(C.POINTER(BinaryInfo)),
    C.POINTER(C.c_uint64),
)
"""QnnSystemContext_getBinaryInfo(context, buffer, size, const BinaryInfo**, info size*)."""
GetMetadataFn = C.CFUNCTYPE(
    ErrorHandle, C.c_void_p, C.c_void_p, C.c_uint64, C.POINTER(C.POINTER(BinaryInfo))
)
"""QnnSystemContext_getMetadata(context, buffer, size, const BinaryInfo**): builds without
getBinaryInfo."""
SystemContextFreeFn = C.CFUNCTYPE(ErrorHandle, C.c_void_p)
"""QnnSystemContext_free(context)."""
_BuildIdFn = C.CFUNCTYPE(ErrorHandle, C.POINTER(C.c_char_p))


def _ver(v: Version) -> str:
    """'major.minor.patch' of a Qnn_Version_t."""
    return f"{v.major}.{v.minor}.{v.patch}"


def _str(p: bytes | None) -> str:
    """Decode a C string that may be NULL."""
    return p.decode("utf-8", "replace") if p else ""


def _qnn_dir() -> str:
    """Folder holding the QNN libraries shipped with onnxruntime_qnn."""
    import onnxruntime_qnn as oq
    return os.path.dirname(oq.get_qnn_htp_path())


def dlopen_quiet(path: str) -> C.CDLL:
    """dlopen a QNN library with fd 1 sent to /dev/null (libQnnHtp prints a '# LIBNATIVE'
    line to stdout).

    The pitfall (docs/qairt-families.md): libQnnHtp.so loaded through ctypes before this process has
    loaded onnxruntime (or numpy) makes the process's first QNN EP session segfault (exit 139 in
    _create_inference_session; measured with the pinned wheel, tests/test_compiler_families.py).
    Loading onnxruntime first makes every later order safe."""
    if os.path.basename(path).startswith("libQnnHtp"):
        import onnxruntime  # noqa: F401  (its native libraries first: see above)
    sys.stdout.flush()
    libc = C.CDLL(None)
    libc.fflush(None)
    saved, null = os.dup(1), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        lib = C.CDLL(path)
        libc.fflush(None)
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(null)
    return lib


@functools.lru_cache(maxsize=None)
def system_interface(lib_dir: str | None = None) -> tuple[C.CDLL, SystemInterface]:
    """Load libQnnSystem.so (bundled, or from `lib_dir`) once and return (lib, first
    system interface provider)."""
    lib = dlopen_quiet(os.path.join(lib_dir or _qnn_dir(), "libQnnSystem.so"))
    provs, n = C.POINTER(C.POINTER(SystemInterface))(), C.c_uint32()
    lib.QnnSystemInterface_getProviders.restype = ErrorHandle
    rc = lib.QnnSystemInterface_getProviders(C.byref(provs), C.byref(n))
    if rc & 0xFFFF or n.value == 0:
        raise RuntimeError(
            f"QnnSystemInterface_getProviders failed (error {rc & 0xFFFF}, {n.value} providers)"
        )
    return lib, provs[0].contents


def _tensor(t: Tensor) -> dict:
    """Qnn_Tensor_t -> {"name", "dtype", "shape"[, "scale", "offset"]}."""
    v = t.v2
    d: dict = {"name": _str(v.name), "dtype": DTYPES.get(v.dataType, "0x%04x" % v.dataType),
         "shape": [int(v.dims[i]) for i in range(v.rank)] if v.dims else []}
    q = v.quant
    if (q.encodingDefinition == QNN_DEFINITION_DEFINED
            and q.encoding in (ENCODING_SCALE_OFFSET, ENCODING_BW_SCALE_OFFSET)):
        so = q.u.so if q.encoding == ENCODING_SCALE_OFFSET else q.u.bw
        d["scale"], d["offset"] = float("%.9g" % so.scale), int(so.offset)
    return d


def _graph(g: _GraphInfo) -> dict:
    """QnnSystemContext_GraphInfo_t -> {"name", "inputs", "outputs"}."""
    if g.version not in (1, 2, 3):
        raise ValueError(f"unknown QnnSystemContext_GraphInfo version {g.version}")
    v = g.v3
    return {"name": _str(v.name),
            "inputs": [_tensor(v.inputs[i]) for i in range(v.numInputs)],
            "outputs": [_tensor(v.outputs[i]) for i in range(v.numOutputs)]}


def binary_info(bin_path: str, lib_dir: str | None = None) -> dict:
    """Versions, SoC model, blob size and graph I/O of a context binary, read
    through libQnnSystem."""
    with open(bin_path, "rb") as f:
        data = f.read()
    _, iface = system_interface(lib_dir)
    create, free = SystemContextCreateFn(iface.fns[0]), SystemContextFreeFn(iface.fns[3])
    handle = C.c_void_p()
    rc = create(C.byref(handle)) & 0xFFFF
    if rc:
        raise RuntimeError(f"QnnSystemContext_create failed (error {rc})")
    try:
        buf = C.create_string_buffer(data, len(data)) if data else C.create_string_buffer(1)
        info = C.POINTER(BinaryInfo)()
        if iface.fns[2]:
            rc = (
                GetMetadataFn(iface.fns[2])(
                    handle, C.cast(buf, C.c_void_p), len(data), C.byref(info)
                )
                & 0xFFFF
            )
        else:
            size = C.c_uint64()
            rc = (
                GetBinaryInfoFn(iface.fns[1])(
                    handle, C.cast(buf, C.c_void_p), len(data), C.byref(info), C.byref(size)
                )
                & 0xFFFF
            )
        if rc or not info:
            raise ValueError(f"{bin_path}: not a QNN context binary (QnnSystem error {rc})")
        ver = info.contents.version
        if ver not in (1, 2, 3):
            raise ValueError(f"{bin_path}: unsupported QnnSystemContext_BinaryInfo version {ver}")
        b = info.contents.u.v3 if ver == 3 else info.contents.u.v1
        return {"infoVersion": ver, "backendId": b.backendId, "buildId": _str(b.buildId),
                "coreApi": _ver(b.coreApi), "backendApi": _ver(b.backendApi),
                "socModel": b.socModel if ver == 3 else None, "ctxBlobSize": int(b.ctxBlobSize),
                "graphs": [_graph(b.graphs[i]) for i in range(b.numGraphs)]}
    finally:
        free(handle)


@functools.lru_cache(maxsize=None)
def htp_lib(lib_dir: str | None = None) -> C.CDLL:
    """Load libQnnHtp.so (bundled, or from `lib_dir`) once."""
    return dlopen_quiet(os.path.join(lib_dir or _qnn_dir(), "libQnnHtp.so"))


def htp_build_id(lib_dir: str | None = None) -> dict:
    """Provider name, backend id, API versions and build id of libQnnHtp.so (bundled,
    or in `lib_dir`)."""
    lib = htp_lib(lib_dir)
    provs, n = C.POINTER(C.POINTER(Interface))(), C.c_uint32()
    lib.QnnInterface_getProviders.restype = ErrorHandle
    rc = lib.QnnInterface_getProviders(C.byref(provs), C.byref(n)) & 0xFFFF
    if rc or n.value == 0:
        raise RuntimeError(f"QnnInterface_getProviders failed (error {rc}, {n.value} providers)")
    p = provs[0].contents
    bid = C.c_char_p()
    rc = _BuildIdFn(p.backendGetBuildId)(C.byref(bid)) & 0xFFFF if p.backendGetBuildId else -1
    return {"provider": _str(p.providerName), "backendId": p.backendId, "coreApi": _ver(p.coreApi),
            "htpApi": _ver(p.backendApi), "buildId": _str(bid.value) if rc == 0 else None}


# ---- clear-text HTP config string ---- Many keys in the string are stored compressed (a two-char
# [0-9A-Z] code + suffix, e.g. "0K_final"); those are skipped. Keys written out in full (soc_type,
# arch, vtcm_size, OpO, relaxed_precision_flag, ...) are returned.
_KV = re.compile(rb"(?<=[;\x00-\x1f\x7f-\xff])([A-Za-z_][A-Za-z0-9_]*)=([\x20-\x3a\x3c-\x7e]*);")
_INT = re.compile(r"-?\d+")
_FLOAT = re.compile(r"-?\d+\.\d+(?:[eE][-+]?\d+)?")
_HEXF = re.compile(r"-?0x[0-9a-f]+(?:\.[0-9a-f]*)?p[-+]?\d+")


def _value(s: str) -> int | float | bool | str:
    """Parse a config value: int, bool, decimal or C99 hex float, else the string."""
    if _INT.fullmatch(s):
        return int(s)
    if s in ("true", "false"):
        return s == "true"
    if _FLOAT.fullmatch(s):
        return float(s)
    if _HEXF.fullmatch(s):
        return float.fromhex(s)
    return s


# the config string sits in the binary's header: at 21-37 KB in every binary built here
HEAD = 1 << 20


def config_fields(bin_path: str) -> dict:
    """Fields of the clear-text HTP config string in a context binary (soc_type, arch, vtcm_size,
    OpO, ...). Read from the header; only a binary without the string there is searched whole (a 98
    MB decoder took 3.7 s of regex when every binary was)."""
    with open(bin_path, "rb") as f:
        out = _fields(f.read(HEAD))
        if "soc_type" not in out and "arch" not in out:
            f.seek(0)
            out = _fields(f.read())
    if "soc_type" not in out and "arch" not in out:
        raise ValueError(f"{bin_path}: no HTP config string (soc_type=/arch=) found")
    return out


def _fields(data: bytes) -> dict:
    out: dict = {}
    for m in _KV.finditer(data):
        key = m.group(1).decode()
        if re.match(r"[0-9A-Z]{2}", key):
            continue
        out.setdefault(key, _value(m.group(2).decode()))
    return out


MIB = 1 << 20


def chip_problems(config: dict, info: dict, chip: dict, given_only: bool = False) -> list[str]:
    """What a compiled binary says of its chip (config string: arch, vtcm_size; header: socModel)
    that differs from the chip record; `given_only`: skip the fields the binary does not carry
    (qnn-context-binary-generator's header may lack socModel, its config the arch)."""
    found = []
    if (
        not (given_only and info.get("socModel") is None)
        and info.get("socModel") != chip["soc_model"]
    ):
        found.append(f"socModel {info.get('socModel')} != {chip['soc_model']} ({chip['name']})")
    if not (given_only and "arch" not in config) and config.get("arch") != chip["htp_arch"]:
        found.append(f"arch {config.get('arch')} != {chip['htp_arch']}")
    if (
        not (given_only and "vtcm_size" not in config)
        and config.get("vtcm_size") != chip["vtcm_mb"] * MIB
    ):
        found.append(f"vtcm_size {config.get('vtcm_size')} != {chip['vtcm_mb']} MiB")
    return found
