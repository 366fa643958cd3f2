"""``listen``'s HOST:PORT, read before the server's modules are imported: a bad address is one
line before aiohttp's import (0.3 s to the error, not 0.76)."""

from __future__ import annotations

from exporter.errors import quoted


def parse_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    # ASCII and 5 digits before int(): "²" is a digit int() refuses, and 5,000 digits pass
    # int()'s limit of 4,300 as a ValueError that names no key
    if (not sep or not (port.isascii() and port.isdigit()) or len(port) > 5
            or not 0 <= int(port) <= 65535):
        raise ValueError(f"listen: must be HOST:PORT, got {quoted(listen)}")
    return host.strip("[]") or "0.0.0.0", int(port)
