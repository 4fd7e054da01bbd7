"""Every real dcgm-exporter page in ../shared/dcgm-pages becomes the rows it should: per page, the GPUs and MIG
instances, model, node, pods and fields written down once in PAGES below (checked against each page's source
line), and on every page, listed or not, no physical GPU billed more than 1.0. A page dropped into the folder
is checked for the invariants with no code change; add a line to PAGES to pin what it must yield."""
from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import pytest

from gpuledger.collector.dcgm_source import DcgmPageConverter, bill_each_gpu_once

SHARED_PAGES = Path(__file__).resolve().parent.parent.parent / "shared" / "dcgm-pages"
FILES = sorted(SHARED_PAGES.glob("*.txt"))
NOW = datetime(2026, 12, 1, tzinfo=timezone.utc)


@dataclass(frozen=True)
class Page:
    gpus: int  # physical GPUs (UUIDs)
    instances: int  # MIG instance rows
    models: tuple[str, ...]
    node: str  # "unknown" where the page names only the exporter's container or pod, or nothing
    allocated: int  # rows held by a pod
    billed: float  # the page's GPU fractions, summed
    fields: tuple[str, ...]  # sample columns the page fills


SEEN = ("mem_used_mib", "nvlink_bps", "pcie_tx_bps", "power_w", "tensor_active", "temp_c", "throttle_reasons",
        "util_pct", "xid")
CONFORMANCE = ("mem_used_mib", "pcie_tx_bps", "power_w", "tensor_active", "temp_c", "util_pct")
PAGES = {
    "datadog-integrations-core-dcgm-fixture-t4-460.txt":  # Hostname is the exporter's container id
        Page(1, 0, ("T4",), "unknown", 0, 1.0, ("mem_used_mib", "nvlink_bps", "power_w", "temp_c", "util_pct", "xid")),
    "dcgm-exporter-issue-188-1x-compat-names.txt":  # dcgm_* 1.x names; Hostname is the exporter's pod
        Page(1, 0, ("unknown",), "unknown", 0, 1.0, ("power_w", "temp_c", "util_pct")),
    "dcgm-exporter-issue-250-v100.txt": Page(4, 0, ("V100",), "r6i3n0", 0, 4.0, ("util_pct",)),
    # 1g.6gb is a quarter of an A30 (4 compute slices), not a seventh; each card's quarter no instance holds is its
    # idle capacity (a row of its own), so the two cards bill 2.0 in all, not 1.5
    "dcgm-exporter-issue-317-a30-mig.txt":
        Page(2, 6, ("A30",), "yg-data-k8s-gpu-a30-node-test-test0003.mt", 0, 2.0, ("tensor_active", "util_pct")),
    "dcgm-exporter-issue-363-rtxa5000.txt":
        Page(1, 0, ("RTX-A5000",), "k8s-gpu1", 0, 1.0, ("mem_used_mib", "util_pct")),
    # MIG without the card's own series: 3/7 held, 4/7 the card's idle capacity
    "dcgm-exporter-issue-512-h100-mig-pods.txt": Page(1, 3, ("H100",), "gsrh100-074", 2, 1.0, ("util_pct",)),
    "dcgm-exporter-issue-544-h100nvl-mig.txt":  # the profile as pasted, "**1g.11gb**": one slice each, not a GPU
        Page(1, 2, ("H100-NVL",), "vijay-1-bodha-h100-nvl-nfm45-5h7w7-gj5nn-9sbrb", 0, 1.0, ("mem_used_mib",)),
    "dcgm-exporter-issue-58-titanv-podhostname.txt":  # only clock series: the GPUs are there, nothing else is
        Page(5, 0, ("NVIDIA TITAN V",), "unknown", 0, 5.0, ()),
    "dcgm-exporter-readme-sentinel-9223372036854775794.txt": Page(1, 0, ("unknown",), "unknown", 0, 1.0, ()),
    "gpu-monitoring-tools-issue-138-old-labels.txt":  # no Hostname, no modelName
        Page(1, 0, ("unknown",), "unknown", 0, 1.0, ("power_w", "temp_c", "util_pct")),
    "k8s-ai-conformance-ericsson-T4-nohelp.txt": Page(1, 0, ("T4",), "cp-bm14r7", 0, 1.0, CONFORMANCE),
    "k8s-ai-conformance-kops-L4.txt": Page(1, 0, ("L4",), "i-030791dc5a37cd257", 0, 1.0, CONFORMANCE),
    "nvidia-aicr-conformance-h100x8-pods.txt":
        Page(8, 0, ("H100",), "gpu-node-1", 1, 8.0, ("power_w", "temp_c", "util_pct")),
    "nvidia-cloud-native-docs-dcgm-exporter-rst-a100-mig-2.4.txt":  # -d g+i: the GPU and its one 1g.5gb instance;
        # the card is named by the profile only, and the GPU row is the six sevenths no instance holds
        Page(1, 1, ("A100-40GB",), "ub20-a100-k8s", 0, 1.0, (*CONFORMANCE, "nvlink_bps", "xid")),
}


def rows(path: Path):
    return DcgmPageConverter().convert(path.read_text(), NOW, 10.0).to_pandas()


def test_the_shared_pages_are_there():
    assert len(FILES) >= len(PAGES), f"expected the real pages in {SHARED_PAGES}"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_no_physical_gpu_is_billed_more_than_once_on_any_page(path):
    got = rows(path)
    has_gpu_series = re.search(r'(?m)^[A-Za-z_]+\{[^}]*\b(UUID|uuid)="', path.read_text())
    assert (len(got) > 0) == bool(has_gpu_series)
    if len(got):
        per_gpu = got.groupby(["node", "gpu_uuid"])["gpu_fraction"].sum()
        assert (per_gpu <= 1.0 + 1e-9).all(), per_gpu[per_gpu > 1.0].to_dict()
        # and nothing of a MIG card is lost: its instances and the part none holds bill the whole card
        mig_cards = got[got["mig_instance"].notna()].groupby(["node", "gpu_uuid"]).size().index
        assert all(per_gpu[card] == pytest.approx(1.0) for card in mig_cards), per_gpu.to_dict()
        assert got["gpu_fraction"].between(0.0, 1.0).all()
        assert not got["node"].str.match(r"^[0-9a-f]{12}$|^(nvidia-)?dcgm-exporter-[a-z0-9]{5}$").any()


@pytest.mark.parametrize("path", [p for p in FILES if p.name in PAGES], ids=lambda p: p.name)
def test_each_page_yields_the_rows_written_down_for_it(path):
    want, got = PAGES[path.name], rows(path)
    assert got["gpu_uuid"].nunique() == want.gpus
    assert int(got["mig_instance"].notna().sum()) == want.instances
    assert tuple(sorted(set(got["gpu_model"]))) == want.models
    assert set(got["node"]) == {want.node}
    assert int(got["allocated"].sum()) == want.allocated
    assert got["gpu_fraction"].sum() == pytest.approx(want.billed)
    filled = tuple(sorted(c for c in SEEN if got[c].notna().any()))
    assert filled == tuple(sorted(want.fields))


def test_every_page_in_the_table_exists():
    assert set(PAGES) <= {p.name for p in FILES}


def test_instances_claiming_more_than_the_card_are_scaled_and_the_gpu_row_keeps_the_rest():
    def row(instance, fraction, job=None):
        return {"node": "n", "gpu_uuid": "GPU-1", "mig_instance": instance, "gpu_fraction": fraction,
                "gpu_model": "unknown" if instance is None else "H100", "allocated": job is not None,
                "job_id": job, "team": None, "pod": None, "namespace": None, "container": None}
    over = bill_each_gpu_once([row(None, 1.0, "whole"), row(1, 4 / 7, "a"), row(2, 4 / 7), row(3, None)])
    assert sum(r["gpu_fraction"] for r in over) == pytest.approx(1.0)
    whole = over[0]
    assert whole["gpu_fraction"] == 0.0 and not whole["allocated"] and whole["gpu_model"] == "H100"
    partial = bill_each_gpu_once([row(None, 1.0), row(1, 3 / 7), row(2, None), row(3, None)])
    assert [r["gpu_fraction"] for r in partial] == pytest.approx([0.0, 3 / 7, 2 / 7, 2 / 7])


def test_a_gpu_shared_by_pods_bills_each_pod_an_equal_part():
    """Time-slicing: the exporter repeats GPU 0's series once per pod. Built from the real 8 x H100 page by
    repeating GPU 0's pod series for two more pods."""
    page = (SHARED_PAGES / "nvidia-aicr-conformance-h100x8-pods.txt").read_text()
    held = [line for line in page.splitlines() if 'pod="vllm-agg-0-vllmdecodeworker-s65j5"' in line]
    assert held, "the page's pod series"
    extra = [line.replace("vllmdecodeworker-s65j5", f"sliced-{n}") for n in (1, 2) for line in held]
    got = DcgmPageConverter().convert(page + "\n" + "\n".join(extra) + "\n", NOW, 10.0).to_pandas()
    gpu0 = got[got["gpu_uuid"] == "GPU-c4529c8d-69c4-b61d-e0bc-7b2460096005"]
    assert len(gpu0) == 3 and gpu0["allocated"].all()
    assert gpu0["gpu_fraction"].tolist() == pytest.approx([1 / 3] * 3)
    assert sorted(gpu0["pod"]) == ["vllm-agg-0-sliced-1", "vllm-agg-0-sliced-2", "vllm-agg-0-vllmdecodeworker-s65j5"]
    # the device at 0% is each pod at 0% (nobody used it); a busy device's utilisation is not each pod's: unknown
    # per pod (the exporter has no per-pod figure here), never the device's figure three times over
    assert gpu0["util_pct"].tolist() == [0.0, 0.0, 0.0]
    busy = "\n".join(re.sub(r"} 0$", "} 90", line) if line.startswith("DCGM_FI_DEV_GPU_UTIL") else line
                     for line in (page + "\n" + "\n".join(extra)).splitlines())
    shared = DcgmPageConverter().convert(busy + "\n", NOW, 10.0).to_pandas()
    assert shared[shared["gpu_uuid"] == "GPU-c4529c8d-69c4-b61d-e0bc-7b2460096005"]["util_pct"].isna().all()
    assert shared[shared["gpu_uuid"] != "GPU-c4529c8d-69c4-b61d-e0bc-7b2460096005"]["util_pct"].eq(90).all()
    assert got["gpu_fraction"].sum() == pytest.approx(8.0)


def test_a_vgpu_guest_bills_its_profile_not_the_card():
    """A vGPU guest's exporter names the profile as the model ("GRID A100-10C": 10 GB of a 40 GB A100)."""
    page = (SHARED_PAGES / "dcgm-exporter-issue-250-v100.txt").read_text()
    for name, model, share in (("GRID A100-10C", "A100-40GB", 0.25), ("NVIDIA A100D-20C", "A100-80GB", 0.25),
                               ("GRID T4-16Q", "T4", 1.0)):
        got = DcgmPageConverter().convert(re.sub(r'modelName="[^"]*"', f'modelName="{name}"', page), NOW, 10.0)
        got = got.to_pandas()
        assert set(got["gpu_model"]) == {model} and got["gpu_fraction"].tolist() == pytest.approx([share] * 4)


def test_shared_gpu_split_follows_hami_requests_when_every_sharer_is_known():
    from gpuledger.collector.dcgm_source import PodFacts
    page = (SHARED_PAGES / "nvidia-aicr-conformance-h100x8-pods.txt").read_text()
    held = [line for line in page.splitlines() if 'pod="vllm-agg-0-vllmdecodeworker-s65j5"' in line]
    extra = [line.replace("vllmdecodeworker-s65j5", "sliced-1") for line in held]
    converter = DcgmPageConverter()
    namespace = re.search(r'namespace="([^"]+)"', held[0]).group(1)
    converter.pods = {(namespace, "vllm-agg-0-vllmdecodeworker-s65j5"): PodFacts("serving", 0.3),
                      (namespace, "vllm-agg-0-sliced-1"): PodFacts(None, 0.6)}
    got = converter.convert(page + "\n" + "\n".join(extra) + "\n", NOW, 10.0).to_pandas()
    shared = got[got["pod"].notna()].set_index("pod")
    assert shared.loc["vllm-agg-0-vllmdecodeworker-s65j5", "gpu_fraction"] == pytest.approx(1 / 3)
    assert shared.loc["vllm-agg-0-sliced-1", "gpu_fraction"] == pytest.approx(2 / 3)
    assert shared.loc["vllm-agg-0-vllmdecodeworker-s65j5", "team"] == "serving"  # the pod's team label wins
    converter.pods.pop((namespace, "vllm-agg-0-sliced-1"))  # one request unknown: equal parts
    got = converter.convert(page + "\n" + "\n".join(extra) + "\n", NOW, 10.0).to_pandas()
    assert got[got["pod"].notna()]["gpu_fraction"].tolist() == pytest.approx([0.5, 0.5])


def test_the_kubernetes_node_a_scrape_config_attached_names_the_node():
    page = (SHARED_PAGES / "dcgm-exporter-issue-58-titanv-podhostname.txt").read_text()
    relabelled = page.replace('Hostname="', 'kubernetes_node="gpu-node-7",Hostname="')
    got = DcgmPageConverter().convert(relabelled, NOW, 10.0).to_pandas()
    assert set(got["node"]) == {"gpu-node-7"}


def test_pcie_throughput_of_older_exporters_is_read_in_kb_per_second():
    line = 'DCGM_FI_DEV_PCIE_TX_THROUGHPUT{gpu="0",UUID="GPU-1",modelName="Tesla V100-SXM2-32GB",Hostname="n"} 2048\n'
    got = DcgmPageConverter().convert(line + line.replace("TX", "RX").replace("2048", "1024"), NOW, 10.0).to_pylist()
    assert (got[0]["pcie_tx_bps"], got[0]["pcie_rx_bps"]) == (2048 * 1024.0, 1024 * 1024.0)


GPU0 = "GPU-c4529c8d-69c4-b61d-e0bc-7b2460096005"
DECODE, SLICED = "vllm-agg-0-vllmdecodeworker-s65j5", "vllm-agg-0-sliced-1"


def hami_monitor_page(use: dict[str, tuple[float, float]], legacy_too: bool = True) -> str:
    """HAMi's vGPU monitor page (2.8+ names, and with --legacy-metrics the older names too) for pods sharing GPU 0:
    pod -> (SM use in per cent, memory used in GiB)."""
    lines = []
    for pod, (core, gib) in use.items():
        new = f'namespace="dynamo-workload",pod="{pod}",container="main",vdevice_index="0",device_uuid="{GPU0}"'
        old = f'podnamespace="dynamo-workload",podname="{pod}",ctrname="main",vdeviceid="0",deviceuuid="{GPU0}"'
        lines += [f"hami_container_device_utilization_ratio{{{new}}} {core}",
                  f"hami_vgpu_memory_used_bytes{{{new}}} {gib * 2**30:.0f}",
                  f"hami_container_device_memory_bytes{{{new}}} {gib * 2**30:.0f}"]
        if legacy_too:  # the same values under the legacy names: read once, not twice
            lines += [f"Device_utilization_desc_of_container{{{old},zone=\"vGPU\"}} {core}",
                      f"vGPU_device_memory_usage_in_bytes{{{old},zone=\"vGPU\"}} {gib * 2**30:.0f}"]
    return "\n".join(lines) + "\n"


def sliced_page(device_util: float = 90.0) -> str:
    page = (SHARED_PAGES / "nvidia-aicr-conformance-h100x8-pods.txt").read_text()
    held = [line for line in page.splitlines() if f'pod="{DECODE}"' in line]
    extra = [line.replace("vllmdecodeworker-s65j5", "sliced-1") for line in held]
    return "\n".join(re.sub(r"} \S+$", f"}} {device_util}", line) if line.startswith("DCGM_FI_DEV_GPU_UTIL") else line
                     for line in (page + "\n" + "\n".join(extra)).splitlines()) + "\n"


def _use_at(page: str, ts: float, sampled: float | None = None) -> dict:
    """Each pod's use at `ts` from the monitor page sampled at `sampled` (default: then)."""
    from gpuledger.collector.apps.hami import ContainerUse
    from gpuledger.collector.prom_text import parse
    series = [(name, labels, [(ts if sampled is None else sampled, value)])
              for name, labels, value, _ in parse(page).samples]
    return ContainerUse(series).at(ts)


def test_sharers_carry_what_hami_measured_and_split_by_it_when_no_request_is_known():
    from gpuledger.collector.dcgm_source import PodFacts
    used = _use_at(hami_monitor_page({DECODE: (45.0, 10.0), SLICED: (15.0, 2.0)}), NOW.timestamp())
    assert used[("dynamo-workload", DECODE)][GPU0].core == pytest.approx(0.45)  # one generation read, not both
    assert used[("dynamo-workload", DECODE)][GPU0].mem_mib == pytest.approx(10 * 1024)
    converter = DcgmPageConverter()
    converter.pods = {key: PodFacts(used=gpus) for key, gpus in used.items()}
    got = converter.convert(sliced_page(), NOW, 10.0).to_pandas()
    shared = got[got["gpu_uuid"] == GPU0].set_index("pod")
    # no requests: parts by measured use (45 : 15), each with its own figures over its part (45% of the SMs over
    # 3/4 of the GPU is 60% busy), never the device's 90%
    assert shared.loc[DECODE, "gpu_fraction"] == pytest.approx(0.75)
    assert shared.loc[SLICED, "gpu_fraction"] == pytest.approx(0.25)
    assert shared["util_pct"].tolist() == pytest.approx([60.0, 60.0])
    assert shared.loc[SLICED, "mem_used_mib"] == pytest.approx(2 * 1024)
    # with HAMi requests (gpucores 50 each) the parts follow the requests and the figures stay each pod's own
    converter.pods = {key: PodFacts(gpu_share=0.5, used=gpus) for key, gpus in used.items()}
    got = converter.convert(sliced_page(), NOW, 10.0).to_pandas().set_index("pod")
    assert got.loc[DECODE, "gpu_fraction"] == pytest.approx(0.5) and got.loc[DECODE, "util_pct"] == pytest.approx(90)
    assert got.loc[SLICED, "util_pct"] == pytest.approx(30)
    assert got[got["gpu_uuid"] == GPU0]["gpu_fraction"].sum() == pytest.approx(1.0)  # billed once, nothing lost
    # a monitor sample older than the lookback stands for nothing now
    assert _use_at(hami_monitor_page({DECODE: (45.0, 10.0)}), NOW.timestamp(), NOW.timestamp() - 600) == {}
    assert _use_at(hami_monitor_page({DECODE: (45.0, 10.0)}), NOW.timestamp(), NOW.timestamp() - 60) != {}
