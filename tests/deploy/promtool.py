"""Installs `promtool` (Prometheus's rule checker) into `.promtool/` beside the project, for
the tests that evaluate the alert rules (`promtool test rules`). It comes from Debian's
`prometheus` package, unpacked where it is, so no root is needed (except to read the
package lists with `apt-get update` on a machine that has none):

    python -m tests.deploy.promtool

Does nothing when `.promtool/` already holds a promtool that runs. `PD_PROMTOOL` names
another promtool to use instead.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".promtool"
PACKAGE = "prometheus"


def promtool() -> Path:
    """The promtool the tests run: `PD_PROMTOOL`, else the one installed in `.promtool/`."""
    return Path(os.environ.get("PD_PROMTOOL") or CACHE / "usr" / "bin" / "promtool")


def runs(tool: Path) -> bool:
    if not tool.exists():
        return False
    return subprocess.run([str(tool), "--version"], capture_output=True).returncode == 0


def install() -> None:
    tool = promtool()
    if runs(tool):
        print(f"promtool is ready: {tool}")
        return
    with tempfile.TemporaryDirectory() as download:
        fetched = _download(download)
        if fetched.returncode != 0 and os.geteuid() == 0:
            # A fresh machine may have empty package lists: read them, then try again.
            subprocess.run(["apt-get", "update", "-qq"], capture_output=True)
            fetched = _download(download)
        debs = list(Path(download).glob(f"{PACKAGE}_*.deb"))
        if fetched.returncode != 0 or not debs:
            sys.exit(f"apt-get download {PACKAGE} failed: {fetched.stderr.strip()}")
        shutil.rmtree(CACHE, ignore_errors=True)
        subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(CACHE)], check=True)
    # Only promtool is wanted: the server binary and the web assets are most of the package.
    for unwanted in ("usr/bin/prometheus", "usr/share"):
        path = CACHE / unwanted
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    if not runs(tool):
        sys.exit(f"promtool did not install in {CACHE}")
    print(f"promtool is ready: {tool}")


def _download(folder: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["apt-get", "download", PACKAGE], cwd=folder, capture_output=True, text=True
    )


if __name__ == "__main__":
    install()
