"""Services outside dpot: Hugging Face Hub names (`hub.py`: `hf://` and `dpot:`) and the metric trackers
(`trackers.py`: MLflow, Weights & Biases).

May import: none. Third-party clients are imported only where used.
"""
