"""The kernel catalogues both sides of the hunt rely on, one list each: the examine pass's dump scopes (what it
leaves out) and the analysis (what it reads through, what it does not take as evidence) use the same names.

Names are MindSpore's kernel (primitive) types as they appear in dump file and scope names (``ApplyMomentum``);
:func:`lower` gives the lower-case form the analysis compares ``op_type`` with. Slots are 0-based. Never imports
MindSpore.
"""
from __future__ import annotations

from typing import Dict, FrozenSet, Iterable, Tuple

#: Optimizer kernels: they write the trained weights and their own state in place. The narrow dump leaves them
#: out (they are as large as the weights); the analysis reads their written inputs as after-step values.
OPTIMIZER_KERNELS: Tuple[str, ...] = (
    "ApplyMomentum", "SGD", "Adam", "ApplyAdam", "AdamWeightDecay", "FusedAdamWeightDecay", "FusedAdam",
    "FusedSparseAdam", "FusedSparseLazyAdam", "ApplyAdamWithAmsgrad", "ApplyRMSProp", "ApplyCenteredRMSProp",
    "ApplyAdagrad", "ApplyAdagradV2", "SparseApplyAdagrad", "ApplyFtrl", "SparseApplyFtrl", "ApplyProximalAdagrad",
    "Lamb", "LarsUpdate", "ApplyGradientDescent", "ApplyAdaMax", "ApplyAdadelta", "ApplyPowerSign", "ApplyAddSign",
)

#: Optimizer kernels whose written inputs are known (MindSpore's operator docs, input order as documented): the
#: other inputs (the learning rate above all) are read only. E.g. ApplyMomentum(variable, accumulation,
#: learning_rate, gradient, momentum), SGD(parameters, gradient, learning_rate, accum, momentum, stat).
OPTIMIZER_WRITTEN_SLOTS: Dict[str, Tuple[int, ...]] = {
    "ApplyMomentum": (0, 1), "Adam": (0, 1, 2), "AdamWeightDecay": (0, 1, 2), "SGD": (0, 3, 5),
    "ApplyRMSProp": (0, 1, 2), "ApplyCenteredRMSProp": (0, 1, 2, 3), "ApplyAdagrad": (0, 1),
    "ApplyAdagradV2": (0, 1), "ApplyFtrl": (0, 1, 2), "ApplyProximalAdagrad": (0, 1),
    "ApplyGradientDescent": (0,), "ApplyAdaMax": (0, 1, 2), "ApplyAdadelta": (0, 1, 2),
    "ApplyAdamWithAmsgrad": (0, 1, 2, 3),
}

#: Other kernels that write a Parameter input in place (every Parameter input they take).
IN_PLACE_WRITERS: Tuple[str, ...] = ("Assign", "AssignAdd", "AssignSub", "ScatterUpdate", "ScatterNdUpdate",
                                     "ScatterAdd", "ScatterSub")

#: Kernels that are neither but write some of their inputs: BatchNorm(x, scale, bias, moving_mean, moving_variance,
#: ...) updates its moving statistics in training.
IN_PLACE_INPUT_SLOTS: Dict[str, Tuple[int, ...]] = {
    "BatchNorm": (3, 4), "FusedBatchNorm": (3, 4), "FusedBatchNormEx": (3, 4), "BatchNormWithActivation": (3, 4),
    "BatchNormWithAddAndActivation": (3, 4), "SyncBatchNorm": (3, 4), "BNUpdate": (3, 4),
}

#: Copies: their output is the input at this slot, read there (the narrow dump leaves them out).
COPY_KERNELS: Dict[str, int] = {"TensorMove": 0, "Assign": 1}

#: Weight gradients consumed only by the optimizer, as large as the weights (the narrow dump leaves them out).
WEIGHT_GRADIENT_KERNELS: Tuple[str, ...] = ("Conv2DBackpropFilter", "Conv3DBackpropFilter",
                                            "DepthwiseConv2dNativeBackpropFilter")

#: Kernels that write a constant: +-Inf from them with no NaN is an intended mask (``masked_fill(s, m, -inf)``),
#: not the culprit.
INTENDED_INFINITY_KERNELS: Tuple[str, ...] = ("MaskedFill", "ScalarToTensor", "Fill", "FillV2", "Full", "FullLike",
                                              "Select")

#: Outputs a kernel can leave unwritten (their memory holds what an earlier kernel left): not evidence. Measured on
#: 2.10 CPU: BatchNorm in training writes y and its saved statistics, not outputs 1 and 2; the CPU LSTM's reserve
#: and state workspaces (3, 4).
UNWRITTEN_OUTPUT_SLOTS: Dict[str, Tuple[int, ...]] = {"BatchNorm": (1, 2), "LSTM": (3, 4)}

#: Collective communication kernels: a rank that received Inf/NaN through one did not make it.
COLLECTIVE_KERNELS: Tuple[str, ...] = ("AllReduce", "AllGather", "ReduceScatter", "Broadcast", "AlltoAll",
                                       "AlltoAllV", "NeighborExchange", "NeighborExchangeV2", "Receive",
                                       "CollectiveGather", "CollectiveScatter")


def lower(names: Iterable[str]) -> FrozenSet[str]:
    """The lower-case names (what the analysis compares an ``op_type`` with)."""
    return frozenset(name.lower() for name in names)


def lower_keys(table: Dict[str, Tuple[int, ...]]) -> Dict[str, Tuple[int, ...]]:
    return {name.lower(): slots for name, slots in table.items()}


def alternation(names: Iterable[str]) -> str:
    """``"A|B|C"`` for a dump config's ``name-regex``."""
    return "|".join(names)
