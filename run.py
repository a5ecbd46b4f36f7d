"""Entry point: `python run.py model=... drafter=... pruner=... retriever=... graft=... tree.total_tokens=...`.

Composes the Hydra config under conf/, validates it before any model loads, decodes the dataset with
the chosen method and the interleaved AR baseline, and writes answers.jsonl and summary.json.
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from graft_lab.config import validate
from graft_lab.errors import GraftLabError
from graft_lab.provenance import metadata
from graft_lab.report import print_summary
from graft_lab.runner import run


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    try:
        run_cfg, _ = validate(cfg)
        out_dir = Path(run_cfg.output_dir or HydraConfig.get().runtime.output_dir)
        nodes = {g: cfg[g] for g in ("drafter", "pruner", "retriever", "graft", "dataset")}
        summary = run(run_cfg, nodes, out_dir, metadata(cfg))
    except GraftLabError as exc:
        print(f"graft-lab: error: {exc}", file=sys.stderr)
        sys.exit(2)
    print_summary(summary, out_dir)


if __name__ == "__main__":
    main()
