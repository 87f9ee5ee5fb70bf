"""Model facts for `dpot-train model info`: parameter counts, config and weight memory, without real allocation."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from dpot_train.core.checkpoint import checkpoint_model_config, load_state_dict_file, missing_checkpoint
from dpot_train.integrations.hub import is_reference, resolve
from dpot_train.model import families

# DPOT's modules in the order its summary lists them; other families list theirs in registration order
_GROUPS = ("pos_embed", "patch_embed", "time_agg_layer", "blocks", "cls_head", "out_layer", "scale_feats_mu",
           "scale_feats_sigma")


def parameter_breakdown(config: Any) -> dict[str, int]:
    """Parameter count per top-level module, counted on the meta device (no memory for the weights)."""
    model = families.build(config, device="meta")
    counts: dict[str, int] = {}
    for name, param in model.named_parameters():
        group = name.split(".", 1)[0]
        counts[group] = counts.get(group, 0) + param.numel()
    order = {g: i for i, g in enumerate(_GROUPS)}
    return dict(sorted(counts.items(), key=lambda item: order.get(item[0], len(order))))


def describe_config(config: Any, *, source: str, kind: str) -> dict[str, Any]:
    """Info dict for a config of any family: network, family and size, parameters (total and per module), weight
    bytes in fp32 and bf16, the config."""
    groups = parameter_breakdown(config)
    total = sum(groups.values())
    return {
        "source": source,
        "kind": kind,
        **families.summary(config),
        "parameters": total,
        "parameters_by_module": groups,
        "weight_bytes": {"fp32": total * 4, "bf16": total * 2},
        "config": config.to_dict(),
    }


def model_info(target: str | Path | Any, *, trusted: bool = False, sha256: str | None = None) -> dict[str, Any]:
    """Info for a preset name (any family), a model config or a checkpoint path (config from the file or inferred
    from the weights) or Hub reference (dpot:Ti, hf://...: its commit and sha256 under `hub`); `sha256`: the
    checkpoint file's expected digest, checked before it is loaded."""
    if not isinstance(target, (str, Path)):
        return describe_config(families.resolve(target), source="config", kind="config")
    if is_reference(target):
        resolved = resolve(str(target))
        digest: list[str] = []
        info = _checkpoint_info(resolved.path, str(target), trusted, sha256, digest)
        return {**info, "hub": resolved.record(digest[0])}
    text = str(target)
    if text.lower() in {k.lower() for k in families.preset_names()} and not Path(text).is_file():
        return describe_config(families.preset_config(text), source=text, kind="preset")
    path = Path(text)
    if not path.exists():
        if os.sep in text or path.suffix:  # meant as a file: say that it does not exist (and why, in a run)
            raise FileNotFoundError(missing_checkpoint(path))
        raise FileNotFoundError(f"{text!r} is neither a preset ({', '.join(families.preset_names())}) nor an existing "
                                "checkpoint file")
    return _checkpoint_info(path, str(path), trusted, sha256)


def _checkpoint_info(path: Path, source: str, trusted: bool, sha256: str | None,
                     digest: list[str] | None = None) -> dict[str, Any]:
    """`model_info` of the checkpoint file `path`, named `source` (the path, or the Hub reference it came from)."""
    state, config_dict, hints = load_state_dict_file(path, trusted=trusted, sha256=sha256, digest_out=digest)
    config = checkpoint_model_config(config_dict, state, hints, str(path))
    info = describe_config(config, source=source, kind="checkpoint")
    info["checkpoint"] = {
        "tensors": len(state),
        "values": sum(t.numel() for t in state.values()),
        "dtypes": sorted({str(t.dtype).replace("torch.", "") for t in state.values()}),
        "config_from": "checkpoint" if config_dict is not None else "weights",
    }
    return info


def format_info(info: dict[str, Any]) -> str:
    """Human-readable multi-line summary of `model_info` output."""
    def mib(n: int) -> str:
        return f"{n / 2**20:,.1f} MiB"

    lines = [
        f"{info['model']} from {info['kind']} {info['source']}",
        f"family: {info['family']}, size: {info['size']}",
        f"parameters: {info['parameters']:,} ({info['parameters'] / 1e6:.2f}M)",
        f"weights: fp32 {mib(info['weight_bytes']['fp32'])}, bf16 {mib(info['weight_bytes']['bf16'])}",
        "parameters by module:",
    ]
    lines += [f"  {name:<18} {count:>14,}" for name, count in info["parameters_by_module"].items()]
    if "checkpoint" in info:
        ck = info["checkpoint"]
        lines.append(f"checkpoint: {ck['tensors']} tensors, {ck['values']:,} values, dtypes {ck['dtypes']}, "
                     f"config from {ck['config_from']}")
    if "hub" in info:
        hub = info["hub"]
        lines.append(f"hub: {hub['pinned']} (commit {hub['revision']}), sha256 {hub['sha256']}")
    lines.append("config:")
    lines += [f"  {k:<14} {v}" for k, v in info["config"].items()]
    return "\n".join(lines)


def model_info_text(target: str, *, trusted: bool = False, sha256: str | None = None, as_json: bool = False) -> str:
    """`dpot-train model info`: model_info of `target` (`sha256` checked as the --sha256 option), as JSON or as the
    summary. FileNotFoundError / ValueError, one line."""
    import json

    from dpot_train.core.checkpoint import check_sha256_option

    info = model_info(target, trusted=trusted, sha256=check_sha256_option(sha256))
    return json.dumps(info, indent=1) if as_json else format_info(info)
