"""Pure parsers for Slurm's output: hostlists, GRES index lists, ``squeue``/``sinfo --json``
and ``scontrol show job|node -d -o`` text.

Both formats parse into the same records (:class:`SlurmNode`, :class:`SlurmJob`), and
:func:`to_snapshot` turns those into a :class:`FleetSnapshot`, so the JSON path and the
text fallback can be proved equal on the same cluster (``tests/test_slurm_parse.py``
does it on ``data/slurm-samples/``).

Formats this understands, all seen in Slurm 22.05 (Debian 12):

- hostlists ``gpu-[001-004]``, ``gpu-[005,008]``, ``rack[1-2]-gpu[01-02]``, comma-joined;
- GRES ``gpu:h200:8``, ``gpu:h200:6(IDX:0-5)``, ``gpu:h100:8(S:0-1)``, ``gpu(IDX:0,2-3)``,
  ``gpu:h200:0(IDX:N/A)``, several comma-separated;
- TRES requests ``gres:gpu:h200:2`` (22.05) and ``gres/gpu:h200=2`` (23.02 and later);
- numbers wrapped as ``{"set": true, "number": N}`` and states as lists (OpenAPI 0.0.39+),
  so a newer ``squeue --json`` still parses.
"""

from __future__ import annotations

import datetime as dt
import itertools
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from exporter.errors import one_line
from exporter.gpu_catalogue import Catalogue
from exporter.snapshot import (
    Allocation,
    FleetSnapshot,
    Gpu,
    Interruption,
    JobRequest,
    Node,
    Placement,
)
from exporter.sources import job_hints


class SlurmParseError(ValueError):
    """Slurm's output is not what we expect; the message says what and where."""


# Hostlists and index lists are ranges a few characters long: "n[0-999999999]" was a
# billion names, and "n[0-99]x[0-99]y[0-99]" a million. The largest Slurm clusters have
# tens of thousands of nodes, and a node's CPU ids some thousands.
MAX_EXPANDED = 100_000
# GPUs one node's GRES may give it, over all its entries: the largest chassis hold 72, and
# the snapshot's layout is one record per GPU (``gpu:h200:99999999999`` would have been that
# many, and ``gpu:h100:1024`` written 2,000 times on one line 2,048,000)
MAX_GRES_GPUS = 1024


# Slurm keeps a job's restart count in 16 bits (job_record_t.restart_cnt)
MAX_RESTARTS = 2 ** 16 - 1

# Jobs in these states hold their nodes' GPUs and CPUs (COMPLETING: until the epilog ends).
HOLDING_STATES = frozenset({"RUNNING", "COMPLETING", "SUSPENDED", "CONFIGURING", "STOPPED"})


# -- hostlists and index lists ------------------------------------------------------------


def _split_top(text: str, sep: str = ",") -> list[str]:
    """Split on ``sep`` outside brackets and parentheses: ``a[1,3],b`` -> ``a[1,3]``, ``b``."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char in "[(":
            depth += 1
        elif char in "])":
            depth -= 1
        elif char == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def expand_ranges(text: str) -> list[str]:
    """``001-003,007`` -> ``['001', '002', '003', '007']``, keeping zero padding."""
    out: list[str] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        low, dash, high = part.partition("-")
        if not dash:
            out.append(low)
            continue
        # ASCII digits only: "²".isdigit() is True and int() refuses it
        if not ((low + high).isascii() and low.isdigit() and high.isdigit()) or int(high) < int(low):
            raise SlurmParseError(f"bad range {part[:40]!r}")
        if len(out) + int(high) - int(low) >= MAX_EXPANDED:
            raise SlurmParseError(f"range {part[:40]!r}: more than {MAX_EXPANDED} items")
        width = len(low) if low.startswith("0") else 0
        out += [f"{n:0{width}d}" for n in range(int(low), int(high) + 1)]
    return out


_BRACKET = re.compile(r"\[([^\]]*)\]")


def expand_hostlist(text: str) -> list[str]:
    """Slurm hostlist to names: ``gpu-[006-007],cpu1`` -> ``gpu-006, gpu-007, cpu1``."""
    if text in ("", "(null)", "None", "N/A"):
        return []
    names: list[str] = []
    for item in _split_top(text):
        pieces = _BRACKET.split(item)  # literal, ranges, literal, ranges, ...
        choices = [[p] if i % 2 == 0 else expand_ranges(p) for i, p in enumerate(pieces)]
        if len(names) + math.prod(map(len, choices)) > MAX_EXPANDED:
            raise SlurmParseError(f"hostlist {item[:40]!r}: more than {MAX_EXPANDED} names")
        names += ["".join(combo) for combo in itertools.product(*choices)]
    return names


def expand_index_list(text: str) -> tuple[int, ...]:
    """A GRES IDX list: ``0,2-3`` -> ``(0, 2, 3)``; ``N/A`` -> ``()``."""
    if text.strip() in ("", "N/A"):
        return ()
    items = expand_ranges(text)
    if not all(i.isascii() and i.isdigit() for i in items):
        raise SlurmParseError(f"bad index list {text[:40]!r}")
    return tuple(int(i) for i in items)


def count_cpu_ids(text: str) -> int:
    """``CPU_IDs=1-8,12`` -> 9."""
    return len(expand_index_list(text))


# -- GRES and TRES strings -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Gres:
    name: str  # "gpu"
    type: str  # "h200", "" when untyped
    count: int
    indices: tuple[int, ...] | None = None  # IDX list when Slurm gave one


_GRES = re.compile(
    r"^(?P<body>[^()]+)(?:\((?P<extra>[^)]*)\))?$"
)


def parse_gres(text: str) -> list[Gres]:
    """``gpu:h200:2(IDX:0-1),gpu:a100:1(IDX:3)`` -> one :class:`Gres` per entry.

    Each entry is ``name[:type][:count][(S:sockets|IDX:indices)]``; IDX comes last and may
    itself hold commas (``IDX:0,2-3``).
    """
    if text in ("", "(null)", "N/A"):
        return []
    out = []
    gpus = expanded = 0  # over the whole string: one node's GRES (or one job's on one node)
    for item in _split_top(text):
        if item.startswith(("gres:", "gres/")):
            item = item[5:]
        match = _GRES.match(item)
        if match is None:
            raise SlurmParseError(f"bad GRES {item[:40]!r}")
        pieces = match.group("body").split(":")
        extra = match.group("extra") or ""
        indices = expand_index_list(extra.split("IDX:", 1)[1]) if "IDX:" in extra else None
        expanded += len(indices or ())
        if expanded > MAX_EXPANDED:
            raise SlurmParseError(f"GRES {text[:40]!r}: more than {MAX_EXPANDED} indices")
        name, gres_type, count = pieces[0], "", None
        rest = pieces[1:]
        if rest and rest[-1].isascii() and rest[-1].isdigit():
            count = int(rest.pop())
        if rest:
            gres_type = rest[0]
        if count is None:
            count = len(indices) if indices is not None else 1
        if name == "gpu" and count > MAX_GRES_GPUS:
            raise SlurmParseError(f"GRES {item[:40]!r}: more than {MAX_GRES_GPUS} GPUs")
        if name == "gpu":
            gpus += count
            if gpus > MAX_GRES_GPUS:
                raise SlurmParseError(f"GRES {text[:40]!r}: more than {MAX_GRES_GPUS} GPUs "
                                      "on one node")
        out.append(Gres(name, gres_type, count, indices))
    return out


def parse_tres_gpus(text: str) -> list[Gres]:
    """GPU requests of a TRES string: ``gres:gpu:h200:2`` (22.05), ``gres/gpu:h200=2`` and
    ``gres/gpu=2`` (23.02+). Other GRES (shards, licenses) are ignored."""
    if text in ("", "(null)", "N/A"):
        return []
    out = []
    for item in _split_top(text):
        body = item[5:] if item.startswith(("gres:", "gres/")) else item
        if "=" in body:
            body, _, amount = body.rpartition("=")
            body = f"{body}:{amount}"
        pieces = body.split(":")
        if pieces[0] != "gpu":
            continue
        rest = pieces[1:]
        count = int(rest.pop()) if rest and rest[-1].isascii() and rest[-1].isdigit() else 1
        out.append(Gres("gpu", rest[0] if rest else "", count))
    return out


# -- records -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SlurmNode:
    name: str
    cpus: int
    partitions: tuple[str, ...]
    gres: tuple[Gres, ...]  # configured GRES (all names; GPUs are the name "gpu")
    state: str  # lower case base state: idle, mixed, allocated, down, drain...
    responding: bool = True
    threads_per_core: int = 1
    drained: bool = False  # the DRAIN flag (drained or draining), whatever the base state

    @property
    def up(self) -> bool:
        return self.responding and self.state not in ("down", "future", "unknown")


@dataclass(frozen=True, slots=True)
class NodeShare:
    """The part of a running job on one node."""

    node: str
    gpus: tuple[int, ...]
    gpu_types: tuple[str, ...]  # GRES types held there, e.g. ("h200",)
    cpus: int


@dataclass(frozen=True, slots=True)
class SlurmJob:
    job_id: str
    state: str  # upper case, e.g. RUNNING, PENDING
    partition: str
    user: str = ""
    account: str = ""
    qos: str = ""
    priority: int = 0
    submit_time: float | None = None
    start_time: float | None = None
    node_count: int = 1
    tasks: int = 1
    cpus: int = 0
    nodes: tuple[NodeShare, ...] = ()
    gpus_per_job: tuple[Gres, ...] = ()
    gpus_per_node: tuple[Gres, ...] = ()
    gpus_per_task: tuple[Gres, ...] = ()
    reason: str = ""
    comment: str = ""  # sbatch --comment: where a site states a job's memory need (job_hints)
    # times Slurm requeued the job (a preemption under PreemptMode=REQUEUE, an operator's
    # scontrol requeue, a node failure); a requeued job is PENDING again, its SubmitTime the
    # moment of the requeue (Slurm 22.05 clears PreemptTime then)
    restarts: int = 0
    suspend_time: float | None = None  # a SUSPENDED job's (PreemptMode=SUSPEND, scontrol suspend)

    def requested_gpus(self) -> int:
        """GPUs the job asked for in total, whichever way it asked."""
        total = sum(g.count for g in self.gpus_per_job)
        total += sum(g.count for g in self.gpus_per_node) * max(self.node_count, 1)
        total += sum(g.count for g in self.gpus_per_task) * max(self.tasks, 1)
        return total

    def requested_types(self) -> tuple[str, ...]:
        types = [g.type for g in (*self.gpus_per_job, *self.gpus_per_node, *self.gpus_per_task)]
        return tuple(dict.fromkeys(t for t in types if t))


OnError = Callable[[str], None] | None


def _each(items: Iterable[Any], parse: Callable[[Any], Any], on_error: OnError, what: str) -> list:
    """Parse every record; with ``on_error`` a bad record is reported and skipped, so one
    odd job never hides the others. Without it the first bad record raises."""
    out = []
    for item in items:
        try:
            out.append(parse(item))
        # OverflowError: float() of a 400-digit integer, or a time before year 1 in this zone
        except (SlurmParseError, KeyError, ValueError, TypeError, AttributeError, OverflowError) as exc:
            message = f"{what}: skipped a record: {type(exc).__name__}: {exc}"
            if on_error is None:
                raise SlurmParseError(message) from None
            on_error(message)
    return out


# -- JSON ------------------------------------------------------------------------------------


def _num(value: Any) -> Any:
    """OpenAPI 0.0.39+ wraps numbers as ``{"set": bool, "infinite": bool, "number": n}``."""
    if isinstance(value, Mapping):
        if not value.get("set", True) or value.get("infinite"):
            return None
        return value.get("number")
    return value


def _time(value: Any) -> float | None:
    number = _num(value)
    if not number:  # Slurm writes 0 for "not yet"
        return None
    return float(number)


def _state(value: Any) -> str:
    if isinstance(value, list):
        return str(value[0]) if value else ""
    return str(value or "")


def _json_errors(data: Mapping[str, Any], what: str) -> None:
    # squeue/sinfo --json exit 0 even when slurmctld is unreachable; the failure is only in
    # "errors" (seen on 22.05: {"error": "Unspecified error", "source": "slurm_load_jobs"})
    errors = data.get("errors") or []
    if errors:
        first = errors[0] if isinstance(errors, list) else errors
        text = (first.get("description") or first.get("error")) if isinstance(first, Mapping) else None
        raise SlurmParseError(f"{what}: Slurm reported an error: {one_line(str(text or first)[:200])}")


def _load_json(text: str, what: str, key: str) -> Mapping[str, Any]:
    """The output as JSON, with ``key`` a list; SlurmParseError for anything else."""
    import json

    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SlurmParseError(f"{what}: not JSON ({exc.msg} at char {exc.pos})") from None
    except (ValueError, RecursionError) as exc:  # a 4,300-digit integer; 1,000 nested arrays
        raise SlurmParseError(f"{what}: not JSON ({type(exc).__name__})") from None
    if not isinstance(data, Mapping) or key not in data:
        raise SlurmParseError(f"{what}: no '{key}' in the output")
    _json_errors(data, what)
    if not isinstance(data[key], list):
        raise SlurmParseError(f"{what}: '{key}' is not a list")
    return data


def _allocated_nodes(job: Mapping[str, Any]) -> list[tuple[str, int]]:
    """(node, CPUs) for each allocated node, in the order ``gres_detail`` pairs with."""
    resources = job.get("job_resources") or {}
    out = []
    legacy = resources.get("allocated_nodes")
    if isinstance(legacy, list):  # OpenAPI 0.0.38 (22.05)
        for entry in legacy:
            cores = 0
            for socket_ in (entry.get("sockets") or {}).values():
                for state in (socket_.get("cores") or {}).values():
                    if "allocated" in str(state).lower():
                        cores += 1
            out.append((entry["nodename"], cores))
        return out
    nodes = resources.get("nodes")
    if isinstance(nodes, Mapping):  # OpenAPI 0.0.40+ (23.11 and later)
        for entry in nodes.get("allocation") or []:
            cpus = entry.get("cpus") or {}
            out.append((entry["name"], int(_num(cpus.get("count")) or 0)))
    return out


def parse_squeue_json(
    text: str, threads: Mapping[str, int] | None = None, on_error: OnError = None
) -> list[SlurmJob]:
    """``squeue --json``. ``threads``: threads per core by node (from sinfo), because 22.05
    lists allocated *cores* per node while ``scontrol`` lists CPU ids (threads)."""
    data = _load_json(text, "squeue --json", "jobs")
    threads = threads or {}
    return _each(data["jobs"], lambda job: _job_from_json(job, threads), on_error, "squeue --json")


def _job_from_json(job: Mapping[str, Any], threads: Mapping[str, int]) -> SlurmJob:
    state = _state(job.get("job_state")).upper()
    shares: list[NodeShare] = []
    if state in HOLDING_STATES:
        details = job.get("gres_detail") or []
        for i, (node, cores) in enumerate(_allocated_nodes(job)):
            gres = parse_gres(details[i]) if i < len(details) else []
            gpus = [g for g in gres if g.name == "gpu"]
            indices = tuple(sorted(i for g in gpus for i in (g.indices or ())))
            cpus = cores * threads.get(node, 1)
            shares.append(NodeShare(node, indices, tuple(g.type for g in gpus if g.type), cpus))
    job_id = str(job["job_id"])
    array_task = _num(job.get("array_task_id"))
    if array_task is not None and _num(job.get("array_job_id")):
        job_id = f"{_num(job['array_job_id'])}_{array_task}"
    return SlurmJob(
        job_id=job_id,
        state=state,
        partition=str(job.get("partition") or "").split(",")[0],
        user=str(job.get("user_name") or ""),
        account=str(job.get("account") or ""),
        qos=str(job.get("qos") or ""),
        priority=int(_num(job.get("priority")) or 0),
        submit_time=_time(job.get("submit_time")),
        start_time=_time(job.get("start_time")) if state in HOLDING_STATES else None,
        node_count=int(_num(job.get("node_count")) or 1),
        tasks=int(_num(job.get("tasks")) or 1),
        cpus=int(_num(job.get("cpus")) or 0),
        nodes=tuple(shares),
        gpus_per_job=tuple(parse_tres_gpus(job.get("tres_per_job") or "")),
        gpus_per_node=tuple(parse_tres_gpus(job.get("tres_per_node") or "")),
        gpus_per_task=tuple(parse_tres_gpus(job.get("tres_per_task") or "")),
        reason=_null(str(job.get("state_reason") or "")),
        comment=str(job.get("comment") or "")[:job_hints.MAX_TEXT],
        restarts=_restarts(_num(job.get("restart_cnt"))),
        suspend_time=_time(job.get("suspend_time")) if state == "SUSPENDED" else None,
    )


def _restarts(value: Any) -> int:
    """Slurm's restart count; 0 for what is not a count (a hostile or odd record)."""
    if isinstance(value, str) and value.isascii() and value.isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        return 0
    return min(value, MAX_RESTARTS)


def parse_sinfo_json(text: str, on_error: OnError = None) -> list[SlurmNode]:
    # no "nodes": 23.02+ groups nodes per partition under "sinfo"; the text fallback covers it
    data = _load_json(text, "sinfo --json", "nodes")
    return _each(data["nodes"], _node_from_json, on_error, "sinfo --json")


def _node_from_json(node: Mapping[str, Any]) -> SlurmNode:
    states = node.get("state")
    flags = [str(f).upper() for f in (node.get("state_flags") or [])]
    if isinstance(states, list):  # 0.0.39+: ["MIXED", "DRAIN"]
        flags += [str(s).upper() for s in states[1:]]
        states = states[0] if states else ""
    return SlurmNode(
        name=node["name"],
        cpus=int(_num(node.get("cpus")) or 0),
        partitions=tuple(node.get("partitions") or ()),
        gres=tuple(parse_gres(node.get("gres") or "")),
        state=_base_state(str(states)),
        responding="NOT_RESPONDING" not in flags,
        threads_per_core=int(_num(node.get("threads")) or 1),
        drained="DRAIN" in flags or _drained(str(states)),
    )


def _drained(state: str) -> bool:
    """Whether a state string (``IDLE+DRAIN``, ``drng``, ``drained*``) carries the DRAIN flag."""
    parts = [p.rstrip("*~#!%$@^-").lower() for p in state.split("+")]
    return parts[0] in ("drain", "drained", "draining", "drng") or "drain" in parts[1:]


def _base_state(state: str) -> str:
    """``MIXED+DRAIN`` / ``down*`` -> ``mixed`` / ``down``."""
    return state.split("+")[0].rstrip("*~#!%$@^-").lower()


# -- scontrol text -----------------------------------------------------------------------------

_KEY = re.compile(r"^([A-Za-z][A-Za-z0-9_/:.]*)=(.*)$")


def _pairs(record: str) -> list[tuple[str, str]]:
    """``Key=value`` tokens of one record, in order. A token without ``=`` continues the
    previous value (``OS=Linux 6.1 #1 SMP``).

    Continuation words are gathered in a list and joined once: appending each to the
    value string copies it every time, and a 400 KB field of words cost 1.2 s."""
    pairs: list[tuple[str, list[str]]] = []
    for token in record.split():
        match = _KEY.match(token)
        if match:
            pairs.append((match.group(1), [match.group(2)]))
        elif pairs:
            pairs[-1][1].append(token)
    return [(key, " ".join(words)) for key, words in pairs]


def _records(text: str, first_key: str) -> list[str]:
    """Records of ``scontrol show`` output, one-line (``-o``) or multi-line alike."""
    records: list[list[str]] = []  # lines of each record, joined once (linear time)
    start = f"{first_key}="
    for line in text.splitlines():
        if line.startswith(start):
            records.append([line])
        elif records and line.strip():
            records[-1].append(line)
    return [" ".join(lines) for lines in records]


def _null(value: str) -> str:
    return "" if value in ("(null)", "N/A", "None") else value


def parse_text_time(value: str, tz: dt.tzinfo | None) -> float | None:
    """``2026-11-29T14:04:17`` in the controller's time zone; ``Unknown``/``None`` -> None."""
    if not value or not value[0].isdigit():
        return None
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError:
        raise SlurmParseError(f"bad time {value!r}") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=tz) if tz is not None else parsed.astimezone()
    return parsed.timestamp()


def parse_scontrol_jobs(
    text: str, tz: dt.tzinfo | None = None, on_error: OnError = None
) -> list[SlurmJob]:
    """``scontrol show job -d -o`` (or without ``-o``). ``tz``: the controller's time zone,
    which the text omits; None means this machine's."""
    return _each(_records(text, "JobId"), lambda r: _job_from_text(r, tz), on_error,
                 "scontrol show job")


_DETAIL_KEYS = {"Nodes", "CPU_IDs", "Mem", "GRES"}


def _job_from_text(record: str, tz: dt.tzinfo | None) -> SlurmJob:
    pairs = _pairs(record)
    fields: dict[str, str] = {}
    details: list[dict[str, str]] = []
    for key, value in pairs:
        if key == "Nodes":
            details.append({"Nodes": value})
        elif details and key in _DETAIL_KEYS and key not in details[-1]:
            details[-1][key] = value
        else:
            fields.setdefault(key, value)
    state = fields.get("JobState", "").upper()
    shares: list[NodeShare] = []
    if state in HOLDING_STATES:
        for detail in details:
            gpus = [g for g in parse_gres(detail.get("GRES", "")) if g.name == "gpu"]
            indices = tuple(sorted(i for g in gpus for i in (g.indices or ())))
            cpus = count_cpu_ids(detail.get("CPU_IDs", ""))
            for node in expand_hostlist(detail["Nodes"]):
                shares.append(NodeShare(node, indices, tuple(g.type for g in gpus if g.type), cpus))
    job_id = fields.get("JobId", "")
    if fields.get("ArrayTaskId") and fields.get("ArrayJobId"):
        job_id = f"{fields['ArrayJobId']}_{fields['ArrayTaskId']}"
    user = fields.get("UserId", "")
    return SlurmJob(
        job_id=job_id,
        state=state,
        partition=fields.get("Partition", "").split(",")[0],
        user=_null(user.split("(")[0]),
        account=_null(fields.get("Account", "")),
        qos=_null(fields.get("QOS", "")),
        priority=int(fields.get("Priority", "0") or 0),
        submit_time=parse_text_time(fields.get("SubmitTime", ""), tz),
        start_time=parse_text_time(fields.get("StartTime", ""), tz) if state in HOLDING_STATES
        else None,
        node_count=int(fields.get("NumNodes", "1").split("-")[0] or 1),
        tasks=int(fields.get("NumTasks", "1") or 1),
        cpus=int(fields.get("NumCPUs", "0").split("-")[0] or 0),
        nodes=tuple(shares),
        gpus_per_job=tuple(parse_tres_gpus(fields.get("TresPerJob", ""))),
        gpus_per_node=tuple(parse_tres_gpus(fields.get("TresPerNode", ""))),
        gpus_per_task=tuple(parse_tres_gpus(fields.get("TresPerTask", ""))),
        reason=_null(fields.get("Reason", "")),
        comment=_null(fields.get("Comment", ""))[:job_hints.MAX_TEXT],
        restarts=_restarts(fields.get("Restarts", "0")[:8]),
        suspend_time=parse_text_time(fields.get("SuspendTime", ""), tz) if state == "SUSPENDED"
        else None,
    )


def parse_scontrol_nodes(text: str, on_error: OnError = None) -> list[SlurmNode]:
    """``scontrol show node -d -o`` (or without ``-o``)."""
    return _each(_records(text, "NodeName"), _node_from_text, on_error, "scontrol show node")


def _node_from_text(record: str) -> SlurmNode:
    fields: dict[str, str] = {}
    for key, value in _pairs(record):
        fields.setdefault(key, value)
    raw_state = fields.get("State", "")
    return SlurmNode(
        name=fields["NodeName"],
        cpus=int(fields.get("CPUTot", "0") or 0),
        partitions=tuple(p for p in _null(fields.get("Partitions", "")).split(",") if p),
        gres=tuple(parse_gres(_null(fields.get("Gres", "")))),
        state=_base_state(raw_state),
        responding="*" not in raw_state.split("+")[0] and "NOT_RESPONDING" not in raw_state,
        threads_per_core=int(fields.get("ThreadsPerCore", "1") or 1),
        drained=_drained(raw_state),
    )


# -- to a snapshot -------------------------------------------------------------------------------


def gpu_layout(node: SlurmNode) -> list[str]:
    """GRES type of each GPU index of the node. Slurm numbers a node's GPUs across all
    types in gres.conf order, so ``gpu:h100:4,gpu:a100:4`` is h100 at 0-3, a100 at 4-7."""
    types: list[str] = []
    for gres in node.gres:
        if gres.name == "gpu":
            types += [gres.type] * gres.count
    return types


def to_snapshot(
    taken_at: float,
    nodes: Iterable[SlurmNode],
    jobs: Iterable[SlurmJob],
    model_of: Mapping[str, str],
    catalogue: Catalogue,
    qos_priorities: Mapping[str, int] = job_hints.DEFAULT_QOS_PRIORITIES,
) -> FleetSnapshot:
    """Inventory, allocations and demand as one snapshot.

    A job's priority is its QOS's on gpufleet's scale (``qos_priorities``), not Slurm's
    queue order (:func:`exporter.sources.job_hints.slurm_priority` says why).

    ``model_of`` maps GRES types to catalogue names (``h200`` -> ``H200``); a type it lacks is
    looked up in the catalogue as is, and an untyped GPU is reported with model ``unknown``.
    Nodes without GPU GRES are left out: they hold no GPU and would only add noise.
    """

    def model(gres_type: str) -> str:
        if not gres_type:
            return "unknown"
        return model_of.get(gres_type) or catalogue.resolve(gres_type)

    out_nodes: list[Node] = []
    out_gpus: list[Gpu] = []
    known: set[str] = set()
    for node in nodes:
        layout = gpu_layout(node)
        if not layout:
            continue
        known.add(node.name)
        pool = node.partitions[0] if node.partitions else ""
        node_model = model(layout[0])
        out_nodes.append(Node(node.name, node_model, float(node.cpus), pool,
                              catalogue.get(node_model).architecture, len(layout),
                              drained=node.drained))
        for index, gres_type in enumerate(layout):
            # Slurm knows no GPU UUID; a telemetry source supplies it when composed
            out_gpus.append(Gpu(node.name, index, "", model(gres_type), pool, up=node.up))

    allocations: list[Allocation] = []
    pending: list[JobRequest] = []
    for job in jobs:
        if job.state in HOLDING_STATES:
            placements = tuple(
                Placement(share.node, share.gpus, 1.0, float(share.cpus))
                for share in job.nodes if share.node in known
            )
            if not placements:
                continue
            hints = job_hints.from_comment(job.comment)
            allocations.append(Allocation(
                job=job.job_id, placements=placements,
                priority=job_hints.slurm_priority(job.qos, qos_priorities), qos=job.qos,
                user=job.user, account=job.account, start_time=job.start_time,
                last_checkpoint_time=hints.last_checkpoint_time,
                gpu_memory_need_bytes=hints.gpu_memory_need_bytes,
                allowed_models=tuple(model(t) for t in job.requested_types()),
                interrupted=Interruption("suspend", job.suspend_time)
                if job.state == "SUSPENDED" else None,
            ))
        elif job.state == "PENDING":
            gpus = job.requested_gpus()
            if gpus == 0:
                continue  # CPU-only demand is not GPU demand
            pending.append(JobRequest(
                job=job.job_id, gpu_count=gpus, cpus=float(job.cpus), node_count=job.node_count,
                models=tuple(model(t) for t in job.requested_types()), pool=job.partition,
                priority=job_hints.slurm_priority(job.qos, qos_priorities),
                submit_time=job.submit_time,
                last_checkpoint_time=job_hints.from_comment(job.comment).last_checkpoint_time,
                # requeued: Slurm set its SubmitTime to the requeue, the time it was stopped
                interrupted=Interruption("requeue", job.submit_time, job.restarts)
                if job.restarts else None,
            ))
    return FleetSnapshot(taken_at, tuple(out_nodes), tuple(out_gpus), tuple(allocations),
                         tuple(pending))


def node_threads(nodes: Sequence[SlurmNode]) -> dict[str, int]:
    return {n.name: n.threads_per_core for n in nodes}
