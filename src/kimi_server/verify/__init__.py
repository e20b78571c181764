"""``kimi-server verify URL``: a conformance run against any Kimi-compatible endpoint.

``registry`` names the groups and their checks, ``checks/`` holds one module per group,
``target`` is the endpoint under test (the ``openai`` SDK and raw HTTP, both with timeouts),
``runner`` runs the chosen checks and ``report`` prints them. The expectations come from the
contract itself (``contracts``), not from this server's own rules, so the run says something
about this server too.
"""
