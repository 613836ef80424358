#!/usr/bin/env python3
"""Fails loudly on an executed notebook that went wrong without failing the run.

The evcxr kernel reports a panic, or an `Err` that reaches `?` at the top of a cell, as ordinary
cell output: `jupyter nbconvert --execute` and nbclient then exit 0 (measured, see
notebooks/README.md). This checker reads the executed notebook's JSON and reports, naming the
notebook and the cell:

- an `error` output (compile errors, errors the kernel reports);
- any output text containing `panicked at` (a Rust panic message);
- an `Err(...)`/`Error:` line as a cell's result or in its stderr (an error that reached `?`);
- a `stderr` stream, unless the cell carries the tag `allow-stderr` (for progress output);
- a code cell that was never executed (the run stopped before it).

Python standard library only, so that it runs anywhere. Usage:

    python3 scripts/check_notebook.py EXECUTED.ipynb [...]

Exit status 0 if every notebook is clean, 1 otherwise (the problems are printed on stderr).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

PANIC_MARKER = "panicked at"
ALLOW_STDERR_TAG = "allow-stderr"


def _text(value) -> str:
    """Notebook text fields are either a string or a list of lines."""
    if isinstance(value, list):
        return "".join(value)
    return value or ""


def _output_texts(output: dict) -> list[str]:
    """Every human-readable text of one output, whatever its type."""
    kind = output.get("output_type")
    if kind == "stream":
        return [_text(output.get("text"))]
    if kind == "error":
        return [output.get("ename", ""), output.get("evalue", "")] + [
            _text(line) for line in output.get("traceback", [])
        ]
    if kind in ("execute_result", "display_data"):
        data = output.get("data", {})
        return [_text(data.get(mime)) for mime in ("text/plain", "text/html") if mime in data]
    return []


def _looks_like_error_result(text: str) -> bool:
    """An `Err` or `Error:` that a cell evaluated to or printed as its error."""
    stripped = text.lstrip()
    return stripped.startswith("Err(") or stripped.startswith("Error:")


def _cell_label(index: int, cell: dict) -> str:
    first_line = next(
        (line.strip() for line in _text(cell.get("source")).splitlines() if line.strip()), ""
    )
    if len(first_line) > 60:
        first_line = first_line[:57] + "..."
    return f"cell {index} ({first_line!r})"


def cell_problems(index: int, cell: dict) -> list[str]:
    """The problems of one code cell of an executed notebook."""
    if cell.get("cell_type") != "code" or not _text(cell.get("source")).strip():
        return []
    label = _cell_label(index, cell)
    if cell.get("execution_count") is None:
        return [f"{label}: not executed (the run stopped before it)"]
    tags = cell.get("metadata", {}).get("tags", [])
    outputs = cell.get("outputs", [])
    problems = []
    for output in outputs:
        if output.get("output_type") == "error":
            summary = f"{output.get('ename', '')}: {output.get('evalue', '')}".strip(": ")
            problems.append(f"{label}: error output: {summary[:500]}")
    # The kernel sends one stream output per line: judge the cell's text as a whole, and report
    # each kind of problem once per cell.
    all_text = "\n".join(t for output in outputs for t in _output_texts(output))
    if PANIC_MARKER in all_text:
        line = next(l for l in all_text.splitlines() if PANIC_MARKER in l)
        problems.append(f"{label}: panic: {line.strip()[:500]}")
    for output in outputs:
        if output.get("output_type") == "execute_result":
            text = "\n".join(_output_texts(output))
            if _looks_like_error_result(text):
                problems.append(f"{label}: evaluated to an error: {text.strip()[:500]}")
    stderr = "".join(
        _text(o.get("text"))
        for o in outputs
        if o.get("output_type") == "stream" and o.get("name") == "stderr"
    )
    error_line = any(_looks_like_error_result(line) for line in stderr.splitlines())
    if stderr.strip() and (error_line or ALLOW_STDERR_TAG not in tags):
        lines = [line for line in stderr.splitlines() if line.strip()]
        more = f" (+{len(lines) - 5} more lines)" if len(lines) > 5 else ""
        problems.append(f"{label}: wrote to stderr: " + " | ".join(lines[:5])[:800] + more)
    return problems


def notebook_problems(path: Path) -> list[str]:
    """The problems of one executed notebook, each naming the notebook and the cell."""
    try:
        notebook = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        return [f"{path}: cannot read the executed notebook: {err}"]
    cells = notebook.get("cells") if isinstance(notebook, dict) else None
    if not isinstance(cells, list):
        return [f"{path}: not a notebook (no 'cells' list)"]
    return [
        f"{path}: {problem}"
        for index, cell in enumerate(cells)
        for problem in cell_problems(index, cell)
    ]


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    problems = [p for arg in argv for p in notebook_problems(Path(arg))]
    for problem in problems:
        print(f"FAILED {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
