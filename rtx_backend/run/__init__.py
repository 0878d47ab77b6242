"""Running: the region module that replaces a region, its executors, first-call validation."""
