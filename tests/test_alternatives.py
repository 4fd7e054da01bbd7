"""Advice that wants the same GPUs or jobs is one group of alternatives, and the savings total counts each group
once (issue 39 item 6).

The demo's shape is the first case: on one H100 node a consolidation would empty the node for a waiting gang job,
a co-location would fill its two free GPUs, a separation would take one of them, and a resize would shrink one of
the jobs the consolidation moves. Each is right alone; their dollars must not be added up. Then the invariants on
random sets of advice (bounded, seeded): every pair that cannot be done together shares a group; the set each group
counts can be done; no other set of a group's advice is worth more; the total is the counted dollars.
"""
from __future__ import annotations

import random
from itertools import combinations

import pandas as pd
from fastapi.testclient import TestClient

from gpuledger.analytics.config import Config
from gpuledger.analytics.store import Store
from gpuledger.analytics.store.access import Role, create_token
from gpuledger.deploy.api import create_app
from gpuledger.policies import alternatives
from gpuledger.policies.alternatives import CLAIMS, annotate, potential_savings, together
from gpuledger.policies.recommendation import HELD_BACK, KINDS, PROPOSED, Recommendation
from gpuledger.policies.recommender import Evaluation


def _rec(kind: str, job: str | None, action: dict, usd: float | None = None, team: str = "nlp",
         status: str = PROPOSED, **evidence) -> dict:
    evidence = {**evidence, **({"effect_usd_per_week": usd} if usd is not None else {})}
    return Recommendation(kind=kind, team=team, job_id=job, action=action, evidence=evidence, reason=kind,
                          gpu_model="H100", status=status).to_dict()


def _demo_shape() -> dict[str, dict]:
    return {
        "consolidate": _rec("consolidate", "nlp/pretrain", {"node": "h1", "frees_gpus": 4, "move": [
            {"job_id": "nlp/finetune", "gpus": 1, "to_node": "h2"}, {"job_id": "recsys/eval", "gpus": 1,
                                                                      "to_node": "h2"}]},
            waiting_job="nlp/pretrain", free_gpus_on_node=2, free_gpus_on_targets={"h2": 2}),
        "colocate": _rec("colocate", "vision/ddp", {"node": "h1", "gpus": 4, "island": 0}, usd=1039.0,
                         team="vision", target_own_gpus=2, free_gpus_on_target=2),
        "separate": _rec("separate", "inference/llm", {"from_gpu": "g7", "node": "h1", "to_node": "h1"},
                         free_gpus_on_target=2),
        "resize": _rec("resize", "recsys/eval", {"move_to": "H100 MIG 2g.20gb", "gpus": 1}, usd=826.0,
                       team="recsys"),
        "reclaim": _rec("reclaim", "research/notebook", {"reclaim_gpus": ["g9"], "node": "h1", "gpus": 1},
                        usd=1156.0, team="research"),
        "quota": _rec("quota", None, {"guarantee_gpus": 3, "limit_gpus": 8, "current_guarantee_gpus": 1}),
        "held": _rec("reclaim", "nlp/held", {"reclaim_gpus": ["g1"], "node": "h3", "gpus": 1}, usd=99.0,
                     status=HELD_BACK),
    }


def test_the_demos_competing_advice_is_one_group_and_counted_once():
    recs = _demo_shape()
    names = {r["id"]: name for name, r in recs.items()}
    out = {names[r["id"]]: r for r in annotate(list(recs.values()))}
    group = out["consolidate"]["alternatives"]["group"]
    assert {n for n, r in out.items() if r["alternatives"] and r["alternatives"]["group"] == group} == \
        {"consolidate", "colocate", "separate", "resize"}
    # best first by dollars, unpriced last
    assert [n for n, r in sorted(((n, r) for n, r in out.items() if r["alternatives"]
                                  and r["alternatives"]["group"] == group), key=lambda nr: nr[1]["alternatives"]["rank"])
            ][:2] == ["colocate", "resize"]
    # colocate (2 free GPUs of h1) and separate (1 of them) cannot both be done; consolidation clears h1 and moves
    # the job the resize shrinks; co-location and resize can be done together and are worth the most
    rivals = {n: {names[i] for i in r["alternatives"]["competes_with"]} for n, r in out.items() if r["alternatives"]}
    assert rivals["colocate"] == {"consolidate", "separate"} and rivals["resize"] == {"consolidate"}
    assert {n for n, r in out.items() if r["alternatives"] and r["alternatives"]["counted"]} == \
        {"colocate", "resize", "reclaim"}
    assert out["reclaim"]["alternatives"]["of"] == 1  # nothing competes with giving back an idle GPU elsewhere
    assert out["quota"]["alternatives"] is None and out["held"]["alternatives"] is None
    savings = potential_savings(out.values())
    assert savings["usd_per_week"] == 1039.0 + 826.0 + 1156.0
    assert savings["groups"] == 2 and savings["left_out"] == [] and savings["priced"] == 3
    # without the co-location the separation fits beside nothing else on h1: still grouped with the consolidation
    rest = annotate([r for n, r in recs.items() if n != "colocate"])
    assert len({r["alternatives"]["group"] for r in rest if r["alternatives"]}) == 2


def test_a_node_with_room_for_every_taker_groups_nobody_and_unknown_room_groups_them():
    one = _rec("separate", "ls/a", {"from_gpu": "g1", "node": "h1", "to_node": "h2"}, free_gpus_on_target=2)
    two = _rec("separate", "ls/b", {"from_gpu": "g2", "node": "h1", "to_node": "h2"}, free_gpus_on_target=2)
    out = annotate([one, two])
    assert out[0]["alternatives"]["group"] != out[1]["alternatives"]["group"]
    stale = [{**r, "evidence": {}} for r in (one, two)]  # stored before the free GPUs were recorded
    out = annotate(stale)
    assert out[0]["alternatives"]["group"] == out[1]["alternatives"]["group"]
    assert out[0]["alternatives"]["of"] == 2


def test_unpriced_advice_alone_gives_an_unknown_total_not_zero():
    only = annotate([_demo_shape()["separate"]])
    savings = potential_savings(only)
    assert savings["usd_per_week"] is None and "no advice shown prices" in savings["basis"]
    assert potential_savings([])["usd_per_week"] == 0.0


def test_every_kind_of_placement_advice_has_a_claim_reader():
    assert set(CLAIMS) == set(KINDS) - {"quota"}


def _random_recs(rng: random.Random, n: int) -> list[dict]:
    nodes, jobs = [f"n{i}" for i in range(4)], [f"t/j{i}" for i in range(6)]
    out = []
    for k in range(n):
        kind = rng.choice(sorted(CLAIMS))
        usd = rng.choice([None, 100.0, 250.0, 400.0, 900.0])
        free = {"free_gpus_on_target": rng.randint(0, 3)} if rng.random() < 0.8 else {}
        job = rng.choice(jobs)
        if kind == "consolidate":
            node, to = rng.sample(nodes, 2)
            moved = rng.sample([j for j in jobs if j != job], 2)
            out.append(_rec(kind, job, {"node": node, "frees_gpus": 4, "move": [
                {"job_id": m, "gpus": 1, "to_node": to} for m in moved]}, usd=usd, waiting_job=job,
                free_gpus_on_node=1, free_gpus_on_targets={to: rng.randint(1, 3)}))
        elif kind == "colocate":
            out.append(_rec(kind, job, {"node": rng.choice(nodes), "gpus": 4, "island": 0}, usd=usd,
                            target_own_gpus=rng.randint(1, 3), **free))
        elif kind == "separate":
            out.append(_rec(kind, job, {"from_gpu": f"g{k}", "node": "n0", "to_node": rng.choice(nodes)}, usd=usd,
                            **free))
        else:
            out.append(_rec(kind, job, {"reclaim_gpus": [f"g{k}"], "node": "n0", "gpus": 1}, usd=usd))
    return out


def test_groups_counted_sets_and_totals_hold_on_random_advice():
    rng = random.Random(39)
    for _ in range(60):  # bounded: 60 sets of at most 9 advice
        out = annotate(_random_recs(rng, rng.randint(1, 9)))
        claims = {r["id"]: CLAIMS[r["kind"]](r) for r in out}
        by_id = {r["id"]: r for r in out}
        for a, b in combinations(out, 2):
            if not together([claims[a["id"]], claims[b["id"]]]):
                assert a["alternatives"]["group"] == b["alternatives"]["group"], (a["reason"], b["reason"])
        groups: dict[str, list[str]] = {}
        for r in out:
            groups.setdefault(r["alternatives"]["group"], []).append(r["id"])
        total = 0.0
        for ids in groups.values():
            usd = {i: float(by_id[i]["evidence"].get("effect_usd_per_week") or 0.0) for i in ids}
            counted = [i for i in ids if by_id[i]["alternatives"]["counted"]]
            assert together([claims[i] for i in counted])
            best = max(sum(usd[i] for i in subset) for size in range(len(ids) + 1)
                       for subset in combinations(ids, size) if together([claims[i] for i in subset]))
            assert abs(sum(usd[i] for i in counted) - best) < 1e-6
            total += sum(usd[i] for i in counted)
        savings = potential_savings(out)
        if savings["priced"]:
            assert abs(savings["usd_per_week"] - round(total, 2)) < 0.011


def test_a_large_group_is_counted_greedily_and_stays_feasible(monkeypatch):
    monkeypatch.setattr(alternatives, "EXACT_UP_TO", 2)
    recs = [_rec("separate", f"ls/{i}", {"from_gpu": f"g{i}", "node": "h1", "to_node": "h2"}, usd=100.0 + i,
                 free_gpus_on_target=2) for i in range(5)]
    out = annotate(recs)
    assert len({r["alternatives"]["group"] for r in out}) == 1
    counted = [r for r in out if r["alternatives"]["counted"]]
    assert len(counted) == 2 and {r["job_id"] for r in counted} == {"ls/4", "ls/3"}  # the two best fit h2's 2 GPUs


def test_the_api_groups_alternatives_and_a_team_sees_its_part(tmp_path):
    store = Store(tmp_path / "alt.duckdb")
    store.upsert_teams(pd.DataFrame({"team": ["nlp", "vision", "recsys", "research"], "share": [1.0] * 4}))
    recs = _demo_shape()
    objects = [Recommendation(**{k: v for k, v in r.items() if k in Recommendation.__dataclass_fields__
                                 and k != "id"}) for r in recs.values()]
    app = create_app(store, Config(), open_reads=True)

    class Fixed:
        def current(self):
            from datetime import datetime, timezone
            at = datetime(2026, 12, 7, tzinfo=timezone.utc)
            return Evaluation(at, at), objects

    with TestClient(app) as client:
        app.state.recommender = Fixed()
        answer = client.get("/v1/recommendations").json()
        shown = answer["recommendations"]
        assert answer["potential_savings"]["usd_per_week"] == 1039.0 + 826.0 + 1156.0
        assert all(r["alternatives"] for r in shown if r["kind"] != "quota" and r["status"] == PROPOSED)
        vision = client.get("/v1/recommendations", params={"kind": "colocate"}).json()
        assert vision["potential_savings"]["usd_per_week"] == 1039.0 and vision["potential_savings"]["groups"] == 1
        _, secret = create_token(store, "lead-recsys", Role.parse("team:recsys"), "test")
        mine = client.get("/v1/recommendations", headers={"Authorization": f"Bearer {secret}"}).json()
        assert [r["kind"] for r in mine["recommendations"]] == ["resize"]
        assert mine["recommendations"][0]["alternatives"]["of"] == 4  # it competes, with advice it cannot read
        assert "nlp/pretrain" not in str(mine)
        assert mine["potential_savings"]["usd_per_week"] == 826.0
    store.close()


def test_the_weekly_report_shows_the_groups_and_counts_each_once(tmp_path):
    from gpuledger.analytics.report import write_weekly_report
    from gpuledger.analytics.windows import iso_week, utc_now
    from tests.helpers import gpu_rows, table
    store = Store(tmp_path / "report.duckdb")
    store.append_samples(table(gpu_rows("h1", 0, "H100", 30, start=utc_now().replace(microsecond=0)
                                        - pd.Timedelta(minutes=40), util=50.0, job="nlp/a", team="nlp")))
    start, end, label = iso_week("current")
    files = write_weekly_report(store, Config(), tmp_path / "reports", start, end, label,
                                annotate(list(_demo_shape().values())))
    page = open(files.html).read()
    assert "Potential savings <strong>$3,021.00 per week</strong>: 2 group(s) of alternatives" in page
    assert page.count(" of 4 in alt-") == 4 and page.count("alone, counted") == 1
    store.close()
