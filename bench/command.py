"""A bench run from end to end: deploy, measure level by level with a progress bar, write
results.json, results.md and the plots to the output directory."""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import uvloop
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from bench.deployment import Deployment, deployed
from bench.options import BenchOptions
from bench.peers import peer_states
from bench.plots import PlotsUnavailable, write_plots
from bench.processes import StartFailure
from bench.report import NoPlaceInReport, embedded, markdown
from bench.results import document, level_document
from bench.rounds import measure
from bench.scenarios import VLLM_ROUTER, Level, levels
from bench.script import Script, make_script

REQUEST_TIMEOUT_S = 60.0


def run_bench(options: BenchOptions, console: Console | None = None) -> int:
    console = console or Console(stderr=True)
    if not Path("/proc/self/stat").exists():
        console.print("error: pd-gateway bench reads /proc: it runs on Linux only")
        return 2
    script = make_script(options.tokens)
    with ExitStack() as cleanup:
        with console.status("starting the simulated stack and the gateways"):
            try:
                deployment = cleanup.enter_context(deployed(options))
            except StartFailure as exc:
                console.print(f"error: {exc}", markup=False, soft_wrap=True)
                return 1
        results = uvloop.run(_measure_all(options, deployment, script, console))
    doc = document(options, results, peer_states(measured=_peer_measured(results)))
    _write(doc, options.out, console)
    if options.report is not None:
        try:
            _embed(markdown(doc), options.report)
        except NoPlaceInReport as exc:
            console.print(f"error: {options.report}: {exc}", markup=False, soft_wrap=True)
            return 1
        console.print(f"the table is in {options.report}")
    return 0


async def _measure_all(
    options: BenchOptions, deployment: Deployment, script: Script, console: Console
) -> list[dict[str, Any]]:
    widest = options.widest
    # Idle connections are dropped well before any server closes them (uvicorn's default is
    # 5 s), or a round may reuse one just closed.
    limits = httpx.Limits(
        max_connections=4 * widest, max_keepalive_connections=4 * widest, keepalive_expiry=2.0
    )
    timeout = httpx.Timeout(REQUEST_TIMEOUT_S)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        plan = levels(options, deployment, client, script)
        total = sum(len(level.methods) * options.rounds * level.per_round for level in plan)
        columns = (
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
        )
        with Progress(*columns, console=console) as progress:
            task = progress.add_task("warming up", total=total)
            return [await _level(options, level, progress, task) for level in plan]


async def _level(
    options: BenchOptions, level: Level, progress: Progress, task: TaskID
) -> dict[str, Any]:
    where = f"{level.path} path, {level.concurrency} stream(s)"
    measured = await measure(
        level,
        options.rounds,
        lambda what: progress.update(task, description=f"{where}: {what}"),
        lambda: progress.advance(task),
    )
    return level_document(level, measured)


def _embed(table: str, report: Path) -> None:
    report.write_text(embedded(report.read_text(encoding="utf-8"), table), encoding="utf-8")


def _peer_measured(levels: list[dict[str, Any]]) -> bool:
    return any(VLLM_ROUTER in level["methods"] for level in levels)


def _write(doc: dict[str, Any], out: Path, console: Console) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    table = markdown(doc)
    (out / "results.md").write_text(table, encoding="utf-8")
    written = [out / "results.json", out / "results.md"]
    try:
        written += write_plots(doc, out)
    except PlotsUnavailable as exc:
        console.print(f"PNG plots skipped: {exc}", markup=False, soft_wrap=True)
    print(table)
    console.print("written: " + ", ".join(str(path) for path in written))
