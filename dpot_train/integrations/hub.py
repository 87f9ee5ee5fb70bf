"""Checkpoints by name from the Hugging Face Hub: `hf://OWNER/REPO/PATH/IN/REPO[@REVISION]` and the short names of
the DPOT authors' released weights (`dpot:Ti` ... `dpot:H`, the files of the Hub repo `hzk17/DPOT`).

`parse_reference` is pure (the text alone); `resolve` does the I/O, through `huggingface_hub.hf_hub_download`: its
cache (HF_HUB_CACHE / HF_HOME), its offline mode (HF_HUB_OFFLINE=1) and its token handling (HF_TOKEN, `hf auth
login`). Nothing is stored by dpot itself. A resolved reference names the commit it came from, so a run can record
exactly which file it read and load that same file again (`Resolved.pinned`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

HUB_PREFIX = "hf://"
SHORT_PREFIX = "dpot:"
DPOT_REPO = "hzk17/DPOT"  # the DPOT authors' released weights (thu-ml/DPOT's README links them)
# short name -> file in DPOT_REPO (the presets of the same names; docs/training.md, "Released checkpoints")
RELEASED = {"Ti": "model_Ti.pth", "S": "model_S.pth", "M": "model_M.pth", "L": "model_L.pth", "H": "model_H.pth"}
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_REPO_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class HubError(ValueError):
    """A Hub reference that is malformed or cannot be resolved; `str()` is one line naming the reference."""


@dataclass(frozen=True)
class HubReference:
    """A parsed reference: the repo, the file in it and the revision asked for (None: the default branch)."""

    text: str  # as given (dpot:Ti, hf://...)
    repo_id: str
    filename: str
    revision: str | None

    def url(self, revision: str | None = None) -> str:
        """hf://OWNER/REPO/PATH[@REVISION], with `revision` (else the one asked for, if any)."""
        rev = revision or self.revision
        return f"{HUB_PREFIX}{self.repo_id}/{self.filename}" + (f"@{rev}" if rev else "")


@dataclass(frozen=True)
class Resolved:
    """A reference resolved to a file of the Hugging Face cache, and the commit that file belongs to."""

    reference: HubReference
    path: Path  # the file in huggingface_hub's cache (snapshots/<commit>/PATH)
    revision: str  # the commit hash (40 hex digits)

    @property
    def pinned(self) -> str:
        """hf://OWNER/REPO/PATH@COMMIT: the same file again, whatever the branch points to later."""
        return self.reference.url(self.revision)

    def record(self, sha256: str | None = None) -> dict[str, Any]:
        """What a run or an evaluation records of the weights it read: the reference as given, the repo, the file,
        the commit, the pinned reference and (when known) the file's sha256."""
        ref = self.reference
        out = {"reference": ref.text, "repo_id": ref.repo_id, "filename": ref.filename, "revision": self.revision,
               "pinned": self.pinned}
        return {**out, "sha256": sha256} if sha256 is not None else out


def is_reference(text: Any) -> bool:
    """Whether `text` names a Hub checkpoint (a string starting hf:// or dpot:) rather than a local file."""
    return isinstance(text, str) and text.startswith((HUB_PREFIX, SHORT_PREFIX))


def known_names() -> str:
    """The short names, for messages: "dpot:Ti, dpot:S, ..."."""
    return ", ".join(SHORT_PREFIX + k for k in RELEASED)


def parse_reference(text: str) -> HubReference:
    """`dpot:NAME[@REVISION]` or `hf://OWNER/REPO/PATH/IN/REPO[@REVISION]` (huggingface_hub's own
    `hf://OWNER/REPO@REVISION/PATH` is read too) -> HubReference; HubError (one line) for any other form."""
    if text.startswith(SHORT_PREFIX):
        name, at, revision = text[len(SHORT_PREFIX):].partition("@")
        key = next((k for k in RELEASED if k.lower() == name.lower()), None)
        if key is None:
            raise HubError(f"{text}: unknown released checkpoint {name!r}; expected one of {known_names()}")
        return HubReference(text, DPOT_REPO, RELEASED[key], _revision(text, revision, bool(at)))
    if not text.startswith(HUB_PREFIX):
        raise HubError(f"{text}: expected hf://OWNER/REPO/PATH/IN/REPO[@REVISION] or one of {known_names()}")
    rest, revision = text[len(HUB_PREFIX):], None
    parts = rest.split("/")
    if len(parts) >= 2 and "@" in parts[1]:  # huggingface_hub's form: hf://OWNER/REPO@REVISION/PATH
        parts[1], revision = parts[1].split("@", 1)
        revision = _revision(text, revision, True)
    elif "@" in "/".join(parts[2:]):  # hf://OWNER/REPO/PATH@REVISION (a revision may hold '/': refs/pr/3)
        rest, after = rest.rsplit("@", 1)
        parts, revision = rest.split("/"), _revision(text, after, True)
    form = "expected hf://OWNER/REPO/PATH/IN/REPO[@REVISION], a file in a model repo of the Hugging Face Hub"
    if len(parts) < 3 or not all(parts) or not all(_REPO_PART.match(p) for p in parts[:2]):
        raise HubError(f"{text}: {form}" + (" (no file named)" if len(parts) < 3 or not parts[-1] else ""))
    if any(p in (".", "..") for p in parts[2:]):
        raise HubError(f"{text}: {form} (no '.' or '..' in the path)")
    return HubReference(text, f"{parts[0]}/{parts[1]}", "/".join(parts[2:]), revision)


def _revision(text: str, revision: str, given: bool) -> str | None:
    """The revision after '@' (None when no '@'); HubError when '@' is followed by nothing."""
    if given and not revision:
        raise HubError(f"{text}: expected a revision (branch, tag or commit hash) after '@'")
    return revision or None


def resolve(text: str) -> Resolved:
    """The local file of a Hub reference, downloaded into (or found in) huggingface_hub's cache, and its commit.

    HubError, one line: huggingface_hub missing, the file not in the cache while offline, no such repo, revision or
    file, or the Hub unreachable."""
    ref = parse_reference(text)
    try:
        from huggingface_hub import constants, hf_hub_download
        from huggingface_hub import errors as hf_errors
    except ImportError:
        raise HubError(f"{text}: loading weights from the Hugging Face Hub needs huggingface_hub; install dpot[hub] "
                       "(pip install 'dpot[hub]')") from None
    offline = bool(getattr(constants, "HF_HUB_OFFLINE", False))
    unreachable = None if offline else hub_unreachable(constants.ENDPOINT)
    try:  # an unreachable Hub is asked nothing (huggingface_hub would retry for half a minute): the cache only
        local = Path(hf_hub_download(ref.repo_id, ref.filename, revision=ref.revision,
                                     local_files_only=offline or unreachable is not None))
    except hf_errors.LocalEntryNotFoundError as exc:
        cache = constants.HF_HUB_CACHE
        if offline:
            raise HubError(f"{text}: {ref.url()} is not in the Hugging Face cache ({cache}) and HF_HUB_OFFLINE=1 is "
                           "set; download it once with HF_HUB_OFFLINE unset, or point HF_HUB_CACHE at a cache that "
                           "holds it") from exc
        why = unreachable or _first_line(exc.__cause__ or exc)
        raise HubError(f"{text}: {ref.url()} is not in the Hugging Face cache ({cache}) and the Hub could not be "
                       f"reached ({why}); on a machine without network set HF_HUB_OFFLINE=1 and point HF_HUB_CACHE "
                       "at a cache that holds it") from exc
    except hf_errors.RevisionNotFoundError as exc:
        raise HubError(f"{text}: revision {ref.revision or 'main'!r} not found in the Hub repo {ref.repo_id}") from exc
    except hf_errors.EntryNotFoundError as exc:
        raise HubError(f"{text}: no file {ref.filename!r} in the Hub repo {ref.repo_id} at revision "
                       f"{ref.revision or 'main'}") from exc
    except (hf_errors.RepositoryNotFoundError, hf_errors.GatedRepoError) as exc:
        raise HubError(f"{text}: the Hub repo {ref.repo_id} was not found or needs access (a private or gated repo: "
                       "set HF_TOKEN or run `hf auth login`)") from exc
    except (hf_errors.HfHubHTTPError, hf_errors.HFValidationError, OSError) as exc:
        raise HubError(f"{text}: {ref.url()} could not be downloaded ({_first_line(exc)})") from exc
    return Resolved(ref, local, _commit_of(text, local, ref.filename))


def hub_unreachable(endpoint: str) -> str | None:
    """Why the Hub at `endpoint` cannot be reached, from one request with no retries (None when it answers at all,
    whatever the status): huggingface_hub retries a failed connection five times with back-off, about half a
    minute of noise before its error, so an unreachable Hub is found out here once and only the cache is read."""
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session

    try:
        get_session().head(endpoint, timeout=float(getattr(constants, "HF_HUB_ETAG_TIMEOUT", 10)))
    except Exception as exc:  # any transport failure (DNS, refused, timeout, proxy); an HTTP answer is no failure
        return _first_line(exc)
    return None


def _commit_of(text: str, local: Path, filename: str) -> str:
    """The commit of a file hf_hub_download returned: its folder under `snapshots/` (the cache layout, so no
    request to the Hub is made for it)."""
    snapshot = local.parents[len(PurePosixPath(filename).parts) - 1]
    if snapshot.parent.name != "snapshots" or not _COMMIT.match(snapshot.name):
        raise HubError(f"{text}: huggingface_hub returned {local}, expected a file under snapshots/<commit>/ of its "
                       "cache")
    return snapshot.name


def _first_line(exc: BaseException) -> str:
    """An exception's first line, for a one-line error."""
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]


def local_file(path: str | Path) -> Path:
    """The file to read for a checkpoint argument: a Hub reference resolved (`resolve`), any other path as is."""
    return resolve(path).path if is_reference(path) else Path(path)
