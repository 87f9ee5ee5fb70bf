"""The checked-in dataset catalog (manifests/catalog.yaml): look datasets up by name or by file, and compare what a
reader returned with what a complete public download holds, so that ingest can warn about partial or odd inputs."""

from __future__ import annotations

import fnmatch
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from dpot_data.errors import CatalogError  # defined there: the CLI catches it without importing the catalog
from dpot_data.sources.base import BOUNDARIES, SPLITS, ReadResult
from dpot_format.names import manifest_name  # noqa: F401 - re-export: the rule lives in the format

CATALOG_ENV = "DPOT_CATALOG"
# packaged with dpot_data (the checkout's top-level manifests/ is a link to this folder: one copy)
DEFAULT_CATALOG = Path(__file__).resolve().parent / "manifests" / "catalog.yaml"
CATALOG_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")
SOURCES = ("fno", "pdebench", "pdearena", "cfdbench", "the_well", "xarray")
_KEYS = {"name", "source", "dpot_name", "files", "file_count", "channels", "frames", "segment", "samples", "grid",
         "boundary", "split", "pretrain", "weight", "rollout", "parameters", "uncertain", "notes",
         "download", "reference"}
_REQUIRED = {"name", "source", "files", "channels", "frames", "samples", "grid", "boundary", "split", "pretrain",
             "weight", "rollout", "parameters"}


@dataclass(frozen=True)
class SplitRule:
    """How trajectories are split: kept from the files ("file") or drawn at random by trajectory with a seed."""

    rule: str
    ratios: Mapping[str, float] = field(default_factory=dict)
    seed: int = 0


@dataclass(frozen=True)
class Entry:
    """One public dataset as the catalog describes it (see the key list at the top of manifests/catalog.yaml)."""

    name: str
    source: str
    files: tuple[str, ...]
    channels: tuple[str, ...]
    frames: int | None
    samples: int | None
    grid: tuple[int, ...]
    boundary: str
    split: SplitRule
    pretrain: bool
    weight: float | None
    rollout: int | None
    parameters: Mapping[str, object]
    dpot_name: str | None = None
    file_count: int | None = None
    segment: int | None = None
    uncertain: tuple[str, ...] = ()
    notes: str = ""
    download: Mapping[str, Any] | None = None  # {"url", ["md5"], ["stated"], ["note"], ["files"]}: where published
    reference: Mapping[str, Any] | None = None  # what the default (dpot-reference) ingest of the complete set gives

    def conventions(self) -> dict[str, dict[str, Any]]:
        """What each convention's ingest gives for the complete public set: frames per stored trajectory, the first
        stored frame, the split rule (and counts), the grid; `dpot-reference` is the default of `dpot-data ingest`."""
        ratios = self.split.ratios
        # the rule as the manifest records it (dpot_data.ingest.plan.split_rule; tests/test_catalog_conventions.py)
        split = (f"by trajectory: numpy default_rng({self.split.seed}).permutation over sorted trajectory ids; "
                 f"train {ratios.get('train', 0):g}, valid {ratios.get('valid', 0):g}, test rest (counts rounded "
                 "half up)" if self.split.rule == "random" else "from the files: train, valid and test files")
        first = ("the initial vorticity `a`, then the frames of `u`" if self.source == "fno"
                 else "as under dpot-reference" if self.reference is not None else "the first frame of the files")
        canonical = {"frames": self.frames if self.frames is not None else self.segment, "first_frame": first,
                     "split": split, "grid": list(self.grid) if len(self.grid) == 3 else [128, 128]}
        out = {"canonical": canonical}
        if self.reference is not None:
            out = {"dpot-reference": dict(self.reference), **out}
        return out

    @property
    def manifest_name(self) -> str:
        """The name the dataset is written under in manifests (`[a-z0-9_-]+`)."""
        return manifest_name(self.name)


@dataclass(frozen=True)
class SourceFacts:
    """What a dataset card says about a source (the `sources` block of manifests/catalog.yaml): the publisher's
    title and page, the equation of each dataset (fnmatch pattern -> text), the data's licence (a Hugging Face id,
    None where none is stated), where that is stated, and the publisher's BibTeX."""

    title: str
    homepage: str
    equations: Mapping[str, str]
    license: str | None
    license_stated: str
    citation: str

    def equation(self, *names: str) -> str | None:
        """The equation of the first pattern that matches one of `names` (catalog or manifest name)."""
        for pattern, text in self.equations.items():
            if any(fnmatch.fnmatchcase(n, pattern) for n in names):
                return text
        return None


@dataclass(frozen=True)
class Catalog:
    """All entries, addressable by catalog name or manifest name, plus the named mixtures and facts per source."""

    path: Path
    entries: Mapping[str, Entry]
    mixtures: Mapping[str, Path]
    sources: Mapping[str, SourceFacts] = field(default_factory=dict)

    def get(self, name: str) -> Entry:
        """Entry by catalog name (`pdebench-cfd-m1-eta0.1`) or manifest name (`pdebench-cfd-m1-eta0p1`)."""
        if name in self.entries:
            return self.entries[name]
        for entry in self.entries.values():
            if entry.manifest_name == name:
                return entry
        close = [n for n in self.entries if n.split("-")[0] == name.split("-")[0]] or list(self.entries)
        raise KeyError(f"unknown dataset {name!r}; the catalog ({self.path}) knows: {', '.join(sorted(close))}")

    def find(self, name: str) -> Entry | None:
        """Like `get`, but None for an unknown name."""
        try:
            return self.get(name)
        except KeyError:
            return None

    def pretrain(self) -> list[Entry]:
        """The DPOT pre-training datasets, in catalog order."""
        return [e for e in self.entries.values() if e.pretrain]

    def match_files(self, paths: Sequence[str | Path]) -> list[Entry]:
        """Entries whose file patterns accept every given path (a pattern matches the path's last components)."""
        return [e for e in self.entries.values() if paths and all(_matches(Path(p), e.files) for p in paths)]


def _matches(path: Path, patterns: Sequence[str]) -> bool:
    """True if the last components of `path` match one of the patterns (each pattern component by fnmatch)."""
    parts = path.parts
    for pattern in patterns:
        pp = Path(pattern).parts
        if len(parts) >= len(pp) and all(fnmatch.fnmatchcase(a, b) for a, b in zip(parts[-len(pp):], pp)):
            return True
    return False


def _int_or_none(where: str, key: str, value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CatalogError(f"{where}: {key} must be a positive integer or null, got {value!r}")
    return value


def _entry(where: str, raw: object) -> Entry:
    """Parse and check one catalog entry; CatalogError names the entry and the key."""
    if not isinstance(raw, dict):
        raise CatalogError(f"{where}: an entry must be a mapping")
    name = raw.get("name")
    where = f"{where} ({name})" if name else where
    missing, unknown = _REQUIRED - set(raw), set(raw) - _KEYS
    if missing:
        raise CatalogError(f"{where}: missing keys {sorted(missing)}")
    if unknown:
        raise CatalogError(f"{where}: unknown keys {sorted(unknown)}")
    if not isinstance(name, str) or not CATALOG_NAME.match(name):
        raise CatalogError(f"{where}: name must be lower case [a-z0-9_.-], got {name!r}")
    manifest_name(name)
    if raw["source"] not in SOURCES:
        raise CatalogError(f"{where}: source must be one of {SOURCES}, got {raw['source']!r}")
    if raw["boundary"] not in BOUNDARIES:
        raise CatalogError(f"{where}: boundary must be one of {BOUNDARIES}, got {raw['boundary']!r}")
    for key in ("files", "channels"):
        if not isinstance(raw[key], list) or not raw[key] or not all(isinstance(v, str) for v in raw[key]):
            raise CatalogError(f"{where}: {key} must be a non-empty list of strings")
    grid = raw["grid"]
    if not isinstance(grid, list) or len(grid) not in (2, 3) or not all(isinstance(g, int) and g > 0 for g in grid):
        raise CatalogError(f"{where}: grid must be [y, x] or [z, y, x] positive integers, got {grid!r}")
    split = raw["split"]
    if not isinstance(split, dict) or split.get("rule") not in ("file", "random"):
        raise CatalogError(f"{where}: split.rule must be 'file' or 'random'")
    ratios = split.get("ratios", {})
    if split["rule"] == "random":
        if set(ratios) != set(SPLITS) or abs(sum(float(v) for v in ratios.values()) - 1.0) > 1e-9:
            raise CatalogError(f"{where}: split.ratios must give {SPLITS} summing to 1, got {ratios!r}")
    frames, segment = _int_or_none(where, "frames", raw["frames"]), _int_or_none(where, "segment", raw.get("segment"))
    if frames is None and segment is None:
        raise CatalogError(f"{where}: a variable-length dataset (frames: null) needs a segment length")
    if not isinstance(raw["pretrain"], bool):
        raise CatalogError(f"{where}: pretrain must be true or false")
    weight = raw["weight"]
    if raw["pretrain"] != (weight is not None) or (
            weight is not None and (isinstance(weight, bool) or not isinstance(weight, (int, float)) or weight <= 0)):
        raise CatalogError(f"{where}: weight must be a positive number for a pre-training dataset and null otherwise,"
                           f" got {weight!r}")
    if not isinstance(raw["parameters"], dict):
        raise CatalogError(f"{where}: parameters must be a mapping")
    uncertain = raw.get("uncertain") or []
    if not set(uncertain) <= _KEYS:
        raise CatalogError(f"{where}: uncertain lists unknown keys {sorted(set(uncertain) - _KEYS)}")
    return Entry(
        name=name, source=raw["source"], files=tuple(raw["files"]), channels=tuple(raw["channels"]), frames=frames,
        samples=_int_or_none(where, "samples", raw["samples"]), grid=tuple(grid), boundary=raw["boundary"],
        split=SplitRule(split["rule"], {k: float(v) for k, v in ratios.items()}, int(split.get("seed", 0))),
        pretrain=raw["pretrain"], weight=None if weight is None else float(weight), rollout=_int_or_none(where, "rollout", raw["rollout"]),
        parameters=dict(raw["parameters"]), dpot_name=raw.get("dpot_name"),
        file_count=_int_or_none(where, "file_count", raw.get("file_count")), segment=segment,
        uncertain=tuple(uncertain), notes=str(raw.get("notes") or ""), download=_download(where, raw.get("download")),
        reference=_reference(where, raw.get("reference")),
    )


_DOWNLOAD_KEYS = {"url", "md5", "stated", "note", "files"}
_REFERENCE_KEYS = {"frames", "first_frame", "split", "counts", "t_test", "grid"}


def _download(where: str, raw: object) -> dict[str, Any] | None:
    """The optional `download` entry: {url: https://..., md5: 32 hex digits (where the publisher lists one),
    stated: where the publisher states the location, note: how to fetch it, files: the published file names of each
    split (at <url><split>/<name>)}."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or "url" not in raw or not set(raw) <= _DOWNLOAD_KEYS \
            or not str(raw["url"]).startswith("https://") \
            or ("md5" in raw and not re.fullmatch(r"[0-9a-f]{32}", str(raw["md5"]))):
        raise CatalogError(f"{where}: download must be {{url: https://..., [md5: 32 hex digits], [stated: text], "
                           f"[note: text], [files: {{split: [names]}}]}}, got {raw!r}")
    out: dict[str, Any] = {k: str(raw[k]) for k in ("url", "md5", "stated", "note") if k in raw}
    if "files" in raw:
        files = raw["files"]
        if not isinstance(files, dict) or not files or not set(files) <= set(SPLITS) or not all(
                isinstance(names, list) and all(isinstance(n, str) and n and "/" not in n for n in names)
                for names in files.values()):
            raise CatalogError(f"{where}: download.files must map {SPLITS} to lists of file names, got {files!r}")
        out["files"] = {s: list(files[s]) for s in SPLITS if s in files}
    return out


def _reference(where: str, raw: object) -> dict[str, Any] | None:
    """The optional `reference` entry: what the default dpot-reference ingest of the complete set stores."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or not {"frames", "first_frame", "split", "grid"} <= set(raw) <= _REFERENCE_KEYS:
        raise CatalogError(f"{where}: reference must give frames, first_frame, split and grid (and optionally "
                           f"counts, t_test), got {raw!r}")
    _int_or_none(where, "reference.frames", raw["frames"])
    _int_or_none(where, "reference.t_test", raw.get("t_test"))
    grid = raw["grid"]
    if not isinstance(grid, list) or not all(isinstance(g, int) and g > 0 for g in grid):
        raise CatalogError(f"{where}: reference.grid must be the stored [y, x] or [z, y, x], got {grid!r}")
    counts = raw.get("counts")
    if counts is not None and (not isinstance(counts, dict) or not set(counts) <= set(SPLITS)
                               or not all(isinstance(v, int) and v >= 0 for v in counts.values())):
        raise CatalogError(f"{where}: reference.counts must map {SPLITS} to counts, got {counts!r}")
    return dict(raw)


_SOURCE_KEYS = {"title", "homepage", "equations", "license", "license_stated", "citation"}


def _source_facts(where: str, name: object, raw: object) -> SourceFacts:
    """Parse and check one entry of the `sources` block; CatalogError names the source and the key."""
    where = f"{where}: sources.{name}"
    if name not in SOURCES:
        raise CatalogError(f"{where}: not a source, expected one of {SOURCES}")
    if not isinstance(raw, dict) or set(raw) != _SOURCE_KEYS:
        keys = sorted(raw) if isinstance(raw, dict) else raw
        raise CatalogError(f"{where}: expected the keys {sorted(_SOURCE_KEYS)}, got {keys!r}")
    for key in ("title", "homepage", "license_stated", "citation"):
        if not isinstance(raw[key], str) or not raw[key].strip():
            raise CatalogError(f"{where}: {key} must be non-empty text")
    if raw["license"] is not None and not (isinstance(raw["license"], str) and re.fullmatch(r"[a-z0-9][a-z0-9.-]*",
                                                                                        raw["license"])):
        raise CatalogError(f"{where}: license must be a Hugging Face licence id (e.g. cc-by-4.0) or null, "
                           f"got {raw['license']!r}")
    equations = raw["equations"]
    if not isinstance(equations, dict) or not equations or not all(
            isinstance(k, str) and isinstance(v, str) and v.strip() for k, v in equations.items()):
        raise CatalogError(f"{where}: equations must map dataset name patterns to non-empty text")
    return SourceFacts(title=raw["title"], homepage=raw["homepage"], equations=dict(equations),
                       license=raw["license"], license_stated=raw["license_stated"], citation=raw["citation"].strip())


def load_catalog(path: str | Path | None = None) -> Catalog:
    """Read and validate the catalog (default: manifests/catalog.yaml, or $DPOT_CATALOG); CatalogError if malformed."""
    path = Path(path or os.environ.get(CATALOG_ENV) or DEFAULT_CATALOG)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise CatalogError(f"{path}: cannot read the catalog: {exc}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("datasets"), list):
        raise CatalogError(f"{path}: expected a mapping with a list under 'datasets'")
    entries: dict[str, Entry] = {}
    for i, item in enumerate(raw["datasets"]):
        entry = _entry(f"{path}: datasets[{i}]", item)
        if entry.name in entries or any(e.manifest_name == entry.manifest_name for e in entries.values()):
            raise CatalogError(f"{path}: datasets[{i}]: duplicate name {entry.name!r}")
        entries[entry.name] = entry
    mixtures = {str(k): (path.parent / str(v)) for k, v in (raw.get("mixtures") or {}).items()}
    sources = raw.get("sources") or {}
    if not isinstance(sources, dict):
        raise CatalogError(f"{path}: sources must be a mapping of source name to facts")
    facts = {str(k): _source_facts(str(path), k, v) for k, v in sources.items()}
    return Catalog(path, entries, mixtures, facts)


def load_mixture(name_or_path: str | Path, catalog: Catalog | None = None) -> dict[str, float]:
    """Weights of a mixture by name (`dpot-pretrain`) or file, keyed by manifest name; every dataset must exist."""
    catalog = catalog or load_catalog()
    path = catalog.mixtures.get(str(name_or_path), Path(name_or_path))
    try:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise CatalogError(f"{path}: cannot read the mixture: {exc}") from None
    weights = raw.get("weights") if isinstance(raw, dict) else None
    if not isinstance(weights, dict) or not weights:
        raise CatalogError(f"{path}: expected a non-empty mapping under 'weights'")
    out: dict[str, float] = {}
    for key, value in weights.items():
        entry = catalog.find(str(key))
        if entry is None:
            raise CatalogError(f"{path}: weights: {key!r} is not a catalog dataset")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise CatalogError(f"{path}: weights: {key!r} must be a number >= 0, got {value!r}")
        out[entry.manifest_name] = float(value)
    return out


def compare(result: ReadResult, entry: Entry) -> list[str]:
    """Warnings where what was read differs from the catalog (source, channels, frames, grid, counts, boundary).

    A partial download (fewer trajectories than the public set) is reported as such; keys the catalog marks as
    uncertain are reported as notes. An empty list means everything that can be checked matches.
    """
    ds = result.data
    out: list[str] = []

    def say(key: str, text: str) -> None:
        out.append(f"{entry.name}: {text}" + (" (catalog value uncertain)" if key in entry.uncertain else ""))

    if ds.attrs.get("source") != entry.source:
        say("source", f"read by source {ds.attrs.get('source')!r}, the catalog expects {entry.source!r}")
    channels = _physical_channels(ds)
    if channels != entry.channels:
        say("channels", f"channels {list(channels)} differ from the catalog's {list(entry.channels)}")
    if ds.attrs.get("boundary") != entry.boundary:
        say("boundary", f"boundary {ds.attrs.get('boundary')!r}, the catalog says {entry.boundary!r}")
    grid = tuple(int(ds.sizes[d]) for d in ds["fields"].dims[3:])
    if grid != entry.grid:
        say("grid", f"grid {list(grid)} differs from the catalog's {list(entry.grid)}")
    frames = int(ds.sizes["time"]) + int(ds.attrs.get("frames_left_out", 0))  # FNO's `a` under dpot-reference
    if entry.frames is not None and frames != entry.frames:
        say("frames", f"{frames} frames per trajectory, the catalog expects {entry.frames}")
    if entry.segment is not None and result.lengths is not None and int(min(result.lengths)) < entry.segment:
        short = int((result.lengths < entry.segment).sum())
        say("segment", f"{short} trajectories are shorter than one {entry.segment}-frame piece and give no piece")
    trajectories = {re.sub(r"/seg\d+$", "", str(s)) for s in ds["sample"].values}  # reference pieces: their case
    n = len(trajectories) + sum(1 for what, _ in result.skipped if "#" in what)
    if entry.samples is not None and n != entry.samples:
        kind = "a partial set" if n < entry.samples else "more than the public set"
        say("samples", f"{n} trajectories read, the complete public set has {entry.samples} ({kind})")
    n_files = len({Path(p).name for p in result.inputs}) + sum(1 for what, _ in result.skipped if "#" not in what)
    if entry.file_count is not None and entry.file_count > 1 and n_files != entry.file_count:
        say("file_count", f"{n_files} files given, the complete public set has {entry.file_count}")
    for key, value in entry.parameters.items():
        got = ds.attrs.get("parameters", {}).get(key)
        if got is not None and isinstance(value, (int, float)) and not _close(float(got), float(value)):
            say("parameters", f"parameter {key} = {got} in the files, the catalog says {value}")
    return out


def conflicts(result: ReadResult, entry: Entry) -> list[str]:
    """Differences that make the files a different dataset than `entry` (source, channels, PDE parameters)."""
    ds = result.data
    out = []
    if ds.attrs.get("source") != entry.source:
        out.append(f"the files are {ds.attrs.get('source')} data, {entry.name} is a {entry.source} dataset")
    channels = _physical_channels(ds)
    if channels != entry.channels:
        out.append(f"the files hold channels {list(channels)}, {entry.name} has {list(entry.channels)}")
    for key, value in entry.parameters.items():
        got = ds.attrs.get("parameters", {}).get(key)
        if got is not None and isinstance(value, (int, float)) and not _close(float(got), float(value)):
            out.append(f"the files have {key} = {got}, {entry.name} has {key} = {value}")
    return out


def _physical_channels(ds: Any) -> tuple[str, ...]:
    """The data channels a reader returned, without the reference's geometry channel ("mask")."""
    return tuple(str(c) for c in ds["channel"].values if str(c) != "mask")


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(abs(a), abs(b), 1e-300)


# ------------------------------------------------------------------------------------------------ catalog-driven ingest

@dataclass
class CatalogMatch:
    """Which reader and files an ingest uses, and the catalog dataset they were named as (None: detected)."""

    source: str
    inputs: list[Path]
    entry: Entry | None
    reader_options: dict[str, object]


def reader_options_for(entry: Entry) -> dict[str, object]:
    """Reader options that make a reader produce the catalog's dataset (its manifest name, its variant)."""
    options: dict[str, object] = {"name": entry.manifest_name}
    if entry.source == "pdearena":
        options["conditioned"] = entry.name == "pdearena-ns-cond"
    if entry.source == "cfdbench" and entry.segment is not None:
        options["segment"] = entry.segment
    return options


def match(paths: Sequence[str | Path], *, dataset: str | None = None, source: str | None = None,
          catalog: Catalog | None = None, reader_options: dict[str, object] | None = None) -> CatalogMatch:
    """The source and raw files of an ingest: the catalog entry `dataset` gives the source (and reader options
    naming its variant), else `source`, else the source detected from the files. A named dataset's files must be
    of its source."""
    from dpot_data.errors import InputError
    from dpot_data.sources.detect import detect, expand

    catalog = catalog or load_catalog()
    reader_options = dict(reader_options or {})
    entry = None
    if dataset is not None:
        try:
            entry = catalog.get(dataset)
        except KeyError as exc:
            raise InputError("--dataset", str(exc.args[0])) from None
        if source is not None and source != entry.source:
            raise InputError("--dataset", f"{entry.name} is a {entry.source} dataset, not {source}")
        source = entry.source
        reader_options = {**reader_options_for(entry), **reader_options}
    if source is None:
        found = detect(paths)
        source, inputs = found.source, list(found.paths)
    elif source == "xarray":  # a Zarr store is a folder: the reader expands what it is given itself
        inputs = [Path(p) for p in paths]
    else:
        inputs = expand(paths)
        if source == "cfdbench":
            inputs = list(dict.fromkeys(p.parent if p.is_file() else p for p in inputs))
    if entry is not None:
        try:
            detected = detect(inputs[:1]).source if inputs else source
        except InputError:  # nothing tells (an odd name and unreadable content): the reader will judge
            detected = source
        if detected != source:
            raise InputError(inputs[0], f"holds {detected} data, but {entry.name} is a {source} dataset")
    return CatalogMatch(source, inputs, entry, reader_options)


def select_entries(name: str | None, pretrain: bool) -> tuple[Catalog, list[Entry]]:
    """The catalog and the entries `dpot-data catalog` shows: all, or the one NAME names (CatalogError when none
    does); with `pretrain` only the pre-training ones."""
    catalog = load_catalog()
    entries = list(catalog.entries.values())
    if name is not None:
        found = catalog.find(name)
        if found is None:
            raise CatalogError(f"no catalog dataset {name!r}; `dpot-data catalog` lists them")
        entries = [found]
    return catalog, [e for e in entries if e.pretrain] if pretrain else entries


def entry_facts(entry: Entry) -> dict[str, Any]:
    """One catalog entry as `catalog --json` prints it: the published set's facts, then what each convention's
    ingest stores (`conventions`, the default dpot-reference first), so that frames and split are never ambiguous."""
    from dataclasses import asdict

    facts = {k: v for k, v in asdict(entry).items() if k not in ("frames", "segment", "split", "reference")}
    return {**facts, "manifest_name": entry.manifest_name, "published_frames": entry.frames,
            "default_convention": "dpot-reference", "conventions": entry.conventions()}


def entry_lines(entry: Entry) -> list[str]:
    """`dpot-data catalog NAME`: every fact of one entry, one a line, then the ingest command for it."""
    lines = [f"{key:<12} {value}" for key, value in entry_facts(entry).items()]
    return [*lines, f"ingest:      dpot-data ingest --dataset {entry.name} {entry.files[0]} "
                    f"--out out/{entry.manifest_name}"]


def catalog_table(catalog: Catalog, entries: Sequence[Entry]) -> Any:
    """`dpot-data catalog`: a rich table of the entries, one row each."""
    from rich.table import Table

    table = Table(title=f"{len(entries)} datasets ({catalog.path}); `dpot-data catalog NAME` for one")
    for column in ("dataset", "source", "files", "trajectories", "frames", "grid", "channels", "pre-train"):
        table.add_column(column)
    for e in entries:
        table.add_row(e.name, e.source, e.files[0] + (f" (+{e.file_count - 1})" if (e.file_count or 1) > 1 else ""),
                      str(e.samples or "-"), str((e.reference or {}).get("frames") or e.frames or e.segment),
                      "x".join(map(str, e.grid)), ", ".join(e.channels), "yes" if e.pretrain else "")
    return table
