"""Caches that outlive the process: engines, whole compiled graphs, and the store they share."""
