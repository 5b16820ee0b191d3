"""What leaves the build for a phone: bundles (bundle, tarball), sherpa-onnx's runtime contract (sherpa) and
its Whisper host loop as the gate (sherpa_whisper, sherpa_run), runtime libraries (runtime_libs), the chip
index an app chooses from (selector)."""
