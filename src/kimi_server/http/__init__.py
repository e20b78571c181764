"""HTTP: app factory, one router per endpoint, SSE framing, error rendering."""
