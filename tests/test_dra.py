"""Kubernetes Dynamic Resource Allocation (issue 44 item 1): a dcgm-exporter page in DRA mode, where one GPU is
claimed by two pods through one ResourceClaim and appears once per pod, is billed once, and the claim is named on
each job's bill (GET /v1/jobs) and as an /allocation aggregate. The page follows dcgm-exporter's DRA labels as the
Kubernetes documentation shows them (KubeletPodResourcesDynamicResources): `dra_claim_name`, `dra_claim_namespace`,
`dra_device_name`, `dra_driver_name`, `dra_pool_name` beside the pod's own labels."""
from __future__ import annotations

from datetime import timedelta

import pandas as pd
import pytest

from gpuledger.analytics.config import Config
from gpuledger.analytics.store import Store
from gpuledger.analytics.windows import utc_now
from gpuledger.collector.dcgm_source import DcgmPageConverter
from tests.helpers import api_client

GH200_RATE = 5.0  # the GH200 has no default rate: the site names one
NODE = "sc-node-7"
GPU0, GPU1 = "GPU-a4f34abc-7715-3560-dcea-7238b9611a45", "GPU-b5e45bcd-8826-4671-edfb-8349c0722b56"


def _series(gpu: int, uuid: str, pod: str, claim: str, device: str, util: float, mem: float) -> list[str]:
    labels = (f'gpu="{gpu}",UUID="{uuid}",pci_bus_id="0000000{gpu + 9}:01:00.0",device="nvidia{gpu}",'
              f'modelName="NVIDIA GH200 96GB HBM3",Hostname="{NODE}",container="ctr",dra_claim_name="{claim}",'
              f'dra_claim_namespace="gpu-test3",dra_device_name="{device}",dra_driver_name="gpu.nvidia.com",'
              f'dra_pool_name="{NODE}",namespace="gpu-test3",pod="{pod}"')
    return [f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} {util}", f"DCGM_FI_DEV_FB_USED{{{labels}}} {mem}"]


def page(claim0: str = "single-gpu") -> str:
    """GPU 0 claimed by pod1 and pod2 through one claim (a series per pod), GPU 1 by pod3 through its own."""
    lines = ["# TYPE DCGM_FI_DEV_GPU_UTIL gauge", "# TYPE DCGM_FI_DEV_FB_USED gauge"]
    lines += _series(0, GPU0, "pod1", claim0, "gpu-0", 40, 1200)
    lines += _series(0, GPU0, "pod2", claim0, "gpu-0", 40, 1200)
    lines += _series(1, GPU1, "pod3", "train-claim", "gpu-1", 90, 60000)
    return "\n".join(lines) + "\n"


@pytest.fixture
def dra_store(tmp_path):
    end = utc_now().replace(second=0, microsecond=0) - timedelta(minutes=5)
    start = end - timedelta(minutes=30)
    store = Store(tmp_path / "dra.duckdb")
    store.set_rates({**Config().rates, "GH200": GH200_RATE})
    converter = DcgmPageConverter()
    for i in range(180):
        store.append_samples(converter.convert(page(), start + timedelta(seconds=10 * i), 10.0))
    store.fold(until=end + timedelta(minutes=1))
    yield store
    store.close()


def test_a_page_in_dra_mode_carries_each_rows_claim_and_device():
    rows = DcgmPageConverter().convert(page(), utc_now(), 10.0).to_pandas().set_index("pod")
    assert rows.loc["pod1", "dra_claim"] == rows.loc["pod2", "dra_claim"] == "gpu-test3/single-gpu"
    assert rows.loc["pod1", "dra_device"] == f"gpu.nvidia.com/{NODE}/gpu-0"
    assert rows.loc["pod1", "gpu_fraction"] + rows.loc["pod2", "gpu_fraction"] == pytest.approx(1.0)
    assert rows.loc["pod3", "dra_claim"] == "gpu-test3/train-claim" and rows.loc["pod3", "gpu_fraction"] == 1.0
    assert set(rows["gpu_model"]) == {"GH200"}


def test_a_malformed_claim_loses_its_name_never_the_gpus_row():
    rows = DcgmPageConverter().convert(page(claim0="x<script>"), utc_now(), 10.0).to_pandas().set_index("pod")
    assert pd.isna(rows.loc["pod1", "dra_claim"]) and rows.loc["pod1", "gpu_fraction"] == pytest.approx(0.5)
    assert rows.loc["pod3", "dra_claim"] == "gpu-test3/train-claim"


def test_a_gpu_claimed_by_two_pods_is_billed_once_and_each_bill_names_the_claim(dra_store):
    with api_client(dra_store, Config(), open_reads=True) as client:
        jobs = {j["job_id"]: j for j in client.get("/v1/jobs", params={"days": 1}).json()}
        costs = client.get("/v1/costs", params={"days": 1}).json()
        claims = client.get("/allocation", params={"window": "1d", "aggregate": "claim"}).json()["data"][0]
        pods = client.get("/allocation", params={"window": "1d", "aggregate": "pod"}).json()["data"][0]
        held = client.get("/v1/gpus", params={"days": 1}).json()["holders"]
    assert jobs["gpu-test3/pod1"]["dra_claims"] == jobs["gpu-test3/pod2"]["dra_claims"] == ["gpu-test3/single-gpu"]
    assert jobs["gpu-test3/pod3"]["dra_claims"] == ["gpu-test3/train-claim"]
    # half an hour of each GPU: GPU 0 split between its two pods, once
    assert jobs["gpu-test3/pod1"]["gpu_hours"] + jobs["gpu-test3/pod2"]["gpu_hours"] == pytest.approx(0.5)
    assert jobs["gpu-test3/pod3"]["gpu_hours"] == pytest.approx(0.5)
    assert set(claims) == {"gpu-test3/single-gpu", "gpu-test3/train-claim"}
    # the Nodes page's inventory: each GPU's holders with the claim they hold it through
    assert {(h["gpu_uuid"], h["job_id"], h["dra_claim"]) for h in held} == {
        (GPU0, "gpu-test3/pod1", "gpu-test3/single-gpu"), (GPU0, "gpu-test3/pod2", "gpu-test3/single-gpu"),
        (GPU1, "gpu-test3/pod3", "gpu-test3/train-claim")}
    assert claims["gpu-test3/single-gpu"]["gpuHours"] == pytest.approx(0.5)
    assert claims["gpu-test3/single-gpu"]["properties"]["claim"] == "gpu-test3/single-gpu"
    total = sum(a["totalCost"] for a in claims.values())
    assert total == pytest.approx(sum(a["totalCost"] for a in pods.values()), abs=0.01)
    assert total == pytest.approx(costs["total_usd"], abs=0.01) == pytest.approx(1.0 * GH200_RATE, abs=0.01)


def test_claims_are_derived_again_when_a_late_batch_arrives(dra_store):
    before = dra_store.query("SELECT dra_claim, sum(gpu_s) AS s FROM dra_claim_hours GROUP BY 1 ORDER BY 1")
    first = dra_store.scalar("SELECT min(ts) FROM samples")
    late = DcgmPageConverter().convert(page(), first - timedelta(seconds=10), 10.0)
    dra_store.append_samples(late)
    dra_store.fold()
    after = dra_store.query("SELECT dra_claim, sum(gpu_s) AS s FROM dra_claim_hours GROUP BY 1 ORDER BY 1")
    assert list(after["dra_claim"]) == list(before["dra_claim"])
    assert (after["s"] - before["s"]).tolist() == pytest.approx([10.0, 10.0])  # one more reading of each GPU, once
