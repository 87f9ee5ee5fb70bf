"""What a `dpot-train launch` command asks for: its options as run-config overrides (over --config, a resumed
run's config.yaml or the defaults), checked, and the torchrun command that runs it. Imports neither the trainer nor
the worker (the launcher stays light)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from dpot_train.core.config import TrainConfig, apply_overrides, find_config, load_config


def base_config(config: Path | None, out: str | None, resume: bool) -> tuple[TrainConfig, Path | None]:
    """The run config the options apply to and the file it came from: --config, else on --resume the run's own
    config.yaml, else the defaults (no file)."""
    source = find_config(config) if config is not None else Path(out) / "config.yaml" if resume and out else None
    if source is not None and (config is not None or source.exists()):
        return load_config(source), source
    return TrainConfig(), None


def model_named(model: str | None, source: Path | None) -> str | None:
    """Where the run's `model` was named: "--model", "FILE: model" (a --config file, or a resumed run's
    config.yaml, that sets it), None when it is the default."""
    if model is not None:
        return "--model"
    if source is not None and source.is_file():
        from dpot_train.core.config import read_yaml

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
           "tracker_project": "tracker_project", "compile_mode": "compile_mode"}
_SWITCHES = {"mixture_partial": ("data.mixture_partial", True), "audit": ("audit", True),  # flag -> (key, value)
             "deterministic": ("deterministic", True), "trust": ("trust", True),
             "allow_convention_mismatch": ("allow_convention_mismatch", True), "no_progress": ("progress", False),
             "no_eval": ("eval_at_end", False), "no_verify_checksums": ("data.verify_checksums", False),
             "compile_step": ("compile", True)}


def res_option(value: str | None) -> int | list[int] | None:
    """`--res` as given ("64", "48,64", "16,24,32") as the run config's data.res (None: not given); ValueError in one
    line for anything else."""
    from dpot_train.core.config import res_value

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


def check_request(cfg: TrainConfig, out: str | None, config: str | None, resume: bool) -> None:
    """What the options and the environment alone can refute: no RUN_DIR, a --resume with no run to resume, or an
    OMP_NUM_THREADS that is no thread count (said here once, not by ranks racing torchrun's teardown)."""
    from dpot_train.core.threads import user_threads

    user_threads(os.environ)
    if out is None and config is None:
        raise ValueError("--out RUN_DIR is required")
    if resume and not cfg.data.manifests and not (Path(cfg.out) / "config.yaml").exists():
        raise ValueError(f"--resume: there is no run to resume at {cfg.out} (no {Path(cfg.out) / 'config.yaml'}); "
                         "start one with --manifest DIR --out RUN_DIR, or name the run's folder with --out")


def plan_launch(given: dict[str, Any]) -> tuple[TrainConfig, Any, list[str]]:
    """The run of launch's options (`given` by parameter name): its config (written to RUN_DIR/config.yaml unless
    `dry_run`), topology and torchrun command, every check done first; any problem raises, in one line each."""
    from dpot_train.run.launch import prepare_run
    from dpot_train.core.topology import choose_topology, torchrun_command

    given = {**given, "res": res_option(given["res"])}
    config, out, resume = given["config"], given["out"], given["resume"]
    base, source = base_config(config, out, resume)
    cfg = apply_overrides(base, launch_overrides(given))
    check_request(cfg, out, config, resume)
    topo = choose_topology(Path(cfg.out), resume, given["nproc_per_node"], given["nnodes"], given["node_rank"],
                           given["rdzv_endpoint"], given["rdzv_timeout"])
    cfg, cfg_path = prepare_run(cfg, resume, topo, str(source) if source else None, write=not given["dry_run"],
                                model_named=model_named(given["model"], source))
    return cfg, topo, torchrun_command(cfg_path, topo, resume, checksums_verified=True)


def exec_torchrun(cmd: list[str]) -> None:
    """Run torchrun (`cmd`) in this process, as an exec would (no second interpreter; its exit code is ours); the
    workers' rank 0 then prints the time to its first step."""
    from dpot_train.train import startup
    from dpot_train.run.launch import hand_over

    os.environ[startup.ENV] = startup.handover()
    hand_over(cmd)
