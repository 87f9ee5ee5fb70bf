"""`inspect --verify`: re-hash every shard and Zarr array of an output folder against its manifest.

Returns every problem found (never stops at the first), each naming the file or array: a missing file, a size or
sha256 that differs from the manifest, a manifest that does not follow the schema. Shard files on disk that the
manifest does not list are reported too, as warnings (leftovers of an interrupted run, for instance).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator

from dpot_data import fs
from dpot_data.hashing import sha256_array
from dpot_data.manifest import validation_errors
from dpot_data.output import MANIFEST, OutputError, load_manifest
from dpot_data.scheduler import SchedulerOptions, scheduler_context


@dataclass(frozen=True)
class Mismatch:
    """One problem: `what` (path relative to the output, or "<dataset>/<array>" for Zarr), `kind`, details."""

    what: str
    kind: str  # "missing" | "bytes" | "sha256" | "schema" | "manifest" | "unlisted"
    expected: str = ""
    actual: str = ""

    @property
    def fatal(self) -> bool:
        """Unlisted files are warnings; everything else means the output cannot be trusted."""
        return self.kind != "unlisted"

    def __str__(self) -> str:
        if self.kind == "missing":
            return f"{self.what}: missing (listed in the manifest)"
        if self.kind == "unlisted":
            return f"{self.what}: not listed in the manifest (warning)"
        if self.kind in ("schema", "manifest"):
            return f"{self.what}: {self.actual}"
        return f"{self.what}: {self.kind} mismatch (manifest {self.expected}, found {self.actual})"


@dataclass(frozen=True)
class Check:
    """One item to re-hash: a shard file or a Zarr array, with what the manifest says it should be."""

    what: str
    kind: str  # "shard" | "zarr"
    location: str  # file URL/path, or the Zarr store path
    sha256: str
    bytes: int | None = None
    group: str = ""
    array: str = ""


def zarr_array_sha256(store_path: str, group: str, array: str) -> str:
    """sha256 of a Zarr array's uncompressed C-order bytes, the manifest's definition (`hashing.sha256_array`)."""
    import zarr

    store = fs.zarr_store(store_path, read_only=True)
    return sha256_array(zarr.open_array(store, mode="r", path=f"{group}/{array}"))


def plan(root: str, manifest: dict) -> Iterator[Check]:
    """Every shard and Zarr array the manifest lists, as checks to run."""
    for entry in manifest.get("datasets", []):
        for shard in entry.get("shards", []):
            yield Check(shard["path"], "shard", fs.join(root, shard["path"]), shard["sha256"], int(shard["bytes"]))
        z = entry.get("zarr")
        if z:
            for name, digest in sorted(z.get("arrays", {}).items()):
                yield Check(f"{z['path']}/{z['group']}/{name}", "zarr", fs.join(root, z["path"]), digest,
                            group=z["group"], array=name)


def run_check(check: Check) -> list[Mismatch]:
    """Re-hash one item; the mismatches it shows (empty when it matches)."""
    if check.kind == "shard":
        if not fs.exists(check.location):
            return [Mismatch(check.what, "missing")]
        digest, size = fs.sha256_of(check.location)
        out = []
        if check.bytes is not None and size != check.bytes:
            out.append(Mismatch(check.what, "bytes", str(check.bytes), str(size)))
        if digest != check.sha256:
            out.append(Mismatch(check.what, "sha256", check.sha256, digest))
        return out
    if not fs.exists(fs.join(check.location, check.group, check.array, "zarr.json")):
        return [Mismatch(check.what, "missing")]
    digest = zarr_array_sha256(check.location, check.group, check.array)
    return [] if digest == check.sha256 else [Mismatch(check.what, "sha256", check.sha256, digest)]


def unlisted_shards(root: str, manifest: dict) -> list[Mismatch]:
    """Files under `shards/` that no dataset entry lists (warnings)."""
    listed = {s["path"] for e in manifest.get("datasets", []) for s in e.get("shards", [])}
    filesystem, base = fs.filesystem(fs.join(root, "shards"))
    if not filesystem.exists(base):
        return []
    found = []
    for path in sorted(filesystem.find(base)):
        rel = "shards/" + path[len(base.rstrip("/")) + 1 :]
        if rel not in listed:
            found.append(Mismatch(rel, "unlisted"))
    return found


def verify_output(root: str, options: SchedulerOptions | None = None,
                  progress: Callable[[Check, list[Mismatch]], None] | None = None) -> list[Mismatch]:
    """All problems of the output folder (or URL) `root`; hashing runs on the chosen scheduler."""
    try:
        manifest = load_manifest(root)
    except OutputError as exc:
        return [Mismatch(MANIFEST, "manifest", actual=str(exc))]
    problems = [Mismatch(MANIFEST, "schema", actual=line) for line in validation_errors(manifest)]
    checks = list(plan(root, manifest))
    with scheduler_context(options or SchedulerOptions()) as runner:
        for check, found in zip(checks, runner.imap(run_check, checks)):
            if progress is not None:
                progress(check, found)
            problems.extend(found)
    problems.extend(unlisted_shards(root, manifest))
    return problems


def summarise(problems: list[Mismatch], checked: int | None = None) -> tuple[int, list[str]]:
    """Exit code (1 when any problem is fatal) and the lines to print."""
    lines = [str(p) for p in problems]
    fatal = [p for p in problems if p.fatal]
    if fatal:
        lines.append(f"FAILED: {len(fatal)} problem(s)")
        return 1, lines
    lines.append("OK" if checked is None else f"OK: {checked} item(s) match the manifest")
    return 0, lines


def manifest_items(root: str) -> int:
    """Number of shards and Zarr arrays the manifest lists (for the summary line)."""
    return sum(1 for _ in plan(root, load_manifest(root)))


def as_json(problems: list[Mismatch]) -> list[dict[str, Any]]:
    """Problems as JSON-able dicts (for --json output)."""
    return [{"what": p.what, "kind": p.kind, "expected": p.expected, "actual": p.actual, "fatal": p.fatal}
            for p in problems]
