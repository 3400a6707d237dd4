"""MAD accuracy over the scored positions (targets != IGNORE).

mad-lab scores with ``torchmetrics`` ``MulticlassAccuracy(ignore_index=-100)``, whose default is
the macro average: per class c, recall tp_c / (tp_c + fn_c) (0 when undefined), averaged over the
classes with tp + fp + fn > 0. It computes that per test batch (128 sequences) and logs the mean
over batches weighted by their sequence count (Lightning's ``on_epoch`` mean): ``batch_macro``
here, MAD's score. ``macro`` is the same average over the whole test set at once, ``micro`` the
plain fraction of correct scored positions.
"""

from __future__ import annotations

import torch

from eval.mad.recall import IGNORE


class AccuracyCounter:
    """Accumulates per-class counts over batches; ``result()`` -> {"macro": float, "micro": float}."""

    def __init__(self, num_classes: int):
        self.tp = torch.zeros(num_classes, dtype=torch.float64)
        self.support = torch.zeros(num_classes, dtype=torch.float64)
        self.predicted = torch.zeros(num_classes, dtype=torch.float64)

    def update(self, predictions: torch.Tensor, targets: torch.Tensor) -> None:
        """predictions, targets: int64 tensors of the same shape; IGNORE targets are skipped."""
        keep = targets != IGNORE
        pred, tgt = predictions[keep].cpu(), targets[keep].cpu()
        n = len(self.tp)
        if len(tgt) and (int(tgt.max()) >= n or int(tgt.min()) < 0):
            raise ValueError(f"targets must lie in [0, {n}) or be {IGNORE}; got range "
                             f"[{int(tgt.min())}, {int(tgt.max())}]")
        self.support += torch.bincount(tgt, minlength=n).double()
        self.predicted += torch.bincount(pred.clamp(0, n - 1), minlength=n).double()
        self.tp += torch.bincount(tgt[pred == tgt], minlength=n).double()

    def result(self) -> dict[str, float]:
        total = float(self.support.sum())
        if total == 0:
            raise ValueError("no scored positions (every target is IGNORE)")
        active = (self.support + self.predicted) > 0  # tp + fn + fp > 0
        recall = torch.where(self.support > 0, self.tp / self.support.clamp(min=1), torch.zeros_like(self.tp))
        return {"macro": float(recall[active].mean()), "micro": float(self.tp.sum()) / total}


@torch.no_grad()
def evaluate(model, inputs: torch.Tensor, targets: torch.Tensor, num_classes: int,
             batch_size: int = 128) -> dict[str, float]:
    """Accuracy of ``model`` (tokens (B, L) -> logits (B, L, V)) on (N, L) int64 inputs/targets.

    Returns {"batch_macro": mean over batches of ``batch_size`` sequences of the batch's macro
    accuracy, weighted by sequences (MAD's score), "macro": macro over all N, "micro": over all N}.
    """
    total = AccuracyCounter(num_classes)
    weighted, sequences = 0.0, 0
    for start in range(0, len(inputs), batch_size):
        x, y = inputs[start:start + batch_size], targets[start:start + batch_size]
        batch = AccuracyCounter(num_classes)
        predictions = model(x).argmax(dim=-1)
        batch.update(predictions, y)
        total.update(predictions, y)
        weighted += batch.result()["macro"] * len(x)
        sequences += len(x)
    return {"batch_macro": weighted / sequences, **total.result()}
