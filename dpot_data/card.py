"""Dataset cards: a README.md beside an ingest output's manifest, in the Hugging Face dataset-card form (YAML front
matter, then Markdown), so that an output can be published or handed on with what it is, where it comes from, under
which licence, how it is laid out and how it was made.

`card_text` is the pure part (manifest + catalog facts -> the card's text); `write_card` reads an output folder
(local path or fsspec URL), draws the preview pictures (`card/<dataset>.png`: the first frame of the first test,
else train, trajectory, one panel per channel) and writes them, then the card, each atomically. Everything the card
says comes from the manifest, the catalog (manifests/catalog.yaml, `sources` and `datasets`) and dpot_data.units;
nothing depends on when the card is written, so `ingest --card` and a later `dpot-data card` write the same card.
Every text taken from the manifest (names, units, attributes, paths, the command) goes in through `_cell` / `_code`
(dpot_format.text: one line, bounded, escaped for Markdown and HTML); raw inputs are named by file name and sha256 and
the command's absolute paths by file name, so a published card shows no folder of the machine that made it.
"""

from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

import numpy as np
import yaml

from dpot_data.catalog import Catalog, Entry, SourceFacts, load_catalog
from dpot_data.errors import InputError
from dpot_data.units import DIMENSIONLESS
from dpot_format.display import colour_scale, data_axes, draw_field, fluid_range
from dpot_format.units import entry_units, stated_label, time_symbol
from dpot_format import io as fio
from dpot_format.errors import FormatError
from dpot_format.layout import space_order
from dpot_format.names import MANIFEST_NAME, SPLITS
from dpot_format.text import NAME_LIMIT, TEXT_LIMIT, bound, file_name, md, md_code_block, public_command, strip_dirs

CARD_NAME = "README.md"
PREVIEW_FOLDER = "card"
NOT_GIVEN = "not given"
NOT_RECORDED = "not recorded"
SKIPPED_SHOWN = 100  # entries of `skipped` the card lists
TASK_CATEGORIES = ["time-series-forecasting", "other"]
# Hugging Face's size buckets (number of examples: here trajectories)
_PLAIN = re.compile(r"[\w.:/+=#@,-]{1,100}")  # shown as inline code as it is
_SIZES = [(1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"), (1_000_000, "100K<n<1M"),
          (10_000_000, "1M<n<10M"), (100_000_000, "10M<n<100M")]


@dataclass(frozen=True)
class Preview:
    """The preview picture of one dataset: its path (relative to the card), the trajectory drawn (split, index,
    id), and the fraction of its cells that are fluid (mask 1)."""

    path: str
    split: str
    index: int
    sample_id: str | None
    fluid: float
    time: str = "frame 0"  # the frame's time as the picture's titles give it: `t = 0 s`, or `frame 0`


def preview_path(dataset: str) -> str:
    """Where the preview of `dataset` goes, relative to the manifest's folder."""
    return f"{PREVIEW_FOLDER}/{dataset}.png"


def size_category(trajectories: int) -> str:
    """The Hugging Face size bucket of a number of examples."""
    for bound, name in _SIZES:
        if trajectories < bound:
            return name
    return "n>100M"


def _cell(value: object, limit: int = NAME_LIMIT) -> str:
    """Text from the manifest as Markdown (a table cell or inline text): one line, cut to `limit` characters,
    HTML and Markdown syntax escaped (dpot_format.text.md)."""
    return md(value, limit)


def _code(value: object) -> str:
    """A short identifier from the manifest as inline code; anything else as escaped text (`_cell`)."""
    text = str(value)
    return f"`{text}`" if _PLAIN.fullmatch(text) else _cell(text)


def _tag(value: object) -> str:
    """A Hub tag from a manifest's text: lower case, runs of other characters than [a-z0-9_.-] as "-", bounded."""
    return bound(re.sub(r"[^a-z0-9_.-]+", "-", str(value)[:4 * NAME_LIMIT].lower()).strip("-") or "unknown")


def _params(entry: Mapping[str, Any]) -> str:
    """The PDE parameters on one line: each text inside (a NetCDF attribute) cut to NAME_LIMIT characters, the
    whole line to TEXT_LIMIT, escaped."""
    def cut(v: object) -> object:
        if isinstance(v, dict):
            return {bound(k): cut(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [cut(x) for x in v]
        return bound(v) if isinstance(v, str) else v

    text = ", ".join(f"{bound(k)} = {v if isinstance(v, (str, int, float)) else json.dumps(v, ensure_ascii=False)}"
                     for k, v in cut(entry.get("parameters") or {}).items())
    return _cell(text, TEXT_LIMIT)


def _number(value: object) -> str:
    """A statistic as printed: 6 significant digits, '-' when absent."""
    return "-" if value is None else f"{float(value):.6g}"


def _facts(entry: Mapping[str, Any], catalog: Catalog | None) -> tuple[Entry | None, SourceFacts | None]:
    """The catalog dataset (by name, only when its source agrees) and the source's facts of a manifest entry."""
    if catalog is None:
        return None, None
    found = catalog.find(str(entry["name"]))
    if found is not None and found.source != entry["source"]:
        found = None
    return found, catalog.sources.get(str(entry["source"]))


def _front_matter(manifest: Mapping[str, Any], catalog: Catalog | None) -> dict[str, Any]:
    """The card's YAML front matter (Hugging Face dataset-card metadata)."""
    entries = manifest["datasets"]
    licences = set()
    for entry in entries:
        _, facts = _facts(entry, catalog)
        licences.add(facts.license if facts is not None and facts.license else "unknown")
    sources = sorted({_tag(e["source"]) for e in entries})
    configs = []
    for entry in entries:
        files = [{"split": s, "path": [sh["path"] for sh in entry["shards"] if sh["split"] == s]} for s in SPLITS]
        files = [f for f in files if f["path"]]
        if files:
            configs.append({"config_name": str(entry["name"]), "data_files": files})
    doc: dict[str, Any] = {
        "license": licences.pop() if len(licences) == 1 else "other",
        "pretty_name": ", ".join(str(e["name"]) for e in entries),
        "tags": ["physics", "pde", "scientific-machine-learning", "dpot", "webdataset", "zarr", *sources],
        "task_categories": list(TASK_CATEGORIES),
        "size_categories": [size_category(sum(int(e["trajectories"]) for e in entries))],
    }
    if configs:
        doc["configs"] = configs
    return doc


def _source_section(entry: Mapping[str, Any], catalog: Catalog | None) -> list[str]:
    """What the data is and where it comes from: equation, source, licence, citation."""
    found, facts = _facts(entry, catalog)
    names = [str(entry["name"])] + ([found.name] if found is not None else [])
    equation = facts.equation(*names) if facts is not None else None
    out = ["### Source", ""]
    out.append(f"- Equation: {equation or NOT_GIVEN}")
    if facts is not None:
        out.append(f"- Source: {facts.title} ({_code(entry['source'])}), {facts.homepage}")
    else:
        out.append(f"- Source: {_code(entry['source'])} (no catalog facts for this source)")
    if found is not None:
        dpot = f", DPOT's `{found.dpot_name}`" if found.dpot_name else ""
        url = f"; published at {found.download['url']}" if found.download else ""
        out.append(f"- Catalog dataset: `{found.name}`{dpot}{url}")
    params = _params(entry)
    out.append(f"- PDE parameters: {params or 'none recorded'}")
    if facts is not None and facts.license:
        out.append(f"- Licence: {facts.license} (stated in {facts.license_stated})")
    else:
        stated = f"; {facts.license_stated}" if facts is not None else ""
        out.append(f"- Licence: {NOT_GIVEN}{stated}")
    if facts is not None:
        out += ["- Citation (the publisher's BibTeX):", "", "```bibtex", facts.citation, "```"]
    else:
        out.append(f"- Citation: {NOT_GIVEN}")
    return out + [""]


def _layout_lines(entry: Mapping[str, Any]) -> list[str]:
    """Grid, axis order, frames, dt, boundary, resampling and the model's reading of them."""
    grid = entry["grid"]
    dims = [str(d) for d in grid["dims"]]
    shape = "x".join(str(s) for s in grid["shape"])
    native = "x".join(str(s) for s in grid["native_shape"])
    convention = entry.get("convention") or {"name": "canonical", "model_layout": "xy"}
    layout = str(convention.get("model_layout", "xy"))
    model = ", ".join(dims[i].upper() for i in space_order(len(dims), layout))
    stored = ", ".join(["T", "C", *(d.upper() for d in dims)])
    dt = entry.get("dt")
    units = entry_units(entry)
    step = f"{dt} {time_symbol(units['time']) or ''}".rstrip() if dt is not None else "unknown"
    resample = entry.get("resample") or {}
    return [
        "### Layout", "",
        f"- Grid: {shape} ({', '.join(_cell(stated_label(d, units[d])) for d in dims)}), native {native}; resampled "
        f"with {_code(resample.get('fields', 'none'))} (mask {_code(resample.get('mask', 'none'))})",
        f"- Axis order: a stored trajectory is ({stored}), its mask ({', '.join(d.upper() for d in dims)}); the model "
        f"reads space as ({model}) (convention {_code(convention.get('name'))}, model_layout {_code(layout)})",
        f"- Frames per trajectory: {entry['frames']}" + (f" (pieces of {entry['segment']} frames)"
                                                          if entry.get("segment") else ""),
        f"- dt: {step}",
        f"- Boundary: {entry['boundary']}",
        "",
    ]


def _channel_lines(entry: Mapping[str, Any]) -> list[str]:
    """One row per stored channel: name, units, whether it holds data or padding."""
    channels = [str(c) for c in entry["channels"]]
    valid = [bool(v) for v in entry["channel_valid"]]
    units = entry_units(entry)["channels"]
    out = ["### Channels", "", "| channel | units | holds |", "|---|---|---|"]
    for name, unit, ok in zip(channels, units, valid):
        holds = "data" if ok else f"padding (constant {entry['fill_value']})"
        out.append(f"| {_cell(name)} | {_cell(unit)} | {holds} |")
    return out + ["", "Units are the raw file's or the publisher's where they state them, `unknown` where none does, "
                      f"`{DIMENSIONLESS}` for what is dimensionless by construction.", ""]


def _mask_lines(entry: Mapping[str, Any], preview: Preview | None) -> list[str]:
    """What the geometry mask is, and how much of the previewed trajectory is fluid."""
    line = ("- Geometry mask: one uint8 mask per trajectory (`mask.npy`, Zarr `mask`), 1 = fluid or valid cell, "
            "0 = solid; statistics count fluid cells only")
    if preview is not None:
        line += (f"; {preview.fluid:.1%} of the cells of the previewed trajectory are fluid")
    return ["### Geometry", "", line, ""]


def _split_lines(entry: Mapping[str, Any]) -> list[str]:
    """Trajectories, shards and bytes per split, and the rule that made the split."""
    counts = entry["splits"]["counts"]
    out = ["### Splits", "", f"Rule: {_cell(entry['splits'].get('rule', NOT_GIVEN), TEXT_LIMIT)} (seed "
                             f"{_cell(entry['splits'].get('seed', NOT_GIVEN))}).", "",
           "| split | trajectories | shards | bytes |", "|---|---|---|---|"]
    for split in SPLITS:
        shards = [s for s in entry["shards"] if s["split"] == split]
        if counts.get(split, 0) or shards:
            out.append(f"| {split} | {counts.get(split, 0)} | {len(shards)} | {sum(int(s['bytes']) for s in shards)} |")
    out.append(f"| all | {entry['trajectories']} | {len(entry['shards'])} | "
               f"{sum(int(s['bytes']) for s in entry['shards'])} |")
    return out + [""]


def _stats_lines(entry: Mapping[str, Any]) -> list[str]:
    """The per-channel statistics the manifest records (values and frame-to-frame differences)."""
    stats = entry.get("stats")
    out = ["### Statistics", ""]
    if not stats:
        return out + ["The manifest records no statistics (ingested with `--no-stats`).", ""]
    out += [f"Over the {_cell(stats.get('trajectories'))} {_cell(stats.get('split', 'train'))} trajectories, "
            f"{_cell(stats.get('cells', 'all cells'))}, {_cell(stats.get('dtype', 'float64'))}, ddof "
            f"{_cell(stats.get('ddof', 0))}; "
            "`dt` rows are differences between consecutive frames.", "",
            "| channel | of | count | mean | std | rms | min | max |", "|---|---|---|---|---|---|---|---|"]
    for family, label in (("fields", "value"), ("diff", "dt")):
        for name in stats.get("channels", []):
            v = stats.get(family, {}).get(name, {})
            nums = " | ".join(_number(v.get(k)) for k in ("mean", "std", "rms", "min", "max"))
            out.append(f"| {_cell(name)} | {label} | {_cell(v.get('count', '-'))} | {nums} |")
    return out + [""]


def _checksum_lines(entry: Mapping[str, Any]) -> list[str]:
    """The sha256 of every shard (and of every Zarr array) as the manifest records them."""
    out = ["### Checksums", "", "`dpot-data verify` re-hashes every file listed here.", ""]
    if entry["shards"]:
        out += ["| shard | split | samples | bytes | sha256 |", "|---|---|---|---|---|"]
        out += [f"| {_cell(s['path'], TEXT_LIMIT)} | {_cell(s['split'])} | {s['samples']} | {s['bytes']} | "
                f"{s['sha256']} |"
                for s in entry["shards"]]
    else:
        out.append("No WebDataset shards (written with `--format zarr`).")
    z = entry.get("zarr")
    if z:
        out += ["", f"Zarr store {_code(z['path'])}, group {_code(z['group'])}, codec "
                    f"{_code(z.get('codec', 'zstd (schema version 1)'))}; sha256 of each array's uncompressed C-order "
                    "bytes:", "", "| array | sha256 |", "|---|---|"]
        out += [f"| {_cell(name)} | {_cell(digest)} |" for name, digest in z["arrays"].items()]
    return out + [""]


def _provenance_lines(manifest: Mapping[str, Any], entry: Mapping[str, Any]) -> list[str]:
    """How the output was made: dpot version, creation time, the command line, the raw inputs."""
    tool = manifest.get("tool") or {}
    command = str(manifest.get("command") or "").strip()
    out = ["### Provenance", "",
           f"- Written by {_cell(tool.get('name', 'dpot'))} {_cell(tool.get('version', NOT_RECORDED))} on "
           f"{_cell(manifest.get('created', NOT_RECORDED))}"]
    reader = (entry.get("provenance") or {}).get("reader")
    if reader:
        out.append(f"- Reader: {_code(reader)} version "
                   f"{_cell((entry.get('provenance') or {}).get('reader_version', '?'))}")
    if command:
        out += ["- Ingest command (absolute paths by file name):", "",
                *md_code_block(public_command(command), "bash", TEXT_LIMIT)]
    else:
        out.append(f"- Ingest command: {NOT_RECORDED}")
    inputs = entry.get("inputs") or []
    if inputs:
        out += ["", "| raw input (file name) | bytes | sha256 |", "|---|---|---|"]
        out += [f"| {_cell(file_name(i['path']))} | {i['bytes']} | {i['sha256']} |" for i in inputs]
    skipped = entry.get("skipped") or []
    if skipped:
        out += ["", f"Left out at ingest ({len(skipped)}):", ""]
        out += [f"- {_cell(strip_dirs(s['what']))}: {_cell(strip_dirs(s['reason']), 4 * NAME_LIMIT)}"
                for s in skipped[:SKIPPED_SHOWN]]
        if len(skipped) > SKIPPED_SHOWN:
            out.append(f"- and {len(skipped) - SKIPPED_SHOWN} more ({MANIFEST_NAME} lists them)")
    return out + [""]


def _preview_lines(entry: Mapping[str, Any], preview: Preview | None) -> list[str]:
    out = ["### Preview", ""]
    if preview is None:
        return out + ["No trajectory to draw.", ""]
    which = f"{preview.split} trajectory {preview.index}" + (f" ({_code(strip_dirs(preview.sample_id))})"
                                                              if preview.sample_id else "")
    return out + [f"![first frame of {entry['name']}]({preview.path})", "",
                  f"The first frame of {which}, at {preview.time}, one panel per channel: {_data_channels(entry)}; "
                  "solid cells grey, outlined in black.", ""]


def _data_channels(entry: Mapping[str, Any]) -> str:
    """The data channels with their units: `temperature [K]`, `u [m/s], v [m/s]`."""
    units = entry_units(entry)["channels"]
    return ", ".join(_cell(stated_label(str(c), u)) for c, u, ok in zip(entry["channels"], units, entry["channel_valid"])
                     if ok)


def card_text(manifest: Mapping[str, Any], catalog: Catalog | None = None,
              previews: Mapping[str, Preview] | None = None) -> str:
    """The dataset card of a (validated) manifest: YAML front matter, then one section per dataset. `catalog`
    gives the equation, licence and citation (None, or a dataset it does not know: "not given"); `previews` the
    pictures per dataset name. Pure: the same inputs give the same text."""
    previews = previews or {}
    front = yaml.safe_dump(_front_matter(manifest, catalog), sort_keys=False, allow_unicode=True, width=120)
    entries = manifest["datasets"]
    title = ", ".join(str(e["name"]) for e in entries)
    lines = ["---", front.rstrip("\n"), "---", "", f"# {title}", ""]
    for entry in entries:
        found, facts = _facts(entry, catalog)
        what = facts.title if facts is not None else f"{_code(entry['source'])} data"
        counts = ", ".join(f"{s} {n}" for s, n in entry["splits"]["counts"].items() if n)
        lines += [f"## {entry['name']}", "",
                  f"{entry['trajectories']} trajectories ({counts}) of {what} ({_data_channels(entry)}), "
                  f"{entry['frames']} frames each on a "
                  f"{'x'.join(map(str, entry['grid']['shape']))} grid, written by `dpot-data ingest` as WebDataset "
                  "shards and a Zarr store (the dpot shard format: docs/format.md). Read the paths from "
                  f"`{MANIFEST_NAME}`, never assume them.", ""]
        preview = previews.get(str(entry["name"]))
        lines += _source_section(entry, catalog)
        lines += _layout_lines(entry)
        lines += _channel_lines(entry)
        lines += _mask_lines(entry, preview)
        lines += _split_lines(entry)
        lines += _stats_lines(entry)
        lines += _checksum_lines(entry)
        lines += _provenance_lines(manifest, entry)
        lines += _preview_lines(entry, preview)
    return "\n".join(lines).rstrip("\n") + "\n"


# ------------------------------------------------------------------------------------------------------------ I/O


def _first_sample(view: Any) -> tuple[str, Any] | None:
    """(split, sample) of the first test trajectory, else the first train one (else valid); None when none is
    stored. One trajectory is read: a Zarr chunk, or the first sample of the split's first shard."""
    from dpot_format.paths import resolve_member
    from dpot_format.tar import iter_samples

    group = view.zarr_group()
    labels = view.split_labels() if group is not None else None
    ids = None
    for split in ("test", "train", "valid"):
        if labels is not None:
            rows = np.flatnonzero(labels == split)
            if rows.size:
                if ids is None and "sample" in group:
                    ids = [str(v) for v in np.asarray(group["sample"][:]).ravel().tolist()]
                i = int(rows[0])
                return split, view.trajectory(i, group=group, split=split, sample_id=None if ids is None else ids[i])
            continue
        for shard in view.entry["shards"]:
            if shard["split"] == split and int(shard["samples"]):
                for sample in iter_samples(resolve_member(view.root, shard["path"]), where=shard["path"]):
                    return split, sample
    return None


def preview_figure(view: Any) -> tuple[Any, Preview] | None:
    """The matplotlib figure of the first frame of a dataset's first test (else train) trajectory, one panel per
    valid channel (3D: the middle z slice) in the data's coordinates, each with a colour bar naming the channel and
    its unit, and what it shows; None when the dataset stores no trajectory. The caller closes the figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    found = _first_sample(view)
    if found is None:
        return None
    split, sample = found
    fields, mask = np.asarray(sample.fields), np.asarray(sample.mask)
    if fields.ndim == 5:
        fields, mask = fields[:, :, fields.shape[2] // 2], mask[mask.shape[0] // 2]
    entry = view.entry
    axes_of = data_axes(entry, view.zarr_group())
    plane = axes_of.plane(entry["grid"]["dims"])
    shown = [c for c, ok in enumerate(entry["channel_valid"]) if ok] or [0]
    fluid = mask.astype(bool)
    fig, axes = plt.subplots(1, len(shown), figsize=(3.4 * len(shown), 3.2), squeeze=False, constrained_layout=True)
    for ax, c in zip(axes[0], shown):
        vmin, vmax, cmap = colour_scale(*fluid_range(fields[0, c], fluid))
        image = draw_field(ax, fields[0, c], fluid, plane, vmin, vmax, cmap)
        ax.set_title(axes_of.title(0), fontsize=9)
        fig.colorbar(image, ax=ax, shrink=0.85).set_label(axes_of.channel_label(entry["channels"], c), fontsize=8)
    index = int(sample.meta.get("index", 0))
    fig.suptitle(f"{entry['name']}: {split} trajectory {index}", fontsize=9)
    sample_id = sample.meta.get("id")
    return fig, Preview(preview_path(str(entry["name"])), split, index, None if sample_id is None else str(sample_id),
                        float(fluid.mean()), axes_of.title(0))


def render_preview(view: Any, dpi: int = 80) -> tuple[bytes, Preview] | None:
    """The PNG of `preview_figure` and what it shows; None when the dataset stores no trajectory."""
    import matplotlib.pyplot as plt

    drawn = preview_figure(view)
    if drawn is None:
        return None
    fig, preview = drawn
    try:
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=dpi, metadata={"Software": None})
    finally:
        plt.close(fig)
    return buf.getvalue(), preview


def _write(root: str, rel: str, data: bytes) -> str:
    """Write `data` atomically to ROOT/rel (path or URL), creating its folder; InputError (one line) when the
    file or its folder cannot be written."""
    target = fio.join(root, rel)
    try:
        if fio.is_local(target):
            import os

            os.makedirs(os.path.dirname(fio.local_path(target)), exist_ok=True)
        else:
            fsys, path = fio.filesystem(target)
            fsys.makedirs(path.rstrip("/").rpartition("/")[0], exist_ok=True)
        return fio.atomic_write(target, data)
    except OSError as exc:
        raise InputError(target, f"cannot be written ({exc.strerror or exc}); expected a writable output "
                                 "folder") from None


def _check_targets(root: str, rels: list[str]) -> None:
    """The one output rule (dpot_format.output) for the card's files in a local output, before anything is drawn:
    none is a link, a folder or a special file, nor is the pictures' folder; InputError (one line) otherwise."""
    if not fio.is_local(root):
        return
    from dpot_format.output import check_file, check_folder

    base = fio.local_path(root)
    try:
        check_folder(fio.join(base, PREVIEW_FOLDER), None, home=base)
        for rel in rels:
            check_file(fio.join(base, rel), None, CARD_NAME, home=base)
    except FormatError as exc:
        raise InputError(exc.where or root, exc.expected) from None


def write_card(root: str, catalog: Catalog | None = None) -> list[str]:
    """Write the card (README.md) and the preview pictures of the output at `root` (a folder holding
    manifest.json, or its URL) beside its manifest; returns what was written (pictures first, the card last).
    InputError (one line) when there is no manifest or the output fails the format's cheap check."""
    from dpot_data.output import DatasetView
    from dpot_format.manifest import read_manifest
    from dpot_format.validate import validate_output

    root = str(root).rstrip("/") or "/"
    try:
        manifest = read_manifest(root)
    except FormatError as exc:
        raise InputError(exc.where or root, exc.expected) from None
    problems = [p for p in validate_output(root, rehash=False, scan=False, manifest=manifest, trust_index=True)
                if p.fatal]
    if problems:
        more = f" (and {len(problems) - 1} more; `dpot-data verify` lists them)" if len(problems) > 1 else ""
        raise InputError(root, f"fails the format's check, expected a valid ingest output: {problems[0]}{more}")
    views = [DatasetView(root, entry) for entry in manifest["datasets"]]
    _check_targets(root, [CARD_NAME, *(preview_path(v.name) for v in views)])
    catalog = catalog if catalog is not None else load_catalog()
    written, previews = [], {}
    for view in views:
        try:
            drawn = render_preview(view)
        except FormatError as exc:
            raise InputError(exc.where or root, exc.expected) from None
        if drawn is not None:
            png, preview = drawn
            written.append(_write(root, preview.path, png))
            previews[view.name] = preview
    text = card_text(manifest, catalog, previews)
    written.append(_write(root, CARD_NAME, text.encode("utf-8")))
    return written


def write_cards(folder: str) -> Iterator[list[str]]:
    """`dpot-data card`: write_card for the output at `folder`, or for each dataset folder of an `ingest corpus`
    folder, yielding what each wrote as it is written. InputError for a file given instead of a folder."""
    from pathlib import Path

    from dpot_data.paths import output_roots

    if "://" not in folder and Path(folder).is_file():  # e.g. shards/manifest.json
        hint = f" (give {Path(folder).parent})" if Path(folder).name == "manifest.json" else ""
        raise InputError(folder, f"a file; expected an output folder holding manifest.json{hint}")
    for root in output_roots(folder):
        yield write_card(root)
