"""`dpot-train report`: one table of datasets x runs from eval.json files (dpot_train.evaluation.report)."""

from pathlib import Path
from typing import Annotated

import typer


def report_cmd(
    evals: Annotated[list[Path], typer.Argument(help="eval.json files of `evaluate` or of finished runs (one per "
                                                "run).")],
    out: Annotated[Path, typer.Option("--out", help="report.md (Markdown) or report.html (HTML, pictures "
                                      "embedded).")],
    paper: Annotated[bool, typer.Option(
        "--paper", help="Set the DPOT paper's published tables beside the runs "
                        "(dpot_train/evaluation/paper/dpot_icml2024.yaml: "
        "Table 1 with each run's ratio to each row and its sign, the checkpoint sizes), each with its "
        "source.")] = False,
) -> None:
    """One table of datasets x runs (the model's rollout L2RE), persistence, the horizon columns, and with --paper
    the paper's figures; prints the Markdown form and writes --out (a picture not embedded: one line each on
    stderr)."""
    from dpot_train.evaluation.report import write_report

    try:
        path, text = write_report(list(evals), out, paper=paper, warn=lambda line: typer.echo(line, err=True))
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from exc
    typer.echo(text)
    typer.echo(f"wrote {path}")
