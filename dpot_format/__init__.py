"""dpot_format: the shard contract of docs/format.md (names, limits, manifest, tar and .npy readers, validator),
owned in one place and imported by both the writer (dpot_data) and the reader (dpot_train)."""

__version__ = "0.1.0"
