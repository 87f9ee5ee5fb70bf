"""dpot_train: the DPOT model and a resumable DDP trainer that streams dpot_data shards."""

__version__ = "0.1.0"
