"""Fine-tuning from a checkpoint as the reference does it: load named components, the rest starts fresh.

The component names are the reference's (thu-ml/DPOT utils/utilities.py `load_components_from_pretrained` and
`load_3d_components_from_2d`): `all`, or any of patch_embed, pos, blocks, time_agg, cls_head, scale_feats, out.
A component loads whole or not at all; one that cannot load (another channel count, patch size or dimension)
keeps its fresh initialisation and the summary line says why. A 2D checkpoint in a 3D model gets the reference's
2D -> 3D transfer: the blocks' 1x1 convolution weights gain a trailing axis (as `transfer_2d_to_3d`).
"""

from __future__ import annotations

from typing import Any

import torch

from dpot_train.model import CheckpointError, DPOTConfig, build_model, families, load_weights
from dpot_train.model.family_config import grid_text
from dpot_train.core.model_setup import checkpoint_config, resize_pos_embed

# component -> key prefixes of the state dict, in the order the summary lists them
COMPONENTS: dict[str, tuple[str, ...]] = {
    "patch_embed": ("patch_embed.",), "pos": ("pos_embed",), "blocks": ("blocks.",),
    "time_agg": ("time_agg_layer.",), "cls_head": ("cls_head.",),
    "scale_feats": ("scale_feats_mu.", "scale_feats_sigma."), "out": ("out_layer.",),
}
ALIASES = {"patch": "patch_embed"}  # the reference's docstring says "patch"; its code checks "patch_embed"


def parse_components(value: str | list[str]) -> list[str]:
    """`all`, a comma-separated string or a list of component names -> the components, in COMPONENTS order."""
    names = [n.strip() for n in (value.split(",") if isinstance(value, str) else value) if str(n).strip()]
    names = [ALIASES.get(n, n) for n in names]
    unknown = [n for n in names if n != "all" and n not in COMPONENTS]
    if unknown or not names:
        raise ValueError(f"--load {value!r}: expected all, or a comma-separated list of {', '.join(COMPONENTS)}"
                         + (f" (unknown: {', '.join(unknown)})" if unknown else ""))
    return list(COMPONENTS) if "all" in names else [c for c in COMPONENTS if c in names]


def fit_problem(key: str, src: tuple[int, ...] | None, dst: tuple[int, ...]) -> str:
    """Why a checkpoint tensor of shape `src` (None: absent) cannot fill the model tensor of shape `dst`; "" when it
    can (see fit_tensor). Shapes alone decide, so a launch checks this before any weight is copied."""
    src, dst = (tuple(src) if src is not None else None), tuple(dst)
    if src is None:
        return "not in the checkpoint"
    if src == dst:
        return ""
    if key.startswith("blocks.") and len(src) == 4 and len(dst) == 5 and src == dst[:-1] and dst[-1] == 1:
        return ""
    if key == "pos_embed" and len(src) == len(dst) and src[:2] == dst[:2]:
        return ""
    return f"{key} is {src} in the checkpoint, {dst} here"


def fit_tensor(key: str, src: torch.Tensor | None, dst: torch.Tensor) -> tuple[torch.Tensor | None, str]:
    """`src` shaped for the model tensor `dst`, or None and the reason it does not fit.

    Equal shapes copy; a 2D block's 1x1 convolution weight (O, I, 1, 1) gains a trailing axis for 3D; a positional
    embedding of the same dimension is resampled to the model's latent grid."""
    problem = fit_problem(key, src.shape if src is not None else None, dst.shape)
    if problem or src is None:
        return None, problem
    if src.shape == dst.shape:
        return src, ""
    if key == "pos_embed":
        return resize_pos_embed(src, tuple(dst.shape[2:])), ""
    return src.unsqueeze(-1), ""


def plan_components(target: dict[str, Any], state: dict[str, Any], components: list[str]
                    ) -> tuple[list[str], list[str]]:
    """Which components of the model state `target` the checkpoint `state` fills (tensors, or anything with a
    `.shape`: the model may live on the meta device): (loaded names, fresh ones each with why)."""
    loaded: list[str] = []
    fresh: list[str] = []
    for name, prefixes in COMPONENTS.items():
        keys = [k for k in target if k.startswith(prefixes)]
        if not keys:
            continue  # the model has no such part (scale_feats without normalize)
        if name not in components:
            fresh.append(f"{name} (not requested)")
            continue
        problems = [why for k in keys if (why := fit_problem(k, state[k].shape if k in state else None,
                                                             target[k].shape))]
        if problems:
            fresh.append(f"{name} (cannot load: {problems[0]})")
            continue
        loaded.append(name)
    return loaded, fresh


def check_components(path: str, state: dict[str, torch.Tensor], config: Any, fixed: dict[str, Any],
                     load: str | list[str], overrides: dict[str, Any] | None = None) -> None:
    """Before torchrun: ValueError when none of the components `load` names can load into the run's model (built on
    the meta device, no memory), as the reference's strict load would stop, instead of training from scratch."""
    components = parse_components(load)
    if not isinstance(config, DPOTConfig):  # a baseline (FNO, UNet) loads whole: only `--load all` applies
        _baseline_config(config, fixed, components, overrides or {})
        return
    model = build_model(finetune_config(config, fixed, overrides or {}), device="meta")
    loaded, fresh = plan_components(model.state_dict(), state, components)
    if not loaded:
        why = "; ".join(f for f in fresh if not f.endswith("(not requested)")) or "the model has none of them"
        raise ValueError(f"--init {path}: nothing of --load {load if isinstance(load, str) else ','.join(load)} "
                         f"can load into this run's model: {why}; the run would train from scratch (choose "
                         "components that fit, or data of the checkpoint's channels, frames and dimension)")


@torch.no_grad()
def load_components(model: torch.nn.Module, state: dict[str, torch.Tensor], components: list[str]
                    ) -> tuple[list[str], list[str]]:
    """Copy the tensors of `components` from `state` into `model` where the whole component fits.

    Returns (loaded component names, fresh ones, each with why: "not requested" or what did not fit)."""
    target = model.state_dict()
    loaded, fresh = plan_components(target, state, components)
    for name in loaded:
        for k in [k for k in target if k.startswith(COMPONENTS[name])]:
            target[k].copy_(fit_tensor(k, state.get(k), target[k])[0])
    return loaded, fresh


def finetune_config(config: DPOTConfig, fixed: dict[str, Any], overrides: dict[str, Any]) -> DPOTConfig:
    """The checkpoint's architecture with the fields the data fixes (grid, channels, frames, dimension) and the
    user's model overrides (e.g. patch_size)."""
    return config.replace(**{**fixed, **overrides})


def finetune_model(path: str, fixed: dict[str, Any], load: str | list[str] = "all",
                   overrides: dict[str, Any] | None = None, trusted: bool = False, sha256: str | None = None
                   ) -> tuple[torch.nn.Module, str]:
    """A freshly initialised model (seed the torch RNG first) with the checkpoint's `load` components copied in;
    returns it and one line saying what was loaded and what starts fresh. `sha256`: the digest launch recorded (the
    file the workers load is the one launch checked)."""
    components = parse_components(load)
    state, config = checkpoint_config(path, trusted, sha256=sha256)
    if not isinstance(config, DPOTConfig):  # a baseline (FNO, UNet): its weights load whole
        return _whole_model(path, state, config, fixed, components, overrides or {})
    model = build_model(finetune_config(config, fixed, overrides or {}))
    loaded, fresh = load_components(model, state, components)
    transfer = f" ({config.spatial_dims}D -> {model.config.spatial_dims}D transfer)" \
        if config.spatial_dims != model.config.spatial_dims else ""
    resampled = pos_resampled(tuple(state["pos_embed"].shape[2:]), model.config) if "pos" in loaded else ""
    line = (f"--init {path}{transfer}: loaded {', '.join(loaded) or 'nothing'}; "
            f"fresh: {', '.join(fresh) or 'nothing'}{resampled}")
    return model, line


def pos_resampled(latent: tuple[int, ...], config: DPOTConfig) -> str:
    """The summary's note that the checkpoint's positional embedding (latent grid `latent`) was resampled to the
    model's latent grid, and how (bicubic 2D, trilinear 3D); "" when it fits as it is."""
    if latent == config.latent_grid:
        return ""
    return (f"; pos_embed resampled {'bicubic' if len(latent) == 2 else 'trilinear'} from the checkpoint's "
            f"{grid_text(latent)} latent grid to {grid_text(config.latent_grid)} (the {grid_text(config.grid)} grid "
            f"in patches of {config.patch_size})")


def _baseline_config(config: Any, fixed: dict[str, Any], components: list[str],
                     overrides: dict[str, Any]) -> Any:
    """A baseline checkpoint's config fitted to the data (e.g. its modes fit the grid); CheckpointError unless `--load`
    asks for everything (its components are DPOT's), checked before torchrun and again in the workers."""
    if components != list(COMPONENTS):
        raise CheckpointError(f"--load {','.join(components)}: {families.not_applicable(config, 'load')}")
    return families.configure(config, fixed, overrides)


def _whole_model(path: str, state: dict[str, torch.Tensor], config: Any, fixed: dict[str, Any],
                 components: list[str], overrides: dict[str, Any]) -> tuple[torch.nn.Module, str]:
    """A baseline's --init: every weight loads (the components are DPOT's), fitted to the data grid."""
    model = families.build(_baseline_config(config, fixed, components, overrides))
    load_weights(model, families.adapt_state(state, model.config), source=f"--init {path}")
    return model, f"--init {path}: loaded all ({families.model_label(model.config)})"
def recipe_line(init: str | None, recipe: str | None) -> str | None:
    """The line a fine-tune prints before training when it runs under the reference recipe (the default for released
    weights), saying what changes and which option keeps the dpot recipe; None otherwise."""
    if not init or recipe != "reference":
        return None
    return (f"--init {init}: training with the reference recipe (the default for released weights): loss and noise "
            "over every channel and cell, padded channels included; pass --recipe dpot to keep the dpot recipe "
            "(valid channels, fluid cells)")
