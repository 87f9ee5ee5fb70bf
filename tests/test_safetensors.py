"""Weights as safetensors: `model export --format safetensors` (or an --out ending .safetensors) writes the released
format's tensors with its entries (recipe, normalisation) in the file's metadata and a sha256 record beside it; every
command that reads weights reads such a file as it reads the .pth (no code execution, so no trust needed), and a
safetensors file written by another tool loads as released weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from typer.testing import CliRunner

from dpot_train.core import checkpoint as C
from dpot_train.core.checkpoint import CheckpointError, checkpoint_payload, file_sha256, load_pretrained, record_path
from dpot_train.cli import app
from dpot_train.model import build_model

GOLDEN = Path(__file__).resolve().parent / "golden" / "dpot_small.pth"


@pytest.fixture(scope="module")
def run_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One of our checkpoints (a tiny DPOT with its config), as a run writes it."""
    torch.manual_seed(0)
    model = build_model("tiny", img_size=16, embed_dim=16, depth=1)
    path = C.checkpoint_path(tmp_path_factory.mktemp("run") / "checkpoints", 2)
    C.save_atomic({**checkpoint_payload(model), "format": C.FORMAT, "step": 2}, path)
    return path


def _export(ckpt: Path, out: Path, *extra: str) -> str:
    r = CliRunner().invoke(app, ["model", "export", str(ckpt), "--out", str(out), *extra])
    assert r.exit_code == 0, r.output
    return r.output


def _x(model: torch.nn.Module) -> torch.Tensor:
    c = model.config
    return torch.randn(1, c.img_size, c.img_size, c.in_timesteps, c.in_channels, generator=torch.Generator().manual_seed(0))


def test_export_as_safetensors_loads_as_the_pth_export(run_ckpt: Path, tmp_path: Path) -> None:
    pth, st = tmp_path / "w.pth", tmp_path / "w.safetensors"
    _export(run_ckpt, pth)
    said = _export(run_ckpt, st)  # the suffix chooses the format
    assert "safetensors" in said and record_path(st).read_text() == f"{file_sha256(st)}  {st.name}\n"
    with safe_open(str(st), framework="pt") as f:  # a real safetensors file, read by the library itself
        keys, meta = set(f.keys()), f.metadata()
    assert keys == set(torch.load(pth, weights_only=True)["model"]) and meta["recipe"] == "dpot"
    a, b = load_pretrained(pth), load_pretrained(st)
    assert a.config == b.config
    with torch.no_grad():
        assert torch.equal(a(_x(a)), b(_x(b)))
    info_pth, info_st = (CliRunner().invoke(app, ["model", "info", str(p), "--json"]) for p in (pth, st))
    assert info_st.exit_code == 0, info_st.output
    drop = ("source", "sha256")
    assert {k: v for k, v in json.loads(info_st.output).items() if k not in drop} == \
        {k: v for k, v in json.loads(info_pth.output).items() if k not in drop}


def test_explicit_format_and_contradictions(run_ckpt: Path, tmp_path: Path) -> None:
    st = tmp_path / "weights.bin"
    _export(run_ckpt, st, "--format", "safetensors")
    with open(st, "rb") as fh:
        assert C.is_safetensors(fh)
    for out, fmt, expected in ((tmp_path / "w.pth", "safetensors", "says another format than --format safetensors"),
                               (tmp_path / "w.safetensors", "pth", "says another format than --format pth"),
                               (tmp_path / "w.x", "onnx", "--format onnx: expected one of pth, safetensors")):
        r = CliRunner().invoke(app, ["model", "export", str(run_ckpt), "--out", str(out), "--format", fmt])
        assert r.exit_code == 2 and expected in r.output and len(r.output.strip().splitlines()) == 1, r.output
        assert not out.exists()


def test_a_flipped_bit_and_a_cut_file_are_one_line(run_ckpt: Path, tmp_path: Path) -> None:
    st = tmp_path / "w.safetensors"
    _export(run_ckpt, st)
    data = bytearray(st.read_bytes())
    data[-5] ^= 0x10
    st.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="damaged: its sha256"):
        load_pretrained(st)
    record_path(st).unlink()  # without a record: the library's own check of the layout
    st.write_bytes(bytes(data[: len(data) // 2]))
    with pytest.raises(CheckpointError, match=r"not a readable safetensors file"):
        load_pretrained(st)


def test_a_safetensors_file_from_another_tool_loads_as_released_weights(tmp_path: Path) -> None:
    state = torch.load(GOLDEN, weights_only=True)["model"]
    st = tmp_path / "model_small.safetensors"
    save_file({k: v.contiguous() for k, v in state.items()}, str(st))  # no metadata, no record
    a, b = load_pretrained(GOLDEN), load_pretrained(st)
    assert a.config == b.config
    with torch.no_grad():
        assert torch.equal(a(_x(a)), b(_x(b)))
    assert C.weights_recipe(C.read_checkpoint(st)) == "reference"  # released weights: the paper's metric
