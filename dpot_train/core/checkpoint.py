"""Checkpoint files, all in one place: their layouts, safe reading and verifying, atomic writing with a sha256 record,
the released-format export, a model from a file, and a run's `checkpoints/step-XXXXXXXX.pt` folder.

Layouts (each a dict that torch.load(weights_only=True) reads):
- released DPOT weights: `model` (the state dict, keys possibly prefixed `module.`), optionally beside saved
  arguments (`args`, an argparse.Namespace) and optimizer state;
- our model payload: the same plus `config` (the model config's `to_dict()`; a baseline's names its family), so the
  architecture is not inferred;
- a training checkpoint: our model payload plus the format tag and everything an exact resume needs: optimizer,
  scheduler, step, the loader position, every rank's RNG states (as tensors and lists) and the run config.
- safetensors weights (`model export --out W.safetensors`): the released format's tensors with `recipe` and
  `normalization` (JSON) in the file's metadata; read without any code execution, so no trust is needed.
Every file we write has a sha256 record beside it (`step-00000042.pt.sha256`, `sha256sum -c` reads it): torch does
not check the CRCs of a zip's tensor records, so without it a flipped bit in the weights loads as good. A record, when
present, is checked on every read; released files have none and load as before.
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import json
import os
import pickle
import random
import re
import stat
import warnings
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dpot_format.io import atomic_path, atomic_write, fsync_dir
from dpot_train.integrations.hub import local_file
from dpot_train.model import CheckpointError, families, load_weights, strip_module_prefix, unwrap_model
from dpot_train.model.families import HINT_FIELDS

FORMAT = "dpot-train-checkpoint/1"
# Python types that released checkpoints hold besides tensors and containers (the saved training arguments).
SAFE_GLOBALS: list[Any] = [argparse.Namespace]
RECORD_SUFFIX = ".sha256"
_HEX = re.compile(r"^[0-9a-f]{64}$")
_NAME = re.compile(r"^step-(\d{8})\.pt$")


# --- layouts --------------------------------------------------------------------------------------------------------

def released_payload(state: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """The released format: a bare {'model': state_dict}."""
    return {"model": state}


def model_payload(model: Any) -> dict[str, Any]:
    """Our model layout: the released format's `model` (unwrapped, no prefixes) plus `config`, the config dict."""
    core = unwrap_model(model)
    return {**released_payload(core.state_dict()), "config": core.config.to_dict()}


def checkpoint_payload(model: Any, **extra: Any) -> dict[str, Any]:
    """Dict in our checkpoint format: {'model': state dict (unwrapped, no prefixes), 'config': config dict, **extra}."""
    if "model" in extra or "config" in extra:
        raise ValueError("'model' and 'config' are reserved checkpoint keys")
    return {**model_payload(model), **extra}


def training_payload(model: torch.nn.Module, train_config: dict[str, Any], optimizer: Any, scheduler: Any, step: int,
                     loader: dict[str, int], rng: list[dict[str, Any]],
                     trained: dict[str, Any] | None = None) -> dict[str, Any]:
    """The layout of a training checkpoint: the released format's `model` and our `config` (so `load_pretrained` and
    `--init` read it), plus the format tag and everything an exact resume needs; `trained` (data_record): the
    datasets the weights were trained on, which `evaluate` compares its data with."""
    return {"format": FORMAT, **model_payload(model),
            "train_config": train_config, "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
            "step": step, "loader": loader, "rng": rng, **({TRAINED_ON: trained} if trained else {})}


TRAINED_ON = "trained_on"  # the checkpoint entry recording the training data (data_record)


def data_record(datasets: list[Any]) -> dict[str, Any]:
    """What weights were trained on, per dataset name: its channels (names, which are valid) and its stored grid
    (shape, dims, the model's axis order), so that an evaluation on other data can say so (plain JSON values)."""
    return {d.name: {"channels": [str(c) for c in d.channels], "channel_valid": [bool(v) for v in d.channel_valid],
                     "shape": [int(n) for n in d.shape], "dims": [str(x) for x in d.dims],
                     "model_layout": str(d.model_layout)} for d in datasets}


def trained_on(content: Any) -> dict[str, dict[str, Any]] | None:
    """A checkpoint content's record of its training data (data_record), None when it has none (released weights,
    and checkpoints written before the record existed)."""
    record = content.get(TRAINED_ON) if isinstance(content, Mapping) else None
    if not isinstance(record, Mapping) or not all(isinstance(v, Mapping) for v in record.values()):
        return None
    return {str(k): dict(v) for k, v in record.items()}


def stored_config(content: Any) -> Any:
    """A checkpoint content's `config` entry (our model config dict), None for released weights."""
    return content.get("config") if isinstance(content, Mapping) else None


def trained_config(content: Any) -> dict[str, Any]:
    """The run config a checkpoint was trained with (its `train_config`); {} for released weights and files
    without one."""
    train_config = content.get("train_config") if isinstance(content, dict) else None
    return train_config if isinstance(train_config, dict) else {}


def trained_recipe(content: Any) -> str:
    """The recipe a checkpoint's run was trained with, from its content ("dpot" when it names none: released weights
    and runs from before recipes)."""
    return str(trained_config(content).get("recipe") or "dpot")


def weights_recipe(content: Any) -> str:
    """The recipe weights are evaluated with when none is named: the one they were trained with, as their file
    records it (our checkpoint's run config, or the `recipe` entry a `model export` writes beside the weights), so
    that a checkpoint and its export score alike; released weights that record none: "reference" (the paper's
    metric)."""
    if isinstance(content, dict) and content.get("recipe") in ("dpot", "reference"):
        return str(content["recipe"])
    if isinstance(content, dict) and isinstance(content.get("train_config"), dict):
        return trained_recipe(content)
    return "reference"


def trained_res(content: Any) -> int | list[int]:
    """The grid a checkpoint's run resized windows to (its data.res: one side, or one side per stored axis), 0 when
    none or for released weights."""
    data = trained_config(content).get("data")
    res = (data if isinstance(data, dict) else {}).get("res") or 0
    return [int(s) for s in res] if isinstance(res, (list, tuple)) else int(res)


def restore_training(ckpt: dict[str, Any], model: torch.nn.Module, optimizer: Any, scheduler: Any) -> tuple[int, int]:
    """Load a training checkpoint's weights, optimiser and schedule state; (step, stream position) to continue from."""
    model.load_state_dict(ckpt["model"], strict=True)
    optimizer.load_state_dict(ckpt["optimizer"])
    scheduler.load_state_dict(ckpt["scheduler"])
    return int(ckpt["step"]), int(ckpt["loader"]["position"])


def rng_states(ckpt: dict[str, Any]) -> list[dict[str, Any]]:
    """Every rank's RNG states saved in a training checkpoint (`rng_state()` of each rank, in rank order)."""
    return ckpt["rng"]


# --- the sha256 record and file checks ------------------------------------------------------------------------------

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


def _is_regular(path: Path) -> bool:
    """Whether `path` is a regular file (OSError when it cannot be stat'ed); a FIFO or device is never opened."""
    return stat.S_ISREG(os.stat(path).st_mode)


def check_regular_file(path: Path) -> None:
    """FileNotFoundError unless `path` is a regular file (a FIFO or device would block or never end a read); a
    missing file of a run's checkpoints folder is explained (missing_checkpoint)."""
    try:
        regular = _is_regular(path)
    except OSError:
        raise FileNotFoundError(missing_checkpoint(path)) from None
    if not regular:
        raise CheckpointError(f"{path}: expected a checkpoint file, found something else (a folder, FIFO or device)")


def _run_of(ckpt_dir: Path) -> dict[str, Any] | None:
    """The run config (config.yaml beside `ckpt_dir`, as plain YAML) when `ckpt_dir` is a run's checkpoints folder."""
    if ckpt_dir.name != "checkpoints":
        return None
    try:
        import yaml

        config = yaml.safe_load((ckpt_dir.parent / "config.yaml").read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError):
        return None
    return config if isinstance(config, dict) else None


def missing_checkpoint(path: str | Path) -> str:
    """One line for a checkpoint file that does not exist: in a run's checkpoints folder, why (pruned, set aside as
    damaged, a best.pt the run never wrote) and which checkpoints exist beside it; elsewhere `checkpoint not found`."""
    path = Path(path)
    folder = path.parent
    run = _run_of(folder)
    if run is None and not (folder.is_dir() and (list_checkpoints(folder) or path.name == "best.pt")):
        return f"checkpoint not found: {path}"
    present = [p.name for _, p in list_checkpoints(folder)] + (["best.pt"] if (folder / "best.pt").is_file() else [])
    beside = f"; beside it: {', '.join(present)}" if present else "; the folder holds no checkpoint"
    aside = sorted(n for n in (os.listdir(folder) if folder.is_dir() else []) if n.startswith(f"{path.name}.damaged")
                   and not n.endswith(RECORD_SUFFIX))
    if aside:
        why = f"it was set aside as damaged ({aside[-1]})"
    elif path.name == "best.pt":
        every = int((run or {}).get("eval_every") or 0)
        newest = max((step for step, _ in list_checkpoints(folder)), default=0)
        why = ("the run had no --eval-every, so it keeps no best.pt" if run is not None and every <= 0 else
               "best.pt is written by a run with --eval-every" if every <= 0 or (folder / "best.json").exists() else
               f"no validation finished yet (--eval-every {every}: the first at step {every})" if newest < every else
               f"no validation of the run wrote one (--eval-every {every}; did its data have a 'valid' split?)")
    elif _NAME.match(path.name):
        keep = (run or {}).get("keep_checkpoints")
        why = (f"pruned? a run keeps its newest {keep} checkpoints (keep_checkpoints)" if isinstance(keep, int)
               and keep > 0 else "pruned? a run keeps only its newest checkpoints (keep_checkpoints)")
    else:
        why = "no such checkpoint"
    return f"{path}: no such file: {why}{beside}"


def check_sha256_option(value: str | None, option: str = "--sha256") -> str | None:
    """A sha256 given by the user, lower-cased; ValueError naming `option` unless it is 64 hex digits."""
    if value is None:
        return None
    text = value.strip().lower()
    if not _HEX.match(text):
        raise ValueError(f"{option} {value!r}: expected the file's sha256, 64 hex digits (as `sha256sum` prints it)")
    return text


def verify_sha256(path: Path, expected: str, fh: Any = None) -> None:
    """Check the file (read through `fh` when given, from its start) against a sha256 the user gave (--sha256) or the
    run recorded; CheckpointError naming the file otherwise. The released format carries no record of its own."""
    actual = file_sha256(path) if fh is None else _sha256_of(fh)
    if actual != expected:
        raise CheckpointError(f"{path}: damaged or another file: its sha256 is {actual}, expected {expected} "
                              "(--sha256, or the run's record of its --init)")


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


# --- reading --------------------------------------------------------------------------------------------------------

def _read(path: Path, map_location: Any, trusted: bool, sha256: str | None = None,
          digest_out: list[str] | None = None) -> Any:
    """torch.load with weights_only (plus SAFE_GLOBALS) unless the caller trusts the file, after checking that it is a
    regular file and that it matches its sha256 record (when it has one) and `sha256` (when given); `digest_out`
    receives the file's sha256, taken in the same open."""
    check_regular_file(path)
    with open(path, "rb") as fh:  # one open: the record check and the load read the same file
        verify_record(path, fh)
        if digest_out is not None:
            fh.seek(0)
            digest_out.append(hashlib.file_digest(fh, "sha256").hexdigest())
        if sha256 is not None:
            fh.seek(0)
            verify_sha256(path, sha256, fh)
        fh.seek(0)
        if is_safetensors(fh):
            return _read_safetensors(path)
        fh.seek(0)
        not_torch = not_a_torch_file(fh)
        if not_torch:  # before torch.load: its refusal would suggest --trust for a file that is no checkpoint
            raise CheckpointError(f"{path}: not a checkpoint: {not_torch}, expected a file written by torch.save "
                                  "(a zip archive holding data.pkl, or its legacy pickle format)")
        fh.seek(0)
        return _load(fh, path, map_location, trusted)


SAFETENSORS_SUFFIX = ".safetensors"
_SAFETENSORS_META = ("recipe", "normalization", "trained_on")  # what a released export records beside the tensors


def is_safetensors(fh: Any) -> bool:
    """Whether the open file starts as a safetensors file: an 8-byte little-endian header length, then a JSON object
    (reads from the current position)."""
    head = fh.read(9)
    return len(head) == 9 and head[8:9] == b"{" and 2 <= int.from_bytes(head[:8], "little") < 100_000_000


def _read_safetensors(path: Path) -> dict[str, Any]:
    """A safetensors file as the released-format payload: {'model': tensors, plus the metadata entries dpot writes
    (`recipe`, `normalization`, `trained_on`)}; CheckpointError naming `path` when the file is damaged."""
    try:
        from safetensors import SafetensorError, safe_open
    except ImportError as exc:  # a dependency of dpot; absent only in a broken install
        raise CheckpointError(f"{path}: reading .safetensors weights needs the safetensors package") from exc
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            state = {k: f.get_tensor(k) for k in f.keys()}
            meta = f.metadata() or {}
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: not a readable safetensors file ({str(exc).strip()[:300]})") from exc
    payload: dict[str, Any] = {"model": state}
    if meta.get("recipe") in ("dpot", "reference"):
        payload["recipe"] = meta["recipe"]
    for key in ("normalization", TRAINED_ON):
        if key in meta:
            try:
                payload[key] = json.loads(meta[key])
            except ValueError as exc:
                raise CheckpointError(f"{path}: metadata {key!r} is not JSON ({exc})") from exc
    return payload


def _safetensors_bytes(payload: Mapping[str, Any]) -> bytes:
    """A released-format payload as safetensors bytes: the tensors (contiguous, shared storage copied), and its
    other entries in the metadata (strings; `normalization` as JSON)."""
    from safetensors.torch import save

    state = {k: v.detach().contiguous().clone() for k, v in payload["model"].items()}
    meta = {k: (payload[k] if isinstance(payload[k], str) else json.dumps(payload[k], sort_keys=True))
            for k in _SAFETENSORS_META if k in payload}
    return save(state, metadata={"format": "pt", **meta})


# leading bytes of files that get passed where a checkpoint is expected, and what they are
_MAGIC = ((b"\x89PNG", "a PNG image"), (b"\x89HDF", "an HDF5 file (NetCDF-4, .h5, .mat v7.3)"),
          (b"CDF\x01", "a NetCDF-3 file"), (b"CDF\x02", "a NetCDF-3 file"), (b"\x93NUMPY", "a NumPy .npy array"),
          (b"\xff\xd8\xff", "a JPEG image"), (b"MATLAB", "a MATLAB .mat file"), (b"\x1f\x8b", "a gzip file"))


# the magic number torch.save's legacy (non-zip) format pickles first (a LONG1 opcode: 10 bytes)
_LEGACY_MAGIC = b"\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19"


def not_a_torch_file(fh: Any) -> str | None:
    """What the open file is when it is not something torch.save writes (None when it is: a zip archive with a
    data.pkl record, or a pickle, which starts with the PROTO opcode 0x80); reads from the current position."""
    head = fh.read(32)
    if head.startswith(b"\x80"):  # a pickle: torch.save's legacy format starts with its magic number
        return None if _LEGACY_MAGIC in head else "a plain Python pickle (written by pickle.dump)"
    if head.startswith(b"PK\x03\x04") or head.startswith(b"PK\x05\x06"):
        fh.seek(0)
        try:
            with zipfile.ZipFile(fh) as z:
                if any(n.endswith("/data.pkl") or n == "data.pkl" for n in z.namelist()):
                    return None
        except (zipfile.BadZipFile, OSError, ValueError):
            return "a damaged zip archive"
        return "a zip archive without the data.pkl record of torch.save"
    for magic, what in _MAGIC:
        if head.startswith(magic):
            return what
    if not head:
        return "an empty file"
    if head.lstrip()[:1] in (b"{", b"["):
        return "JSON text"
    return "text" if all(32 <= b < 127 or b in (9, 10, 13) for b in head) else f"unknown content (starts {head!r})"


def _load(fh: Any, path: Path, map_location: Any, trusted: bool) -> Any:
    """torch.load of an open checkpoint file; CheckpointError naming `path` for unsafe or unreadable content."""
    try:
        with warnings.catch_warnings():  # torch's advice on pickle protocols is no news to the user: our line says it
            warnings.filterwarnings("ignore", message=".*pickle protocol", category=UserWarning)
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


def read_checkpoint(path: str | Path, *, map_location: Any = "cpu", trusted: bool = False,
                    sha256: str | None = None, digest_out: list[str] | None = None) -> Any:
    """The whole content of a checkpoint file, read safely and checked against its record and `sha256` (`_read`);
    `path` may be a Hub reference (dpot:Ti, hf://...: dpot_train.integrations.hub); `digest_out` receives the file's
    sha256."""
    return _read(local_file(path), map_location, trusted, sha256, digest_out)


def _is_state_dict(obj: Any) -> bool:
    return isinstance(obj, Mapping) and bool(obj) and all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items()
    )


def load_state_dict_file(
    path: str | Path, *, map_location: Any = "cpu", trusted: bool = False, sha256: str | None = None,
    digest_out: list[str] | None = None
) -> tuple[dict[str, torch.Tensor], dict[str, Any] | None, dict[str, Any]]:
    """Read a checkpoint safely -> (state dict without wrapper prefixes, our config dict or None, config hints);
    `sha256`: the file's expected digest (checked before it is loaded); `digest_out` receives the file's sha256.
    `path` may be a Hub reference (dpot:Ti, hf://...), read from huggingface_hub's cache
    (dpot_train.integrations.hub)."""
    path = local_file(path)
    return parse_checkpoint(_read(path, map_location, trusted, sha256, digest_out), path)


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
    config = stored_config(obj)
    if config is not None and not isinstance(config, Mapping):
        raise CheckpointError(f"{path}: entry 'config' must be a dict (a model config's to_dict()), got {type(config).__name__}")
    hints: dict[str, Any] = {}
    args = obj.get("args") if isinstance(obj, Mapping) else None
    if args is not None:
        values = vars(args) if isinstance(args, argparse.Namespace) else args if isinstance(args, Mapping) else {}
        hints = {k: values[k] for k in HINT_FIELDS if k in values}
    return strip_module_prefix(state), (dict(config) if config is not None else None), hints


# --- a model from a checkpoint, and the released-format export ------------------------------------------------------

def load_pretrained(path: str | Path, *, map_location: Any = "cpu", trusted: bool = False) -> torch.nn.Module:
    """The network of any checkpoint dpot reads (DPOT 2D/3D, FNO, UNet; released format or ours), in eval mode, with
    the weights of `path` (a file, or a Hub reference: `dpot:Ti`, `hf://OWNER/REPO/FILE[@REVISION]`); its config
    comes from the checkpoint (ours) or the weights (released). `model(x)` gives the prediction,
    `model(x, return_logits=True)` the reference's (prediction, class logits)."""
    return pretrained_from(*load_state_dict_file(path, map_location="cpu", trusted=trusted), source=str(path),
                           map_location=map_location).eval()


def checkpoint_model_config(config_dict: dict[str, Any] | None, state: Mapping[str, torch.Tensor],
                            hints: dict[str, Any], source: str) -> Any:
    """The model config of a parsed checkpoint: its `config` entry (ours), else inferred from the weights (the
    family recognised from the keys); CheckpointError naming `source` when neither works."""
    if config_dict is not None:
        try:
            return families.config_from_dict(config_dict)
        except (TypeError, ValueError) as exc:
            raise CheckpointError(f"{source}: entry 'config' is not a valid model config: {exc}") from exc
    try:
        return families.infer_config(state, hints)
    except CheckpointError as exc:
        raise CheckpointError(f"{source}: {exc}") from exc


def pretrained_from(state: Mapping[str, torch.Tensor], config_dict: dict[str, Any] | None, hints: dict[str, Any],
                    *, source: str, map_location: Any = "cpu") -> torch.nn.Module:
    """`load_pretrained` for a checkpoint already read and parsed (`parse_checkpoint`), left in train mode."""
    config = checkpoint_model_config(config_dict, state, hints, source)
    model = families.build(config, device="meta")  # no random initialisation: every tensor comes from the file
    load_weights(model, state, source=str(source))
    return model.to(map_location) if map_location is not None else model


def export_released(src: str | Path, dst: str | Path, fmt: str | None = None) -> Any:
    """Write the weights of one of our checkpoints in the released format, a bare {'model': state_dict} (what the
    reference code and `--init`/`evaluate` take as released weights); returns the config the weights imply.

    Refused when the bare weights would not say the architecture back (a field only our config records). The run's
    normalisation (its mode and statistics, unless `none`) goes beside the weights as `normalization`
    (dpot_train.core.normalize.export_record): the reference code ignores it, `evaluate` applies it as for the
    checkpoint. `fmt` (`export_format`): a torch file (.pth), or safetensors (the same entries, read without code
    execution). The record of the training data (`trained_on`) goes beside them too, for `evaluate`'s checks."""
    from dpot_format.output import check_file
    from dpot_train.core.normalize import export_record

    check_file(dst, "--out", "dpot_tiny.pth")  # the one output rule, before the checkpoint is read
    check_file(record_path(dst), "--out", "dpot_tiny.pth")  # and the sha256 record written beside it
    content = read_checkpoint(src)
    state, config_dict, _ = parse_checkpoint(content, src)
    if config_dict is None:
        raise CheckpointError(f"{src}: already in the released format (no 'config' entry); nothing to export")
    config = checkpoint_model_config(config_dict, state, {}, str(src))
    lost = families.lost_in_export(config, state)
    if lost:
        inferred = families.infer_config(state).to_dict()
        said = ", ".join(f"{k}={inferred.get(k)}" for k in lost)
        raise CheckpointError(f"{src}: the released format cannot record {', '.join(lost)} of this model "
                              f"(the weights alone say {said})")
    record = export_record(content)
    data = trained_on(content)
    payload = {**released_payload(state), "recipe": trained_recipe(content),  # evaluated as the checkpoint is
               **({"normalization": record} if record else {}), **({TRAINED_ON: data} if data else {})}
    fmt = export_format(dst, fmt)
    if fmt == "safetensors":
        write_atomic_with_record(_safetensors_bytes(payload), Path(dst))
    else:
        save_atomic(payload, Path(dst))  # with its sha256 record: a flipped bit is caught on load
    return config


EXPORT_FORMATS = ("pth", "safetensors")


def export_format(dst: str | Path, fmt: str | None) -> str:
    """The format of an export: `fmt` when given (pth, safetensors), else from the suffix of `dst` (.safetensors;
    anything else: pth); ValueError for a format that contradicts a .safetensors/.pth suffix."""
    suffix = Path(dst).suffix.lower()
    if fmt is None:
        return "safetensors" if suffix == SAFETENSORS_SUFFIX else "pth"
    if fmt not in EXPORT_FORMATS:
        raise ValueError(f"--format {fmt}: expected one of {', '.join(EXPORT_FORMATS)}")
    if (suffix == SAFETENSORS_SUFFIX and fmt != "safetensors") or (suffix in (".pth", ".pt") and fmt != "pth"):
        raise ValueError(f"--out {dst}: the suffix {suffix} says another format than --format {fmt}")
    return fmt


# --- writing --------------------------------------------------------------------------------------------------------

class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written (full disk, no permission): nothing partial is left behind."""


class _HashingWriter:
    """A file wrapper that hashes what torch.save writes, so the record costs no second read of the file."""

    def __init__(self, fh: Any) -> None:
        self.fh, self.sha256 = fh, hashlib.sha256()

    def write(self, data: Any) -> int:
        self.sha256.update(data)
        return self.fh.write(data)

    def flush(self) -> None:
        self.fh.flush()


def save_atomic(payload: dict[str, Any], path: Path) -> None:
    """torch.save to a temporary name in the same folder, fsync, write the sha256 record, rename: a reader never sees
    a partial file, and a file that changes afterwards no longer matches its record. On failure the temporary file is
    removed and CheckpointWriteError says why in one line."""
    from dpot_format.output import remove_stale

    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale(path)  # what a killed write of this file (and of its record) left
        remove_stale(record_path(path))
        with atomic_path(path) as tmp:  # fsync, rename, folder fsync; the temporary file removed on failure
            with open(tmp, "wb") as f:
                writer = _HashingWriter(f)
                torch.save(payload, writer)
            atomic_write(record_path(path), record_text(writer.sha256.hexdigest(), path))
    except BaseException as exc:
        os_error = _os_error(exc)
        if os_error is not None:
            raise CheckpointWriteError(_write_problem(path, os_error)) from exc
        raise


def write_atomic_with_record(data: bytes, path: Path) -> None:
    """`data` written atomically to `path` with its sha256 record beside it (as `save_atomic` does for torch files);
    CheckpointWriteError (one line) on failure, nothing partial left."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            with open(tmp, "wb") as f:
                f.write(data)
            atomic_write(record_path(path), record_text(hashlib.sha256(data).hexdigest(), path))
    except OSError as exc:
        raise CheckpointWriteError(_write_problem(path, exc)) from exc


def _os_error(exc: BaseException | None) -> OSError | None:
    """The OSError behind a failure (torch reports a failed write as a RuntimeError raised while handling it)."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, OSError):
            return exc
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


def _write_problem(path: Path, err: OSError) -> str:
    """One line for a failed checkpoint write."""
    why = f"no space left on the device holding {path.parent}" if err.errno == errno.ENOSPC else \
        (err.strerror or str(err))
    return (f"{path}: the checkpoint could not be written ({why}); no partial file was left. The checkpoints "
            "already written are intact: free space (or fix the folder) and continue with --resume")


# --- a run's checkpoints folder -------------------------------------------------------------------------------------

def checkpoint_path(ckpt_dir: Path, step: int) -> Path:
    """checkpoints/step-00000042.pt."""
    return Path(ckpt_dir) / f"step-{step:08d}.pt"


def list_checkpoints(ckpt_dir: Path) -> list[tuple[int, Path]]:
    """(step, path) of complete checkpoints, oldest first (temporary files are ignored)."""
    ckpt_dir = Path(ckpt_dir)
    if not ckpt_dir.is_dir():
        return []
    found = [(int(m.group(1)), ckpt_dir / n) for n in os.listdir(ckpt_dir) if (m := _NAME.match(n))]
    return sorted(found)


class RunDirError(RuntimeError):
    """RUN_DIR is in a state that does not fit the request (e.g. checkpoints exist but --resume is not given)."""


class UnreadableCheckpointsError(RuntimeError):
    """RUN_DIR holds checkpoints but none of them loads: a resume would silently start over."""


def looks_complete(path: Path) -> bool:
    """A structural check that costs one read of the file's end: a regular file holding a torch zip archive with a
    pickled payload (a FIFO or device fails it without being opened).

    Truncated or overwritten files fail it; pruning never deletes a file that fails it (a damaged checkpoint is
    left for the user to inspect, and it does not count among the checkpoints kept)."""
    try:
        if not _is_regular(path):
            return False
        with zipfile.ZipFile(path) as z:
            return any(n.endswith("/data.pkl") or n == "data.pkl" for n in z.namelist())
    except (OSError, zipfile.BadZipFile):
        return False


def prune(ckpt_dir: Path, keep: int) -> None:
    """Delete all but the newest `keep` complete checkpoints (keep <= 0 keeps all); damaged files are never deleted.
    The temporary files a killed writer left in the folder (`.step-N.pt.tmp-<pid>`, its process gone) go too."""
    from dpot_format.output import remove_stale_in

    remove_stale_in(ckpt_dir)
    if keep <= 0:
        return
    complete = [p for _, p in list_checkpoints(ckpt_dir) if looks_complete(p)]
    for p in complete[:-keep]:
        p.unlink(missing_ok=True)
        record_path(p).unlink(missing_ok=True)


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Load one of our checkpoints safely (weights_only, a regular file, its sha256 record checked) and check its
    format tag."""
    ckpt = read_checkpoint(path)
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        tag = ckpt.get("format") if isinstance(ckpt, dict) else None
        raise ValueError(f"{path}: not a dpot-train checkpoint (format tag {tag!r})")
    return ckpt


def set_aside(path: Path) -> Path:
    """Rename a damaged checkpoint (and its record) to `step-N.pt.damaged` (then `.damaged-2`, ...) so that a resume
    that redoes its step cannot overwrite it; returns the new name."""
    target = path.with_name(path.name + ".damaged")
    k = 1
    while target.exists() or target.is_symlink():
        k += 1
        target = path.with_name(f"{path.name}.damaged-{k}")
    os.replace(path, target)
    if record_path(path).exists():
        os.replace(record_path(path), record_path(target))
    fsync_dir(path.parent)
    return target


def latest_checkpoint(ckpt_dir: Path, keep_damaged: bool = True) -> tuple[Path, dict[str, Any]] | None:
    """Newest checkpoint that loads, falling back to older ones; each newer one that does not load is renamed aside
    (`set_aside`, when `keep_damaged`) and said so in one line, so the steps redone never overwrite it.

    None when there is no checkpoint; UnreadableCheckpointsError when there are some and none loads (starting over
    would overwrite a run the user may still recover); nothing is renamed then."""
    found = list_checkpoints(ckpt_dir)
    failures = []
    for _, path in reversed(found):
        try:
            ckpt = load_checkpoint(path)
        except Exception as e:  # noqa: BLE001 - any unreadable file means: try the previous one
            failures.append((path, " ".join(str(e).split())[:300]))
            continue
        for bad, why in failures if keep_damaged else []:
            print(f"warning: {bad} does not load ({why}); kept as {set_aside(bad).name}, resuming from {path.name}",
                  flush=True)
        return path, ckpt
    if found:
        names = ", ".join(f"{p.name} ({why[:80]})" for p, why in failures)
        raise UnreadableCheckpointsError(
            f"{ckpt_dir}: none of the {len(found)} checkpoints loads ({names}); nothing was changed. "
            f"Move them aside to start the run over, or restore a readable checkpoint to resume")
    return None


# --- RNG states saved with a training checkpoint --------------------------------------------------------------------

def rng_state() -> dict[str, Any]:
    """This process's RNG states (python, numpy, torch CPU and CUDA) as tensors and plain lists."""
    np_state = np.random.get_state()
    py_state = random.getstate()
    return {
        "python": [py_state[0], list(py_state[1]), py_state[2]],
        "numpy": {"keys": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2]),
                  "has_gauss": int(np_state[3]), "cached_gaussian": float(np_state[4])},
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Inverse of rng_state()."""
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    npst = state["numpy"]
    np.random.set_state(("MT19937", npst["keys"].numpy().astype(np.uint32), npst["pos"], npst["has_gauss"],
                         npst["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def export_weights(checkpoint: str, out: str | Path, fmt: str | None = None) -> str:
    """`dpot-train model export`: a run checkpoint's weights written in the released format (`fmt`: pth or
    safetensors, default from `out`'s suffix); returns the line saying what was written and where its sha256 is."""
    from dpot_train.model.family_config import grid_text

    kind = export_format(out, fmt)
    config = export_released(checkpoint, out, kind)
    layout = "safetensors: the tensors, recipe and normalisation" if kind == "safetensors" else \
        "{'model': state_dict}, the released format"
    return (f"wrote {out}: {config.in_channels} channels, {grid_text(config.grid)}, "
            f"{config.in_timesteps} input frames ({layout}); its sha256 in {record_path(out).name} (publish it: "
            "`--sha256` checks a copy)")
