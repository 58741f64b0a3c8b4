"""Batches as a pure function of ``(seed, step, micro_step)``.

Every variant of a paired comparison sees the same token windows, and a resumed run needs only its
step to continue the sequence. A window is drawn uniformly over all window starts of all shards (a
shard in proportion to its length) and never crosses a shard boundary; with one shard it is exactly
the single-file sampler.
"""

from __future__ import annotations

import numpy as np
import torch

from normlab.data.corpus import DataError

#: Seed of the fixed validation batches: the same windows for every run, seed and variant.
VAL_SEED = 1_000_003


class _Windows:
    """Uniform random windows over shards: a shard is drawn in proportion to its window starts."""

    def __init__(self, shards: tuple[np.ndarray, ...], seq_len: int, split: str):
        self.shards, self.T = shards, seq_len
        starts = np.array([max(0, len(s) - seq_len - 1) for s in shards], dtype=np.int64)
        if starts.sum() == 0:
            longest = max((len(s) for s in shards), default=0)
            raise DataError(
                f"the {split} split has {longest} tokens in its longest shard, fewer than one "
                f"sequence of {seq_len + 1}"
            )
        self.cum = np.cumsum(starts)  # window starts before the end of each shard
        self.base = self.cum - starts  # ... and before its beginning

    def sample(self, rng: np.random.Generator, batch: int) -> np.ndarray:
        g = rng.integers(
            0, self.cum[-1], size=batch
        )  # one shard: exactly rng.integers(0, N - T - 1)
        k = np.searchsorted(self.cum, g, side="right")
        offsets = g - self.base[k]
        return np.stack(
            [self.shards[j][o : o + self.T + 1] for j, o in zip(k, offsets, strict=True)]
        ).astype(np.int64)


class BatchSampler:
    """Random windows of ``seq_len + 1`` tokens; each batch a pure function of its indices.

    ``train_batch(step, micro)`` and ``val_batch(i)`` return ``(x, y)``, both ``(B, T)`` int64 on
    ``device``, with ``y`` shifted one token to the right of ``x``. Windows never cross a shard.

    Raises:
        DataError: no shard of a split holds ``seq_len + 2`` tokens.
    """

    def __init__(self, data, batch_size: int, seq_len: int, seed: int, device: torch.device):
        self.train = _Windows(data.train_shards, seq_len, "train")
        self.val = _Windows(data.val_shards, seq_len, "val")
        self.B, self.T, self.seed, self.device = batch_size, seq_len, seed, device

    def _batch(
        self, windows: _Windows, rng: np.random.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        w = torch.from_numpy(windows.sample(rng, self.B)).to(self.device, non_blocking=True)
        return w[:, :-1], w[:, 1:]

    def train_batch(self, step: int, micro: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """The micro-batch ``micro`` of optimizer step ``step`` (0-based) for this run's seed."""
        return self._batch(self.train, np.random.default_rng([self.seed, step, micro]))

    def val_batch(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Fixed validation batch ``i``: identical for every run, seed and variant."""
        return self._batch(self.val, np.random.default_rng([VAL_SEED, i]))
