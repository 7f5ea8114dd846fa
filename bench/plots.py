"""PNG plots of a run, from its JSON document: TTFT, inter-chunk gap and hand-off CDFs per
level, and what the gateway adds as concurrency grows. Needs matplotlib (the `bench` extra)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

INSTALL_HINT = "pip install 'pd-gateway[bench]'  (or: pip install matplotlib)"


class PlotsUnavailable(RuntimeError):
    """matplotlib is not installed."""


def write_plots(doc: dict[str, Any], out: Path) -> list[Path]:
    try:
        import matplotlib
    except ImportError:
        raise PlotsUnavailable(f"matplotlib is not installed: {INSTALL_HINT}") from None
    matplotlib.use("Agg")  # files only, no display
    written = [
        _cdfs(doc, "ttft_ms", "time to first token (ms)", out / "ttft_cdf.png"),
        _cdfs(doc, "gap_ms", "inter-chunk gap (ms)", out / "gap_cdf.png"),
        _overhead(doc, out / "overhead.png"),
    ]
    if any(_measured(level, "handoff_ms") for level in doc["levels"]):
        written.append(_cdfs(doc, "handoff_ms", "slot hand-off gap (ms)", out / "handoff_cdf.png"))
    return written


def _cdfs(doc: dict[str, Any], measure: str, title: str, path: Path) -> Path:
    import matplotlib.pyplot as plt

    levels = [level for level in doc["levels"] if _measured(level, measure)]
    figure, axes = plt.subplots(1, len(levels), figsize=(3.2 * len(levels), 3.2), squeeze=False)
    for axis, level in zip(axes[0], levels, strict=True):
        for label, method in level["methods"].items():
            cdf = method[measure].get("cdf", [])
            fractions = [i / max(len(cdf) - 1, 1) for i in range(len(cdf))]
            axis.plot(cdf, fractions, label=label)
        axis.set_title(f"{level['path']}, {level['concurrency']} stream(s)", fontsize=9)
        axis.set_xlabel(title, fontsize=8)
        axis.grid(alpha=0.3)
    axes[0][0].set_ylabel("fraction of requests" if measure == "ttft_ms" else "fraction")
    axes[0][0].legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def _measured(level: dict[str, Any], measure: str) -> bool:
    return all(measure in method for method in level["methods"].values())


def _overhead(doc: dict[str, Any], path: Path) -> Path:
    import matplotlib.pyplot as plt

    paths = sorted({level["path"] for level in doc["levels"]})
    figure, axes = plt.subplots(1, len(paths), figsize=(5 * len(paths), 3.6), squeeze=False)
    for axis, name in zip(axes[0], paths, strict=True):
        levels = [lv for lv in doc["levels"] if lv["path"] == name]
        streams = [lv["concurrency"] for lv in levels]
        routers = sorted({label for lv in levels for label in lv["added"]})
        for router in routers:
            for key, style in (
                ("ttft_p50_ms", "o-"),
                ("ttft_p99_ms", "o--"),
                ("gap_p99_ms", "s:"),
            ):
                values = [lv["added"][router][key] for lv in levels]
                axis.plot(streams, values, style, label=f"{router} {key.removesuffix('_ms')}")
        axis.axhline(0, color="grey", linewidth=0.8)
        axis.set_xscale("log", base=2)
        axis.set_title(f"{name} path: added to direct", fontsize=10)
        axis.set_xlabel("concurrent streams")
        axis.set_ylabel("ms")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
