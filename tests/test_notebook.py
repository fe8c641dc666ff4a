"""Execute notebooks/walkthrough.ipynb so the walkthrough never rots."""
from __future__ import annotations

from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "walkthrough.ipynb"

nbformat = pytest.importorskip("nbformat", reason="nbformat not installed (pip install nbformat)")
nbclient = pytest.importorskip("nbclient", reason="nbclient not installed (pip install nbclient)")


def test_walkthrough_notebook_runs(monkeypatch):
    pytest.importorskip("ipykernel", reason="ipykernel not installed (pip install ipykernel)")
    monkeypatch.setenv("OPSCOPE_NO_BROWSER", "1")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=240, kernel_name="python3",
                                     resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    client.execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    text = "\n".join(str(o.get("text", "")) + str(o.get("data", {}).get("text/plain", "")) for o in outputs)
    assert "'report.html'" in text and "'scan.json'" in text and "operator signatures" in text
    assert "report.xlsx" in text and "# NPU readiness" in text
    assert "time by verdict (us/step): {" in text and "'native'" in text  # run.operators.groupby("verdict")
    assert "backend unchanged: True" in text  # opscope.capture in a notebook keeps its matplotlib backend
