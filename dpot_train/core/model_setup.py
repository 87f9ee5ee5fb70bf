"""Build the model a run trains: a preset fitted to the data, or `--init` weights (released format or ours)."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from dpot_format.conventions import OWN_DATA, REFERENCE
from dpot_train.core.checkpoint import load_state_dict_file
from dpot_train.model import families
from dpot_train.model.family_config import GridError
from dpot_train.model.weights import resize_pos_embed

__all__ = ["checkpoint_config", "convention_problems", "data_overrides", "fresh_config", "fresh_model", "init_model",
           "resize_pos_embed"]


def data_overrides(channels: int, shape: tuple[int, ...], t_in: int, t_out: int,
                   res: int | Sequence[int] = 0) -> dict[str, Any]:
    """Model config fields the data fixes: dimension (2D or 3D), grid (`shape`, in the model's axis order; `res`
    when the run resizes windows: one side for every axis, or one per axis in that order), channel count, input and
    output frames. The grid is one side when square (cubic), the reference's form, else one side per axis."""
    grid = tuple(int(s) for s in (res if isinstance(res, (list, tuple)) else
                                  (res,) * len(shape) if res > 0 else shape))
    if len(grid) not in (2, 3) or len(grid) != len(shape):
        raise ValueError(f"the model needs a 2D or 3D grid; the data grid is {list(shape)}"
                         + (f" and --res gives {list(grid)}" if grid != tuple(shape) else ""))
    return {"img_size": grid[0] if len(set(grid)) == 1 else grid, "in_channels": channels, "out_channels": channels,
            "in_timesteps": t_in, "out_timesteps": t_out, "spatial_dims": len(grid)}


def fresh_config(preset: str, overrides: dict[str, Any], fixed: dict[str, Any]) -> Any:
    """The config of a preset (any family) with the data's fields and the user's overrides (user wins); ValueError
    in one line when they do not fit (e.g. more Fourier modes than the grid holds)."""
    try:
        return families.configure(preset, fixed, overrides)
    except GridError:
        raise  # the caller names the grid as the user gives it (launch: --res, --resolution)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"--model {preset} on this data ({fixed}): {exc}") from None


def fresh_model(preset: str, overrides: dict[str, Any], fixed: dict[str, Any]) -> torch.nn.Module:
    """A newly initialised preset (any family) with the data's fields and the user's overrides (user wins)."""
    return families.build(fresh_config(preset, overrides, fixed))


def convention_problems(datasets: list[Any], checkpoint: str) -> list[str]:
    """One line per dataset whose convention is not the one the released weights were trained on: dpot-reference,
    or own-data (data the reference never saw, given the reference's orientation, padding and resampling)."""
    return [f"dataset {d.name!r} ({d.manifest}) follows the {d.convention.get('name')!r} convention, but the released "
            f"weights {checkpoint} were pre-trained on dpot-reference inputs (re-ingest with the default "
            "--convention dpot-reference, or pass --allow-convention-mismatch)"
            for d in datasets if d.convention.get("name") not in (REFERENCE, OWN_DATA)]


Loaded = tuple[dict[str, Any], dict[str, Any] | None, dict[str, Any]]  # a checkpoint file's (state, config, hints)


def checkpoint_config(path: str, trusted: bool = False, loaded: Loaded | None = None, sha256: str | None = None,
                      ) -> tuple[dict[str, torch.Tensor], Any]:
    """The state dict of `path` and its model config, any family (stored with our checkpoints, inferred for released
    ones); `loaded`: the file's (state, config, hints) when already read, so it is not loaded again; `sha256`: the
    file's expected digest."""
    state, config_dict, hints = loaded if loaded is not None else load_state_dict_file(path, trusted=trusted,
                                                                                        sha256=sha256)
    return state, (families.config_from_dict(config_dict) if config_dict is not None
                   else families.infer_config(state, hints))


def init_model(path: str, fixed: dict[str, Any], trusted: bool = False,
               loaded: Loaded | None = None) -> torch.nn.Module:
    """Weights of `path` (released `{'model': state_dict}` or ours, any family) adapted to the data grid.

    Channels and frame counts must match the data; a different grid side resamples DPOT's positional embedding
    (the baselines have no weight that depends on the grid).
    `loaded`: the file's (state, config, hints) when already read (`parse_checkpoint`), so it is not loaded again.
    """
    state, config = checkpoint_config(path, trusted, loaded)
    if config.spatial_dims != fixed.get("spatial_dims", config.spatial_dims):
        raise ValueError(f"--init {path}: a {config.spatial_dims}D model, the data is {fixed['spatial_dims']}D")
    for key in ("in_channels", "out_channels", "in_timesteps", "out_timesteps"):
        if getattr(config, key) != fixed[key]:
            raise ValueError(f"--init {path}: the checkpoint has {key}={getattr(config, key)} but the data/run "
                             f"needs {fixed[key]} (pad channels to {getattr(config, 'in_channels')} at ingest, "
                             "or set t_in/t_out to match)")
    config = families.configure(config, {**fixed, "spatial_dims": config.spatial_dims}, {})
    model = families.build(config)
    model.load_state_dict(families.adapt_state(state, config), strict=True)
    return model
