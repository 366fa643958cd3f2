#!/usr/bin/env python3
"""Prometheus file_sd targets for gpufleet's node-mode exporters, from Slurm's node list.

Every node that advertises a GPU GRES becomes one target, ``<NodeName>:9874``, in the
``file_sd_configs`` JSON format::

    [{"targets": ["gpu-001:9874", ...], "labels": {}}]

Prometheus re-reads the file when it changes, so a node added to slurm.conf is scraped
after the next run (deploy/file_sd/gpufleet-file-sd.timer runs this every 5 minutes).

Input: ``sinfo --json`` (Slurm 21.08 and later), or the text of
``sinfo -N -h -o '%N %G'`` where JSON is missing (``--format text``); ``--input FILE``
reads a saved output instead of running sinfo. No label is added by default: a target
label that gpufleet also sets (``pool``, ``node``, ``cluster``) would be renamed
``exported_pool`` etc. by Prometheus (honor_labels false), and the dashboards and rules
read gpufleet's own.

Standard library only, so it runs on a Slurm head node without gpufleet installed.
Exit codes: 0 written (or unchanged), 1 sinfo failed or its output could not be read,
2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

# sinfo's output for 10,000 nodes is about 25 MB of JSON; anything far beyond is not sinfo.
MAX_INPUT_BYTES = 64 * 1024 * 1024
MAX_NODES = 100_000
# A Slurm NodeName or NodeAddr: a host name or an address, never a URL or a path.
_HOST = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:\-\[\]]{0,252}$")
_GPU_GRES = re.compile(r"(?:^|,)gpu(?::|$|,|\()")


class InputError(Exception):
    """sinfo's output could not be read; the message is one line for the user."""


def has_gpu(gres: str) -> bool:
    """True when a GRES string (``gpu:h200:8``, ``gpu:8(S:0-1)``, ``tmpfs:1,gpu:2``) names GPUs."""
    return bool(_GPU_GRES.search(gres))


def nodes_from_json(text: str, use_address: bool) -> list[str]:
    """GPU nodes from ``sinfo --json``: their NodeName (or NodeAddr with use_address)."""
    try:
        doc = json.loads(text)
    except ValueError as err:
        raise InputError(f"sinfo --json output is not JSON: {err}") from None
    nodes = doc.get("nodes") if isinstance(doc, dict) else None
    if not isinstance(nodes, list):
        raise InputError("sinfo --json output has no `nodes` list")
    if len(nodes) > MAX_NODES:
        raise InputError(f"sinfo lists {len(nodes)} nodes, more than {MAX_NODES}")
    out = []
    for i, node in enumerate(nodes):
        if not isinstance(node, dict) or not isinstance(node.get("name"), str):
            raise InputError(f"sinfo --json: nodes[{i}] has no name")
        gres = node.get("gres", "")
        if not isinstance(gres, str) or not has_gpu(gres):
            continue
        host = node.get("address") if use_address else node["name"]
        if not isinstance(host, str) or not host:
            raise InputError(f"sinfo --json: nodes[{i}] ({node['name']}) has no address")
        out.append(host)
    return out


def nodes_from_text(text: str) -> list[str]:
    """GPU nodes from ``sinfo -N -h -o '%N %G'`` (a header line, if present, is skipped)."""
    out = []
    lines = text.splitlines()
    if len(lines) > MAX_NODES + 1:
        raise InputError(f"sinfo lists more than {MAX_NODES} nodes")
    for number, line in enumerate(lines, 1):
        fields = line.split()
        if not fields or (number == 1 and fields[0] == "NODELIST"):
            continue
        if len(fields) < 2:
            raise InputError(f"sinfo text line {number}: expected `NODE GRES`, got {line[:80]!r}")
        if has_gpu(fields[1]):
            out.append(fields[0])
    return out


def targets(hosts: list[str], port: int) -> list[dict[str, object]]:
    """One file_sd group of every host, sorted and without repeats (a node in two
    partitions is listed twice by ``sinfo -N``)."""
    for host in hosts:
        if not _HOST.match(host):
            raise InputError(f"not a host name: {host[:80]!r}")
    # an IPv6 address needs brackets before the port
    names = sorted({f"[{h}]:{port}" if ":" in h and not h.startswith("[") else f"{h}:{port}"
                    for h in hosts})
    return [{"targets": names, "labels": {}}] if names else []


def write_atomically(path: Path, text: str) -> bool:
    """Write text to path through a rename, so Prometheus never reads half a file.
    Returns False when the file already holds text (its mtime is kept)."""
    try:
        if path.read_text() == text:
            return False
    except (FileNotFoundError, UnicodeDecodeError):
        pass
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return True


def read_input(args: argparse.Namespace) -> str:
    if args.input:
        with open(args.input, "rb") as f:
            data = f.read(MAX_INPUT_BYTES + 1)
    else:
        cmd = [args.sinfo, "--json"] if args.format == "json" else [args.sinfo, "-N", "-h", "-o", "%N %G"]
        try:
            done = subprocess.run(cmd, capture_output=True, timeout=args.timeout, check=False)
        except (OSError, subprocess.TimeoutExpired) as err:
            raise InputError(f"{' '.join(cmd)}: {err}") from None
        if done.returncode != 0:
            last = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no message"]
            raise InputError(f"{' '.join(cmd)} exited {done.returncode}: {last[0][:200]}")
        data = done.stdout
    if len(data) > MAX_INPUT_BYTES:
        raise InputError(f"sinfo output is over {MAX_INPUT_BYTES} bytes")
    return data.decode(errors="replace")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="-", help="file_sd JSON file to write (default: stdout)")
    parser.add_argument("--port", type=int, default=9874, help="gpufleet's port on the nodes")
    parser.add_argument("--format", choices=["json", "text"], default="json",
                        help="sinfo --json (default) or sinfo -N -h -o '%%N %%G' text")
    parser.add_argument("--input", help="read this saved sinfo output instead of running sinfo")
    parser.add_argument("--sinfo", default="sinfo", help="sinfo command (default: from PATH)")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds sinfo may run")
    parser.add_argument("--address", action="store_true",
                        help="target each node's NodeAddr rather than its NodeName (json only)")
    args = parser.parse_args(argv)
    if not 0 < args.port < 65536:
        parser.error(f"--port: must be 1-65535, got {args.port}")
    try:
        text = read_input(args)
        hosts = nodes_from_json(text, args.address) if args.format == "json" else nodes_from_text(text)
        doc = json.dumps(targets(hosts, args.port), indent=2) + "\n"
    except (InputError, OSError) as err:
        print(f"sinfo_targets: {err}", file=sys.stderr)
        return 1
    if args.out == "-":
        sys.stdout.write(doc)
    else:
        write_atomically(Path(args.out), doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
