"""Export: each region -> an ONNX model (torch.onnx, dynamo=True), with its rewrites."""
