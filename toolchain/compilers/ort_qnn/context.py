"""Model library -> HTP context binary for one chip: the design card's per-chip step on
the embedded toolchain.

The model library (modellib.py) composes the graph the QNN Saver recorded (convert.py) through
a QNN interface table handed to it. This module hands it the wheel's libQnnHtp.so table with
three calls wrapped:
- deviceCreate gets the chip's device configs (SoC id, HTP arch), and graphCreate the graph configs
  (optimization level, VTCM, fp16 precision), in the order and under the conditions the onnxruntime
  QNN EP sets them: the Saver records these calls with empty config lists (docs/design-card.md), so
  they are put back here;
- contextFree first asks the finalized context for its binary (contextGetBinarySize
/ contextGetBinary). Given the same options, the bytes equal the EP's own compile
(the oracle, oracle.py)."""
from __future__ import annotations

import ctypes as C
from typing import Any

from toolchain.engine.files import atomic_path
from toolchain.qnn import qnnbin
from toolchain.qnn.qnnbin import INTERFACE_FUNCTIONS, ErrorHandle, Interface, htp_lib

_P = C.c_void_p
# Option numbers of the documented QNN HTP API (QnnDevice/QnnGraph config options,
# HTP custom configs).
CONFIG_OPTION_CUSTOM = 0
HTP_DEVICE_SOC, HTP_DEVICE_ARCH = 0, 1
HTP_GRAPH_OPTIMIZATION, HTP_GRAPH_PRECISION, HTP_GRAPH_VTCM_MB = 1, 2, 3
HTP_OPTIMIZATION_FINALIZE_FLAG = 3
PRECISION_FLOAT16 = 1


class _Config(C.Structure):
    # Qnn{Device,Graph}_Config_t: an option, then a union holding a pointer (offset 8)
    _fields_ = [("option", C.c_uint32), ("custom", _P)]


class _Pair(C.Structure):
    _fields_ = [("a", C.c_uint32), ("b", C.c_uint32)]


class _Custom(C.Structure):
    # QnnHtp{Device,Graph}_CustomConfig_t: an option, then the union at offset 8 (it may
    # hold a pointer)
    _fields_ = [
        ("option", C.c_uint32),
        ("_align", C.c_uint32),
        ("value", _Pair),
        ("_rest", C.c_uint64),
    ]


# Where a device custom config's value sits: offset 8 (QAIRT 2.47, 2.48, 2.50, 2.51), 4 in
# QAIRT 2.49, whose libQnnHtp.so refuses the SoC config at 8 (14001); measured per family by
# the oracle (families.toml).
DEVICE_CONFIG_OFFSET = 8


def _custom(option: int, first: int, second: int = 0, offset: int = 8) -> _Custom:
    c = _Custom()
    c.option = option
    if offset == 8:
        c.value.a, c.value.b = first, second
    elif offset == 4:
        c._align, c.value.a = first, second
    else:
        raise ValueError(f"device config union at offset {offset}: only 4 and 8 are known")
    return c


def _optimization(level: float) -> _Custom:
    c = _Custom()
    c.option = HTP_GRAPH_OPTIMIZATION
    c.value.a = HTP_OPTIMIZATION_FINALIZE_FLAG
    c.value.b = C.c_uint32.from_buffer_copy(C.c_float(level)).value   # {type; float value}
    return c


class ConfigList:
    """A NULL-terminated `const Qnn*_Config_t**` of CUSTOM configs, kept alive with its parts."""

    def __init__(self, customs: list[_Custom]) -> None:
        self.customs = customs
        self.configs = [_Config(CONFIG_OPTION_CUSTOM, C.cast(C.pointer(c), _P)) for c in customs]
        self.array = (C.POINTER(_Config) * (len(self.configs) + 1))(
            *[C.pointer(c) for c in self.configs], C.POINTER(_Config)()   # NULL-terminated
        )

    @property
    def pointer(self):
        return C.cast(self.array, _P)


def device_configs(chip: dict, offset: int = DEVICE_CONFIG_OFFSET) -> ConfigList:
    """SoC id and HTP arch (device 0), as the EP sets them."""
    return ConfigList([_custom(HTP_DEVICE_SOC, chip["soc_model"], offset=offset),
                       _custom(HTP_DEVICE_ARCH, 0, chip["htp_arch"], offset=offset)])


# The monolithic-LSTM graph option has no number in any documentation at hand; 17 is the one whose
# replay gives the EP's own bytes for the seeded LSTM (and sets monolithic_lstm_flag in the binary's
# config string), found by trying the numbers after the documented ones; the oracle test holds it
# (tests/test_compiler_ort_qnn.py).
HTP_GRAPH_MONOLITHIC_LSTM = 17


def graph_settings(options: dict) -> dict:
    """The finalization settings of a graph, from the EP options it is compiled with
    (ep.provider_options)."""
    return {"optimization": int(options.get("htp_graph_finalization_optimization_mode", "0")),
            "vtcm_mb": int(options.get("vtcm_mb", "0")),
            "fp16": options.get("enable_htp_fp16_precision", "1") == "1",
            "monolithic_lstm": options.get("enable_htp_monolithic_lstm", "0") == "1"}


def graph_configs(settings: dict) -> ConfigList:
    """The EP's order and conditions: optimization when a level is set, VTCM when above 0, fp16
    precision unless disabled, monolithic LSTM when enabled (`settings`: graph_settings())."""
    found = []
    if settings.get("optimization"):
        found.append(_optimization(float(settings["optimization"])))
    if settings.get("vtcm_mb", 0) > 0:
        found.append(_custom(HTP_GRAPH_VTCM_MB, settings["vtcm_mb"]))
    if settings.get("fp16", True):
        found.append(_custom(HTP_GRAPH_PRECISION, PRECISION_FLOAT16))
    if settings.get("monolithic_lstm"):
        found.append(_custom(HTP_GRAPH_MONOLITHIC_LSTM, 1))
    return ConfigList(found)


_PROVIDERS = C.CFUNCTYPE(
    ErrorHandle, C.POINTER(C.POINTER(C.POINTER(Interface))), C.POINTER(C.c_uint32)
)
_DEVICE_CREATE = C.CFUNCTYPE(ErrorHandle, _P, _P, C.POINTER(_P))
_GRAPH_CREATE = C.CFUNCTYPE(ErrorHandle, _P, C.c_char_p, _P, C.POINTER(_P))
_CONTEXT_FREE = C.CFUNCTYPE(ErrorHandle, _P, _P)
_GET_SIZE = C.CFUNCTYPE(ErrorHandle, _P, C.POINTER(C.c_uint64))
_GET_BINARY = C.CFUNCTYPE(ErrorHandle, _P, _P, C.c_uint64, C.POINTER(C.c_uint64))


class Replay:
    """The interface table a model library composes into: libQnnHtp.so's, with the chip's settings
    put back and the finalized context's binary kept (`binary`, `graph_names`)."""

    def __init__(self, chip: dict, settings: dict, device_config_offset: int = DEVICE_CONFIG_OFFSET,
                 lib_dir: str | None = None) -> None:
        provs, n = C.POINTER(C.POINTER(Interface))(), C.c_uint32()
        lib = htp_lib(lib_dir)
        lib.QnnInterface_getProviders.restype = ErrorHandle
        rc = lib.QnnInterface_getProviders(C.byref(provs), C.byref(n))
        if rc & 0xFFFF or n.value == 0:
            raise RuntimeError(f"QnnInterface_getProviders failed (error {rc & 0xFFFF})")
        real = provs[0].contents
        self.table = Interface()
        C.pointer(self.table)[0] = real
        self._device_configs = device_configs(chip, device_config_offset)
        self._graph_configs = graph_configs(settings)
        self.binary: bytes | None = None
        self.graph_names: list[str] = []
        self.errors: list[str] = []
        real_device, real_graph = _DEVICE_CREATE(real.deviceCreate), _GRAPH_CREATE(real.graphCreate)
        real_free = _CONTEXT_FREE(real.contextFree)
        get_size, get_binary = (
            _GET_SIZE(real.contextGetBinarySize),
            _GET_BINARY(real.contextGetBinary),
        )

        def device_create(log, _configs, device):
            return real_device(log, self._device_configs.pointer, device)

        def graph_create(
            context: int | None, name: bytes, _configs: int | None, graph: C._Pointer[_P]
        ) -> int:
            self.graph_names.append(name.decode())
            return real_graph(context, name, self._graph_configs.pointer, graph)

        def context_free(context, profile):
            size = C.c_uint64()
            rc = get_size(context, C.byref(size))
            if rc & 0xFFFF:
                self.errors.append(f"contextGetBinarySize: QNN error {rc & 0xFFFF}")
            else:
                buf, written = C.create_string_buffer(size.value), C.c_uint64()
                rc = get_binary(context, C.cast(buf, _P), size.value, C.byref(written))
                if rc & 0xFFFF:
                    self.errors.append(f"contextGetBinary: QNN error {rc & 0xFFFF}")
                else:
                    self.binary = buf.raw[:written.value]
            return real_free(context, profile)

        self._callbacks = [
            _DEVICE_CREATE(device_create),
            _GRAPH_CREATE(graph_create),
            _CONTEXT_FREE(context_free),
        ]
        for name, fn in zip(("deviceCreate", "graphCreate", "contextFree"), self._callbacks):
            setattr(self.table, name, C.cast(fn, _P))
        self._list = (C.POINTER(Interface) * 1)(C.pointer(self.table))

        def providers(out, count):
            out[0] = C.cast(self._list, C.POINTER(C.POINTER(Interface)))
            count[0] = 1
            return 0

        self.providers = _PROVIDERS(providers)


def compose(model_lib: str, weights: str, chip: dict, settings: dict,
            device_config_offset: int = DEVICE_CONFIG_OFFSET) -> Replay:
    """Run the model library's recorded graph into libQnnHtp.so for `chip`; the replay
    holds the binary."""
    lib = C.CDLL(model_lib)   # not libQnnHtp itself: the model library gets its table from Replay
    lib.qnc_compose.restype = C.c_int
    lib.qnc_compose.argtypes = [C.c_char_p, _PROVIDERS]
    replay = Replay(chip, settings, device_config_offset)
    status = lib.qnc_compose(weights.encode(), replay.providers)
    if status:
        replay.errors.append(f"the recorded graph failed with QNN error {status & 0xFFFF}")
    return replay


# the documented prefix of the function table (qnnbin.py), as csrc/include declares it
assert len(INTERFACE_FUNCTIONS) == 48


# EPContext wrapper: what the EP writes beside its binaries, as measured on its own outputs
# (onnxruntime-qnn 2.7.0): one com.microsoft EPContext node named after the QNN graph, the binary by
# file name, and the EP's compatibility string "v2:<backend id>:<QAIRT>:<HTP API>:<arch>:<soc
# id>:<VTCM MB>:0" (the last field 0 in every compile measured). The oracle compares this wrapper's
# node and metadata with the EP's (oracle.py).
_ONNX_DTYPES = {
    "float32": 1,
    "uint8": 2,
    "int8": 3,
    "uint16": 4,
    "int16": 5,
    "int32": 6,
    "int64": 7,
    "bool": 9,
    "float16": 10,
}
WRAPPER_OPSET, WRAPPER_IR = 17, 10   # any the EP loads: the node is com.microsoft EPContext v1


# How the EPs of older QAIRT families write it (families.toml, measured by the oracle on five
# chips): format 2 is the string above; format 1 (the EPs of 2.47 and 2.48) has no
# is_multi_soc_ep_context attribute and the string "<backend id>:<QAIRT>:<HTP
# API>:0.0.0:<arch>:0". The EPs before 2.51 do not write v79 as 79 (2.47, 2.48: 68; 2.49, 2.50:
# 0): `arch_as`. The external_dependencies entry is written by onnxruntime 1.32, not by 1.27
# (which hosts 2.47's EP): "dependencies".
WRAPPER = {"format": 2, "arch": True, "dependencies": True}   # QAIRT 2.51's, the default


def compatibility(chip: dict, htp: dict, qairt: str, wrapper: dict = WRAPPER) -> str:
    if wrapper["format"] == 1:
        # as that EP writes it
        arch = wrapper.get("arch_as", {}).get(str(chip["htp_arch"]), chip["htp_arch"])
        return f"{htp['backendId']}:{qairt}:{htp['htpApi']}:0.0.0:{arch}:0"
    arch = (
        wrapper.get("arch_as", {}).get(str(chip["htp_arch"]), chip["htp_arch"])
        if wrapper["arch"]
        else 0
    )
    fields = [htp["backendId"], qairt, htp["htpApi"], arch, chip["soc_model"], chip["vtcm_mb"], 0]
    return "v2:" + ":".join(str(f) for f in fields)


def write_context_model(
    out: str,
    binary_name: str,
    graph_name: str,
    io: dict,
    chip: dict,
    metadata: dict,
    wrapper: dict = WRAPPER,
) -> None:
    """The EPContext ONNX onnxruntime users load (verify runs it), pointing at `binary_name` beside
    it; `metadata`: the source model's metadata_props, which the EP carries over; `wrapper`: how the
    family's EP writes it."""
    import onnx  # heavy: only in the compile step's process
    import onnxruntime_qnn.build_and_package_info as info
    from onnx import helper

    htp = qnnbin.htp_build_id()

    def values(kind):
        return [
            helper.make_tensor_value_info(name, _ONNX_DTYPES[dtype], shape)
            for name, shape, dtype in io[kind]
        ]

    multi_soc: dict[str, Any] = {"is_multi_soc_ep_context": 0} if wrapper["format"] == 2 else {}
    node = helper.make_node(
        "EPContext",
        [t[0] for t in io["inputs"]],
        [t[0] for t in io["outputs"]],
        name=graph_name,
        domain="com.microsoft",
        main_context=1,
        ep_cache_context=binary_name,
        **multi_soc,
        max_size=0,
        ep_sdk_version=htp["buildId"],
        embed_mode=0,
        source="QNNExecutionProvider",
        partition_name=graph_name,
    )
    node.doc_string = "EPContext node for QNNExecutionProvider"
    model = helper.make_model(
        helper.make_graph([node], "main_graph", values("inputs"), values("outputs")),
        opset_imports=[
            helper.make_opsetid("", WRAPPER_OPSET),
            helper.make_opsetid("com.microsoft", 1),
        ],
        ir_version=WRAPPER_IR,
    )
    dependencies = (
        {"external_dependencies": "ep_context_binary"} if wrapper.get("dependencies", True) else {}
    )
    helper.set_model_props(
        model,
        {
            "ep_compatibility_info.QNNExecutionProvider": compatibility(
                chip, htp, info.qnn_version, wrapper
            ),
            **metadata,
            **dependencies,
        },
    )
    with atomic_path(out) as tmp:
        onnx.save(model, str(tmp))
