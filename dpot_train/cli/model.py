"""`dpot-train model info|export`: inspect DPOT presets and checkpoints (dpot_train.model_info, checkpoint)."""

from pathlib import Path
from typing import Annotated, Optional

import typer

from dpot_train.cli.options import Sha256, Trust

app = typer.Typer(help="Inspect DPOT presets and checkpoints.", no_args_is_help=True)


@app.command("info")
def model_info_cmd(
    target: Annotated[str, typer.Argument(help="Preset name (tiny, Ti, S, M, L, H, fno, fno-m, unet, ...), "
                                          "checkpoint path, or Hub reference (dpot:Ti|S|M|L|H, "
                                          "hf://OWNER/REPO/FILE[@REVISION]).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a summary.")] = False,
    trust: Trust = False,
    sha256: Sha256 = None,
) -> None:
    """Parameters, config and weight memory (fp32/bf16) of a preset or checkpoint."""
    from dpot_train.model_info import model_info_text

    try:
        text = model_info_text(target, trusted=trust, sha256=sha256, as_json=as_json)
    except (FileNotFoundError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from exc
    typer.echo(text)


@app.command("export")
def model_export_cmd(
    checkpoint: Annotated[str, typer.Argument(help="A checkpoint of a run (RUN_DIR/checkpoints/step-*.pt), or one "
                                              "on the Hugging Face Hub (hf://OWNER/REPO/FILE[@REVISION]).")],
    out: Annotated[Path, typer.Option("--out", help="Where to write the weights (.pth, or .safetensors).")],
    fmt: Annotated[Optional[str], typer.Option(
        "--format", help="pth (a torch file) or safetensors (tensors and metadata only: loads without code "
        "execution); default: from --out's suffix (.safetensors, else pth).")] = None,
) -> None:
    """Write a run checkpoint's weights in the released DPOT format, a bare {'model': state_dict}: what the
    reference implementation loads, and what --init and evaluate treat as released weights (the reference recipe).
    With --format safetensors (or an --out ending .safetensors) the same tensors and entries go into a safetensors
    file, which every command that reads weights also reads."""
    from dpot_train.core.checkpoint import CheckpointWriteError, export_weights

    try:
        line = export_weights(checkpoint, out, fmt)
    except (FileNotFoundError, ValueError, CheckpointWriteError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from exc
    typer.echo(line)
