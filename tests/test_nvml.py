"""The NVML source on the fake pynvml: normal, MIG, lost GPU, NotSupported, wedged call.

Each test reads through the collector and checks the exported /metrics values
in base units against what the fake gives in NVML's units.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes.util
import io
import subprocess
import sys
import threading

import pynvml
import pytest

from exporter.collect import Collector
from exporter.config import Config, Duration
from exporter.sources import SourceStartupError
from exporter.sources.nvml.options import NvmlSource
from exporter.sources.nvml.source import NvmlGpuSource, build, mig_profile
from exporter.web.server import STATE, make_app
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


async def test_a_gpu_without_nvlink_links_has_no_nvlink_capacity(sources):
    """An SXM H100 alone in a VM (a real one, driver 580.159.04) reports no NVLink link: the
    model's 900 GB/s is not its capacity, so the family has no series for it."""
    fake = FakeNvml([h100(0), h100(1, nvlink_tx_kib=[], nvlink_rx_kib=[])])
    out = await read(sources(fake))
    assert out.value("gpufleet_gpu_nvlink_capacity_bytes_per_second", gpu="0") == 900e9
    assert out.absent("gpufleet_gpu_nvlink_capacity_bytes_per_second", gpu="1")
    assert out.absent("gpufleet_gpu_nvlink_transmit_bytes_total", gpu="1")
    assert out.value("gpufleet_gpu_up", gpu="1") == 1


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
    # issue 16: health and performance values, identity, and the calls a collection makes
    for field in ("ecc_single_bit_volatile", "remapped_rows_correctable", "clock_event_reasons",
                  "sm_clock_hertz", "memory_temperature_celsius", "sm_active_ratio"):
        assert field in text
    assert "550.54.15 / 96.00.99.00.01" in text
    assert "NVML calls per collection per GPU:" in text
    assert "nvmlDeviceGetRemappedRows" in text and " per call" in text


def test_nvml_cost_counts_the_calls_of_a_collection():
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import nvml_cost
    finally:
        sys.path.remove(str(REPO / "bench"))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert nvml_cost.main(["--gpus", "2", "--collections", "3"]) == 0
    text = out.getvalue()
    # 8 core calls + 22 of issue 16 on an H100 with everything supported (max clocks read once)
    assert "NVML calls per collection per GPU: 30.0" in text
    assert "nvmlDeviceGetTotalEccErrors                    4.0" in text
    assert "nvmlGpmMetricsGet" in text and "nvmlShutdown" not in text


async def test_nvml_is_shut_down_on_close():
    fake = FakeNvml([h100(0)])
    source = source_for(fake)
    assert fake.initialised == 1
    await read(source)
    await source.close()
    assert fake.initialised == 0


# --- issue 16: health and performance -------------------------------------------------------

GPU0 = {"gpu": "0"}


def h100_health(index: int = 0, **kwargs) -> FakeGpu:
    """An H100 with something to report on every issue-16 family it supports."""
    defaults = dict(
        utilization_memory=43,
        ecc={(pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC): 3,
             (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC): 0,
             (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_AGGREGATE_ECC): 17,
             (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_AGGREGATE_ECC): 1},
        remapped_rows=(2, 1, 1, 0),
        nvlink_errors={pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT: [1] * 18,
                       pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA: [0] * 17 + [5],
                       pynvml.NVML_NVLINK_ERROR_DL_REPLAY: [2] * 18,
                       pynvml.NVML_NVLINK_ERROR_DL_RECOVERY: [0] * 18},
        pcie_replay=7,
        clock_reasons=pynvml.nvmlClocksEventReasonSwPowerCap
        | pynvml.nvmlClocksEventReasonHwThermalSlowdown | pynvml.nvmlClocksEventReasonGpuIdle,
        clocks_mhz={pynvml.NVML_CLOCK_SM: 1755, pynvml.NVML_CLOCK_MEM: 2619,
                    pynvml.NVML_CLOCK_GRAPHICS: 1755},
        memory_temperature=52, pstate=0, pcie_generation=5, pcie_width=16,
        pcie_tx_kbs=1_000, pcie_rx_kbs=250_000, encoder=5, decoder=12,
        gpm={pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: 95.0, pynvml.NVML_GPM_METRIC_SM_UTIL: 62.5,
             pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: 31.25,
             pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 40.0,
             pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: 55.0},
    )
    return h100(index, **{**defaults, **kwargs})


async def test_health_counters_in_base_units(sources):
    out = await read(sources(FakeNvml([h100_health()])))
    assert out.value("gpufleet_gpu_up", **GPU0) == 1
    ecc = {(lab["type"], lab["counter"]): v for lab, v in out.all("gpufleet_gpu_ecc_errors_total")}
    assert ecc == {("single_bit", "volatile"): 3, ("double_bit", "volatile"): 0,
                   ("single_bit", "aggregate"): 17, ("double_bit", "aggregate"): 1}
    assert out.value("gpufleet_gpu_remapped_rows_total", cause="correctable") == 2
    assert out.value("gpufleet_gpu_remapped_rows_total", cause="uncorrectable") == 1
    assert out.value("gpufleet_gpu_remapped_rows_pending") == 1
    assert out.value("gpufleet_gpu_remapped_rows_failure") == 0
    assert out.absent("gpufleet_gpu_retired_pages_total")  # Hopper remaps rows instead
    assert out.absent("gpufleet_gpu_retired_pages_pending")
    nvlink = {lab["type"]: v for lab, v in out.all("gpufleet_gpu_nvlink_errors_total")}
    assert nvlink == {"crc_flit": 18, "crc_data": 5, "replay": 36, "recovery": 0}
    assert out.value("gpufleet_gpu_pcie_replay_errors_total") == 7
    # the mask 0x45 is power cap + HW thermal (+ idle, which is not a slowdown): six series
    reasons = {lab["reason"]: v for lab, v in out.all("gpufleet_gpu_clock_event_active")}
    assert reasons == {"sw_power_cap": 1, "hw_slowdown": 0, "sync_boost": 0, "sw_thermal": 0,
                       "hw_thermal": 1, "hw_power_brake": 0}
    assert out.absent("gpufleet_gpu_xid_errors_total")  # none seen yet
    assert out.absent("gpufleet_gpu_last_xid")


async def test_performance_values_in_base_units_and_gpm_from_the_second_read(sources):
    source = sources(FakeNvml([h100_health()]))
    first = await read(source)
    clocks = {lab["clock"]: v for lab, v in first.all("gpufleet_gpu_clock_hertz")}
    assert clocks == {"sm": 1755e6, "memory": 2619e6, "graphics": 1755e6}  # MHz → Hz
    maxima = {lab["clock"]: v for lab, v in first.all("gpufleet_gpu_clock_max_hertz")}
    assert maxima == {"sm": 1980e6, "memory": 2619e6, "graphics": 1980e6}
    assert first.value("gpufleet_gpu_memory_temperature_celsius") == 52
    assert first.absent("gpufleet_gpu_fan_speed_ratio")  # passively cooled: NOT_SUPPORTED
    assert first.value("gpufleet_gpu_performance_state") == 0
    assert first.value("gpufleet_gpu_pcie_link_generation") == 5
    assert first.value("gpufleet_gpu_pcie_link_width") == 16
    assert first.value("gpufleet_gpu_pcie_transmit_bytes_per_second") == 1_000 * 1024
    assert first.value("gpufleet_gpu_pcie_receive_bytes_per_second") == 250_000 * 1024
    assert first.value("gpufleet_gpu_encoder_utilization_ratio") == 0.05
    assert first.value("gpufleet_gpu_decoder_utilization_ratio") == 0.12
    assert first.value("gpufleet_gpu_memory_bandwidth_utilization_ratio") == 0.43
    # GPM needs two samples: nothing after one read, the interval's activity after two
    assert first.absent("gpufleet_gpu_sm_active_ratio")
    second = await read(source)
    assert second.value("gpufleet_gpu_graphics_engine_active_ratio") == 0.95
    assert second.value("gpufleet_gpu_sm_active_ratio") == 0.625
    assert second.value("gpufleet_gpu_sm_occupancy_ratio") == 0.3125
    assert second.value("gpufleet_gpu_tensor_active_ratio") == 0.4
    assert second.value("gpufleet_gpu_dram_active_ratio") == 0.55
    # the maximum clocks are static: read at the first collection only
    assert source.nvml.calls.count("nvmlDeviceGetMaxClockInfo") == 3


async def test_fan_and_pstate_where_the_board_has_them(sources):
    fake = FakeNvml([h100(0, fan_percent=45, pstate=8),
                     h100(1, pstate=pynvml.NVML_PSTATE_UNKNOWN)])
    out = await read(sources(fake))
    assert out.value("gpufleet_gpu_fan_speed_ratio", gpu="0") == 0.45  # percent → ratio
    assert out.value("gpufleet_gpu_performance_state", gpu="0") == 8
    assert out.absent("gpufleet_gpu_performance_state", gpu="1")  # NVML's "unknown" (32)
    assert out.absent("gpufleet_gpu_fan_speed_ratio", gpu="1")


async def test_identity_labels_and_serial_only_when_enabled(sources):
    out = await read(sources(FakeNvml([h100(0)])))
    assert out.value("gpufleet_gpu_info", driver_version="550.54.15",
                     vbios_version="96.00.99.00.01", pci_bus_id="00000000:18:00.0") == 1
    ((labels, _),) = out.all("gpufleet_gpu_info")
    assert "serial" not in labels
    config = NvmlSource(enabled=True, node="gpu-host-1", export_serial=True)
    source = build(config, clock=lambda: 1_700_000_000.0, nvml=FakeNvml([h100(0)]))
    try:
        assert (await read(source)).value("gpufleet_gpu_info", serial="1654923012345") == 1
    finally:
        await source.close()


async def test_xid_injected_through_the_event_set_is_counted_across_collections(sources):
    fake = FakeNvml([h100(0), h100(1)])
    source = sources(fake)
    await read(source)
    assert fake.inject_xid(1, 79) == 1  # one event set per GPU, registered for XIDs
    fake.inject_xid(1, 48)
    fake.inject_xid(1, 79)
    out = await read(source)
    assert out.value("gpufleet_gpu_xid_errors_total", gpu="1", xid="79") == 2
    assert out.value("gpufleet_gpu_xid_errors_total", gpu="1", xid="48") == 1
    assert out.value("gpufleet_gpu_last_xid", gpu="1") == 79
    assert out.value("gpufleet_gpu_last_xid_timestamp_seconds", gpu="1") == 1_700_000_000.0
    assert out.absent("gpufleet_gpu_xid_errors_total", gpu="0")  # the other GPU saw none
    fake.inject_xid(1, 79)
    out = await read(source)
    assert out.value("gpufleet_gpu_xid_errors_total", gpu="1", xid="79") == 3  # kept, added to


async def test_an_xid_storm_is_drained_in_bounded_steps(sources):
    fake = FakeNvml([h100(0)])
    source = sources(fake)
    for _ in range(100):
        fake.inject_xid(0, 13)
    first = await read(source)
    assert first.value("gpufleet_gpu_xid_errors_total", xid="13") == 64  # MAX_XID_EVENTS
    second = await read(source)
    assert second.value("gpufleet_gpu_xid_errors_total", xid="13") == 100


async def test_lost_gpu_keeps_its_xids_and_is_up_0(sources):
    fake = FakeNvml([h100(0), h100(1)])
    source = sources(fake)
    await read(source)
    fake.inject_xid(0, 79)  # "GPU has fallen off the bus", then the GPU is lost
    fake.gpus[0].lost = True
    out = await read(source)
    assert out.value("gpufleet_gpu_up", gpu="0") == 0
    assert out.value("gpufleet_gpu_xid_errors_total", gpu="0", xid="79") == 1
    assert out.absent("gpufleet_gpu_ecc_errors_total", gpu="0")
    assert out.absent("gpufleet_gpu_clock_hertz", gpu="0")
    assert out.value("gpufleet_gpu_up", gpu="1") == 1


async def test_gpu_is_lost_in_a_health_read_stops_the_rest(sources):
    fake = FakeNvml([h100_health(0, failing={
        "nvmlDeviceGetRemappedRows": pynvml.NVML_ERROR_GPU_IS_LOST}), h100_health(1)])
    source = sources(fake)
    out = await read(source)
    assert out.value("gpufleet_gpu_up", gpu="0") == 0
    assert out.absent("gpufleet_gpu_power_watts", gpu="0")
    assert out.absent("gpufleet_gpu_pcie_replay_errors_total", gpu="0")
    errors = source.last_readings[0].errors
    assert [(e.call, e.optional) for e in errors] == [("nvmlDeviceGetRemappedRows", False)]
    assert out.value("gpufleet_gpu_pcie_replay_errors_total", gpu="1") == 7


async def test_unknown_error_in_one_health_read_loses_only_that_value(sources):
    fake = FakeNvml([h100_health(0, failing={
        "nvmlDeviceGetPcieReplayCounter": pynvml.NVML_ERROR_UNKNOWN,
        "nvmlDeviceGetClockInfo": pynvml.NVML_ERROR_UNKNOWN})])
    source = sources(fake)
    out = await read(source)
    assert out.absent("gpufleet_gpu_pcie_replay_errors_total")
    assert out.absent("gpufleet_gpu_clock_hertz")
    # everything else was read, and the GPU is up: an optional read is no lost GPU
    assert out.value("gpufleet_gpu_up") == 1
    assert out.value("gpufleet_gpu_remapped_rows_total", cause="correctable") == 2
    assert out.value("gpufleet_gpu_clock_max_hertz", clock="sm") == 1980e6
    assert out.value("gpufleet_gpu_power_watts") == 312.5
    errors = [(e.call, e.error, e.optional) for e in source.last_readings[0].errors]
    assert ("nvmlDeviceGetPcieReplayCounter", "NVMLError_Unknown: Unknown Error", True) in errors
    assert len(errors) == 4  # the replay counter and the three clock domains
    # an error is not NotSupported: it is asked again next time
    fake.gpus[0].failing.clear()
    assert (await read(source)).value("gpufleet_gpu_pcie_replay_errors_total") == 7


async def test_not_supported_reads_are_absent_and_not_asked_again(sources):
    fake = FakeNvml([h100(0, xid_events=False, remapped_rows=None, memory_temperature=None,
                          not_supported={"nvmlDeviceGetTotalEccErrors",
                                         "nvmlDeviceGetPcieReplayCounter",
                                         "nvmlDeviceGetEncoderUtilization"})])
    source = sources(fake)
    out = await read(source)
    for name in ("gpufleet_gpu_ecc_errors_total", "gpufleet_gpu_remapped_rows_total",
                 "gpufleet_gpu_remapped_rows_pending", "gpufleet_gpu_remapped_rows_failure",
                 "gpufleet_gpu_retired_pages_total", "gpufleet_gpu_pcie_replay_errors_total",
                 "gpufleet_gpu_memory_temperature_celsius", "gpufleet_gpu_encoder_utilization_ratio",
                 "gpufleet_gpu_fan_speed_ratio", "gpufleet_gpu_sm_active_ratio"):
        assert out.absent(name), name
    assert out.value("gpufleet_gpu_up") == 1
    assert source.last_readings[0].errors == ()
    assert fake.inject_xid(0, 79) == 0  # no event set registered for this GPU
    fake.calls.clear()
    await read(source)
    for call in ("nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetRemappedRows",
                 "nvmlDeviceGetPcieReplayCounter", "nvmlDeviceGetRetiredPages",
                 "nvmlGpmSampleGet", "nvmlEventSetWait_v2"):
        assert call not in fake.calls, call
    assert fake.calls.count("nvmlDeviceGetFieldValues") == 2  # NVLink data and error totals


async def test_pre_ampere_gpu_reports_retired_pages(sources):
    v100 = FakeGpu(uuid="GPU-v100-0", name="Tesla V100-SXM2-32GB", remapped_rows=None,
                   retired_pages={pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS:
                                  [0x1000, 0x2000],
                                  pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR: [0x3000]},
                   retired_pending=True)
    out = await read(sources(FakeNvml([v100])))
    assert out.value("gpufleet_gpu_retired_pages_total", cause="single_bit") == 2
    assert out.value("gpufleet_gpu_retired_pages_total", cause="double_bit") == 1
    assert out.value("gpufleet_gpu_retired_pages_pending") == 1
    assert out.absent("gpufleet_gpu_remapped_rows_total")


async def test_older_driver_throttle_reasons_and_per_link_nvlink_errors(sources):
    fake = FakeNvml([h100_health(0, nvlink_error_totals=False, unsupported_links={17})],
                    clocks_event_reasons=False)
    source = sources(fake)
    out = await read(source)
    reasons = {lab["reason"]: v for lab, v in out.all("gpufleet_gpu_clock_event_active")}
    assert reasons["hw_thermal"] == 1 and reasons["sw_power_cap"] == 1
    nvlink = {lab["type"]: v for lab, v in out.all("gpufleet_gpu_nvlink_errors_total")}
    assert nvlink == {"crc_flit": 17, "crc_data": 0, "replay": 34, "recovery": 0}  # link 17 out
    fake.calls.clear()
    await read(source)
    assert "nvmlDeviceGetCurrentClocksEventReasons" not in fake.calls  # the fallback is kept
    assert fake.calls.count("nvmlDeviceGetNvLinkErrorCounter") == 4 * 18


async def test_xid_appears_on_metrics_end_to_end(aiohttp_client):
    """An XID injected through the fake event set, served on /metrics by the running app."""
    fake = FakeNvml([h100(0)])
    source = source_for(fake)
    config = Config(collect_interval=Duration(0.1), source_timeout=Duration(120))
    app = make_app(config, Collector([source], timeout_seconds=120))
    client = await aiohttp_client(app)
    await _wait_for(lambda: app[STATE].current is not None)
    fake.inject_xid(0, 94)

    async def xid_served() -> Exported | None:
        out = Exported(await (await client.get("/metrics")).text())
        return out if out.all("gpufleet_gpu_xid_errors_total") else None

    out = await _wait_for(xid_served)
    assert out.value("gpufleet_gpu_xid_errors_total", gpu="0", xid="94") == 1
    assert out.value("gpufleet_gpu_last_xid", gpu="0") == 94
