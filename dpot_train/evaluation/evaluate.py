"""Per-dataset one-step and rollout L2RE of a model and of the persistence baseline; eval.json and a table."""

from __future__ import annotations

import errno
import json
import sys
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch

from dpot_format.units import entry_units, label
from dpot_train.core.config import DataConfig
from dpot_train.data.datasets import DatasetInfo, check_compatible, without_split
from dpot_train.data.prepare import checked_index, data_reader, load_datasets, norm_table
from dpot_train.data.readers import TrajRef, indexed_trajectories
from dpot_train.data.windows import model_shape, resize_window, run_grid, stored_shape, takes_fluid_rule, \
    to_model_layout, to_model_mask
from dpot_train.evaluation.metrics import VRMSE_WINDOWS, DatasetSuite
from dpot_train.evaluation.predictions import PredictionSink
from dpot_train.evaluation.stream import STREAM_STEPS, score_streamed
from dpot_train.core.metrics import (l2re, one_step, original_grid_cells, persistence, predicted_entries,
                                     reference_rollout_errors, rollout)
from dpot_train.core.normalize import Stats, denormalize, normalize

RECIPES = ("dpot", "reference")
EVAL_SCHEMA = "dpot-eval/3"  # docs/training.md, "eval.json"


def _predictor(model: torch.nn.Module, device: torch.device) -> Any:
    def predict(window: torch.Tensor) -> torch.Tensor:
        return model(window.to(device)).float().cpu()

    return predict


def _normalized(predict: Any, stats: Stats | None) -> Any:
    """`predict` on windows in physical units: normalised before the model, its prediction denormalised after, so
    that rollouts and metrics stay in physical units (unchanged when the dataset is not normalised)."""
    if stats is None:
        return predict

    def in_physical_units(window: torch.Tensor) -> torch.Tensor:
        return denormalize(predict(normalize(window, stats)), stats)

    return in_physical_units


@torch.no_grad()
def evaluate_model(model: torch.nn.Module, data: DataConfig, split: str = "test", rollout_steps: int = 0,
                   device: torch.device | str = "cpu", max_trajectories: int = 0, batch_size: int = 8,
                   verify: bool | None = None, recipe: str = "dpot", datasets: list[DatasetInfo] | None = None,
                   trajectories: Mapping[str, list[TrajRef]] | None = None,
                   sink: PredictionSink | None = None, ensemble: Any = None) -> dict[str, Any]:
    """L2RE per dataset of the model and of the persistence baseline (the last input frame repeated).

    recipe "dpot": valid channels and fluid cells; rollout and one-step from the first t_in true frames; padded
    channels and solid cells are not predicted but carry over from the last input frame (metrics.rollout).
    recipe "reference": the reference DPOT evaluation (docs/training.md): every predicted channel fed back, scored
    on the original grid's cells and the dataset's pred_channels; rollout_l2re over the whole rollout and
    step_l2re, the mean of the per-step errors inside it.

    The model is handed each dataset normalised as `data` says
    (data.normalize, data.norm_stats: dpot_train.core.normalize) and its predictions are denormalised before scoring.
    rollout_steps = 0 rolls out to the end of each trajectory (reference: at most the dataset's t_test frames).
    `data.res` > 0 resizes every trajectory to that grid first, as training did (2D and 3D alike).
    `datasets`: the manifests' datasets, already read and checked (a run's plan); else they are read here.
    `trajectories`: per dataset, its `split` trajectories already indexed (their shards' headers are not read again).
    `sink`: receives the model's rollouts batch by batch (dpot recipe; eval_predictions.PredictionWriter).
    `ensemble`: an ensemble.Ensemble whose members are rolled out and scored beside (dpot recipe).
    """
    if recipe not in RECIPES:
        raise ValueError(f"unknown recipe {recipe!r}; expected one of {RECIPES}")
    device = torch.device(device)
    if datasets is None:
        datasets, index = load_datasets(data, split, verify=verify)
        trajectories = indexed_trajectories(datasets, split, index)
    else:
        check_compatible(datasets, data.t_in, data.t_out, split, data.res)
    norm = norm_table(data, datasets)
    reader = data_reader(data, datasets)
    given = dict(trajectories or {})
    model = model.to(device).eval()
    t_in = data.t_in
    out: dict[str, Any] = {"schema": EVAL_SCHEMA, "split": split, "t_in": t_in, "recipe": recipe,
                           "normalization": {"normalize": data.normalize, "stats": norm}, "datasets": {}}
    if ensemble is not None:  # the members' models on the device; the predictions store gains their rollouts
        out["ensemble"] = ensemble.to(device).record()
        if sink is not None:
            sink.set_ensemble(out["ensemble"])
    for ds in datasets:
        predict = _normalized(_predictor(model, device), norm[ds.name])
        refs = given[ds.name] if ds.name in given else reader.refs(ds, split)
        if max_trajectories > 0:
            refs = refs[:max_trajectories]
        if recipe == "reference":
            out["datasets"][ds.name] = _reference_scores(predict, ds, reader, refs, t_in, rollout_steps,
                                                         batch_size, data.res)
            _note_clamped(out, ds, rollout_steps, t_in, out["datasets"][ds.name]["rollout_steps"])
            continue
        steps = ds.frames - t_in if rollout_steps <= 0 else min(rollout_steps, ds.frames - t_in)
        _note_clamped(out, ds, rollout_steps, t_in, steps)
        sums = {k: [] for k in ("model_one_step", "model_rollout", "persistence_one_step", "persistence_rollout")}
        suite = DatasetSuite(ds.channels, ds.channel_valid, steps)
        if sink is not None:
            sink.begin(ds, [r.id for r in refs], steps, t_in)
        members = ensemble.scorer(ds, norm[ds.name], steps, t_in, sink) if ensemble is not None else None
        scored = []  # per trajectory: any fluid cell in a valid channel (else its L2RE is 0/0, not a perfect 0)
        valid = torch.tensor(ds.channel_valid, dtype=torch.bool)
        for i in range(0, len(refs), batch_size):
            chunk = refs[i:i + batch_size]
            if steps > STREAM_STEPS:  # a long rollout: read and scored chunk by chunk (eval_stream)
                read = lambda t0, n, c=chunk: _read_batch(reader, c, ds, t0, n, data.res)  # noqa: E731
                found = score_streamed(predict, read, t_in, steps, ds.channel_valid, suite, sink, ds,
                                       [r.id for r in chunk])
                for k, v in found.items():
                    sums[k].append(v)
                mask = _read_batch(reader, chunk, ds, 0, 1, data.res)[1]
                scored.append(mask.flatten(1).any(1) & valid.any())
                if sink is not None:  # the suite saw every trajectory of the batch
                    sink.write_blowups(ds, [r.id for r in chunk], suite.by["model"].first_blowup)
                if members is not None:
                    members.score_batch(read, i, [r.id for r in chunk])
                continue
            frames, mask = _read_batch(reader, chunk, ds, 0, t_in + steps, data.res)
            cv = torch.tensor([ds.channel_valid] * len(chunk), dtype=torch.bool)
            true = frames[..., t_in:t_in + steps, :]
            keep = predicted_entries(mask, cv, frames[..., :1, :])
            rows = mask.flatten(1).any(1) & cv.any(1)  # trajectories with something to score
            for who, fn, k in (("model", predict, keep), ("persistence", persistence, None)):
                pred, once = rollout(fn, frames, t_in, steps, k), one_step(fn, frames, t_in, steps, k)
                sums[f"{who}_rollout"].append(l2re(pred, true, mask, cv))
                sums[f"{who}_one_step"].append(l2re(once, true, mask, cv))
                if rows.any():
                    suite.add(who, pred[rows], once[rows], true[rows], mask[rows])
                if who == "model" and sink is not None:
                    sink.write(ds, [r.id for r in chunk], pred, true, mask)
            scored.append(rows)
            if sink is not None:  # the suite saw the trajectories with something to score
                first = torch.full((len(chunk),), -1, dtype=torch.int64)
                if rows.any():
                    first[rows] = suite.by["model"].first_blowup
                sink.write_blowups(ds, [r.id for r in chunk], first)
            if members is not None:
                members.score_batch(lambda t0, n, f=frames, m=mask: (f[..., t0:t0 + n, :], m), i,
                                    [r.id for r in chunk])
        keep = torch.cat(scored)
        vals = {k: float(torch.cat(v)[keep].mean()) if keep.any() else None for k, v in sums.items()}
        more = suite.result() if keep.any() else _no_numbers(suite.result())
        out["datasets"][ds.name] = {
            "trajectories": len(refs), "rollout_steps": steps,
            **{k: v for k, v in more.items() if k not in ("model", "persistence")},
            "model": {"one_step_l2re": vals["model_one_step"], "rollout_l2re": vals["model_rollout"], **more["model"]},
            "persistence": {"one_step_l2re": vals["persistence_one_step"], "rollout_l2re": vals["persistence_rollout"],
                            **more["persistence"]},
        }
        out["datasets"][ds.name]["units"] = _channel_units(ds)
        if members is not None:  # beside the single rollout's figures
            out["datasets"][ds.name].update(members.result() if keep.any() else _no_numbers(members.result()))
        if not keep.all():  # left out of the means; none left: the metrics are null
            out["datasets"][ds.name]["unscored"] = (f"{int((~keep).sum())} of {len(refs)} trajectories have no fluid "
                                                    "cell in a valid channel: nothing to score, left out")
    return out


def _channel_units(ds: DatasetInfo) -> dict[str, str]:
    """The unit of each valid channel (dpot_format.units): RMSE is in it, the spectral MSE in its square."""
    units = entry_units(ds.entry)["channels"]
    return {c: u for c, u, ok in zip(ds.channels, units, ds.channel_valid) if ok}


def add_note(result: dict[str, Any], line: str) -> None:
    """Record one line in the result's `notes` (eval.json; print_table prints them under the table): what was scored
    differs from what was asked or from what the model was trained on."""
    result.setdefault("notes", []).append(line)


def _note_clamped(out: dict[str, Any], ds: DatasetInfo, asked: int, t_in: int, steps: int) -> None:
    """A note when --rollout-steps asked for more steps than the dataset's trajectories hold (they were clamped)."""
    if asked > steps:
        limit = f"{ds.frames} frames, {t_in} of them inputs" if steps == ds.frames - t_in else \
            f"t_test {ds.convention.get('t_test')} frames (the reference recipe)"
        add_note(out, f"--rollout-steps {asked}: dataset {ds.name!r} has {limit}; rolled out {steps} steps")


def _no_numbers(found: Any) -> Any:
    """`found` with every number replaced by None: the suite of a dataset with nothing to score (null, never 0)."""
    if isinstance(found, dict):
        return {k: _no_numbers(v) for k, v in found.items()}
    if isinstance(found, list):
        return [_no_numbers(v) for v in found]
    return None if isinstance(found, (int, float)) and not isinstance(found, bool) else found


def _read_batch(reader: Any, chunk: list[TrajRef], ds: DatasetInfo, t0: int, length: int, res: int | list[int]
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Frames [t0, t0 + length) of the trajectories `chunk` in the model layout (B, *S, T, C), resized to `res`
    (data.res), and their fluid-cell mask (B, *S)."""
    arrays = [reader.read(r, t0, length) for r in chunk]
    grid = _model_grid(ds, res)[0] if res else 0
    return resize_window(torch.from_numpy(np.stack([to_model_layout(f, ds.model_layout) for f, _ in arrays])),
                         torch.from_numpy(np.stack([to_model_mask(m, ds.model_layout)
                                                    for _, m in arrays]).astype(bool)), grid, takes_fluid_rule(ds))


def _model_grid(ds: Any, res: int | list[int] = 0) -> tuple[tuple[int, ...], list[int]]:
    """(H, W[, D]) of the model's grid (after `res`, data.res, when the run resizes) and of the native grid, in the
    model's orientation."""
    native = list(model_shape(ds.entry.get("grid", {}).get("native_shape", ds.shape), ds.model_layout))
    return run_grid(ds.shape, ds.model_layout, res, ds.dims), native


def _reference_scores(predict: Any, ds: Any, reader: Any, refs: list[TrajRef], t_in: int, rollout_steps: int,
                      batch_size: int, res: int | list[int] = 0) -> dict[str, Any]:
    """One dataset's trajectories `refs` under the reference recipe: model and persistence, rollout_l2re and
    step_l2re."""
    t_test = int(ds.convention.get("t_test", ds.frames - t_in))
    steps = min(t_test, ds.frames - t_in) if rollout_steps <= 0 else min(rollout_steps, t_test, ds.frames - t_in)
    shape, native = _model_grid(ds, res)
    cells, channels = original_grid_cells(shape, native), ds.pred_channels
    found: dict[str, list[torch.Tensor]] = {k: [] for k in ("model_rollout", "model_step", "persistence_rollout",
                                                            "persistence_step")}
    for i in range(0, len(refs), batch_size):
        frames, _ = _read_batch(reader, refs[i:i + batch_size], ds, 0, t_in + steps, res)
        for name, fn in (("model", predict), ("persistence", persistence)):
            whole, per_step = reference_rollout_errors(fn, frames, t_in, steps, cells, channels)
            found[f"{name}_rollout"].append(whole)
            found[f"{name}_step"].append(per_step)
    vals = {k: float(torch.cat(v).double().mean()) for k, v in found.items()}
    return {"trajectories": len(refs), "rollout_steps": steps, "pred_channels": channels,
            "model": {"rollout_l2re": vals["model_rollout"], "step_l2re": vals["model_step"]},
            "persistence": {"rollout_l2re": vals["persistence_rollout"], "step_l2re": vals["persistence_step"]}}


def require_split(datasets: list[Any], split: str, remedy: str) -> None:
    """ValueError naming every dataset without trajectories in `split` (checked from the manifests, before any data
    is read), so that an evaluation that would have nothing to score stops with what to do instead."""
    names = without_split(datasets, split)
    if names:
        raise ValueError(f"no {split!r} trajectories to evaluate in dataset(s) {names}: re-ingest with a test split "
                         f"(`dpot-data ingest ... --split 0.8 --overwrite`: 80% train, the rest test), or {remedy}")


class ResultWriteError(RuntimeError):
    """eval.json could not be written (full disk, no permission); nothing partial is left, the message names the
    file."""


def write_eval(result: dict[str, Any], path: str | Path) -> None:
    """Write eval.json atomically (fsynced temporary file, rename); ResultWriteError naming the file (and, for a full
    disk, its folder) when that fails."""
    from dpot_format.io import atomic_write

    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, (json.dumps(result, indent=2) + "\n").encode("utf-8"))
    except OSError as exc:
        why = f"no space left on the device holding {path.parent.absolute()}" if exc.errno == errno.ENOSPC else \
            (exc.strerror or str(exc))
        raise ResultWriteError(f"{path}: the results could not be written ({why}); no partial file was left: free "
                               "space there (or write elsewhere) and run again") from exc


def print_table(result: dict[str, Any]) -> None:
    """Rich table: one row per dataset, model vs persistence, one-step and rollout L2RE."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    reference = result.get("recipe") == "reference"
    scored = "the reference's metric: original-grid cells, pred_channels" if reference else \
        "valid channels, fluid cells"
    first = "step_l2re" if reference else "one_step_l2re"
    label = "step (in rollout)" if reference else "1-step"
    table = Table(title=f"L2RE on the {result['split']} split ({scored}; lower is better)")
    for col in ("dataset", "traj", "steps", f"model {label}", f"persist {label}", "model rollout", "persist rollout"):
        table.add_column(col, justify="left" if col == "dataset" else "right")
    def number(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.4f}"  # None: no trajectory with a cell to score

    for name, r in result["datasets"].items():
        table.add_row(name, str(r["trajectories"]), str(r["rollout_steps"]),
                      number(r["model"][first]), number(r["persistence"][first]),
                      number(r["model"]["rollout_l2re"]), number(r["persistence"]["rollout_l2re"]))
    Console(width=120).print(table)
    rmse = rmse_rows(result)
    if rmse:
        table = Table(title=f"RMSE over the rollout in the data's units ({scored}; lower is better)")
        for col in ("dataset", "channel [unit]", "model rollout RMSE", "persist rollout RMSE"):
            table.add_column(escape(col), justify="left" if col in ("dataset", "channel [unit]") else "right")
        for row in rmse:
            table.add_row(*(escape(cell) for cell in row))
        Console(width=120).print(table)
    for title, head, rows in extra_tables(result):
        table = Table(title=title)
        for col in head:
            table.add_column(escape(col), justify="left" if col.startswith(("dataset", "channel")) else "right")
        for row in rows:
            table.add_row(*(escape(cell) for cell in row))
        Console(width=120).print(table)
    for line in result.get("notes", []):  # what was scored differs from what was asked or trained on
        print(f"note: {line}", file=sys.stderr, flush=True)


def rmse_rows(result: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(dataset, `channel [unit]`, model RMSE, persistence RMSE) of every valid channel scored with the dpot
    recipe: the errors in the data's own units (`temperature [K]`)."""
    def number(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.4g}"

    rows = []
    for name, r in result["datasets"].items():
        units = r.get("units") or {}
        for channel, scores in (r["model"].get("channels") or {}).items():
            if "rmse" in scores:
                rows.append((name, label(channel, units.get(channel)), number(scores["rmse"]),
                             number(r["persistence"]["channels"][channel]["rmse"])))
    return rows


def extra_tables(result: dict[str, Any]) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows) of the stability table (VRMSE by window, blow-ups by the last step; dpot-eval/3) and,
    with an ensemble, its scores: what print_table adds to the L2RE and RMSE tables."""
    def number(x: Any) -> str:
        return "n/a" if x is None else f"{x:.4g}"

    stability, members = [], []
    for name, r in result["datasets"].items():
        units = r.get("units") or {}
        for channel, scores in (r["model"].get("channels") or {}).items():
            if "vrmse_window" not in scores:
                continue
            other = r["persistence"]["channels"][channel]["vrmse_window"]
            windows = [f"{number(scores['vrmse_window'][k])} / {number(other.get(k))}"
                       if k in scores["vrmse_window"] else "-" for k, _, _ in VRMSE_WINDOWS]
            blown = [number((r[w].get("blowup_fraction_per_step") or [None])[-1]) for w in ("model", "persistence")]
            stability.append([name, str(channel), *windows, " / ".join(blown)])  # VRMSE: no unit
        for channel, scores in ((r.get("ensemble") or {}).get("channels") or {}).items():
            ssr = scores["spread_skill_per_step"]
            members.append([name, label(channel, units.get(channel)), number(scores["crps"]),
                            number(ssr[-1] if ssr else None),
                            number(r["ensemble_mean"]["rollout_l2re"]), number(r["model"]["rollout_l2re"])])
    out = []
    if stability:
        out.append(("Stability, model / persistence: The Well's VRMSE averaged over rollout steps, and the share of "
                    "trajectories blown up (VRMSE > 1) by the last step",
                    ["dataset", "channel"] + [f"VRMSE {k}" for k, _, _ in VRMSE_WINDOWS] + ["blown up"], stability))
    if members:
        ens = result.get("ensemble", {})
        out.append((f"Ensemble of {ens.get('members')} members (noise {ens.get('noise')}): CRPS ({ens.get('estimator')}"
                    " estimator, mean over steps; the channel's unit), spread-skill at the last step (1: reliable)",
                    ["dataset", "channel [unit]", "CRPS", "spread-skill", "mean rollout L2RE", "model rollout L2RE"],
                    members))
    return out


def evaluate_checkpoint(checkpoint: str, manifests: list[str], rollout_steps: int = 0, split: str = "test",
                        backend: str = "webdataset", device: str = "auto", max_trajectories: int = 0,
                        verify_checksums: bool = True, trusted: bool = False, recipe: str | None = None,
                        allow_convention_mismatch: bool = False, res: int | list[int] | None = None,
                        cache_dir: str | None = None, cache_limit: str | None = None,
                        sha256: str | None = None, normalize: str | None = None,
                        sink: PredictionSink | None = None, ensemble: int = 0, ensemble_noise: float | None = None,
                        ensemble_checkpoints: list[str] | None = None) -> dict[str, Any]:
    """Load a checkpoint (ours or the released format; a file or a Hub reference, dpot:Ti or hf://..., whose commit
    and sha256 go to the result's `hub`) and evaluate it on the manifests' `split`.

    `recipe` None: the one the weights were trained with (checkpoint.weights_recipe: a checkpoint and its export
    score alike; released weights: "reference", the paper's metric). `normalize` None: as the
    weights were trained, with the statistics their run recorded (a checkpoint's run config, an export's
    `normalization` entry); released weights without a record: none. A mode (auto, manifest, none) instead takes
    the statistics from the manifests. Released weights on shards of another convention than
    dpot-reference are refused unless `allow_convention_mismatch`. `res`: the grid windows are resized to, as
    data.res (None: the run's data.res; for a 3D model without one, the model's own grid). `sha256`: the file's expected digest.
    `ensemble` N > 0 (or `ensemble_checkpoints`): also roll out and score an ensemble
    (dpot_train/evaluation/ensemble.py) of N members (default: one per checkpoint) over this checkpoint and
    `ensemble_checkpoints`, with noise `ensemble_noise` (None: the run's data.noise)."""
    from dpot_train.core.checkpoint import (parse_checkpoint, pretrained_from, read_checkpoint, trained_on, trained_res,
                                            weights_recipe)
    from dpot_train.data.datasets import read_manifests
    from dpot_train.integrations.hub import is_reference, resolve
    from dpot_train.model import families
    from dpot_train.core.model_setup import convention_problems, data_overrides, init_model
    from dpot_train.core.normalize import check_mode, recorded
    from dpot_train.core.threads import apply_threads

    if normalize is not None:
        check_mode(normalize, "--normalize")
    datasets = read_manifests(manifests)
    require_split(datasets, split, "evaluate another --split")
    hub = resolve(checkpoint) if is_reference(checkpoint) else None  # dpot:Ti, hf://...: huggingface_hub's cache
    digest: list[str] = []
    content = read_checkpoint(hub.path if hub else checkpoint, trusted=trusted, sha256=sha256,
                              digest_out=digest)  # the one load of the file
    loaded = parse_checkpoint(content, checkpoint)
    released = loaded[1] is None
    if released and not allow_convention_mismatch:
        problems = convention_problems(datasets, checkpoint)
        if problems:
            raise ValueError(problems[0])
    recipe = weights_recipe(content) if recipe is None else recipe
    mode, stats = (normalize, None) if normalize is not None else recorded(content) or ("none", None)
    model = pretrained_from(*loaded, source=str(checkpoint))
    cfg = model.config
    frames_in = cfg.in_timesteps
    grid = datasets[0].shape
    for ds in datasets:
        if cfg.in_channels != len(ds.channels):
            raise ValueError(f"{checkpoint}: the model reads {cfg.in_channels} channels but dataset "
                             f"{ds.name!r} has {len(ds.channels)} ({ds.channels})")
        if cfg.spatial_dims != len(ds.shape):
            raise ValueError(f"{checkpoint}: a {cfg.spatial_dims}D model, but dataset {ds.name!r} is "
                             f"{len(ds.shape)}D (dims {ds.dims})")
    trained = trained_on(content)
    notes = data_notes(checkpoint, datasets, trained) if trained else []
    ds0 = datasets[0]
    if res is None:  # the run's grid; a 3D model reads its own grid (the reference resizes every sample to it)
        res = 0 if released else trained_res(content)
        if not res and cfg.spatial_dims == 3 and families.weights_fix_grid(cfg):  # its (X, Y, Z), stored (Z, Y, X)
            res = cfg.img_size if isinstance(cfg.img_size, int) else list(stored_shape(cfg.grid, ds0.model_layout))
    if not released or families.weights_fix_grid(cfg):  # the grid the weights were trained on is known
        notes += grid_notes(cfg, datasets, res)
    seen = run_grid(grid, ds0.model_layout, res, ds0.dims)  # the grid the model is handed
    if tuple(cfg.grid) != seen:  # weights of another grid: DPOT resamples its positional embedding
        model = init_model(checkpoint, data_overrides(cfg.in_channels, seen, frames_in, cfg.out_timesteps), trusted,
                           loaded=loaded)
    members = None
    if ensemble or ensemble_checkpoints:  # dpot_train/evaluation/ensemble.py; its other checkpoints made as `model` was
        from dpot_train.evaluation.ensemble import build_ensemble

        resample = tuple(cfg.grid) != seen  # as for `model`: the positional embedding resampled to the grid seen
        members = build_ensemble(
            str(checkpoint), model, content, recipe, ensemble, ensemble_noise, list(ensemble_checkpoints or []),
            cfg, None if normalize is not None else (mode, stats), trusted,
            lambda path, found: init_model(path, data_overrides(cfg.in_channels, seen, frames_in, cfg.out_timesteps),
                                           trusted, loaded=found) if resample else pretrained_from(*found, source=path))
    data = DataConfig(manifests=list(manifests), backend=backend, t_in=frames_in, t_out=cfg.out_timesteps,
                      verify_checksums=verify_checksums, res=res, cache_dir=cache_dir, cache_limit=cache_limit,
                      normalize=mode, norm_stats=stats)
    dev = torch.device("cuda" if device == "auto" and torch.cuda.is_available() else
                       ("cpu" if device == "auto" else device))
    apply_threads(0)  # one process, no loader workers: dpot_train.core.threads' rule, or the user's OMP_NUM_THREADS
    index = checked_index(data, datasets, split)  # the manifests read above are not read again
    result = evaluate_model(model, data, split=split, rollout_steps=rollout_steps, device=dev,
                            max_trajectories=max_trajectories, recipe=recipe, datasets=datasets,
                            trajectories=indexed_trajectories(datasets, split, index), sink=sink,
                            ensemble=members)
    for line in reversed(notes):  # what the data is to the model, before what the evaluation clamped
        result.setdefault("notes", []).insert(0, line)
    result["checkpoint"] = hub.pinned if hub else str(checkpoint)
    if hub is not None:  # which file of the Hub was scored: the commit and the file's sha256
        result["hub"] = hub.record(digest[0])
    result["network"] = families.summary(model.config)  # model family, size and parameter count
    return result


def _valid_names(channels: list[str], valid: list[bool]) -> list[str]:
    return [str(c) for c, v in zip(channels, valid) if v]


def data_notes(checkpoint: str, datasets: list[DatasetInfo], trained: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Check the datasets against the record of the weights' training data (checkpoint.data_record): ValueError in
    one line when a dataset's channels are not the model's (another channel list for a dataset it was trained on; a
    valid channel the model never saw in that slot for a new one), else one note per dataset it never saw."""
    notes = []
    for ds in datasets:
        mine = _valid_names(ds.channels, ds.channel_valid)
        seen = trained.get(ds.name)
        if seen is not None:
            theirs = _valid_names(seen.get("channels", []), seen.get("channel_valid", []))
            if list(seen.get("channels", [])) != list(ds.channels) or \
                    [bool(v) for v in seen.get("channel_valid", [])] != [bool(v) for v in ds.channel_valid]:
                raise ValueError(f"{checkpoint}: dataset {ds.name!r} ({ds.manifest}) has channels {', '.join(mine)} "
                                 f"({ds.channels}); the model was trained on it with {', '.join(theirs)} "
                                 f"({list(seen.get('channels', []))}): expected the channels the model reads "
                                 "(re-ingested with other channels? evaluate on data ingested as for training)")
            continue
        slots: dict[int, set[str]] = {}  # channel slot -> the names the model was trained on in it
        for rec in trained.values():
            for i, (name, valid) in enumerate(zip(rec.get("channels", []), rec.get("channel_valid", []))):
                if valid:
                    slots.setdefault(i, set()).add(str(name))
        for i, (name, valid) in enumerate(zip(ds.channels, ds.channel_valid)):
            if valid and str(name) not in slots.get(i, set()):
                known = ", ".join(sorted(slots.get(i, set()))) or "padding only"
                raise ValueError(f"{checkpoint}: dataset {ds.name!r} ({ds.manifest}) has channels {', '.join(mine)}; "
                                 f"the model was trained on {', '.join(sorted(trained))} with channel {i} = "
                                 f"{known}, never {name!r}: expected data of the model's channels (fine-tune on "
                                 "it first: dpot-train launch --init CHECKPOINT --manifest ...)")
        notes.append(f"dataset {ds.name!r} was not in the model's training data ({', '.join(sorted(trained))}); "
                     "scored as new data")
    return notes


def _shown(grid: tuple[int, ...]) -> str:
    return "x".join(str(g) for g in grid)


def _res_text(res: int | list[int] | tuple[int, ...]) -> str:
    """A grid as `--res` takes it: 64, or 48,64 (the manifest's axis order)."""
    return ",".join(str(int(s)) for s in res) if isinstance(res, (list, tuple)) else str(int(res))


def grid_notes(cfg: Any, datasets: list[DatasetInfo], res: int | list[int]) -> list[str]:
    """One note per dataset scored on another grid than the model was trained on (`cfg.grid`), saying what
    happens: resized to --res, or scored on its own grid (DPOT's positional embedding resampled; the baselines'
    weights do not depend on the grid)."""
    from dpot_train.model import families

    trained = tuple(int(s) for s in cfg.grid)
    notes = []
    for ds in datasets:
        stored = tuple(int(n) for n in model_shape(ds.shape, ds.model_layout))
        scored = run_grid(ds.shape, ds.model_layout, res, ds.dims)
        if scored == trained:
            continue
        square = len(set(trained)) == 1
        back = f"; --res {trained[0] if square else _res_text(stored_shape(trained, ds.model_layout))} resizes it " \
               "to the trained grid"
        if res:
            how = f"resized from {_shown(stored)} to {_shown(scored)} (--res {_res_text(res)})"
        elif families.weights_fix_grid(cfg):
            how = f"scored on its {_shown(stored)} grid, the positional embedding resampled{back}"
        else:
            how = f"scored on its {_shown(stored)} grid (the weights do not depend on the grid){back}"
        notes.append(f"the model was trained on a {_shown(trained)} grid; dataset {ds.name!r} is {how}")
    return notes
