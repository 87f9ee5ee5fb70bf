"""Starting and running training: `dpot-train launch` (every check before a run, RUN_DIR, the exec into torchrun:
`launch.py`), the torchrun wrapper (`torchrun.py`), the process each rank runs (`worker.py`) and each node's launch
under Slurm (`slurm.py`).

May import: train, evaluation, data, core, model, integrations. Never the top level (cli, api, preview,
model_info), which imports it.
"""
