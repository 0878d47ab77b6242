"""Tools on top of the backend: explain, crosscheck, recording, preload, info and clear-cache."""
