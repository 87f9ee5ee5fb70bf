"""The model families a run can train and a checkpoint can hold (DPOT, and the paper's FNO and UNet baselines), behind
one seam: each `Family` says how to build its network from its typed config, how to fit that config to the data, how
to recognise its state dict and infer the config from it, and what its presets are. The trainer, evaluation, export,
`model info` and the checkpoint module use only the functions below; adding a family is one `Family` entry here.

Every network takes (B, *S, T, C) frames: `model(x)` returns the prediction (B, *S, T_out, C),
`model(x, return_logits=True)` the reference's pair (prediction, dataset logits (B, n_cls)). Every config has the
fields the data fixes under the same names (`img_size`, `in_channels`, `out_channels`, `in_timesteps`,
`out_timesteps`, `spatial_dims`, as fields or properties) and `to_dict`/`from_dict`/`replace`; the dict of a
non-DPOT config names its family (`"family": "fno"`), a dict without one is DPOT's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from . import weights
from .config import PRESETS as DPOT_PRESETS
from .config import DPOTConfig
from .factory import build_model as build_dpot
from .family_config import grid_sides
from .fno import FNO2D, FNO3D, FNOConfig
from .unet import UNet, UNetConfig

State = Mapping[str, torch.Tensor]


@dataclass(frozen=True)
class Family:
    """One model family: its typed config, presets and the functions the seam calls."""

    name: str  # as stored in a config dict ("dpot", "fno", "unet")
    label: str  # as printed ("DPOT", "FNO", "UNet")
    config_type: type
    presets: Mapping[str, Any]  # preset name -> config
    signature: str  # a state-dict key that only this family's networks have
    network: Callable[[Any], nn.Module]  # config -> freshly initialised network
    infer: Callable[[State, Mapping[str, Any]], Any]  # state dict (+ saved-argument hints) -> config
    fit: Callable[[Any, Mapping[str, Any], Mapping[str, Any]], Any]  # (config, data fields, user overrides) -> config
    hint_fields: tuple[str, ...] = ()  # saved reference arguments `infer` reads
    free_fields: tuple[str, ...] = ()  # config fields export need not check: not in the weights (the grid, fitted to
    # the data when loaded) or unused by the network (FNO2D's modes3, FNO3D's patch_size)
    adapt: Callable[[State, Any], State] = lambda state, config: state  # weights for a config at another grid
    count: Callable[[Any], int] | None = None  # parameter count without building the network (None: on meta)
    only: dict[str, str] = field(default_factory=dict)  # option -> why it does not apply to this family


# --- DPOT -----------------------------------------------------------------------------------------------------------

def _dpot_fit(config: DPOTConfig, fixed: Mapping[str, Any], overrides: Mapping[str, Any]) -> DPOTConfig:
    return config.replace(**{**fixed, **overrides})


def _dpot_adapt(state: State, config: DPOTConfig) -> State:
    return {**state, "pos_embed": weights.resize_pos_embed(state["pos_embed"], config.latent_grid)}


def _dpot_count(config: DPOTConfig) -> int:
    """Two blocks built on the meta device (no time spent building a depth a typo made huge)."""
    one, two = (sum(p.numel() for p in build_dpot(config.replace(depth=d), device="meta").parameters())
                for d in (1, 2))
    return one + (config.depth - 1) * (two - one)


# --- FNO ------------------------------------------------------------------------------------------------------------

def _data_fields(fixed: Mapping[str, Any], label: str, dims: tuple[int, ...]) -> None:
    """ValueError when the data's dimension or channel counts cannot be expressed by a family."""
    if fixed.get("spatial_dims", dims[0]) not in dims:
        raise ValueError(f"the {label} baseline is {' or '.join(f'{d}D' for d in dims)}; the data is "
                         f"{fixed['spatial_dims']}D")
    if fixed.get("in_channels") != fixed.get("out_channels"):
        raise ValueError(f"the {label} baseline predicts the channels it reads; in_channels {fixed.get('in_channels')}"
                         f" != out_channels {fixed.get('out_channels')}")


def _fno_network(config: FNOConfig) -> nn.Module:
    return FNO3D(config) if config.n_dim == 3 else FNO2D(config)


def _fno_fit(config: FNOConfig, fixed: Mapping[str, Any], overrides: Mapping[str, Any]) -> FNOConfig:
    _data_fields(fixed, "FNO", (2, 3))
    names = {"img_size": "img_size", "in_channels": "n_channels", "in_timesteps": "in_timesteps",
             "out_timesteps": "out_timesteps", "spatial_dims": "n_dim"}
    mapped = {names[k]: v for k, v in fixed.items() if k in names}
    return config.replace(**{**mapped, **overrides})


def _fno_infer(state: State, hints: Mapping[str, Any]) -> FNOConfig:
    """The reference builds FNO2d with out_timesteps=1; n_channels follows from the head, in_timesteps from the
    embedding; the grid (not in the weights) from the saved `res`, else 128."""
    def shape(key: str) -> tuple[int, ...]:
        if key not in state:
            raise weights.CheckpointError(f"not an FNO state dict: missing {key!r}")
        return tuple(state[key].shape)

    if state["spectral_convs.0.weights1"].is_complex():
        return _fno3d_infer(state, hints)
    embed = shape("patch_embed.proj.0.weight")
    spectral = shape("spectral_convs.0.weights1")
    width = shape("fc1.weight")[0]
    out_t = 1
    channels = shape("fc2.weight")[0] // out_t
    flat = embed[1] - 2
    if flat <= 0 or flat % channels:
        raise weights.CheckpointError(f"patch_embed.proj.0.weight has shape {embed}; its second axis should be "
                                      f"n_channels ({channels}) * in_timesteps + 2")
    layers = 0
    while f"spectral_convs.{layers}.weights1" in state:
        layers += 1
    values = dict(modes1=spectral[3], modes2=spectral[4], width=width, img_size=int(hints.get("res", 128)),
                  n_channels=channels, in_timesteps=flat // channels, out_timesteps=out_t, n_layers=layers,
                  patch_size=embed[-1], use_ln="ln_layers.0.weight" in state, normalize="scale_feats.weight" in state,
                  n_cls=shape("cls_head.4.weight")[0])
    try:
        return FNOConfig(**values)
    except (TypeError, ValueError) as exc:
        raise weights.CheckpointError(f"weights imply an invalid FNO config: {exc}") from exc


def _fno3d_infer(state: State, hints: Mapping[str, Any]) -> FNOConfig:
    """The reference's FNO3d: complex spectral weights (in, out, modes1, modes2, modes3), a linear lift `fc0` from
    T*C + 3 inputs; out_timesteps 1, the grid and class count (not in the weights) from saved arguments."""
    for key in ("fc0.weight", "fc2.weight"):
        if key not in state:
            raise weights.CheckpointError(f"not an FNO3d state dict: missing {key!r}")
    spectral = tuple(state["spectral_convs.0.weights1"].shape)
    width, lifted = tuple(state["fc0.weight"].shape)
    channels = int(state["fc2.weight"].shape[0])
    flat = lifted - 3
    if len(spectral) != 5 or flat <= 0 or flat % channels:
        raise weights.CheckpointError(f"fc0.weight has shape {(width, lifted)}; its second axis should be "
                                      f"n_channels ({channels}) * in_timesteps + 3")
    layers = 0
    while f"spectral_convs.{layers}.weights1" in state:
        layers += 1
    values = dict(modes1=spectral[2], modes2=spectral[3], modes3=spectral[4], width=width,
                  img_size=int(hints.get("res", 128)), n_channels=channels, in_timesteps=flat // channels,
                  out_timesteps=1, n_layers=layers, use_ln="ln_layers.0.weight" in state,
                  normalize="scale_feats.weight" in state, n_cls=int(hints.get("n_class", 12)), n_dim=3)
    try:
        return FNOConfig(**values)
    except (TypeError, ValueError) as exc:
        raise weights.CheckpointError(f"weights imply an invalid FNO config: {exc}") from exc


# --- UNet -----------------------------------------------------------------------------------------------------------

def _unet_fit(config: UNetConfig, fixed: Mapping[str, Any], overrides: Mapping[str, Any]) -> UNetConfig:
    _data_fields(fixed, "UNet", (2, 3))
    mapped = {k: v for k, v in fixed.items() if k in ("in_channels", "out_channels", "in_timesteps", "out_timesteps")}
    if "spatial_dims" in fixed:
        mapped["n_dim"] = fixed["spatial_dims"]
    if "img_size" in fixed:
        nd = mapped.get("n_dim", config.n_dim)
        mapped["in_shape"] = mapped["out_shape"] = grid_sides(fixed["img_size"], nd)
    return config.replace(**{**mapped, **overrides})


def _unet_infer(state: State, hints: Mapping[str, Any]) -> UNetConfig:
    """Width and dimension from the first convolution, channels from the last (out_timesteps 1, the channels read
    are the channels predicted); the grid, activation and class count (not in the weights) from saved arguments."""
    if "encoder1.enc1conv1.weight" not in state or "conv.weight" not in state:
        raise weights.CheckpointError("not a UNet state dict: missing 'encoder1.enc1conv1.weight' or 'conv.weight'")
    first = tuple(state["encoder1.enc1conv1.weight"].shape)
    nd = len(first) - 2
    channels = int(state["conv.weight"].shape[0])
    flat = first[1] - nd
    if nd not in (2, 3) or flat <= 0 or flat % channels:
        raise weights.CheckpointError(f"encoder1.enc1conv1.weight has shape {first}; expected (width, "
                                      f"in_channels * in_timesteps + n_dim, 3, 3[, 3])")
    side = (int(hints.get("res", 128)),) * nd
    values = dict(n_dim=nd, in_channels=channels, out_channels=channels, in_timesteps=flat // channels,
                  out_timesteps=1, in_shape=side, out_shape=side, width=first[0], act=str(hints.get("act", "gelu")),
                  n_cls=int(hints.get("n_class", 12)))
    try:
        return UNetConfig(**values)
    except (TypeError, ValueError) as exc:
        raise weights.CheckpointError(f"weights imply an invalid UNet config: {exc}") from exc


# --- the registry ---------------------------------------------------------------------------------------------------

_BASELINE_ONLY = {"load": "names DPOT components; {label} checkpoints load whole (--load all)"}

FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("dpot", "DPOT", DPOTConfig, DPOT_PRESETS, "pos_embed", lambda c: build_dpot(c), weights.infer_config,
           _dpot_fit, hint_fields=weights.HINT_FIELDS, adapt=_dpot_adapt, count=_dpot_count),
    # sizes: docs/model.md, "Baselines" (the paper's FNO 0.5M, FNO-m 7M and UNet 25M, and test-sized ones)
    Family("fno", "FNO", FNOConfig,
           {"fno": FNOConfig(modes1=11, modes2=11, width=16, img_size=128),
            "fno-m": FNOConfig(modes1=20, modes2=20, width=32, img_size=128),
            "fno-tiny": FNOConfig(modes1=4, modes2=4, modes3=4, width=8, n_layers=2, img_size=32)},
           "spectral_convs.0.weights1", _fno_network, _fno_infer, _fno_fit, hint_fields=("res", "n_class"),
           free_fields=("img_size", "n_cls", "modes3", "patch_size"), only=_BASELINE_ONLY),
    Family("unet", "UNet", UNetConfig,
           {"unet": UNetConfig(width=57), "unet-tiny": UNetConfig(width=4, in_shape=(32, 32), out_shape=(32, 32)),
            "unet-small": UNetConfig(width=8, in_shape=(32, 32), out_shape=(32, 32))},
           "encoder1.enc1conv1.weight", UNet, _unet_infer, _unet_fit, hint_fields=("res", "act", "n_class"),
           free_fields=("in_shape", "out_shape", "act", "n_cls"), only=_BASELINE_ONLY),
)}
HINT_FIELDS = tuple(dict.fromkeys(h for f in FAMILIES.values() for h in f.hint_fields))
weights.NETWORKS.extend([FNO2D, FNO3D, UNet])  # so unwrap_model stops at them


def family_of(config: Any) -> Family:
    """The family of a config object."""
    for family in FAMILIES.values():
        if isinstance(config, family.config_type):
            return family
    raise TypeError(f"expected a model config ({', '.join(f.config_type.__name__ for f in FAMILIES.values())}), "
                    f"got {type(config).__name__}")


def preset_names() -> list[str]:
    """Every preset name, family by family."""
    return [name for f in FAMILIES.values() for name in f.presets]


def preset_config(name: str) -> Any:
    """The config of a preset of any family, matched case-insensitively (`ti`, `FNO-m`)."""
    for family in FAMILIES.values():
        for key, config in family.presets.items():
            if key.lower() == str(name).lower():
                return config
    raise KeyError(f"unknown model preset {name!r}; available: {', '.join(preset_names())}")


def config_from_dict(data: Mapping[str, Any]) -> Any:
    """A config from its `to_dict()` form; a dict naming no family is DPOT's."""
    if not isinstance(data, Mapping):
        raise TypeError(f"a model config must be a dict, got {type(data).__name__}")
    name = data.get("family", "dpot")
    family = FAMILIES.get(name) if isinstance(name, str) else None
    if family is None:
        raise ValueError(f"unknown model family {name!r}; known: {', '.join(FAMILIES)}")
    return family.config_type.from_dict(data)


def resolve(preset_or_config: Any, **overrides: Any) -> Any:
    """A config from a preset name, a config or a config dict, with fields replaced by `overrides`."""
    if isinstance(preset_or_config, str):
        config = preset_config(preset_or_config)
    elif isinstance(preset_or_config, Mapping):
        config = config_from_dict(preset_or_config)
    else:
        family_of(preset_or_config)
        config = preset_or_config
    return config.replace(**overrides) if overrides else config


def configure(preset: Any, fixed: Mapping[str, Any], overrides: Mapping[str, Any]) -> Any:
    """A preset (name or config) fitted to the data (`fixed`, in the shared field names) with the user's
    `overrides` (its own family's field names; they win)."""
    config = resolve(preset)
    return family_of(config).fit(config, fixed, overrides)


def build(config: Any, *, device: str | torch.device | None = None) -> nn.Module:
    """Freshly initialised network of `config`'s family; `device='meta'` allocates nothing (for counting/loading)."""
    family = family_of(config)
    if device is None:
        return family.network(config)
    with torch.device(device):
        return family.network(config)


def recognise(state: State) -> Family:
    """The family whose networks have this state dict's keys (DPOT when none does: its errors say what is missing)."""
    for family in FAMILIES.values():
        if family.signature in state:
            return family
    return FAMILIES["dpot"]


def infer_config(state: State, hints: Mapping[str, Any] | None = None) -> Any:
    """The config a state dict's shapes imply (its family recognised from its keys); `hints`: saved arguments."""
    family = recognise(state)
    return family.infer(state, {k: v for k, v in (hints or {}).items() if k in family.hint_fields})


def adapt_state(state: State, config: Any) -> State:
    """Weights of a checkpoint shaped for `config` at another grid (DPOT resamples its positional embedding)."""
    return family_of(config).adapt(state, config)


def lost_in_export(config: Any, state: State) -> list[str]:
    """The architecture fields a bare state dict cannot say back (the released format stores no config)."""
    family = family_of(config)
    inferred = family.infer(state, {}).to_dict()
    return sorted(k for k, v in config.to_dict().items()
                  if k not in family.free_fields and inferred.get(k) != v)


def parameter_count(config: Any) -> int:
    """Parameter count of `config`'s network, without allocating its weights."""
    family = family_of(config)
    if family.count is not None:
        return family.count(config)
    return sum(p.numel() for p in build(config, device="meta").parameters())


def model_label(config: Any) -> str:
    """The network's name with its dimension: DPOT2D, DPOT3D, FNO2D, UNet2D, UNet3D."""
    return f"{family_of(config).label}{config.spatial_dims}D"


def size_name(config: Any) -> str:
    """The preset this config is, up to the fields the data fixes ("custom" when none)."""
    family = family_of(config)
    fixed = {"img_size": config.img_size, "in_channels": config.in_channels, "out_channels": config.out_channels,
             "in_timesteps": config.in_timesteps, "out_timesteps": config.out_timesteps,
             "spatial_dims": config.spatial_dims}
    for name, preset in family.presets.items():
        try:
            if family.fit(preset, fixed, {}) == config:
                return name
        except ValueError:
            continue
    return "custom"


def summary(config: Any) -> dict[str, Any]:
    """What names a network in reports: its label, family, size (preset or "custom") and parameter count."""
    return {"model": model_label(config), "family": family_of(config).name, "size": size_name(config),
            "parameters": parameter_count(config)}


def weights_fix_grid(config: Any) -> bool:
    """Whether the weights fix the grid (DPOT's positional embedding); the baselines' run on the data's."""
    return "img_size" not in family_of(config).free_fields and "in_shape" not in family_of(config).free_fields


def not_applicable(config: Any, option: str) -> str | None:
    """One line saying why a DPOT-only option does not apply to `config`'s family (None when it does)."""
    family = family_of(config)
    why = family.only.get(option)
    return why.format(label=family.label) if why else None


