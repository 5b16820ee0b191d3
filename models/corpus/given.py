"""No model code for the corpus's given ONNX files: each graph is taken as its package ships it (the spec's
`source`), the HTP's needs met by the rewrite library, and verify feeds seeded inputs of the declared shapes."""
