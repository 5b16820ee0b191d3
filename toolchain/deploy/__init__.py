"""What leaves the build for a phone: bundles (bundle, tarball), sherpa-onnx's runtime contract
(sherpa_contract) and its Whisper host loop as the gate (sherpa_whisper; the stage: sherpa), runtime
libraries (runtime), the chip index an app chooses from (chip_index)."""
