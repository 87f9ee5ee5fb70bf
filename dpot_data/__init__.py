"""dpot_data: ingest public PDE datasets into training-ready Zarr stores and WebDataset shards."""

__version__ = "0.1.0"
