"""`pd-gateway bench --quick`: every measure of every level is in the JSON, counted and
finite, and the Markdown shows every target. Timing itself is never asserted."""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from bench.report import REPORT_END, REPORT_START
from tests.support.gateway_python import gateway_python, gateway_python_has
from tests.support.processes import run_in_group

pytestmark = pytest.mark.e2e

LEVELS = [
    ("latency", 1),
    ("latency", 2),
    ("batched", 1),
    ("batched", 2),
    ("ttft", 1),
    ("ttft", 2),
    ("ttft-batched", 1),
    ("ttft-batched", 2),
    ("handoff", 6),
    ("native", 1),
    ("native", 4),
    ("capacity", 4),
]
CHECKOUT = Path(__file__).resolve().parents[2]
ROUNDS, REQUESTS, NODES, HANDOFF_REQUESTS, TTFT_REQUESTS = 2, 4, 2, 8, 6  # the quick run's
TARGETS = [
    "TTFT added ≤ 1 ms p50, ≤ 3 ms p99",
    "inter-chunk gap p99 added ≤ 0.5 ms",
    "TTFT p99 added ≤ 5 ms",
    "batch relay: node line to client event",
    "tokens/s per stream through the gateway",
    "TTFT p50 added ≤ 0.5× vllm-router's",
    "CPU per request against vllm-router's",
    "hand-off added vs direct ≤ 1 ms p99 (memory gate)",
    "Redis gate within 1 ms p50, 2 ms p99 of the memory gate",
    "idle RSS ≤ 150 MB, one model",
    "≤ 50 KB per open stream",
    "capacity",
]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    out = tmp_path_factory.mktemp("bench")
    (out / "benchmarks.md").write_text(f"# Figures\n{REPORT_START}\nold\n{REPORT_END}\nAfter.\n")
    done = bench(out, timeout_s=150)
    assert done.returncode == 0, done.stderr[-3000:]
    return out, done


def bench(out: Path, *, timeout_s: float) -> subprocess.CompletedProcess[str]:
    """`pd-gateway bench --quick` writing to `out`, its table into `out`'s benchmarks.md, with
    this checkout as its `--baseline`; run from `out`'s parent with relative paths, as a user
    runs it in a checkout."""
    command = ["bench", "--quick", "--out", out.name, "--report", f"{out.name}/benchmarks.md"]
    command += ["--baseline", str(CHECKOUT)]
    return run_in_group(
        [gateway_python(), "-m", "router.cli", *command],
        timeout_s=timeout_s,
        stdin=subprocess.DEVNULL,
        cwd=out.parent,
    )


@pytest.fixture(scope="module")
def results(run: tuple[Path, subprocess.CompletedProcess[str]]) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((run[0] / "results.json").read_text())
    return document


def expected_requests(level: dict[str, Any]) -> int:
    requests = {"handoff": HANDOFF_REQUESTS, "ttft": TTFT_REQUESTS}.get(
        level["path"].removesuffix("-batched"), REQUESTS
    )
    return ROUNDS * max(level["concurrency"], -(-requests // ROUNDS))


def test_every_level_ran_every_request_of_each_method(results: dict[str, Any]) -> None:
    assert [(lv["path"], lv["concurrency"]) for lv in results["levels"]] == LEVELS
    (capacity,) = [lv for lv in results["levels"] if lv["path"] == "capacity"]
    assert set(capacity["methods"]) == {"direct", "gateway", "gateway-2w"}  # 1 and 2 workers
    for level in results["levels"]:
        assert {"direct", "gateway"} <= set(level["methods"])
        for method in level["methods"].values():
            requests = expected_requests(level)
            assert method["requests"] == requests
            assert method["ttft_ms"]["count"] == requests
            assert method["gap_ms"]["count"] == method["chunks"] - requests > 0


def test_the_baseline_runs_beside_the_gateway_on_every_path(results: dict[str, Any]) -> None:
    """`--baseline`: the other checkout's gateway beside each of this one's, in pull mode
    too; not on the capacity curve."""
    for level in results["levels"]:
        methods = set(level["methods"])
        if level["path"] == "capacity":
            assert not any(label.startswith("baseline") for label in methods)
        elif level["path"] == "native":
            assert {"gateway", "baseline", "gateway-pull", "baseline-pull"} <= methods
        else:
            assert "baseline" in methods


def test_the_budget_table_gives_each_path_its_cpu_against_the_baseline(
    results: dict[str, Any], run: tuple[Path, subprocess.CompletedProcess[str]]
) -> None:
    """A row per level and gateway, its CPU per request against the baseline's, judged."""
    table = (run[0] / "results.md").read_text().splitlines()
    start = next(i for i, line in enumerate(table) if line.startswith("| CPU per request |"))
    end = table.index("", start)
    rows = [line.split(" | ") for line in table[start + 2 : end]]
    budgeted = [lv for lv in results["levels"] if lv["path"] != "capacity"]
    native_levels = [lv for lv in budgeted if lv["path"] == "native"]
    assert len(rows) == len(budgeted) + len(native_levels)  # pull mode's rows of their own
    for cells in rows:
        cpu, base, ratio = float(cells[2]), float(cells[3]), cells[4]
        assert ratio.endswith("×") and float(ratio[:-1]) == pytest.approx(cpu / base, abs=0.01)
        assert cells[-1] in ("yes |", "no |") and "≤ 1.05× baseline" in cells[-2]
    native = [cells[0] for cells in rows if "native" in cells[0]]
    assert native == ["| native (proxy)", "| native (pull)"] * 2


def test_every_measure_is_there_and_finite(results: dict[str, Any]) -> None:
    for level in results["levels"]:
        for label, method in level["methods"].items():
            for measure in ("ttft_ms", "gap_ms"):
                figures = method[measure]
                assert 0 <= figures["p50"] <= figures["p99"] <= figures["max"]
                assert len(figures["cdf"]) == 101 and figures["cdf"] == sorted(figures["cdf"])
            if label == "direct":
                assert "cpu_ms_per_request" not in method
                continue
            assert method["cpu_ms_per_request"] >= 0
            assert 20 < method["rss_idle_mb"] <= method["rss_peak_mb"]
            assert math.isfinite(method["rss_per_stream_kb"])
        assert set(level["added"]) == set(level["methods"]) - {"direct"}
        extra = {"handoff": ["handoff"], "batched": ["relay"]}.get(level["path"], [])
        measures = ["ttft", "gap", *extra]
        for added in level["added"].values():
            assert set(added) == {f"{m}_{q}_ms" for m in measures for q in ("p50", "p99")}
            assert all(math.isfinite(value) for value in added.values())


def test_every_hand_off_of_a_round_is_measured(results: dict[str, Any]) -> None:
    """In each round, every decode but each node's last is followed on its node by the
    next prefill: that many gaps, each one positive."""
    (level,) = [lv for lv in results["levels"] if lv["path"] == "handoff"]
    assert level["pool_nodes"] == NODES
    for method in level["methods"].values():
        figures = method["handoff_ms"]
        assert figures["count"] == method["requests"] - ROUNDS * NODES
        assert 0 < figures["cdf"][0] <= figures["p50"] <= figures["p99"] <= figures["max"]
    for level in results["levels"]:
        if level["path"] != "handoff":
            assert not any("handoff_ms" in method for method in level["methods"].values())


def test_the_hand_off_runs_on_the_memory_gate_and_on_the_redis_gate(
    results: dict[str, Any],
) -> None:
    (level,) = [lv for lv in results["levels"] if lv["path"] == "handoff"]
    expected = {"direct", "gateway", "gateway-redis", "gateway-redis-3x", "baseline"}
    assert set(level["methods"]) == expected


def test_every_batch_of_the_batching_pool_is_paired_with_its_node_line(
    results: dict[str, Any],
) -> None:
    """On the TileRT 0.1.6 pool, each chunk a client read is paired with the line its node
    wrote, directly and through the gateway: as many relay figures as chunks."""
    for level in results["levels"]:
        for method in level["methods"].values():
            assert method["tokens_per_s"]["p50"] > 0
            if level["path"] != "batched":
                assert "relay_ms" not in method
                continue
            assert method["relay_unpaired"] == 0
            assert method["relay_ms"]["count"] == method["chunks"]
            assert 0 < method["relay_ms"]["cdf"][0] <= method["relay_ms"]["p99"]


def test_the_run_is_described(results: dict[str, Any]) -> None:
    assert results["command"].startswith("pd-gateway bench --quick")
    assert results["settings"]["tokens"] == 32
    assert results["machine"]["cpus"] >= 1
    assert "vllm-router" in results["peers"]


def test_markdown_shows_every_target_and_plots_are_drawn_or_explained(
    run: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    out, done = run
    table = (out / "results.md").read_text()
    for target in TARGETS:
        assert target in table
    assert "streams with 1 worker(s)" in table and "streams with 2 worker(s)" in table
    (handoff,) = [line for line in table.splitlines() if "hand-off added vs direct" in line]
    assert "not run" not in handoff and "2 nodes, 6 clients" in handoff
    ttft = [line for line in table.splitlines() if line.startswith("| TTFT added ≤ 1 ms")]
    assert len(ttft) == 4  # 1 and 2 streams on each pool, judged on the TTFT levels
    assert all(f"{TTFT_REQUESTS} requests" in line for line in ttft), ttft
    redis = [line for line in table.splitlines() if "Redis gate within" in line]
    assert len(redis) == 2 and all(line.endswith(("| yes |", "| no |")) for line in redis)
    assert table in done.stdout
    plots = ["ttft_cdf.png", "gap_cdf.png", "overhead.png", "handoff_cdf.png"]
    if gateway_python_has("matplotlib"):
        for name in plots:
            assert (out / name).read_bytes().startswith(b"\x89PNG")
    else:
        assert "pip install 'pd-gateway[bench]'" in done.stderr
        assert not any((out / name).exists() for name in plots)


def test_the_report_gets_the_table_in_its_marked_place(
    run: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    out, _ = run
    table = (out / "results.md").read_text()
    report = (out / "benchmarks.md").read_text()
    assert report == f"# Figures\n{REPORT_START}\n{table}{REPORT_END}\nAfter.\n"


def test_a_report_without_a_marked_place_is_refused_before_measuring(tmp_path: Path) -> None:
    (tmp_path / "benchmarks.md").write_text("# No markers\n")
    done = bench(tmp_path, timeout_s=30)
    assert done.returncode == 2
    assert REPORT_START in done.stderr
    assert not (tmp_path / "results.json").exists()


def test_a_peer_that_cannot_start_is_an_error_naming_its_log(tmp_path: Path) -> None:
    """An installed vllm-router that dies at once (its package installed without its
    dependencies, say): the run stops with what it said, not a traceback."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "vllm-router"
    fake.write_text(
        "#!/bin/sh\necho \"ModuleNotFoundError: No module named 'setproctitle'\"\nexit 1\n"
    )
    fake.chmod(0o755)
    out = tmp_path / "out"
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    done = run_in_group(
        [
            gateway_python(),
            "-m",
            "router.cli",
            "bench",
            "--quick",
            "--no-capacity",
            "--out",
            str(out),
        ],
        timeout_s=100,
        stdin=subprocess.DEVNULL,
        env=env,
    )
    assert done.returncode == 1, done.stderr[-3000:]
    assert "error: vllm-router did not start" in done.stderr
    assert "No module named 'setproctitle'" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (out / "results.json").exists()
