"""CFDBench reader (docs/sources.md): cavity, tube, cylinder and dam cases, with the geometry mask from `case.json`.

Input: the tree root, problem or subset folders, case folders, or files inside case folders; every
`<problem>/<subset>/caseNNNN/` with `u.npy`, `v.npy` (T_i, 64, 64) [t, y, x] and `case.json` is one case.

Two conventions (docs/sources.md, "CFDBench conventions"):
- "dpot-reference" (default): the samples are the reference DPOT pipeline's 20-frame pieces (ceil(T_i/20) per case,
  the last padded with its last frame), channels u, v and its geometry channel (tube and cylinder fields padded with
  an inlet column and wall rows, resized back with bilinear align_corners=True), its per-problem random.seed(0) case
  split (dev cases and dam left out, listed in `skipped`), `model_layout` "yx". Sample ids
  "<problem>/<subset>/caseNNNN#0/seg<k>" (`reference_piece_id`, `raw_piece`).
- "canonical": every case is one trajectory (u, v), ordered by problem, subset and case number. Trajectories differ
  in length: `fields` is NaN-padded to the longest, `lengths` gives each one's frames, and ingest cuts them into
  `segment`-frame pieces after its seeded split.

The grid is 64×64 cell centres over the physical domain (row 0 at the bottom). Solid cells, whose centre lies
inside the obstacle, get mask 0:
cylinder, a disc of `radius` centred at (−x_min, −y_min) on [0, x_max − x_min] × [0, y_max − y_min];
dam, the barrier x ∈ [0.5, 0.5 + barrier_width], y ∈ [0, barrier_height] on [0, width] × [0, height];
cavity and tube are all fluid (the tube's inlet column and wall rows are boundary values, not solid).
"""

from __future__ import annotations

import json
import math
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import dask.array as da
import numpy as np
import xarray as xr

from dpot_format.names import manifest_name
from dpot_data.errors import InputError
from dpot_data.sources._blocks import (SampleBlocks, all_finite, as_path, auto_block, check_sizes, check_stored,
                                        checked, distinct_files, file_token, nonfinite_error, npy_info, on_disk_bytes,
                                        text_path, to_dask)
from dpot_data.sources.base import MAX_JSON_BYTES, ReadResult

READER_VERSION = "1"
CHANNELS = ("u", "v")
FRAME_DT = 0.1
DEFAULT_SEGMENT = 20
KEYS = {
    "cavity": ("vel_top", "density", "viscosity", "height", "width"),
    "tube": ("vel_in", "density", "viscosity", "height", "width"),
    "cylinder": ("vel_in", "density", "viscosity", "radius", "x_min", "x_max", "y_min", "y_max"),
    "dam": ("velocity", "density", "viscosity", "barrier_height", "barrier_width", "height", "width"),
}
VELOCITY_KEY = {"cavity": "vel_top", "tube": "vel_in", "cylinder": "vel_in", "dam": "velocity"}
_CASE = re.compile(r"^case(\d+)$")
CONVENTIONS = ("dpot-reference", "canonical")


@dataclass(frozen=True)
class Case:
    """One case folder, checked: its problem, subset, number, parameters, frame count and on-disk dtypes."""

    folder: Path
    problem: str
    subset: str
    number: int
    params: dict[str, object]
    frames: int
    grid: tuple[int, int]
    dtypes: tuple[str, str]

    @property
    def id(self) -> str:
        return f"{self.problem}/{self.subset}/{self.folder.name}"


def domain_size(problem: str, params: dict[str, object]) -> tuple[float, float]:
    """Physical (width, height) covered by the grid."""
    if problem == "cylinder":
        return float(params["x_max"]) - float(params["x_min"]), float(params["y_max"]) - float(params["y_min"])
    return float(params["width"]), float(params["height"])


def geometry_mask(problem: str, params: dict[str, object], shape: tuple[int, int]) -> np.ndarray:
    """uint8 (y, x) mask, 1 = fluid, 0 = solid, of the obstacle `case.json` describes, on cell centres."""
    ny, nx = shape
    lx, ly = domain_size(problem, params)
    x = (np.arange(nx) + 0.5) * lx / nx
    y = (np.arange(ny) + 0.5) * ly / ny
    yy, xx = np.meshgrid(y, x, indexing="ij")
    solid = np.zeros(shape, dtype=bool)
    if problem == "cylinder":
        cx, cy, r = -float(params["x_min"]), -float(params["y_min"]), float(params["radius"])
        solid = (xx - cx) ** 2 + (yy - cy) ** 2 <= r * r
    elif problem == "dam":
        x0, x1, top = 0.5, 0.5 + float(params["barrier_width"]), float(params["barrier_height"])
        solid = (xx >= x0) & (xx <= x1) & (yy <= top)
    return (~solid).astype(np.uint8)


def _case_id(folder: Path) -> str:
    """"<problem>/<subset>/caseNNNN": what a case's trajectory ids are made from."""
    return f"{folder.parent.parent.name}/{folder.parent.name}/{folder.name}"


def _case_folders(paths: Sequence[Path]) -> list[Path]:
    """Case folders named by or below the given paths (files name their folder), each path UTF-8 text and each case
    folder kept once: the same folder reached twice (a path given twice, a tree and a case inside it, a link under
    the same <problem>/<subset>/caseNNNN) is read once, with a warning when given through different paths; the same
    folder under another <problem>/<subset>/caseNNNN is refused (`distinct_files`)."""
    found: list[Path] = []
    for p in paths:
        text_path(p)
        if p.is_file():
            p = p.parent
        if not p.exists():
            raise InputError(p, "not found")
        if _CASE.match(p.name):
            found.append(p)
            continue
        folders = sorted({q.parent for pattern in ("case.json", "u.npy") for q in p.rglob(pattern)
                          if _CASE.match(q.parent.name)})
        if not folders:
            raise InputError(p, "expected CFDBench case folders <problem>/<subset>/caseNNNN/ with u.npy, v.npy, "
                                "case.json below it; found none")
        found.extend(folders)
    for folder in found:
        text_path(folder)
    return distinct_files(found, name_of=_case_id, what="case folder")


def _check_case(folder: Path) -> Case | str:
    """Validate one case folder; a string says why it is skipped (unreadable file), InputError for wrong content."""
    problem, subset = folder.parent.parent.name, folder.parent.name
    if problem not in KEYS:
        raise InputError(folder, f"expected the case under <problem>/<subset>/ with problem one of {sorted(KEYS)}, "
                                 f"found {problem!r}")
    case_json = folder / "case.json"
    for needed in (case_json, folder / "u.npy", folder / "v.npy"):
        if not needed.is_file():
            return f"{needed.name} is missing"
    try:
        size = case_json.stat().st_size
        if size > MAX_JSON_BYTES:
            raise InputError(case_json, f"holds {size} bytes; expected a small JSON object of case parameters "
                                        f"(at most {MAX_JSON_BYTES} bytes, dpot_data.sources.base.MAX_JSON_BYTES)")
        params = json.loads(case_json.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:  # RecursionError: nested
        return f"case.json is unreadable: {exc}"  # deeper than the parser goes
    if not isinstance(params, dict):
        raise InputError(case_json, "expected a JSON object of case parameters")
    missing = [k for k in KEYS[problem] if k not in params]
    if missing:
        raise InputError(case_json, f"{problem} case: missing key(s) {missing}; expected {list(KEYS[problem])}")
    for k in KEYS[problem]:
        if isinstance(params[k], bool) or not isinstance(params[k], (int, float)):
            raise InputError(case_json, f"key {k!r}: expected a number, found {params[k]!r}")
    headers = []
    for name in ("u.npy", "v.npy"):
        try:
            shape, dtype, offset = npy_info(folder / name)
        except (OSError, ValueError, EOFError) as exc:
            return f"{name} is unreadable (truncated or corrupt): {exc}"
        if len(shape) != 3 or shape[0] < 1 or dtype.kind != "f":
            raise InputError(folder / name, f"expected a float array (T, y, x), found {dtype} {shape}")
        check_sizes(folder / name, name[0], frames=shape[0], space=shape[1:], channels=len(CHANNELS))
        data = math.prod(shape) * dtype.itemsize
        size = (folder / name).stat().st_size
        if size < offset + data:
            return (f"{name} is unreadable (truncated or corrupt): its header declares {data} data bytes, the file "
                    f"ends {offset + data - size} bytes short")
        check_stored(folder / name, name[0], shape, dtype.itemsize, on_disk_bytes(folder / name),
                     "on disk (the file is sparse)")
        headers.append((shape, dtype))
    (shape_u, dt_u), (shape_v, dt_v) = headers
    if shape_u != shape_v:
        raise InputError(folder / "v.npy", f"expected the shape of u.npy {shape_u}, found {shape_v}")
    number = int(_CASE.match(folder.name).group(1))
    return Case(folder, problem, subset, number, params, shape_u[0], (shape_u[1], shape_u[2]),
                (dt_u.name, dt_v.name))


# ------------------------------------------------------------------------------------------ dpot-reference convention
REFERENCE_PROBLEMS = ("cavity", "tube", "cylinder")  # the reference never processes dam
REFERENCE_SUBSETS = ("prop", "bc", "geo")  # the order in which it lists a problem's case folders before shuffling
REFERENCE_CHANNELS = ("u", "v", "mask")
REFERENCE_PRED_CHANNELS = 2  # its evaluation scores u and v only


def reference_piece_id(piece: str) -> str:
    """Our sample id of the reference's piece "<problem>/<subset>/caseNNNN/seg<k>": "<problem>/<subset>/caseNNNN#0/
    seg<k>" (the case id with the "#0" every CFDBench trajectory id carries, then the piece). `raw_piece` inverts it."""
    case, seg = piece.rsplit("/", 1)
    return f"{case}#0/{seg}"


def raw_piece(sample_id: str) -> str:
    """The reference's piece name ("<problem>/<subset>/caseNNNN/seg<k>") of our sample id: `reference_piece_id`
    inverted."""
    case, seg = sample_id.rsplit("/", 1)
    if not case.endswith("#0") or not re.fullmatch(r"seg\d+", seg):
        raise ValueError(f"not a CFDBench piece id <problem>/<subset>/caseNNNN#0/seg<k>: {sample_id!r}")
    return f"{case[:-2]}/{seg}"


def reference_split(case_ids: Sequence[str]) -> dict[str, str]:
    """The reference's split of each problem's cases, given as ids "<problem>/<subset>/caseNNNN": per problem, the
    folders listed subset by subset (prop, bc, geo; no other subset is listed) and by case number, shuffled with
    Python's random.seed(0), then 80 % train, 10 % dev (never used), the rest test; counts rounded for cavity and
    truncated for tube and cylinder (docs/conventions.md). Returns case id -> "train" | "dev" | "test" for the cases
    of cavity, tube and cylinder in the prop, bc and geo subsets. The split is the reference's only when every case
    folder of the problem is given (the shuffle depends on the whole list)."""
    out: dict[str, str] = {}
    for problem in REFERENCE_PROBLEMS:
        listed = []
        for cid in case_ids:
            prob, subset, name = cid.split("/")
            match = _CASE.match(name)
            if prob == problem and subset in REFERENCE_SUBSETS and match:
                listed.append((REFERENCE_SUBSETS.index(subset), int(match.group(1)), cid))
        listed = [cid for _, _, cid in sorted(set(listed))]
        random.Random(0).shuffle(listed)  # the same order as random.seed(0); random.shuffle, without the global state
        n = len(listed)
        cut = round if problem == "cavity" else int
        n_train, n_dev = int(cut(0.8 * n)), int(cut(0.1 * n))
        for i, cid in enumerate(listed):
            out[cid] = "train" if i < n_train else ("dev" if i < n_train + n_dev else "test")
    return out


def reference_mask_channel(case: Case, grid: tuple[int, int]) -> np.ndarray:
    """The reference's geometry channel at the raw grid (before its inlet/wall padding): all ones, but for the
    cylinder 0 on the points (x_min + j dx, y_min + i dy), dx = (x_max - x_min) / nx, dy = (y_max - y_min) / ny,
    that lie in a disc of `radius` at (0.5, 0.5), as the reference places it (grid corners, not cell centres; for the
    published domains, x in [-0.06, 0.16], that disc lies outside the grid, so the channel is all ones there too)."""
    ny, nx = grid
    if case.problem != "cylinder":
        return np.ones(grid)
    p = case.params
    x_min, y_min = float(p["x_min"]), float(p["y_min"])
    dx = (float(p["x_max"]) - x_min) / nx
    dy = (float(p["y_max"]) - y_min) / ny
    x = x_min + np.arange(nx) * dx
    y = y_min + np.arange(ny) * dy
    yy, xx = np.meshgrid(y, x, indexing="ij")
    return (~((xx - 0.5) ** 2 + (yy - 0.5) ** 2 <= float(p["radius"]) ** 2)).astype(np.float64)


def _inlet_and_walls(frames: np.ndarray, inlet: float) -> np.ndarray:
    """(T, y, x) -> (T, y, x) as the reference prepares tube and cylinder fields: an inlet column of value `inlet`
    on the left, then a wall row of 0 above and below, then a bilinear (align_corners=True) resize back to the
    original grid, in float64."""
    import torch
    import torch.nn.functional as F

    t, ny, nx = frames.shape
    a = np.concatenate([np.full((t, ny, 1), inlet), frames.astype(np.float64)], axis=2)
    a = np.concatenate([np.zeros((t, 1, nx + 1)), a, np.zeros((t, 1, nx + 1))], axis=1)
    out = F.interpolate(torch.from_numpy(a)[:, None], size=(ny, nx), mode="bilinear", align_corners=True)
    return out[:, 0].numpy()


def _load(case: Case, name: str, check: bool) -> np.ndarray:
    """u or v of a case, (T, y, x) as stored; `check`: NaN/Inf raise InputError naming the file and the case."""
    arr = np.load(case.folder / f"{name}.npy", allow_pickle=False)
    if check and not all_finite(arr):
        raise nonfinite_error(case.folder / f"{name}.npy", name, f"{case.id}#0", arr)
    return arr


def reference_case_fields(case: Case, check: bool = False) -> np.ndarray:
    """(T, 3, y, x) float32 of one case as the reference hands it on: u, v and its geometry channel; `check`: NaN/Inf
    in u or v raise InputError."""
    u = _load(case, "u", check)
    v = _load(case, "v", check)
    mask = np.broadcast_to(reference_mask_channel(case, case.grid), u.shape)
    if case.problem in ("tube", "cylinder"):
        inlet = float(case.params[VELOCITY_KEY[case.problem]])
        u, v, mask = _inlet_and_walls(u, inlet), _inlet_and_walls(v, 0.0), _inlet_and_walls(mask, 0.0)
    return np.stack([u, v, mask], axis=1).astype(np.float32)


class _ReferencePieces(SampleBlocks):
    """(N, segment, 3, y, x) float32: the reference's pieces, the last of each case padded with its last frame."""

    def __init__(self, pieces: list[tuple[Case, int]], segment: int) -> None:
        self.pieces, self.segment = pieces, segment
        ny, nx = pieces[0][0].grid
        self.shape = (len(pieces), segment, len(REFERENCE_CHANNELS), ny, nx)

    def block(self, n0: int, n1: int, *, check: bool | None = None) -> np.ndarray:
        check = self.checks if check is None else check
        out = np.empty((n1 - n0,) + self.shape[1:], dtype=np.float32)
        cache: dict[Path, np.ndarray] = {}
        for i, (case, k) in enumerate(self.pieces[n0:n1]):
            if case.folder not in cache:
                cache = {case.folder: reference_case_fields(case, check)}
            frames = cache[case.folder]
            idx = np.minimum(np.arange(k * self.segment, (k + 1) * self.segment), len(frames) - 1)
            out[i] = frames[idx]
        return out


def _case_files(cases: Sequence[Case]) -> list[Path]:
    """The u.npy, v.npy and case.json of each case, in order: what is hashed and recorded as the inputs."""
    return [c.folder / n for c in cases for n in ("u.npy", "v.npy", "case.json")]


def _geometry_masks(cases: Sequence[Case], grid: tuple[int, int], fields: da.Array) -> da.Array:
    """The geometry mask of each sample's case, chunked along samples like `fields`."""
    masks = np.stack([geometry_mask(c.problem, c.params, grid) for c in cases])
    return da.from_array(masks, chunks=(fields.chunks[0], *grid))


def _reference_cases(cases: list[Case], listed: list[str],
                     skipped: list[tuple[str, str]]) -> tuple[list[Case], dict[str, str]]:
    """The cases the reference trains or tests on and its split of `listed`; the others are added to `skipped`."""
    kept = []
    for c in cases:
        if c.problem not in REFERENCE_PROBLEMS:
            skipped.append((c.id, "not part of the DPOT reference pre-training (the reference never processes "
                                  f"{c.problem}); ingest it with --convention canonical"))
        elif c.subset not in REFERENCE_SUBSETS:
            skipped.append((c.id, f"not part of the DPOT reference pre-training (the reference lists the subsets "
                                  f"{', '.join(REFERENCE_SUBSETS)} only); ingest it with --convention canonical"))
        else:
            kept.append(c)
    if not kept:
        raise InputError(cases[0].folder, "no cavity, tube or cylinder case in a prop, bc or geo subset: the "
                                          "dpot-reference convention has none of these cases (use --convention "
                                          "canonical)")
    splits = reference_split(listed)
    for c in kept:
        if splits[c.id] == "dev":
            skipped.append((c.id, "the reference's dev part of its case split (never used by DPOT)"))
    return [c for c in kept if splits[c.id] != "dev"], splits


def _reference_dataset(kept: list[Case], pieces: list[tuple[Case, int]], fields: da.Array, mask: da.Array,
                       name: str | None, segment: int) -> xr.Dataset:
    """The dpot-reference dataset of the pieces: channels u, v, mask, the reference's orientation and split rule."""
    ny, nx = kept[0].grid
    order = {p: i for i, p in enumerate(KEYS)}
    return xr.Dataset(
        {"fields": (("sample", "time", "channel", "y", "x"), fields), "mask": (("sample", "y", "x"), mask)},
        coords={"sample": np.array([f"{c.id}#0/seg{k}" for c, k in pieces], dtype=str),
                "time": FRAME_DT * np.arange(segment), "channel": np.array(REFERENCE_CHANNELS),
                "y": (np.arange(ny) + 0.5) / ny, "x": (np.arange(nx) + 0.5) / nx},
        attrs={"source": "cfdbench", "dataset": manifest_name(name or "cfdbench"), "boundary": "non-periodic",
               "parameters": {"problems": sorted({c.problem for c in kept}, key=order.get)}, "dt": FRAME_DT,
               "model_layout": "yx",  # the reference's (H, W) are the stored rows and columns of u.npy
               "pred_channels": REFERENCE_PRED_CHANNELS,
               "split_rule": "dpot-reference: per problem, case folders (prop, bc, geo; by number) shuffled with "
                             "Python random.seed(0); 80 % train, 10 % dev (left out), the rest test (cavity rounds, "
                             f"tube and cylinder truncate); {segment}-frame pieces, the last padded with its last "
                             "frame",
               "provenance": {
                   "reader": "dpot_data.sources.cfdbench", "reader_version": READER_VERSION,
                   "convention": "dpot-reference: channels u, v and the reference's geometry channel; tube and "
                                 "cylinder fields padded with an inlet column and wall rows and resized back "
                                 "(bilinear, align_corners=True) as the reference does",
                   "cases": {c.id: {"frames": c.frames, "dtype": list(c.dtypes), "case": c.params} for c in kept},
               }},
    )


def _read_reference(cases: list[Case], listed: list[str], skipped: list[tuple[str, str]], name: str | None,
                    segment: int, block: int | None, checks: bool = True) -> ReadResult:
    """The dpot-reference convention: the reference's pieces, channels, split and orientation. `listed`: the ids of
    every case folder given (readable or not), over which the reference's shuffle runs, so that a case left out for
    unreadable or non-finite data does not move the others between splits."""
    kept, splits = _reference_cases(cases, listed, skipped)
    pieces = [(c, k) for c in kept for k in range(math.ceil(c.frames / segment))]
    grid = kept[0].grid
    blk = auto_block(segment * len(REFERENCE_CHANNELS) * grid[0] * grid[1] * 4, block)
    token = [file_token(p) for p in _case_files(kept)]
    pieces_blocks = _ReferencePieces(pieces, segment)
    pieces_blocks.checks = checks
    fields = to_dask(pieces_blocks, blk, "cfdbench-reference", token, segment)
    mask = _geometry_masks([c for c, _ in pieces], grid, fields)
    data = _reference_dataset(kept, pieces, fields, mask, name, segment)
    sample_params = {
        "problem": np.array([c.problem for c, _ in pieces]),
        "subset": np.array([c.subset for c, _ in pieces]),
        "velocity": np.array([float(c.params[VELOCITY_KEY[c.problem]]) for c, _ in pieces]),
    }
    return ReadResult(data=data, split=np.array([splits[c.id] for c, _ in pieces]), sample_params=sample_params,
                      skipped=skipped, inputs=_case_files(kept))


class _Blocks(SampleBlocks):
    """(N, T_max, 2, y, x) float32 view of the cases, NaN past each case's own frame count."""

    def __init__(self, cases: list[Case], frames: int) -> None:
        self.cases = cases
        ny, nx = cases[0].grid
        self.shape = (len(cases), frames, len(CHANNELS), ny, nx)

    def block(self, n0: int, n1: int, *, check: bool | None = None) -> np.ndarray:
        check = self.checks if check is None else check
        out = np.full((n1 - n0,) + self.shape[1:], np.nan, dtype=np.float32)
        with np.errstate(over="ignore"):  # float64 beyond float32: Inf, as always
            for i, case in enumerate(self.cases[n0:n1]):
                for c, name in enumerate(CHANNELS):
                    out[i, : case.frames, c] = _load(case, name, check)
        return out


def _check_options(paths: list[Path], problems: Sequence[str] | None, convention: str) -> None:
    """Refuse an empty input list, unknown problems and an unknown convention before any file is looked at."""
    if not paths:
        raise InputError("<no files>", "expected a CFDBench folder or case folders")
    if problems is not None and not set(problems) <= set(KEYS):
        raise InputError(",".join(problems), f"unknown CFDBench problem(s); expected some of {sorted(KEYS)}")
    if convention not in CONVENTIONS:
        raise InputError("--convention", f"expected one of {', '.join(CONVENTIONS)}, got {convention!r}")


def _gather_cases(paths: list[Path],
                  problems: Sequence[str] | None) -> tuple[list[Case], list[str], list[tuple[str, str]]]:
    """The readable cases of the wanted problems (sorted), the ids of every case folder listed, the unreadable ones."""
    cases: list[Case] = []
    skipped: list[tuple[str, str]] = []
    listed: list[str] = []
    for folder in _case_folders(paths):
        if problems is not None and folder.parent.parent.name not in problems:
            continue
        listed.append(_case_id(folder))
        case = _check_case(folder)
        if isinstance(case, str):
            skipped.append((_case_id(folder), case))
        else:
            cases.append(case)
    if not cases:
        raise InputError(paths[0], "no readable CFDBench case: " + ("; ".join(f"{w}: {r}" for w, r in skipped)
                                                                     or "none matched"))
    order = {p: i for i, p in enumerate(KEYS)}
    cases.sort(key=lambda c: (order[c.problem], c.subset, c.number))
    return cases, listed, skipped


def _check_grids(cases: list[Case]) -> None:
    """Refuse a case whose grid differs from the first case's: one dataset has one grid."""
    grid = cases[0].grid
    for c in cases:
        if c.grid != grid:
            raise InputError(c.folder / "u.npy", f"expected a {grid[0]}x{grid[1]} grid like {cases[0].id}, "
                                                 f"found {c.grid[0]}x{c.grid[1]}")


def _usable_cases(paths: list[Path], cases: list[Case], skipped: list[tuple[str, str]], block: int | None,
                  check_finite: bool | str) -> tuple[list[Case], np.ndarray, int, bool]:
    """The cases `check_finite` keeps (others go to `skipped`), their lengths, the block size, whether reads check."""
    grid = cases[0].grid
    lengths = np.array([c.frames for c in cases], dtype=np.int64)
    t_max = int(lengths.max())
    blk = auto_block(t_max * len(CHANNELS) * grid[0] * grid[1] * 4, block)
    all_ids = [f"{c.id}#0" for c in cases]
    scanned, keep, bad = checked(_Blocks(cases, t_max), blk, all_ids, "all cases", check_finite, lengths)
    skipped.extend(bad)
    if keep.size == 0:
        raise InputError(paths[0], "no usable CFDBench case: " + "; ".join(f"{w}: {r}" for w, r in skipped[:3]))
    return [cases[i] for i in keep], lengths[keep], blk, scanned.checks


def _canonical_params(cases: list[Case]) -> dict[str, np.ndarray]:
    """Per-case parameters of the canonical convention: problem, subset, density, viscosity, velocity, domain size."""
    sizes = np.array([domain_size(c.problem, c.params) for c in cases])
    return {
        "problem": np.array([c.problem for c in cases]),
        "subset": np.array([c.subset for c in cases]),
        "density": np.array([float(c.params["density"]) for c in cases]),
        "viscosity": np.array([float(c.params["viscosity"]) for c in cases]),
        "velocity": np.array([float(c.params[VELOCITY_KEY[c.problem]]) for c in cases]),
        "domain_width": sizes[:, 0],
        "domain_height": sizes[:, 1],
    }


def _canonical_dataset(cases: list[Case], fields: da.Array, mask: da.Array, name: str | None,
                       t_max: int) -> xr.Dataset:
    """The canonical dataset: one NaN-padded (u, v) trajectory per case on the unit square's cell centres."""
    ny, nx = cases[0].grid
    order = {p: i for i, p in enumerate(KEYS)}
    return xr.Dataset(
        {"fields": (("sample", "time", "channel", "y", "x"), fields), "mask": (("sample", "y", "x"), mask)},
        coords={"sample": np.array([f"{c.id}#0" for c in cases], dtype=str),
                "time": FRAME_DT * np.arange(t_max), "channel": np.array(CHANNELS),
                "y": (np.arange(ny) + 0.5) / ny, "x": (np.arange(nx) + 0.5) / nx},
        attrs={"source": "cfdbench", "dataset": manifest_name(name or "cfdbench"), "boundary": "non-periodic",
               "parameters": {"problems": sorted({c.problem for c in cases}, key=order.get)}, "dt": FRAME_DT,
               "provenance": {
                   "reader": "dpot_data.sources.cfdbench", "reader_version": READER_VERSION,
                   "coordinates": "x, y are cell centres of the unit square; the physical domain of each case is "
                                  "domain_width x domain_height (sample params)",
                   "cases": {c.id: {"frames": c.frames, "dtype": list(c.dtypes), "case": c.params} for c in cases},
               }},
    )


def _read_canonical(cases: list[Case], lengths: np.ndarray, skipped: list[tuple[str, str]], name: str | None,
                    segment: int, blk: int, checks: bool) -> ReadResult:
    """The canonical convention: one variable-length (u, v) trajectory per case, cut into pieces by ingest."""
    t_max = int(lengths.max())
    blocks = _Blocks(cases, t_max)
    blocks.checks = checks
    token = [file_token(p) for p in _case_files(cases)]
    fields = to_dask(blocks, blk, "cfdbench", token, t_max)
    mask = _geometry_masks(cases, cases[0].grid, fields)
    data = _canonical_dataset(cases, fields, mask, name, t_max)
    return ReadResult(data=data, lengths=lengths, segment=int(segment), sample_params=_canonical_params(cases),
                      skipped=skipped, inputs=_case_files(cases))


def read(paths: Sequence[str | Path], *, name: str | None = None, segment: int = DEFAULT_SEGMENT,
         problems: Sequence[str] | None = None, block: int | None = None, check_finite: bool | str = True,
         convention: str = "dpot-reference") -> ReadResult:
    """Open CFDBench cases lazily as one dataset of variable-length trajectories with per-case geometry masks.

    `problems` keeps only the named problems (default: all found). A case whose u/v/case.json cannot be read is
    skipped and reported; wrong shapes or missing case.json keys raise InputError naming the file and the key.
    With `check_finite=True` (one streamed pass over the data when opened, before anything is written), cases
    holding NaN or Inf in their frames, or whose data cannot be read, are left out and listed in `skipped` with their
    id; with "raise" nothing is scanned when opened and a block read meeting NaN or Inf raises InputError naming the
    file and the case; False keeps them. Headers declaring sizes beyond the limits of dpot_data.sources.base, or data
    not on disk (a sparse file), are refused; a case folder reached twice is read once (`_case_folders`).

    Under the "dpot-reference" convention (the default) the samples are the reference's pieces: channels u, v and
    its geometry channel, tube and cylinder fields prepared as the reference prepares them, `segment`-frame pieces
    with the last one padded, the reference's case split (its dev cases, any dam case and any case outside the prop,
    bc and geo subsets left out, listed in `skipped`). The split is drawn per problem over the case folders given
    (unreadable ones included), so it equals the reference's only when whole problem folders are given. Under
    "canonical": variable-length trajectories (u, v) that ingest cuts into pieces after a seeded split.
    """
    paths = [as_path(p) for p in paths]
    _check_options(paths, problems, convention)
    cases, listed, skipped = _gather_cases(paths, problems)
    _check_grids(cases)
    cases, lengths, blk, checks = _usable_cases(paths, cases, skipped, block, check_finite)
    if convention == "dpot-reference":
        return _read_reference(cases, listed, skipped, name, int(segment), block, checks)
    return _read_canonical(cases, lengths, skipped, name, segment, blk, checks)
