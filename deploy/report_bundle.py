"""A weekly report's files in one zip, as `GET /v1/reports/{week}` answers and `gpuledger report --server` unpacks:
the pages and CSVs as the server wrote them, and `manifest.json` saying which file is which (the admin page, the
summary, each team's page and CSV). A team's bundle holds its own page and CSV only.

Unpacking takes only the names the manifest lists, each a plain file name (no folder, no `..`), so a bundle from a
server cannot write outside the report's folder."""
from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path
from typing import Any

from gpuledger.analytics.report import ReportFiles
from gpuledger.collector.errors import GpuledgerError, NotFoundError

MANIFEST = "manifest.json"
MAX_UNPACKED_BYTES = 512 * 1024 * 1024  # far above any week's pages (a 1,000-GPU week's are a few MB)


def pack(files: ReportFiles, team: str | None = None) -> bytes:
    """The report's files (only `team`'s page and CSV when given) and the manifest, zipped."""
    if team is None:
        chosen = {"html": files.html, "summary_csv": files.summary_csv, "team_csvs": files.team_csvs,
                  "team_pages": files.team_pages}
    else:
        csv, page = files.team_csvs.get(team), files.team_pages.get(team)
        if csv is None or page is None:
            raise NotFoundError(f"team {team} has no line in week {files.label}")
        chosen = {"html": page, "summary_csv": csv, "team_csvs": {team: csv}, "team_pages": {team: page}}
    manifest: dict[str, Any] = {"label": files.label, "team": team}
    paths: list[Path] = []
    for key, value in chosen.items():
        if isinstance(value, dict):
            manifest[key] = {name: path.name for name, path in value.items()}
            paths += value.values()
        else:
            manifest[key] = value.name
            paths.append(value)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as bundle:
        bundle.writestr(MANIFEST, json.dumps(manifest, indent=1))
        for path in dict.fromkeys(paths):
            bundle.write(path, path.name)
    return buffer.getvalue()


def _plain(name: Any) -> str:
    if not isinstance(name, str) or not name or Path(name).name != name or name in (".", "..", MANIFEST):
        raise GpuledgerError(f"the server's report bundle names a file {name!r} that is not a plain file name")
    return name


def unpack(data: bytes, out: Path) -> ReportFiles:
    """The bundle's files under `out`/<week>, as the report's ReportFiles."""
    try:
        bundle = zipfile.ZipFile(io.BytesIO(data))
        manifest = json.loads(bundle.read(MANIFEST))
        label = _plain(manifest["label"])
        names = {key: _plain(manifest[key]) for key in ("html", "summary_csv")}
        teams = {key: {str(t): _plain(n) for t, n in manifest[key].items()} for key in ("team_csvs", "team_pages")}
        wanted = {*names.values(), *teams["team_csvs"].values(), *teams["team_pages"].values()}
        if sum(bundle.getinfo(n).file_size for n in wanted) > MAX_UNPACKED_BYTES:
            raise GpuledgerError("the server's report bundle unpacks to more than 512 MiB")
        folder = out / label
        folder.mkdir(parents=True, exist_ok=True)
        for name in wanted:
            (folder / name).write_bytes(bundle.read(name))
    except (zipfile.BadZipFile, KeyError, ValueError, AttributeError) as exc:
        raise GpuledgerError(f"the server's answer is not a report bundle: {exc}") from exc
    return ReportFiles(label=label, html=folder / names["html"], summary_csv=folder / names["summary_csv"],
                       team_csvs={t: folder / n for t, n in teams["team_csvs"].items()},
                       team_pages={t: folder / n for t, n in teams["team_pages"].items()})


__all__ = ["pack", "unpack", "MANIFEST"]
