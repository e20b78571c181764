"""Local GGUF weights: the downloadable catalogue, the on-disk store, pulling and the CLI."""
