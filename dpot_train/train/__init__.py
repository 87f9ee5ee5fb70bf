"""The training loop and what it needs around it: the loop and `train_step` (`trainer.py`), what a run records
(`log.py`), fine-tuning (`finetune.py`), validation during training (`validation.py`), the learning-rate schedule
(`schedule.py`), the run's plan that launch writes and workers read (`run_plan.py`) and the time to first step
(`startup.py`: launch notes its parts, the loop's rank 0 prints it, so it stands here, below run).

May import: evaluation, data, core, model, integrations.
"""
