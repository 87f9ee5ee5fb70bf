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

from dpot_train.model import DPOTConfig, build_model
from dpot_train.model_setup import checkpoint_config, resize_pos_embed

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


def fit_tensor(key: str, src: torch.Tensor | None, dst: torch.Tensor) -> tuple[torch.Tensor | None, str]:
    """`src` shaped for the model tensor `dst`, or None and the reason it does not fit.

    Equal shapes copy; a 2D block's 1x1 convolution weight (O, I, 1, 1) gains a trailing axis for 3D; a positional
    embedding of the same dimension is resampled to the model's latent grid."""
    if src is None:
        return None, "not in the checkpoint"
    if src.shape == dst.shape:
        return src, ""
    if key.startswith("blocks.") and src.ndim == 4 and dst.ndim == 5 and src.shape == dst.shape[:-1] \
            and dst.shape[-1] == 1:
        return src.unsqueeze(-1), ""
    if key == "pos_embed" and src.ndim == dst.ndim and src.shape[:2] == dst.shape[:2]:
        return resize_pos_embed(src, dst.shape[-1]), ""
    return None, f"{key} is {tuple(src.shape)} in the checkpoint, {tuple(dst.shape)} here"


@torch.no_grad()
def load_components(model: torch.nn.Module, state: dict[str, torch.Tensor], components: list[str]
                    ) -> tuple[list[str], list[str]]:
    """Copy the tensors of `components` from `state` into `model` where the whole component fits.

    Returns (loaded component names, fresh ones, each with why: "not requested" or what did not fit)."""
    target = model.state_dict()
    loaded: list[str] = []
    fresh: list[str] = []
    for name, prefixes in COMPONENTS.items():
        keys = [k for k in target if k.startswith(prefixes)]
        if not keys:
            continue  # the model has no such part (scale_feats without normalize)
        if name not in components:
            fresh.append(f"{name} (not requested)")
            continue
        fitted = {k: fit_tensor(k, state.get(k), target[k]) for k in keys}
        problems = [why for _, why in fitted.values() if why]
        if problems:
            fresh.append(f"{name} (cannot load: {problems[0]})")
            continue
        for k, (value, _) in fitted.items():
            target[k].copy_(value)
        loaded.append(name)
    return loaded, fresh


def finetune_config(config: DPOTConfig, fixed: dict[str, Any], overrides: dict[str, Any]) -> DPOTConfig:
    """The checkpoint's architecture with the fields the data fixes (grid, channels, frames, dimension) and the
    user's model overrides (e.g. patch_size)."""
    return config.replace(**{**fixed, **overrides})


def finetune_model(path: str, fixed: dict[str, Any], load: str | list[str] = "all",
                   overrides: dict[str, Any] | None = None, trusted: bool = False
                   ) -> tuple[torch.nn.Module, str]:
    """A freshly initialised model (seed the torch RNG first) with the checkpoint's `load` components copied in;
    returns it and one line saying what was loaded and what starts fresh."""
    components = parse_components(load)
    state, config = checkpoint_config(path, trusted)
    model = build_model(finetune_config(config, fixed, overrides or {}))
    loaded, fresh = load_components(model, state, components)
    transfer = f" ({config.spatial_dims}D -> {model.config.spatial_dims}D transfer)" \
        if config.spatial_dims != model.config.spatial_dims else ""
    line = (f"--init {path}{transfer}: loaded {', '.join(loaded) or 'nothing'}; "
            f"fresh: {', '.join(fresh) or 'nothing'}")
    return model, line


def recipe_line(init: str | None, recipe: str | None) -> str | None:
    """The line a fine-tune prints before training when it runs under the reference recipe (the default for released
    weights), saying what changes and which option keeps the dpot recipe; None otherwise."""
    if not init or recipe != "reference":
        return None
    return (f"--init {init}: training with the reference recipe (the default for released weights): loss and noise "
            "over every channel and cell, padded channels included; pass --recipe dpot to keep the dpot recipe "
            "(valid channels, fluid cells)")
