"""`dpot-train`: launch, resume and evaluate DPOT training runs; inspect models. Assembled from one module per
command group (launch, evaluate, preview, report, model); shared options in options.py. Thin over the library."""

from dpot_train.cli import model
from dpot_train.cli.evaluate import evaluate_cmd
from dpot_train.cli.launch import launch_cmd
from dpot_train.cli.preview import preview_cmd
from dpot_train.cli.report import report_cmd
from dpot_format.cli_help import root_app

app = root_app("dpot-train", "Train and evaluate DPOT on dpot-data shards (DDP via torchrun), and inspect models and "
               "checkpoints.")
app.add_typer(model.app, name="model")
app.command("launch")(launch_cmd)
app.command("evaluate")(evaluate_cmd)
app.command("preview")(preview_cmd)
app.command("report")(report_cmd)


def main() -> None:
    """The `dpot-train` console script."""
    app()
