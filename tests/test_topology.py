"""GPU topology, collected and kept: NVML's answers (the fake, faithful to nvidia-ml-py's names and errors), every
shared dcgm-exporter page, an agent's post to a real server, the history of changes, and what the API shows."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pynvml
import pytest
import requests

from gpuledger.analytics.config import Config, TopologyConfig
from gpuledger.analytics.fragmentation import TaskShape, current_state
from gpuledger.analytics.topology import cluster_topology, slot_islands, topology_history
from gpuledger.collector.agent.agent import Agent
from gpuledger.collector.agent.spool import Spool
from gpuledger.collector.dcgm_source import DcgmPageConverter
from gpuledger.collector.jobs.kube_state import parse_kube_state
from gpuledger.collector.nvml_source import NvmlSource
from gpuledger.collector.topology import GpuLink, GpuPlace, NodeTopology
from gpuledger.deploy.collect_loop import CollectLoop
from gpuledger.policies.placers import ClusterState, Task
from gpuledger.policies.placers.fgd import FgdPlacer
from tests.fake_nvml import FakeGpu, FakeNvml, bridge, nvswitch_board
from tests.helpers import T0, api_client, gpu_rows, table
from tests.procs import TOKEN

SHARED = Path(__file__).resolve().parents[2] / "shared"
PAGES = sorted((SHARED / "dcgm-pages").glob("*.txt")) + sorted((SHARED / "app-pages" / "dcgm-prof").glob("*.txt"))
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)


def two_boards() -> tuple[FakeNvml, list[FakeGpu]]:
    """A 16-GPU node with two 8-GPU NVSwitch boards on two NUMA nodes, the second board in an NVLink fabric."""
    gpus = [FakeGpu(f"GPU-a{i:02d}", numa_node=i // 8, cpus=tuple(range(56 * (i // 8), 56 * (i // 8) + 56)))
            for i in range(16)]
    nvml = FakeNvml(gpus)
    nvswitch_board(nvml, gpus[:8])
    nvswitch_board(nvml, gpus[8:], switch_bus="00000000:f0:00.0")
    for gpu in gpus[8:]:
        gpu.fabric = (bytes(range(1, 17)), 7)
    return nvml, gpus


def test_nvml_topology_islands_numa_cpus_and_fabric():
    nvml, gpus = two_boards()
    found = NvmlSource(nvml=nvml, node="n1").topology()[0]
    assert found.basis == "measured" and found.source == "nvml" and not found.notes
    by_uuid = {g.uuid: g for g in found.gpus}
    assert {by_uuid[g.uuid].island for g in gpus[:8]} == {0} and {by_uuid[g.uuid].island for g in gpus[8:]} == {1}
    assert by_uuid["GPU-a00"].cpu_affinity == "0-55" and by_uuid["GPU-a15"].cpu_affinity == "56-111"
    assert by_uuid["GPU-a15"].numa_node == 1 and by_uuid["GPU-a03"].pci_bus_id == "00000000:04:00.0"
    assert by_uuid["GPU-a09"].clique_id == "7" and by_uuid["GPU-a09"].cluster_uuid.startswith("01020304-0506")
    assert by_uuid["GPU-a01"].clique_id is None and by_uuid["GPU-a01"].nvlink_links == 18
    paths = {(k.gpu, k.peer): k.path for k in found.links}
    assert len(paths) == 16 * 15 // 2
    assert paths[("GPU-a00", "GPU-a07")] == "nvlink"
    assert paths[("GPU-a00", "GPU-a08")] == "system"  # other board, other NUMA node: across the CPUs


def test_nvml_contradiction_is_noted_and_not_an_island():
    """A bridge one card reports and its peer does not: the pair is not NVLink, and a note says why."""
    gpus = [FakeGpu(f"GPU-b{i}", name="NVIDIA H100 NVL") for i in range(4)]
    nvml = FakeNvml(gpus)
    bridge(nvml, gpus[0], gpus[1])
    bridge(nvml, gpus[2], gpus[3])
    gpus[3].nvlinks.clear()  # GPU-b3 no longer sees its side of the bridge
    found = NvmlSource(nvml=nvml, node="n2").topology()[0]
    island = {g.uuid: g.island for g in found.gpus}
    assert island["GPU-b0"] == island["GPU-b1"] and len({island["GPU-b2"], island["GPU-b3"], island["GPU-b0"]}) == 3
    assert any("GPU-b2 reports 4 NVLink link(s) to GPU-b3, which reports 0 back" in n for n in found.notes)
    nvlink = [(k.gpu, k.peer, k.nvlinks) for k in found.links if k.path == "nvlink"]
    assert nvlink == [("GPU-b0", "GPU-b1", 4)]


def test_nvml_without_nvlink_numa_or_new_names_leaves_them_unknown():
    """A PCIe card without NVLink (NotSupported), a system without NUMA information, an nvidia-ml-py without
    nvmlDeviceGetNumaNodeId or fabric info: those facts are None, the GPUs are still placed, one island each."""

    class OldNvml(FakeNvml):
        def __getattribute__(self, name: str):
            if name in ("nvmlDeviceGetNumaNodeId", "nvmlDeviceGetGpuFabricInfo", "c_nvmlGpuFabricInfo_t"):
                raise AttributeError(f"module 'pynvml' has no attribute '{name}'")
            return super().__getattribute__(name)

    gpus = [FakeGpu(f"GPU-c{i}", name="NVIDIA L4", nvlink_ports=0, numa_node=None) for i in range(2)]
    found = NvmlSource(nvml=OldNvml(gpus), node="n3").topology()[0]
    assert [(g.island, g.numa_node, g.nvlink_links, g.clique_id) for g in found.gpus] == [(0, None, None, None),
                                                                                        (1, None, None, None)]
    assert {k.path for k in found.links} == {"system"}  # NUMA unknown: the fake's default, across the CPUs


def test_fake_answers_as_nvml_does():
    """The fake's errors are nvidia-ml-py's classes: a link past the card's is Invalid Argument, NVLink on a card
    without it Not Supported, fabric info on a GPU outside a fabric Not Supported."""
    nvml, gpus = two_boards()
    nvml.nvmlInit()
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetNvLinkState(gpus[0], 18)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetNvLinkState(FakeGpu("GPU-x", nvlink_ports=0), 0)
    info = pynvml.c_nvmlGpuFabricInfo_t()
    import ctypes
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetGpuFabricInfo(gpus[0], ctypes.byref(info))
    assert nvml.nvmlDeviceGetP2PStatus(gpus[0], gpus[7], pynvml.NVML_P2P_CAPS_INDEX_NVLINK) == \
        pynvml.NVML_P2P_STATUS_OK
    assert nvml.nvmlDeviceGetTopologyCommonAncestor(gpus[0], gpus[1]) == pynvml.NVML_TOPOLOGY_NODE


def test_collect_loop_keeps_one_snapshot_per_change_and_the_api_shows_islands(file_store):
    nvml, gpus = two_boards()
    source = NvmlSource(nvml=nvml, node="n1")
    loop = CollectLoop(source, file_store, 10.0)
    loop.collect_once()
    loop.topology_due = 0.0
    loop.collect_once()  # the same topology read again: nothing new stored
    assert file_store.scalar("SELECT count(*) FROM topology_snapshots") == 1
    for gpu in gpus[4:8]:  # half of the first board loses its switch links (a failed NVSwitch tray)
        gpu.nvlinks.clear()
    loop.topology_due = 0.0
    loop.collect_once()
    assert file_store.scalar("SELECT count(*) FROM topology_snapshots") == 2
    now = datetime.now(timezone.utc) + timedelta(seconds=1)
    answer = cluster_topology(file_store, now)
    (node,) = answer["nodes"]
    assert [i["gpus"] for i in node["islands"]] == [4, 1, 1, 1, 1, 8]
    assert node["largest_island"] == 8 and node["basis"] == "measured"
    changes = topology_history(file_store, "n1", now - timedelta(hours=1), now)
    assert changes["islands"].tolist() == [2, 6]
    with api_client(file_store, Config(), open_reads=True) as client:
        body = client.get("/v1/topology").json()
        assert [i["gpus"] for i in body["nodes"][0]["islands"]] == [4, 1, 1, 1, 1, 8]
        assert body["missing"] == []  # n1's samples have a topology
        assert len(client.get("/v1/topology/n1/history").json()["snapshots"]) == 2


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_shared_dcgm_page_gives_a_topology_or_says_why_not(page, file_store):
    """Every page's GPUs are placed on their node (a page naming no node gives none: 'unknown' is no place), with
    the rule of the inference in the notes; stored and read back whole."""
    converter = DcgmPageConverter()
    table = converter.convert(page.read_text(errors="replace"), NOW, 30.0)
    found = converter.topology.topologies()
    named = {n for n in table.column("node").to_pylist() if n != "unknown"}
    assert {t.node for t in found} == named
    for topology in found:
        assert topology.basis == "inferred" and topology.notes
        assert file_store.record_topology(topology, NOW)
        stored = cluster_topology(file_store, NOW + timedelta(seconds=1), topology.node)["nodes"][0]
        assert stored["gpus"] == len(topology.gpus) == len({g.uuid for g in topology.gpus})


def test_h100_page_is_one_inferred_island_of_eight():
    page = SHARED / "dcgm-pages" / "nvidia-aicr-conformance-h100x8-pods.txt"
    converter = DcgmPageConverter()
    converter.convert(page.read_text(), NOW, 30.0)
    (found,) = converter.topology.topologies()
    assert found.node == "gpu-node-1" and {g.island for g in found.gpus} == {0} and len(found.gpus) == 8
    assert "inferred from the model" in found.notes[0]
    assert {g.pci_bus_id for g in found.gpus} >= {"00000000:53:00.0", "00000000:64:00.0"}


def p2p_page(pairs: dict[tuple[int, int], str]) -> str:
    """A dcgm-exporter page with DCGM_EXP_P2P_STATUS series as dcgm-exporter 4.3+ writes them (labels peer_gpu and
    link_status, value the status number) for four GPUs of node p2p-node."""
    lines = ["# HELP DCGM_EXP_P2P_STATUS P2P NvLink status", "# TYPE DCGM_EXP_P2P_STATUS gauge"]
    codes = {"OK": 0, "NotSupported": 4}
    for (gpu, peer), status in pairs.items():
        lines.append(f'DCGM_EXP_P2P_STATUS{{gpu="{gpu}",UUID="GPU-p{gpu}",pci_bus_id="00000000:{gpu + 1:02X}:00.0",'
                     f'device="nvidia{gpu}",modelName="NVIDIA H100 NVL",Hostname="p2p-node",peer_gpu="{peer}",'
                     f'link_status="{status}"}} {codes[status]}')
    return "\n".join(lines) + "\n"


def test_dcgm_p2p_status_measures_islands_and_notes_a_one_sided_link():
    pairs = {(a, b): "NotSupported" for a in range(4) for b in range(4) if a != b}
    pairs[(0, 1)] = pairs[(1, 0)] = "OK"
    pairs[(2, 3)] = "OK"  # GPU 3 does not say the same of GPU 2
    converter = DcgmPageConverter()
    converter.convert(p2p_page(pairs), NOW, 30.0)
    (found,) = converter.topology.topologies()
    assert found.basis == "measured"
    assert [g.island for g in sorted(found.gpus, key=lambda g: g.index)] == [0, 0, 1, 2]
    assert found.notes == ("GPU 2 reports NVLink P2P to GPU 3 as OK, GPU 3 to GPU 2 as not OK: not counted as "
                           "NVLink",)


def test_agent_posts_its_topology_once_per_change_to_a_real_server(tmp_path, central):
    url, store = central
    nvml, gpus = two_boards()
    agent = Agent(NvmlSource(nvml=nvml, node="n1"), Spool(tmp_path / "sp"), url, TOKEN, "n1", 1.0)
    assert agent.send_topology() == 1
    agent.topology_due = 0.0
    assert agent.send_topology() == 0  # unchanged: not posted again
    body = requests.get(f"{url}/v1/topology", timeout=10).json()
    assert [i["gpus"] for i in body["nodes"][0]["islands"]] == [8, 8]
    assert body["nodes"][0]["gpu_places"][9]["clique_id"] == "7"


def test_posted_topology_is_checked(file_store):
    nvml, _ = two_boards()
    good = NvmlSource(nvml=nvml, node="n1").topology()[0].to_json()
    with api_client(file_store, Config(), token=TOKEN) as client:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        assert client.post("/v1/topology", json=good).status_code == 401
        assert client.post("/v1/topology", json=good, headers=auth).json()["stored"] is True
        assert client.post("/v1/topology", json=good, headers=auth).json()["stored"] is False
        wrong = {**good, "gpus": [dict(g, island=0) for g in good["gpus"]]}  # two boards claimed one island
        answer = client.post("/v1/topology", json=wrong, headers=auth)
        assert answer.status_code == 422 and "contradict" in answer.json()["detail"]
        twice = {**good, "gpus": good["gpus"] + good["gpus"][:1]}
        assert client.post("/v1/topology", json=twice, headers=auth).status_code == 422
        stranger = {**good, "links": good["links"] + [{"gpu": "GPU-zz", "peer": "GPU-a00", "path": "nvlink"}]}
        assert "not listed" in client.post("/v1/topology", json=stranger, headers=auth).json()["detail"]
        for field, value in (("node", "<script>alert(1)</script>"), ("node", "n1; rm -rf /"),
                             ("basis", "guessed"), ("source", "gossip")):
            assert client.post("/v1/topology", json={**good, field: value}, headers=auth).status_code == 422
        hostile_rack = {**good, "gpus": [dict(good["gpus"][0], rack="r1\n- kind: Secret")] + good["gpus"][1:]}
        assert client.post("/v1/topology", json=hostile_rack, headers=auth).status_code == 422


def test_node_labels_from_kube_state_metrics_fill_clique_and_rack_with_history(file_store):
    """kube_node_labels (only the labels a deployment allows) give the clique and a site's rack label; each change
    is kept, so the rack a node was in last week is still known."""
    nvml, _ = two_boards()
    file_store.record_topology(NvmlSource(nvml=nvml, node="n1").topology()[0], NOW)
    page = ('kube_node_labels{node="n1",label_nvidia_com_gpu_clique="nvl72-a",label_example_com_rack="rack-12"} 1\n'
            'kube_node_labels{node="n2",label_example_com_rack="rack-13"} 1\n')
    file_store.set_node_labels(parse_kube_state(page).node_labels, NOW)
    moved = page.replace("rack-12", "rack-14")
    file_store.set_node_labels(parse_kube_state(moved).node_labels, NOW + timedelta(days=1))
    file_store.set_node_labels(parse_kube_state(moved).node_labels, NOW + timedelta(days=2))  # no change
    assert file_store.scalar("SELECT count(*) FROM node_label_changes") == 4
    node = cluster_topology(file_store, NOW + timedelta(hours=1), rack_label="example.com/rack")["nodes"][0]
    places = {p["gpu_uuid"]: p for p in node["gpu_places"]}
    assert places["GPU-a00"]["clique_id"] == "nvl72-a" and places["GPU-a09"]["clique_id"] == "7"  # the GPU's own
    assert node["rack"] == "rack-12" and node["clique_id"] is None  # the GPUs disagree: no single clique
    later = cluster_topology(file_store, NOW + timedelta(days=3), rack_label="example.com/rack")["nodes"][0]
    assert later["rack"] == "rack-14"
    assert cluster_topology(file_store, NOW + timedelta(hours=1))["nodes"][0]["rack"] is None  # no rack label set


def test_simulated_nodes_have_a_topology():
    from gpuledger.collector.simulator import SimulatorSource, cluster_of
    found = SimulatorSource(cluster_of(2)).topology()
    assert [t.node for t in found] == ["node-0000", "node-0001"]
    assert all(isinstance(t, NodeTopology) and {g.island for g in t.gpus} == {0} for t in found)


def placement_store(store) -> None:
    """Node a: 16 GPUs on two 8-GPU NVSwitch boards, job j1 holding four of the first; node b: 8 free GPUs on two
    4-GPU islands (bridged PCIe cards); both with their topology stored, measured."""
    rows = [gpu_rows("a", g, "H100", 30, job="j1" if g < 4 else None, team="nlp" if g < 4 else None, util=60.0)
            for g in range(16)] + [gpu_rows("b", g, "H100", 30) for g in range(8)]
    store.append_samples(table(*rows))
    store.fold()
    for node, gpus, size in (("a", 16, 8), ("b", 8, 4)):
        places = tuple(GpuPlace(f"GPU-{node}-{g}", g, "H100", g // size) for g in range(gpus))
        links = tuple(GpuLink(f"GPU-{node}-{g}", f"GPU-{node}-{h}", "nvlink" if g // size == h // size else "system")
                      for g in range(gpus) for h in range(g + 1, gpus))
        store.record_topology(NodeTopology(node, "nvml", "measured", places, links), T0)


def test_an_8_gpu_job_is_placed_inside_one_island_where_the_placer_splits_it(file_store):
    placement_store(file_store)
    at, nodes, workload = current_state(file_store, None, 7.0)
    state = ClusterState(nodes, workload)
    task = Task("job", TaskShape(0, 1000, 8), 0)
    today = FgdPlacer().place(state, task)  # the placer alone: islands unknown to it
    islands = slot_islands(file_store, at, state.gpu_ids, state.gpu_free.shape[1])
    split = {int(islands[today.node][s]) for s in today.slots}
    assert len(split) == 2, "the placer alone should split the 8-GPU job over two islands"
    with api_client(file_store, Config(), open_reads=True) as client:
        answer = client.post("/v1/placement", json={"gpus": 8}).json()
    first = answer["candidates"][0]
    assert first["within_island"] is True and first["node"] == "a" and first["island"] == 1
    assert sorted(first["gpus"]) == sorted(f"GPU-a-{g}" for g in range(8, 16))
    assert [c["within_island"] for c in answer["candidates"]] == [True, False]  # b can only split it
    assert answer["feasible"] == 2 and answer["within_island"] == 1 and answer["keep_within"] == "island"
    assert answer["annotations"] == {}


def gang_store(store) -> None:
    """Five 4-GPU nodes, each one NVLink island: n1, n2 in clique A with two GPUs of n1 held; n3, n4 in clique B,
    free; n5 free with no clique reported."""
    rows = [gpu_rows(f"n{n}", g, "H100", 30, job="j1" if (n, g) in ((1, 0), (1, 1)) else None,
                     team="nlp" if (n, g) in ((1, 0), (1, 1)) else None, util=60.0)
            for n in range(1, 6) for g in range(4)]
    store.append_samples(table(*rows))
    store.fold()
    for n, clique in ((1, "A"), (2, "A"), (3, "B"), (4, "B"), (5, None)):
        node = f"n{n}"
        places = tuple(GpuPlace(f"GPU-{node}-{g}", g, "H100", 0, clique_id=clique) for g in range(4))
        links = tuple(GpuLink(f"GPU-{node}-{g}", f"GPU-{node}-{h}", "nvlink")
                      for g in range(4) for h in range(g + 1, 4))
        store.record_topology(NodeTopology(node, "nvml", "measured", places, links), T0)


def test_a_gang_of_pods_is_kept_inside_one_clique_that_takes_it_whole(file_store):
    """Two pods of 4 GPUs: clique A has 6 GPUs free but not two nodes with 4 (n1 has 2), so B (n3 and n4) takes
    them; n5, of no known clique, is never used. Three pods fit no clique: none placed, said so. Kept within the
    node (no clique asked), the pods may go anywhere, each on 4 GPUs of one node."""
    gang_store(file_store)
    clique = Config(topology=TopologyConfig(keep_within="clique"))
    with api_client(file_store, clique, open_reads=True) as client:
        two = client.post("/v1/placement", json={"gpus": 4, "pods": 2}).json()["gang"]
        three = client.post("/v1/placement", json={"gpus": 4, "pods": 3}).json()["gang"]
        assert client.post("/v1/placement", json={"gpus": 1, "pods": 2, "gpu_fraction": 0.5}).status_code == 422
    assert two["scope"] == "clique" and two["group"] == "B" and two["groups_considered"] == 2
    assert two["groups_fitting"] == 1 and two["nodes_without_group"] == ["n5"]
    assert sorted(p["node"] for p in two["placed"]) == ["n3", "n4"]
    assert all(p["within_island"] is True and len(set(p["gpus"])) == 4 for p in two["placed"])
    assert sorted(g for p in two["placed"] for g in p["gpus"]) == sorted(f"GPU-n{n}-{g}" for n in (3, 4)
                                                                         for g in range(4))
    assert three["placed"] == [] and three["group"] is None and three["groups_fitting"] == 0
    with api_client(file_store, Config(), open_reads=True) as client:
        anywhere = client.post("/v1/placement", json={"gpus": 4, "pods": 3}).json()["gang"]
    assert anywhere["group"] == "cluster" and anywhere["nodes_without_group"] == []
    assert len({p["node"] for p in anywhere["placed"]}) == 3 and "n1" not in {p["node"] for p in anywhere["placed"]}
    # racks from the site's node label (kube-state-metrics): r1 = n1, n2; r2 = n3, n4, n5: three pods fit only r2
    page = "".join(f'kube_node_labels{{node="n{n}",label_example_com_rack="r{1 if n < 3 else 2}"}} 1\n'
                   for n in range(1, 6))
    file_store.set_node_labels(parse_kube_state(page).node_labels, T0)
    rack = Config(topology=TopologyConfig(levels=("example.com/rack", "kubernetes.io/hostname"),
                                          rack_label="example.com/rack", keep_within="rack"))
    with api_client(file_store, rack, open_reads=True) as client:
        racked = client.post("/v1/placement", json={"gpus": 4, "pods": 3}).json()["gang"]
    assert racked["group"] == "r2" and sorted(p["node"] for p in racked["placed"]) == ["n3", "n4", "n5"]


def test_keep_within_node_reports_islands_without_ranking_by_them(file_store):
    placement_store(file_store)
    config = Config(topology=TopologyConfig(keep_within="node"))
    with api_client(file_store, config, open_reads=True) as client:
        by_fgd = client.post("/v1/placement", json={"gpus": 8}).json()
        single = client.post("/v1/placement", json={"gpus": 1}).json()
    assert by_fgd["keep_within"] == "node" and by_fgd["candidates"][0]["within_island"] is False
    assert all(c["within_island"] is True for c in single["candidates"])  # one GPU fits any island


def test_placement_on_nodes_without_topology_says_unknown(file_store):
    file_store.append_samples(table(gpu_rows("c", 0, "H100", 30, job="j9", team="nlp"),
                                    *[gpu_rows("c", g, "H100", 30) for g in range(1, 8)]))
    file_store.fold()
    with api_client(file_store, Config(), open_reads=True) as client:
        answer = client.post("/v1/placement", json={"gpus": 4}).json()
        shown = client.get("/v1/topology").json()
    assert answer["candidates"][0]["within_island"] is None and answer["within_island"] == 0
    assert shown["nodes"] == [] and shown["missing"] == ["c"]
