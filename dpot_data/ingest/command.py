"""One `dpot-data ingest <source>` command, from its option values to the lines it prints: the options checked and
made IngestOptions, then a dry run, one dataset's ingest or a corpus (every catalog dataset found in folders)."""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from dpot_data.errors import InputError
from dpot_data.paths import absolute_path

Warn = Callable[[str], None]  # says one line on stderr


class SizeError(ValueError):
    """A byte size option that is no byte size (the command line reports it as a bad option value)."""


@dataclass
class CommandReport:
    """What the command prints once the work is done: (line, on stderr) in order; `failed`: exit code 2."""

    lines: list[tuple[str, bool]] = field(default_factory=list)
    failed: bool = False


def parse_bytes(text: str) -> int:
    """'256MiB', '64M', '1GB', '1048576' → bytes; SizeError for anything else."""
    units = {"": 1, "b": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": 1 << 20, "mb": 1000**2, "mib": 1 << 20,
             "g": 1 << 30, "gb": 1000**3, "gib": 1 << 30}
    value = text.strip().lower()
    number = value.rstrip("kmgib")
    unit = value[len(number):]
    try:
        return int(float(number) * units[unit])
    except (ValueError, KeyError):
        raise SizeError(f"expected a byte size such as 256MiB, got {text!r}") from None


def command_options(given: dict[str, Any], resolution: Optional[str], max_abs: Optional[float]) -> dict[str, Any]:
    """The ingest's options as the command line gave them (`formats` a comma list), with --resolution parsed
    (InputError naming it) and --max-abs / --resolution left to IngestOptions' defaults when not given."""
    options = {**given, "formats": tuple(f.strip() for f in given["formats"].split(",") if f.strip())}
    if max_abs is not None:  # else IngestOptions' default (dpot_data.ingest.options.MAX_ABS)
        options["max_abs"] = max_abs
    if resolution is not None:  # else IngestOptions' default: per source
        from dpot_data.ingest.options import parse_resolution

        options["resolution"] = parse_resolution(resolution)
    return options


@contextlib.contextmanager
def warnings_to(warn: Warn) -> Iterator[None]:
    """Every warning raised in the body said at once as a `warning:` line."""
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = lambda message, *_a, **_k: warn(f"warning: {message}")
        yield


def _ingest_options(given: dict[str, Any]) -> tuple[Any, Optional[str]]:
    """IngestOptions of the command's options (`split` taken out of `given`) and the --split text as given."""
    from dpot_data.ingest import IngestOptions, parse_split

    split = given.pop("split")
    options = IngestOptions(**{**given, "shard_size": parse_bytes(given["shard_size"])},
                            split=parse_split(split) if split else None)
    return options, split


def ingest_command(source: str, files: list[str], out: str, given: dict[str, Any], *, resolution: Optional[str],
                   max_abs: Optional[float], dataset: Optional[str], reader: dict[str, Any], dry_run: bool,
                   warn: Warn) -> CommandReport:
    """`dpot-data ingest <source>` (every source, corpus and auto; `given`: the shared options as command_options
    takes them): the plan with `dry_run`, else the ingest's outcome lines. Warnings are said through `warn` as
    they happen; bad input raises InputError / CatalogError (one line), a bad --shard-size SizeError."""
    given = command_options(given, resolution, max_abs)
    if dry_run:
        return CommandReport([(line, False) for line in plan_lines(source, files, out, given, dataset, reader, warn)])
    runs, failed = run_command(source, files, out, given, dataset, reader, warn)
    return outcome_report(runs, failed)


def plan_lines(source: str, files: list[str], out: str, given: dict[str, Any], dataset: Optional[str],
               reader: dict[str, Any], warn: Warn) -> list[str]:
    """`ingest --dry-run`: the plan of one dataset's ingest into OUT; nothing is written."""
    from dpot_data.ingest.dry_run import dry_run

    if source == "corpus":
        raise InputError("--dry-run", "expected one dataset's files (`ingest corpus` plans each dataset; "
                                      "dry-run them one at a time with --dataset NAME)")
    with warnings_to(warn):
        options, split = _ingest_options(given)
        lines = dry_run(source, [absolute_path(f) for f in files], options, out=absolute_path(out), dataset=dataset,
                        catalog_split=split is None, reader=reader)
    return [*lines, f"dry run: nothing was written; without --dry-run the output goes to {out}"]


def run_command(source: str, files: list[str], out: str, given: dict[str, Any], dataset: Optional[str],
                reader: dict[str, Any], warn: Warn) -> tuple[list, list]:
    """Run the ingest (every source, corpus and auto): the outcomes and the datasets that failed."""
    from dpot_data.ingest.allocator import reuse_freed_memory
    from dpot_data.ingest.input_hashes import InputHashes
    from dpot_data.ingest.startup import ingest_process

    reuse_freed_memory()  # this process is the ingest's: block buffers are reused, not faulted in again per block
    # the local input files are hashed from here on, beside the imports below (half a second)
    hashes = InputHashes([f for f in files if "://" not in f] if source != "corpus" else [])
    with contextlib.closing(hashes), ingest_process(source if source not in ("auto", "corpus") else None):
        from dpot_data.ingest import run_ingest

        with warnings_to(warn):
            options, split = _ingest_options(given)
            if source == "corpus":
                return run_corpus(files, out, options, dataset, split is None, warn)
            files, out = [absolute_path(f) for f in files], absolute_path(out)  # workers may run elsewhere
            return [run_ingest(None if source == "auto" else source, files, out, options, dataset=dataset,
                               catalog=True, catalog_split=split is None, hashes=hashes, **reader)], []


def run_corpus(files: list[str], out: str, options: Any, dataset: Optional[str], catalog_split: bool,
               warn: Warn) -> tuple[list, list]:
    """`dpot-data ingest corpus`: every catalog dataset found, each into OUT/<dataset>/."""
    from dpot_data.catalog import load_catalog
    from dpot_data.corpus import ingest_corpus

    if any("://" in p for p in [*files, out]):
        raise InputError(out, "expected local folders for `ingest corpus` (URLs work per dataset)")
    catalog = load_catalog()  # once, for the corpus plan, every dataset's job and the warnings below
    run = ingest_corpus([Path(p) for p in files], Path(out), options, dataset=dataset, catalog_split=catalog_split,
                        catalog=catalog)
    for path in run.plan.unknown:
        warn(f"warning: {path}: no catalog dataset has this file name; not ingested")
    if run.plan.missing:
        warn(missing_line(run.plan.missing, len(catalog.pretrain())))
    return run.done, run.failed


def missing_line(missing: list[str], pretrain: int) -> str:
    """One warning line for the pre-training datasets a corpus folder has no raw files of (one line, not one each:
    a folder of a few datasets is the usual case, not a problem)."""
    return (f"warning: {len(missing)} of the {pretrain} pre-training datasets have no raw files here: "
            f"{', '.join(missing)} (`dpot-data catalog NAME` names each one's files and where they come from)")


def outcome_report(runs: list, failed: list) -> CommandReport:
    """One line per dataset written or kept, its warnings and notes, one error line per dataset that failed."""
    report = CommandReport(failed=bool(failed))
    for outcome in runs:
        report.lines += [(f"warning: {warning}", True) for warning in outcome.warnings]
        report.lines += [(note, True) for note in outcome.notes]
        for d in outcome.manifest["datasets"]:
            counts = ", ".join(f"{k} {v}" for k, v in d["splits"]["counts"].items() if v)
            size = sum(s["bytes"] for s in d["shards"])
            report.lines.append((f"{'wrote' if outcome.written else 'kept'} {outcome.path}: {d['name']}, "
                                 f"{d['trajectories']} trajectories ({counts}), {d['frames']} frames, "
                                 f"grid {'x'.join(map(str, d['grid']['shape']))}, {len(d['shards'])} shards "
                                 f"({size} bytes)", False))
    report.lines += [(f"error: {name}: {error}", True) for name, error in failed]
    return report
