"""`resolve(...) -> IngestJob`: everything an ingest decides before it reads a byte of data, decided once, at the
entry point: the options (checked), the output (local folder or URL, and the local folder written for a URL), what
the output holds already (complete: left alone), the inputs (URLs copied into a local cache), the source and catalog
entry, and the reader options. Nothing below re-reads the catalog, the output's manifest or the options."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from dpot_data import fs
from dpot_data.errors import InputError
from dpot_data.ingest.identity import InputIdentity
from dpot_data.ingest.input_hashes import content_differs
from dpot_data.ingest.options import PER_SOURCE as PER_SOURCE_RESOLUTION
from dpot_data.ingest.options import IngestOptions, IngestOutcome, check_options, default_resolution
from dpot_data.ingest.publish import existing_outcome
from dpot_format.grid import grid_text
from dpot_format.io import file_kind


@dataclass(frozen=True)
class Target:
    """Where an ingest writes: `local` (the folder the local ingest writes), `remote` (the URL uploaded to, None for
    a local output), `workdir` (the job's local working folder for URL inputs or output, None when all is local)
    and `seen` (for a URL: sha256 of its manifest bytes when the job was resolved, None when there was none; a local
    OUT is re-checked under its lock by publish instead)."""

    out: str
    local: Path
    remote: str | None
    workdir: Path | None
    seen: str | None


@dataclass(frozen=True)
class IngestJob:
    """One ingest, resolved: what to read (`source`, local `inputs`, `reader_options`), how (`options`, the final
    ones, the catalog's split included), where to (`target`), and what the output holds already (`existing`: the
    outcome of a complete output left alone, else None)."""

    source: str
    inputs: tuple[Path, ...]
    target: Target
    options: IngestOptions
    reader_options: Mapping[str, Any] = field(default_factory=dict)
    input_names: Mapping[str, str] = field(default_factory=dict)  # local copy (resolved) -> URL as given
    entry: Any = None  # the catalog dataset named or found (dpot_data.catalog.Entry), None when not in the catalog
    catalog: Any = None  # the catalog the files are compared with (loaded once), None: no comparison
    catalog_split: bool = False  # the catalog's split applies when the reader has none
    existing: IngestOutcome | None = None
    upload_only: bool = False  # a URL job whose local output is complete (its upload was cut short): upload it
    identity: InputIdentity | None = None  # the inputs as they were when the job was resolved (read, then checked)


def manifest_digest(out: str) -> str | None:
    """sha256 of the manifest bytes at an output (local or URL), None when there is none: what "the output the job
    saw" means when a later step checks that nobody else committed in between."""
    path = fs.join(out, "manifest.json")
    if not fs.exists(path):
        return None
    try:
        return hashlib.sha256(fs.read_bounded(path, 1 << 30)).hexdigest()
    except Exception as exc:  # noqa: BLE001 - a manifest that cannot be read is judged by the reader later
        return f"unreadable: {exc}"


def job_key(paths: Sequence[str], out: str, source: str | None, dataset: str | None, options: IngestOptions,
            reader_options: Mapping[str, Any]) -> str:
    """A digest of everything that makes two ingests into one URL different jobs (16 hex digits)."""
    text = json.dumps({"out": out, "inputs": list(paths), "source": source, "dataset": dataset,
                       "options": options.identity(), "reader": dict(reader_options)}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def work_root() -> Path:
    """Where the local working folders of URL jobs live (one per output URL, one job folder inside)."""
    return Path(tempfile.gettempdir()) / "dpot-work"


def url_key(out: str) -> str:
    """16 hex digits naming an output URL's working folder and lock."""
    return hashlib.sha256(out.encode("utf-8")).hexdigest()[:16]


def make_target(paths: Sequence[str], out: str, key: str, workdir: str | os.PathLike[str] | None) -> Target:
    """The local folder a job writes and its working folder: for a URL output or URL inputs, a folder keyed by the
    job (`workdir`/<key>, default $TMPDIR/dpot-work/<url>/<key>), so that another job into the same URL never
    finds this one's output; for local paths, OUT itself."""
    remote = None if fs.is_local(out) else out
    needs_work = remote is not None or any(not fs.is_local(p) for p in paths)
    base = Path(workdir) if workdir is not None else work_root() / url_key(out)
    work = base / key if needs_work else None
    local = work / "out" if remote is not None and work is not None else Path(fs.local_path(out))
    return Target(out, local, remote, work, manifest_digest(out) if remote is not None else None)


def check_out_name(out: str) -> None:
    """An output name must be valid UTF-8: it is recorded in the manifest and printed."""
    try:
        out.encode("utf-8")
    except UnicodeEncodeError:
        shown = os.fsencode(out).decode("utf-8", "backslashreplace")
        raise InputError(shown, "expected an output folder name that is valid UTF-8 (it is recorded in the manifest "
                                "and printed); rename it") from None


def check_inputs(paths: Sequence[str]) -> None:
    """Every local input exists and is a regular file or a folder; one line naming the path as given otherwise (a
    link loop, a dangling link, a device or FIFO behind a link)."""
    for p in paths:
        if not fs.is_local(p):
            continue
        local = fs.local_path(p)
        try:
            mode = os.stat(local).st_mode
        except FileNotFoundError:
            kind = "a dangling symbolic link" if os.path.islink(local) else None
            raise InputError(p, f"is {kind}, expected a file" if kind else "file not found") from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise InputError(p, "is a symbolic link loop, expected a file") from None
            raise InputError(p, f"cannot be read ({exc.strerror})") from None
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            raise InputError(p, f"is {file_kind(mode)}, expected a regular file")


def _localized(path: str, cache: Path) -> str:
    """`fs.localize`, with an input URL that names nothing (or that this user may not read) as one InputError line
    naming it; other errors (a full disk while copying it in) are said by the caller."""
    try:
        return fs.localize(path, cache)
    except FileNotFoundError:
        raise InputError(path, "not found; expected a file or folder at this URL") from None
    except PermissionError as exc:
        raise InputError(path, f"cannot be read ({exc.strerror or exc}); expected a readable file or folder at "
                               "this URL") from None
    except ConnectionError as exc:
        if type(exc).__name__ != "OfflineModeIsEnabled":  # huggingface_hub's, for hf:// with HF_HUB_OFFLINE=1
            raise
        raise InputError(path, "cannot be reached: HF_HUB_OFFLINE=1 is set; expected a local copy of the file, "
                               "or HF_HUB_OFFLINE unset to download it") from None


def localize_inputs(paths: Sequence[str], target: Target) -> tuple[list[str], dict[str, str]]:
    """Local paths for the inputs (URLs streamed into the job's working folder) and the local copy -> URL names."""
    if target.workdir is None:
        return [fs.local_path(p) for p in paths], {}
    local = [_localized(p, target.workdir / "inputs") for p in paths]
    names = {str(Path(l).resolve()): str(u) for u, l in zip(paths, local) if not fs.is_local(u)}
    return local, names


def resolve(source: str | None, paths: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str],
            options: IngestOptions | None = None, *, dataset: str | None = None, catalog: Any = None,
            catalog_split: bool = True, workdir: str | os.PathLike[str] | None = None,
            reader_options: Mapping[str, Any] | None = None) -> IngestJob:
    """Decide everything about one ingest before reading data (see the module docstring); the caller holds the
    output's lock. `catalog`: True or a dpot_data.catalog.Catalog to compare the files with the catalog."""
    opts = options or IngestOptions()
    check_options(opts)
    texts = [os.fsdecode(p) for p in paths]  # str, Path or bytes (a name that is not UTF-8 arrives as bytes)
    out = str(out)
    check_out_name(out)
    source = None if source == "auto" else source
    reader_options = dict(reader_options or {})
    target = make_target(texts, out, job_key(texts, out, source, dataset, opts, reader_options), workdir)
    existing = existing_outcome(out, opts.overwrite)
    if existing is not None:  # complete: read nothing, unless it is another job's output
        problem = another_jobs_output(existing.manifest, texts, opts)
        if problem:
            raise InputError(out, f"{problem}; one output folder holds one ingest: choose another --out (`ingest "
                                  "corpus` writes one sub-folder per dataset) or pass --overwrite to replace it")
        return IngestJob(source or "", (), target, opts, existing=existing)
    check_inputs(texts)
    if target.remote is not None and (target.local / "manifest.json").is_file():  # this job, its upload cut short
        return IngestJob(source or "", (), target, opts, upload_only=True)
    local, names = localize_inputs(texts, target)
    job = _with_catalog(IngestJob(source or "", tuple(Path(p) for p in local), target, opts, reader_options,
                                  names), source, dataset, catalog, catalog_split)
    return replace(job, identity=InputIdentity.of(job.inputs, exclude=(target.local, target.workdir)))


def another_jobs_output(manifest: Mapping[str, Any], inputs: Sequence[str], opts: IngestOptions) -> str | None:
    """Why the complete output described by `manifest` is not what this job would write (another --name or
    --resolution, or inputs it was not made from: by path, else by their bytes), None when it is: such an output is
    never silently "kept" for another ingest. Inputs at another path are hashed only when all else agrees."""
    datasets = list(manifest.get("datasets") or [])
    names = ", ".join(str(d.get("name")) for d in datasets)
    entries = [i for d in datasets for i in d.get("inputs") or [] if isinstance(i, Mapping)]
    recorded = [str(i.get("path", "")) for i in entries]
    foreign = [t for t in inputs if not _recorded_input(t, recorded)] if recorded else []
    if foreign and "://" in "".join(foreign):  # a URL is compared by name only
        return f"holds {names}, made from other inputs than {', '.join(foreign)}"
    problem = _settings_problem(datasets, names, opts)
    if problem is not None or not foreign:
        return problem
    given = [t for t in inputs if t not in foreign]  # at their recorded path: the rest must match by content
    rest = [e for e in entries if not any(_recorded_input(t, [str(e.get("path", ""))]) for t in given)]
    skipped = [str(s.get("what", "")) for d in datasets for s in d.get("skipped") or [] if isinstance(s, Mapping)]
    why = content_differs(foreign, rest, skipped)
    return None if why is None else f"holds {names}, made from other inputs than {', '.join(foreign)} ({why})"


def _settings_problem(datasets: list[Any], names: str, opts: IngestOptions) -> str | None:
    """Why the output's datasets are not what --name and --resolution ask for, None when they are."""
    if opts.name and opts.name not in [d.get("name") for d in datasets]:
        return f"holds {names}, not the dataset --name {opts.name} asks for"
    if opts.resolution == PER_SOURCE_RESOLUTION:
        return None
    for d in datasets:
        grid = d.get("grid") or {}
        shape = list(grid.get("shape") or [])
        res = default_resolution(opts.resolution, len(shape))
        expected = list(grid.get("native_shape") or shape) if res is None else \
            list(res) if isinstance(res, tuple) else [res] * len(shape)
        if shape != expected:
            return (f"holds {d.get('name')} on a {'x'.join(map(str, shape))} grid, not the "
                    f"{'x'.join(map(str, expected))} that --resolution {grid_text(opts.resolution)} asks for")
    return None


def _recorded_input(text: str, recorded: Sequence[str]) -> bool:
    """Whether the input `text` (file, folder or URL) is one the manifest's inputs came from by name: the same path,
    or a file under the same folder (else `content_differs` compares its bytes)."""
    paths = [text.rstrip("/")] if "://" in text else list({os.path.abspath(text), os.path.realpath(text)})
    return any(r == p or r.startswith(p.rstrip("/") + "/") for r in recorded for p in paths)


def _with_catalog(job: IngestJob, source: str | None, dataset: str | None, catalog: Any,
                  catalog_split: bool) -> IngestJob:
    """The job with its source, inputs and reader options as the catalog (loaded once, here) names them."""
    from dpot_data import catalog as cat

    if not (bool(catalog) or dataset is not None or source is None):
        return job
    book = catalog if isinstance(catalog, cat.Catalog) else cat.load_catalog()
    found = cat.match(list(job.inputs), dataset=dataset, source=source, catalog=book,
                      reader_options=dict(job.reader_options))
    return replace(job, source=found.source, inputs=tuple(found.inputs), reader_options=found.reader_options,
                   entry=found.entry, catalog=book, catalog_split=catalog_split and job.options.split is None)
