"""The preemption watch (exporter/preemption/): each stop of a job counted once, by pool and
cause, with the work it lost since its last checkpoint; the GPU-seconds each pool delivered;
the stopped jobs waiting to resume. And what the sources say of a stop: Slurm's restart count
and suspend, read from scontrol text and squeue JSON as Slurm 22.05 writes them."""

from __future__ import annotations

import json

import pytest

from exporter import metrics
from exporter.gpu_catalogue import default_catalogue
from exporter.preemption.watch import CAUSES, PreemptionWatch, WatchSettings, lost_work
from exporter.snapshot import Allocation, FleetSnapshot, Interruption, JobRequest, Node, Placement
from exporter.sources.slurm.parse import Gres, SlurmNode, parse_scontrol_jobs, parse_squeue_json, to_snapshot

T0 = 1_800_000_000.0
NODES = (Node("gpu-008", "H100", 64.0, "gpu-h100", "hopper", 8),
         Node("gpu-001", "H200", 64.0, "gpu-h200", "hopper", 8))


def running(job: str = "spot-1", start: float = T0 - 2400, checkpoint: float | None = T0 - 600,
            node: str = "gpu-008", gpus: int = 8, interrupted: Interruption | None = None,
            namespace: str = "") -> Allocation:
    return Allocation(job, (Placement(node, tuple(range(gpus)), 1.0, 8.0),), namespace=namespace,
                      start_time=start, last_checkpoint_time=checkpoint, interrupted=interrupted)


def requeued(job: str = "spot-1", at: float = T0 + 30, count: int = 1,
             checkpoint: float | None = T0 - 600) -> JobRequest:
    # Slurm 22.05: the requeued job is PENDING, its SubmitTime the requeue, in its partition
    return JobRequest(job, 8, pool="spot", submit_time=at, last_checkpoint_time=checkpoint,
                      interrupted=Interruption("requeue", at, count))


def snap(at: float, allocations=(), pending=()) -> FleetSnapshot:
    return FleetSnapshot(at, NODES, (), tuple(allocations), tuple(pending))


def sample(watch: PreemptionWatch, name: str, **labels: str) -> float | None:
    for family in watch.families():
        if family.name == name:
            for got, value in family.samples:
                if dict(got) == labels:
                    return value
    return None


# -- the work a stop lost --------------------------------------------------------------------------

def test_a_job_stopped_after_40_minutes_with_a_checkpoint_at_30_lost_10_minutes():
    assert lost_work(T0 + 40 * 60, T0 + 30 * 60, T0, 900.0) == 600.0


def test_a_checkpoint_older_than_the_run_counts_from_the_run_start():
    # the run restored from it: the work before the run was saved
    assert lost_work(T0 + 600, T0 - 3600, T0, 900.0) == 600.0


def test_a_job_stating_no_checkpoint_lost_its_last_part_interval_or_its_whole_run():
    assert lost_work(T0 + 40 * 60, None, T0, 900.0) == 600.0  # 40 min mod 15
    assert lost_work(T0 + 40 * 60, None, T0, None) == 2400.0  # the site assumes none
    assert lost_work(T0 + 40 * 60, None, None, 900.0) is None  # neither known


def test_a_checkpoint_after_the_stop_loses_nothing():
    assert lost_work(T0, T0 + 5, T0 - 100, 900.0) == 0.0  # clocks apart by seconds


# -- counting -------------------------------------------------------------------------------------

def test_a_requeued_job_is_counted_once_with_its_lost_work_in_the_pool_it_ran_in():
    watch = PreemptionWatch(WatchSettings(checkpoint_interval=900.0))
    watch.observe(snap(T0, [running()]))
    view = watch.observe(snap(T0 + 60, pending=[requeued()]))
    assert len(view.stops) == 1
    stop = view.stops[0]
    # the pool of the nodes it ran on, not the partition it waits in
    assert (stop.pool, stop.cause, stop.time, stop.gpus) == ("gpu-h100", "requeue", T0 + 30, 8.0)
    assert stop.lost_seconds == 630.0  # requeued at T0+30, last checkpoint at T0-600
    assert sample(watch, metrics.PREEMPTIONS_TOTAL.name, pool="gpu-h100", cause="requeue") == 1
    assert sample(watch, metrics.PREEMPTION_LOST_GPU_SECONDS_TOTAL.name,
                  pool="gpu-h100", cause="requeue") == 630.0 * 8
    assert sample(watch, metrics.PREEMPTED_JOBS_WAITING.name, pool="gpu-h100",
                  cause="requeue") == 1
    job = {"job": "spot-1", "namespace": "", "pool": "gpu-h100", "cause": "requeue"}
    assert sample(watch, metrics.JOB_PREEMPTED_WAIT_SECONDS.name, **job) == 30.0
    assert sample(watch, metrics.JOB_PREEMPTION_LOST_SECONDS.name, **job) == 630.0

    # seen again: the same stop, not counted again; its wait grows
    view = watch.observe(snap(T0 + 120, pending=[requeued()]))
    assert view.stops == ()
    assert sample(watch, metrics.PREEMPTIONS_TOTAL.name, pool="gpu-h100", cause="requeue") == 1
    assert sample(watch, metrics.JOB_PREEMPTED_WAIT_SECONDS.name, **job) == 90.0

    # resumed: no longer waiting
    watch.observe(snap(T0 + 300, [running(start=T0 + 300, checkpoint=T0 - 600)]))
    assert sample(watch, metrics.PREEMPTED_JOBS_WAITING.name, pool="gpu-h100",
                  cause="requeue") == 0
    assert sample(watch, metrics.JOB_PREEMPTED_WAIT_SECONDS.name, **job) is None

    # requeued again (Restarts 2): a new stop; the checkpoint predates the run, so the run is lost
    view = watch.observe(snap(T0 + 900, pending=[requeued(at=T0 + 800, count=2)]))
    assert [(s.time, s.lost_seconds) for s in view.stops] == [(T0 + 800, 500.0)]
    assert sample(watch, metrics.PREEMPTIONS_TOTAL.name, pool="gpu-h100", cause="requeue") == 2
    assert sample(watch, metrics.PREEMPTION_LOST_GPU_SECONDS_TOTAL.name,
                  pool="gpu-h100", cause="requeue") == (630.0 + 500.0) * 8


def test_a_start_slurm_rewrites_while_the_requeued_job_completes_is_not_a_new_run():
    # Slurm 22.05, polled through a preemption (squeue --json every 50 ms): RUNNING, then
    # COMPLETING with Restarts 1 and StartTime the requeue, then PENDING with SubmitTime it
    watch = PreemptionWatch(WatchSettings(checkpoint_interval=None))
    watch.observe(snap(T0, [running(start=T0 - 2400, checkpoint=None)]))
    # completing, listed without its GPUs (gres_detail empty) as squeue --json lists it
    watch.observe(snap(T0 + 30, [running(start=T0 + 20, checkpoint=None, gpus=0)]))
    view = watch.observe(snap(T0 + 60, pending=[requeued(at=T0 + 20, checkpoint=None)]))
    assert [(s.lost_seconds, s.gpus) for s in view.stops] == [(2420.0, 8.0)]  # not 0, not 0 GPUs
    assert sample(watch, metrics.PREEMPTION_LOST_GPU_SECONDS_TOTAL.name,
                  pool="gpu-h100", cause="requeue") == 2420.0 * 8


def test_a_job_requeued_before_the_watch_saw_it_counts_its_stated_checkpoint_only():
    watch = PreemptionWatch()
    view = watch.observe(snap(T0 + 60, pending=[requeued(), requeued("other", checkpoint=None)]))
    by_job = {s.job: s for s in view.stops}
    assert by_job["spot-1"].lost_seconds == 630.0
    assert by_job["spot-1"].pool == "spot"  # never seen running: the partition it waits in
    assert by_job["other"].lost_seconds is None
    assert sample(watch, metrics.PREEMPTIONS_TOTAL.name, pool="spot", cause="requeue") == 2
    assert sample(watch, metrics.PREEMPTION_LOST_GPU_SECONDS_TOTAL.name,
                  pool="spot", cause="requeue") == 630.0 * 8
    assert sample(watch, metrics.JOB_PREEMPTION_LOST_SECONDS.name, job="other", namespace="",
                  pool="spot", cause="requeue") is None


def test_a_pod_being_preempted_is_counted_once_and_does_not_wait():
    watch = PreemptionWatch()
    watch.observe(snap(T0, [running("ns/train", namespace="ns")]))
    stopping = running("ns/train", namespace="ns",
                       interrupted=Interruption("preemption", T0 + 50))
    for at in (T0 + 60, T0 + 90):
        watch.observe(snap(at, [stopping]))
    assert sample(watch, metrics.PREEMPTIONS_TOTAL.name, pool="gpu-h100", cause="preemption") == 1
    assert sample(watch, metrics.PREEMPTION_LOST_GPU_SECONDS_TOTAL.name, pool="gpu-h100",
                  cause="preemption") == 650.0 * 8
    assert sample(watch, metrics.PREEMPTED_JOBS_WAITING.name, pool="gpu-h100",
                  cause="preemption") == 0
    weird = running("ns/b", namespace="ns", interrupted=Interruption("SomethingNew", T0))
    watch.observe(snap(T0 + 120, [weird]))
    assert sample(watch, metrics.PREEMPTIONS_TOTAL.name, pool="gpu-h100", cause="other") == 1


def test_a_suspended_job_waits_and_delivers_nothing():
    watch = PreemptionWatch()
    watch.observe(snap(T0, [running()]))
    paused = running(interrupted=Interruption("suspend", T0 + 10))
    watch.observe(snap(T0 + 60, [paused]))
    watch.observe(snap(T0 + 120, [paused]))
    assert sample(watch, metrics.PREEMPTIONS_TOTAL.name, pool="gpu-h100", cause="suspend") == 1
    assert sample(watch, metrics.PREEMPTED_JOBS_WAITING.name, pool="gpu-h100",
                  cause="suspend") == 1
    # 8 GPUs worked T0..T0+60; suspended from then on
    assert sample(watch, metrics.POOL_DELIVERED_GPU_SECONDS_TOTAL.name, pool="gpu-h100") == 480.0


def test_delivered_gpu_seconds_count_a_long_gap_as_at_most_max_gap():
    watch = PreemptionWatch(WatchSettings(max_gap_seconds=300.0))
    job = running()
    watch.observe(snap(T0, [job]))
    watch.observe(snap(T0 + 60, [job]))
    watch.observe(snap(T0 + 3660, [job]))  # an hour away: 300 s counted
    assert sample(watch, metrics.POOL_DELIVERED_GPU_SECONDS_TOTAL.name,
                  pool="gpu-h100") == 8 * (60 + 300)
    watch.observe(snap(T0 - 100, [job]))  # a clock stepped back adds nothing
    assert sample(watch, metrics.POOL_DELIVERED_GPU_SECONDS_TOTAL.name,
                  pool="gpu-h100") == 8 * (60 + 300)


def test_every_cause_of_a_pool_has_its_counters_from_the_first_snapshot():
    watch = PreemptionWatch()
    watch.observe(snap(T0, [running()]))
    for cause in CAUSES:
        assert sample(watch, metrics.PREEMPTIONS_TOTAL.name, pool="gpu-h100", cause=cause) == 0
        assert sample(watch, metrics.PREEMPTION_LOST_GPU_SECONDS_TOTAL.name, pool="gpu-h100",
                      cause=cause) == 0
    assert sample(watch, metrics.POOL_DELIVERED_GPU_SECONDS_TOTAL.name, pool="gpu-h100") == 0
    for cause in CAUSES:
        assert sample(watch, metrics.PREEMPTED_JOBS_WAITING.name, pool="gpu-h100",
                      cause=cause) == 0


def test_what_the_watch_keeps_is_the_last_snapshot_s_jobs():
    watch = PreemptionWatch()
    watch.observe(snap(T0, [running(f"job-{i}") for i in range(50)],
                       [requeued(f"q-{i}") for i in range(50)]))
    watch.observe(snap(T0 + 60, [running("job-0")]))
    assert set(watch._runs) == {"job-0"} and watch._counted == {}


# -- what Slurm says of a stop ------------------------------------------------------------------------

# scontrol show job -d -o of a job requeued by preemption, as Slurm 22.05 printed it (the real
# slurmctld of tests/test_preemption_slurm.py; fields cut to those read)
REQUEUED_TEXT = (
    "JobId=1 JobName=wrap UserId=root(0) GroupId=root(0) Priority=4294901759 Account=(null) "
    "QOS=(null) JobState=PENDING Reason=BeginTime Dependency=(null) Requeue=1 Restarts=1 "
    "BatchFlag=1 RunTime=00:00:00 SubmitTime=2026-12-05T21:41:32 "
    "EligibleTime=2026-12-05T21:43:33 StartTime=2026-12-05T21:43:33 EndTime=Unknown "
    "SuspendTime=None SecsPreSuspend=0 Partition=spot NodeList= NumNodes=1 NumCPUs=1 "
    "NumTasks=1 Comment=last-checkpoint=1796506287  TresPerNode=gres:gpu:h100:8\n")

REQUEUED_JSON = {"jobs": [{
    "job_id": 1, "job_state": "PENDING", "state_reason": "BeginTime", "restart_cnt": 1,
    "submit_time": 1796506892, "start_time": 1796507013, "preempt_time": 0, "suspend_time": 0,
    "partition": "spot", "nodes": "", "comment": "last-checkpoint=1796506287",
    "tres_per_node": "gres:gpu:h100:8", "node_count": 1, "tasks": 1, "cpus": 1}]}


def _slurm_snapshot(jobs) -> FleetSnapshot:
    node = SlurmNode("gpu-008", 64, ("gpu-h100", "spot", "high"),
                     (Gres("gpu", "h100", 8),), "allocated")
    return to_snapshot(T0, [node], jobs, {"h100": "H100"}, default_catalogue())


@pytest.mark.parametrize("form", ["text", "json"])
def test_slurm_s_requeued_job_is_pending_with_its_requeue_time_and_checkpoint(form):
    import datetime as dt

    jobs = (parse_scontrol_jobs(REQUEUED_TEXT, dt.UTC) if form == "text"
            else parse_squeue_json(json.dumps(REQUEUED_JSON)))
    (request,) = _slurm_snapshot(jobs).pending
    submit = (dt.datetime(2026, 12, 5, 21, 41, 32, tzinfo=dt.UTC).timestamp() if form == "text"
              else 1796506892.0)
    assert request.interrupted == Interruption("requeue", submit, 1)
    assert request.last_checkpoint_time == 1796506287.0
    assert (request.gpu_count, request.pool) == (8, "spot")


@pytest.mark.parametrize("restarts", ["0", "-3", "x", "99999999999999999999"])
def test_a_job_with_no_or_an_odd_restart_count_is_not_a_stop(restarts):
    text = REQUEUED_TEXT.replace("Restarts=1", f"Restarts={restarts}")
    (request,) = _slurm_snapshot(parse_scontrol_jobs(text)).pending
    if restarts.startswith("9"):
        # a count past Slurm's 16 bits is cut, not believed whole, and the job still shows
        assert request.interrupted is not None and request.interrupted.count <= 2 ** 16 - 1
    else:
        assert request.interrupted is None


def test_a_suspended_slurm_job_holds_its_gpus_and_says_since_when():
    record = {"job_id": 7, "job_state": "SUSPENDED", "suspend_time": 1796500000,
              "start_time": 1796490000, "partition": "spot", "nodes": "gpu-008",
              "job_resources": {"allocated_nodes": [{"nodename": "gpu-008", "sockets": {}}]},
              "gres_detail": ["gpu:h100:8(IDX:0-7)"], "node_count": 1}
    (alloc,) = _slurm_snapshot(parse_squeue_json(json.dumps({"jobs": [record]}))).allocations
    assert alloc.interrupted == Interruption("suspend", 1796500000.0)
    assert alloc.gpu_count == 8


# -- what Kubernetes says of a stop ----------------------------------------------------------------

# The condition the scheduler writes on a victim before deleting it (Kubernetes 1.26+, as the
# pod disruption conditions documentation shows it)
PREEMPTED = {"type": "DisruptionTarget", "status": "True", "lastProbeTime": None,
             "lastTransitionTime": "2026-03-10T04:00:00Z", "reason": "PreemptionByScheduler",
             "message": "default-scheduler: preempting to accommodate a higher priority pod"}


async def test_a_pod_the_scheduler_preempts_is_read_and_counted_with_its_cause(tmp_path):
    import copy
    import time as clock
    from pathlib import Path

    from exporter.options import Duration
    from exporter.sources.kubernetes.options import KubernetesSource as KubernetesConfig
    from exporter.sources.kubernetes.source import build
    from tests.helpers.fake_apiserver import FakeApiserver, read_objects, write_kubeconfig

    victim = "vllm-agg-0-vllmdecodeworker-s65j5"  # a recorded pod holding one GPU of gpu-node-1
    objects = copy.deepcopy(read_objects(Path(__file__).parent / "data" / "kubernetes"))
    (pod,) = [o for o in objects if o.get("kind", "Pod") == "Pod"
              and o["metadata"]["name"] == victim]
    pod["status"]["conditions"].append(PREEMPTED)
    # an evicted pod's condition that is no longer True is no stop
    others = [o for o in objects if o is not pod and o.get("kind", "Pod") == "Pod"
              and o.get("status", {}).get("conditions")]
    others[0]["status"]["conditions"].append({**PREEMPTED, "status": "False",
                                              "reason": "EvictionByEvictionAPI"})
    fake = FakeApiserver(token="t")
    fake.load(objects)
    await fake.start()
    source = build(KubernetesConfig(enabled=True, sync_timeout=Duration(5.0), kubeconfig=str(
        write_kubeconfig(tmp_path / "kubeconfig", fake.url, "t"))), clock.time)
    try:
        reading = await source.read()
    finally:
        await source.close()
        await fake.kill()
    stopped = {a.pod: a.interrupted for a in reading.allocations if a.interrupted is not None}
    import datetime as dt
    at = dt.datetime(2026, 3, 10, 4, tzinfo=dt.UTC).timestamp()
    assert stopped == {victim: Interruption("preemption", at)}
    watch = PreemptionWatch()
    snapshot = FleetSnapshot(at + 5, reading.nodes, reading.gpus, reading.allocations)
    (stop,) = watch.observe(snapshot).stops
    assert (stop.cause, stop.time, stop.gpus) == ("preemption", at, 1.0)
    pool = next(n.pool for n in reading.nodes if n.name == "gpu-node-1")
    assert sample(watch, metrics.PREEMPTIONS_TOTAL.name, pool=pool, cause="preemption") == 1
    assert sample(watch, metrics.PREEMPTIONS_TOTAL.name, pool=pool, cause="eviction") == 0


# -- the alerts on VictoriaMetrics ----------------------------------------------------------------

def _vm_series(t0: int, name: str, labels: dict[str, str], values: list[float]) -> str:
    return json.dumps({"metric": {"__name__": name, "job": "gpufleet-cluster",
                                  "instance": "gpufleet-a:9874", **labels},
                       "values": values, "timestamps": [(t0 + 60 * i) * 1000
                                                        for i in range(len(values))]})


@pytest.mark.slow  # a real victoria-metrics and vmalert (Debian's 1.79), replaying an hour
def test_vmalert_raises_the_overhead_and_checkpoint_tickets_as_promtool_does(tmp_path):
    """The promtool cases' fleet (rules/tests/gpu_pool_preemption_overhead.yaml), an hour of it
    imported into VictoriaMetrics and the committed rules replayed over it by vmalert
    (``-replay.*``, one evaluation a minute): the same alerts, pending and firing at the same
    minutes; the fleet that keeps the rule fires nothing."""
    import subprocess
    import time as clock
    import urllib.parse
    import urllib.request

    from tests.helpers import REPO
    from tests.helpers.servers import free_port, http_get, require_binary, start_server, stop

    port = free_port()
    vm = f"http://127.0.0.1:{port}"
    proc = start_server("victoria-metrics", tmp_path, port, [
        require_binary("victoria-metrics"), f"-storageDataPath={tmp_path / 'vm'}",
        f"-httpListenAddr=127.0.0.1:{port}", "-retentionPeriod=1", "-search.latencyOffset=0s",
        "-search.disableCache"], ready_path="/health")
    try:
        t0 = int(clock.time()) // 60 * 60 - 7200  # two hours ago, on the minute
        minutes = range(61)
        sawtooth = [60.0 * (i % 15) for i in minutes]  # a checkpoint every 15 min
        lines = [
            _vm_series(t0, metrics.POOL_DELIVERED_GPU_SECONDS_TOTAL.name, {"pool": "spot-h100"},
                       [3840.0 * i for i in minutes]),
            _vm_series(t0, metrics.PREEMPTION_LOST_GPU_SECONDS_TOTAL.name,
                       {"pool": "spot-h100", "cause": "requeue"}, [384.0 * i for i in minutes]),
            _vm_series(t0, metrics.POOL_DELIVERED_GPU_SECONDS_TOTAL.name, {"pool": "kept"},
                       [3840.0 * i for i in minutes]),
            _vm_series(t0, metrics.PREEMPTION_LOST_GPU_SECONDS_TOTAL.name,
                       {"pool": "kept", "cause": "requeue"}, [76.8 * i for i in minutes]),
            _vm_series(t0, metrics.JOB_CHECKPOINT_AGE_SECONDS.name,
                       {"exported_job": "train-ok", "namespace": "ml", "account": "ml",
                        "source": "stated"}, sawtooth),
            _vm_series(t0, metrics.JOB_CHECKPOINT_AGE_SECONDS.name,
                       {"exported_job": "train-stale", "namespace": "ml", "account": "ml",
                        "source": "stated"}, [1900.0 + 60 * i for i in minutes]),
        ]
        urllib.request.urlopen(urllib.request.Request(
            f"{vm}/api/v1/import", data="\n".join(lines).encode(), method="POST"), timeout=30)
        http_get(f"{vm}/internal/force_flush")
        iso = "%Y-%m-%dT%H:%M:%SZ"
        assert "ALERTS" not in (REPO / "rules" / "gpufleet-alerts.yaml").read_text()
        replay = subprocess.run([
            require_binary("vmalert"), f"-rule={REPO / 'rules' / 'gpufleet-alerts.yaml'}",
            f"-datasource.url={vm}", f"-remoteWrite.url={vm}", "-evaluationInterval=1m",
            "-datasource.queryStep=1m", "-replay.disableProgressBar",
            # vmalert waits 1 s after each rule by default, for a later rule of the group that
            # reads an earlier one's results (40 rules: 40 s of this test's wall); no alert reads
            # another's (ALERTS, asserted above)
            "-replay.rulesDelay=0s",
            f"-replay.timeFrom={clock.strftime(iso, clock.gmtime(t0))}",
            f"-replay.timeTo={clock.strftime(iso, clock.gmtime(t0 + 3600))}"],
            capture_output=True, text=True, timeout=300, check=False)
        assert replay.returncode == 0, replay.stderr[-2000:]
        http_get(f"{vm}/internal/force_flush")
        query = urllib.parse.urlencode({"match[]": 'ALERTS{alertname=~"GpuPool.*|GpuJobCheck.*"}',
                                        "start": t0 - 600, "end": t0 + 7200})
        seen: dict[tuple[str, str, str], tuple[int, int]] = {}
        for line in http_get(f"{vm}/api/v1/export?{query}").decode().splitlines():
            series = json.loads(line)
            labels = series["metric"]
            at = [(t // 1000 - t0) // 60 for t in series["timestamps"]]
            key = (labels["alertname"], labels.get("pool") or labels.get("exported_job", ""),
                   labels["alertstate"])
            seen[key] = (min(at), max(at))
    finally:
        stop(proc)
    assert seen == {
        # the first ratio at 1m, pending for 15m: firing from 16m, as promtool says
        ("GpuPoolPreemptionOverheadHigh", "spot-h100", "pending"): (1, 15),
        ("GpuPoolPreemptionOverheadHigh", "spot-h100", "firing"): (16, 60),
        # above 30m from 0 (31m40s), for 5m
        ("GpuJobCheckpointStale", "train-stale", "pending"): (0, 4),
        ("GpuJobCheckpointStale", "train-stale", "firing"): (5, 60),
    }
