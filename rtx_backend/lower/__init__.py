"""Lowering: Dynamo's FX graph -> an ATen inference graph that the ONNX exporter translates."""
