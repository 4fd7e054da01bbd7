"""The NVML source's profiling columns from GPM (Hopper and later), against tests/fake_nvml.py.

GPM values are computed from two samples, so these tests drive both the GPU's activity (what the counters saw) and
the source's clock (when it sampled), and count allocations, since each leaked sample is driver memory.
"""
from __future__ import annotations

import logging

import pynvml
import pytest

from gpuledger.collector.nvml_source import NvmlSource
from tests.fake_nvml import FakeGpu, FakeMig, FakeNvml

SM, OCC, TENSOR, DRAM = (pynvml.NVML_GPM_METRIC_SM_UTIL, pynvml.NVML_GPM_METRIC_SM_OCCUPANCY,
                         pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL, pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL)
BUSY = {SM: 80.0, OCC: 35.0, TENSOR: 62.5, DRAM: 41.0}  # percent, as GPM reports them
PROFILING = ("sm_active", "sm_occupancy", "tensor_active", "dram_active")
MIB = 1024 * 1024


class Clock:
    """The source's GPM clock, moved by the test (the fake GPU's own time moves with FakeGpmActivity.run)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def source_for(nvml: FakeNvml, interval_s: float = 10.0) -> tuple[NvmlSource, Clock]:
    source = NvmlSource(nvml, interval_s=interval_s, node="n1", nvlink_links=2)
    clock = Clock()
    source.clock = clock
    return source, clock


def step(source: NvmlSource, clock: Clock, gpus: list[FakeGpu], seconds: float = 10.0,
         values: dict[int, float] | None = None) -> dict:
    """Let every GPU run `seconds` at `values`, then collect: rows by (GPU, MIG instance)."""
    for gpu in gpus:
        gpu.activity.run(seconds, values or {})
        for mig in gpu.migs or []:
            mig.activity.run(seconds, values or {})
    clock.now += seconds
    return {(r["gpu_uuid"], r["mig_instance"]): r for r in source.collect().to_pylist()}


def profiling(row: dict) -> tuple:
    return tuple(row[c] for c in PROFILING)


def test_hopper_reads_fractions_from_the_second_collect_on_and_frees_every_sample():
    gpu = FakeGpu("GPU-h")  # NVIDIA H100 80GB HBM3
    nvml = FakeNvml([gpu])
    source, clock = source_for(nvml)
    first = step(source, clock, [gpu], values=BUSY)[("GPU-h", None)]
    assert profiling(first) == (None, None, None, None)  # one sample: nothing to compute yet, and not 0
    second = step(source, clock, [gpu], values=BUSY)[("GPU-h", None)]
    assert profiling(second) == pytest.approx((0.80, 0.35, 0.625, 0.41))
    assert source.gpm_support == {"GPU-h": True}
    # the next interval is measured from the sample before it, not from the start
    third = step(source, clock, [gpu], values={SM: 20.0})[("GPU-h", None)]
    assert profiling(third) == pytest.approx((0.20, 0.0, 0.0, 0.0))
    for _ in range(5):
        step(source, clock, [gpu], values=BUSY)
    assert nvml.live_gpm_samples() == 1  # only the latest, kept for the next collect
    source.close()
    assert nvml.live_gpm_samples() == 0 and nvml.gpm_allocs == nvml.gpm_frees == 8


def test_percentages_are_clipped_to_fractions():
    gpu = FakeGpu("GPU-h")
    source, clock = source_for(FakeNvml([gpu]))
    step(source, clock, [gpu])
    row = step(source, clock, [gpu], values={SM: 100.4, OCC: -0.2})[("GPU-h", None)]
    assert (row["sm_active"], row["sm_occupancy"]) == (1.0, 0.0)


@pytest.mark.parametrize("gpu", [FakeGpu("GPU-a", name="NVIDIA A100-SXM4-80GB"),  # isSupportedDevice 0
                                 FakeGpu("GPU-h", gpm=False),
                                 FakeGpu("GPU-h", unsupported={"nvmlGpmQueryDeviceSupport"})],
                         ids=["ampere", "is_supported_0", "not_supported"])
def test_a_gpu_without_gpm_leaves_the_columns_empty_and_is_asked_once(gpu, caplog):
    nvml = FakeNvml([gpu])
    asked = []
    real = nvml.nvmlGpmQueryDeviceSupport
    nvml.nvmlGpmQueryDeviceSupport = lambda handle: asked.append(handle) or real(handle)
    source, clock = source_for(nvml)
    with caplog.at_level(logging.INFO, logger="gpuledger.collector.nvml_source"):
        rows = [step(source, clock, [gpu], values=BUSY)[(gpu.uuid, None)] for _ in range(3)]
    assert all(profiling(r) == (None, None, None, None) for r in rows)
    assert rows[-1]["util_pct"] == 50 and rows[-1]["pcie_tx_bps"] == 1000 * 1024  # the rest is read as before
    assert len(asked) == 1 and source.gpm_support == {gpu.uuid: False} and nvml.gpm_allocs == 0
    assert sum("GPM" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.parametrize("kind", ["old_library", "old_driver"])
def test_an_nvml_without_gpm_leaves_the_columns_empty(kind, caplog):
    gpu = FakeGpu("GPU-h")
    nvml = FakeNvml([gpu], gpm_library=kind != "old_library", gpm_driver=kind != "old_driver")
    if kind == "old_library":
        assert not hasattr(nvml, "nvmlGpmSampleAlloc") and not hasattr(nvml, "NVML_GPM_METRIC_SM_UTIL")
    else:
        with pytest.raises(pynvml.NVMLError_FunctionNotFound):
            nvml.nvmlInit() or nvml.nvmlGpmQueryDeviceSupport(gpu)
    source, clock = source_for(nvml)
    with caplog.at_level(logging.INFO, logger="gpuledger.collector.nvml_source"):
        rows = [step(source, clock, [gpu], values=BUSY)[("GPU-h", None)] for _ in range(3)]
    assert all(profiling(r) == (None, None, None, None) for r in rows) and rows[-1]["power_w"] == 350.0
    assert sum("GPM" in r.getMessage() for r in caplog.records) == 1
    source.close()


def test_a_metric_nvml_cannot_compute_leaves_only_its_column_empty():
    gpu = FakeGpu("GPU-h", gpm_failing={TENSOR: pynvml.NVML_ERROR_NOT_SUPPORTED})
    source, clock = source_for(FakeNvml([gpu]))
    step(source, clock, [gpu], values=BUSY)
    row = step(source, clock, [gpu], values=BUSY)[("GPU-h", None)]
    assert profiling(row) == pytest.approx((0.80, 0.35, None, 0.41))


def test_nvmls_own_pcie_and_nvlink_readings_win_and_gpm_fills_where_they_are_absent():
    pcie_tx, nvlink_rx = pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC, pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC
    gpm_rates = {pcie_tx: 300.0, pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC: 200.0, nvlink_rx: 5.0}
    own = FakeGpu("GPU-own", pcie_tx_kbps=1000, nvlink_kib={0: 0})
    bare = FakeGpu("GPU-bare", unsupported={"nvmlDeviceGetPcieThroughput", "nvmlDeviceGetFieldValues"})
    source, clock = source_for(FakeNvml([own, bare]))
    step(source, clock, [own, bare], values=gpm_rates)
    own.nvlink_kib = {0: 10 * 1024}
    rows = step(source, clock, [own, bare], values=gpm_rates)
    a, b = rows[("GPU-own", None)], rows[("GPU-bare", None)]
    assert a["pcie_tx_bps"] == 1000 * 1024 and a["nvlink_rx_bps"] not in (None, 5 * MIB)  # its counter's rate
    assert (b["pcie_tx_bps"], b["pcie_rx_bps"], b["nvlink_rx_bps"]) == (300 * MIB, 200 * MIB, 5 * MIB)
    assert b["nvlink_tx_bps"] == 0.0  # GPM read no NVLink writes: a reading of 0, not a missing one


def test_samples_too_close_or_too_far_apart_give_no_value():
    gpu = FakeGpu("GPU-h")
    nvml = FakeNvml([gpu])
    source, clock = source_for(nvml, interval_s=10)
    step(source, clock, [gpu], values=BUSY)
    assert step(source, clock, [gpu], seconds=0.05, values=BUSY)[("GPU-h", None)]["sm_active"] is None
    assert nvml.gpm_allocs == 1  # under NVML's 100 ms: the older sample is kept, no new one taken
    assert step(source, clock, [gpu], values=BUSY)[("GPU-h", None)]["sm_active"] == pytest.approx(0.8)
    assert step(source, clock, [gpu], seconds=600, values=BUSY)[("GPU-h", None)]["sm_active"] is None
    assert step(source, clock, [gpu], values={SM: 10.0})[("GPU-h", None)]["sm_active"] == pytest.approx(0.1)
    assert nvml.live_gpm_samples() == 1


def test_a_failed_sample_starts_again_and_a_vanished_gpu_frees_its_sample():
    h1, h2 = FakeGpu("GPU-1"), FakeGpu("GPU-2")
    nvml = FakeNvml([h1, h2])
    source, clock = source_for(nvml)
    step(source, clock, [h1, h2], values=BUSY)
    h1.lost = True  # GPU-1 falls off the bus: its row and its sample go
    rows = step(source, clock, [h1, h2], values=BUSY)
    assert set(rows) == {("GPU-2", None)} and rows[("GPU-2", None)]["sm_active"] == pytest.approx(0.8)
    assert nvml.live_gpm_samples() == 1
    h1.lost = False
    assert step(source, clock, [h1, h2], values=BUSY)[("GPU-1", None)]["sm_active"] is None  # primes again
    real = nvml.nvmlGpmSampleGet
    nvml.nvmlGpmSampleGet = lambda d, s: (_ for _ in ()).throw(pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN))
    assert step(source, clock, [h1, h2], values=BUSY)[("GPU-2", None)]["sm_active"] is None
    assert nvml.live_gpm_samples() == 0  # the failed sample and the older one, both freed
    nvml.nvmlGpmSampleGet = real
    step(source, clock, [h1, h2], values=BUSY)
    assert profiling(step(source, clock, [h1, h2], values=BUSY)[("GPU-1", None)]) == pytest.approx(
        (0.80, 0.35, 0.625, 0.41))
    source.close()
    assert nvml.live_gpm_samples() == 0 and nvml.gpm_allocs == nvml.gpm_frees


def test_mig_instances_are_read_per_gpu_instance_without_the_cards_pcie():
    gpu = FakeGpu("GPU-m", migs=[FakeMig("MIG-1", gi_id=1, slices=3, memory_mb=40192, used_mib=0),
                                 FakeMig("MIG-2", gi_id=9, slices=1, memory_mb=9856, used_mib=0)])
    nvml = FakeNvml([gpu])
    source, clock = source_for(nvml)
    step(source, clock, [gpu])
    gpu.migs[0].activity.run(10, {SM: 50.0, TENSOR: 25.0, pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC: 7.0})
    gpu.migs[1].activity.run(10, {})
    clock.now += 10
    rows = {(r["gpu_uuid"], r["mig_instance"]): r for r in source.collect().to_pylist()}
    big, small = rows[("GPU-m", 1)], rows[("GPU-m", 9)]
    assert profiling(big) == pytest.approx((0.5, 0.0, 0.25, 0.0)) and big["pcie_tx_bps"] is None
    assert profiling(small) == (0.0, 0.0, 0.0, 0.0)
    gpu.migs = gpu.migs[:1]  # MIG-2's instance destroyed: its sample is freed
    step(source, clock, [gpu])
    assert nvml.live_gpm_samples() == 1
    source.close()
    assert nvml.live_gpm_samples() == 0


def test_the_fake_keeps_nvmls_contract():
    """The fake itself: samples fit the real c_nvmlGpmMetricsGet_t, the later sample goes second, a wrong
    version or a freed sample is refused, and a double free fails the test."""
    gpu = FakeGpu("GPU-h")
    nvml = FakeNvml([gpu])
    nvml.nvmlInit()
    one, two = nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()
    nvml.nvmlGpmSampleGet(gpu, one)
    gpu.activity.run(4, {SM: 30.0})
    nvml.nvmlGpmSampleGet(gpu, two)
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version, request.numMetrics, request.sample1, request.sample2 = \
        pynvml.NVML_GPM_METRICS_GET_VERSION, 1, two, one
    request.metrics[0].metricId = SM
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlGpmMetricsGet(request)
    request.sample1, request.sample2 = one, two
    got = nvml.nvmlGpmMetricsGet(request).metrics[0]
    assert (got.nvmlReturn, got.value) == (pynvml.NVML_SUCCESS, pytest.approx(30.0))
    request.version = 99
    with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
        nvml.nvmlGpmMetricsGet(request)
    nvml.nvmlGpmSampleFree(one)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlGpmSampleGet(gpu, one)
    with pytest.raises(AssertionError):
        nvml.nvmlGpmSampleFree(one)
    nvml.nvmlGpmSampleFree(two)
    assert nvml.live_gpm_samples() == 0
