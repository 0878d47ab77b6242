"""Build: ONNX model -> screened TensorRT-RTX network -> engine for the declared targets."""
