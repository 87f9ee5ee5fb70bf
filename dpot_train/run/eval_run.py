"""One evaluation into files, as `dpot-train evaluate` runs it: every output checked before any work, the checkpoint
scored (dpot_train.evaluation.evaluate), the optional predictions store and pictures written, then eval.json."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional


@dataclass(frozen=True)
class EvalFiles:
    """Where an evaluation writes: eval.json (`out`), the predictions store and the pictures' folder (optional)."""

    out: str
    predictions: Optional[Path] = None
    plot: Optional[Path] = None
    video: bool = False


def check_out_file(path: str, option: str = "--out", example: str = "eval.json") -> None:
    """A file path the command can write (dpot_format.output.check_file: not a folder, a link or a special file,
    not inside an ingest output or a run's data, its parent a folder). Checked before any work, so a long
    evaluation never ends in a failed write; OutputError (a ValueError), one line."""
    from dpot_format.output import check_file

    check_file(path, option, example)


def comma_list(value: str | None, option: str) -> list[str]:
    """The items of a comma list option (none: []); ValueError (one line) for an empty item."""
    if value is None:
        return []
    items = [v.strip() for v in value.split(",")]
    if not all(items):
        raise ValueError(f"{option} {value}: expected a comma list of checkpoint files, without empty items")
    return items


def _check_options(files: EvalFiles, ensemble: int, ensemble_noise: float | None,
                   ensemble_checkpoints: str | None) -> None:
    """What the options alone refute, before any work: --video without --plot, a noise without members, a plot
    folder that cannot be one."""
    if files.video and files.plot is None:
        raise ValueError("--video: name the folder for it with --plot DIR")
    if (ensemble_noise is not None) and not ensemble and not ensemble_checkpoints:
        raise ValueError("--ensemble-noise: give the member count with --ensemble N")
    if files.plot is not None:
        from dpot_train.evaluation.plots import check_plot_folder

        check_plot_folder(files.plot)


def evaluate_to_files(checkpoint: str, manifests: list[str], files: EvalFiles, *, res: str | None = None,
                      sha256: str | None = None, ensemble_checkpoints: str | None = None,
                      **options: Any) -> dict[str, Any]:
    """Evaluate `checkpoint` on the manifests' data and write eval.json (and the predictions store and pictures
    `files` names); `options`: evaluate_checkpoint's. Returns the result; any problem raises, in one line each."""
    from dpot_train.core.checkpoint import check_sha256_option
    from dpot_train.evaluation.predictions import PredictionWriter
    from dpot_train.evaluation.evaluate import evaluate_checkpoint, write_eval
    from dpot_train.run.launch import reading
    from dpot_train.run.launch_request import res_option

    scratch = sink = None
    try:
        check_out_file(files.out)  # every output is checked before the evaluation, not after it
        grid = res_option(res)
        _check_options(files, options.get("ensemble", 0), options.get("ensemble_noise"), ensemble_checkpoints)
        sink = PredictionWriter(files.predictions) if files.predictions is not None else None
        if files.plot is not None:
            files.plot.mkdir(parents=True, exist_ok=True)
        if files.plot is not None and sink is None:  # a scratch store for the pictures, a name a later run sweeps
            from dpot_train.evaluation.plots import SCRATCH_STEM

            scratch = tempfile.TemporaryDirectory(prefix=f".{SCRATCH_STEM}.tmp-{os.getpid()}-", dir=files.plot)
            sink = PredictionWriter(Path(scratch.name) / "predictions.zarr")
        if sink is not None and options.get("recipe") == "reference":
            raise ValueError("--predictions/--plot: the reference recipe writes no predictions; use --recipe dpot")
        with reading(manifests):  # an ingest --overwrite of these outputs waits for the evaluation
            result = evaluate_checkpoint(checkpoint, [str(m) for m in manifests], res=grid,
                                         sha256=check_sha256_option(sha256), sink=sink,
                                         ensemble_checkpoints=comma_list(ensemble_checkpoints,
                                                                         "--ensemble-checkpoints"), **options)
        _write_extras(result, sink, files)
    except Exception:
        if sink is not None:
            sink.abort()
        raise
    finally:
        if scratch is not None:
            scratch.cleanup()
    write_eval(result, files.out)  # a full disk: one line naming the file
    return result


def _write_extras(result: dict[str, Any], sink: Any, files: EvalFiles) -> None:
    """The predictions store published (its path in `result` when asked for) and the pictures drawn from it."""
    if sink is None:
        return
    if result["recipe"] == "reference":
        raise ValueError("--predictions/--plot: the reference recipe (released weights) writes no predictions; "
                         "add --recipe dpot")
    published = sink.close()
    if files.predictions is not None:
        result["predictions"] = str(published)
    if files.plot is not None:
        from dpot_train.evaluation.plots import write_plots

        result["plots"] = [str(p.resolve()) for p in write_plots(published, result, files.plot, video=files.video)]


def summary_lines(result: dict[str, Any], files: EvalFiles, split: str) -> list[str]:
    """What `evaluate` says after its table: the files written and what they hold."""
    normalised = sorted(k for k, v in result["normalization"]["stats"].items() if v is not None)
    lines = [f"wrote {files.out}: L2RE per dataset, model vs the persistence baseline "
             f"({result['recipe']} recipe, {split} split; normalised: {', '.join(normalised) or 'none'})"]
    if "predictions" in result:
        lines.append(f"wrote {result['predictions']}: prediction, truth and mask per dataset "
                     "(xarray.open_zarr(PATH, group=DATASET))")
    if "plots" in result:
        lines.append(f"wrote {len(result['plots'])} pictures to {files.plot}: "
                     f"{', '.join(Path(p).name for p in result['plots'])}")
    return lines
