"""The NVML source on the fake pynvml: normal, MIG, lost GPU, NotSupported, wedged call.

Each test reads through the collector and checks the exported /metrics values
in base units against what the fake gives in NVML's units.
"""

from __future__ import annotations

import asyncio
import ctypes.util
import io
import subprocess
import sys
import threading

import pynvml
import pytest

from exporter.collect import Collector
from exporter.config import Config, Duration
from exporter.server import STATE, make_app
from exporter.sources import SourceStartupError
from exporter.sources.nvml import NvmlGpuSource, build, mig_profile
from exporter.sources.nvml_options import NvmlSource
from tests.helpers import REPO
from tests.helpers.exported import Exported
from tests.helpers.fake_pynvml import FAKE_FUNCTIONS, GIB, FakeGpu, FakeMig, FakeNvml

MIB = 1024**2


def h100(index: int, **kwargs) -> FakeGpu:
    defaults = dict(
        uuid=f"GPU-0000000{index}-aaaa-bbbb-cccc-dddddddddddd",
        pci_bus_id=f"00000000:{0x18 + index:02X}:00.0",
        utilization=87, memory_used=61 * GIB, temperature=64,
        power_mw=312_500, power_limit_mw=700_000, energy_mj=123_456_789,
        nvlink_tx_kib=[1000 * (link + 1) for link in range(18)],
        nvlink_rx_kib=[2000 * (link + 1) for link in range(18)],
    )
    return FakeGpu(**{**defaults, **kwargs})


def source_for(fake: FakeNvml, call_timeout: float = 2.0) -> NvmlGpuSource:
    config = NvmlSource(enabled=True, node="gpu-host-1", pool="gpu-h100",
                        call_timeout=Duration(call_timeout))
    return build(config, clock=lambda: 1_700_000_000.0, nvml=fake)


async def read(source: NvmlGpuSource) -> Exported:
    collector = Collector([source], timeout_seconds=10, clock=lambda: 1_700_000_000.0)
    return Exported.of(await collector.collect())


@pytest.fixture
async def sources():
    started: list[NvmlGpuSource] = []

    def make(fake: FakeNvml, call_timeout: float = 2.0) -> NvmlGpuSource:
        source = source_for(fake, call_timeout)
        started.append(source)
        return source

    yield make
    for source in started:
        await source.close()


def test_the_fake_has_only_real_pynvml_functions():
    missing = [name for name in FAKE_FUNCTIONS if not callable(getattr(pynvml, name, None))]
    assert missing == []
    # and raises pynvml's own classes
    fake = FakeNvml([], library_present=False)
    with pytest.raises(pynvml.NVMLError_LibraryNotFound):
        fake.nvmlInit()


async def test_normal_gpus_export_base_units(sources):
    fake = FakeNvml([h100(0), h100(1, utilization=12, power_mw=98_250)])
    out = await read(sources(fake))
    gpu0 = {"node": "gpu-host-1", "gpu": "0", "pool": "gpu-h100", "model": "H100",
            "uuid": "GPU-00000000-aaaa-bbbb-cccc-dddddddddddd"}
    assert out.value("gpufleet_gpu_up", **gpu0) == 1
    assert out.value("gpufleet_gpu_stale", **gpu0) == 0
    assert out.value("gpufleet_gpu_utilization_ratio", **gpu0) == 0.87
    assert out.value("gpufleet_gpu_memory_used_bytes", **gpu0) == 61 * GIB  # v2: no reserved
    assert out.value("gpufleet_gpu_memory_total_bytes", **gpu0) == 80 * GIB
    assert out.value("gpufleet_gpu_temperature_celsius", **gpu0) == 64
    assert out.value("gpufleet_gpu_power_watts", **gpu0) == 312.5  # 312,500 mW
    assert out.value("gpufleet_gpu_power_limit_watts", **gpu0) == 700
    assert out.value("gpufleet_gpu_energy_joules_total", **gpu0) == 123456.789  # mJ → J
    # 18 links, KiB counters summed and turned into bytes
    assert out.value("gpufleet_gpu_nvlink_transmit_bytes_total", **gpu0) == \
        sum(1000 * (k + 1) for k in range(18)) * 1024
    assert out.value("gpufleet_gpu_nvlink_receive_bytes_total", **gpu0) == \
        sum(2000 * (k + 1) for k in range(18)) * 1024
    assert out.value("gpufleet_gpu_nvlink_capacity_bytes_per_second", **gpu0) == 900e9
    assert out.value("gpufleet_gpu_power_watts", gpu="1") == 98.25
    assert out.value("gpufleet_gpu_utilization_ratio", gpu="1") == 0.12
    assert out.value("gpufleet_node_info", node="gpu-host-1", model="H100", gpus="2",
                     architecture="hopper") == 1
    assert out.value("gpufleet_source_up", source="nvml") == 1
    assert out.absent("gpufleet_gpu_mig_instance_info")


async def test_old_driver_falls_back_to_v1_memory_and_plain_temperature(sources):
    fake = FakeNvml([h100(0, memory_used=10 * GIB, memory_reserved=GIB // 2)],
                    memory_v2=False, temperature_v=False)
    source = sources(fake)
    out = await read(source)
    # v1 counts reserved memory as used: that is what this driver can tell
    assert out.value("gpufleet_gpu_memory_used_bytes") == 10 * GIB + GIB // 2
    assert out.value("gpufleet_gpu_temperature_celsius") == 64
    assert out.value("gpufleet_gpu_up") == 1
    fake.calls.clear()
    await read(source)
    assert "nvmlDeviceGetTemperatureV" not in fake.calls  # the fallback is remembered


async def test_mig_gpu_lists_instances_and_has_no_utilization(sources):
    a100 = FakeGpu(
        uuid="GPU-a100-0", name="NVIDIA A100-SXM4-80GB", utilization=55,
        memory_total=80 * GIB, memory_used=30 * GIB, power_mw=250_000, energy_mj=5_000,
        mig=[FakeMig(9, "1g.10gb", 9856 * MIB, 1200 * MIB),
             FakeMig(2, "3g.40gb", 40192 * MIB, 30000 * MIB),
             FakeMig(2, "3g.40gb", 40192 * MIB, 30000 * MIB)],  # a 2nd compute instance of GI 2
    )
    out = await read(sources(FakeNvml([a100])))
    instances = sorted((labels["gpu_instance"], labels["profile"])
                       for labels, _ in out.all("gpufleet_gpu_mig_instance_info"))
    assert instances == [("2", "3g.40gb"), ("9", "1g.10gb")]
    assert out.value("gpufleet_gpu_mig_memory_total_bytes", gpu_instance="9") == 9856 * MIB
    assert out.value("gpufleet_gpu_mig_memory_used_bytes", gpu_instance="2") == 30000 * MIB
    assert out.absent("gpufleet_gpu_utilization_ratio")  # absent, not 0
    assert out.value("gpufleet_gpu_power_watts") == 250
    assert out.value("gpufleet_gpu_info", model="A100-80GB") == 1
    assert out.value("gpufleet_gpu_up") == 1


async def test_lost_gpu_is_up_0_and_spoils_nothing_else(sources):
    fake = FakeNvml([h100(0), h100(1), h100(2)])
    source = sources(fake)
    await read(source)
    fake.gpus[1].lost = True
    out = await read(source)
    assert out.value("gpufleet_gpu_up", gpu="1") == 0
    assert out.absent("gpufleet_gpu_power_watts", gpu="1")
    assert out.absent("gpufleet_gpu_memory_used_bytes", gpu="1")
    for gpu in ("0", "2"):
        assert out.value("gpufleet_gpu_up", gpu=gpu) == 1
        assert out.value("gpufleet_gpu_power_watts", gpu=gpu) == 312.5
    errors = source.last_readings[1].errors
    assert errors[0].error.startswith("NVMLError_GpuIsLost")
    assert len(errors) == 1  # nothing more is asked of a lost GPU


async def test_not_supported_fields_are_absent_and_the_gpu_stays_up(sources):
    fake = FakeNvml([h100(0, not_supported={"nvmlDeviceGetTotalEnergyConsumption",
                                            "nvmlDeviceGetEnforcedPowerLimit"},
                          unsupported_links={16, 17})])
    out = await read(sources(fake))
    assert out.absent("gpufleet_gpu_energy_joules_total")
    assert out.absent("gpufleet_gpu_power_limit_watts")
    assert out.value("gpufleet_gpu_up") == 1
    assert out.value("gpufleet_gpu_power_watts") == 312.5
    # links 16 and 17 answer NOT_SUPPORTED: the counter sums links 0-15 only
    assert out.value("gpufleet_gpu_nvlink_transmit_bytes_total") == \
        sum(1000 * (k + 1) for k in range(16)) * 1024


async def test_a_failing_call_sets_up_0_for_that_gpu_only(sources):
    fake = FakeNvml([h100(0, failing={"nvmlDeviceGetPowerUsage": pynvml.NVML_ERROR_UNKNOWN}),
                     h100(1)])
    source = sources(fake)
    out = await read(source)
    assert out.value("gpufleet_gpu_up", gpu="0") == 0
    assert out.absent("gpufleet_gpu_power_watts", gpu="0")
    assert out.value("gpufleet_gpu_temperature_celsius", gpu="0") == 64  # what it read is real
    assert out.value("gpufleet_gpu_up", gpu="1") == 1
    assert [(e.call, e.error) for e in source.last_readings[0].errors] == [
        ("nvmlDeviceGetPowerUsage", "NVMLError_Unknown: Unknown Error")]


async def test_wedged_call_serves_last_good_sample_stale_and_the_loop_answers(aiohttp_client):
    fake = FakeNvml([h100(0), h100(1)])
    source = source_for(fake, call_timeout=0.3)
    # The collector's own timeout is far beyond the test, so only the source's
    # per-GPU call timeout can produce what is asserted below.
    config = Config(collect_interval=Duration(0.1), source_timeout=Duration(120))
    app = make_app(config, Collector([source], timeout_seconds=120))
    release = threading.Event()
    try:
        client = await aiohttp_client(app)
        state = app[STATE]
        await _wait_for(lambda: state.current is not None)
        fake.gpus[1].power_mw = 650_000  # a new value the wedged GPU will not deliver
        fake.wedged[("nvmlDeviceGetPowerUsage", 1)] = release

        async def stale_served() -> Exported | None:
            response = await client.get("/metrics")
            out = Exported(await response.text())
            return out if out.value("gpufleet_gpu_stale", gpu="1") == 1 else None

        out = await _wait_for(stale_served)
        # the event loop keeps answering while the driver call hangs
        healthy = await client.get("/-/healthy")
        assert healthy.status == 200
        assert out.value("gpufleet_gpu_power_watts", gpu="1") == 312.5  # last good sample
        assert out.value("gpufleet_gpu_up", gpu="1") == 1
        assert out.value("gpufleet_gpu_stale", gpu="0") == 0  # the other GPU stays fresh
        assert out.value("gpufleet_source_up", source="nvml") == 1
        assert out.value("gpufleet_gpu_power_watts", gpu="0") == 312.5

        release.set()  # the driver comes back: fresh values, no longer stale

        async def fresh_again() -> Exported | None:
            response = await client.get("/metrics")
            out = Exported(await response.text())
            return out if out.value("gpufleet_gpu_stale", gpu="1") == 0 else None

        out = await _wait_for(fresh_again)
        assert out.value("gpufleet_gpu_power_watts", gpu="1") == 650
    finally:
        release.set()


async def _wait_for(probe, attempts: int = 200):
    for _ in range(attempts):
        result = probe()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return result
        await asyncio.sleep(0.05)
    raise AssertionError("condition never held")


def test_missing_library_is_a_startup_error_naming_the_fix():
    with pytest.raises(SourceStartupError, match=r"libnvidia-ml\.so\.1 not found.*driver"):
        source_for(FakeNvml([h100(0)], library_present=False))
    with pytest.raises(SourceStartupError, match="no GPU"):
        source_for(FakeNvml([]))


def test_mig_profile_from_nvml_device_name():
    assert mig_profile("NVIDIA A100-SXM4-80GB MIG 1g.10gb") == "1g.10gb"
    assert mig_profile("NVIDIA H100 80GB HBM3 MIG 1g.10gb+me") == "1g.10gb+me"
    assert mig_profile("NVIDIA H100 80GB HBM3") == "unknown"


def _has_nvml_library() -> bool:
    return ctypes.util.find_library("nvidia-ml") is not None


@pytest.mark.skipif(_has_nvml_library(), reason="this machine has an NVIDIA driver")
def test_serve_with_nvml_on_a_machine_without_gpu_exits_2_with_one_line():
    result = subprocess.run(
        [sys.executable, "-m", "exporter", "serve", "--source", "nvml",
         "--listen", "127.0.0.1:0"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr + result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("gpufleet: NVML library libnvidia-ml.so.1 not found")


@pytest.mark.skipif(_has_nvml_library(), reason="this machine has an NVIDIA driver")
def test_nvml_check_without_gpu_says_so_and_exits_2():
    result = subprocess.run([sys.executable, "bench/nvml_check.py", "--seconds", "1"],
                            cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr + result.stdout
    assert "libnvidia-ml.so.1 not found" in result.stderr


def test_nvml_check_prints_every_metric_on_the_fake():
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import nvml_check
    finally:
        sys.path.remove(str(REPO / "bench"))
    a100 = FakeGpu(uuid="GPU-a100-0", name="NVIDIA A100-SXM4-80GB",
                   mig=[FakeMig(9, "1g.10gb", 9856 * MIB, 1200 * MIB)])
    fake = FakeNvml([h100(0), a100, h100(2, failing={"nvmlDeviceGetTotalEnergyConsumption":
                                                      pynvml.NVML_ERROR_UNKNOWN})])
    out = io.StringIO()
    code = nvml_check.run(fake, seconds=0.3, interval=0.1, out=out)
    text = out.getvalue()
    assert code == 0
    assert "driver 550.54.15" in text
    for metric in ("utilization_ratio", "memory_used_bytes", "memory_total_bytes",
                   "temperature_celsius", "power_watts", "power_limit_watts", "energy_joules",
                   "nvlink_transmit_bytes", "nvlink_receive_bytes"):
        assert metric in text
    assert "312.5" in text and "mig 9 1g.10gb" in text
    assert "cost per collection" in text
    assert "nvmlDeviceGetTotalEnergyConsumption" in text and "NVMLError_Unknown" in text


async def test_nvml_is_shut_down_on_close():
    fake = FakeNvml([h100(0)])
    source = source_for(fake)
    assert fake.initialised == 1
    await read(source)
    await source.close()
    assert fake.initialised == 0
