"""`dpot-train`: launch, resume and evaluate DPOT training runs; inspect models. Thin over the library."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from dpot_format.cli_help import TidyGroup, add_version_option

app = typer.Typer(
    name="dpot-train",
    help="Train and evaluate DPOT on dpot-data shards (DDP via torchrun), and inspect models and checkpoints.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=TidyGroup,
)
add_version_option(app, "dpot-train")
model_app = typer.Typer(help="Inspect DPOT presets and checkpoints.", no_args_is_help=True)
app.add_typer(model_app, name="model")

from dpot_train.cli_train import CACHE_DIR_HELP, CACHE_LIMIT_HELP, SHA256_HELP, evaluate_cmd, launch_cmd  # noqa: E402

app.command("launch")(launch_cmd)
app.command("evaluate")(evaluate_cmd)


@app.command("preview")
def preview_cmd(
    manifest: str = typer.Option(..., "--manifest", help="Folder holding manifest.json."),
    out: str = typer.Option(..., "--out", help="The file to write the array to, as named (.npy format, no pickle)."),
    mask_out: Optional[str] = typer.Option(None, "--mask-out", help="Also write the fluid mask the loss uses, "
                                           "(H, W) or (X, Y, Z) bool in the same orientation as --out's array "
                                           "(.npy format)."),
    dataset: str = typer.Option(None, "--dataset", help="Dataset name (needed when the manifest holds several)."),
    split: str = typer.Option("test", "--split", help="train, valid or test."),
    index: int = typer.Option(0, "--index", help="Trajectory index within the split, in stored order."),
    start: int = typer.Option(0, "--start", help="First frame."),
    frames: int = typer.Option(None, "--frames", help="Number of frames (default: to the end)."),
    backend: str = typer.Option("webdataset", "--backend", help="webdataset or zarr."),
    res: str = typer.Option("0", "--res", help="Resize to this grid, as `launch --res`: N per axis, or H,W (D,H,W "
                            "for 3D) in the manifest's axis order (0: the stored grid)."),
    cache_dir: Optional[str] = typer.Option(None, "--cache-dir", help=CACHE_DIR_HELP),
    cache_limit: Optional[str] = typer.Option(None, "--cache-limit", help=CACHE_LIMIT_HELP),
    normalize: str = typer.Option("auto", "--normalize", help="Normalise per channel with the manifest's train "
                                  "statistics as `launch --normalize` does: auto (all but the paper's datasets under "
                                  "dpot-reference), manifest or none."),
) -> None:
    """Write exactly what the model is handed for one trajectory: (H, W, T, C) float32 ((X, Y, Z, T, C) for 3D),
    padded channels included, in the manifest's convention (docs/conventions.md), normalised per channel as a run
    with the same --normalize is ((x - mean) / std, the manifest's train statistics); no noise. --mask-out adds the
    loss's fluid mask, cell for cell in the same order."""
    from dpot_format.readers import ReadersBusy
    from dpot_train.cli_train import check_out_file, res_option
    from dpot_train.launch import reading
    from dpot_train.normalize import check_mode
    from dpot_train.preview import save_array, window

    try:
        check_out_file(out, "--out", "x.npy")
        if mask_out is not None:
            check_out_file(mask_out, "--mask-out", "mask.npy")
            if Path(mask_out).absolute() == Path(out).absolute():
                raise ValueError(f"--mask-out {mask_out}: the same file as --out; expected another file")
        with reading([manifest]):  # an ingest --overwrite of this output waits for the read
            x, mask, stats = window(manifest, dataset, split, index, start, frames, backend, res_option(res), cache_dir,
                                    cache_limit, check_mode(normalize, "--normalize"))
    except (FileNotFoundError, ValueError, ReadersBusy) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from exc
    axes = "(X, Y, Z" if x.ndim == 5 else "(H, W"
    how = "as stored (not normalised)" if stats is None else \
        f"normalised per channel, (x - mean) / std with mean {stats['mean']} and std {stats['std']}"
    typer.echo(f"{save_array(out, x)}: {x.dtype} {tuple(x.shape)} {axes}, T, C), {how}")
    if mask_out is not None:
        typer.echo(f"{save_array(mask_out, mask)}: loss mask {mask.dtype} {tuple(mask.shape)} {axes}) "
                   "(True: fluid)")


@app.command("report")
def report_cmd(
    evals: list[Path] = typer.Argument(..., help="eval.json files of `evaluate` or of finished runs (one per run)."),
    out: Path = typer.Option(..., "--out", help="report.md (Markdown) or report.html (HTML, pictures embedded)."),
    paper: bool = typer.Option(False, "--paper", help="Set the DPOT paper's published tables beside the runs "
                               "(dpot_train/paper/dpot_icml2024.yaml: Table 1 with each run's ratio to each row and "
                               "its sign, the checkpoint sizes), each with its source."),
) -> None:
    """One table of datasets x runs (the model's rollout L2RE), persistence, the horizon columns, and with --paper
    the paper's figures; prints the Markdown form and writes --out (a picture not embedded: one line each on
    stderr)."""
    from dpot_train.report import write_report

    try:
        path, text = write_report(list(evals), out, paper=paper, warn=lambda line: typer.echo(line, err=True))
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from exc
    typer.echo(text)
    typer.echo(f"wrote {path}")


@model_app.command("info")
def model_info_cmd(
    target: str = typer.Argument(..., help="Preset name (tiny, Ti, S, M, L, H, fno, fno-m, unet, ...), "
                                 "checkpoint path, or Hub reference (dpot:Ti|S|M|L|H, "
                                 "hf://OWNER/REPO/FILE[@REVISION])."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of a summary."),
    trust: bool = typer.Option(False, "--trust", help="Allow arbitrary pickled objects in the checkpoint (unsafe)."),
    sha256: Optional[str] = typer.Option(None, "--sha256", help=SHA256_HELP),
) -> None:
    """Parameters, config and weight memory (fp32/bf16) of a preset or checkpoint."""
    import json

    from dpot_train.checkpoint import check_sha256_option
    from dpot_train.model_info import format_info, model_info

    try:
        info = model_info(target, trusted=trust, sha256=check_sha256_option(sha256))
    except (FileNotFoundError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from exc
    typer.echo(json.dumps(info, indent=1) if as_json else format_info(info))


@model_app.command("export")
def model_export_cmd(
    checkpoint: str = typer.Argument(..., help="A checkpoint of a run (RUN_DIR/checkpoints/step-*.pt), or "
                                    "one on the Hugging Face Hub (hf://OWNER/REPO/FILE[@REVISION])."),
    out: Path = typer.Option(..., "--out", help="Where to write the weights (.pth, or .safetensors)."),
    fmt: Optional[str] = typer.Option(None, "--format", help="pth (a torch file) or safetensors (tensors and "
                                      "metadata only: loads without code execution); default: from --out's suffix "
                                      "(.safetensors, else pth)."),
) -> None:
    """Write a run checkpoint's weights in the released DPOT format, a bare {'model': state_dict}: what the
    reference implementation loads, and what --init and evaluate treat as released weights (the reference recipe).
    With --format safetensors (or an --out ending .safetensors) the same tensors and entries go into a safetensors
    file, which every command that reads weights also reads."""
    from dpot_train.checkpoint import CheckpointWriteError, export_format, export_released, record_path
    from dpot_train.model.family_config import grid_text

    try:
        kind = export_format(out, fmt)
        config = export_released(checkpoint, out, kind)
    except (FileNotFoundError, ValueError, CheckpointWriteError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from exc
    layout = "safetensors: the tensors, recipe and normalisation" if kind == "safetensors" else \
        "{'model': state_dict}, the released format"
    typer.echo(f"wrote {out}: {config.in_channels} channels, {grid_text(config.grid)}, "
               f"{config.in_timesteps} input frames ({layout}); its sha256 in {record_path(out).name} (publish it: "
               "`--sha256` checks a copy)")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
