"""qnn-npu-compile's build: spec/ (TOML -> records) -> stages/ (compiler-independent doit stages)
-> compilers/ (the compilers, one surface) -> deploy/ (bundles, runtime contract) and phone/;
engine/ runs it all (worker, cache, limits, stamps) knowing nothing of QNN or a model, qnn/ holds
the facts of QNN itself (tensor layout, the SDK's layout, the binary reader), shared/ what every
checking wing uses (the error measures, a model's samples on the CPU, the I/O record, WAV files).
errors.py: the exceptions a user sees; artifacts.py: where every stage writes in build/;
pipeline.py lists the stages.

Model code (models/*.py) imports toolchain.modelkit, and only that; modelkit.ModelCode lists every
function of a model file the build calls."""
