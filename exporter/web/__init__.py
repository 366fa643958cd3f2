"""Serving: the aiohttp app and its routes (server.py), the connection gate that sheds
floods (connection_gate.py), and exporter-toolkit's web config: TLS and basic auth
(webconfig.py)."""
