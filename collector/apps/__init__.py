"""Inference servers' and training jobs' /metrics pages read into one closed set of figures (figures.py).

`read_page(text)` -> AppPage(kinds, rows: list[AppRow], skipped, examples); one data table per server
(vllm.py, triton.py, tgi.py, sglang.py for SGLang and its router, hami.py, training.py) behind the one
`ServerReader` interface (spec.py); `read_families` (families.py) is the page -> metric families step under it.
"""
from gpuledger.collector.apps.families import Family, FamilyPage, Series, parse_bound, read_families
from gpuledger.collector.apps.figures import FIGURES, PARTS, SERVER_KINDS, Figure
from gpuledger.collector.apps.reading import NOT_A_SERVER, READERS, AppPage, AppRow, read_families_page, read_page
from gpuledger.collector.apps.spec import ServerReader, Source

__all__ = ["FIGURES", "NOT_A_SERVER", "PARTS", "READERS", "SERVER_KINDS", "AppPage", "AppRow", "Family",
           "FamilyPage", "Figure", "Series", "ServerReader", "Source", "parse_bound", "read_families",
           "read_families_page", "read_page"]
