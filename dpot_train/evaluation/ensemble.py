"""`evaluate --ensemble N`: an inference-time ensemble of rollouts, scored by CRPS and the spread-skill ratio.

Member m rolls out checkpoint m mod K (the evaluated one first, then `--ensemble-checkpoints`) from the same t_in
true frames, with DPOT's own noise injection on the inputs of every model call (data/windows.py `inject_noise`:
x + S * ||x||_2 * N(0, 1), the norm per sample and channel over space and time, on fluid cells of valid channels,
applied to the normalised window the model is handed, as in training). S is `--ensemble-noise`, by default the
run's `data.noise`. The draws of trajectory j at the k-th model call of member m are seeded by (seed, m, k, j), so
a member's rollout does not depend on the batch size or the chunking. Solid cells and padded channels carry over
from the last input frame, as in the single rollout (metrics.rollout).

Memory: a batch's members are rolled out together, CHUNK_STEPS steps at a time (M windows of t_in frames and one
chunk of M predictions held), and scored one trajectory at a time (eval_metrics.EnsembleAccumulator).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from dpot_train.data.windows import inject_noise
from dpot_train.evaluation.metrics import EnsembleAccumulator
from dpot_train.evaluation.stream import CHUNK_STEPS, RolloutStream
from dpot_train.core.metrics import predicted_entries
from dpot_train.core.normalize import Stats, denormalize, normalize

ESTIMATOR = "fair"  # the CRPS estimator (eval_metrics.crps_fair; scoringrules' estimator="fair")
ReadFrames = Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]  # (first frame, count) -> (frames, mask)


def call_seed(seed: int, member: int, call: int) -> int:
    """The seed handed to inject_noise at a member's `call`-th model call (inject_noise then seeds each trajectory
    by its position)."""
    return int(np.random.SeedSequence([seed, member, call, 0xE45E]).generate_state(1)[0])


def check_members(members: int, checkpoints: int, noise: float) -> None:
    """ValueError (one line) for an ensemble that cannot be: fewer than 2 members, fewer members than checkpoints,
    or members that would repeat one another (no noise, and more members than checkpoints)."""
    if members < 2:
        raise ValueError(f"--ensemble {members}: expected a member count of at least 2")
    if members < checkpoints:
        raise ValueError(f"--ensemble {members}: fewer members than the {checkpoints} checkpoints (the evaluated one "
                         "and --ensemble-checkpoints); expected at least one member per checkpoint")
    if not math.isfinite(noise) or noise < 0:
        raise ValueError(f"--ensemble-noise {noise}: expected a finite noise epsilon >= 0")
    if noise == 0 and members > checkpoints:
        raise ValueError(f"--ensemble {members}: without noise the members of one checkpoint are identical; give "
                         "--ensemble-noise S > 0 (the weights' run trained with noise 0, or recorded none) or one "
                         "checkpoint per member with --ensemble-checkpoints")


@dataclass
class Ensemble:
    """The members: `models` (the evaluated checkpoint's first), their `checkpoints` (names), the member count, the
    noise epsilon and the seed."""

    models: list[torch.nn.Module]
    checkpoints: list[str]
    members: int
    noise: float
    seed: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    def __post_init__(self) -> None:
        check_members(self.members, len(self.models), self.noise)

    def model_of(self, member: int) -> int:
        """The index (into `models`) of the checkpoint member `member` rolls out."""
        return member % len(self.models)

    def record(self) -> dict[str, Any]:
        """What eval.json's top-level `ensemble` says of the members."""
        return {"members": self.members, "noise": self.noise, "seed": self.seed, "estimator": ESTIMATOR,
                "checkpoints": list(self.checkpoints),
                "member_checkpoint": [self.model_of(m) for m in range(self.members)]}

    def to(self, device: torch.device) -> "Ensemble":
        """Every member model on `device`, in eval mode."""
        self.device = torch.device(device)
        self.models = [m.to(self.device).eval() for m in self.models]
        return self

    def scorer(self, ds: Any, stats: Stats | None, steps: int, t_in: int, sink: Any = None) -> "EnsembleScorer":
        """The scorer of one dataset (`stats`: its normalisation, None: none)."""
        return EnsembleScorer(self, ds, stats, steps, t_in, sink)


def noisy_predictor(model: torch.nn.Module, device: torch.device, eps: float, seed: int, member: int,
                    positions: torch.Tensor, mask: torch.Tensor, channel_valid: torch.Tensor,
                    stats: Stats | None) -> Callable[[torch.Tensor], torch.Tensor]:
    """A predictor on windows in physical units: normalised (`stats`), noise injected (inject_noise, seeded by
    call_seed(seed, member, k) at its k-th call and each trajectory's `positions`), the model, denormalised."""
    calls = [0]
    mask_d, cv_d = mask.to(device), channel_valid.to(device)

    def predict(window: torch.Tensor) -> torch.Tensor:
        x = window if stats is None else normalize(window, stats)
        x = inject_noise(x.to(device), eps, positions, call_seed(seed, member, calls[0]), mask_d, cv_d)
        calls[0] += 1
        out = model(x).float().cpu()
        return out if stats is None else denormalize(out, stats)

    return predict


class EnsembleScorer:
    """One dataset's ensemble: rolls out every batch's members chunk by chunk, scores them and hands them to the
    predictions store."""

    def __init__(self, ens: Ensemble, ds: Any, stats: Stats | None, steps: int, t_in: int, sink: Any = None) -> None:
        self.ens, self.ds, self.stats, self.steps, self.t_in, self.sink = ens, ds, stats, steps, t_in, sink
        self.acc = EnsembleAccumulator(ds.channels, ds.channel_valid, steps, ens.members)

    @torch.no_grad()
    def score_batch(self, read: ReadFrames, first_position: int, ids: list[str]) -> None:
        """One batch of trajectories (positions first_position.. in the dataset's list); `read(t0, n)` gives its
        frames [t0, t0 + n) in the model layout and its mask."""
        first, mask = read(0, self.t_in)
        cv = torch.tensor([self.ds.channel_valid] * first.shape[0], dtype=torch.bool)
        keep = predicted_entries(mask, cv, first[..., :1, :])
        rows = mask.flatten(1).any(1) & cv.any(1)  # trajectories with something to score
        positions = torch.arange(first_position, first_position + first.shape[0])
        streams = [RolloutStream(noisy_predictor(self.ens.models[self.ens.model_of(m)], self.ens.device,
                                                 self.ens.noise, self.ens.seed, m, positions, mask, cv, self.stats),
                                 first, self.t_in, keep) for m in range(self.ens.members)]
        if rows.any():
            self.acc.start_batch(int(rows.sum()))
        for t0 in range(0, self.steps, CHUNK_STEPS):
            n = min(CHUNK_STEPS, self.steps - t0)
            true = read(self.t_in + t0, n)[0]
            members = torch.stack([s.take(n) for s in streams])  # (M, B, *S, n, C)
            if rows.any():
                self.acc.add_rollout(members[:, rows], true[rows], mask[rows])
            if self.sink is not None:
                self.sink.write_members(self.ds, ids, members, step0=t0)

    def result(self) -> dict[str, Any]:
        """The dataset's `ensemble` and `ensemble_mean` entries of eval.json."""
        found = self.acc.result()
        return {"ensemble": found["ensemble"], "ensemble_mean": found["mean"]}


def recorded_noise(content: Any) -> float | None:
    """The noise epsilon a checkpoint's run trained with (its run config's data.noise), None when it records none
    (released weights, exports)."""
    from dpot_train.core.checkpoint import trained_config

    data = trained_config(content).get("data")
    noise = data.get("noise") if isinstance(data, dict) else None
    return float(noise) if isinstance(noise, (int, float)) and not isinstance(noise, bool) else None


def load_members(paths: list[str], cfg: Any, recorded_norm: Any, trusted: bool = False,
                 finish: Callable[[str, Any], torch.nn.Module] | None = None) -> list[torch.nn.Module]:
    """The models of `--ensemble-checkpoints`: each read as evaluate reads a checkpoint (a file or a Hub reference;
    weights-only unless `trusted`), and refused in one line unless it has the evaluated model's configuration `cfg`
    and, unless `recorded_norm` is None (--normalize given), its recorded normalisation. `finish(path, loaded)`
    makes the model as the evaluated one was made (a positional embedding resampled to the data's grid)."""
    from dpot_train.core.checkpoint import parse_checkpoint, pretrained_from, read_checkpoint
    from dpot_train.integrations.hub import is_reference, resolve
    from dpot_train.core.normalize import recorded

    models = []
    for path in paths:
        content = read_checkpoint(resolve(path).path if is_reference(path) else path, trusted=trusted)
        loaded = parse_checkpoint(content, path)
        model = pretrained_from(*loaded, source=str(path))
        if model.config != cfg:
            raise ValueError(f"--ensemble-checkpoints {path}: a model of another configuration than the evaluated "
                             "checkpoint's; expected checkpoints of the same architecture, grid, channels and frames")
        if recorded_norm is not None and (recorded(content) or ("none", None)) != recorded_norm:
            raise ValueError(f"--ensemble-checkpoints {path}: normalised otherwise than the evaluated checkpoint "
                             "(another normalisation mode or statistics); expected members trained on the same "
                             "normalised data")
        models.append(finish(str(path), loaded) if finish is not None else model)
    return models


def build_ensemble(checkpoint: str, model: torch.nn.Module, content: Any, recipe: str, members: int,
                   noise: float | None, extra: list[str], cfg: Any, recorded_norm: Any, trusted: bool,
                   finish: Callable[[str, Any], torch.nn.Module]) -> Ensemble:
    """The Ensemble `evaluate --ensemble N [--ensemble-noise S] [--ensemble-checkpoints ...]` asks for: `model`
    (read from `checkpoint`, whose `content` gives the run's noise when `noise` is None) and the models of `extra`
    (load_members); N = 0: one member per checkpoint. ValueError in one line for what cannot be scored."""
    if recipe == "reference":
        raise ValueError("--ensemble: the reference recipe scores no ensemble; add --recipe dpot")
    eps = recorded_noise(content) if noise is None else float(noise)
    count = members or len(extra) + 1
    if eps is None and count > len(extra) + 1:
        raise ValueError(f"--ensemble {count}: {checkpoint} records no training noise (data.noise); give "
                         "--ensemble-noise S (5e-4 is the pre-training recipe's) or --ensemble-checkpoints")
    check_members(count, len(extra) + 1, eps or 0.0)  # before the other checkpoints are read
    models = [model] + load_members(extra, cfg, recorded_norm, trusted, finish)
    return Ensemble(models, [checkpoint] + extra, count, eps or 0.0)
