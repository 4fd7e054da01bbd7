"""Co-locate advice from measured cross-node traffic and the topology, on hand-built clusters whose answer can be
worked out by hand: the target island, the expected gain, and what is not advised (little traffic, traffic unread,
one multi-node NVLink clique, no island that holds the job)."""
from __future__ import annotations

from datetime import timedelta

import pytest

from gpuledger.analytics.config import Config
from gpuledger.collector.gpu_catalog import MODELS
from gpuledger.collector.topology import GpuLink, GpuPlace, NodeTopology
from gpuledger.policies.colocation import colocate_advice, expected_gain
from gpuledger.policies.quota import HOURS_PER_WEEK
from gpuledger.policies.recommendation import INSUFFICIENT_DATA
from gpuledger.policies.recommender import evaluate
from tests.helpers import T0, gpu_rows, table

MINUTES = 20
AT = T0 + timedelta(minutes=MINUTES)
SPREAD = {"d": ["spread", None, None, "other"], "e": ["spread", "spread", "busy", "busy"]}


def cluster(layout: dict[str, list[str | None]], pcie_gbytes_s: float | None = 20.0, sm_active: float = 0.5,
            model: str = "H100") -> list[dict]:
    """`layout`: node -> the job holding each GPU (None: free). The spread job's GPUs read `pcie_gbytes_s` of PCIe
    per GPU (both directions, split evenly; None: no PCIe counter) and `sm_active`; the other GPUs little."""
    rows = []
    for node, holders in layout.items():
        for gpu, job in enumerate(holders):
            pcie = pcie_gbytes_s if job == "spread" else 0.2
            extra = {} if pcie is None else {"pcie_tx_bps": pcie * 5e8, "pcie_rx_bps": pcie * 5e8}
            rows += gpu_rows(node, gpu, model, MINUTES, 60.0, util=80.0 if job else 0.0, job=job,
                             team="vision" if job else None, sm_active=sm_active if job else 0.0, **extra)
    return rows


def islands_of(store, node: str, sizes: list[int], clique: str | None = None, at=T0) -> None:
    """A measured topology for `node`: consecutive islands of the given sizes (NVLink inside, PCIe between)."""
    owner = [k for k, size in enumerate(sizes) for _ in range(size)]
    places = tuple(GpuPlace(f"GPU-{node}-{g}", g, "H100", owner[g], clique_id=clique) for g in range(len(owner)))
    links = tuple(GpuLink(f"GPU-{node}-{g}", f"GPU-{node}-{h}", "nvlink" if owner[g] == owner[h] else "system")
                  for g in range(len(owner)) for h in range(g + 1, len(owner)))
    store.record_topology(NodeTopology(node, "nvml", "measured", places, links), at)


def test_a_spread_job_with_cross_node_traffic_is_advised_into_one_island_with_its_gain(open_store):
    """3 GPUs: one on d, two on e. e has room 2 (its own), d room 3 (its own + two free): d, island 0 (no topology
    read: an H100 board is one NVSwitch island). 20 GB/s per GPU over a 100 GB/s network is 20% of the time, over
    NVLink (900 GB/s) 2.2%: 17.8% saved (under the 50% the SMs wait), 3 GPUs x 24 h x 0.178 = 12.8 GPU-h a day."""
    with open_store("colo") as s:
        s.append_samples(table(cluster(SPREAD)))
        (advice,) = colocate_advice(s, Config(), AT, s.latest_ts())
        assert (advice.kind, advice.job_id, advice.action) == ("colocate", "spread", {"node": "d", "gpus": 3,
                                                                                      "island": 0})
        e = advice.evidence
        assert e["gpus_per_node"] == {"d": 1, "e": 2} and e["target_basis"] == "model" and "SXM" in e["target_note"]
        assert e["cross_node_gbytes_s_per_gpu"] == pytest.approx(20.0) and e["traffic_coverage"] == pytest.approx(1.0)
        saved = 20.0 / 100.0 - 20.0 / 900.0
        assert e["time_share_saved"] == pytest.approx(saved)
        assert e["gpu_hours_per_day"] == pytest.approx(3 * 24 * saved)
        rate = Config().rates["H100"]
        assert e["effect_usd_per_week"] == pytest.approx(3 * saved * HOURS_PER_WEEK * rate)
        assert "20.0 GB/s per GPU" in advice.reason and "island 0 of d" in advice.reason and "18%" in advice.reason
        assert advice.id in {r.id for r in evaluate(s, Config(), AT).proposals()}  # it joins the stream


def test_the_gain_is_capped_by_the_time_the_sms_wait():
    """Communication overlapped with compute costs nothing: a job whose SMs are busy 95% can gain at most 5%."""
    gain = expected_gain(50.0, 0.95, 8, 900.0, 100.0, 2.0)
    assert gain["time_share_over_network"] == pytest.approx(0.5) and gain["time_share_saved"] == pytest.approx(0.05)
    assert gain["gpu_hours_per_day"] == pytest.approx(8 * 24 * 0.05)
    assert expected_gain(50.0, None, 8, 900.0, 100.0, None)["effect_usd_per_week"] is None  # unpriced: no $
    assert expected_gain(500.0, None, 1, 900.0, 100.0, 1.0)["time_share_over_network"] == 1.0  # a share, capped


def test_little_traffic_gives_no_advice_and_unread_traffic_is_said_to_be_unknown(open_store):
    with open_store("quiet") as s:
        s.append_samples(table(cluster(SPREAD, pcie_gbytes_s=0.5)))
        assert colocate_advice(s, Config(), AT, s.latest_ts()) == []  # under colocate_min_gbytes_s_per_gpu
    with open_store("unread") as s:
        s.append_samples(table(cluster(SPREAD, pcie_gbytes_s=None)))
        (advice,) = colocate_advice(s, Config(), AT, s.latest_ts())
        assert advice.status == INSUFFICIENT_DATA and advice.action == {} and "unknown" in advice.reason
        assert "time_share_saved" not in advice.evidence  # no number where nothing was read
        evaluation = evaluate(s, Config(), AT)
        assert "colocate" not in {r.kind for r in evaluation.proposals()}
        assert "colocate" in {r.kind for r in evaluation.insufficient()}


def test_the_target_is_an_island_that_holds_the_job_not_a_node_with_room_across_islands(open_store):
    """d has 2 islands of 2 (bridged cards): its free GPUs 1, 2 and its own 0 are in two islands, so d does not hold
    the 3-GPU job inside one; f, an 8-GPU board with 4 free in island 1, does."""
    layout = dict(SPREAD, f=["x1", "x2", "x3", "x4", None, None, None, None])
    with open_store("islands") as s:
        s.append_samples(table(cluster(layout)))
        islands_of(s, "d", [2, 2])
        islands_of(s, "f", [4, 4])
        (advice,) = colocate_advice(s, Config(), AT, s.latest_ts())
        assert advice.action == {"node": "f", "gpus": 3, "island": 1}
        assert advice.evidence["target_basis"] == "measured" and advice.evidence["target_spare_gpus"] == 1
        assert advice.evidence["islands_per_node"]["d"] == [0]
    with open_store("islands-none") as s:
        s.append_samples(table(cluster(SPREAD)))
        islands_of(s, "d", [2, 2])
        assert colocate_advice(s, Config(), AT, s.latest_ts()) == []  # no island anywhere holds 3


def test_a_job_inside_one_multi_node_nvlink_clique_already_talks_over_nvlink(open_store):
    with open_store("clique") as s:
        s.append_samples(table(cluster(SPREAD)))
        islands_of(s, "d", [4], clique="nvl72-a")
        islands_of(s, "e", [4], clique="nvl72-a")
        assert colocate_advice(s, Config(), AT, s.latest_ts()) == []
        # the tray moved to another clique: now the network carries the traffic
        islands_of(s, "e", [4], clique="nvl72-b", at=T0 + timedelta(minutes=1))
        assert [r.action["node"] for r in colocate_advice(s, Config(), AT, s.latest_ts())] == ["d"]


def test_a_card_without_nvlink_gets_no_colocate_advice(open_store):
    """Nothing to move the traffic to: the catalogue gives no NVLink rate, so no gain can be stated."""
    assert MODELS["L4"].nvlink_gbytes_s is None
    with open_store("l4") as s:
        s.append_samples(table(cluster(SPREAD, model="L4")))
        assert colocate_advice(s, Config(), AT, s.latest_ts()) == []
