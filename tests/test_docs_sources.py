"""docs/sources.md: the example source runs exactly as written, with one registry line.

The module and the registry entry are taken from the document's code blocks and
run in a fresh interpreter: the entry is added to ``SOURCES`` before
``exporter.config`` is imported, as if it were written in the file, and the source
is then configured from YAML, built and collected the way ``gpufleet serve`` does.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

from tests.helpers import REPO, family_example

DOC = REPO / "docs" / "sources.md"

RUN = r"""
import asyncio, json, sys, types
from exporter.sources import SOURCES, Registered

module = types.ModuleType("exporter.sources.jsonfile")
sys.modules[module.__name__] = module
exec(compile({module!r}, "docs/sources.md", "exec"), module.__dict__)
SOURCES.update(eval("{{" + {entry!r} + "}}", {{"Registered": Registered}}))

from exporter.config import ConfigError, describe, load
from exporter.exposition import render_text
from exporter.cli.serve import assemble, enabled_sources

out = {{"help": [line for line in describe() if "jsonfile" in line]}}
try:
    load({bad!r})
except ConfigError as exc:
    out["bad"] = str(exc)
config = load({good!r})
out["enabled"] = enabled_sources(config)
collector, _, _ = assemble(config, out["enabled"], clock=lambda: 1_760_000_000.0, timer=lambda: 0.0)

async def collect(text):
    with open({gpus!r}, "w") as handle:
        handle.write(text)
    snapshot = await collector.collect()
    return {{"metrics": render_text(snapshot).decode(),
             "gpus": [[g.node, g.index, g.stale] for g in snapshot.gpus],
             "status": [[s.source, s.up, s.error] for s in snapshot.sources]}}

async def main():
    out["listed"] = await collect({listed!r})
    out["broken"] = await collect("[{{not json")
    out["empty"] = await collect("[]")
    await collector.close()

asyncio.run(main())
print(json.dumps(out))
"""


def example() -> tuple[str, str]:
    """The two code blocks of "Adding a source": the module, and its registry entry."""
    section = DOC.read_text().split("## Adding a source", 1)[1].split("\n## ", 1)[0]
    module, entry = re.findall(r"```python\n(.*?)```", section, re.S)
    return module, entry


def test_the_example_source_is_about_thirty_lines_and_names_no_status():
    module, entry = example()
    code = [line for line in module.splitlines() if line.strip()]
    assert len(code) <= 40
    assert "SourceStatus" not in module and "perf_counter" not in module and "except" not in module
    assert entry.strip().startswith('"jsonfile": Registered(')


def test_the_example_source_runs_as_written(tmp_path):
    module, entry = example()
    gpus = tmp_path / "gpus.json"
    good = tmp_path / "good.yaml"
    good.write_text(f"sources:\n  sim: {{enabled: false}}\n"
                    f"  jsonfile: {{enabled: true, path: '{gpus}', pool: gpu-test}}\n"
                    "analysis: {enabled: false}\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text("sources:\n  jsonfile: {pool: 3}\n")
    listed = json.dumps([{"node": "n1", "index": i, "model": "H100", "uuid": f"GPU-{i}"}
                         for i in range(2)] + [{"node": "n2", "index": 0, "model": "L4"}])
    script = RUN.format(module=module, entry=entry, bad=str(bad), good=str(good), gpus=str(gpus),
                        listed=listed)
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)

    assert out["enabled"] == ["jsonfile"]
    assert "  sources.jsonfile: GPUs listed in a JSON file." in out["help"]
    assert "  sources.jsonfile.pool = '': Pool of every GPU in it." in out["help"]
    assert out["bad"] == "sources.jsonfile.pool: must be a string, got 3"

    listed_out = out["listed"]
    assert listed_out["gpus"] == [["n1", 0, False], ["n1", 1, False], ["n2", 0, False]]
    assert listed_out["status"] == [["jsonfile", True, ""]]
    metrics = listed_out["metrics"]
    assert 'gpufleet_source_up{source="jsonfile"} 1.0' in metrics
    assert ('gpufleet_gpu_info{architecture="",driver_version="",gpu="1",model="H100",node="n1",'
            'pci_bus_id="",pool="gpu-test",uuid="GPU-1",vbios_version=""} 1.0') in metrics
    assert 'gpufleet_node_info{architecture="",gpus="2",model="H100",node="n1",pool="gpu-test"} 1.0' \
        in metrics

    # a file it cannot parse fails the read: the last good list is served, stale
    broken = out["broken"]
    assert broken["gpus"] == [["n1", 0, True], ["n1", 1, True], ["n2", 0, True]]
    assert broken["status"][0][:2] == ["jsonfile", False]
    assert broken["status"][0][2].startswith("JSONDecodeError")
    # an empty list is NoData: down, and nothing served
    assert out["empty"]["gpus"] == []
    assert out["empty"]["status"] == [["jsonfile", False, "no data: " + str(gpus) + " lists no GPU"]]


FAMILY_RUN = r"""
import asyncio, json, sys, types
from exporter.sources import SOURCES, Registered

module = types.ModuleType("exporter.sources.jsonfile")
sys.modules[module.__name__] = module
exec(compile({module!r}, "docs/sources.md", "exec"), module.__dict__)
SOURCES.update(eval("{{" + {entry!r} + "}}", {{"Registered": Registered}}))

from exporter.config import load
from exporter.exposition import render_text
from exporter.cli.serve import assemble, enabled_sources

config = load({good!r})
collector, _, _ = assemble(config, enabled_sources(config), clock=lambda: 1_760_000_000.0,
                           timer=lambda: 0.0)

async def main():
    snapshot = await collector.collect()
    await collector.close()
    return render_text(snapshot).decode()

print(json.dumps(asyncio.run(main())))
"""


def test_the_example_family_is_filled_by_the_example_source(tmp_path):
    """"Adding a family": the field, the catalogue entry and the source's line, as written,
    and the reserved memory a JSON file lists is on /metrics."""
    module, entry = example()
    gpus = tmp_path / "gpus.json"
    gpus.write_text(json.dumps([{"node": "n1", "index": 0, "model": "H100", "uuid": "GPU-0",
                                 "reserved_bytes": 536870912}, {"node": "n1", "index": 1, "model": "H100"}]))
    good = tmp_path / "good.yaml"
    good.write_text(f"sources:\n  sim: {{enabled: false}}\n"
                    f"  jsonfile: {{enabled: true, path: '{gpus}', pool: gpu-test}}\n"
                    "analysis: {enabled: false}\n")
    script = family_example.prelude() + FAMILY_RUN.format(
        module=family_example.with_source_line(module), entry=entry, good=str(good))
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    metrics = json.loads(done.stdout)
    name = family_example.FAMILY
    assert (f'{name}{{gpu="0",model="H100",node="n1",pool="gpu-test",uuid="GPU-0"}} 5.36870912e+08\n'
            in metrics)
    assert f'{name}{{gpu="1",' not in metrics  # not listed: absent, never 0
    assert f"# TYPE {name} gauge\n" in metrics
