"""dpot_format.text: what cards and reports put on a page from an input is one line, bounded, escaped for Markdown and
HTML, and names files without the machine's folders."""

from __future__ import annotations

import pytest

from dpot_format.text import (ELLIPSIS, NAME_LIMIT, bound, file_name, html_text, md, md_code_block, public_command,
                              relative_name, strip_dirs)


def test_markdown_text_cannot_open_a_tag_break_a_row_or_start_a_line() -> None:
    assert md("<script>alert(1)</script>") == "&lt;script&gt;alert(1)&lt;/script&gt;"
    assert md("a|b\n# h\r\n> q") == "a\\|b # h  &gt; q"
    assert md("[x](javascript:1) *em* `c` ~s~ \\") == "\\[x\\](javascript:1) \\*em\\* \\`c\\` \\~s\\~ \\\\"
    assert md("velocity_x _em_") == "velocity_x \\_em\\_"  # "_" inside a word is plain text in Markdown
    assert md("a\x1b(0red\u202e") == "a (0red "  # terminal escapes and bidi overrides are spaces
    assert html_text("<b title='x'>&") == "&lt;b title=&#x27;x&#x27;&gt;&amp;"


def test_long_text_is_cut_to_the_stated_length() -> None:
    assert bound("k" * 1_000_000) == "k" * (NAME_LIMIT - 1) + ELLIPSIS
    assert len(md("<" * 1000)) == len("&lt;") * (NAME_LIMIT - 1) + 1
    assert bound("short") == "short" and len(bound("x" * 5000, None)) == 5000
    assert md_code_block("a ``` b", "bash") == ["````bash", "a ``` b", "````"]


@pytest.mark.parametrize(("command", "public"), [
    ("dpot-data ingest fno /home/me/raw/ns.mat --out /srv/out", "dpot-data ingest fno ns.mat --out out"),
    ("dpot-data ingest xarray '/home/me/my data/x.nc' --out=/tmp/o/", "dpot-data ingest xarray x.nc --out=o"),
    ("dpot-data ingest fno raw/ns.mat --out s3://b/out", "dpot-data ingest fno raw/ns.mat --out s3://b/out"),
    ("unbalanced 'quote /home/me/a.h5", "unbalanced 'quote a.h5"),
])
def test_commands_name_absolute_paths_by_file_name(command: str, public: str) -> None:
    assert public_command(command) == public


def test_paths_are_named_by_file_name_or_relative_to_the_page(tmp_path) -> None:  # noqa: ANN001
    assert strip_dirs("/home/me/raw/bad.nc: sample 3 (see raw/x.nc, gs://b/c/d)") == \
        "bad.nc: sample 3 (see raw/x.nc, gs://b/c/d)"
    assert file_name("/home/me/store.zarr/") == "store.zarr" and file_name("s3://b/x.h5") == "x.h5"
    (tmp_path / "runs" / "a").mkdir(parents=True)
    assert relative_name(tmp_path / "runs" / "a" / "eval.json", tmp_path / "report") == "../runs/a/eval.json"
    assert relative_name("/etc/hosts", tmp_path) == "etc/hosts"  # only the root in common: no absolute path
