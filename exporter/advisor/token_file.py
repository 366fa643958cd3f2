"""The advisor's bearer token and its secret files, read by the bounded reader.

Apart from :mod:`exporter.advisor.service`, whose modules load numpy: node mode reads the
token too (GET /v1/* under ``api.require_token_for_reads``) and needs none of the advisor
(docs/performance.md, "A lean node").
"""

from __future__ import annotations

import logging
import os
import threading
from typing import TYPE_CHECKING

from exporter.bounded_file import Wording, read_bounded
from exporter.errors import ConfigError

if TYPE_CHECKING:
    from exporter.config import AdvisorConfig

log = logging.getLogger("exporter.advisor.service")  # its lines as they were before the move

TOKEN_ENV = "GPUFLEET_ADVISOR_TOKEN"


# A token or an HMAC secret is a line, not a document: a cap far above any real one
SECRET_MAX_BYTES = 64 * 1024
_SECRET_FILE = Wording(
    ConfigError, cannot_read="{key}: cannot read {path}: {reason}",
    over_limit="{key}: {path} is {size} bytes, over the {limit}-byte limit of a secret",
    grew_over_limit="{key}: {path} is over the {limit}-byte limit of a secret",
    # a FIFO opened without blocking and refused, /dev/zero refused before a byte is read
    not_regular="{key}: {path} is not a regular file")


class BlankSecret(ConfigError):
    """A secret file that was read and holds only whitespace."""


def _read_secret(path: str, key: str) -> bytes:
    """The stripped secret in ``path``, read by the bounded reader; ConfigError names ``key``."""
    data = read_bounded(path, SECRET_MAX_BYTES, _SECRET_FILE, key=key)
    try:
        value = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise ConfigError(f"{key}: {path} is not UTF-8 text") from None
    if not value:
        raise BlankSecret(f"{key}: {path} is empty after stripping whitespace")
    return value.encode()


class TokenFile:
    """``advisor.token_file``, read again whenever it changes, so a rotated token needs no restart.

    Calling it is blocking (a stat(), and a read when the file changed): the server calls it
    off the event loop (exporter.bearer.current_token), SIGHUP from its reload thread. A file that turns
    blank refuses every POST (fails closed: a blank token file is an operator's "no token")
    until a token is back. A file that cannot be read as a token (gone, unreadable, a FIFO or
    a device swapped in, over the size cap, not UTF-8) says nothing about the token: the last
    good one stays in force. Either way :attr:`ok` is False until a read succeeds again
    (``gpufleet_config_last_reload_successful`` 0), with one warning per change.
    """

    KEY = "advisor.token_file"

    def __init__(self, path: str) -> None:
        self.path = path
        self._stamp = self._stat()
        self._token: bytes | None = _read_secret(path, self.KEY)  # at start, errors stop it
        self.ok = True  # the last read succeeded
        # a POST's read (in a worker thread) and SIGHUP's (the reload thread) may overlap
        self._lock = threading.Lock()

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            info = os.stat(self.path)
        except OSError:
            return None
        # size and inode too: a rewrite within one mtime tick, or a rename over the file
        return (info.st_mtime_ns, info.st_size, info.st_ino)

    def __call__(self, force: bool = False) -> bytes | None:
        with self._lock:
            stamp = self._stat()
            if stamp != self._stamp or force:  # force: SIGHUP reads it again, changed or not
                self._stamp = stamp
                self._read()
            return self._token

    def _read(self) -> None:
        try:
            self._token = _read_secret(self.path, self.KEY)
        except ConfigError as exc:
            self.ok = False
            if isinstance(exc, BlankSecret):
                self._token = None
                log.warning(f"advisor POSTs refused until the token file is fixed: {exc}")
            else:
                log.warning(f"advisor token kept, the file cannot be read as one: {exc}")
        else:
            self.ok = True
            log.info("advisor token file read again", extra={"path": self.path})


def load_token(config: AdvisorConfig,
               environ: dict[str, str] | os._Environ = os.environ) -> bytes | TokenFile | None:
    """The bearer token: the environment's, else the file's; blank is an error, not "none"."""
    if TOKEN_ENV in environ:
        token = environ[TOKEN_ENV].strip()  # str.strip: U+00A0 and every Unicode space too
        if not token:
            raise ConfigError(f"{TOKEN_ENV}: empty after stripping whitespace")
        return token.encode()
    if config.token_file:
        return TokenFile(config.token_file)
    return None
