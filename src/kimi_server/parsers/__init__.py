"""Reasoning formats, registered by name."""
