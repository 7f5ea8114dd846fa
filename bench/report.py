"""The Markdown docs/benchmarks.md embeds: every target of the performance campaign with its
measured value beside direct orchestration, then every level in full. Built from the JSON
document alone, so a saved run can be rendered again."""

from __future__ import annotations

from typing import Any

from bench.scenarios import DIRECT, GATEWAY, PULL_GATEWAY, VLLM_ROUTER, workers_label

Row = tuple[str, str, str, str, str]
NOT_RUN = "not run"
REPORT_START = "<!-- pd-gateway bench: start -->"
REPORT_END = "<!-- pd-gateway bench: end -->"


class NoPlaceInReport(Exception):
    """The file given to `--report` has no place marked for the table."""


def markers(scenario: str = "paths") -> tuple[str, str]:
    """The lines that mark a scenario's place in a report."""
    if scenario == "paths":
        return REPORT_START, REPORT_END
    return REPORT_START.replace("bench:", f"bench {scenario}:"), REPORT_END.replace(
        "bench:", f"bench {scenario}:"
    )


def embedded(report: str, table: str, start: str = REPORT_START, end: str = REPORT_END) -> str:
    """`report` with `table` in place of whatever stands between its two marker lines (each
    a line of its own: the page may quote the markers in its text)."""
    lines = report.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line.strip() == start]
    ends = [i for i, line in enumerate(lines) if line.strip() == end]
    if len(starts) != 1 or len(ends) != 1 or ends[0] < starts[0]:
        raise NoPlaceInReport(
            f"mark the table's place with one line {start} and, below it, one line {end}"
        )
    return "".join(lines[: starts[0] + 1]) + table + "".join(lines[ends[0] :])


def markdown(doc: dict[str, Any]) -> str:
    lines = [
        f"`{doc['command']}` (pd-gateway {doc['version']}, {doc['created']};"
        f" {doc['machine']['cpus']} CPUs, load {doc['machine']['load_average'][0]})",
        "",
        "| target | measure | direct | gateway | added |",
        "| --- | --- | --- | --- | --- |",
        *(_row(row) for row in target_rows(doc)),
        "",
        "| path | streams | method | requests | TTFT p50 | TTFT p99 | gap p50 | gap p99 |"
        " CPU / request | added TTFT p50 / p99 | added gap p50 / p99 |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        *_level_rows(doc),
        "",
        "ms unless stated. TTFT: from sending the request to the first node line (direct"
        " latency), or SSE event with content; gap: between consecutive chunks of a stream;"
        " hand-off: from the simulators' records, with clients queueing for the pool"
        " (direct: the clients hand a node to the longest waiter among them)."
        " CPU and memory are each router process's own, from /proc.",
    ]
    peers = ", ".join(f"{name}: {state}" for name, state in doc["peers"].items())
    if peers:
        lines.append(f"Peers: {peers}.")
    return "\n".join(lines) + "\n"


def target_rows(doc: dict[str, Any]) -> list[Row]:
    settings = doc["settings"]
    latency = {lv["concurrency"]: lv for lv in doc["levels"] if lv["path"] == "latency"}
    native = {lv["concurrency"]: lv for lv in doc["levels"] if lv["path"] == "native"}
    rows: list[Row] = []
    for level in sorted({1, settings["nodes"]}):
        where = f"latency path, {level} stream(s), {settings['nodes']} nodes"
        rows.append(_ttft("TTFT added ≤ 1 ms p50, ≤ 3 ms p99", where, latency.get(level)))
    widest = latency.get(16) or (latency[max(latency)] if latency else None)
    streams = widest["concurrency"] if widest else 16
    where = f"latency path, {streams} streams"
    rows.append(_one("inter-chunk gap p99 added ≤ 0.5 ms", where, widest, "gap", "p99"))
    rows.append(_one("TTFT p99 added ≤ 5 ms", where, widest, "ttft", "p99"))
    top = native[max(native)] if native else None
    where = f"native path (proxy), {top['concurrency'] if top else '?'} streams"
    peer = _peer(top, doc["peers"].get(VLLM_ROUTER, NOT_RUN))
    rows.append(_one(f"TTFT p50 added ≤ vllm-router's ({peer['ttft']})", where, top, "ttft", "p50"))
    rows.append(_cpu(f"CPU per request ≤ 2× vllm-router's ({peer['cpu']})", where, top))
    node_level = latency.get(settings["nodes"])
    rows.append(_cpu("CPU per request (today 10–18 ms)", _at(node_level), node_level))
    rows.append(_handoff(next((lv for lv in doc["levels"] if lv["path"] == "handoff"), None)))
    first = latency.get(min(latency)) if latency else None
    idle = _gateway(first, "rss_idle_mb")
    rows.append(("idle RSS ≤ 150 MB, one model", _at(first), "", _mb(idle), ""))
    # Growth over the resident size with one stream open, shared out: the more streams,
    # the less one allocator arena more or less weighs in it.
    for level in (widest, top):
        per_stream = _gateway(level, "rss_per_stream_kb")
        rows.append(("≤ 50 KB per open stream", _at(level), "", _kb(per_stream), ""))
    rows.append(_capacity(doc))
    return rows


CAPACITY_GAP_MS = 2.0


def _capacity(doc: dict[str, Any]) -> Row:
    """The most native streams (20 tokens/s each) a gateway relayed with its inter-chunk gap
    p99 within `CAPACITY_GAP_MS` of direct, per count of worker processes."""
    target = f"capacity: streams at 20 tok/s, gap p99 added ≤ {CAPACITY_GAP_MS:g} ms"
    levels = sorted(
        (lv for lv in doc["levels"] if lv["path"] == "capacity"), key=lambda lv: lv["concurrency"]
    )
    if not levels:
        return (target, "", "", NOT_RUN, "")
    found = []
    for workers in doc["settings"]["capacity_workers"]:
        label = workers_label(workers)
        within = [
            lv["concurrency"]
            for lv in levels
            if lv["added"].get(label, {}).get("gap_p99_ms", float("inf")) <= CAPACITY_GAP_MS
        ]
        best = f"{max(within)}" if within else f"< {levels[0]['concurrency']}"
        per_core = f", {max(within) / workers:.0f} per core" if within else ""
        found.append(f"{best} streams with {workers} worker(s){per_core}")
    tried = ", ".join(str(lv["concurrency"]) for lv in levels)
    return (target, f"native path, {tried} streams tried", "", "; ".join(found), "")


def _peer(level: dict[str, Any] | None, state: str) -> dict[str, str]:
    """vllm-router's figures at `level` beside the gateway's in pull mode (the same two
    servers behind both), or the peer's state when it did not run."""
    if level is None or VLLM_ROUTER not in level["methods"]:
        return {"ttft": state, "cpu": state}
    ttft = {label: level["added"][label]["ttft_p50_ms"] for label in (VLLM_ROUTER, PULL_GATEWAY)}
    cpu = {
        label: level["methods"][label]["cpu_ms_per_request"]
        for label in (VLLM_ROUTER, PULL_GATEWAY)
    }
    return {
        "ttft": f"vllm-router {ttft[VLLM_ROUTER]:+.2f}, gateway in pull mode"
        f" {ttft[PULL_GATEWAY]:+.2f}, same servers",
        "cpu": f"vllm-router {cpu[VLLM_ROUTER]:.2f} ms, gateway in pull mode"
        f" {cpu[PULL_GATEWAY]:.2f} ms",
    }


def _ttft(target: str, where: str, level: dict[str, Any] | None) -> Row:
    if level is None:
        return (target, where, NOT_RUN, NOT_RUN, "")
    d, g = level["methods"][DIRECT]["ttft_ms"], level["methods"][GATEWAY]["ttft_ms"]
    add = level["added"][GATEWAY]
    return (
        target,
        f"{where}: TTFT p50 / p99",
        f"{d['p50']:.2f} / {d['p99']:.2f}",
        f"{g['p50']:.2f} / {g['p99']:.2f}",
        f"{add['ttft_p50_ms']:+.2f} / {add['ttft_p99_ms']:+.2f}",
    )


def _handoff(level: dict[str, Any] | None) -> Row:
    target = "hand-off gap ≤ 1 ms p99"
    if level is None or "handoff_ms" not in level["methods"][GATEWAY]:
        return (target, "slot hand-off", NOT_RUN, NOT_RUN, "")
    where = (
        f"slot hand-off (memory gate), {level['pool_nodes']} nodes, {level['concurrency']} clients:"
        " a decode's end to its node's next prefill, p50 / p99"
    )
    d, g = level["methods"][DIRECT]["handoff_ms"], level["methods"][GATEWAY]["handoff_ms"]
    add = level["added"][GATEWAY]
    return (
        target,
        where,
        f"{d['p50']:.2f} / {d['p99']:.2f}",
        f"{g['p50']:.2f} / {g['p99']:.2f}",
        f"{add['handoff_p50_ms']:+.2f} / {add['handoff_p99_ms']:+.2f}",
    )


def _one(target: str, where: str, level: dict[str, Any] | None, measure: str, q: str) -> Row:
    label = f"{where}: {'TTFT' if measure == 'ttft' else 'gap'} {q}"
    if level is None:
        return (target, label, NOT_RUN, NOT_RUN, "")
    direct = level["methods"][DIRECT][f"{measure}_ms"][q]
    relayed = level["methods"][GATEWAY][f"{measure}_ms"][q]
    return (target, label, f"{direct:.2f}", f"{relayed:.2f}", f"{relayed - direct:+.2f}")


def _cpu(target: str, where: str, level: dict[str, Any] | None) -> Row:
    cpu = _gateway(level, "cpu_ms_per_request")
    return (target, where, "", NOT_RUN if cpu is None else f"{cpu:.2f} ms", "")


def _gateway(level: dict[str, Any] | None, key: str) -> float | None:
    return None if level is None else level["methods"][GATEWAY].get(key)


def _at(level: dict[str, Any] | None) -> str:
    return "" if level is None else f"{level['path']} path, {level['concurrency']} stream(s)"


def _mb(value: float | None) -> str:
    return NOT_RUN if value is None else f"{value:.1f} MB"


def _kb(value: float | None) -> str:
    return NOT_RUN if value is None else f"{value:.0f} KB"


def _row(cells: Row) -> str:
    return "| " + " | ".join(cells) + " |"


def _level_rows(doc: dict[str, Any]) -> list[str]:
    lines = []
    for level in doc["levels"]:
        for label, m in level["methods"].items():
            add = level["added"].get(label)
            cpu = m.get("cpu_ms_per_request")
            cells = [
                level["path"],
                str(level["concurrency"]),
                label,
                str(m["requests"]),
                f"{m['ttft_ms']['p50']:.2f}",
                f"{m['ttft_ms']['p99']:.2f}",
                f"{m['gap_ms']['p50']:.2f}",
                f"{m['gap_ms']['p99']:.2f}",
                "" if cpu is None else f"{cpu:.2f}",
                "" if add is None else f"{add['ttft_p50_ms']:+.2f} / {add['ttft_p99_ms']:+.2f}",
                "" if add is None else f"{add['gap_p50_ms']:+.2f} / {add['gap_p99_ms']:+.2f}",
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return lines
