"""The option declarations several `dpot-train` commands share (typing.Annotated aliases, their help texts),
and the one-line errors."""

from typing import Annotated, NoReturn, Optional

import typer

CACHE_DIR_HELP = ("Node-local folder caching shards read from object storage (s3://, gs://, ...), shared by every "
                  "rank and worker; default $DPOT_CACHE_DIR, else RUN_DIR/shard-cache (~/.cache/dpot/shards without "
                  "a run).")
SHA256_HELP = ("sha256 of the checkpoint file (64 hex digits, as published with released weights): it is checked "
               "before the file is loaded; our checkpoints also carry a .sha256 record beside them.")
VERIFY_HELP = ("sha256 of local shards and Zarr arrays before torchrun: auto (default) hashes only those the record "
               "of verified shards (.dpot-verified.json beside the data, or in the cache folder) does not vouch for, "
               "always hashes every one, never none (sizes are still checked).")
CACHE_LIMIT_HELP = "Size bound of the shard cache, least recently used shards evicted (e.g. 200GiB; default 100GiB)."
TRACKER_HELP = ("Mirror metrics.jsonl and eval.json's scalars to Weights & Biases or MLflow from rank 0 (repeat, or "
                "a comma list; none: off; a --resume continues the same tracker run); needs "
                'pip install "dpot\\[track]". Default: none.')  # \\[: rich markup would drop "[track]"
TRACKER_PROJECT_HELP = ("W&B project / MLflow experiment of the tracker run, which is named after RUN_DIR. Default: "
                        "$WANDB_PROJECT or $MLFLOW_EXPERIMENT_NAME when set, else dpot.")

CacheDir = Annotated[Optional[str], typer.Option("--cache-dir", help=CACHE_DIR_HELP)]
CacheLimit = Annotated[Optional[str], typer.Option("--cache-limit", help=CACHE_LIMIT_HELP)]
Sha256 = Annotated[Optional[str], typer.Option("--sha256", help=SHA256_HELP)]
Trust = Annotated[bool, typer.Option("--trust", help="Allow arbitrary pickled objects in the checkpoint (unsafe).")]


def fail(exc: Exception) -> NoReturn:
    """Exit code 2 with one `error:` line per line of the message (a data check may find several problems)."""
    for line in str(exc).splitlines() or [type(exc).__name__]:
        typer.echo(f"error: {line}", err=True)
    raise typer.Exit(code=2) from exc
