"""Wire models only: what clients send and receive (pydantic at the edge)."""
