"""NvmlSource against a fake of the hardware that raises nvidia-ml-py's own error classes."""
from __future__ import annotations

import os

import pynvml
import pytest

from gpuledger.collector.attribution import Attributor
from gpuledger.collector.nvml_source import NvmlSource
from gpuledger.collector.proc_attribution import describe_process
from gpuledger.collector.source import SourceError
from tests.fake_nvml import FakeGpu, FakeMig, FakeNvml


def rows(source: NvmlSource) -> dict:
    return {(r["gpu_uuid"], r["mig_instance"]): r for r in source.collect().to_pylist()}


def test_reads_whole_gpus_with_processes_attributed_to_their_owner():
    me = os.getpid()
    nvml = FakeNvml([FakeGpu("GPU-a", util=88, used_mib=40000, processes=[(me, 39000.0)]),
                     FakeGpu("GPU-b", name="NVIDIA L4", total_mib=23034, util=0)])
    user = describe_process(me).user
    source = NvmlSource(nvml, interval_s=10, attributor=Attributor(user_to_team={user: "platform"}), node="n1")
    got = rows(source)
    a, b = got[("GPU-a", None)], got[("GPU-b", None)]
    assert (a["util_pct"], a["mem_used_mib"], a["power_w"], a["temp_c"]) == (88, 40000, 350.0, 55)
    assert a["mem_reserved_mib"] == pytest.approx(300) and a["pcie_tx_bps"] == 1000 * 1024
    assert (a["allocated"], a["user"], a["team"], a["gpu_model"], a["node"]) == (True, user, "platform", "H100", "n1")
    assert (b["allocated"], b["team"], b["gpu_model"]) == (False, None, "L4")
    procs = source.processes.to_pylist()
    assert [(p["gpu_uuid"], p["pid"], p["used_mem_mib"], p["user"]) for p in procs] == [("GPU-a", me, 39000.0, user)]


def test_not_supported_fields_are_skipped_and_not_retried():
    gpu = FakeGpu("GPU-a", unsupported={"nvmlDeviceGetPowerUsage", "nvmlDeviceGetFieldValues",
                                        "nvmlDeviceGetPcieThroughput"})
    nvml = FakeNvml([gpu])
    calls = []
    real = nvml.nvmlDeviceGetPowerUsage

    def counting(handle):
        calls.append(handle)
        return real(handle)

    nvml.nvmlDeviceGetPowerUsage = counting
    source = NvmlSource(nvml)
    first = rows(source)[("GPU-a", None)]
    assert first["power_w"] is None and first["pcie_tx_bps"] is None and first["util_pct"] == 50
    rows(source)
    assert len(calls) == 1  # NotSupported is remembered for the device


def test_memory_falls_back_to_v1_when_v2_is_not_supported():
    class OldDriver(FakeNvml):
        def nvmlDeviceGetMemoryInfo(self, handle, version=None):
            if version:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
            return super().nvmlDeviceGetMemoryInfo(handle)

    row = rows(NvmlSource(OldDriver([FakeGpu("GPU-a", used_mib=2048)])))[("GPU-a", None)]
    assert row["mem_used_mib"] == 2048 and row["mem_reserved_mib"] is None


def test_nvlink_and_energy_counters_become_rates_after_the_first_reading():
    gpu = FakeGpu("GPU-a", nvlink_kib={0: 1000, 1: 3000})
    live = NvmlSource(FakeNvml([gpu]), interval_s=10, nvlink_links=4)
    first = rows(live)[("GPU-a", None)]
    assert first["nvlink_tx_bps"] is None and first["power_avg_w"] is None  # first reading only primes
    gpu.nvlink_kib = {0: gpu.nvlink_kib[0] + 2048, 1: gpu.nvlink_kib[1]}
    gpu.energy_mj += 5_000
    second = rows(live)[("GPU-a", None)]
    assert second["nvlink_tx_bps"] > 0 and second["power_avg_w"] > 0
    gpu.energy_mj = 10  # reset (driver reload): no rate, never negative power
    assert rows(live)[("GPU-a", None)]["power_avg_w"] is None


def test_mig_instances_are_rows_with_profile_fraction_and_owner():
    me = os.getpid()
    gpu = FakeGpu("GPU-m", name="NVIDIA A100-SXM4-80GB", migs=[
        FakeMig("MIG-1", gi_id=1, slices=3, memory_mb=40192, used_mib=10000, processes=[(me, 9000.0)]),
        FakeMig("MIG-2", gi_id=9, slices=1, memory_mb=9856, used_mib=0)])
    got = rows(NvmlSource(FakeNvml([gpu])))
    big, small = got[("GPU-m", 1)], got[("GPU-m", 9)]
    assert big["mig_profile"] == "3g.40gb" and big["gpu_fraction"] == pytest.approx(3 / 7) and big["allocated"]
    assert small["mig_profile"] == "1g.10gb" and not small["allocated"] and small["mem_used_mib"] == 0
    # mixed mode: the 3/7 of the card no instance holds is its idle capacity, so the card bills 1.0, not 4/7
    free = got[("GPU-m", None)]
    assert free["gpu_fraction"] == pytest.approx(3 / 7) and not free["allocated"] and free["util_pct"] is None
    assert sum(r["gpu_fraction"] for r in got.values()) == pytest.approx(1.0)


def test_a_lost_gpu_does_not_hide_the_others_and_init_failure_is_clear():
    nvml = FakeNvml([FakeGpu("GPU-a"), FakeGpu("GPU-b", lost=True), FakeGpu("GPU-c")])
    assert sorted(k[0] for k in rows(NvmlSource(nvml))) == ["GPU-a", "GPU-c"]
    broken = FakeNvml([])
    broken.init_error = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    with pytest.raises(SourceError, match="Driver Not Loaded"):
        NvmlSource(broken).collect()


def test_process_attribution_reads_slurm_and_pod_from_cgroup(tmp_path):
    proc = tmp_path / "4242"
    proc.mkdir()
    (proc / "cgroup").write_text(
        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b2c3d4e_5f6a_7b8c_9d0e_1f2a3b4c5d6e.slice/"
        "cri-containerd-" + "a" * 64 + ".scope\n")
    info = describe_process(4242, tmp_path)
    assert info.pod_uid == "1b2c3d4e-5f6a-7b8c-9d0e-1f2a3b4c5d6e" and info.container_id == "a" * 64
    assert info.job_id == "pod:1b2c3d4e-5f6a-7b8c-9d0e-1f2a3b4c5d6e"
    slurm = tmp_path / "77"
    slurm.mkdir()
    (slurm / "cgroup").write_text("0::/system.slice/slurmstepd.scope/job_123456/step_0/user/task_0\n")
    assert describe_process(77, tmp_path).job_id == "slurm:123456"
    env = tmp_path / "78"
    env.mkdir()
    (env / "cgroup").write_text("0::/user.slice\n")
    (env / "environ").write_bytes(b"HOME=/root\0SLURM_JOB_ID=999\0")
    assert describe_process(78, tmp_path).job_id == "slurm:999"
    assert describe_process(31337, tmp_path).job_id is None  # vanished process: still describable


def test_health_readings_and_xid_events_are_sampled_like_dcgm_reports_them():
    """Throttle bits, volatile ECC counts and remapped rows are read each sample; XIDs arrive as NVML events and
    the sample keeps the last one (0 until the first), as DCGM's XID field does. A GPU without ECC or remapping
    (a consumer card) leaves those out."""
    sick, plain = FakeGpu("GPU-a", clocks_event_reasons=0x40, ecc_corrected=3, remapped_rows=(1, 0, 0, 0)), \
        FakeGpu("GPU-b", name="NVIDIA L4", unsupported={"nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetRemappedRows"})
    nvml = FakeNvml([sick, plain])
    source = NvmlSource(nvml, interval_s=10, node="n1")
    first = rows(source)
    a, b = first[("GPU-a", None)], first[("GPU-b", None)]
    assert (a["xid"], a["throttle_reasons"], a["ecc_sbe_total"], a["ecc_dbe_total"]) == (0, 0x40, 3, 0)
    assert (a["remapped_rows_corr"], a["remapped_rows_uncorr"], a["row_remap_failed"]) == (1, 0, False)
    assert (b["xid"], b["ecc_sbe_total"], b["remapped_rows_corr"]) == (0, None, None)
    nvml.raise_xid(sick, 79)
    second = rows(source)
    assert (second[("GPU-a", None)]["xid"], second[("GPU-b", None)]["xid"]) == (79, 0)
    assert rows(source)[("GPU-a", None)]["xid"] == 79  # kept until the next XID
    source.close()
    assert nvml.event_sets == []


def test_a_vgpu_guest_is_billed_its_profile():
    source = NvmlSource(FakeNvml([FakeGpu("GPU-v", name="GRID A100-10C", total_mib=10240)]), node="n1")
    row = rows(source)[("GPU-v", None)]
    assert (row["gpu_model"], row["gpu_fraction"]) == ("A100-40GB", 0.25)


def _slurm_procs(root, jobs: dict[int, str]) -> None:
    for pid, job in jobs.items():
        (root / str(pid)).mkdir()
        (root / str(pid) / "cgroup").write_text(f"0::/system.slice/slurmstepd.scope/job_{job}/step_0/user/task_0\n")


def test_a_gpu_shared_by_two_jobs_is_split_by_what_each_used_and_each_keeps_its_own_utilisation(tmp_path):
    """Two Slurm jobs on one GPU (30 GB and 10 GB): billed by their processes' SM utilisation where NVML reports
    it per process, else by their memory; never wholly to the first, never over 1.0 in all."""
    _slurm_procs(tmp_path, {4242: "100", 4343: "200"})
    by_memory = FakeGpu("GPU-s", util=70, processes=[(4242, 30720.0), (4343, 10240.0)])
    by_sm = FakeGpu("GPU-t", util=70, processes=[(4242, 30720.0), (4343, 10240.0)],
                    process_util=[(4242, 30), (4343, 50), (4242, 30)])
    no_api = FakeGpu("GPU-u", util=70, processes=[(4242, 30720.0), (4343, 10240.0)],
                     unsupported={"nvmlDeviceGetProcessUtilization"})
    source = NvmlSource(FakeNvml([by_memory, by_sm, no_api]), interval_s=10, node="n1", proc_root=tmp_path)
    got: dict[str, dict[str, dict]] = {}
    for row in source.collect().to_pylist():
        got.setdefault(row["gpu_uuid"], {})[row["job_id"]] = row
    for uuid in ("GPU-s", "GPU-u"):  # no per-process figure: split by memory, utilisation unknown
        jobs = got[uuid]
        assert jobs["slurm:100"]["gpu_fraction"] == pytest.approx(0.75)
        assert jobs["slurm:200"]["gpu_fraction"] == pytest.approx(0.25)
        assert jobs["slurm:100"]["util_pct"] is None and jobs["slurm:200"]["mem_used_mib"] == pytest.approx(10240)
    jobs = got["GPU-t"]
    assert jobs["slurm:100"]["gpu_fraction"] == pytest.approx(30 / 80)  # mean SM of its samples: 30 of 80
    assert (jobs["slurm:100"]["util_pct"], jobs["slurm:200"]["util_pct"]) == (30.0, 50.0)
    for uuid, jobs in got.items():
        assert sum(r["gpu_fraction"] for r in jobs.values()) == pytest.approx(1.0), uuid
        assert all(r["allocated"] for r in jobs.values())
    # the next read asks only for samples newer than those it has seen: none, so memory splits again
    again = {r["job_id"]: r for r in source.collect().to_pylist() if r["gpu_uuid"] == "GPU-t"}
    assert again["slurm:100"]["gpu_fraction"] == pytest.approx(0.75) and again["slurm:100"]["util_pct"] is None
