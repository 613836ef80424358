#!/usr/bin/env python3
"""Executes evcxr notebooks headless with visible progress, then checks them.

Called by scripts/run_notebooks.sh, which sets up the environment (the venv with nbclient, the
`rust` kernel, EVCXR_TMPDIR, EVCXR_CONFIG_DIR, RANKWISE_SCALE). For each notebook it prints
which cell runs and, every minute, that the cell is still running (the first cell compiles
rankwise for minutes on a cold machine), writes the executed copy atomically, and then runs
scripts/check_notebook.py's checks on it: a panic or an error printed by a cell fails the run
even when the kernel itself reported success.

Usage: execute_notebooks.py [--out-dir DIR] [--cell-timeout S] NOTEBOOK...
Without --out-dir the notebooks are overwritten with their executed copies.
Exit status: 0 if every notebook ran clean, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_notebook import notebook_problems  # noqa: E402

HEARTBEAT_SECONDS = 60


def log(message: str) -> None:
    print(f"[notebooks] {message}", file=sys.stderr, flush=True)


def minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


class Progress:
    """Prints the cell that starts, the time each took, and a heartbeat for long cells."""

    def __init__(self, name: str, num_cells: int):
        self.name = name
        self.num_cells = num_cells
        self.cell = None
        self.started = time.monotonic()
        self.cell_started = self.started
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._heartbeat, daemon=True)
        self.thread.start()

    def _heartbeat(self) -> None:
        while not self.stop.wait(HEARTBEAT_SECONDS):
            if self.cell is not None:
                log(
                    f"{self.name}: cell {self.cell}/{self.num_cells} still running "
                    f"({minutes(time.monotonic() - self.cell_started)})"
                )

    def on_cell_start(self, cell, cell_index, **_kwargs) -> None:
        if cell.cell_type != "code":
            return
        self.cell = cell_index
        self.cell_started = time.monotonic()
        first = next((l for l in cell.source.splitlines() if l.strip()), "")
        note = ""
        if first.lstrip().startswith(":dep"):
            note = " (builds rankwise inside evcxr: minutes on a cold machine, seconds warm)"
        log(f"{self.name}: cell {cell_index}/{self.num_cells} `{first[:60]}`{note}")

    def on_cell_executed(self, cell, cell_index, **_kwargs) -> None:
        if cell.cell_type == "code":
            log(
                f"{self.name}: cell {cell_index} done in "
                f"{time.monotonic() - self.cell_started:.1f} s"
            )
        self.cell = None

    def close(self) -> float:
        self.stop.set()
        return time.monotonic() - self.started


def write_atomically(notebook, path: Path) -> None:
    """Writes next to `path` and renames, so a reader never sees half a notebook."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # mkstemp creates the file 0600; give it the permissions a plain open() would.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            nbformat.write(notebook, f)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def execute(path: Path, out_path: Path, cell_timeout: int) -> list[str]:
    """Runs one notebook; returns its problems (empty when it ran clean)."""
    notebook = nbformat.read(path, as_version=4)
    progress = Progress(path.stem, len(notebook.cells) - 1)
    client = NotebookClient(
        notebook,
        kernel_name="rust",
        timeout=cell_timeout,
        # Cells run in the notebook's folder, so `:dep rankwise = { path = ".." }` resolves.
        resources={"metadata": {"path": str(path.parent)}},
        on_cell_start=progress.on_cell_start,
        on_cell_executed=progress.on_cell_executed,
    )
    problems = []
    try:
        client.execute()
    except (CellExecutionError, CellTimeoutError, DeadKernelError) as err:
        # The partly executed notebook is still written: its outputs show what went wrong.
        problems.append(f"{path}: execution stopped: {str(err).strip()[:600]}")
    finally:
        elapsed = progress.close()
    write_atomically(notebook, out_path)
    problems += notebook_problems(out_path)
    status = "FAILED" if problems else "ok"
    log(f"{path.stem}: {status} in {minutes(elapsed)} -> {out_path}")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--out-dir", type=Path, help="write executed copies here (default: in place)")
    parser.add_argument(
        "--cell-timeout", type=int, default=10800, help="seconds one cell may run (default 10800)"
    )
    args = parser.parse_args()
    problems = []
    for index, path in enumerate(args.notebooks, 1):
        log(f"[{index}/{len(args.notebooks)}] {path}")
        out_path = args.out_dir / path.name if args.out_dir else path
        problems += execute(path.resolve(), out_path.resolve(), args.cell_timeout)
    for problem in problems:
        print(f"FAILED {problem}", file=sys.stderr)
    if problems:
        log(f"{len(problems)} problem(s) in the notebooks above")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
