"""exporter.options: declaring an option, and config.py assembling sources from the registry."""

from __future__ import annotations

import dataclasses
import doctest

import exporter.options
from exporter.config import Config, SourcesConfig
from exporter.options import Duration, opt
from exporter.sources import SOURCES


def test_the_module_example_runs():
    failed, tried = doctest.testmod(exporter.options)
    assert (failed, tried > 0) == (0, True)


def test_opt_carries_default_help_and_rules():
    @dataclasses.dataclass(frozen=True)
    class Options:
        timeout: Duration = opt(Duration(3), help="Per-target timeout.", exclusive_min=0)
        targets: tuple[str, ...] = opt(help="Endpoints.", factory=tuple)

    timeout, targets = dataclasses.fields(Options)
    assert timeout.default == 3.0 and dict(timeout.metadata) == {
        "help": "Per-target timeout.", "exclusive_min": 0}
    assert targets.default_factory is tuple and dict(targets.metadata) == {"help": "Endpoints."}


def test_sources_config_has_one_field_per_registered_source_typed_by_its_options():
    fields = dataclasses.fields(SourcesConfig)
    assert [f.name for f in fields] == list(SOURCES)
    for f in fields:
        assert f.type is SOURCES[f.name].options_class()
        assert f.metadata["help"] == SOURCES[f.name].help
        assert getattr(Config().sources, f.name) == f.type()
