"""Auxiliary losses and statistics that modules report to the criterion.

A module that computes an auxiliary term during ``forward`` (ReLUFormer's regulariser, eq. 7;
the flexible-attention gate term) records it in its :class:`AuxiliaryBuffer`; the criterion
``label_smoothed_cross_entropy_with_reg`` switches recording on (:func:`enable_auxiliary`),
collects every buffer of the model after the forward pass with :func:`collect_auxiliary` and
empties them.  Nothing is global: the buffers live on
the modules, so two models in one process never mix their terms.

A record is a *sum* over items (e.g. query rows x heads) plus the item *count*; the criterion
turns it into a per-module mean and averages the means over modules (i.e. over layers and
attention types).  Records are either losses (added to the training objective) or statistics
(logged only, e.g. attention entropy).
"""

from typing import Dict, Iterable, Tuple, Union

import torch
import torch.nn as nn

__all__ = ["AuxiliaryBuffer", "collect_auxiliary", "clear_auxiliary", "enable_auxiliary"]

Number = Union[float, torch.Tensor]


class AuxiliaryBuffer:
    """Running ``(sum, count, is_loss)`` per name for one module; not an ``nn.Module``, not saved.

    Recording is off until a collector switches it on with :func:`enable_auxiliary` (the
    criterion does so before every forward pass), so generation and criteria that ignore the
    terms pay nothing for them.
    """

    def __init__(self):
        self.enabled = False
        self._records: Dict[str, Tuple[Number, Number, bool]] = {}

    def record(self, name: str, total: Number, count: Number, is_loss: bool) -> None:
        """Add ``total`` (sum over ``count`` items) under ``name``.

        Raises:
            ValueError: ``name`` was recorded before with a different ``is_loss``.
        """
        if not self.enabled:
            return
        if name in self._records:
            t, c, kind = self._records[name]
            if kind != is_loss:
                raise ValueError(f"auxiliary record {name!r} mixes losses and statistics")
            total, count = t + total, c + count
        self._records[name] = (total, count, is_loss)

    def pop(self) -> Dict[str, Tuple[Number, Number, bool]]:
        """Return and clear the records."""
        out, self._records = self._records, {}
        return out

    def __bool__(self):
        return bool(self._records)


def _buffers(model: nn.Module) -> Iterable[AuxiliaryBuffer]:
    for m in model.modules():
        buf = getattr(m, "aux", None)
        if isinstance(buf, AuxiliaryBuffer):
            yield buf


def collect_auxiliary(model: nn.Module) -> Dict[str, Tuple[torch.Tensor, bool, int]]:
    """Pop every module's records and average them: per module ``sum / count``, then the mean
    over the modules that reported the name with ``count > 0`` (a module whose rows were all
    masked adds nothing; 0 when none counted anything).

    Computed on the records' device without reading a count back to the host: this runs in the
    criterion after every forward pass, and a host-device sync there would stop the host from
    queueing the backward pass while the forward one runs.

    Returns:
        ``{name: (mean (0-dim float32 tensor, keeps the graph), is_loss, number of modules that
        reported the name)}``.
    """
    acc: Dict[str, list] = {}
    for buf in _buffers(model):
        for name, (total, count, is_loss) in buf.pop().items():
            total = torch.as_tensor(total, dtype=torch.float32)
            if not torch.is_tensor(count):  # a Python number: a fill, not a host-to-device copy
                count = torch.full((), float(count), dtype=torch.float32, device=total.device)
            count = count.to(device=total.device, dtype=torch.float32)
            entry = acc.setdefault(name, [[], [], is_loss])
            entry[0].append(total / count.clamp_min(1.0))
            entry[1].append((count > 0).float())
    out = {}
    for name, (means, has, is_loss) in acc.items():
        has_t = torch.stack(has)
        out[name] = ((torch.stack(means) * has_t).sum() / has_t.sum().clamp_min(1.0), is_loss, len(means))
    return out


def enable_auxiliary(model: nn.Module, enabled: bool = True) -> None:
    """Switch recording on (or off) in every buffer of ``model``."""
    for buf in _buffers(model):
        buf.enabled = enabled


def clear_auxiliary(model: nn.Module) -> None:
    """Drop all pending records (e.g. after a forward pass whose terms are not used)."""
    for buf in _buffers(model):
        buf.pop()
