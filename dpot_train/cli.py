"""`dpot-train`: launch, resume and evaluate DPOT training runs; inspect models. Thin over the library."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="dpot-train",
    help="Train and evaluate DPOT on dpot-data shards (DDP via torchrun), and inspect models and checkpoints.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
model_app = typer.Typer(help="Inspect DPOT presets and checkpoints.", no_args_is_help=True)
app.add_typer(model_app, name="model")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
