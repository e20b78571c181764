"""Engines turn a GenerationRequest into a stream of EngineEvents."""
