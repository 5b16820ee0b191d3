"""Facts of QNN itself, whichever compiler made the binary: the context-binary format and its
reader (qnnbin), the C API runner the deployed runtimes use (qnnrun), tensor layouts and
library names (layout)."""
