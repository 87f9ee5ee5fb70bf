"""`dpot-train preview`: write exactly what the model is handed for one trajectory (dpot_train.preview)."""

from typing import Annotated, Optional

import typer

from dpot_train.cli.options import CacheDir, CacheLimit


def preview_cmd(
    manifest: Annotated[str, typer.Option("--manifest", help="Folder holding manifest.json.")],
    out: Annotated[str, typer.Option("--out", help="The file to write the array to, as named (.npy format, no "
                                     "pickle).")],
    mask_out: Annotated[Optional[str], typer.Option(
        "--mask-out", help="Also write the fluid mask the loss uses, (H, W) or (X, Y, Z) bool in the same orientation "
        "as --out's array (.npy format).")] = None,
    dataset: Annotated[str, typer.Option("--dataset", help="Dataset name (needed when the manifest holds "
                                         "several).")] = None,
    split: Annotated[str, typer.Option("--split", help="train, valid or test.")] = "test",
    index: Annotated[int, typer.Option("--index", help="Trajectory index within the split, in stored order.")] = 0,
    start: Annotated[int, typer.Option("--start", help="First frame.")] = 0,
    frames: Annotated[int, typer.Option("--frames", help="Number of frames (default: to the end).")] = None,
    backend: Annotated[str, typer.Option("--backend", help="webdataset or zarr.")] = "webdataset",
    res: Annotated[str, typer.Option("--res", help="Resize to this grid, as `launch --res`: N per axis, or H,W "
                                     "(D,H,W for 3D) in the manifest's axis order (0: the stored grid).")] = "0",
    cache_dir: CacheDir = None,
    cache_limit: CacheLimit = None,
    normalize: Annotated[str, typer.Option(
        "--normalize", help="Normalise per channel with the manifest's train statistics as `launch --normalize` "
        "does: auto (all but the paper's datasets under dpot-reference), manifest or none.")] = "auto",
) -> None:
    """Write exactly what the model is handed for one trajectory: (H, W, T, C) float32 ((X, Y, Z, T, C) for 3D),
    padded channels included, in the manifest's convention (docs/conventions.md), normalised per channel as a run
    with the same --normalize is ((x - mean) / std, the manifest's train statistics); no noise. --mask-out adds the
    loss's fluid mask, cell for cell in the same order."""
    from dpot_format.readers import ReadersBusy
    from dpot_train.preview import preview_window, save_preview

    try:
        x, mask, stats = preview_window(manifest, out, mask_out, res=res, normalize=normalize, dataset=dataset,
                                        split=split, index=index, start=start, frames=frames, backend=backend,
                                        cache_dir=cache_dir, cache_limit=cache_limit)
    except (FileNotFoundError, ValueError, ReadersBusy) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from exc
    for line in save_preview(out, mask_out, x, mask, stats):
        typer.echo(line)
