"""Evaluating checkpoints and reporting on them: `dpot-train evaluate` (`evaluate.py`), the metrics beyond the two
scalars (`metrics.py`), the streamed rollout sums (`stream.py`), stored predictions (`predictions.py`), pictures
(`plots.py`), the noisy-member ensembles (`ensemble.py`) and `dpot-train report` (`report.py`, with the paper's
tables in `paper/`).

May import: data, core, model, integrations.
"""
