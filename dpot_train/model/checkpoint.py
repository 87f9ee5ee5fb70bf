"""Safe loading of released DPOT checkpoints and of our own, with the config inferred from the weights.

Released format: a torch pickle holding a dict whose `model` entry is the state dict (keys possibly prefixed
`module.`), optionally beside saved arguments (`args`, an argparse.Namespace) and optimizer state.
Our trainer's format: the same dict with a `config` entry (`DPOTConfig.to_dict()`).
Every file we write has a sha256 record beside it (`step-00000042.pt.sha256`, `sha256sum -c` reads it): torch does
not check the CRCs of a zip's tensor records, so without it a flipped bit in the weights loads as good. A record, when
present, is checked on every read; released files have none and load as before.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import pickle
import re
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from .base import DPOTBase
from .config import DPOTConfig
from .factory import build_model

# Python types that released checkpoints hold besides tensors and containers (the saved training arguments).
SAFE_GLOBALS: list[Any] = [argparse.Namespace]
# Config fields that the weights cannot reveal; taken from saved arguments when present.
_HINT_FIELDS = ("modes", "modes_z", "act")
_WRAPPER_PREFIXES = ("module.", "_orig_mod.")


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded: unsafe content, wrong layout, or weights that do not fit the model."""


def strip_module_prefix(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Remove the `module.` (DDP) and `_orig_mod.` (torch.compile) prefixes when every key carries them."""
    out = dict(state_dict)
    changed = True
    while changed and out:
        changed = False
        for prefix in _WRAPPER_PREFIXES:
            if all(k.startswith(prefix) for k in out):
                out = {k[len(prefix):]: v for k, v in out.items()}
                changed = True
    return out


RECORD_SUFFIX = ".sha256"
_HEX = re.compile(r"^[0-9a-f]{64}$")


def record_path(path: str | Path) -> Path:
    """The sha256 record of a checkpoint: its name plus `.sha256`."""
    path = Path(path)
    return path.with_name(path.name + RECORD_SUFFIX)


def record_text(digest: str, path: str | Path) -> bytes:
    """A record's content, in `sha256sum` format."""
    return f"{digest}  {Path(path).name}\n".encode()


def file_sha256(path: str | Path) -> str:
    """Hex sha256 of a file, read in 4 MiB blocks."""
    with open(path, "rb") as fh:
        return _sha256_of(fh)


def _sha256_of(fh: Any) -> str:
    h = hashlib.sha256()
    while block := fh.read(4 << 20):
        h.update(block)
    return h.hexdigest()


def check_regular_file(path: Path) -> None:
    """FileNotFoundError unless `path` is a regular file (a FIFO or device would block or never end a read)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        raise FileNotFoundError(f"checkpoint not found: {path}") from None
    if not stat.S_ISREG(mode):
        raise CheckpointError(f"{path}: expected a checkpoint file, found something else (a folder, FIFO or device)")


def verify_record(path: Path, fh: Any = None) -> None:
    """Check the file (read through `fh` when given, from its start) against its sha256 record when it has one;
    CheckpointError naming both files otherwise."""
    record = record_path(path)
    if not record.exists():
        return
    try:
        check_regular_file(record)
        expected = record.read_bytes()[:200].decode("ascii", "replace").split(maxsplit=1)[:1]
    except (OSError, CheckpointError) as exc:
        raise CheckpointError(f"{record}: the checkpoint's sha256 record cannot be read ({exc})") from None
    if not expected or not _HEX.match(expected[0]):
        raise CheckpointError(f"{record}: expected a sha256 record (64 hex digits and the file name)")
    actual = file_sha256(path) if fh is None else _sha256_of(fh)
    if actual != expected[0]:
        raise CheckpointError(f"{path}: damaged: its sha256 {actual[:16]}... differs from the one recorded when it "
                              f"was written ({record.name}: {expected[0][:16]}...)")


def _read(path: Path, map_location: Any, trusted: bool) -> Any:
    """torch.load with weights_only (plus SAFE_GLOBALS) unless the caller trusts the file, after checking that it is a
    regular file and that it matches its sha256 record (when it has one)."""
    check_regular_file(path)
    with open(path, "rb") as fh:  # one open: the record check and the load read the same file
        verify_record(path, fh)
        fh.seek(0)
        return _load(fh, path, map_location, trusted)


def _load(fh: Any, path: Path, map_location: Any, trusted: bool) -> Any:
    """torch.load of an open checkpoint file; CheckpointError naming `path` for unsafe or unreadable content."""
    try:
        if trusted:
            return torch.load(fh, map_location=map_location, weights_only=False)
        with torch.serialization.safe_globals(SAFE_GLOBALS):
            return torch.load(fh, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
        if "weights only" not in text.lower():
            raise CheckpointError(f"{path}: not a readable torch checkpoint: {text.strip()[:300]}") from exc
        found = sorted(set(re.findall(r"GLOBAL ([\w.]+)", text)))
        what = f" (found {', '.join(found)})" if found else f" ({text.strip().splitlines()[-1][:300]})" if text.strip() else ""
        raise CheckpointError(
            f"{path}: refused to load: the file holds Python objects outside the allowed set (tensors, containers, "
            f"numbers, strings, argparse.Namespace){what}. Load it with trusted=True "
            "(CLI: --trust) only if you trust its origin."
        ) from exc
    except Exception as exc:  # torch.load raises many types on corrupt input (IndexError, EOFError, RuntimeError ...)
        raise CheckpointError(f"{path}: not a readable torch checkpoint ({type(exc).__name__}: {exc})") from exc


def read_checkpoint(path: str | Path, *, map_location: Any = "cpu", trusted: bool = False) -> Any:
    """The whole content of a checkpoint file, read safely and checked against its record (see `_read`)."""
    return _read(Path(path), map_location, trusted)


def _is_state_dict(obj: Any) -> bool:
    return isinstance(obj, Mapping) and bool(obj) and all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items()
    )


def load_state_dict_file(
    path: str | Path, *, map_location: Any = "cpu", trusted: bool = False
) -> tuple[dict[str, torch.Tensor], dict[str, Any] | None, dict[str, Any]]:
    """Read a checkpoint safely -> (state dict without wrapper prefixes, our config dict or None, config hints)."""
    path = Path(path)
    return parse_checkpoint(_read(path, map_location, trusted), path)


def parse_checkpoint(obj: Any, path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, Any] | None,
                                                          dict[str, Any]]:
    """The content of a checkpoint file already read (`read_checkpoint`) -> (state dict without wrapper prefixes, our
    config dict or None for the released format, config hints from saved arguments); `path` names it in errors."""
    if isinstance(obj, Mapping) and "model" in obj:
        state = obj["model"]
        if not _is_state_dict(state):
            raise CheckpointError(f"{path}: entry 'model' is not a state dict (a mapping of names to tensors), "
                                  f"got {type(state).__name__}")
    elif _is_state_dict(obj):
        state = obj
    else:
        keys = sorted(map(str, obj.keys()))[:20] if isinstance(obj, Mapping) else None
        raise CheckpointError(f"{path}: expected a dict with a 'model' entry holding the state dict; "
                              f"got {type(obj).__name__}" + (f" with keys {keys}" if keys is not None else ""))
    config = obj.get("config") if isinstance(obj, Mapping) else None
    if config is not None and not isinstance(config, Mapping):
        raise CheckpointError(f"{path}: entry 'config' must be a dict (DPOTConfig.to_dict()), got {type(config).__name__}")
    hints: dict[str, Any] = {}
    args = obj.get("args") if isinstance(obj, Mapping) else None
    if args is not None:
        values = vars(args) if isinstance(args, argparse.Namespace) else args if isinstance(args, Mapping) else {}
        hints = {k: values[k] for k in _HINT_FIELDS if k in values}
    return strip_module_prefix(state), (dict(config) if config is not None else None), hints


def _shape(state: Mapping[str, torch.Tensor], key: str) -> tuple[int, ...]:
    return tuple(state[key].shape)


def _mlp_ratio(hidden: int, dim: int) -> float:
    """Ratio r with int(dim * r) == hidden (the reference's rounding), robust to float error."""
    ratio = hidden / dim
    while int(dim * ratio) < hidden:
        ratio = math.nextafter(ratio, math.inf)
    return ratio


def infer_config(state_dict: Mapping[str, torch.Tensor], hints: Mapping[str, Any] | None = None) -> DPOTConfig:
    """DPOTConfig from the tensor shapes of a DPOT state dict; `modes`/`modes_z`/`act` come from hints or defaults."""
    required = ["pos_embed", "patch_embed.proj.0.weight", "time_agg_layer.w", "out_layer.0.weight",
                "out_layer.4.weight", "cls_head.4.weight", "blocks.0.filter.w1", "blocks.0.mlp.0.weight"]
    missing = [k for k in required if k not in state_dict]
    if missing:
        raise CheckpointError(f"not a DPOT state dict: missing {missing} (found {len(state_dict)} keys, "
                              f"e.g. {sorted(state_dict)[:5]})")
    pos = _shape(state_dict, "pos_embed")
    nd = len(pos) - 2
    if nd not in (2, 3) or len(set(pos[2:])) != 1:
        raise CheckpointError(f"pos_embed has shape {pos}; expected (1, D, n, n) or (1, D, n, n, n)")
    dim, latent = pos[1], pos[2]
    patch_w = _shape(state_dict, "patch_embed.proj.0.weight")
    patch = patch_w[-1]
    in_channels = patch_w[1] - (nd + 1)
    hidden = patch_w[0] - (nd + 1)
    if hidden <= 0 or hidden % patch:
        raise CheckpointError(f"patch_embed.proj.0.weight has shape {patch_w}; its first axis should be "
                              f"out_channels * patch_size + {nd + 1}")
    out_channels = hidden // patch
    out_total = _shape(state_dict, "out_layer.4.weight")[0]
    if out_total % out_channels:
        raise CheckpointError(f"out_layer.4.weight has {out_total} outputs, not a multiple of out_channels {out_channels}")
    depth = 0
    while f"blocks.{depth}.norm1.weight" in state_dict:
        depth += 1
    w1 = _shape(state_dict, "blocks.0.filter.w1")
    values: dict[str, Any] = dict(
        img_size=latent * patch,
        patch_size=patch,
        in_channels=in_channels,
        out_channels=out_channels,
        in_timesteps=_shape(state_dict, "time_agg_layer.w")[0],
        out_timesteps=out_total // out_channels,
        n_blocks=w1[1],
        embed_dim=dim,
        out_layer_dim=_shape(state_dict, "out_layer.0.weight")[1],
        depth=depth,
        mlp_ratio=_mlp_ratio(_shape(state_dict, "blocks.0.mlp.0.weight")[0], dim),
        n_cls=_shape(state_dict, "cls_head.4.weight")[0],
        normalize="scale_feats_mu.weight" in state_dict,
        time_agg="exp_mlp" if "time_agg_layer.gamma" in state_dict else "mlp",
        spatial_dims=nd,
    )
    for key, value in (hints or {}).items():
        if key in _HINT_FIELDS:
            values[key] = value
    try:
        return DPOTConfig(**values)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"weights imply an invalid DPOT config: {exc}") from exc


def load_weights(model: DPOTBase, state_dict: Mapping[str, torch.Tensor], source: str = "state dict") -> None:
    """Strict load with one clear error listing missing, unexpected and mis-shaped keys."""
    expected = model.state_dict()
    missing = [k for k in expected if k not in state_dict]
    unexpected = [k for k in state_dict if k not in expected]
    mis_shaped = [
        f"{k}: checkpoint {tuple(state_dict[k].shape)} vs model {tuple(v.shape)}"
        for k, v in expected.items()
        if k in state_dict and tuple(state_dict[k].shape) != tuple(v.shape)
    ]
    if missing or unexpected or mis_shaped:
        parts = []
        if missing:
            parts.append(f"missing keys {missing}")
        if unexpected:
            parts.append(f"unexpected keys {unexpected}")
        if mis_shaped:
            parts.append(f"shape mismatches {mis_shaped}")
        raise CheckpointError(f"{source} does not fit the DPOT model: " + "; ".join(parts))
    on_meta = any(p.device.type == "meta" for p in expected.values())
    if on_meta:
        # Take the checkpoint tensors as the parameters (no second copy), cast to each parameter's dtype.
        cast = {k: state_dict[k].to(dtype=v.dtype).contiguous() for k, v in expected.items()}
        model.load_state_dict(cast, strict=True, assign=True)
    else:
        model.load_state_dict(state_dict, strict=True)


def unwrap_model(model: Any) -> DPOTBase:
    """The DPOT module inside DistributedDataParallel (`.module`) and torch.compile (`._orig_mod`) wrappers."""
    while not isinstance(model, DPOTBase):
        inner = getattr(model, "_orig_mod", None) or getattr(model, "module", None)
        if inner is None:
            raise TypeError(f"expected a DPOT model (possibly wrapped), got {type(model).__name__}")
        model = inner
    return model


def load_pretrained(path: str | Path, *, map_location: Any = "cpu", trusted: bool = False) -> DPOTBase:
    """DPOT2D/DPOT3D with the weights of `path`; its config comes from the checkpoint (ours) or the weights (released)."""
    return pretrained_from(*load_state_dict_file(path, map_location="cpu", trusted=trusted), source=str(path),
                           map_location=map_location)


def pretrained_from(state: Mapping[str, torch.Tensor], config_dict: dict[str, Any] | None, hints: dict[str, Any],
                    *, source: str, map_location: Any = "cpu") -> DPOTBase:
    """`load_pretrained` for a checkpoint already read and parsed (`parse_checkpoint`)."""
    path = source
    if config_dict is not None:
        try:
            config = DPOTConfig.from_dict(config_dict)
        except (TypeError, ValueError) as exc:
            raise CheckpointError(f"{path}: entry 'config' is not a valid DPOTConfig: {exc}") from exc
    else:
        try:
            config = infer_config(state, hints)
        except CheckpointError as exc:
            raise CheckpointError(f"{path}: {exc}") from exc
    model = build_model(config, device="meta")  # no random initialisation: every tensor comes from the file
    load_weights(model, state, source=str(path))
    return model.to(map_location) if map_location is not None else model


def checkpoint_payload(model: Any, **extra: Any) -> dict[str, Any]:
    """Dict in our checkpoint format: {'model': state dict (unwrapped, no prefixes), 'config': config dict, **extra}."""
    if "model" in extra or "config" in extra:
        raise ValueError("'model' and 'config' are reserved checkpoint keys")
    core = unwrap_model(model)
    return {"model": core.state_dict(), "config": core.config.to_dict(), **extra}


def export_released(src: str | Path, dst: str | Path) -> DPOTConfig:
    """Write the weights of one of our checkpoints in the released format, a bare {'model': state_dict} (what the
    reference code and `--init`/`evaluate` take as released weights); returns the config the weights imply.

    Refused when the bare weights would not say the architecture back (a field only our config records)."""
    state, config_dict, _ = load_state_dict_file(src)
    if config_dict is None:
        raise CheckpointError(f"{src}: already in the released format (no 'config' entry); nothing to export")
    config = DPOTConfig.from_dict(config_dict)
    inferred = infer_config(state)
    lost = sorted(k for k, v in config.to_dict().items() if inferred.to_dict().get(k) != v)
    if lost:
        said = ", ".join(f"{k}={inferred.to_dict().get(k)}" for k in lost)
        raise CheckpointError(f"{src}: the released format cannot record {', '.join(lost)} of this model "
                              f"(the weights alone say {said})")
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.tmp")
    torch.save({"model": state}, tmp)
    tmp.replace(dst)
    return config
