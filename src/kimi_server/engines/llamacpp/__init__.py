"""The embedded engine: llama.cpp in-process through xllamacpp."""
