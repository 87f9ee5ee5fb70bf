"""What every part of training shares: the run config and its checks (`config.py`), per-channel normalisation
(`normalize.py`), thread counts (`threads.py`), the process group (`distributed.py`), the torchrun process layout
(`topology.py`), relative L2 with masks, the loss and L2RE (`metrics.py`), checkpoint files (`checkpoint.py`) and
the model a run starts from (`model_setup.py`).

May import: model, integrations. It stands above model: checkpoint and model_setup build networks from files.
"""
