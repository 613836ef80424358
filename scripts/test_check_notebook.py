#!/usr/bin/env python3
"""Unit tests of check_notebook.py (standard library only): python3 scripts/test_check_notebook.py"""

import json
import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_notebook import cell_problems, main, notebook_problems  # noqa: E402


def code_cell(outputs, source="let x = 1;", executed=True, tags=None):
    return {
        "cell_type": "code",
        "source": source,
        "execution_count": 1 if executed else None,
        "metadata": {"tags": tags} if tags else {},
        "outputs": outputs,
    }


def stream(name, text):
    return {"output_type": "stream", "name": name, "text": text}


class CellProblems(unittest.TestCase):
    def test_clean_cell_passes(self):
        cell = code_cell([stream("stdout", ["R@1 0.52\n", "done\n"])])
        self.assertEqual(cell_problems(0, cell), [])

    def test_markdown_and_empty_cells_are_ignored(self):
        self.assertEqual(cell_problems(0, {"cell_type": "markdown", "source": "panicked at"}), [])
        self.assertEqual(cell_problems(1, code_cell([], source="  \n", executed=False)), [])

    def test_error_output_fails_and_names_the_cell(self):
        cell = code_cell(
            [{"output_type": "error", "ename": "Error", "evalue": "cannot find value `y`", "traceback": []}],
            source="\n:dep rankwise = { path = \"..\" }\n",
        )
        [problem] = cell_problems(3, cell)
        self.assertIn("cell 3", problem)
        self.assertIn(":dep rankwise", problem)
        self.assertIn("cannot find value `y`", problem)

    def test_panic_fails_once_per_cell(self):
        panic = [stream("stdout", "thread '<unnamed>' panicked at src/lib.rs:3:5:\n"), stream("stdout", "boom\n")]
        [problem] = cell_problems(0, code_cell(panic))
        self.assertIn("panic", problem)
        self.assertIn("src/lib.rs:3:5", problem)
        # On stderr (where the kernel sends it) the panic and the stderr text are both reported.
        lines = [stream("stderr", f"line {i}\n") for i in range(9)] + [stream("stderr", "x panicked at y\n")]
        problems = cell_problems(0, code_cell(lines))
        self.assertEqual(len(problems), 2)
        self.assertTrue(any("panic" in p for p in problems))
        self.assertTrue(any("+5 more lines" in p for p in problems))

    def test_panic_in_display_data_fails(self):
        cell = code_cell([{"output_type": "display_data", "data": {"text/plain": ["x panicked at y"]}}])
        self.assertEqual(len(cell_problems(0, cell)), 1)

    def test_stderr_fails_unless_allowed(self):
        cell = code_cell([stream("stderr", "epoch 1/5\n")])
        self.assertEqual(len(cell_problems(0, cell)), 1)
        allowed = code_cell([stream("stderr", "epoch 1/5\n")], tags=["allow-stderr"])
        self.assertEqual(cell_problems(0, allowed), [])

    def test_error_in_allowed_stderr_still_fails(self):
        cell = code_cell([stream("stderr", "Error: file not found\n")], tags=["allow-stderr"])
        self.assertEqual(len(cell_problems(0, cell)), 1)

    def test_err_result_fails(self):
        result = {"output_type": "execute_result", "data": {"text/plain": "Err(Io(NotFound))"}}
        [problem] = cell_problems(0, code_cell([result]))
        self.assertIn("Err(Io(NotFound))", problem)
        ok = {"output_type": "execute_result", "data": {"text/plain": "Ok(())"}}
        self.assertEqual(cell_problems(0, code_cell([ok])), [])

    def test_unexecuted_cell_fails(self):
        [problem] = cell_problems(5, code_cell([], executed=False))
        self.assertIn("not executed", problem)


class NotebookProblems(unittest.TestCase):
    def write(self, content):
        tmp = tempfile.NamedTemporaryFile("w", suffix=".ipynb", delete=False)
        self.addCleanup(Path(tmp.name).unlink)
        tmp.write(content)
        tmp.close()
        return Path(tmp.name)

    def test_clean_notebook_exits_zero(self):
        path = self.write(json.dumps({"cells": [code_cell([stream("stdout", "ok\n")])]}))
        self.assertEqual(notebook_problems(path), [])
        self.assertEqual(main([str(path)]), 0)

    def test_problem_names_the_notebook_and_exits_one(self):
        path = self.write(json.dumps({"cells": [code_cell([stream("stderr", "oops\n")])]}))
        [problem] = notebook_problems(path)
        self.assertTrue(problem.startswith(str(path)))
        self.assertEqual(main([str(path)]), 1)  # prints the FAILED line on stderr

    def test_unreadable_notebook_is_a_problem(self):
        self.assertEqual(len(notebook_problems(self.write("{not json"))), 1)
        self.assertEqual(len(notebook_problems(self.write("[]"))), 1)
        self.assertEqual(len(notebook_problems(Path("/nonexistent/x.ipynb"))), 1)


if __name__ == "__main__":
    unittest.main()
