"""Endpoint logic, engine-agnostic: wire request -> GenerationRequest -> wire output."""
