"""The `launch` and `evaluate` commands of `dpot-train` (registered in cli.py); thin over launch.py / evaluate.py."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Optional

import typer

from dpot_train.config import TrainConfig, apply_overrides, find_config, load_config


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


def _fail(exc: Exception) -> None:
    """Exit code 2 with one `error:` line per line of the message (a data check may find several problems)."""
    for line in str(exc).splitlines() or [type(exc).__name__]:
        typer.echo(f"error: {line}", err=True)
    raise typer.Exit(code=2) from exc


def check_out_file(path: str, option: str = "--out", example: str = "eval.json") -> None:
    """A file path the command can write (dpot_format.output.check_file: not a folder, a link or a special file,
    not inside an ingest output or a run's data, its parent a folder). Checked before any work, so a long
    evaluation never ends in a failed write; OutputError (a ValueError), one line."""
    from dpot_format.output import check_file

    check_file(path, option, example)


def _default(key: str, text: str = "") -> str:
    """A launch option's help with its default: the run config's value (a --config file or a resumed run's wins)."""
    value: object = TrainConfig().to_dict()
    for part in key.split("."):
        value = value[part]  # type: ignore[index]
    from rich.markup import escape

    return f"{text}  " + escape(f"[default: {value}]")  # escaped: --help renders rich markup


def _base_config(config: Path | None, out: str | None, resume: bool) -> tuple[TrainConfig, Path | None]:
    """The run config the options apply to and the file it came from: --config, else on --resume the run's own
    config.yaml, else the defaults (no file)."""
    source = find_config(config) if config is not None else Path(out) / "config.yaml" if resume and out else None
    if source is not None and (config is not None or source.exists()):
        return load_config(source), source
    return TrainConfig(), None


def launch_cmd(
    manifest: list[str] = typer.Option([], "--manifest", help="Folder holding manifest.json (repeat for several)."),
    out: Optional[str] = typer.Option(None, "--out", help="RUN_DIR: config.yaml, checkpoints/, eval.json, logs."),
    config: Optional[str] = typer.Option(None, "--config", help="YAML run config: a file, or a shipped one by name "
                                         "(pretrain-ti, demo, ...); the options below override it, and it (or a "
                                         "resumed run's config.yaml) overrides their defaults."),
    mixture: Optional[str] = typer.Option(None, "--mixture",
                                          help="Mixture YAML (dataset -> weight), a packaged mixture by name "
                                               "(dpot-pretrain-ti), or inline 'a=1,b=2'."),
    mixture_partial: bool = typer.Option(False, "--mixture-partial",
                                         help="Train on the mixture's datasets that the manifests hold, shares "
                                              "renormalised over them (default: a missing one is an error)."),
    model: Optional[str] = typer.Option(None, "--model",
                                        help=_default("model", "Model preset: DPOT's tiny, Ti, S, M, L, H; the "
                                                      "baselines fno, fno-m, unet.")),
    init: Optional[str] = typer.Option(None, "--init", help="Checkpoint to fine-tune from (released or ours): a file, "
                                        "dpot:Ti|S|M|L|H (the released weights, from the Hugging Face Hub) or "
                                        "hf://OWNER/REPO/FILE[@REVISION]; a Hub file is recorded pinned to its "
                                        "commit."),
    load: Optional[str] = typer.Option(None, "--load", help="Components of --init to load: all (default) or a "
                                       "comma-separated list of patch_embed, pos, blocks, time_agg, cls_head, "
                                       "scale_feats, out; the rest starts fresh (a 2D checkpoint on 3D data: "
                                       "blocks,time_agg). DPOT only: an FNO or UNet checkpoint loads whole."),
    res: Optional[str] = typer.Option(None, "--res", help="Resize every window to this grid for this run: N per "
                                      "axis, or H,W (D,H,W for 3D) in the manifest's axis order (trilinear 3D, "
                                      "bilinear 2D; 0: the stored grid)."),
    epochs: Optional[float] = typer.Option(None, "--epochs", help="Train this many epochs: steps from the "
                                           "dataset size and --batch-size (overrides --steps)."),
    trust: bool = typer.Option(False, "--trust", help="Allow arbitrary pickled objects in the --init checkpoint "
                               "(unsafe; only for files you trust)."),
    sha256: Optional[str] = typer.Option(None, "--sha256", help=SHA256_HELP),
    steps: Optional[int] = typer.Option(None, "--steps", help=_default("steps", "Total optimiser steps.")),
    batch_size: Optional[int] = typer.Option(None, "--batch-size",
                                             help=_default("batch_size", "Global batch (split over processes).")),
    lr: Optional[float] = typer.Option(None, "--lr",
                                       help=_default("optim.lr", "Peak learning rate of the one-cycle schedule.")),
    noise: Optional[float] = typer.Option(None, "--noise",
                                          help=_default("data.noise", "Noise epsilon (x + eps*||x||*N(0,1)).")),
    clip_grad: Optional[float] = typer.Option(None, "--clip-grad",
                                              help=_default("optim.clip_grad", "Max gradient norm (0: no clipping).")),
    seed: Optional[int] = typer.Option(None, "--seed", help=_default("seed", "Seed of the model and data stream.")),
    backend: Optional[str] = typer.Option(None, "--backend",
                                          help=_default("data.backend", "webdataset or zarr.")),
    num_workers: Optional[int] = typer.Option(None, "--num-workers",
                                              help=_default("data.num_workers",
                                                            "Loader workers per process (0: none).")),
    worker_kind: Optional[str] = typer.Option(None, "--worker-kind",
                                              help=_default("data.worker_kind", "Loader workers: thread or process.")),
    ckpt_every: Optional[int] = typer.Option(None, "--ckpt-every",
                                             help=_default("ckpt_every", "Checkpoint every N steps.")),
    log_every: Optional[int] = typer.Option(None, "--log-every", help=_default("log_every", "Log every N steps.")),
    eval_every: Optional[int] = typer.Option(None, "--eval-every",
                                             help=_default("eval_every", "Score the validation split every N steps "
                                                           "and keep the best weights as checkpoints/best.pt, which "
                                                           "the final evaluation then scores (0: off).")),
    loss: Optional[str] = typer.Option(None, "--loss", help=_default("loss", "valid or all (the reference's loss).")),
    recipe: Optional[str] = typer.Option(None, "--recipe", help="dpot (loss and noise over valid channels and fluid "
                                         "cells) or reference (the reference DPOT's loss, noise and evaluation); "
                                         "default: reference when --init names released weights, else dpot."),
    allow_convention_mismatch: bool = typer.Option(False, "--allow-convention-mismatch",
                                                   help="Fine-tune released weights on shards of another convention."),
    normalize: Optional[str] = typer.Option(None, "--normalize", help=_default(
        "data.normalize", "Per-channel normalisation from the manifests' train statistics: auto (every dataset but "
        "the paper's under dpot-reference), manifest (every dataset) or none; recorded with the checkpoints.")),
    device: Optional[str] = typer.Option(None, "--device", help=_default("device", "auto, cpu or cuda.")),
    rollout_steps: Optional[int] = typer.Option(None, "--rollout-steps",
                                                help=_default("rollout_steps", "Rollout length of the final evaluation "
                                                              "(0: to the end of each trajectory).")),
    deterministic: bool = typer.Option(False, "--deterministic",
                                       help="Deterministic CUDA kernels: a GPU run and its resume repeat bitwise."),
    audit: bool = typer.Option(False, "--audit", help="Write the trajectory ids each rank consumed."),
    no_progress: bool = typer.Option(False, "--no-progress", help="No progress bar."),
    no_eval: bool = typer.Option(False, "--no-eval", help="Skip the evaluation at the end (RUN_DIR/eval.json)."),
    no_verify_checksums: bool = typer.Option(False, "--no-verify-checksums",
                                             help="Skip sha256 of shards (sizes are still checked); the same as "
                                                  "--verify-checksums never."),
    verify_checksums: Optional[str] = typer.Option(None, "--verify-checksums", metavar="auto|always|never",
                                                   help=VERIFY_HELP),
    nproc_per_node: Optional[int] = typer.Option(
        None, "--nproc-per-node",
        help="Processes per node (GPUs, or CPU processes). Default 1; a --resume reuses the run's layout."),
    nnodes: Optional[int] = typer.Option(None, "--nnodes", help="Nodes. Default 1; a --resume reuses the run's layout."),
    node_rank: int = typer.Option(0, "--node-rank"),
    rdzv_endpoint: Optional[str] = typer.Option(None, "--rdzv-endpoint", help="HOST:PORT for multi-node."),
    rdzv_timeout: int = typer.Option(600, "--rdzv-timeout", help="Seconds a node waits for the others to join."),
    resume: bool = typer.Option(False, "--resume", help="Continue RUN_DIR from its newest checkpoint."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Check everything, print the run config (YAML, on "
                                 "stdout) and the torchrun command, exit; writes no run files."),
    cache_dir: Optional[str] = typer.Option(None, "--cache-dir", help=CACHE_DIR_HELP),
    cache_limit: Optional[str] = typer.Option(None, "--cache-limit", help=CACHE_LIMIT_HELP),
    tracker: Optional[list[str]] = typer.Option(None, "--tracker", metavar="wandb|mlflow", help=TRACKER_HELP),
    tracker_project: Optional[str] = typer.Option(None, "--tracker-project", help=TRACKER_PROJECT_HELP),
) -> None:
    """Check data and RUN_DIR, write RUN_DIR/config.yaml, then run torchrun with dpot_train.worker."""
    given = dict(locals())  # every option by name, before anything else is bound here
    from dpot_train.launch import hand_over, prepare_run
    from dpot_train.topology import choose_topology, torchrun_command

    try:
        given["res"] = res_option(res)
        base, source = _base_config(config, out, resume)
        cfg = apply_overrides(base, launch_overrides(given))
        _check_request(cfg, out, config, resume)
        topo = choose_topology(Path(cfg.out), resume, nproc_per_node, nnodes, node_rank, rdzv_endpoint,
                               rdzv_timeout)
        cfg, cfg_path = prepare_run(cfg, resume, topo, str(source) if source else None, write=not dry_run,
                                    model_named=_model_named(model, source))
        cmd = torchrun_command(cfg_path, topo, resume, checksums_verified=True)
    except Exception as exc:  # noqa: BLE001 - every launch-time problem becomes a one-line error and exit code 2
        _fail(exc)
        return
    if dry_run:  # what config.yaml would hold
        import yaml

        typer.echo(yaml.safe_dump(cfg.to_dict(), sort_keys=False), nl=False)
    typer.echo(" ".join(cmd), err=True)
    if topo.waiting_message():
        typer.echo(topo.waiting_message(), err=True)
    if not dry_run:
        from dpot_train import startup

        os.environ[startup.ENV] = startup.handover()  # the workers' rank 0 prints the time to its first step
        hand_over(cmd)  # torchrun in this process (no second interpreter), as an exec would run it


def _model_named(model: str | None, source: Path | None) -> str | None:
    """Where the run's `model` was named: "--model", "FILE: model" (a --config file, or a resumed run's
    config.yaml, that sets it), None when it is the default."""
    if model is not None:
        return "--model"
    if source is not None and source.is_file():
        from dpot_train.config import read_yaml

        doc = read_yaml(source)
        if isinstance(doc, dict) and "model" in doc:
            return f"{source}: model"
    return None


# launch options -> the run-config keys they set when given (None: not given, the run config's value stays)
_VALUES = {"out": "out", "model": "model", "init": "init", "load": "load", "res": "data.res", "steps": "steps",
           "batch_size": "batch_size", "seed": "seed", "ckpt_every": "ckpt_every", "log_every": "log_every",
           "eval_every": "eval_every",
           "loss": "loss", "device": "device", "rollout_steps": "rollout_steps", "lr": "optim.lr",
           "clip_grad": "optim.clip_grad", "noise": "data.noise", "mixture": "data.mixture",
           "backend": "data.backend", "num_workers": "data.num_workers", "worker_kind": "data.worker_kind",
           "recipe": "recipe", "cache_dir": "data.cache_dir", "cache_limit": "data.cache_limit",
           "sha256": "init_sha256", "normalize": "data.normalize", "tracker": "tracker",
           "tracker_project": "tracker_project"}
_SWITCHES = {"mixture_partial": ("data.mixture_partial", True), "audit": ("audit", True),  # flag -> (key, value)
             "deterministic": ("deterministic", True), "trust": ("trust", True),
             "allow_convention_mismatch": ("allow_convention_mismatch", True), "no_progress": ("progress", False),
             "no_eval": ("eval_at_end", False), "no_verify_checksums": ("data.verify_checksums", False)}


def res_option(value: str | None) -> int | list[int] | None:
    """`--res` as given ("64", "48,64", "16,24,32") as the run config's data.res (None: not given); ValueError in one
    line for anything else."""
    from dpot_train.config import res_value

    return None if value is None else res_value(value, "--res")


def launch_overrides(given: dict[str, Any]) -> dict[str, Any]:
    """The run-config overrides of launch's options (`given` by parameter name): a value where one was given, a
    switch's value where it is on, None (keep the run config's) elsewhere; --steps wins over a config's epochs."""
    out = {key: given[name] for name, key in _VALUES.items()}
    out.update({key: value if given[name] else None for name, (key, value) in _SWITCHES.items()})
    out.update(verify_overrides(given["verify_checksums"], bool(given["no_verify_checksums"])))
    out["data.manifests"] = [str(m) for m in given["manifest"]] or None
    out["epochs"] = given["epochs"] if given["epochs"] is not None else (0 if given["steps"] is not None else None)
    return out


VERIFY_MODES = {"auto": (True, True), "always": (True, False), "never": (False, None)}  # -> (verify, record)
# launch options that set several run-config keys through a function (launch_overrides): option -> keys
_DERIVED = {"verify_checksums": ("data.verify_checksums", "data.checksum_record")}


def verify_overrides(mode: str | None, no_verify: bool) -> dict[str, Any]:
    """data.verify_checksums and data.checksum_record for --verify-checksums MODE (--no-verify-checksums: never);
    ValueError naming the option for another word, or for both options disagreeing."""
    if mode is None:
        return {}
    if mode not in VERIFY_MODES:
        raise ValueError(f"--verify-checksums: expected auto, always or never, got {mode!r}")
    if no_verify and mode != "never":
        raise ValueError(f"--verify-checksums {mode}: contradicts --no-verify-checksums (the same as "
                         "--verify-checksums never); give one of them")
    verify, record = VERIFY_MODES[mode]
    return {"data.verify_checksums": verify, "data.checksum_record": record}


def _check_request(cfg: TrainConfig, out: str | None, config: str | None, resume: bool) -> None:
    """What the options and the environment alone can refute: no RUN_DIR, a --resume with no run to resume, or an
    OMP_NUM_THREADS that is no thread count (said here once, not by ranks racing torchrun's teardown)."""
    from dpot_train.threads import user_threads

    user_threads(os.environ)
    if out is None and config is None:
        raise ValueError("--out RUN_DIR is required")
    if resume and not cfg.data.manifests and not (Path(cfg.out) / "config.yaml").exists():
        raise ValueError(f"--resume: there is no run to resume at {cfg.out} (no {Path(cfg.out) / 'config.yaml'}); "
                         "start one with --manifest DIR --out RUN_DIR, or name the run's folder with --out")


def _comma_list(value: str | None, option: str) -> list[str]:
    """The items of a comma list option (none: []); ValueError (one line) for an empty item."""
    if value is None:
        return []
    items = [v.strip() for v in value.split(",")]
    if not all(items):
        raise ValueError(f"{option} {value}: expected a comma list of checkpoint files, without empty items")
    return items


def evaluate_cmd(
    checkpoint: str = typer.Argument(..., help="Checkpoint (ours, or the released {'model': state_dict} "
                                    "format): a file, dpot:Ti|S|M|L|H or hf://OWNER/REPO/FILE[@REVISION] (read "
                                    "through huggingface_hub's cache)."),
    manifest: list[str] = typer.Option(..., "--manifest", help="Folder holding manifest.json (repeat for several)."),
    out: str = typer.Option(..., "--out", help="The file to write the results to (eval.json; a folder is refused)."),
    rollout_steps: int = typer.Option(0, "--rollout-steps", help="Frames to roll out (0: to the trajectory end)."),
    split: str = typer.Option("test", "--split"),
    backend: str = typer.Option("webdataset", "--backend"),
    device: str = typer.Option("auto", "--device"),
    max_trajectories: int = typer.Option(0, "--max-trajectories", help="Per dataset (0: all)."),
    no_verify_checksums: bool = typer.Option(False, "--no-verify-checksums"),
    trust: bool = typer.Option(False, "--trust", help="Allow arbitrary pickled objects in the checkpoint (unsafe)."),
    sha256: Optional[str] = typer.Option(None, "--sha256", help=SHA256_HELP),
    recipe: Optional[str] = typer.Option(None, "--recipe", help="reference (the reference DPOT evaluation) or dpot "
                                         "(valid channels, fluid cells); default: the recipe the weights were "
                                         "trained with, as their file records it (a checkpoint, or a model "
                                         "export); released weights that record none: reference."),
    normalize: Optional[str] = typer.Option(None, "--normalize", help="auto, manifest or none: normalise with the "
                                            "manifests' train statistics (default: as the weights were trained, with "
                                            "the statistics their run recorded; released weights: none)."),
    allow_convention_mismatch: bool = typer.Option(False, "--allow-convention-mismatch",
                                                   help="Evaluate released weights on shards of another convention."),
    res: Optional[str] = typer.Option(None, "--res", help="Resize trajectories to this grid: N per axis, or H,W "
                                      "(D,H,W for 3D) in the manifest's axis order (default: the run's --res; a 3D "
                                      "DPOT model's own grid)."),
    cache_dir: Optional[str] = typer.Option(None, "--cache-dir", help=CACHE_DIR_HELP),
    cache_limit: Optional[str] = typer.Option(None, "--cache-limit", help=CACHE_LIMIT_HELP),
    predictions: Optional[Path] = typer.Option(None, "--predictions", help="Also write the model's rollouts, truth "
                                               "and mask as a Zarr store here (xarray.open_zarr(PATH, "
                                               "group=DATASET)); dpot recipe."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Write pictures per dataset to this folder: truth / "
                                        "prediction / error at the first, middle and last step, error per step, "
                                        "power spectra (dpot recipe)."),
    video: bool = typer.Option(False, "--video", help="With --plot: also one rollout as a GIF."),
    ensemble: int = typer.Option(0, "--ensemble", help="Also roll out N members (the model's noise injection on "
                                 "the inputs, seeded; checkpoints of --ensemble-checkpoints in turn) and score their "
                                 "CRPS and spread-skill ratio per channel and step, and their mean (dpot recipe)."),
    ensemble_noise: Optional[float] = typer.Option(None, "--ensemble-noise", help="The members' noise epsilon S "
                                                   "(x + S ||x|| N(0,1)); default: the run's data.noise."),
    ensemble_checkpoints: Optional[str] = typer.Option(None, "--ensemble-checkpoints", help="Comma list of further "
                                                       "checkpoints of the same model: members roll them out in turn "
                                                       "(default --ensemble: one member per checkpoint)."),
) -> None:
    """Rollout and one-step (or in-rollout step) L2RE per dataset, for the model and the persistence baseline, with
    per-step L2RE and The Well's NRMSE / VRMSE / spectral MSE per channel; writes eval.json."""
    from dpot_train.checkpoint import check_sha256_option
    from dpot_train.eval_predictions import PredictionWriter
    from dpot_train.evaluate import evaluate_checkpoint, print_table, write_eval
    from dpot_train.launch import reading

    scratch = sink = None
    try:
        check_out_file(out)  # every output is checked before the evaluation, not after it
        grid = res_option(res)
        if video and plot is None:
            raise ValueError("--video: name the folder for it with --plot DIR")
        if (ensemble_noise is not None) and not ensemble and not ensemble_checkpoints:
            raise ValueError("--ensemble-noise: give the member count with --ensemble N")
        if plot is not None:
            from dpot_train.eval_plots import SCRATCH_STEM, check_plot_folder

            check_plot_folder(plot)
        sink = PredictionWriter(predictions) if predictions is not None else None
        if plot is not None:
            plot.mkdir(parents=True, exist_ok=True)
        if plot is not None and sink is None:  # a scratch store for the pictures, a temporary name a later run sweeps
            scratch = tempfile.TemporaryDirectory(prefix=f".{SCRATCH_STEM}.tmp-{os.getpid()}-", dir=plot)
            sink = PredictionWriter(Path(scratch.name) / "predictions.zarr")
        if sink is not None and recipe == "reference":
            raise ValueError("--predictions/--plot: the reference recipe writes no predictions; use --recipe dpot")
        with reading(manifest):  # an ingest --overwrite of these outputs waits for the evaluation
            result = evaluate_checkpoint(checkpoint, [str(m) for m in manifest], rollout_steps=rollout_steps,
                                         split=split, backend=backend, device=device,
                                         max_trajectories=max_trajectories,
                                         verify_checksums=not no_verify_checksums, trusted=trust, recipe=recipe,
                                         allow_convention_mismatch=allow_convention_mismatch, res=grid,
                                         cache_dir=cache_dir, cache_limit=cache_limit,
                                         sha256=check_sha256_option(sha256), normalize=normalize, sink=sink,
                                         ensemble=ensemble, ensemble_noise=ensemble_noise,
                                         ensemble_checkpoints=_comma_list(ensemble_checkpoints,
                                                                          "--ensemble-checkpoints"))
        if sink is not None and result["recipe"] == "reference":
            raise ValueError("--predictions/--plot: the reference recipe (released weights) writes no predictions; "
                             "add --recipe dpot")
        if sink is not None:
            published = sink.close()
            if predictions is not None:
                result["predictions"] = str(published)
        if plot is not None:
            from dpot_train.eval_plots import write_plots

            result["plots"] = [str(p.resolve()) for p in write_plots(published, result, plot, video=video)]
    except Exception as exc:  # noqa: BLE001
        if sink is not None:
            sink.abort()
        _fail(exc)
        return
    finally:
        if scratch is not None:
            scratch.cleanup()
    try:
        write_eval(result, out)  # a full disk: one line naming the file
    except Exception as exc:  # noqa: BLE001
        _fail(exc)
        return
    print_table(result)
    normalised = sorted(k for k, v in result["normalization"]["stats"].items() if v is not None)
    typer.echo(f"wrote {out}: L2RE per dataset, model vs the persistence baseline "
               f"({result['recipe']} recipe, {split} split; normalised: {', '.join(normalised) or 'none'})")
    if "predictions" in result:
        typer.echo(f"wrote {result['predictions']}: prediction, truth and mask per dataset "
                   "(xarray.open_zarr(PATH, group=DATASET))")
    if "plots" in result:
        typer.echo(f"wrote {len(result['plots'])} pictures to {plot}: "
                   f"{', '.join(Path(p).name for p in result['plots'])}")
