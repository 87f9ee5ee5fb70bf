"""`dpot-train launch`: check data and RUN_DIR, write the run config, run torchrun (dpot_train.run.launch_request)."""

from __future__ import annotations

from typing import Optional

import typer

from dpot_train.cli.options import (CACHE_DIR_HELP, CACHE_LIMIT_HELP, SHA256_HELP, TRACKER_HELP, TRACKER_PROJECT_HELP,
                                    VERIFY_HELP, fail)
from dpot_train.core.config import TrainConfig


def _default(key: str, text: str = "") -> str:
    """A launch option's help with its default: the run config's value (a --config file or a resumed run's wins)."""
    value: object = TrainConfig().to_dict()
    for part in key.split("."):
        value = value[part]  # type: ignore[index]
    from rich.markup import escape

    return f"{text}  " + escape(f"[default: {value}]")  # escaped: --help renders rich markup


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
    compile_step: bool = typer.Option(False, "--compile", help="torch.compile the training step (forward, loss, "
                                      "backward, optimiser step): the first steps pay the compilation."),
    compile_mode: Optional[str] = typer.Option(None, "--compile-mode", help="torch.compile mode of --compile: "
                                               "default, reduce-overhead, max-autotune or "
                                               "max-autotune-no-cudagraphs; default: reduce-overhead (CUDA graphs) "
                                               "on CUDA, default on CPU."),
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
    """Check data and RUN_DIR, write RUN_DIR/config.yaml, then run torchrun with dpot_train.run.worker."""
    given = dict(locals())  # every option by name, before anything else is bound here
    from dpot_train.run.launch_request import exec_torchrun, plan_launch

    try:
        cfg, topo, cmd = plan_launch(given)
    except Exception as exc:  # noqa: BLE001 - every launch-time problem becomes a one-line error and exit code 2
        fail(exc)
    if dry_run:  # what config.yaml would hold
        import yaml

        typer.echo(yaml.safe_dump(cfg.to_dict(), sort_keys=False), nl=False)
    typer.echo(" ".join(cmd), err=True)
    if topo.waiting_message():
        typer.echo(topo.waiting_message(), err=True)
    if not dry_run:
        exec_torchrun(cmd)
