"""Label-smoothed cross-entropy plus the auxiliary terms the model's modules report.

Registered as ``--criterion label_smoothed_cross_entropy_with_reg``.  Used by ReLUFormer
(Shen et al. 2023, eq. 7: ``|log sum s| + max(H(s_bar) - C, 0)``) and by any module that records
into an :class:`~fairseq_plugins.modules.auxiliary.AuxiliaryBuffer`.

Scaling follows fairseq's convention (as ``latent_depth`` does): the criterion returns a *sum*
over the ``sample_size`` target tokens (or sentences with ``--sentence-avg``) and the trainer
divides by ``sample_size``.  An auxiliary term is a mean (over query rows and heads, then over
attention modules, i.e. layers and attention types), so it is added as
``reg_weight * mean * sample_size``: after the trainer's division the objective is
``CE/token + reg_weight * mean`` whatever the batch size, and ``sample_size`` is untouched.

Logged per term under its own name (nats, means per query row): every loss term (e.g.
``reluformer_norm``, ``reluformer_entropy``), ``reg_loss`` = the *unweighted* sum of the loss
terms' means (``reg_weight`` multiplies it only in the optimised ``loss``, so the logged
``reg_loss`` does not change with lambda), and statistics (``attn_entropy``, ``attn_null_rate``).  ``loss`` is the optimised total in base 2 as fairseq
logs it; ``nll_loss``/``ppl`` are the plain translation terms.

A model that reports no auxiliary loss (softmax or ReLA attention, no flexible-attention gate)
trains plain label-smoothed cross-entropy under this criterion; the first training forward
pass that finds no loss term logs a warning (once per criterion instance).
"""

import logging
import math
from dataclasses import dataclass

import torch
from fairseq import metrics
from fairseq.criterions import register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterion,
    LabelSmoothedCrossEntropyCriterionConfig,
)

from ..modules.auxiliary import clear_auxiliary, collect_auxiliary, enable_auxiliary
from ..options import check_fields, option

__all__ = ["LabelSmoothedCrossEntropyWithRegCriterion"]

logger = logging.getLogger(__name__)

_PREFIX = "aux_"


@dataclass
class LabelSmoothedCrossEntropyWithRegConfig(LabelSmoothedCrossEntropyCriterionConfig):
    reg_weight: float = option(0.01, "weight lambda of the auxiliary losses reported by modules (ReLUFormer eq. 7 "
                                    "regulariser; the paper gives none, 0.01 is chosen by the lambda study, "
                                    "results/reluformer/lambda_study.md); 0 logs them without training on them", ge=0)


@register_criterion("label_smoothed_cross_entropy_with_reg",
                    dataclass=LabelSmoothedCrossEntropyWithRegConfig)
class LabelSmoothedCrossEntropyWithRegCriterion(LabelSmoothedCrossEntropyCriterion):
    """``CE_ls + reg_weight * sum_k mean_k`` over the auxiliary losses ``k`` of the model.

    Args:
        task, sentence_avg, label_smoothing, ignore_prefix_size, report_accuracy: as fairseq's
            ``label_smoothed_cross_entropy``.
        reg_weight: ``lambda`` (float, >= 0).  Default 0.01: Shen et al. (2023) give no value.
            Multi30k De->En, 1,000 updates, one seed (``results/reluformer/lambda_study.md``, the
            evidence-backed runs): lambda = 1 trains far behind (10.33 BLEU vs 22.73 at lambda = 0),
            0.1 costs 5.7 BLEU (17.02), 0.01 matches lambda = 0 (22.52) while raising attention
            entropy (0.58 -> 0.74 nats) and cutting null rows (68 % -> 19 %), the paper's direction
            (``docs/reluformer.md``).

    Raises:
        ValueError: an option outside its declared range (checked with the config's declaration,
            :func:`~fairseq_plugins.options.check_fields`): ``reg_weight`` not a finite number
            >= 0, ``label_smoothing`` not finite (``nan`` would only show after the first update).

    Warns (``logger.warning``, once per instance): a training forward pass of a model that
    reported no auxiliary loss before (nothing to regularise: plain label-smoothed CE), unless
    ``reg_weight == 0`` (the terms are not trained on anyway).
    """

    def __init__(self, task, sentence_avg, label_smoothing, ignore_prefix_size=0,
                 report_accuracy=False, reg_weight=0.01):
        super().__init__(task, sentence_avg, label_smoothing,
                         ignore_prefix_size=ignore_prefix_size, report_accuracy=report_accuracy)
        check_fields(LabelSmoothedCrossEntropyWithRegConfig(
            sentence_avg=sentence_avg, label_smoothing=label_smoothing, ignore_prefix_size=ignore_prefix_size,
            report_accuracy=report_accuracy, reg_weight=reg_weight))
        self.reg_weight = float(reg_weight)
        self._loss_terms_seen = False  # a forward pass reported an auxiliary loss
        self._warned_no_loss = False

    def forward(self, model, sample, reduce=True):
        """Loss (sum over ``sample_size``), ``sample_size``, logging output."""
        enable_auxiliary(model)  # modules record only while a collector is there
        clear_auxiliary(model)  # terms of any forward pass outside the criterion
        loss, sample_size, logging_output = super().forward(model, sample, reduce=reduce)
        aux = collect_auxiliary(model)
        reg = None
        for name, (mean, is_loss, _) in aux.items():
            logging_output[_PREFIX + name] = mean.detach() * sample_size  # a tensor: no sync (fairseq sums them)
            if is_loss:
                reg = mean if reg is None else reg + mean
        if reg is not None:
            self._loss_terms_seen = True
        elif model.training and not (self._loss_terms_seen or self._warned_no_loss) and self.reg_weight > 0:
            self._warned_no_loss = True
            logger.warning(
                "--criterion label_smoothed_cross_entropy_with_reg: the model (%s) reports no auxiliary "
                "loss (auxiliary terms recorded: %s), so it trains plain label-smoothed cross-entropy and "
                "--reg-weight %g has no effect. Auxiliary losses come from ReLUFormer attention functions "
                "(--*-attention-fn reluformer*, eq. 7) and the flexible-attention gate (rnnsearch "
                "--rnn-attention flexible, eq. 9); use --criterion label_smoothed_cross_entropy if plain CE is intended",
                type(model).__name__, ", ".join(sorted(aux)) or "none", self.reg_weight)
        if reg is not None:
            logging_output[_PREFIX + "reg_loss"] = reg.detach() * sample_size
            if reduce:
                loss = loss + self.reg_weight * reg.to(loss.dtype) * sample_size
                logging_output["loss"] = loss.data
        return loss, sample_size, logging_output

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        """fairseq's metrics plus each auxiliary term averaged per ``sample_size``."""
        super().reduce_metrics(logging_outputs)
        sample_size = sum(log.get("sample_size", 0) for log in logging_outputs)
        names = sorted({k for log in logging_outputs for k in log if k.startswith(_PREFIX)})
        for key in names:
            total = sum(log.get(key, 0) for log in logging_outputs)
            if sample_size > 0:
                metrics.log_scalar(key[len(_PREFIX):], total / sample_size, sample_size, round=4)  # tensor or float

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
