"""Slurm parsers on literals and on real 22.05 output (data/slurm-samples/)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json

import pytest

from exporter.gpu_catalogue import default_catalogue
from exporter.snapshot import JobRequest, Placement
from exporter.sources.slurm.parse import (
    Gres,
    SlurmParseError,
    _pairs,
    _records,
    count_cpu_ids,
    expand_hostlist,
    expand_index_list,
    node_threads,
    parse_gres,
    parse_scontrol_jobs,
    parse_scontrol_nodes,
    parse_sinfo_json,
    parse_squeue_json,
    parse_tres_gpus,
    to_snapshot,
)
from tests.helpers import data_dir

SAMPLES = data_dir() / "slurm-samples"
MODELS = {"h200": "H200", "h100": "H100", "a100": "A100-80GB", "b200": "B200"}


def sample(name: str) -> str:
    path = SAMPLES / name
    if not path.exists():
        pytest.fail(f"{path} is missing: data/ is part of the repository (or set GPUFLEET_DATA)")
    return path.read_text()


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("gpu-001", ["gpu-001"]),
        ("gpu-[006-007]", ["gpu-006", "gpu-007"]),
        ("gpu-[005,008]", ["gpu-005", "gpu-008"]),
        ("gpu-[001-002,010]", ["gpu-001", "gpu-002", "gpu-010"]),
        ("gpu-[8-11]", ["gpu-8", "gpu-9", "gpu-10", "gpu-11"]),
        ("gpu-[098-101]", ["gpu-098", "gpu-099", "gpu-100", "gpu-101"]),
        ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
        ("a1,b[3-4],c", ["a1", "b3", "b4", "c"]),
        ("", []),
        ("(null)", []),
    ],
)
def test_hostlists_expand(text, names):
    assert expand_hostlist(text) == names


@pytest.mark.parametrize(
    ("text", "indices"),
    [("0", (0,)), ("0-1", (0, 1)), ("0,2-3", (0, 2, 3)), ("4-5,7", (4, 5, 7)), ("N/A", ())],
)
def test_index_lists_expand(text, indices):
    assert expand_index_list(text) == indices


def test_cpu_ids_count():
    assert count_cpu_ids("1-8") == 8
    assert count_cpu_ids("0,4-5,9") == 4


def test_bad_range_is_a_parse_error():
    with pytest.raises(SlurmParseError, match="bad range"):
        expand_hostlist("gpu-[9-3]")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("gpu:h200:8", [Gres("gpu", "h200", 8)]),
        ("gpu:h200:6(IDX:0-5)", [Gres("gpu", "h200", 6, (0, 1, 2, 3, 4, 5))]),
        ("gpu:h200:0(IDX:N/A)", [Gres("gpu", "h200", 0, ())]),
        ("gpu:h100:8(S:0-1)", [Gres("gpu", "h100", 8)]),
        ("gpu:3", [Gres("gpu", "", 3)]),
        ("gpu(IDX:0,2-3)", [Gres("gpu", "", 3, (0, 2, 3))]),
        ("gpu:tesla:3(IDX:0,2-3)", [Gres("gpu", "tesla", 3, (0, 2, 3))]),
        ("gpu:h100:2(IDX:0-1),gpu:a100:1(IDX:4)",
         [Gres("gpu", "h100", 2, (0, 1)), Gres("gpu", "a100", 1, (4,))]),
        ("gpu:h100:4(S:0),shard:8", [Gres("gpu", "h100", 4), Gres("shard", "", 8)]),
        ("(null)", []),
    ],
)
def test_gres_strings(text, expected):
    assert parse_gres(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("gres:gpu:h200:2", [Gres("gpu", "h200", 2)]),
        ("gres:gpu:3", [Gres("gpu", "", 3)]),
        ("gres/gpu:h100=4", [Gres("gpu", "h100", 4)]),  # 23.02+
        ("gres/gpu=2", [Gres("gpu", "", 2)]),
        ("gres:gpu", [Gres("gpu", "", 1)]),
        ("gres:shard:4", []),
        ("", []),
    ],
)
def test_tres_gpu_requests(text, expected):
    assert parse_tres_gpus(text) == expected


def _samples_json():
    nodes = parse_sinfo_json(sample("sinfo.json"))
    jobs = parse_squeue_json(sample("squeue.json"), node_threads(nodes))
    return nodes, jobs


def _samples_text(suffix: str):
    # the samples were captured on a machine running in UTC
    nodes = parse_scontrol_nodes(sample(f"scontrol_show_node_d{suffix}.txt"))
    jobs = parse_scontrol_jobs(sample(f"scontrol_show_job_d{suffix}.txt"), dt.UTC)
    return nodes, jobs


@pytest.mark.parametrize("suffix", ["_o", ""])  # one line per record, and the multi-line form
def test_text_parser_equals_json_parser_on_the_samples(suffix):
    json_nodes, json_jobs = _samples_json()
    text_nodes, text_jobs = _samples_text(suffix)
    assert len(json_nodes) == 8 and len(json_jobs) == 9
    assert text_nodes == json_nodes
    assert sorted(text_jobs, key=lambda j: j.job_id) == sorted(json_jobs, key=lambda j: j.job_id)
    catalogue = default_catalogue()
    assert to_snapshot(0.0, text_nodes, text_jobs, MODELS, catalogue) == \
        to_snapshot(0.0, json_nodes, json_jobs, MODELS, catalogue)


def test_samples_become_the_expected_snapshot():
    nodes, jobs = _samples_json()
    snapshot = to_snapshot(1.0, nodes, jobs, MODELS, default_catalogue())
    assert [(n.name, n.model, n.pool, n.cpu_cores, n.gpu_count) for n in snapshot.nodes][:1] == \
        [("gpu-001", "H200", "gpu-h200", 64.0, 8)]
    assert {n.model for n in snapshot.nodes} == {"H200", "H100"}
    assert len(snapshot.gpus) == 64 and all(g.uuid == "" for g in snapshot.gpus)
    placements = {a.job: a.placements for a in snapshot.allocations}
    assert placements == {
        "1": (Placement("gpu-001", (0, 1), 1.0, 1.0),),
        "2": (Placement("gpu-002", tuple(range(8)), 1.0, 1.0),),
        "3": (Placement("gpu-001", (2, 3, 4, 5), 1.0, 8.0),),  # -c 8
        "4": (Placement("gpu-005", (0,), 1.0, 1.0),),
        "5": (Placement("gpu-006", tuple(range(8)), 1.0, 1.0),  # -N 2, hostlist gpu-[006-007]
              Placement("gpu-007", tuple(range(8)), 1.0, 1.0)),
        "6": (Placement("gpu-005", (1, 2, 3), 1.0, 1.0),),  # untyped --gres=gpu:3
        "7": (Placement("gpu-003", (0, 1, 2), 1.0, 1.0),),  # --gpus=h200:3
        "8": (Placement("gpu-005", (4, 5), 1.0, 1.0),  # --gpus-per-node, gpu-[005,008]
              Placement("gpu-008", (0, 1), 1.0, 1.0)),
    }
    by_job = {a.job: a for a in snapshot.allocations}
    assert by_job["6"].allowed_models == ()
    assert by_job["1"].allowed_models == ("H200",)
    assert by_job["1"].start_time == 1795961057.0 and by_job["1"].user == "root"
    assert by_job["1"].priority == 0  # QOS (null): Slurm's 4294901759 is queue order (job_hints)
    assert snapshot.pending == (
        JobRequest("9", gpu_count=32, cpus=4.0, node_count=4, models=("H200",),
                   pool="gpu-h200", priority=0, submit_time=1795961054.0),
    )


def test_squeue_json_errors_fail_although_squeue_exits_0():
    # what squeue --json prints (exit status 0) when slurmctld is down, seen on 22.05
    text = json.dumps({"meta": {}, "errors": [{"description": "Failed while looking for jobs",
                                               "error_number": -1, "error": "Unspecified error",
                                               "source": "slurm_load_jobs"}], "jobs": []})
    with pytest.raises(SlurmParseError, match="Failed while looking for jobs"):
        parse_squeue_json(text)
    with pytest.raises(SlurmParseError, match="Unspecified error"):
        parse_sinfo_json(json.dumps({"errors": [{"error": "Unspecified error", "errno": -1}],
                                     "nodes": []}))


def test_not_json_is_one_clear_error():
    with pytest.raises(SlurmParseError, match="squeue --json: not JSON"):
        parse_squeue_json("slurm_load_jobs error: Unable to contact slurm controller")


def test_a_bad_record_is_skipped_and_reported_not_fatal():
    data = json.loads(sample("squeue.json"))
    data["jobs"][0]["job_resources"]["allocated_nodes"][0].pop("nodename")
    skipped: list[str] = []
    jobs = parse_squeue_json(json.dumps(data), on_error=skipped.append)
    assert len(jobs) == 8 and len(skipped) == 1 and "skipped a record" in skipped[0]
    with pytest.raises(SlurmParseError):
        parse_squeue_json(json.dumps(data))


def test_newer_openapi_wrapping_parses_the_same():
    """OpenAPI 0.0.39+ wraps numbers as {set, number} and states as lists."""
    data = json.loads(sample("squeue.json"))
    for job in data["jobs"]:
        for key in ("priority", "start_time", "submit_time", "node_count", "cpus", "tasks"):
            job[key] = {"set": True, "infinite": False, "number": job[key]}
        job["job_state"] = [job["job_state"]]
    nodes = parse_sinfo_json(sample("sinfo.json"))
    wrapped = parse_squeue_json(json.dumps(data), node_threads(nodes))
    assert wrapped == parse_squeue_json(sample("squeue.json"), node_threads(nodes))


def test_node_states():
    line = ("NodeName=gpu-009 CPUTot=32 Gres=gpu:a100:4 State=DOWN*+DRAIN ThreadsPerCore=2 "
            "Partitions=gpu-a100,debug")
    (node,) = parse_scontrol_nodes(line)
    assert (node.state, node.responding, node.up) == ("down", False, False)
    assert node.partitions == ("gpu-a100", "debug") and node.threads_per_core == 2
    (idle,) = parse_scontrol_nodes("NodeName=n1 CPUTot=8 Gres=gpu:2 State=IDLE+DRAIN")
    assert idle.up and idle.state == "idle"


def test_mixed_gpu_types_on_one_node_number_across_types():
    (node,) = parse_scontrol_nodes(
        "NodeName=n1 CPUTot=64 Gres=gpu:h100:2,gpu:a100:2 State=IDLE Partitions=mixed")
    snapshot = to_snapshot(0.0, [node], [], MODELS, default_catalogue())
    assert [(g.index, g.model) for g in snapshot.gpus] == [
        (0, "H100"), (1, "H100"), (2, "A100-80GB"), (3, "A100-80GB")]
    assert snapshot.nodes[0].model == "H100"


def test_unknown_gres_type_is_looked_up_and_untyped_is_unknown():
    nodes = parse_scontrol_nodes(
        "NodeName=a CPUTot=8 Gres=gpu:l40s:2 State=IDLE Partitions=p\n"
        "NodeName=b CPUTot=8 Gres=gpu:2 State=IDLE Partitions=p\n"
        "NodeName=c CPUTot=8 Gres=(null) State=IDLE Partitions=cpu\n")
    snapshot = to_snapshot(0.0, nodes, [], MODELS, default_catalogue())
    assert {g.node: g.model for g in snapshot.gpus} == {"a": "L40S", "b": "unknown"}
    assert [n.name for n in snapshot.nodes] == ["a", "b"]  # the CPU-only node is left out


def test_gpus_per_task_and_per_job_requests_count():
    line = ("JobId=12 UserId=alice(1000) Priority=5 Account=ml QOS=normal JobState=PENDING "
            "Reason=Priority Partition=gpu-h100,gpu-a100 SubmitTime=2026-01-01T00:00:00 "
            "StartTime=Unknown NumNodes=2-4 NumCPUs=16 NumTasks=4 TresPerTask=gres/gpu:h100=2")
    (job,) = parse_scontrol_jobs(line, dt.UTC)
    assert job.requested_gpus() == 8 and job.partition == "gpu-h100"
    assert (job.user, job.account, job.qos, job.node_count) == ("alice", "ml", "normal", 2)
    assert job.submit_time == dt.datetime(2026, 1, 1, tzinfo=dt.UTC).timestamp()


def test_cpu_only_jobs_hold_cpus_but_are_no_gpu_demand():
    nodes = parse_scontrol_nodes("NodeName=g1 CPUTot=64 Gres=gpu:h100:8 State=MIXED Partitions=p")
    jobs = parse_scontrol_jobs(
        "JobId=1 JobState=RUNNING Partition=p NumNodes=1 NumCPUs=4 NodeList=g1 "
        "Nodes=g1 CPU_IDs=0-3 Mem=0\n"
        "JobId=2 JobState=PENDING Partition=p NumNodes=1 NumCPUs=4\n", dt.UTC)
    snapshot = to_snapshot(0.0, nodes, jobs, MODELS, default_catalogue())
    assert snapshot.allocations[0].placements == (Placement("g1", (), 1.0, 4.0),)
    assert snapshot.pending == ()


def test_json_cores_count_threads_like_scontrol():
    data = json.loads(sample("squeue.json"))
    nodes = [dataclasses.replace(n, threads_per_core=2) for n in parse_sinfo_json(sample("sinfo.json"))]
    jobs = {j.job_id: j for j in parse_squeue_json(json.dumps(data), node_threads(nodes))}
    assert jobs["3"].nodes[0].cpus == 16


def test_a_jobs_comment_states_its_memory_need_and_last_checkpoint():
    # the samples' job 4 (--gres=gpu:h100:1), as if submitted with --comment: the JSON's
    # "comment" field and scontrol's Comment= (both empty in the capture) carry it
    comment = "gpu-memory-required=100Gi;last-checkpoint=1795961000"
    data = json.loads(sample("squeue.json"))
    for job in data["jobs"]:
        if job["job_id"] == 4:
            job["comment"] = comment
    text = sample("scontrol_show_job_d_o.txt").replace(
        "JobId=4 JobName=wrap ", f"JobId=4 JobName=wrap Comment={comment} ")
    nodes = parse_sinfo_json(sample("sinfo.json"))
    for jobs in (parse_squeue_json(json.dumps(data), node_threads(nodes)),
                 parse_scontrol_jobs(text, dt.UTC)):
        snapshot = to_snapshot(1.0, nodes, jobs, MODELS, default_catalogue())
        by_job = {a.job: a for a in snapshot.allocations}
        assert by_job["4"].gpu_memory_need_bytes == 100 * 2**30
        assert by_job["4"].last_checkpoint_time == 1795961000.0
        assert by_job["4"].allowed_models == ("H100",)  # the GRES type limits, it states no need
        assert by_job["1"].gpu_memory_need_bytes is None and by_job["1"].last_checkpoint_time is None


class _Piece(str):
    """A word or line of scontrol text that counts what is built from it piece by piece.

    ``value + " " + word`` or ``f"{value} {word}"`` (each word or line appended to the value
    so far, which copies the value every time: quadratic, a 2 MB field of words took about
    48 s) goes through one of these methods; ``" ".join(words)`` (one copy) through none."""

    built: list[str]

    def split(self, *args, **kwargs):  # type: ignore[override]
        return [_piece(w, self.built) for w in str.split(self, *args, **kwargs)]

    def splitlines(self, *args, **kwargs):  # type: ignore[override]
        return [_piece(w, self.built) for w in str.splitlines(self, *args, **kwargs)]

    def _count(self, how: str) -> None:
        self.built.append(how)

    def __add__(self, other):  # type: ignore[override]
        self._count("+")
        return str.__add__(self, other)

    def __radd__(self, other):
        self._count("+")
        return str.__add__(other, self)

    def __format__(self, spec):
        self._count("format")
        return str.__format__(self, spec)

    def __mod__(self, other):  # type: ignore[override]
        self._count("%")
        return str.__mod__(self, other)

    def __rmod__(self, other):  # type: ignore[misc]
        self._count("%")
        return str.__mod__(other, self)


def _piece(text: str, built: list[str]) -> _Piece:
    piece = _Piece(text)
    piece.built = built
    return piece


@pytest.mark.parametrize("multi_line", [False, True])
def test_a_huge_field_of_words_parses_in_linear_time(multi_line):
    """Issue 32, finding 10: each continuation word (or line) was appended to the value
    string, copying it every time: a 400 KB field cost 1.2 s, 2 MB about 30 s.

    The 2 MB field parses to the same node, and no word or line of it is appended to a value
    piece by piece (counted on the pieces themselves): each value is joined once."""
    line = sample("scontrol_show_node_d_o.txt").splitlines()[0]
    words = 300_000  # about 2 MB
    sep = "\n   " if multi_line else " "
    huge = line.replace(" OS=Linux", " OS=Linux" + sep.join([""] + ["word"] * words), 1)
    (node,) = parse_scontrol_nodes(huge)
    assert node.name == "gpu-001" and node.cpus == 64 and node.gres

    built: list[str] = []
    (record,) = _records(_piece(huge, built), "NodeName")
    assert record.split() == huge.split()
    pairs = dict(_pairs(_piece(record, built)))
    plain = dict(_pairs(line))
    assert pairs == {**plain, "OS": plain["OS"].replace("Linux", "Linux" + " word" * words, 1)}
    assert built == [], f"{len(built)} pieces appended one by one ({sorted(set(built))})"


def test_a_nodes_gpus_are_capped_over_all_its_gres_entries():
    """``gpu:h100:1024`` written 2,000 times on one line (29 kB) was 2,048,000 GPUs of one
    node: 32 s and 598 MB. Each entry was capped; their sum was not."""
    line = ",".join(["gpu:h100:1024"] * 2000)
    with pytest.raises(SlurmParseError) as caught:
        parse_gres(line)
    assert str(caught.value) == ("GRES 'gpu:h100:1024,gpu:h100:1024,gpu:h100:102': "
                                 "more than 1024 GPUs on one node")
    assert [g.count for g in parse_gres("gpu:h100:1000,gpu:a100:24")] == [1000, 24]  # at the cap
    indices = ",".join(["gpu:a:1(IDX:0-49999)"] * 3)  # each list under its cap, 150,000 in all
    with pytest.raises(SlurmParseError, match="more than 100000 indices"):
        parse_gres(indices)


def test_a_node_claiming_too_many_gpus_is_skipped_and_the_others_kept():
    good, bad = sample("scontrol_show_node_d_o.txt").splitlines()[:2]
    bad = bad.replace("Gres=gpu:h200:8", "Gres=" + ",".join(["gpu:h100:1024"] * 2000))
    skipped: list[str] = []
    nodes = parse_scontrol_nodes(f"{good}\n{bad}\n", on_error=skipped.append)
    assert [n.name for n in nodes] == ["gpu-001"]
    assert len(skipped) == 1 and "more than 1024 GPUs on one node" in skipped[0]
