"""The Markdown docs/benchmarks.md embeds: every target of the performance campaign with its
measured value beside direct orchestration, then every level in full. Built from the JSON
document alone, so a saved run can be rendered again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.scenarios import (
    BASELINE,
    BASELINE_PULL,
    DIRECT,
    GATEWAY,
    PULL_GATEWAY,
    VLLM_ROUTER,
    redis_label,
    workers_label,
)

Row = tuple[str, str, str, str, str, str]  # target, measure, direct, gateway, added, met
NOT_RUN = "not run"
MET, NOT_MET, NO_TARGET = "yes", "no", "(no target)"


def met(held: bool) -> str:
    """A target's verdict, as the tables write it."""
    return MET if held else NOT_MET


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
        f"`{doc['command']}` (pd-gateway {doc['version']} on Python"
        f" {doc['machine']['python']}, {doc['created']};"
        f" {doc['machine']['cpus']} CPUs, load {doc['machine']['load_average'][0]})",
        "",
        "| target | measure | direct | gateway | added | met |",
        "| --- | --- | --- | --- | --- | --- |",
        *(_row(row) for row in target_rows(doc)),
        "",
        *budget_table(doc),
        "",
        "| path | streams | method | requests | TTFT p50 | TTFT p99 | gap p50 | gap p99 |"
        " tokens/s p50 | batch relay p50 / p99 | CPU / request | added TTFT p50 / p99 |"
        " added gap p50 / p99 |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
        " ---: |",
        *_level_rows(doc),
        "",
        "ms unless stated. TTFT: from sending the request to the first node line (direct"
        " latency), or SSE event with content; gap: between consecutive chunks of a stream;"
        " hand-off: from the simulators' records, with clients queueing for the pool"
        " (direct: the clients hand a node to the longest waiter among them);"
        " batch relay: from a node handing a line to its server to the client reading the"
        " chunk that carries it (the node's record, paired by rid);"
        " tokens/s: one stream's tokens over the time from sending to its last chunk."
        " Paths: latency, TileRT nodes writing a line per decode step (as 0.1.5 does);"
        " batched, TileRT 0.1.6 nodes (the first token on a line of its own, then a line"
        f" every {doc['settings'].get('batch_interval_ms', 200):g} ms); ttft and"
        " ttft-batched, the same two pools answering"
        f" {doc['settings'].get('ttft_tokens', 16)} tokens, the TTFT targets' levels."
        " CPU and memory are each router process's own (all replicas'), from /proc.",
    ]
    peers = ", ".join(f"{name}: {state}" for name, state in doc["peers"].items())
    if peers:
        lines.append(f"Peers: {peers}.")
    return "\n".join(lines) + "\n"


def target_rows(doc: dict[str, Any]) -> list[Row]:
    settings = doc["settings"]
    latency = _by_streams(doc, "latency")
    batched = _by_streams(doc, "batched")
    native = _by_streams(doc, "native")
    nodes = settings["nodes"]
    rows: list[Row] = []
    # Judged on the TTFT levels (many short requests) where the run has them.
    for name, levels in (
        ("latency path", _by_streams(doc, "ttft") or latency),
        ("TileRT 0.1.6 pool", _by_streams(doc, "ttft-batched") or batched),
    ):
        for level in sorted({1, nodes}):
            where = f"{name}, {level} stream(s), {nodes} nodes"
            rows.append(_ttft(where, levels.get(level)))
    widest = latency.get(16) or (latency[max(latency)] if latency else None)
    streams = widest["concurrency"] if widest else 16
    where = f"latency path, {streams} streams"
    rows.append(_one("inter-chunk gap p99 added ≤ 0.5 ms", where, widest, "gap", "p99", 0.5))
    rows.append(_one("TTFT p99 added ≤ 5 ms", where, widest, "ttft", "p99", 5.0))
    for level in sorted(batched):
        rows += _batched(batched[level])
    top = native[max(native)] if native else None
    rows += _against_peer(top, doc["peers"].get(VLLM_ROUTER, NOT_RUN))
    rows += _handoff(next((lv for lv in doc["levels"] if lv["path"] == "handoff"), None))
    first = latency.get(min(latency)) if latency else None
    idle = _gateway(first, "rss_idle_mb")
    rows.append(("idle RSS ≤ 150 MB, one model", _at(first), "", _mb(idle), "", _met(idle, 150.0)))
    # Growth over the resident size with one stream open, shared out: the more streams,
    # the less one allocator arena more or less weighs in it.
    for level in (widest, top):
        per_stream = _gateway(level, "rss_per_stream_kb")
        rows.append(
            ("≤ 50 KB per open stream", _at(level), "", _kb(per_stream), "", _met(per_stream, 50.0))
        )
    rows.append(_capacity(doc))
    return rows


def _by_streams(doc: dict[str, Any], path: str) -> dict[int, dict[str, Any]]:
    return {lv["concurrency"]: lv for lv in doc["levels"] if lv["path"] == path}


def _met(value: float | None, limit: float | None) -> str:
    if value is None or limit is None:
        return ""
    return MET if value <= limit else NOT_MET


CAPACITY_GAP_MS = 2.0


def _capacity(doc: dict[str, Any]) -> Row:
    """The most native streams (20 tokens/s each) a gateway relayed with its inter-chunk gap
    p99 within `CAPACITY_GAP_MS` of direct, per count of worker processes."""
    target = f"capacity: streams at 20 tok/s, gap p99 added ≤ {CAPACITY_GAP_MS:g} ms"
    levels = sorted(
        (lv for lv in doc["levels"] if lv["path"] == "capacity"), key=lambda lv: lv["concurrency"]
    )
    if not levels:
        return (target, "", "", NOT_RUN, "", "")
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
    return (target, f"native path, {tried} streams tried", "", "; ".join(found), "", NO_TARGET)


def _against_peer(level: dict[str, Any] | None, state: str) -> list[Row]:
    """The native path's targets against vllm-router on the same two servers: TTFT p50
    added at most half the peer's, in each mode; CPU per request at most the peer's in
    `pull` mode (the same two legs) and below it in `proxy` mode (one leg)."""
    streams = level["concurrency"] if level else "?"
    rows: list[Row] = []
    for mode, label in (("proxy", GATEWAY), ("pull", PULL_GATEWAY)):
        where = f"native path ({mode} mode), {streams} streams"
        if level is None or label not in level["methods"]:
            rows.append(
                (f"TTFT p50 added ≤ 0.5× vllm-router's ({mode})", where, "", NOT_RUN, "", "")
            )
            continue
        ttft = level["added"][label]["ttft_p50_ms"]
        cpu = level["methods"][label]["cpu_ms_per_request"]
        if VLLM_ROUTER not in level["methods"]:
            rows.append(
                ("TTFT p50 added ≤ 0.5× vllm-router's", where, "", f"{ttft:+.2f}", "", state)
            )
            rows.append(
                ("CPU per request against vllm-router's", where, "", f"{cpu:.2f} ms", "", state)
            )
            continue
        peer_ttft = level["added"][VLLM_ROUTER]["ttft_p50_ms"]
        peer_cpu = level["methods"][VLLM_ROUTER]["cpu_ms_per_request"]
        rows.append(
            (
                f"TTFT p50 added ≤ 0.5× vllm-router's (vllm-router {peer_ttft:+.2f})",
                f"{where}: TTFT p50",
                f"{level['methods'][DIRECT]['ttft_ms']['p50']:.2f}",
                f"{level['methods'][label]['ttft_ms']['p50']:.2f}",
                f"{ttft:+.2f} ({_times(ttft, peer_ttft)})",
                met(ttft <= 0.5 * peer_ttft),
            )
        )
        below = mode == "proxy"
        rows.append(
            (
                f"CPU per request {'<' if below else '≤'} vllm-router's"
                f" (vllm-router {peer_cpu:.2f} ms)",
                where,
                "",
                f"{cpu:.2f} ms ({_times(cpu, peer_cpu)})",
                "",
                met(cpu < peer_cpu if below else cpu <= peer_cpu),
            )
        )
    return rows


def _times(value: float, reference: float) -> str:
    return f"{value / reference:.2f}×" if reference > 0 else "n/a"


BASELINE_BUDGET = 1.05
"""CPU per request a gateway may take against `--baseline`'s on the same level: what a
change may cost before the budget says so (runs of identical code differ by a few %)."""

BUDGETED_PATHS = ("latency", "batched", "ttft", "ttft-batched", "handoff", "native")
BASELINE_OF = {GATEWAY: BASELINE, PULL_GATEWAY: BASELINE_PULL}


def budget_table(doc: dict[str, Any]) -> list[str]:
    """CPU per request of each path's gateway at each level, beside `--baseline`'s and,
    on the native path, vllm-router's on the same servers, and whether it holds the
    budget: at most `BASELINE_BUDGET`× the baseline's; in `pull` mode at most
    vllm-router's, in `proxy` mode below it."""
    lines = [
        "| CPU per request | streams | gateway | baseline | × baseline | vllm-router"
        " | × vllm-router | budget | held |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for level in doc["levels"]:
        if level["path"] not in BUDGETED_PATHS:
            continue
        methods = level["methods"]
        for label, baseline_label in BASELINE_OF.items():
            if label not in methods or "cpu_ms_per_request" not in methods[label]:
                continue
            cpu = methods[label]["cpu_ms_per_request"]
            base = methods.get(baseline_label, {}).get("cpu_ms_per_request")
            peer = methods.get(VLLM_ROUTER, {}).get("cpu_ms_per_request")
            rules, held = [], []
            if level["path"] == "native" and peer is not None:
                below = label == GATEWAY
                rules.append("< 1.0× vllm-router" if below else "≤ 1.0× vllm-router")
                held.append(cpu < peer if below else cpu <= peer)
            if base is not None:
                rules.append(f"≤ {BASELINE_BUDGET:g}× baseline")
                held.append(cpu <= BASELINE_BUDGET * base)
            mode = {GATEWAY: " (proxy)", PULL_GATEWAY: " (pull)"}[label]
            cells = [
                level["path"] + (mode if level["path"] == "native" else ""),
                str(level["concurrency"]),
                f"{cpu:.2f}",
                "" if base is None else f"{base:.2f}",
                "" if base is None else _times(cpu, base),
                "" if peer is None else f"{peer:.2f}",
                "" if peer is None else _times(cpu, peer),
                ", ".join(rules) or "(no reference run)",
                met(all(held)) if held else "",
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def _ttft(where: str, level: dict[str, Any] | None) -> Row:
    target = "TTFT added ≤ 1 ms p50, ≤ 3 ms p99"
    if level is None:
        return (target, where, NOT_RUN, NOT_RUN, "", "")
    d, g = level["methods"][DIRECT]["ttft_ms"], level["methods"][GATEWAY]["ttft_ms"]
    add = level["added"][GATEWAY]
    met = add["ttft_p50_ms"] <= 1.0 and add["ttft_p99_ms"] <= 3.0
    requests = level["methods"][GATEWAY]["requests"]
    return (
        target,
        f"{where}: TTFT p50 / p99, {requests} requests",
        _pair(d["p50"], d["p99"]),
        _pair(g["p50"], g["p99"]),
        _pair(add["ttft_p50_ms"], add["ttft_p99_ms"], signed=True),
        MET if met else NOT_MET,
    )


def _batched(level: dict[str, Any]) -> list[Row]:
    """What the gateway adds to a batch's way from its node to the client, and its
    tokens per second beside direct's, on the TileRT 0.1.6 pool."""
    where = f"TileRT 0.1.6 pool, {level['concurrency']} stream(s)"
    d, g = level["methods"][DIRECT], level["methods"][GATEWAY]
    rows: list[Row] = []
    if "p50" in d.get("relay_ms", {}) and "p50" in g.get("relay_ms", {}):
        add = level["added"][GATEWAY]
        unpaired = g["relay_unpaired"] + d["relay_unpaired"]
        note = f", {unpaired} request(s) unpaired" if unpaired else ""
        rows.append(
            (
                "batch relay: node line to client event (measured)",
                f"{where}: p50 / p99, {g['relay_ms']['count']} batches{note}",
                _pair(d["relay_ms"]["p50"], d["relay_ms"]["p99"]),
                _pair(g["relay_ms"]["p50"], g["relay_ms"]["p99"]),
                _pair(add["relay_p50_ms"], add["relay_p99_ms"], signed=True),
                NO_TARGET,
            )
        )
    dt, gt = d["tokens_per_s"]["p50"], g["tokens_per_s"]["p50"]
    rows.append(
        (
            "tokens/s per stream through the gateway (measured)",
            f"{where}: p50",
            f"{dt:.0f}",
            f"{gt:.0f}",
            f"{(gt - dt) / dt * 100:+.1f} %" if dt else "",
            NO_TARGET,
        )
    )
    return rows


def _handoff(level: dict[str, Any] | None) -> list[Row]:
    """The memory gate against direct, and each Redis setup against the memory gate."""
    target = "hand-off added vs direct ≤ 1 ms p99 (memory gate)"
    if level is None or "handoff_ms" not in level["methods"][GATEWAY]:
        return [(target, "slot hand-off", NOT_RUN, NOT_RUN, "", "")]
    where = (
        f"slot hand-off, {level['pool_nodes']} nodes, {level['concurrency']} clients:"
        " a decode's end to its node's next prefill, p50 / p99"
    )
    methods = level["methods"]
    d, g = methods[DIRECT]["handoff_ms"], methods[GATEWAY]["handoff_ms"]
    add = level["added"][GATEWAY]
    rows: list[Row] = [
        (
            target,
            where,
            _pair(d["p50"], d["p99"]),
            _pair(g["p50"], g["p99"]),
            _pair(add["handoff_p50_ms"], add["handoff_p99_ms"], signed=True),
            MET if add["handoff_p99_ms"] <= 1.0 else NOT_MET,
        )
    ]
    for label in methods:
        if not label.startswith(redis_label(1)) or "handoff_ms" not in methods[label]:
            continue
        r = methods[label]["handoff_ms"]
        p50, p99 = r["p50"] - g["p50"], r["p99"] - g["p99"]
        replicas = label.removeprefix(redis_label(1)).strip("-") or "1x"
        rows.append(
            (
                "Redis gate within 1 ms p50, 2 ms p99 of the memory gate",
                f"slot hand-off on the Redis gate, {replicas.removesuffix('x')} replica(s):"
                " p50 / p99 (direct column: the memory gate's; added: Redis minus memory)",
                _pair(g["p50"], g["p99"]),
                _pair(r["p50"], r["p99"]),
                _pair(p50, p99, signed=True),
                MET if p50 <= 1.0 and p99 <= 2.0 else NOT_MET,
            )
        )
    return rows


def _pair(p50: float, p99: float, *, signed: bool = False) -> str:
    return f"{p50:+.2f} / {p99:+.2f}" if signed else f"{p50:.2f} / {p99:.2f}"


def _one(
    target: str,
    where: str,
    level: dict[str, Any] | None,
    measure: str,
    q: str,
    limit: float | None,
) -> Row:
    label = f"{where}: {'TTFT' if measure == 'ttft' else 'gap'} {q}"
    if level is None:
        return (target, label, NOT_RUN, NOT_RUN, "", "")
    direct = level["methods"][DIRECT][f"{measure}_ms"][q]
    relayed = level["methods"][GATEWAY][f"{measure}_ms"][q]
    added = relayed - direct
    return (target, label, f"{direct:.2f}", f"{relayed:.2f}", f"{added:+.2f}", _met(added, limit))


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
                f"{m['tokens_per_s']['p50']:.0f}" if "tokens_per_s" in m else "",
                _relay(m),
                "" if cpu is None else f"{cpu:.2f}",
                "" if add is None else f"{add['ttft_p50_ms']:+.2f} / {add['ttft_p99_ms']:+.2f}",
                "" if add is None else f"{add['gap_p50_ms']:+.2f} / {add['gap_p99_ms']:+.2f}",
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def _relay(method: dict[str, Any]) -> str:
    relay = method.get("relay_ms", {})
    return _pair(relay["p50"], relay["p99"]) if "p50" in relay else ""


def publish(table: str, scenario: str, out: Path, report: Path | None) -> None:
    """A scenario's table: printed, written to `out/<scenario>.md` and, with `report`,
    into that page between the scenario's markers."""
    print(table)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{scenario}.md").write_text(table, encoding="utf-8")
    if report is not None:
        page = report.read_text(encoding="utf-8")
        report.write_text(embedded(page, table, *markers(scenario)), encoding="utf-8")
