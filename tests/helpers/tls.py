"""Certificates made with Debian's ``openssl`` CLI, and bcrypt hashes, for the web config tests.

A CA, a server certificate for 127.0.0.1 and localhost signed by it, and a client
certificate (SAN ``DNS:scraper.example``) for ``RequireAndVerifyClientCert``: what an
operator makes by hand, so the tests load what a user would load.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import bcrypt

from tests.helpers.servers import require_binary


@dataclass(frozen=True)
class Pki:
    folder: Path
    ca: Path
    cert: Path
    key: Path
    client_cert: Path
    client_key: Path


def _openssl(folder: Path, *args: str) -> None:
    subprocess.run([require_binary("openssl"), *args], cwd=folder, check=True,
                   capture_output=True, timeout=60)


def make_pki(folder: Path, name: str = "server") -> Pki:
    """A CA and its server and client certificates in ``folder`` (EC P-256: fast to make).
    ``name`` prefixes the server's files, so a second server certificate (a reload) can be
    made beside the first with the same CA."""
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "ca.crt").exists():
        _openssl(folder, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                 "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
                 "-subj", "/CN=gpufleet test CA")
    for who, san in ((name, "IP:127.0.0.1,DNS:localhost"), ("client", "DNS:scraper.example")):
        if (folder / f"{who}.crt").exists():
            continue
        _openssl(folder, "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                 "-keyout", f"{who}.key", "-out", f"{who}.csr", "-subj", f"/CN={who}")
        (folder / f"{who}.ext").write_text(f"subjectAltName={san}\n")
        _openssl(folder, "x509", "-req", "-in", f"{who}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", f"{who}.crt", "-days", "2", "-extfile", f"{who}.ext")
    return Pki(folder, folder / "ca.crt", folder / f"{name}.crt", folder / f"{name}.key",
               folder / "client.crt", folder / "client.key")


def bcrypt_hash(password: str, cost: int = 4) -> str:
    """A bcrypt hash as htpasswd -B writes it; cost 4 (the least) keeps tests fast."""
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(cost)).decode()
