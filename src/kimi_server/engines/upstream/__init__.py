"""Upstream engines: the contract served from another OpenAI-compatible server (vLLM, SGLang,
llama.cpp's server, Moonshot's API, any OpenAI-compatible API)."""
