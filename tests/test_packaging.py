"""Packaging: the repository root shadows no installed package, and constraints.txt pins what pyproject admits.

`python -m pytest` and `python run.py` put the repository root first on sys.path, so a regular package there is
found before a distribution of the same name. transformers 5.25 depends on the Hugging Face `kernels` package and
probes it at import time; it imported this project's old top-level `kernels/` folder instead, which broke every
import of transformers (CI on 2026-12-03). Everything importable lives under src/; the root's folders are namespace
packages at most, which transformers' probes treat as absent.
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]


def test_no_regular_package_at_the_repository_root():
    packages = sorted(p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file() and p.name != ".venv")
    assert packages == [], f"move these under src/graft_lab/: {packages}"


def test_kernels_resolves_to_an_installed_package_or_nothing():
    probe = "import importlib.util as u; s = u.find_spec('kernels'); print(s.origin if s else '')"
    origin = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    path = origin.stdout.strip()
    assert "site-packages" in path or not path.startswith(str(ROOT)), f"the repository shadows `kernels`: {path}"


def test_transformers_imports_from_the_repository_root():
    probe = "import transformers.modeling_utils, graft_lab.kernels as k; print(k.__file__)"
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "src/graft_lab/kernels" in out.stdout


def pins() -> dict[str, str]:
    lines = (ROOT / "constraints.txt").read_text().splitlines()
    return {canonicalize_name(n): v for n, v in (ln.split("==") for ln in lines if ln and not ln.startswith("#"))}


def test_constraints_pin_versions_that_pyproject_admits():
    tomllib = pytest.importorskip("tomllib", reason="Python 3.11+")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    reqs += [Requirement(r) for extra in project["optional-dependencies"].values() for r in extra]
    pinned = pins()
    checked = 0
    for req in reqs:
        name = canonicalize_name(req.name)
        if name in pinned:
            checked += 1
            assert req.specifier.contains(pinned[name], prereleases=True), f"{name}=={pinned[name]} vs {req}"
        else:
            assert name in {"torch", "triton", "graft-lab"}, f"{name} is not pinned in constraints.txt"
    assert checked >= 20 and pinned["transformers"].startswith("5.")


def test_the_makefile_installs_with_the_constraints():
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"pip install -q -c constraints\.txt -e '\.\[dev\]'", makefile)
    assert re.search(r"^\$\(STAMP\):.*constraints\.txt", makefile, re.M)
