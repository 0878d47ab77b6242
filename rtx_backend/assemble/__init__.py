"""Assembly: the stages put together per region and per graph, graph-cache reuse, weight checks."""
