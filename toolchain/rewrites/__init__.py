"""Legalizing rewrites of a simplified ONNX: function-preserving graph edits that let the HTP take
(or compute right) a node it refuses (or gets wrong) as written. library.py holds the rules and the
calls the build makes; the ops the HTP computes wrong are a table (known_wrong.toml, read by
known_wrong.py); a spec turns the rules on per graph with `rewrite = [...]` or `"auto"`.

Each rule says where it *can* apply (`applies`) and where the HTP *needs* it (`needed`, what "auto"
applies and what a failing convert points to). Every applied rewrite is checked against the
unrewritten graph on the CPU, on the model's own data, before any compile
(stages/rewrite_check.py)."""
