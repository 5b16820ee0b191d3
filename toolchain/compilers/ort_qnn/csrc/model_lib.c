/* A QNN Saver recording as a model library: the recorded program's main() becomes qnc_compose(), which
 * composes the graph through a QNN interface table the caller hands in (the wheel's libQnnHtp.so with the
 * chip's settings put back: backends/ort_qnn/context.py) and reads the weights from the file the caller
 * names, not from the working folder. Built with -DQNC_GRAPH_SOURCE='"<graph>.c"' (backends/ort_qnn/modellib.py). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "QnnInterface.h"

typedef Qnn_ErrorHandle_t (*qnc_providers_fn)(const QnnInterface_t*** providers, uint32_t* count);

static qnc_providers_fn qnc_providers;
static const char* qnc_weights;

static Qnn_ErrorHandle_t QnnInterface_getProviders(const QnnInterface_t*** providers, uint32_t* count) {
  return qnc_providers(providers, count);
}

static FILE* qnc_open_weights(const char* recorded_name, const char* mode) {
  (void)recorded_name;  /* "params.bin", relative to the cwd in the recording */
  return fopen(qnc_weights, mode);
}

#define main qnc_recorded_main
#define fopen qnc_open_weights
#include QNC_GRAPH_SOURCE
#undef fopen
#undef main

/* Compose (and finalize) the recorded graph; returns the recording's exit status (0: every call succeeded). */
__attribute__((visibility("default"))) int qnc_compose(const char* weights, qnc_providers_fn providers) {
  char name[] = "model_lib";
  char* argv[] = {name, NULL};
  qnc_weights = weights;
  qnc_providers = providers;
  return qnc_recorded_main(1, argv);
}
