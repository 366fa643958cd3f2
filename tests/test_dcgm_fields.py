"""Every DCGM field is mapped or deliberately dropped, and each new family reads right off dcgm.

The mapping is ``GPU_FIELDS``/``MIG_FIELDS``/``MAPPED_LABELS`` in
``exporter/sources/dcgm/fields.py``; the dropped list, with reasons, is the table under
"Fields the dcgm source drops" in ``docs/sources.md``. The real samples in
``data/dcgm-samples`` and dcgm-exporter's counters files are checked against both.
"""

from __future__ import annotations

import fnmatch
import re

import pytest

from exporter.snapshot import CLOCK_EVENT_REASONS
from exporter.sources.dcgm.exposition_parser import parse_text
from exporter.sources.dcgm.fields import GPU_FIELDS, MAPPED_LABELS, MIG_FIELDS, MIG_ID_LABEL
from exporter.sources.dcgm.source import Target, parse_body
from exporter.sources.gpu_models import catalogue_resolver
from tests.helpers import REPO, data_dir
from tests.test_dcgm import read_samples  # noqa: F401  (the fixture)

SAMPLES = data_dir() / "dcgm-samples"
DOC = REPO / "docs" / "sources.md"
SERIES = ("GPU", "MIG instance", "label")

# Every field row of NVIDIA/dcgm-exporter's etc/default-counters.csv and
# etc/dcp-metrics-included.csv at d5e5f51 (2026-05-12), the commented-out ones too: what a
# user who turns a field on there gets from gpufleet. Copied by hand from the two files.
DEFAULT_COUNTERS = (
    "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_ENC_UTIL",
    "DCGM_FI_DEV_DEC_UTIL", "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_POWER_VIOLATION",
    "DCGM_FI_DEV_THERMAL_VIOLATION", "DCGM_FI_DEV_SYNC_BOOST_VIOLATION",
    "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION", "DCGM_FI_DEV_LOW_UTIL_VIOLATION",
    "DCGM_FI_DEV_RELIABILITY_VIOLATION", "DCGM_EXP_CLOCK_EVENTS_COUNT",
    "DCGM_EXP_XID_ERRORS_COUNT", "DCGM_EXP_GPU_HEALTH_STATUS", "DCGM_EXP_P2P_STATUS",
    "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_RESERVED",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "DCGM_FI_DEV_RETIRED_SBE",
    "DCGM_FI_DEV_RETIRED_DBE", "DCGM_FI_DEV_RETIRED_PENDING",
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "DCGM_FI_DEV_NVLINK_BANDWIDTH_L0",
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_SM_OCCUPANCY",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE", "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
)
# The "label" rows of the same files (static fields dcgm-exporter turns into labels).
DEFAULT_LABEL_FIELDS = (
    "DCGM_FI_DRIVER_VERSION", "DCGM_FI_NVML_VERSION", "DCGM_FI_DEV_BRAND", "DCGM_FI_DEV_SERIAL",
    "DCGM_FI_DEV_OEM_INFOROM_VER", "DCGM_FI_DEV_ECC_INFOROM_VER", "DCGM_FI_DEV_POWER_INFOROM_VER",
    "DCGM_FI_DEV_INFOROM_IMAGE_VER", "DCGM_FI_DEV_VBIOS_VERSION",
)


def dropped() -> dict[str, list[tuple[str, str]]]:
    """The docs' dropped table: series -> [(field pattern, reason)]."""
    text = DOC.read_text()
    section = text.split("### Fields the dcgm source drops", 1)[1].split("\n### ", 1)[0]
    out: dict[str, list[tuple[str, str]]] = {s: [] for s in SERIES}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or cells[0] in ("field", "---"):
            continue
        names, series, reason = cells
        assert series in SERIES, line
        for name in re.findall(r"`([^`]+)`", names):
            out[series].append((name, reason))
    return out


def is_dropped(name: str, series: str) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern, _ in dropped()[series])


def sample_fields() -> set[tuple[str, str, str]]:
    """(sample file, series, field or label name) of every sample line."""
    seen = set()
    for path in sorted(SAMPLES.glob("*.prom")):
        result = parse_text(path.read_text())
        assert result.errors == 0, path
        for name, labels, _value in result.samples:
            seen.add((path.name, "MIG instance" if MIG_ID_LABEL in labels else "GPU", name))
            seen.update((path.name, "label", label) for label in labels)
    return seen


def test_the_dropped_table_parses_and_gives_a_reason_for_each_row():
    table = dropped()
    assert sum(len(rows) for rows in table.values()) >= 15
    assert all(len(reason) > 20 for rows in table.values() for _, reason in rows)
    assert ("device", table["label"][0][1]) in table["label"]


def test_every_field_of_the_real_samples_is_mapped_or_listed_as_dropped():
    fields = sample_fields()
    assert len({f for f in fields if f[1] != "label"}) >= 40  # three samples, all of them read
    unexplained = []
    for path, series, name in sorted(fields):
        if series == "label":
            known = name in MAPPED_LABELS
        else:
            known = name in (MIG_FIELDS if series == "MIG instance" else GPU_FIELDS)
        if not known and not is_dropped(name, series):
            unexplained.append(f"{path}: {series} {name}")
    assert unexplained == []


def test_nothing_is_both_mapped_and_dropped():
    table = dropped()
    both = [p for p, _ in table["GPU"] if any(fnmatch.fnmatchcase(f, p) for f in GPU_FIELDS)]
    both += [p for p, _ in table["MIG instance"]
             if any(fnmatch.fnmatchcase(f, p) for f in MIG_FIELDS)]
    both += [p for p, _ in table["label"] if any(fnmatch.fnmatchcase(lb, p) for lb in MAPPED_LABELS)]
    assert both == []


def test_every_field_of_dcgm_exporters_counters_files_is_mapped_or_dropped():
    assert [f for f in DEFAULT_COUNTERS if f not in GPU_FIELDS and not is_dropped(f, "GPU")] == []
    assert [f for f in DEFAULT_LABEL_FIELDS
            if f not in MAPPED_LABELS and not is_dropped(f, "label")] == []


def test_the_dropped_list_can_fail():
    assert not is_dropped("DCGM_FI_DEV_NEW_FIELD", "GPU")
    assert not is_dropped("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "GPU")  # only MIG-instance copies
    assert is_dropped("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "MIG instance")


# --- each new family, read through the dcgm source --------------------------------------

LABELS = ('gpu="0",UUID="GPU-h",pci_bus_id="00000000:1B:00.0",device="nvidia0",'
          'modelName="NVIDIA H100 80GB HBM3",Hostname="n1",DCGM_FI_DRIVER_VERSION="570.86.15",'
          'DCGM_FI_DEV_VBIOS_VERSION="96.00.99.00.01"')
GPU = {"node": "n1", "gpu": "0", "uuid": "GPU-h"}
# One H100 with every mapped field, in DCGM's units (Go %f for floats, as dcgm-exporter prints).
FULL = {
    "DCGM_FI_DEV_SM_CLOCK": "1980", "DCGM_FI_DEV_MEM_CLOCK": "2619",
    "DCGM_FI_DEV_MAX_SM_CLOCK": "1980", "DCGM_FI_DEV_MAX_MEM_CLOCK": "2619",
    "DCGM_FI_DEV_MEMORY_TEMP": "52", "DCGM_FI_DEV_FAN_SPEED": "37", "DCGM_FI_DEV_PSTATE": "0",
    "DCGM_FI_DEV_PCIE_LINK_GEN": "5", "DCGM_FI_DEV_PCIE_LINK_WIDTH": "16",
    "DCGM_FI_PROF_PCIE_TX_BYTES": "33011804", "DCGM_FI_PROF_PCIE_RX_BYTES": "97863601",
    "DCGM_FI_DEV_ENC_UTIL": "12", "DCGM_FI_DEV_DEC_UTIL": "3", "DCGM_FI_DEV_MEM_COPY_UTIL": "41",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "0.995630", "DCGM_FI_PROF_SM_ACTIVE": "0.912000",
    "DCGM_FI_PROF_SM_OCCUPANCY": "0.450000", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "0.929260",
    "DCGM_FI_PROF_DRAM_ACTIVE": "0.690789",
    "DCGM_FI_DEV_XID_ERRORS": "79", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": "12",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "1", "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": "340",
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": "2", "DCGM_FI_DEV_RETIRED_SBE": "4",
    "DCGM_FI_DEV_RETIRED_DBE": "5", "DCGM_FI_DEV_RETIRED_PENDING": "2",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": "6", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "7",
    "DCGM_FI_DEV_ROW_REMAP_PENDING": "1", "DCGM_FI_DEV_ROW_REMAP_FAILURE": "0",
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": "21",
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": "22",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": "23",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": "24",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "25",
    # SW power cap (0x04) and HW thermal slowdown (0x40), plus GPU idle (0x01), not exported
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": str(0x04 | 0x40 | 0x01),
}


def body(fields: dict[str, str], labels: str = LABELS) -> str:
    return "".join(f"{name}{{{labels}}} {value}\n" for name, value in fields.items())


@pytest.fixture
async def full(read_samples):  # noqa: F811
    return await read_samples(body(FULL))


async def test_clocks_in_hertz(full):
    assert full.value("gpufleet_gpu_clock_hertz", **GPU, clock="sm") == 1980e6
    assert full.value("gpufleet_gpu_clock_hertz", **GPU, clock="memory") == 2619e6
    assert full.value("gpufleet_gpu_clock_max_hertz", **GPU, clock="sm") == 1980e6
    assert full.value("gpufleet_gpu_clock_max_hertz", **GPU, clock="memory") == 2619e6
    # DCGM has no graphics clock: absent, never 0
    assert full.absent("gpufleet_gpu_clock_hertz", clock="graphics")
    assert full.absent("gpufleet_gpu_clock_max_hertz", clock="graphics")


async def test_temperature_fan_and_pstate(full):
    assert full.value("gpufleet_gpu_memory_temperature_celsius", **GPU) == 52
    assert full.value("gpufleet_gpu_fan_speed_ratio", **GPU) == 0.37
    assert full.value("gpufleet_gpu_performance_state", **GPU) == 0


async def test_pcie_link_and_throughput(full):
    assert full.value("gpufleet_gpu_pcie_link_generation", **GPU) == 5
    assert full.value("gpufleet_gpu_pcie_link_width", **GPU) == 16
    assert full.value("gpufleet_gpu_pcie_transmit_bytes_per_second", **GPU) == 33011804
    assert full.value("gpufleet_gpu_pcie_receive_bytes_per_second", **GPU) == 97863601
    assert full.value("gpufleet_gpu_pcie_replay_errors_total", **GPU) == 25


async def test_engine_utilisation_as_ratios(full):
    assert full.value("gpufleet_gpu_encoder_utilization_ratio", **GPU) == 0.12
    assert full.value("gpufleet_gpu_decoder_utilization_ratio", **GPU) == 0.03
    assert full.value("gpufleet_gpu_memory_bandwidth_utilization_ratio", **GPU) == 0.41


async def test_profiling_activity(full):
    assert full.value("gpufleet_gpu_graphics_engine_active_ratio", **GPU) == 0.99563
    assert full.value("gpufleet_gpu_sm_active_ratio", **GPU) == 0.912
    assert full.value("gpufleet_gpu_sm_occupancy_ratio", **GPU) == 0.45
    assert full.value("gpufleet_gpu_tensor_active_ratio", **GPU) == 0.92926
    assert full.value("gpufleet_gpu_dram_active_ratio", **GPU) == 0.690789


async def test_last_xid_and_what_dcgm_cannot_give(full):
    assert full.value("gpufleet_gpu_last_xid", **GPU) == 79
    # DCGM keeps only the last code: no counts, no time
    assert full.absent("gpufleet_gpu_xid_errors_total")
    assert full.absent("gpufleet_gpu_last_xid_timestamp_seconds")


async def test_ecc_errors(full):
    ecc = {(lb["type"], lb["counter"]): v for lb, v in full.all("gpufleet_gpu_ecc_errors_total")}
    assert ecc == {("single_bit", "volatile"): 12, ("double_bit", "volatile"): 1,
                   ("single_bit", "aggregate"): 340, ("double_bit", "aggregate"): 2}


async def test_retired_pages_and_remapped_rows(full):
    assert full.value("gpufleet_gpu_retired_pages_total", **GPU, cause="single_bit") == 4
    assert full.value("gpufleet_gpu_retired_pages_total", **GPU, cause="double_bit") == 5
    assert full.value("gpufleet_gpu_retired_pages_pending", **GPU) == 1  # 2 pages pending
    assert full.value("gpufleet_gpu_remapped_rows_total", **GPU, cause="correctable") == 6
    assert full.value("gpufleet_gpu_remapped_rows_total", **GPU, cause="uncorrectable") == 7
    assert full.value("gpufleet_gpu_remapped_rows_pending", **GPU) == 1
    assert full.value("gpufleet_gpu_remapped_rows_failure", **GPU) == 0


async def test_nvlink_errors(full):
    errors = {lb["type"]: v for lb, v in full.all("gpufleet_gpu_nvlink_errors_total", **GPU)}
    assert errors == {"crc_flit": 21, "crc_data": 22, "replay": 23, "recovery": 24}


async def test_clock_event_reasons_decoded_from_the_mask(full):
    active = {lb["reason"]: v for lb, v in full.all("gpufleet_gpu_clock_event_active", **GPU)}
    assert active == {reason: (1.0 if reason in ("sw_power_cap", "hw_thermal") else 0.0)
                      for reason, _bit in CLOCK_EVENT_REASONS}
    assert len(active) == 6


async def test_the_old_throttle_reasons_name_decodes_the_same(read_samples):  # noqa: F811
    out = await read_samples(body({"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": str(0x80)}))
    active = {lb["reason"] for lb, v in out.all("gpufleet_gpu_clock_event_active") if v == 1}
    assert active == {"hw_power_brake"}


async def test_gpu_info_carries_driver_vbios_and_pci_bus_id(full):
    (labels, value), = full.all("gpufleet_gpu_info", **GPU)
    assert value == 1
    assert (labels["driver_version"], labels["vbios_version"], labels["pci_bus_id"],
            labels["model"]) == ("570.86.15", "96.00.99.00.01", "00000000:1B:00.0", "H100")
    assert "serial" not in labels  # only the nvml source's export_serial adds it


async def test_a_gpu_without_those_fields_has_no_such_series(read_samples):  # noqa: F811
    out = await read_samples(body({"DCGM_FI_DEV_GPU_TEMP": "40"}))
    assert out.value("gpufleet_gpu_temperature_celsius", **GPU) == 40
    for family in ("gpufleet_gpu_clock_hertz", "gpufleet_gpu_ecc_errors_total",
                   "gpufleet_gpu_clock_event_active", "gpufleet_gpu_remapped_rows_pending",
                   "gpufleet_gpu_sm_active_ratio", "gpufleet_gpu_last_xid"):
        assert out.absent(family), family


def _gpu(fields: dict[str, str], labels: str = LABELS):
    fleet, errors = parse_body(body(fields, labels).encode(), Target("u", "", "n1"),
                               catalogue_resolver())
    assert errors == 0
    (gpu,) = fleet.gpus
    return gpu


def test_dcgm_no_value_markers_stay_absent():
    gpu = _gpu({
        "DCGM_FI_DEV_XID_ERRORS": "0",  # no XID yet
        "DCGM_FI_DEV_MEMORY_TEMP": "0",  # the L4 sample: GDDR6, no HBM sensor
        "DCGM_FI_DEV_PSTATE": "32",  # NVML_PSTATE_UNKNOWN
        "DCGM_FI_DEV_FAN_SPEED": "2147483632",  # DCGM_INT32_BLANK: passively cooled
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "9223372036854775792",  # DCGM_INT64_BLANK
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "0",
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": "-5",  # hostile: a count below zero
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": "-1",
    })
    assert gpu.health is not None
    assert gpu.health.last_xid is None and gpu.health.ecc_double_bit_volatile is None
    assert gpu.health.ecc_single_bit_volatile is None and gpu.health.clock_event_reasons is None
    assert gpu.health.pcie_replay_errors == 0  # a real 0 stays
    assert gpu.performance is None  # none of its values was a reading


def test_mig_instance_series_do_not_overwrite_the_gpus_values():
    mig = LABELS + ',GPU_I_PROFILE="1g.10gb",GPU_I_ID="9"'
    text = body({"DCGM_FI_PROF_SM_ACTIVE": "0.2", "DCGM_FI_DEV_XID_ERRORS": "48"}) + \
        body({"DCGM_FI_PROF_SM_ACTIVE": "0.9", "DCGM_FI_DEV_XID_ERRORS": "94"}, mig)
    fleet, _ = parse_body(text.encode(), Target("u", "", "n1"), catalogue_resolver())
    (gpu,) = fleet.gpus
    assert gpu.performance.sm_active_ratio == 0.2
    assert gpu.health.last_xid == 48


@pytest.mark.parametrize("version", ["x" * 65, "570.86\n15", "570.86\x0015"])
def test_hostile_version_labels_are_dropped(version):
    labels = LABELS.replace('DCGM_FI_DRIVER_VERSION="570.86.15"',
                            f'DCGM_FI_DRIVER_VERSION="{version}"'.replace("\n", "\\n"))
    gpu = _gpu({"DCGM_FI_DEV_GPU_TEMP": "40"}, labels)
    assert gpu.driver_version is None
    assert gpu.vbios_version == "96.00.99.00.01"


@pytest.mark.parametrize(("product", "model", "capacity"), [
    ("NVIDIA H100 PCIe", "H100-PCIe", 600e9),  # was H100, 900 GB/s, before the variants
    ("NVIDIA H200 NVL", "H200-NVL", 900e9),
    ("NVIDIA A100-PCIE-40GB", "A100-PCIe", 600e9),
    ("NVIDIA L40S", "L40S", None),
])
async def test_modelname_picks_the_variant(read_samples, product, model, capacity):  # noqa: F811
    out = await read_samples(body({"DCGM_FI_DEV_POWER_USAGE": "300.000000"},
                                  LABELS.replace("NVIDIA H100 80GB HBM3", product)))
    assert out.value("gpufleet_gpu_power_watts", **GPU, model=model) == 300
    if capacity is None:
        assert out.absent("gpufleet_gpu_nvlink_capacity_bytes_per_second")
    else:
        assert out.value("gpufleet_gpu_nvlink_capacity_bytes_per_second", **GPU) == capacity
