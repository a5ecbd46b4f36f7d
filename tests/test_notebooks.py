"""Each notebook in notebooks/ executes end to end on the committed results (results/paper, else results/sample)."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
SAMPLE = NOTEBOOKS.parent / "results" / "sample"



def test_the_sample_is_there():
    assert (SAMPLE / "runs.parquet").is_file() and (SAMPLE / "README.md").is_file()
    assert len(sorted(NOTEBOOKS.glob("*.ipynb"))) == 4


@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("*.ipynb")), ids=lambda p: p.stem)
def test_notebook_runs_on_the_committed_results(path, monkeypatch, tmp_path):
    """results/paper when it is committed (the README's figures), else results/sample; the figure is saved."""
    monkeypatch.delenv("GRAFT_LAB_RESULTS", raising=False)
    monkeypatch.setenv("GRAFT_LAB_FIGURES", str(tmp_path))
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
    images = [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert images, "every notebook draws at least one figure"
    assert list(tmp_path.glob("*.png")), "and saves it where GRAFT_LAB_FIGURES says"


def test_the_readme_shows_every_committed_paper_figure():
    """results/paper's PNGs (experiments/paper_figures.sh) are the README's figures, with the command."""
    paper = NOTEBOOKS.parent / "results" / "paper"
    pngs = sorted(p.name for p in paper.glob("*.png"))
    if not pngs:
        pytest.skip("no paper figures committed yet")
    readme = (NOTEBOOKS.parent / "README.md").read_text()
    assert "experiments/paper_figures.sh" in readme
    for name in pngs:
        assert f"results/paper/{name}" in readme, name
