"""Answers that cannot rot: every notebook's answers run after it (docs/notebook_outputs.py, ``ANSWERS_RUN``), and
an answer that states a number computes it with the project's code and asserts it."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from tests.docs.test_notebooks import NOTEBOOKS, _outputs

_CODE = re.compile(r"```.*?```", re.DOTALL)


def test_every_notebook_runs_its_answers() -> None:
    assert {p.name for p in NOTEBOOKS} <= _outputs().ANSWERS_RUN


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_an_answer_that_states_a_number_asserts_it(path: Path) -> None:
    out = _outputs()
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        for answer in out._ANSWER.findall(cell.source):
            prose = _CODE.sub("", answer).replace("<details><summary>Answer</summary>", "")
            if re.search(r"\d", prose):
                assert any("assert " in code for code in out._PYTHON.findall(answer)), (
                    f"{path.name}: an answer states a number but no ```python block asserts one: "
                    f"{' '.join(prose.split())[:120]}")
