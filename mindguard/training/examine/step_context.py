"""The contexts a step is examined in, each restored afterwards: PyNative mode (:func:`pynative`), the cells'
training flags (:func:`training_mode`), the Parameters' values (:func:`restored`, written in place by
:func:`assign_in_place`); and the cell names as the user knows them (:func:`display_name`)."""
from __future__ import annotations

import contextlib
from typing import Dict, Iterator, List

import numpy as np
import mindspore as ms
from mindspore import nn


def display_name(network: nn.Cell, name: str) -> str:
    """Dotted cell name as the user knows it: ``nn.WithLossCell``'s ``_backbone.`` prefix is dropped
    (``_backbone.norm`` -> ``norm``, the names parameters carry); the root is ``<root>``."""
    if isinstance(network, nn.WithLossCell):
        if name == "_backbone":
            return "<network>"
        if name.startswith("_backbone."):
            return name[len("_backbone."):]
    return name or "<root>"



@contextlib.contextmanager
def pynative() -> Iterator[None]:
    previous = ms.get_context("mode")
    if previous != ms.PYNATIVE_MODE:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        yield
    finally:
        if ms.get_context("mode") != previous:
            ms.set_context(mode=previous)


@contextlib.contextmanager
def training_mode(network: nn.Cell) -> Iterator[None]:
    flags = [(cell, cell.training) for _, cell in network.cells_and_names()]
    network.set_train(True)
    try:
        yield
    finally:
        for cell, flag in flags:
            cell.training = flag


@contextlib.contextmanager
def restored(params: List[ms.Parameter], saved: Dict[int, np.ndarray]) -> Iterator[None]:
    try:
        yield
    finally:
        for param in params:
            if id(param) in saved:
                assign_in_place(param, saved[id(param)])


def assign_in_place(param: ms.Parameter, value: np.ndarray) -> None:
    """Write ``value`` into ``param``'s own memory (in place): a compiled optimizer (PyNative ``@jit``) keeps
    the tensors it was compiled with, so a ``set_data`` replacement would be updated by nobody and read by it
    never (MindSpore 2.10, ``tests/test_replay_ops.py::test_after_update_list_equals_a_real_step``)."""
    array = np.array(np.reshape(value, tuple(param.shape)), order="C")   # ascontiguousarray makes 0-d 1-d
    ms.ops.assign(param, ms.Tensor(array, dtype=param.dtype))
