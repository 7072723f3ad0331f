"""Which Parameters a train network holds, and whose they are: the network's, the optimizer's state, or the
train-step wrapper's own (a loss scale, EMA copies kept by a custom step).

Used by the finiteness checks (every Parameter the step writes, except optimizer state, which follows from
the gradients) and by step capture (every Parameter, by role).
"""
from __future__ import annotations

import inspect
import types
from typing import Any, Iterator, List, Optional, Tuple

import mindspore as ms
import numpy as np
from mindspore import nn

from ...errors import CaptureError

ROLE_NETWORK = "network"        # a parameter of the network with loss: weights, BatchNorm statistics, buffers
ROLE_OPTIMIZER = "optimizer"    # optimizer state: learning_rate, global_step, moments.*, accum.*, ...
ROLE_TRAIN_CELL = "train_cell"  # owned by the train-step wrapper itself (e.g. a loss scale, EMA copies)
FLOAT_TYPES = (ms.float16, ms.float32, ms.float64, ms.bfloat16)


class ModuleParameters:
    """A torch-style model seen as a cell: an object that is not an ``nn.Cell`` (mindnlp's / mindtorch's
    ``nn.Module``, a hand-written wrapper) but whose ``named_parameters()`` (or ``parameters()``) yields MindSpore
    Parameters. Gives what mindguard reads of a cell -- ``get_parameters()``, ``trainable_params()``,
    ``parameters_and_names()``, ``cells_and_names()`` (its sub-modules, by ``named_modules()``, and the MindSpore
    cells they hold) -- and ``model``, the object itself. Build it with :func:`as_network`."""

    def __init__(self, model: Any):
        self.model = model

    def parameters_and_names(self) -> Iterator[Tuple[str, ms.Parameter]]:
        seen = set()
        named = getattr(self.model, "named_parameters", None)
        pairs = named() if callable(named) else ((getattr(p, "name", ""), p) for p in self.model.parameters())
        for name, param in pairs:
            if isinstance(param, ms.Parameter) and id(param) not in seen:
                seen.add(id(param))
                yield name, param

    def get_parameters(self) -> Iterator[ms.Parameter]:
        return (param for _, param in self.parameters_and_names())

    def trainable_params(self) -> List[ms.Parameter]:
        return [p for p in self.get_parameters() if p.requires_grad]

    def cells_and_names(self) -> Iterator[Tuple[str, Any]]:
        """``("", self)``, then every sub-module (``named_modules()``) and every MindSpore cell a module holds as an
        attribute (with that cell's own sub-cells), each once."""
        yield "", self
        seen = {id(self), id(self.model)}
        named = getattr(self.model, "named_modules", None)
        modules = list(named()) if callable(named) else [("", self.model)]
        for prefix, module in modules:
            prefix = prefix.rstrip(".")
            if id(module) not in seen:
                seen.add(id(module))
                yield prefix, module
            for attr, value in list(getattr(module, "__dict__", {}).items()):
                if isinstance(value, nn.Cell) and id(value) not in seen:
                    base = f"{prefix}.{attr}" if prefix else attr
                    for sub, cell in value.cells_and_names():
                        if id(cell) not in seen:
                            seen.add(id(cell))
                            yield (f"{base}.{sub}" if sub else base), cell


def as_network(model: Any) -> Any:
    """``model`` when it is an ``nn.Cell``; a :class:`ModuleParameters` (named after the model's class) when it is
    a torch-style model whose ``named_parameters()``/``parameters()`` yield MindSpore Parameters; else None."""
    if isinstance(model, nn.Cell):
        return model
    if not callable(getattr(model, "named_parameters", None)) and not callable(getattr(model, "parameters", None)):
        return None
    view = type(type(model).__name__, (ModuleParameters,), {"__module__": __name__})(model)
    try:
        found = next(view.get_parameters(), None)
    except Exception:  # noqa: BLE001 - a parameters() of another kind (an arbitrary object's method): not a model
        return None
    return view if found is not None else None


def is_network(cell: Any) -> bool:
    """An ``nn.Cell`` or a :class:`ModuleParameters` view."""
    return isinstance(cell, (nn.Cell, ModuleParameters))


def find_optimizer(train_network: nn.Cell) -> Optional[nn.Optimizer]:
    """The first ``nn.Optimizer`` cell inside ``train_network`` (``None`` when it has none)."""
    for _, cell in train_network.cells_and_names():
        if isinstance(cell, nn.Optimizer):
            return cell
    return None


def find_optimizers(cell: nn.Cell) -> List[nn.Optimizer]:
    """Every ``nn.Optimizer`` cell inside ``cell`` (itself included), each once, in ``cells_and_names`` order."""
    found: List[nn.Optimizer] = []
    for _, sub in cell.cells_and_names():
        if isinstance(sub, nn.Optimizer) and all(sub is not known for known in found):
            found.append(sub)
    return found


def unique_parameters(cell: nn.Cell) -> List[ms.Parameter]:
    """Every Parameter reachable from ``cell``, each once, in ``get_parameters()`` order."""
    seen, out = set(), []
    for param in cell.get_parameters():
        if id(param) not in seen:
            seen.add(id(param))
            out.append(param)
    return out


def classify_parameters(train_network: nn.Cell, optimizer: Optional[nn.Optimizer]) -> List[Tuple[ms.Parameter, str]]:
    """``(parameter, role)`` for every Parameter of ``train_network`` (roles: the ``ROLE_*`` constants).

    Raises :class:`~mindguard.errors.CaptureError` when two Parameters share a name (checkpoints are keyed
    by name, so such a network cannot be captured).
    """
    optimizer_state = set()
    trained_ids = set()
    if optimizer is not None:
        trained_ids = {id(p) for p in optimizer.parameters}
        optimizer_state = {id(p) for p in unique_parameters(optimizer) if id(p) not in trained_ids}
    owned_by_network = set(trained_ids)
    network_with_loss = getattr(train_network, "network", None)
    if isinstance(network_with_loss, nn.Cell) and network_with_loss is not train_network:
        # a train-step wrapper (TrainOneStepCell and kin): its network with loss owns the network's Parameters;
        # the wrapper's other cells (a DynamicLossScaleUpdateCell's step counters) are the wrapper's own
        owned_by_network.update(id(p) for p in unique_parameters(network_with_loss))
    else:
        for name, cell in train_network.cells_and_names():
            # the root's own parameters are the wrapper's (a loss scale) when it trains with an optimizer
            if (name or optimizer is None) and not isinstance(cell, nn.Optimizer):
                owned_by_network.update(id(p) for p in cell._params.values())  # pylint: disable=protected-access
    out = []
    for param in unique_parameters(train_network):
        if id(param) in optimizer_state:
            role = ROLE_OPTIMIZER
        elif id(param) in owned_by_network:
            role = ROLE_NETWORK
        else:
            role = ROLE_TRAIN_CELL
        out.append((param, role))
    names = [p.name for p, _ in out]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise CaptureError(f"cannot capture: several parameters share the names {duplicates[:10]}; give them unique "
                           f"names (MindSpore checkpoints are keyed by name)")
    return out


def written_parameters(train_network: Optional[nn.Cell], optimizer: Optional[nn.Optimizer] = None,
                       extra: Tuple[nn.Cell, ...] = ()) -> List[ms.Parameter]:
    """The floating-point Parameters a training step writes and that a check should watch: the trained
    weights, the network's non-trainable state (BatchNorm moving statistics, EMA copies), the train cell's
    own (loss scale) -- not the optimizer's state (moments, learning rate), which follows from the gradients.

    ``extra``: more cells whose Parameters count as the network's (``mindguard.watch``'s net and optimizer).
    Duplicate names are allowed here (nothing is saved by name).
    """
    params: List[ms.Parameter] = []
    seen = set()
    cells = [c for c in (train_network, *extra) if is_network(c)]
    optimizers = [c for c in cells if isinstance(c, nn.Optimizer)]
    for cell in cells:   # every optimizer inside (a GAN's container holds the discriminator's and the generator's)
        for found in find_optimizers(cell):
            if all(found is not known for known in optimizers):
                optimizers.append(found)
    state: set = set()
    for opt in optimizers:
        trained = {id(p) for p in opt.parameters}
        state.update(id(p) for p in unique_parameters(opt) if id(p) not in trained)
        for p in opt.parameters:  # the trained weights first, in the optimizer's order
            if id(p) not in seen and p.dtype in FLOAT_TYPES:
                seen.add(id(p))
                params.append(p)
    for cell in cells:
        for p in unique_parameters(cell):
            if id(p) not in seen and id(p) not in state and p.dtype in FLOAT_TYPES:
                seen.add(id(p))
                params.append(p)
    return params


def numpy_dtype(dtype: Any) -> "np.dtype[Any]":
    """The numpy dtype of a MindSpore dtype (``TypeError`` for one numpy lacks, such as bfloat16), without
    MindSpore's deprecated ``mindspore.dtype_to_nptype``, which logs a warning on every call since 2.7."""
    from mindspore.common import dtype as mstype

    convert = getattr(mstype, "_dtype_to_nptype", None) or ms.dtype_to_nptype
    return np.dtype(convert(dtype))


def named_objects(function: Any, *, nested: bool = False) -> Tuple[List[Any], List[str]]:
    """The objects a function's code reaches by name -- the globals its code names (``nested``: and its nested
    functions' code), then the values it closes over -- and the names its code uses (global and attribute names).
    Nothing for an object without code."""
    fn = inspect.unwrap(function)
    code = getattr(fn, "__code__", None)
    if code is None:
        return [], []
    names: List[str] = []
    stack = [code]
    while stack:
        current = stack.pop()
        names.extend(current.co_names)
        if nested:
            stack.extend(const for const in current.co_consts if isinstance(const, types.CodeType))
    scope = getattr(fn, "__globals__", {})
    objects = [scope[name] for name in dict.fromkeys(names) if name in scope]
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            objects.append(cell.cell_contents)
        except ValueError:   # an empty closure cell
            continue
    return objects, names
