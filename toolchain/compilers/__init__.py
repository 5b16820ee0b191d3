"""The compilers, one folder each (ort_qnn/, qairt/), and the registry of them (registry.py)."""
