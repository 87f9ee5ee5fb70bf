"""Writers of small raw files in the exact published layout of each source, filled with real solutions.

One module per source (`dpot_data.synth.fno`, ...); each exposes a `synth_<source>(out_dir, ...) -> list[Path]`.
"""
