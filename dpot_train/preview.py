"""Exactly what the model is handed for one stored trajectory: the public way to compare our inputs with others'.

`model_input` reads frames of one trajectory through the same readers and layout rule as training and evaluation
(the manifest's `convention.model_layout`), padded channels included, without noise: (H, W, T, C) float32, or
(X, Y, Z, T, C) for 3D data; `res` resizes it to the grid a run with `--res` trains on. It is normalised as a run
with the same `normalize` setting normalises it (dpot_train.core.normalize: the manifest's train statistics; `auto`
leaves the paper's datasets under dpot-reference as stored), or with `norm_stats` given (a run's recorded statistics). `window`
adds the fluid mask the loss and the evaluation use, (H, W) or (X, Y, Z), cell for cell in the same order.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from dpot_train.core.config import DataConfig, res_value
from dpot_train.data.datasets import DataError
from dpot_train.data.prepare import data_reader, load_datasets, norm_table
from dpot_train.data.windows import resize_window, run_grid, takes_fluid_rule, to_model_layout, to_model_mask
from dpot_train.core.normalize import Stats, normalize_array


def model_input(manifest: str | Path, dataset: str | None = None, split: str = "test", index: int = 0,
                start: int = 0, frames: int | None = None, backend: str = "webdataset", res: Any = 0,
                cache_dir: str | None = None, cache_limit: str | None = None, normalize: str = "auto",
                norm_stats: dict | None = None) -> np.ndarray:
    """`window`'s array: what the model is handed."""
    return window(manifest, dataset, split, index, start, frames, backend, res, cache_dir, cache_limit,
                  normalize, norm_stats)[0]


def window(manifest: str | Path, dataset: str | None = None, split: str = "test", index: int = 0,
           start: int = 0, frames: int | None = None, backend: str = "webdataset", res: Any = 0,
           cache_dir: str | None = None, cache_limit: str | None = None, normalize: str = "auto",
           norm_stats: dict | None = None) -> tuple[np.ndarray, np.ndarray, Stats | None]:
    """Frames [start, start + frames) (default: to the end) of the `index`-th `split` trajectory of `dataset`
    (default: the manifest's only dataset) as the model sees them: (H, W[, D], T, C) float32, resized to `res`
    (as `launch --res` does: N per axis, or "H,W" / (H, W), D,H,W for 3D, in the manifest's axis order),
    normalised per channel as `normalize` (auto, manifest, none) and `norm_stats` say (`data.normalize`,
    `data.norm_stats` of a run); the trajectory's fluid mask as the loss sees it, (H, W[, D]) bool in the same
    orientation (True: fluid), resized by nearest neighbour as the trainer does; and the statistics applied (None:
    as stored)."""
    # any trajectory length: the frame range is checked below, not a training window
    cfg = DataConfig(manifests=[str(manifest)], backend=backend, verify_checksums=False, res=res_value(res, "--res"),
                     t_in=1, t_out=0, cache_dir=cache_dir, cache_limit=cache_limit, normalize=normalize,
                     norm_stats=norm_stats)
    datasets, shard_index = load_datasets(cfg, split, verify=False)
    names = [d.name for d in datasets]
    if dataset is None:
        if len(datasets) != 1:
            raise DataError(f"{manifest}: holds datasets {names}; name one with --dataset")
        ds = datasets[0]
    elif dataset in names:
        ds = datasets[names.index(dataset)]
    else:
        raise DataError(f"{manifest}: no dataset {dataset!r}; it holds {names}")
    reader = data_reader(cfg)
    refs = reader.refs(ds, split, shard_index)
    if not 0 <= index < len(refs):
        raise DataError(f"{ds.name}: --index {index} is outside the {len(refs)} {split!r} trajectories")
    length = ds.frames - start if frames is None else frames
    if start < 0 or length < 1 or start + length > ds.frames:
        raise DataError(f"{ds.name}: frames [{start}, {start + length}) are outside its {ds.frames} frames")
    fields, stored_mask = reader.read(refs[index], start, length)
    stats = norm_table(cfg, [ds])[ds.name]
    x = to_model_layout(normalize_array(fields, stats, axis=1), ds.model_layout)  # stored (T, C, ...): C on axis 1
    mask = to_model_mask(stored_mask, ds.model_layout).astype(bool)
    if cfg.res:
        grid = run_grid(ds.shape, ds.model_layout, cfg.res, ds.dims)
        x, mask = (a[0].numpy() for a in resize_window(torch.from_numpy(x)[None], torch.from_numpy(mask)[None], grid,
                                                      takes_fluid_rule(ds)))
    return x, mask, stats


def save_array(path: str | Path, array: np.ndarray) -> str:
    """Write `array` in .npy format (no pickle) to exactly `path` (numpy would add `.npy` to a bare name), in one
    atomic step, its folder created; returns the path written."""
    import io

    from dpot_format.io import atomic_write

    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return atomic_write(path, buf.getvalue())


def preview_window(manifest: str, out: str, mask_out: str | None, *, res: str = "0", normalize: str = "auto",
                   **where: Any) -> tuple[np.ndarray, np.ndarray, Stats | None]:
    """`dpot-train preview`: the output files checked (--out, --mask-out, not the same file), then `window` of the
    trajectory `where` names (dataset, split, index, start, frames, backend, cache_dir, cache_limit) while the
    output is held for reading. ValueError / FileNotFoundError / ReadersBusy, one line."""
    from dpot_train.run.eval_run import check_out_file
    from dpot_train.run.launch import reading
    from dpot_train.run.launch_request import res_option
    from dpot_train.core.normalize import check_mode

    check_out_file(out, "--out", "x.npy")
    if mask_out is not None:
        check_out_file(mask_out, "--mask-out", "mask.npy")
        if Path(mask_out).absolute() == Path(out).absolute():
            raise ValueError(f"--mask-out {mask_out}: the same file as --out; expected another file")
    with reading([manifest]):  # an ingest --overwrite of this output waits for the read
        return window(manifest, res=res_option(res), normalize=check_mode(normalize, "--normalize"), **where)


def save_preview(out: str, mask_out: str | None, x: np.ndarray, mask: np.ndarray, stats: Stats | None
                 ) -> Iterator[str]:
    """Write the preview's array (and its loss mask), yielding what each file holds as it is written."""
    axes = "(X, Y, Z" if x.ndim == 5 else "(H, W"
    how = "as stored (not normalised)" if stats is None else \
        f"normalised per channel, (x - mean) / std with mean {stats['mean']} and std {stats['std']}"
    yield f"{save_array(out, x)}: {x.dtype} {tuple(x.shape)} {axes}, T, C), {how}"
    if mask_out is not None:
        yield f"{save_array(mask_out, mask)}: loss mask {mask.dtype} {tuple(mask.shape)} {axes}) (True: fluid)"
