"""`dpot-train evaluate`: score a checkpoint on manifests' data into eval.json (dpot_train.run.eval_run)."""

from pathlib import Path
from typing import Annotated, Optional

import typer

from dpot_train.cli.options import CacheDir, CacheLimit, Sha256, Trust, fail


def evaluate_cmd(
    checkpoint: Annotated[str, typer.Argument(help="Checkpoint (ours, or the released {'model': state_dict} "
                                              "format): a file, dpot:Ti|S|M|L|H or hf://OWNER/REPO/FILE[@REVISION] "
                                              "(read through huggingface_hub's cache).")],
    manifest: Annotated[list[str], typer.Option("--manifest", help="Folder holding manifest.json (repeat for "
                                                "several).")],
    out: Annotated[str, typer.Option("--out", help="The file to write the results to (eval.json; a folder is "
                                     "refused).")],
    rollout_steps: Annotated[int, typer.Option("--rollout-steps", help="Frames to roll out (0: to the trajectory "
                                               "end).")] = 0,
    split: Annotated[str, typer.Option("--split")] = "test",
    backend: Annotated[str, typer.Option("--backend")] = "webdataset",
    device: Annotated[str, typer.Option("--device")] = "auto",
    max_trajectories: Annotated[int, typer.Option("--max-trajectories", help="Per dataset (0: all).")] = 0,
    no_verify_checksums: Annotated[bool, typer.Option("--no-verify-checksums")] = False,
    trust: Trust = False,
    sha256: Sha256 = None,
    recipe: Annotated[Optional[str], typer.Option(
        "--recipe", help="reference (the reference DPOT evaluation) or dpot (valid channels, fluid cells); default: "
        "the recipe the weights were trained with, as their file records it (a checkpoint, or a model export); "
        "released weights that record none: reference.")] = None,
    normalize: Annotated[Optional[str], typer.Option(
        "--normalize", help="auto, manifest or none: normalise with the manifests' train statistics (default: as the "
        "weights were trained, with the statistics their run recorded; released weights: none).")] = None,
    allow_convention_mismatch: Annotated[bool, typer.Option(
        "--allow-convention-mismatch", help="Evaluate released weights on shards of another convention.")] = False,
    res: Annotated[Optional[str], typer.Option(
        "--res", help="Resize trajectories to this grid: N per axis, or H,W (D,H,W for 3D) in the manifest's axis "
        "order (default: the run's --res; a 3D DPOT model's own grid).")] = None,
    cache_dir: CacheDir = None,
    cache_limit: CacheLimit = None,
    predictions: Annotated[Optional[Path], typer.Option(
        "--predictions", help="Also write the model's rollouts, truth and mask as a Zarr store here "
        "(xarray.open_zarr(PATH, group=DATASET)); dpot recipe.")] = None,
    plot: Annotated[Optional[Path], typer.Option(
        "--plot", help="Write pictures per dataset to this folder: truth / prediction / error at the first, middle "
        "and last step, error per step, power spectra (dpot recipe).")] = None,
    video: Annotated[bool, typer.Option("--video", help="With --plot: also one rollout as a GIF.")] = False,
    ensemble: Annotated[int, typer.Option(
        "--ensemble", help="Also roll out N members (the model's noise injection on the inputs, seeded; checkpoints "
        "of --ensemble-checkpoints in turn) and score their CRPS and spread-skill ratio per channel and step, and "
        "their mean (dpot recipe).")] = 0,
    ensemble_noise: Annotated[Optional[float], typer.Option(
        "--ensemble-noise", help="The members' noise epsilon S (x + S ||x|| N(0,1)); default: the run's data.noise.")
    ] = None,
    ensemble_checkpoints: Annotated[Optional[str], typer.Option(
        "--ensemble-checkpoints", help="Comma list of further checkpoints of the same model: members roll them out "
        "in turn (default --ensemble: one member per checkpoint).")] = None,
) -> None:
    """Rollout and one-step (or in-rollout step) L2RE per dataset, for the model and the persistence baseline, with
    per-step L2RE and The Well's NRMSE / VRMSE / spectral MSE per channel; writes eval.json."""
    from dpot_train.run.eval_run import EvalFiles, evaluate_to_files, summary_lines
    from dpot_train.evaluation.evaluate import print_table

    files = EvalFiles(out, predictions=predictions, plot=plot, video=video)
    try:
        result = evaluate_to_files(checkpoint, manifest, files, res=res, sha256=sha256,
                                   ensemble_checkpoints=ensemble_checkpoints, rollout_steps=rollout_steps,
                                   split=split, backend=backend, device=device, max_trajectories=max_trajectories,
                                   verify_checksums=not no_verify_checksums, trusted=trust, recipe=recipe,
                                   allow_convention_mismatch=allow_convention_mismatch, cache_dir=cache_dir,
                                   cache_limit=cache_limit, normalize=normalize, ensemble=ensemble,
                                   ensemble_noise=ensemble_noise)
    except Exception as exc:  # noqa: BLE001 - every problem becomes one error line per line and exit code 2
        fail(exc)
    print_table(result)
    for line in summary_lines(result, files, split):
        typer.echo(line)
