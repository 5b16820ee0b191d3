/* qnn-npu-compile's own declarations of the QNN C API types a QNN Saver recording uses, so that the recording
 * (build/<model>/<graph>/<graph>.c, which includes "QnnInterface.h") compiles without Qualcomm's headers.
 * Written from the documented API (type names, enum values, LP64 layouts) for QNN core API 2.x; it is not a
 * copy of Qualcomm's header. Enums the recording only uses through casts are plain uint32_t here. The sizes
 * of Qnn_Tensor_t and Qnn_Param_t must be exact: the recording passes arrays of them. They match
 * toolchain/qnn/qnnbin.py, whose reader of context binaries uses the same layouts. */
#ifndef QNC_QNN_DECLARATIONS_H
#define QNC_QNN_DECLARATIONS_H

#include <stdbool.h>
#include <stdint.h>

typedef uint64_t Qnn_ErrorHandle_t;          /* the error code is the low 16 bits */
typedef void* Qnn_LogHandle_t;
typedef void* Qnn_BackendHandle_t;
typedef void* Qnn_DeviceHandle_t;
typedef void* Qnn_ContextHandle_t;
typedef void* Qnn_GraphHandle_t;
typedef void* Qnn_ProfileHandle_t;
typedef void* Qnn_SignalHandle_t;
typedef void* Qnn_MemHandle_t;
typedef void* QnnDevice_Infrastructure_t;

typedef uint32_t QnnLog_Level_t;
typedef uint32_t QnnProperty_Key_t;
typedef uint32_t Qnn_DataType_t;
typedef uint32_t Qnn_Definition_t;
typedef uint32_t Qnn_QuantizationEncoding_t;
typedef uint32_t Qnn_TensorType_t;
typedef uint32_t Qnn_TensorDataFormat_t;
typedef uint32_t Qnn_TensorMemType_t;
typedef uint32_t Qnn_TensorVersion_t;
typedef uint32_t Qnn_ParamType_t;
typedef uint32_t Qnn_OpConfigVersion_t;
typedef uint32_t Qnn_Priority_t;
typedef uint32_t Qnn_SparseLayoutType_t;

#define QNN_LOG_LEVEL_ERROR 1
#define QNN_LOG_LEVEL_WARN 2
#define QNN_LOG_LEVEL_INFO 3
#define QNN_LOG_LEVEL_VERBOSE 4
#define QNN_LOG_LEVEL_DEBUG 5
#define QNN_COMMON_ERROR_NOT_SUPPORTED 1000
#define QNN_CONTEXT_CONFIG_OPTION_PRIORITY 1

/* ---- quantization encodings: the union is 32 bytes, 8-byte aligned ---- */
typedef struct { float scale; int32_t offset; } Qnn_ScaleOffset_t;
typedef struct { int32_t axis; uint32_t numScaleOffsets; Qnn_ScaleOffset_t* scaleOffset; } Qnn_AxisScaleOffset_t;
typedef struct { uint32_t bitwidth; float scale; int32_t offset; } Qnn_BwScaleOffset_t;
typedef struct {
  uint32_t bitwidth; int32_t axis; uint32_t numElements; float* scales; int32_t* offsets;
} Qnn_BwAxisScaleOffset_t;
typedef struct {
  Qnn_Definition_t encodingDefinition;
  Qnn_QuantizationEncoding_t quantizationEncoding;
  union {
    Qnn_ScaleOffset_t scaleOffsetEncoding;
    Qnn_AxisScaleOffset_t axisScaleOffsetEncoding;
    Qnn_BwScaleOffset_t bwScaleOffsetEncoding;
    Qnn_BwAxisScaleOffset_t bwAxisScaleOffsetEncoding;
  };
} Qnn_QuantizeParams_t;

/* ---- tensors: V1 is a prefix of V2, and Qnn_Tensor_t is sized by V2 ---- */
typedef struct { void* data; uint32_t dataSize; } Qnn_ClientBuffer_t;
typedef struct { uint32_t numSpecifiedElements; uint32_t numSparseDimensions; } Qnn_SparseLayoutHybridCoo_t;
typedef struct { Qnn_SparseLayoutType_t type; union { Qnn_SparseLayoutHybridCoo_t hybridCoo; }; } Qnn_SparseParams_t;

#define QNC_TENSOR_V1_FIELDS                 \
  uint32_t id;                               \
  const char* name;                          \
  Qnn_TensorType_t type;                     \
  Qnn_TensorDataFormat_t dataFormat;         \
  Qnn_DataType_t dataType;                   \
  Qnn_QuantizeParams_t quantizeParams;       \
  uint32_t rank;                             \
  uint32_t* dimensions;                      \
  Qnn_TensorMemType_t memType;               \
  union { Qnn_ClientBuffer_t clientBuf; Qnn_MemHandle_t memHandle; };

typedef struct { QNC_TENSOR_V1_FIELDS } Qnn_TensorV1_t;
typedef struct {
  QNC_TENSOR_V1_FIELDS
  uint8_t* isDynamicDimensions;
  Qnn_SparseParams_t sparseParams;
  uint8_t isProduced;
} Qnn_TensorV2_t;
typedef struct { Qnn_TensorVersion_t version; union { Qnn_TensorV1_t v1; Qnn_TensorV2_t v2; }; } Qnn_Tensor_t;

/* ---- op parameters and op configs ---- */
typedef struct {
  Qnn_DataType_t dataType;
  union {
    float floatValue; double doubleValue;
    uint64_t uint64Value; int64_t int64Value;
    uint32_t uint32Value; uint16_t uint16Value; uint8_t uint8Value;
    int32_t int32Value; int16_t int16Value; int8_t int8Value;
    uint8_t bool8Value; const char* stringValue;
  };
} Qnn_Scalar_t;
typedef struct {
  Qnn_ParamType_t paramType;
  const char* name;
  union { Qnn_Scalar_t scalarParam; Qnn_Tensor_t tensorParam; };
} Qnn_Param_t;
typedef struct {
  const char* name; const char* packageName; const char* typeName;
  uint32_t numOfParams; Qnn_Param_t* params;
  uint32_t numOfInputs; Qnn_Tensor_t* inputTensors;
  uint32_t numOfOutputs; Qnn_Tensor_t* outputTensors;
} Qnn_OpConfigV1_t;
typedef struct { Qnn_OpConfigVersion_t version; union { Qnn_OpConfigV1_t v1; }; } Qnn_OpConfig_t;

/* ---- configs: an option, then a union that holds a pointer or a number (offset 8) ---- */
#define QNC_CONFIG(name) typedef struct { uint32_t option; union { void* customConfig; Qnn_Priority_t priority; \
                                                                  uint64_t value; }; } name
QNC_CONFIG(QnnBackend_Config_t);
QNC_CONFIG(QnnDevice_Config_t);
QNC_CONFIG(QnnContext_Config_t);
QNC_CONFIG(QnnGraph_Config_t);

/* what a recording only passes on: never looked into here */
typedef struct QncDevicePlatformInfo QnnDevice_PlatformInfo_t;

/* ---- the interface table: QnnInterface_t with its function table, in the documented order ---- */
typedef struct { uint32_t major, minor, patch; } Qnn_Version_t;
typedef struct { Qnn_Version_t coreApiVersion; Qnn_Version_t backendApiVersion; } Qnn_ApiVersion_t;

typedef struct {
  Qnn_ErrorHandle_t (*propertyHasCapability)(QnnProperty_Key_t);
  Qnn_ErrorHandle_t (*backendCreate)(Qnn_LogHandle_t, const QnnBackend_Config_t**, Qnn_BackendHandle_t*);
  void* backendSetConfig; void* backendGetApiVersion; void* backendGetBuildId;
  void* backendRegisterOpPackage; void* backendGetSupportedOperations;
  Qnn_ErrorHandle_t (*backendValidateOpConfig)(Qnn_BackendHandle_t, Qnn_OpConfig_t);   /* recorded by QAIRT 2.47 */
  Qnn_ErrorHandle_t (*backendFree)(Qnn_BackendHandle_t);
  Qnn_ErrorHandle_t (*contextCreate)(Qnn_BackendHandle_t, Qnn_DeviceHandle_t, const QnnContext_Config_t**,
                                     Qnn_ContextHandle_t*);
  void* contextSetConfig; void* contextGetBinarySize; void* contextGetBinary; void* contextCreateFromBinary;
  Qnn_ErrorHandle_t (*contextFree)(Qnn_ContextHandle_t, Qnn_ProfileHandle_t);
  Qnn_ErrorHandle_t (*graphCreate)(Qnn_ContextHandle_t, const char*, const QnnGraph_Config_t**, Qnn_GraphHandle_t*);
  void* graphCreateSubgraph; void* graphSetConfig;
  Qnn_ErrorHandle_t (*graphAddNode)(Qnn_GraphHandle_t, Qnn_OpConfig_t);
  Qnn_ErrorHandle_t (*graphFinalize)(Qnn_GraphHandle_t, Qnn_ProfileHandle_t, Qnn_SignalHandle_t);
  void* graphRetrieve; void* graphExecute; void* graphExecuteAsync;
  Qnn_ErrorHandle_t (*tensorCreateContextTensor)(Qnn_ContextHandle_t, Qnn_Tensor_t*);
  Qnn_ErrorHandle_t (*tensorCreateGraphTensor)(Qnn_GraphHandle_t, Qnn_Tensor_t*);
  Qnn_ErrorHandle_t (*logCreate)(void*, QnnLog_Level_t, Qnn_LogHandle_t*);
  void* logSetLogLevel;
  Qnn_ErrorHandle_t (*logFree)(Qnn_LogHandle_t);
  void* profileCreate; void* profileSetConfig; void* profileGetEvents; void* profileGetSubEvents;
  void* profileGetEventData; void* profileGetExtendedEventData; void* profileFree;
  void* memRegister; void* memDeRegister;
  Qnn_ErrorHandle_t (*deviceGetPlatformInfo)(Qnn_LogHandle_t, const QnnDevice_PlatformInfo_t**);   /* QAIRT 2.47, 2.48 */
  Qnn_ErrorHandle_t (*deviceFreePlatformInfo)(Qnn_LogHandle_t, const QnnDevice_PlatformInfo_t*);
  Qnn_ErrorHandle_t (*deviceGetInfrastructure)(QnnDevice_Infrastructure_t*);
  Qnn_ErrorHandle_t (*deviceCreate)(Qnn_LogHandle_t, const QnnDevice_Config_t**, Qnn_DeviceHandle_t*);
  void* deviceSetConfig; void* deviceGetInfo;
  Qnn_ErrorHandle_t (*deviceFree)(Qnn_DeviceHandle_t);
  void* signalCreate; void* signalSetConfig; void* signalTrigger; void* signalFree;
} QnnInterface_FunctionTable_t;

#define QNN_INTERFACE_VER_TYPE QnnInterface_FunctionTable_t
#define QNN_INTERFACE_VER_NAME functions
typedef struct {
  uint32_t backendId;
  const char* providerName;
  Qnn_ApiVersion_t apiVersion;
  union { QNN_INTERFACE_VER_TYPE QNN_INTERFACE_VER_NAME; };
} QnnInterface_t;

#endif
