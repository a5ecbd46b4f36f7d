"""Offline EAGLE-3 drafter training: ShareGPT data, target features, draft vocabulary, batched TTT.

`python -m graft_lab.train --help` is the entry point; `train.loop.train` does the work.
"""
