"""Bare metal and Slurm: the systemd units (deploy/systemd, deploy/file_sd) checked by the
real `systemd-analyze verify`, their configs loaded by gpufleet's own config loader, and
the file_sd generator run on the real Slurm 22.05 output in data/slurm-samples/."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from exporter import config
from tests.helpers import REPO

SYSTEMD = REPO / "deploy" / "systemd"
FILE_SD = REPO / "deploy" / "file_sd"
SAMPLES = REPO / "data" / "slurm-samples"
UNITS = [SYSTEMD / "gpufleet-node.service", SYSTEMD / "gpufleet-cluster.service",
         FILE_SD / "gpufleet-file-sd.service", FILE_SD / "gpufleet-file-sd.timer"]
SCRIPT = FILE_SD / "sinfo_targets.py"
# The paths the units name once installed, and what stands for them here: verify checks
# that ExecStart's program exists and is executable.
INSTALLED = {
    "/opt/gpufleet/bin/gpufleet": str(Path(sys.executable).parent / "gpufleet"),
    "/usr/local/bin/gpufleet-sinfo-targets": str(SCRIPT),
}
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
needs_systemd = pytest.mark.skipif(
    SYSTEMD_ANALYZE is None,
    reason="systemd-analyze is not installed (Debian's `systemd` package provides it)",
)


def unit_keys(path: Path) -> dict[str, list[str]]:
    """`Section.Key` -> every value, in order (keys such as LoadCredential repeat)."""
    out: dict[str, list[str]] = {}
    section = ""
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        out.setdefault(f"{section}.{key}", []).append(value)
    return out


def verify(tmp_path: Path, units: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`systemd-analyze verify` on the given unit texts, written side by side (a timer
    finds its service by name), with the installed program paths mapped to real files."""
    paths = []
    for name, text in units.items():
        for installed, here in INSTALLED.items():
            text = text.replace(installed, here)
        (tmp_path / name).write_text(text)
        paths.append(str(tmp_path / name))
    assert SYSTEMD_ANALYZE is not None
    return subprocess.run([SYSTEMD_ANALYZE, "verify", *paths], capture_output=True, text=True,
                          timeout=60, check=False)


@needs_systemd
def test_units_verify(tmp_path: Path) -> None:
    assert Path(INSTALLED["/opt/gpufleet/bin/gpufleet"]).exists()
    done = verify(tmp_path, {u.name: u.read_text() for u in UNITS})
    # verify exits 0 on unknown keys and bad values too, and says so on stderr
    assert (done.returncode, done.stderr, done.stdout) == (0, "", "")


@needs_systemd
def test_verify_catches_a_broken_unit(tmp_path: Path) -> None:
    """The check above can fail: a misspelt value and an unknown key are reported."""
    text = (SYSTEMD / "gpufleet-node.service").read_text()
    text = text.replace("ProtectSystem=strict", "ProtectSystem=strickt\nProtectSytem=strict")
    done = verify(tmp_path, {"gpufleet-node.service": text})
    assert "Failed to parse protect system value, ignoring: strickt" in done.stderr
    assert "Unknown key 'ProtectSytem' in section [Service], ignoring." in done.stderr


@pytest.mark.parametrize("unit", ["gpufleet-node.service", "gpufleet-cluster.service"])
def test_unit_hardening(unit: str) -> None:
    keys = unit_keys(SYSTEMD / unit)
    want = {
        "Service.User": ["gpufleet"],
        "Service.ProtectSystem": ["strict"],
        "Service.StateDirectory": ["gpufleet"],
        "Service.Restart": ["on-failure"],
        "Service.RestartPreventExitStatus": ["2"],
        "Service.NoNewPrivileges": ["yes"],
        "Service.CapabilityBoundingSet": [""],
        "Service.AmbientCapabilities": [""],
        "Service.WorkingDirectory": ["%S/gpufleet"],
    }
    assert {k: keys.get(k) for k in want} == want
    mode = "node" if "node" in unit else "cluster"
    assert keys["Service.ExecStart"] == [
        f"/opt/gpufleet/bin/gpufleet serve --config /etc/gpufleet/{mode}.yaml"]
    # NVML opens /dev/nvidia*: only the node unit may see devices
    assert keys["Service.PrivateDevices"] == ["no" if mode == "node" else "yes"]


def test_cluster_secrets_are_credentials() -> None:
    """The token and the webhook secret reach the cluster unit as credentials, and the
    config reads them where systemd puts them; no secret is in the unit or its environment."""
    keys = unit_keys(SYSTEMD / "gpufleet-cluster.service")
    assert keys["Service.LoadCredential"] == [
        "advisor-token:/etc/gpufleet/credentials/advisor-token",
        "webhook-secret:/etc/gpufleet/credentials/webhook-secret",
    ]
    assert "Service.Environment" not in keys and "Service.EnvironmentFile" not in keys
    cfg = config.load(SYSTEMD / "cluster.yaml")
    run = "/run/credentials/gpufleet-cluster.service"
    assert cfg.advisor.token_file == f"{run}/advisor-token"
    assert [r.secret_file for r in cfg.advisor.receivers] == [f"{run}/webhook-secret"]
    # the outbox in the StateDirectory, which survives restarts
    assert cfg.advisor.outbox == "/var/lib/gpufleet/gpufleet-outbox.sqlite"
    assert (cfg.sources.slurm.enabled, cfg.sources.prometheus.enabled, cfg.sources.sim.enabled) == (
        True, True, False)


def test_node_config_loads() -> None:
    cfg = config.load(SYSTEMD / "node.yaml")
    assert (cfg.sources.nvml.enabled, cfg.sources.sim.enabled, cfg.analysis.enabled,
            cfg.advisor.enabled) == (True, False, False, False)


def test_sysusers_declares_the_unit_user() -> None:
    lines = [ln for ln in (SYSTEMD / "gpufleet.sysusers").read_text().splitlines()
             if ln and not ln.startswith("#")]
    assert lines == ['u gpufleet - "gpufleet GPU exporter" /var/lib/gpufleet']


# --- the file_sd generator, on real sinfo output ---------------------------------------

GPU_NODES = [f"gpu-00{i}:9874" for i in range(1, 9)]


def run_script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=60, check=False)


def test_file_sd_from_sinfo_json() -> None:
    done = run_script("--input", str(SAMPLES / "sinfo.json"))
    assert (done.returncode, done.stderr) == (0, "")
    assert json.loads(done.stdout) == [{"targets": GPU_NODES, "labels": {}}]


def test_file_sd_from_sinfo_text() -> None:
    """`sinfo -N -o '%N %G ...'` text (here with its header and a CPU column)."""
    done = run_script("--format", "text", "--input", str(SAMPLES / "sinfo_N_G_C.txt"), "--port", "9100")
    assert (done.returncode, done.stderr) == (0, "")
    assert json.loads(done.stdout) == [{"targets": [t.replace("9874", "9100") for t in GPU_NODES],
                                        "labels": {}}]


def test_file_sd_address_and_cpu_nodes(tmp_path: Path) -> None:
    """--address targets NodeAddr (all 127.0.0.1 in the sample: one target); a node without
    a GPU GRES is left out; the file is written whole and rewritten only on a change."""
    doc = json.loads((SAMPLES / "sinfo.json").read_text())
    doc["nodes"][0]["gres"] = "(null)"
    doc["nodes"][1]["gres"] = "tmpfs:10,gpu:a100:4(S:0-1)"
    sample = tmp_path / "sinfo.json"
    sample.write_text(json.dumps(doc))
    out = tmp_path / "targets.json"
    assert run_script("--input", str(sample), "--out", str(out)).returncode == 0
    assert json.loads(out.read_text()) == [{"targets": GPU_NODES[1:], "labels": {}}]
    done = run_script("--input", str(sample), "--address")
    assert json.loads(done.stdout) == [{"targets": ["127.0.0.1:9874"], "labels": {}}]


@pytest.mark.parametrize(("text", "error"), [
    ("{", "sinfo_targets: sinfo --json output is not JSON: Expecting property name enclosed in "
          "double quotes: line 1 column 2 (char 1)\n"),
    ('{"nodes": 3}', "sinfo_targets: sinfo --json output has no `nodes` list\n"),
    ('{"nodes": [{"name": "a/b", "gres": "gpu:1"}]}', "sinfo_targets: not a host name: 'a/b'\n"),
])
def test_file_sd_bad_input(tmp_path: Path, text: str, error: str) -> None:
    sample = tmp_path / "sinfo.json"
    sample.write_text(text)
    done = run_script("--input", str(sample))
    assert (done.returncode, done.stdout, done.stderr) == (1, "", error)


def test_file_sd_sinfo_missing(tmp_path: Path) -> None:
    missing = tmp_path / "sinfo"
    done = run_script("--sinfo", str(missing))
    assert (done.returncode, done.stderr) == (
        1, f"sinfo_targets: {missing} --json: [Errno 2] No such file or directory: '{missing}'\n")


@pytest.mark.slow
def test_file_sd_from_a_real_slurm(tmp_path: Path) -> None:
    """The script runs the real `sinfo --json` (and the text form) of Debian's Slurm 22.05
    on loopback: the same 8 GPU nodes as the captured samples."""
    from tests.helpers.servers import require_binary
    from tests.helpers.slurm_cluster import BINARIES, SlurmCluster

    for binary in BINARIES:
        require_binary(binary)  # `make test` installs them (slurm-deps): missing is broken, not a skip
    if os.geteuid() != 0:
        pytest.fail("the Slurm fixture runs slurmd as root, as in CI; run the tests as root")
    cluster = SlurmCluster(tmp_path / "slurm")
    try:
        cluster.start()
        for fmt in ("json", "text"):
            out = tmp_path / f"targets-{fmt}.json"
            done = subprocess.run([sys.executable, str(SCRIPT), "--format", fmt, "--out", str(out)],
                                  capture_output=True, text=True, timeout=60, env=cluster.env,
                                  check=False)
            assert (done.returncode, done.stderr) == (0, "")
            assert json.loads(out.read_text()) == [{"targets": GPU_NODES, "labels": {}}]
    finally:
        cluster.stop()
