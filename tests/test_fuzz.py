"""Hypothesis fuzzers over every parser of outside input (issue 14, Build 7).

Each parser raises only the error its module documents, and what it accepts is within
the bounds it promises:

| parser | documented error | examples |
|---|---|---|
| config, from YAML text (``yamlfile.parse_mapping`` + ``config.build``) | ConfigError | 1,000 |
| config, from mappings (``config.build``) | ConfigError | 1,000 |
| web config files (``webconfig.parse``) | ConfigError | 1,000 |
| basic auth headers (``webconfig.parse_basic``) | none: None for a bad one | 1,000 |
| exposition text (``exposition_parser.parse_text``) | none: it never raises | 1,000 |
| dcgm bodies (``dcgm.parse_body``, ``BodyParser`` with caps) | none; OverCap with caps | 1,000 |
| dcgm targets files (``dcgm.parse_targets_file``) | ValueError | 500 |
| ``squeue --json`` / ``sinfo --json`` | SlurmParseError | 1,000 |
| ``scontrol show job`` / ``node`` text | SlurmParseError | 1,000 |
| hostlists, GRES and TRES strings | SlurmParseError | 1,000 |
| ``POST /v1/alerts`` bodies (``bounds.alertmanager_from_body``) | bounds.Invalid | 1,000 |
| ``POST /v1/plan`` bodies (``bounds.snapshot_from_body``), then the what-if | bounds.Invalid | 400 |

Of the 400 plan bodies, 223 pass the bounds and reach the what-if, and 58 of those get a
plan (1-5 migrations), checked against the documented Advice and plan schemas.

The examples are drawn under the suite's profile (tests/conftest.py: derandomized, so
the same every run); GPUFLEET_HYPOTHESIS=explore draws new ones. 10,900 examples in all,
about 30 s of CPU on one core.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import json
import math
import typing
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from exporter import config as config_module
from exporter.advisor import bounds
from exporter.advisor.advise import plan_settings
from exporter.advisor.api import _dumps
from exporter.advisor.engine import Advisor, DecisionSettings
from exporter.advisor.openapi import advice_schema, document
from exporter.advisor.planner import plan_compaction
from exporter.advisor.service import AdvisorService
from exporter.advisor.store import Store
from exporter.advisor.webhook import Deliverer
from exporter.advisor.wire import what_if_json
from exporter.analysis.analyzer import LiveAnalyzer
from exporter.analysis.options import AnalysisConfig, ShapeConfig
from exporter.config import AdvisorConfig, Config, ConfigError
from exporter.options import Duration
from exporter.sources.dcgm import fields as dcgm_fields
from exporter.sources.dcgm.exposition_parser import parse_text
from exporter.sources.dcgm.fields import OverCap
from exporter.sources.dcgm.source import BodyParser, Target, parse_body, parse_targets_file
from exporter.sources.gpu_models import unknown_model
from exporter.sources.slurm.parse import (
    MAX_EXPANDED,
    MAX_GRES_GPUS,
    SlurmJob,
    SlurmNode,
    SlurmParseError,
    expand_hostlist,
    parse_gres,
    parse_scontrol_jobs,
    parse_scontrol_nodes,
    parse_sinfo_json,
    parse_squeue_json,
    parse_tres_gpus,
)
from exporter.web import webconfig
from exporter.yamlfile import parse_mapping

# -- hostile scalars, shared by every fuzzer -------------------------------------------------

NUMBERS = st.one_of(
    st.integers(min_value=-(2 ** 70), max_value=2 ** 70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 1, -1, 64, 65, 10 ** 9, 1e400, -0.0, 1e-320, 2 ** 63, 10 ** 25]),
)
TEXT = st.one_of(
    st.text(max_size=20),
    st.sampled_from(["", " ", "\u00a0", "\n", "nan", ".inf", "1e9", "-1", "0x10", "٣", "²", "5m",
                     "0s", "-5s", "1h30m", "NaN", "http://u:p@h:1/x", "host:99999", "[::1", "a" * 300]),
)
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, TEXT)
JSON_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(2 ** 70), 2 ** 70),
                         st.floats(allow_nan=False, allow_infinity=False), TEXT)
ANY_JSON = st.recursive(JSON_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(TEXT, inner, max_size=4)), max_leaves=12)


def _one_line_error(exc: BaseException) -> None:
    """The CLI prints the message as one line; a value is quoted short (errors.QUOTE_LIMIT)."""
    text = str(exc)
    assert "\n" not in text and len(text) < 2000, text[:300]


# -- config ------------------------------------------------------------------------------------


def _config_strategy(cls: type, depth: int = 0) -> st.SearchStrategy[dict[str, Any]]:
    """Mappings of ``cls``'s real keys (and a stray one) to hostile values, nested sections
    included, so the values reach every field's conversion and range check."""
    hints = typing.get_type_hints(cls)
    values: dict[str, st.SearchStrategy[Any]] = {}
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp) and depth < 3:
            values[f.name] = st.one_of(_config_strategy(tp, depth + 1), SCALARS)
        else:
            values[f.name] = st.one_of(SCALARS, st.lists(SCALARS, max_size=3),
                                       st.dictionaries(TEXT, SCALARS, max_size=2))
    values["not_a_key"] = SCALARS
    return st.fixed_dictionaries({}, optional=values)


CONFIGS = _config_strategy(Config)


def _check_config(value: Any, cls: type, key: str = "") -> None:
    """Every accepted value within its field's declared range, and every duration finite."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        item, name = getattr(value, f.name), f"{key}.{f.name}".lstrip(".")
        if dataclasses.is_dataclass(hints[f.name]):
            _check_config(item, hints[f.name], name)
            continue
        meta = f.metadata
        if isinstance(item, float):
            assert math.isfinite(item), name
        if isinstance(item, Duration):
            assert item >= 0, name
        if isinstance(item, int | float) and not isinstance(item, bool):
            assert item >= meta.get("min", item) and item <= meta.get("max", item), (name, item)
            if "exclusive_min" in meta:
                assert item > meta["exclusive_min"], (name, item)
        if "choices" in meta:
            assert item in meta["choices"], (name, item)


def _build_config(data: Any) -> None:
    try:
        built = config_module.build(Config, data)
    except ConfigError as exc:
        _one_line_error(exc)
        return
    _check_config(built, Config)


@settings(max_examples=1000)
@given(CONFIGS)
def test_config_from_mappings(data):
    _build_config(data)


YAML_SNIPPETS = st.sampled_from([
    "listen: &a [*a]\n",  # an alias inside its own anchor
    "a: &a [x, x]\nb: &b [*a, *a]\nc: &c [*b, *b]\nd: [*c, *c]\nlisten: *d\n",
    "collect_interval: .nan\n", "collect_interval: .inf\n", "collect_interval: -.inf\n",
    "gzip_level: 9\ngzip_level: 1\n", "sources: {sim: {scale: 1000000}}\n",
    "listen: !!python/object/apply:os.system [true]\n", "? [a, b]\n: c\n", "[" * 200,
    "listen: \"\\uD800\"\n", "\ufeffcluster: x\n", "cluster: \x00\n", "<<: {listen: x}\n",
    "advisor: {receivers: [{url: 'not a url'}]}\n", "web: {max_connections: 1e99}\n",
])


def _yaml_text(data: dict[str, Any]) -> str:
    return yaml.safe_dump(data, allow_unicode=True)


YAML_TEXTS = st.one_of(
    st.text(max_size=200),
    CONFIGS.filter(lambda d: all(isinstance(k, str) for k in d)).map(_yaml_text),
    YAML_SNIPPETS,
    st.tuples(YAML_SNIPPETS, CONFIGS.map(_yaml_text)).map("".join),
)


@settings(max_examples=1000)
@given(YAML_TEXTS)
def test_config_from_yaml_text(text):
    try:
        data = parse_mapping(text, "fuzz.yaml", ConfigError, empty_ok=True)
    except ConfigError as exc:
        _one_line_error(exc)
        assert str(exc).startswith("fuzz.yaml: ")
        return
    _build_config(data)


def _section(keys: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({}, optional={key: st.one_of(
        SCALARS, st.lists(SCALARS, max_size=3), st.dictionaries(TEXT, SCALARS, max_size=2)) for key in keys})


BCRYPT = "$2b$04$gpufleetTestSaltOnly1.wfqSax00a4PPolBXtwq/aFn5TJjvaum"
WEB_CONFIGS = st.one_of(st.fixed_dictionaries({}, optional={
    "tls_server_config": st.one_of(SCALARS, _section([
        "cert_file", "key_file", "cert", "key", "client_auth_type", "client_ca_file", "client_ca",
        "min_version", "max_version", "cipher_suites", "curve_preferences", "client_allowed_sans",
        "prefer_server_cipher_suites"])),
    "http_server_config": st.one_of(SCALARS, _section(["http2", "headers"])),
    "basic_auth_users": st.one_of(SCALARS, st.dictionaries(TEXT, st.one_of(
        SCALARS, st.sampled_from([BCRYPT, "$2y$99$" + "a" * 53, "$2b$04$short"])), max_size=3)),
    "rate_limit": st.one_of(SCALARS, _section(["interval", "burst"])), "unknown": SCALARS,
}).map(_yaml_text), st.text(max_size=100), YAML_SNIPPETS)


@settings(max_examples=1000)
@given(WEB_CONFIGS)
def test_web_config_files(tmp_path_factory, text):
    try:
        webconfig.parse(text, "web.yml", tmp_path_factory.getbasetemp())
    except ConfigError as exc:
        _one_line_error(exc)
        assert str(exc).startswith("web.yml: "), str(exc)


@settings(max_examples=1000)
@given(st.one_of(st.text(max_size=60), st.text(max_size=30).map("Basic ".__add__),
                 st.binary(max_size=40).map(lambda b: "Basic " + base64.b64encode(b).decode())))
def test_basic_auth_headers(header):
    # every request's Authorization header under basic_auth_users: None, or a user and password
    parsed = webconfig.parse_basic(header)
    assert parsed is None or all(isinstance(part, bytes) for part in parsed)


# -- exposition text and dcgm bodies ---------------------------------------------------------

DCGM_NAMES = st.sampled_from([*dcgm_fields.GPU_FIELDS, "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_XID_ERRORS",
                              "node_cpu_seconds_total", "x", "DCGM_"])
LABEL_NAMES = st.sampled_from([*dcgm_fields.UUID_LABELS, *dcgm_fields.INDEX_LABELS,
                               *dcgm_fields.NODE_LABELS, *dcgm_fields.MODEL_LABELS,
                               *dcgm_fields.PCI_LABELS, *dcgm_fields.NAMESPACE_LABELS,
                               *dcgm_fields.POD_LABELS, dcgm_fields.MIG_ID_LABEL,
                               dcgm_fields.MIG_PROFILE_LABEL, "container", "le", "0bad"])
LABEL_VALUES = st.one_of(st.sampled_from(["0", "1", "7", "63", "64", "-1", "GPU-a", "GPU-b", "n1",
                                          "1g.10gb", "7g.80gb", "99999999999999999999", "1e3", "٣",
                                          'q"uote', "back\\slash", "new\nline", ""]), st.text(max_size=8))
SAMPLE_VALUES = st.one_of(st.sampled_from(["0", "1", "-1", "NaN", "+Inf", "-Inf", "1e400", "80000",
                                           "9.223372036854775807e18", "0x10", "", "1_000"]),
                          st.floats().map(repr), st.text(max_size=6))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@st.composite
def exposition_lines(draw) -> str:
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return draw(st.text(max_size=40))  # garbage
    if kind == 1:
        return draw(st.sampled_from(["# HELP x y", "# TYPE x gauge", "#", "", "x{", 'x{a="b"', "x{}",
                                     'x{a="\\"} 1', "x 1 2 3", "{} 1", 'x{a="b",} 1', 'x{,a="b"} 1']))
    labels = draw(st.lists(st.tuples(LABEL_NAMES, LABEL_VALUES), max_size=6))
    body = ",".join(f'{k}="{_escape(v) if draw(st.booleans()) else v}"' for k, v in labels)
    stamp = draw(st.sampled_from(["", " 1700000000000", " x"]))
    return f"{draw(DCGM_NAMES)}{{{body}}} {draw(SAMPLE_VALUES)}{stamp}"


EXPOSITION = st.lists(exposition_lines(), max_size=30).map("\n".join)


@settings(max_examples=1000)
@given(EXPOSITION)
def test_exposition_parser_never_raises(text):
    result = parse_text(text)  # documented: never raises, counts what it skips
    lines = len(text.splitlines())
    assert 0 <= result.errors <= lines and len(result.samples) + result.errors <= lines
    for name, labels, value in result.samples:
        assert isinstance(name, str) and name and isinstance(value, float)
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items())


TARGET = Target("http://node-1:9400/metrics", "pool-a", "node-1")
MAX_GPUS = 4


@settings(max_examples=1000)
@given(EXPOSITION, st.sampled_from(["utf-8", "latin-1"]))
def test_dcgm_bodies_map_or_hit_a_cap(text, encoding):
    body = text.encode(encoding, errors="replace")
    fleet, skipped = parse_body(body, TARGET, unknown_model)  # no caps: never raises
    assert skipped >= 0
    capped = BodyParser(TARGET, unknown_model, max_lines=20, max_gpus=MAX_GPUS)
    try:
        capped.feed(body)
        fleet, _ = capped.finish()
    except OverCap:  # documented: a target over a cap is down with the reason
        return
    assert len(fleet.gpus) <= MAX_GPUS
    for gpu in fleet.gpus:
        for value in (gpu.utilization_ratio, gpu.temperature_celsius, gpu.power_watts,
                      gpu.memory_used_bytes, gpu.memory_total_bytes, gpu.energy_joules):
            assert value is None or math.isfinite(value), gpu
        assert len(gpu.mig) <= dcgm_fields.MAX_MIG_INSTANCES
    for node in fleet.nodes:
        assert 0 <= node.gpu_count <= bounds.MAX_GPUS_PER_NODE, node


TARGET_FILES = st.one_of(ANY_JSON, st.lists(st.fixed_dictionaries(
    {"targets": st.one_of(st.lists(st.one_of(TEXT, st.sampled_from(
        ["h:9400", "http://u:p@h:1/m", "ftp://h", "h:x", "h:99999", "http://[::1", "https://h/m?q=1"])),
        max_size=3), SCALARS)},
    optional={"labels": st.one_of(st.dictionaries(st.sampled_from(["pool", "x"]), SCALARS), SCALARS)}),
    max_size=3))


@settings(max_examples=500)
@given(TARGET_FILES)
def test_dcgm_targets_files(data):
    try:
        targets = parse_targets_file(data, "default", "targets.yaml")
    except ValueError as exc:  # documented: one line naming the entry
        _one_line_error(exc)
        assert str(exc).startswith("targets.yaml")
        return
    for target in targets:
        assert target.url.startswith(("http://", "https://")) and "@" not in target.url.split("/")[2]


# -- Slurm --------------------------------------------------------------------------------------

SLURM_TEXT = st.one_of(TEXT, st.sampled_from([
    "gpu:h200:8", "gpu:h200:6(IDX:0-5)", "gpu:h100:8(S:0-1)", "gpu(IDX:0,2-3)", "gpu:h200:0(IDX:N/A)",
    "gpu:a:1(IDX:9-1)", "gpu:a:1(IDX:0-99999999999)", "gpu:a:1(IDX:²)", "gres/gpu:h200=2", "gres:gpu:2",
    "gpu-[001-004]", "gpu-[005,008]", "rack[1-2]-gpu[01-02]", "n[0-999999999]", "n[1-", "n]0[",
    "n[0-99]x[0-99]y[0-99]", "(null)", "N/A", "gpu:99999999999999999999999", "0-7,12", "1-",
]))
SLURM_NUMBERS = st.one_of(NUMBERS.filter(lambda v: not isinstance(v, float) or math.isfinite(v)),
                          st.fixed_dictionaries({"set": st.booleans(), "infinite": st.booleans(),
                                                 "number": st.one_of(st.integers(-5, 2 ** 70), TEXT)}))
SLURM_VALUES = st.one_of(SLURM_NUMBERS, SLURM_TEXT, st.none(), st.lists(SLURM_TEXT, max_size=2), ANY_JSON)

SQUEUE_JOB = st.fixed_dictionaries({}, optional={
    "job_id": SLURM_VALUES, "job_state": st.one_of(st.sampled_from(["RUNNING", "PENDING", ["RUNNING"], []]),
                                                   SLURM_VALUES),
    "partition": SLURM_VALUES, "user_name": SLURM_VALUES, "priority": SLURM_VALUES,
    "submit_time": SLURM_VALUES, "start_time": SLURM_VALUES, "node_count": SLURM_VALUES,
    "tasks": SLURM_VALUES, "cpus": SLURM_VALUES, "tres_per_node": SLURM_VALUES,
    "tres_per_job": SLURM_VALUES, "gres_detail": st.one_of(st.lists(SLURM_TEXT, max_size=2), SLURM_VALUES),
    "array_job_id": SLURM_VALUES, "array_task_id": SLURM_VALUES,
    "job_resources": st.one_of(SLURM_VALUES, st.fixed_dictionaries({}, optional={
        "allocated_nodes": st.one_of(SLURM_VALUES, st.lists(st.fixed_dictionaries(
            {}, optional={"nodename": SLURM_VALUES, "sockets": ANY_JSON}), max_size=2)),
        "nodes": st.one_of(SLURM_VALUES, st.fixed_dictionaries({}, optional={
            "allocation": st.one_of(SLURM_VALUES, st.lists(st.fixed_dictionaries(
                {}, optional={"name": SLURM_VALUES, "cpus": ANY_JSON}), max_size=2))}))})),
})
SINFO_NODE = st.fixed_dictionaries({}, optional={
    "name": SLURM_VALUES, "state": SLURM_VALUES, "state_flags": SLURM_VALUES, "cpus": SLURM_VALUES,
    "partitions": SLURM_VALUES, "gres": SLURM_VALUES, "threads": SLURM_VALUES})
SLURM_JSON = st.one_of(
    st.fixed_dictionaries({}, optional={"jobs": st.one_of(st.lists(SQUEUE_JOB, max_size=3), SLURM_VALUES),
                                        "nodes": st.one_of(st.lists(SINFO_NODE, max_size=3), SLURM_VALUES),
                                        "errors": st.one_of(st.lists(ANY_JSON, max_size=2), SLURM_VALUES)}),
    ANY_JSON,
).map(json.dumps)
SLURM_JSON_TEXT = st.one_of(SLURM_JSON, st.text(max_size=50),
                            st.sampled_from(["[" * 5000, '{"jobs": [' + "1" * 5000 + "]}", "{}", "null"]))


def _slurm(parse, text: str, **kwargs) -> list:
    """The records, or [] after the documented SlurmParseError; the same with on_error set,
    where a bad record is reported and skipped and only a bad whole output raises."""
    reported: list[str] = []
    for on_error in (None, reported.append):
        try:
            records = parse(text, on_error=on_error, **kwargs)
        except SlurmParseError as exc:
            _one_line_error(exc) if on_error is None else None
            records = []
    assert all(isinstance(r, str) for r in reported)
    return records


@settings(max_examples=1000)
@given(SLURM_JSON_TEXT)
def test_slurm_json(text):
    _check_jobs(_slurm(parse_squeue_json, text))
    _check_nodes(_slurm(parse_sinfo_json, text))


def _check_jobs(jobs: list[SlurmJob]) -> None:
    for job in jobs:
        assert len(job.nodes) <= MAX_EXPANDED
        assert all(len(share.gpus) <= MAX_EXPANDED for share in job.nodes)


def _check_nodes(nodes: list[SlurmNode]) -> None:
    for node in nodes:  # the snapshot's layout makes one record per GPU a node's GRES gives
        assert all(g.count <= MAX_GRES_GPUS for g in node.gres if g.name == "gpu"), node


@st.composite
def scontrol_records(draw) -> str:
    keys = draw(st.lists(st.sampled_from([
        "JobId", "JobState", "Priority", "SubmitTime", "StartTime", "NumNodes", "NumTasks", "NumCPUs",
        "Nodes", "CPU_IDs", "GRES", "TresPerNode", "TresPerJob", "ArrayJobId", "ArrayTaskId", "UserId",
        "NodeName", "CPUTot", "Gres", "State", "ThreadsPerCore", "Partitions", "Reason"]), max_size=10))
    values = st.one_of(SLURM_TEXT, st.sampled_from([
        "RUNNING", "2026-11-29T14:04:17", "0001-01-01T00:00:00", "9999-12-31T23:59:59", "1-2", "Unknown",
        "DOWN*+DRAIN", "12-", "1e5"]))
    first = draw(st.sampled_from(["JobId", "NodeName"]))
    pairs = " ".join(f"{k}={draw(values)}" for k in keys)
    return f"{first}={draw(values)} {pairs}"


SCONTROL = st.one_of(st.lists(scontrol_records(), max_size=4).map("\n".join), st.text(max_size=80))


@settings(max_examples=1000)
@given(SCONTROL)
def test_slurm_scontrol_text(text):
    _check_jobs(_slurm(parse_scontrol_jobs, text))
    _check_nodes(_slurm(parse_scontrol_nodes, text))


@settings(max_examples=1000)
@given(SLURM_TEXT)
def test_slurm_hostlists_gres_and_tres(text):
    for parse in (expand_hostlist, parse_gres, parse_tres_gpus):
        try:
            parsed = parse(text)
        except SlurmParseError as exc:
            _one_line_error(exc)
            continue
        assert len(parsed) <= MAX_EXPANDED, parse
        if parse is parse_gres:  # a node's GPUs; TRES is a request, and a big one harms nothing
            assert all(g.count <= MAX_GRES_GPUS for g in parsed if g.name == "gpu")


# -- the advisor's POST bodies ----------------------------------------------------------------

DOC = document()
ALERTMANAGER = Draft202012Validator(bounds.alertmanager_schema())
LABELS = st.one_of(st.dictionaries(TEXT, st.one_of(TEXT, SCALARS), max_size=3), SCALARS)
ALERT = st.fixed_dictionaries({}, optional={
    "status": st.one_of(st.sampled_from(["firing", "resolved"]), SCALARS), "labels": LABELS,
    "annotations": LABELS, "startsAt": st.one_of(TEXT, SCALARS), "fingerprint": SCALARS,
    "extra": SCALARS})
ALERTMANAGER_BODIES = st.one_of(
    st.fixed_dictionaries({}, optional={
        "version": st.one_of(st.just("4"), SCALARS), "groupKey": st.one_of(TEXT, SCALARS),
        "status": st.one_of(st.sampled_from(["firing", "resolved"]), SCALARS),
        "alerts": st.one_of(st.lists(ALERT, max_size=3), SCALARS), "receiver": SCALARS,
        "groupLabels": LABELS, "commonLabels": LABELS, "truncatedAlerts": SCALARS,
        "externalURL": SCALARS}).map(lambda d: json.dumps(d).encode()),
    st.binary(max_size=40), st.sampled_from([b"[" * 100_000, b'{"a": ' + b"9" * 5000 + b"}",
                                             b'{"version": "4", "x": NaN}', b"\xff{}"]),
)


@settings(max_examples=1000)
@given(ALERTMANAGER_BODIES)
def test_alertmanager_bodies(body):
    try:
        payload = bounds.alertmanager_from_body(body)
    except bounds.Invalid as exc:  # documented: 400 with this one-line reason
        _one_line_error(exc)
        return
    assert ALERTMANAGER.is_valid(payload)
    assert isinstance(payload["groupKey"], str) and payload["groupKey"]
    assert all(isinstance(a["labels"].get("alertname", "?"), str) for a in payload["alerts"])


NODE_NAMES = st.sampled_from(["n1", "n2", "n3"])
MODELS = st.sampled_from(["H100", "H200", "A100", "B200", "unknown", ""])


def snapshots(hostile: bool) -> st.SearchStrategy[dict[str, Any]]:
    """Small fleets whose GPUs, placements and jobs name each other's nodes and indices.
    ``hostile``: any field may be any JSON scalar, and values sit on and past the limits
    (most such bodies are 400s); else every value is in range, so the body reaches the
    what-if."""

    def pick(*values: Any) -> st.SearchStrategy[Any]:
        return st.one_of(st.sampled_from(values), SCALARS) if hostile else st.sampled_from(values)

    def edge(*values: Any) -> tuple[Any, ...]:
        return values if hostile else ()

    index = st.integers(0, 9) if not hostile else st.one_of(st.integers(0, 9), pick(63, 64, -1))
    node = st.fixed_dictionaries({
        "name": NODE_NAMES, "model": MODELS, "cpu_cores": pick(0, 16, 192, *edge(-1, 1e7)),
        "pool": pick("p1", "p2"), "generation": st.just("hopper"),
        "gpu_count": pick(0, 1, 4, 8, 64, *edge(65, 10 ** 9))})
    gpu = st.fixed_dictionaries(
        {"node": NODE_NAMES, "index": index, "uuid": TEXT, "model": MODELS, "pool": pick("p1", "p2")},
        optional={"memory_total_bytes": pick(0, 80 * 2 ** 30, None), "up": pick(True, False),
                  "memory_used_bytes": pick(0, 2 ** 30, 2 ** 40, *edge(-1, 2 ** 61)),
                  "utilization_ratio": pick(0.0, 0.5, 1.0, None)})
    share = pick(1.0, 0.5, 0.25, 1e-9, *edge(0, 1.5))
    cpus = pick(0, 1, 8.5, 1e6, *edge(-1, 1e7))
    placement = st.fixed_dictionaries({"node": NODE_NAMES, "gpus": st.lists(index, max_size=4),
                                       "gpu_share": share, "cpus": cpus})
    allocation = st.fixed_dictionaries(
        {"job": st.sampled_from(["j1", "j2", "j3", ""]), "namespace": st.just("ns"), "pod": TEXT,
         "priority": st.integers(-(2 ** 63), 2 ** 63 - 1) if not hostile else pick(0, 2 ** 64),
         "placements": st.lists(placement, max_size=3)},
        optional={"start_time": pick(0, 1.7e9, None),
                  "gpu_memory_need_bytes": pick(0, 10 ** 11, None),
                  "allowed_models": st.lists(MODELS, max_size=2)})
    pending = st.fixed_dictionaries(
        {"job": TEXT, "gpu_count": pick(0, 1, 8, 20, *edge(-1)), "gpu_share": share, "cpus": cpus},
        optional={"node_count": pick(0, 1, 3), "models": st.lists(MODELS, max_size=2),
                  "pool": st.sampled_from(["p1", ""]), "priority": pick(-5, 0, 5)})
    extra = {"extra": SCALARS} if hostile else {}
    return st.fixed_dictionaries(
        {"taken_at": pick(0, 1.76e9, bounds.MAX_TIME, *edge(-1, "yesterday"))},
        optional={"nodes": st.lists(node, max_size=3, unique_by=lambda n: n["name"]),
                  "gpus": st.lists(gpu, max_size=8), "allocations": st.lists(allocation, max_size=4),
                  "pending": st.lists(pending, max_size=2), **extra})


@st.composite
def fragmented_fleets(draw) -> dict[str, Any]:
    """Whole nodes with jobs on some of their GPUs: a fragmentation index above 0, so the
    what-if plans (the small fleets above mostly answer decision none without planning)."""
    nodes, gpus, allocations = [], [], []
    for n in range(draw(st.integers(2, 6))):
        name, count = f"n{n}", draw(st.sampled_from([4, 8]))
        model, pool = draw(st.sampled_from([("H100", "p1"), ("H200", "p2"), ("A100", "p1")]))
        nodes.append({"name": name, "model": model, "cpu_cores": 128, "pool": pool,
                      "generation": "hopper", "gpu_count": count})
        gpus += [{"node": name, "index": i, "uuid": f"GPU-{n}-{i}", "model": model, "pool": pool,
                  "memory_total_bytes": 80 * 2 ** 30} for i in range(count)]
        free = list(range(count))
        for j in range(draw(st.integers(0, 3))):
            held = draw(st.lists(st.sampled_from(free), min_size=1, max_size=3, unique=True)) if free else []
            if not held:
                break
            free = [i for i in free if i not in held]
            allocations.append({
                "job": f"job-{n}-{j}", "namespace": draw(st.sampled_from(["a", "b"])), "pod": f"pod-{n}-{j}",
                "priority": draw(st.sampled_from([0, 10, 1000])),
                "start_time": draw(st.sampled_from([None, 1.7e9, 1.76e9 - 60])),
                "gpu_memory_need_bytes": draw(st.sampled_from([None, 10 ** 10, 9 * 10 ** 10, 2 * 10 ** 11])),
                "placements": [{"node": name, "gpus": sorted(held),
                                "gpu_share": draw(st.sampled_from([1.0, 0.5])),
                                "cpus": draw(st.sampled_from([0, 4, 16]))}]})
    pending = [{"job": "waiting", "gpu_count": draw(st.sampled_from([1, 8])), "gpu_share": 1.0, "cpus": 8}]
    return {"taken_at": 1.76e9, "nodes": nodes, "gpus": gpus, "allocations": allocations,
            "pending": draw(st.sampled_from([[], pending]))}


def _body(value: Any) -> bytes:
    return json.dumps(value).encode()


# half in range (they reach the what-if), half hostile
PLAN_BODIES = st.one_of(snapshots(hostile=False).map(_body), fragmented_fleets().map(_body),
                        snapshots(hostile=True).map(_body),
                        st.one_of(ANY_JSON.map(_body), st.binary(max_size=30)))

_ADVICE = Draft202012Validator({**advice_schema(), "components": DOC["components"]})
_SNAPSHOT = Draft202012Validator(bounds.snapshot_schema())


@pytest.fixture(scope="module")
def what_if():
    """The live server's what-if (AdvisorService.what_if, in the wire form POST /v1/plan
    answers), with the real planner, a trigger of
    0 so every fragmented snapshot is planned, and an outbox in memory (a what-if never
    writes it). The target workload is fixed (8-, 4- and 1-GPU tasks): the live window
    starts empty, and against no workload every index is 0 and nothing is planned."""
    settings_ = DecisionSettings(trigger=0.0, clear_below=-1.0, dwell_seconds=0, cooldown_seconds=0)
    planner = functools.partial(plan_compaction, settings=plan_settings(AdvisorConfig()))
    shapes = (ShapeConfig(cpus=8, gpus=8), ShapeConfig(cpus=4, gpus=4), ShapeConfig(cpus=1, gpus=1))
    service = AdvisorService(Advisor(settings_, clock=lambda: 1.76e9),
                             LiveAnalyzer.from_config(AnalysisConfig(workload="shapes", shapes=shapes)),
                             Deliverer(Store(":memory:"), ()), b"token", max_body_bytes=1 << 20,
                             planner=planner)
    return lambda snapshot: what_if_json(service.what_if(snapshot))


@settings(max_examples=400)
@given(body=PLAN_BODIES)
def test_plan_bodies_and_the_what_if(what_if, body):
    try:
        snapshot = bounds.snapshot_from_body(body)
    except bounds.Invalid as exc:  # documented: 400 with this one-line reason
        _one_line_error(exc)
        return
    assert _SNAPSHOT.is_valid(json.loads(body))
    assert len(snapshot.nodes) <= bounds.MAX_NODES
    assert all(0 <= n.gpu_count <= bounds.MAX_GPUS_PER_NODE for n in snapshot.nodes)
    assert all(0 <= g.index < bounds.MAX_GPUS_PER_NODE for g in snapshot.gpus)
    advice = what_if(snapshot)  # an exception here is the 500 POST /v1/plan would answer
    reply = json.loads(_dumps(advice))  # strict JSON: no NaN or Infinity
    assert sorted(f"{list(e.absolute_path)}: {e.message[:200]}" for e in _ADVICE.iter_errors(reply)) == []


# -- what the fuzzers found, pinned (each raised another error, or expanded without bound) ----


@pytest.mark.parametrize(("parse", "text", "reason"), [
    # TypeError, KeyError, AttributeError: "errors" not a list of objects
    (parse_squeue_json, '{"jobs": [], "errors": 5}', "squeue --json: Slurm reported an error: 5"),
    (parse_squeue_json, '{"jobs": [], "errors": {"0": 1}}',
     "squeue --json: Slurm reported an error: {'0': 1}"),
    (parse_sinfo_json, '{"nodes": [], "errors": ["down\\nnow"]}',
     "sinfo --json: Slurm reported an error: down\\nnow"),
    (parse_squeue_json, '{"jobs": null}', "squeue --json: 'jobs' is not a list"),  # TypeError
    (parse_squeue_json, "[" * 5000, "squeue --json: not JSON (RecursionError)"),
    (parse_squeue_json, '{"jobs": [' + "1" * 5000 + "]}", "squeue --json: not JSON (ValueError)"),
    (expand_hostlist, "n[0-999999999]", "range '0-999999999': more than 100000 items"),  # 1e9 names
    (expand_hostlist, "n[0-99]x[0-99]y[0-99]",
     "hostlist 'n[0-99]x[0-99]y[0-99]': more than 100000 names"),
    (expand_hostlist, "n[0-²]", "bad range '0-²'"),  # ValueError from int()
    (parse_gres, "gpu:a:1(IDX::)", "bad index list ':'"),  # ValueError from int()
    (parse_gres, "gpu:h200:99999999999", "GRES 'gpu:h200:99999999999': more than 1024 GPUs"),
])
def test_found_by_the_fuzzers_slurm(parse, text, reason):
    with pytest.raises(SlurmParseError) as caught:
        parse(text)
    assert str(caught.value) == reason


def test_found_by_the_fuzzers_a_bad_record_is_skipped_not_raised():
    # OverflowError (float() of a 400-digit number) escaped _each's skip-and-report
    reported: list[str] = []
    jobs = parse_squeue_json(json.dumps({"jobs": [{"job_id": 1, "submit_time": 10 ** 400},
                                                  {"job_id": 2}]}), on_error=reported.append)
    assert [job.job_id for job in jobs] == ["2"]
    assert reported == ["squeue --json: skipped a record: OverflowError: int too large to convert to float"]


def test_the_what_if_plans_a_fragmented_fleet(what_if):
    # the fixture's workload and trigger make the planner run: a fuzzer over a what-if that
    # only ever answered decision none would prove little about the planner
    nodes = [{"name": n, "model": "H100", "cpu_cores": 128, "pool": "p1", "generation": "hopper",
              "gpu_count": 8} for n in ("n0", "n1")]
    gpus = [{"node": n["name"], "index": i, "uuid": f"GPU-{n['name']}-{i}", "model": "H100", "pool": "p1"}
            for n in nodes for i in range(8)]
    allocations = [{"job": f"job-{n}", "namespace": "a", "pod": f"pod-{n}", "priority": 0,
                    "start_time": 1.7e9,
                    "placements": [{"node": n, "gpus": [3], "gpu_share": 1.0, "cpus": 4}]}
                   for n in ("n0", "n1")]
    advice = what_if(bounds.snapshot_from_body(_body(
        {"taken_at": 1.76e9, "nodes": nodes, "gpus": gpus, "allocations": allocations})))
    assert (advice["decision"], len(advice["plan"]["migrations"])) == ("compact", 1)
    assert _ADVICE.is_valid(json.loads(_dumps(advice)))
