"""Text taken from an input (a manifest, an eval.json, a NetCDF attribute) made safe to publish: one line, a bounded
length, escaped for Markdown or HTML, and machine paths reduced to names. Dataset cards (dpot_data.card) and
evaluation reports (dpot_train.evaluation.report) insert every such field through these functions, so that a name cannot
open an HTML tag, break a table row, start a heading or carry a megabyte into the page.
"""

from __future__ import annotations

import html
import os
import re
import shlex
import unicodedata
from pathlib import PurePosixPath

NAME_LIMIT = 100  # characters kept of a name, unit, attribute or label
TEXT_LIMIT = 2000  # characters kept of longer text (a command line, a parameter list)
ELLIPSIS = "…"

# Markdown's inline syntax: backslash escapes, code spans, emphasis, strikethrough, links and images, table cells
_MD_SPECIAL = re.compile(r"([\\`*\[\]|~])")
# "_" opens emphasis only at a word's edge ("a_b" is plain text), so only those are escaped
_MD_UNDERSCORE = re.compile(r"(?<![0-9A-Za-z])_|_(?![0-9A-Za-z])")
# a directory part of an absolute path in free text ("/home/me/data/" of "/home/me/data/x.nc")
_ABS_DIRS = re.compile(r"(?<![\w.~:/\\-])/(?:[^\s'\"/]+/)+(?=[^\s'\"/])")


def one_line(value: object) -> str:
    """`value` as text on one line: line breaks, control and bidirectional-override characters become spaces."""
    text = str(value)
    return "".join(" " if unicodedata.category(c) in ("Cc", "Zl", "Zp") or 0x202A <= ord(c) <= 0x202E
                   or 0x2066 <= ord(c) <= 0x2069 else c for c in text)


def bound(value: object, limit: int | None = NAME_LIMIT) -> str:
    """`value` on one line, cut to `limit` characters (the last one an ellipsis) when longer; None: not cut."""
    text = one_line(value) if limit is None or len(str(value)) <= 4 * limit else one_line(str(value)[:4 * limit])
    if limit is not None and len(text) > limit:
        return text[:limit - 1] + ELLIPSIS
    return text


def md(value: object, limit: int | None = NAME_LIMIT) -> str:
    """`value` as Markdown inline text (a table cell, a list item, a heading's tail): bounded to `limit`
    characters, HTML's `& < >` as entities, Markdown's syntax characters and table pipes backslash-escaped."""
    text = html.escape(bound(value, limit), quote=False)
    return _MD_UNDERSCORE.sub(r"\\_", _MD_SPECIAL.sub(r"\\\1", text))


def html_text(value: object, limit: int | None = NAME_LIMIT) -> str:
    """`value` as HTML text or attribute value: bounded to `limit` characters, `& < > " '` as entities."""
    return html.escape(bound(value, limit), quote=True)


def md_code_block(text: str, language: str = "", limit: int = TEXT_LIMIT) -> list[str]:
    """A fenced Markdown code block holding `text` (bounded, one line): the fence is longer than any run of
    backticks in it, so the text cannot close it."""
    body = bound(text, limit)
    longest = max((len(m) for m in re.findall(r"`+", body)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence + language, body, fence]


def file_name(path: str) -> str:
    """The last component of a path or URL (a folder's own name when it ends in "/")."""
    name = PurePosixPath(str(path).replace("\\", "/").rstrip("/")).name
    return name or str(path)


def strip_dirs(text: str) -> str:
    """`text` with the folder part of every absolute path removed ("/home/me/raw/x.nc" -> "x.nc"), so that a
    published page names files without the machine's folders; URLs and relative paths are kept."""
    return _ABS_DIRS.sub("", str(text))


def public_command(command: str) -> str:
    """A recorded command line with every absolute path (an argument, or an option's `--opt=PATH` value) reduced
    to its file name; relative paths and URLs are kept as typed."""
    try:
        args = shlex.split(command)
    except ValueError:  # not a shell-quoted line: reduce the paths in the text
        return strip_dirs(command)
    out = []
    for arg in args:
        opt, eq, value = arg.partition("=") if arg.startswith("-") else ("", "", arg)
        if os.path.isabs(value) or value.startswith("file://"):
            value = file_name(value)
        out.append(opt + eq + value)
    return shlex.join(out)


def relative_name(path: str | os.PathLike[str], base: str | os.PathLike[str]) -> str:
    """How a page written in folder `base` names the file `path`: its path relative to `base` (both resolved),
    or, when the two share no folder but the filesystem's root, its parent folder's name and its own."""
    target, start = os.path.realpath(path), os.path.realpath(base)
    try:
        common = os.path.commonpath([target, start])
    except ValueError:  # another drive
        common = ""
    if common and os.path.dirname(common) != common:
        return PurePosixPath(os.path.relpath(target, start).replace(os.sep, "/")).as_posix()
    parent = os.path.basename(os.path.dirname(target))
    return f"{parent}/{os.path.basename(target)}" if parent else os.path.basename(target)
