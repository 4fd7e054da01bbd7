"""The entry point: an inference server's (or training job's) `/metrics` page -> canonical figure rows.

`read_page(text)` reads the page into metric families once (families.py), asks every server reader whether the
page is (also) its own (a vLLM server with TGI-compatible families is both), and lets each recognised reader turn
its families into `AppRow`s (spec.py, with one data table per server in vllm.py, triton.py, tgi.py, sglang.py,
hami.py, training.py). What is not read is never silently dropped: bad lines, families of a recognised server
that hold no figure, summaries' quantile lines, negative or non-finite counters, `_created` series, histograms cut
before `+Inf` (their buckets kept) and series another name already gave are all counted by reason in `skipped`,
with a few examples each. A page no reader recognises gives no kinds and every sample counted as
"not an inference server page".

AppRow fields:
- kind: a SERVER_KINDS name; figure: a FIGURES name; part: "value" for counters and gauges, "bucket" (with `le`,
  `math.inf` for +Inf), "sum" or "count" for histograms.
- service: the model or served-model name ("" when the page names none); instance: the rest of the series'
  identity as sorted "k=v,k=v" of its identity labels (engine, version, rank, GPU, container, the scrape's
  instance/job), "" if none; namespace/pod: from the namespace/pod labels (Kubernetes SD's and Prometheus'
  `exported_*` spellings too), None when absent.
- value: in the figure's canonical unit (seconds, tokens, bytes, fraction 0..1); counters as the exporter gives
  them (resets are for whoever differences two reads); ts_ms: the sample's own timestamp when the page gives one.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Collection, Mapping

from gpuledger.collector.apps import hami, sglang, tgi, training, triton, vllm
from gpuledger.collector.apps.families import FamilyPage, note_example, read_families, show
from gpuledger.collector.apps.figures import SERVER_KINDS
from gpuledger.collector.apps.spec import AppRow, ServerReader
from gpuledger.collector.errors import InputError
from gpuledger.collector.prom_text import PromTextParser

# every reader, one per SERVER_KINDS name
READERS: dict[str, ServerReader] = {
    r.kind: r for r in (vllm.READER, triton.READER, tgi.READER, sglang.READER, sglang.ROUTER, hami.READER,
                        training.READER)
}
assert tuple(READERS) == SERVER_KINDS, "one reader per server kind"
NOT_A_SERVER = "not an inference server page"


@dataclass
class AppPage:
    """What a page gave: the kinds recognised (in page order), the rows, and what was skipped and why."""

    kinds: list[str]
    rows: list[AppRow]
    skipped: Counter = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)


def read_page(text: str, aliases: Mapping[str, Mapping[str, str]] | None = None,
              parser: PromTextParser | None = None, *, ensembles: Collection[str] = ()) -> AppPage:
    """Rows of an inference server's or training job's /metrics page.

    `aliases`: kind -> {family name: figure, or "figure*scale"}: names a config teaches (a metric a new version
    renamed), read after the built-in names. `parser`: keep one per scraped endpoint so repeated label sets are
    parsed once. `ensembles`: Triton model names that are ensembles, beside those named by convention (triton.py).
    """
    return read_families_page(read_families(text, parser), aliases, ensembles=ensembles)


def read_families_page(page: FamilyPage, aliases: Mapping[str, Mapping[str, str]] | None = None, *,
                       ensembles: Collection[str] = (), claimed: Collection[str] = ()) -> AppPage:
    """read_page on a page already read into families (check_page reads a page once for every exporter);
    `claimed`: families another exporter's reader reads, not counted here as `other_family`."""
    aliases = aliases or {}
    unknown = sorted(set(aliases) - set(READERS))
    if unknown:
        raise InputError(f"aliases for unknown server kind(s) {unknown}; kinds are {list(SERVER_KINDS)}")
    families = page.families
    found = [r for r in READERS.values() if r.recognises(families, aliases.get(r.kind, {}))]
    found.sort(key=lambda r: r.first_index(families))
    out = AppPage(kinds=[r.kind for r in found], rows=[], skipped=Counter(page.skipped),
                  examples=list(page.examples))
    if not found:
        if page.sample_count:
            out.skipped[NOT_A_SERVER] += page.sample_count
            note_example(out.examples, NOT_A_SERVER, f"{len(families)} families, none of "
                                                     f"{', '.join(SERVER_KINDS)}")
        return out
    options = {"ensembles": frozenset(ensembles)}
    owned: set[str] = set()
    for reader in found:
        result = reader.read(families, aliases.get(reader.kind), options)
        out.rows.extend(result.rows)
        out.skipped.update(result.skipped)
        for example in result.examples:
            reason = example.partition(": ")[0]
            note_example(out.examples, reason, example[len(reason) + 2:])
        owned |= result.owned
    for name, family in families.items():
        if name not in owned and name not in claimed and family.samples:
            out.skipped["other_family"] += family.samples
            note_example(out.examples, "other_family", f"{name} ({family.type})")
    return out


__all__ = ["AppPage", "AppRow", "NOT_A_SERVER", "READERS", "read_families_page", "read_page", "show"]
