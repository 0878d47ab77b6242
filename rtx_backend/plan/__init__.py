"""Planning: which lowered nodes TensorRT-RTX serves on every target, and the regions they form."""
