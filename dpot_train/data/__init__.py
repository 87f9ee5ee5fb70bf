"""The training data stream: shards and Zarr stores read as windows (`datasets.py`, `readers.py`, `windows.py`,
`stream.py`, `seeded.py`), mixtures (`mixture.py`), loader workers (`loader.py`, `prefetch.py`, `process_ring.py`),
the node's shard cache and ranged downloads from object storage (`cache.py`, `cached_reader.py`, `remote_fetch.py`),
sha256 passes and the record of verified shards (`hash_pool.py`, `verified.py`) and what launch prepares once
(`prepare.py`).

May import: core, model, integrations.
"""
