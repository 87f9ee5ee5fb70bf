"""Long rollouts in bounded memory: a batch whose rollout is longer than STREAM_STEPS is read, rolled out and scored
CHUNK_STEPS steps at a time, so that memory holds one chunk of frames (plus the t_in-frame windows) whatever the
horizon.

The rolled-out frames are exactly those of metrics.rollout (the same predictor calls on the same windows; a model
predicting k > 1 frames per call keeps its surplus frames for the next chunk). The two L2RE scalars are then
accumulated per sample and channel as float64 sums of squares over the chunks (sqrt(sum err^2) / (sqrt(sum true^2)
+ eps), averaged over valid channels): the same definition as the whole-block computation of shorter rollouts, equal
to it up to float rounding (tests/test_eval_stream.py).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from dpot_train.core.metrics import EPS, Predictor, masked_channel_mean, one_step, persistence, predicted_entries

STREAM_STEPS = 64  # rollouts up to this many steps are scored whole, as before (bit for bit)
CHUNK_STEPS = 16

ReadFrames = Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]  # (first frame, count) -> (frames, mask)


class RolloutStream:
    """metrics.rollout, produced `take(n)` frames at a time."""

    def __init__(self, predict: Predictor, window: torch.Tensor, t_in: int, keep: torch.Tensor | None) -> None:
        self.predict, self.window, self.t_in, self.keep = predict, window, t_in, keep
        self.spare: torch.Tensor | None = None

    def take(self, n: int) -> torch.Tensor:
        """The next `n` rolled-out frames, (B, *S, n, C)."""
        out = [] if self.spare is None else [self.spare]
        have = 0 if self.spare is None else self.spare.shape[-2]
        while have < n:
            new = self.predict(self.window)
            if self.keep is not None:
                new = torch.where(self.keep, new, self.window[..., -1:, :])
            out.append(new)
            have += new.shape[-2]
            self.window = torch.cat([self.window, new], dim=-2)[..., -self.t_in:, :]
        frames = torch.cat(out, dim=-2)
        self.spare = frames[..., n:, :] if frames.shape[-2] > n else None
        return frames[..., :n, :]


def _sums(pred: torch.Tensor, true: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, C) float64 sums over fluid cells and frames of err^2 and true^2."""
    p, t = pred.to(torch.float64), true.to(torch.float64)
    if mask is not None:
        m = mask.to(torch.float64)[..., None, None]
        p, t = p * m, t * m
    dims = tuple(range(1, p.ndim - 1))
    return (p - t).pow(2).sum(dim=dims), t.pow(2).sum(dim=dims)


def score_streamed(predict: Predictor, read: ReadFrames, t_in: int, steps: int, channel_valid: list[bool],
                   suite: Any, sink: Any = None, ds: Any = None, ids: list[str] | None = None,
                   chunk: int | None = None) -> dict[str, torch.Tensor]:
    """One batch's (B,) rollout and one-step L2RE of the model and persistence, chunk by chunk; feeds `suite`
    (eval_metrics.DatasetSuite) and `sink` (the predictions store) as it goes. `read(t0, n)` returns frames
    [t0, t0 + n) of the batch in the model layout and the mask."""
    chunk = chunk or CHUNK_STEPS
    first, mask = read(0, t_in)
    cv = torch.tensor([channel_valid] * first.shape[0], dtype=torch.bool)
    keep = predicted_entries(mask, cv, first[..., :1, :])
    who_fn = (("model", predict, keep), ("persistence", persistence, None))
    streams = {who: RolloutStream(fn, first, t_in, k) for who, fn, k in who_fn}
    sums = {f"{who}_{kind}": [0.0, 0.0] for who, _, _ in who_fn for kind in ("rollout", "one_step")}
    for who in streams:
        suite.by[who].start_batch(first.shape[0])
    for t0 in range(0, steps, chunk):
        n = min(chunk, steps - t0)
        frames, _ = read(t0, t_in + n)  # frames t0 .. t0 + t_in + n - 1: the inputs of each one-step prediction
        true = frames[..., t_in:, :]
        for who, fn, k in who_fn:
            pred = streams[who].take(n)
            once = one_step(fn, frames, t_in, n, k)
            for kind, p in (("rollout", pred), ("one_step", once)):
                e, t = _sums(p, true, mask)
                sums[f"{who}_{kind}"][0] += e
                sums[f"{who}_{kind}"][1] += t
            suite.by[who].add_rollout(pred, true, mask)
            suite.by[who].add_one_step(once, true, mask)
            if who == "model" and sink is not None:
                sink.write(ds, ids, pred, true, mask, step0=t0)
    return {k: masked_channel_mean(torch.as_tensor(e).sqrt() / (torch.as_tensor(t).sqrt() + EPS), cv)
            for k, (e, t) in sums.items()}
