"""Cell surgery: swap sub-cells of a built network in place, without the traps.

The traps (see docs/mindspore-facts.md, "Replacing cells in a built network"):
- ``nn.SequentialCell`` runs its ``cell_list``, not ``_cells``: a ``setattr`` would be ignored;
- after a GRAPH-mode compile a replacement is silently ignored (compile cache);
- replacing a cell that owns parameters after an optimizer was built leaves the optimizer updating
  the old, detached Parameters;
- parameter names must stay as they were, or checkpoints no longer load.
"""
from __future__ import annotations
from ..errors import ArgumentTypeError, CellSurgeryError

import gc
from typing import Callable, Dict, List, Tuple, Type, Union

from mindspore import nn

Match = Union[Type[nn.Cell], Callable[[nn.Cell], bool]]


def replace_cells(net: nn.Cell, match: Match, factory: Callable[[nn.Cell], nn.Cell]) -> List[str]:
    """Replace every sub-cell of ``net`` that matches, in place, and return the dotted names replaced.

    Args:
        net: a built network (the replacement happens inside it; ``net`` itself is never replaced).
        match: a ``Cell`` subclass (``isinstance`` test) or a predicate ``match(cell) -> bool``.
        factory: ``factory(old_cell) -> new_cell``; called once per matched cell, and every new cell is
            built and checked before anything is assigned. A matched cell's children are not visited
            (the new cell replaces the whole subtree). A cell shared under several names is replaced
            under each of them by one new cell (and each name is returned).

    Parameter names are kept stable: the new cell's parameters are renamed with the old cell's dotted
    prefix, so checkpoints written before the swap still load.

    Raises:
        TypeError: ``net`` is not a Cell, ``match`` is neither a Cell class nor callable, or ``factory``
            returns something that is not a Cell.
        CellSurgeryError: ``net`` was already compiled in GRAPH mode (MindSpore would keep running the
            compiled graph and ignore the swap), or a replaced cell owns parameters that an existing
            optimizer is updating (the optimizer would keep updating the detached ones).
    """
    if not isinstance(net, nn.Cell):
        raise ArgumentTypeError(f"replace_cells(net=...) needs a mindspore.nn.Cell, got {type(net).__name__}")
    predicate = _as_predicate(match)
    if not callable(factory):
        raise ArgumentTypeError(f"replace_cells(factory=...) must be callable(old_cell) -> Cell, got {factory!r}")

    found = _find(net, predicate)
    if not found:
        return []
    targets = _unique_targets(found)
    compiled = _compiled_graphs_holding(net)
    if compiled:
        raise CellSurgeryError(
            f"cannot replace {[n for n, _ in targets]}: the network was already compiled in GRAPH mode "
            f"(compiled cells include {compiled[:3]}), so MindSpore would keep running the old graph and "
            f"silently ignore the swap. Replace cells right after building the network, before the first "
            f"model.train / model.eval / net(x)."
        )
    _refuse_if_optimizer_holds(targets)

    new_cells = {}  # id(old) -> new; all built (and checked) before the first assignment
    for name, old in targets:
        new = factory(old)
        if not isinstance(new, nn.Cell):
            raise ArgumentTypeError(f"factory returned {type(new).__name__} for {name!r}; it must return a "
                                    f"mindspore.nn.Cell "
                            f"(nothing was replaced)")
        new_cells[id(old)] = new
    replaced = []
    renamed = set()  # a cell shared by several parents becomes one shared new cell, named after its first place
    for name, parent, key, old in found:
        new = new_cells[id(old)]
        _assign(parent, key, new)
        if id(new) not in renamed:
            renamed.add(id(new))
            new.update_parameters_name(name + ".")
        replaced.append(name)
    return replaced


def _assign(parent: nn.Cell, key: str, cell: nn.Cell) -> None:
    """Put ``cell`` at ``key`` of ``parent``: an index of a ``SequentialCell``/``CellList`` (which run their
    ``cell_list``, not ``_cells``), else an attribute."""
    if isinstance(parent, (nn.SequentialCell, nn.CellList)) and key.isdigit():
        parent[int(key)] = cell
    else:
        setattr(parent, key, cell)


def put_back_cells(net: nn.Cell, originals: Dict[int, nn.Cell]) -> List[str]:
    """Undo :func:`replace_cells`: every sub-cell of ``net`` whose ``id`` is a key of ``originals`` is replaced by
    the cell it stands for (``originals[id(new)]``, which kept its own Parameter names), and returns the dotted names
    put back. Allowed after a compile (it restores what the user built): the compile caches of ``net``'s cells are
    cleared, so a later compile sees the user's cells, not the graph built with the replacements."""
    found = _find(net, lambda cell: id(cell) in originals)
    for _name, parent, key, new in found:
        _assign(parent, key, originals[id(new)])
    if found:
        for _, cell in net.cells_and_names():
            cache = getattr(cell, "compile_cache", None)
            if cache:
                cache.clear()
    return [name for name, _, _, _ in found]


def _as_predicate(match: Match) -> Callable[[nn.Cell], bool]:
    if isinstance(match, type):
        if not issubclass(match, nn.Cell):
            raise ArgumentTypeError(f"replace_cells(match=...) got the class {match.__name__}, which is not a "
                                    f"mindspore.nn.Cell")
        return lambda cell: isinstance(cell, match)
    if callable(match):
        return match
    raise ArgumentTypeError(f"replace_cells(match=...) must be a Cell class or a predicate cell -> bool, got {match!r}")


def _find(net: nn.Cell, predicate) -> List[Tuple[str, nn.Cell, str, nn.Cell]]:
    """Every place a matching cell sits: ``(dotted name, parent, key in parent, cell)``, depth first.

    Unlike ``cells_and_names()`` (which lists a shared cell once), a cell reachable under several names
    is returned once per name, so every reference to it gets replaced. A matched cell's children are
    not visited.
    """
    found: List[Tuple[str, nn.Cell, str, nn.Cell]] = []

    def walk(cell: nn.Cell, prefix: str, ancestors: frozenset) -> None:
        for key, child in list(cell._cells.items()):  # pylint: disable=protected-access
            if child is None or id(child) in ancestors:
                continue
            name = f"{prefix}.{key}" if prefix else key
            if predicate(child):
                found.append((name, cell, key, child))
            else:
                walk(child, name, ancestors | {id(child)})

    walk(net, "", frozenset({id(net)}))
    return found


def _unique_targets(found) -> List[Tuple[str, nn.Cell]]:
    seen, targets = set(), []
    for name, _, _, cell in found:
        if id(cell) not in seen:
            seen.add(id(cell))
            targets.append((name, cell))
    return targets


def _is_compiled(cell: nn.Cell) -> bool:
    """True if this cell was the root of a GRAPH-mode compile, or (2.8+) a compile included it."""
    return getattr(cell, "_compile_phase", None) is not None or bool(getattr(cell, "compile_cache", None))


def _compiled_graphs_holding(net: nn.Cell) -> List[str]:
    """Names of compiled cells whose graph includes ``net`` or one of its sub-cells; empty if none.

    Two sources, because one private attribute is not enough across versions: a cell's own
    ``_compile_phase``/``compile_cache`` (MindSpore >= 2.8 sets ``_compile_phase`` on every sub-cell a
    compile included; 2.7 sets nothing on them), and the executor's registry of compiled cells,
    ``cells_compile_cache`` in ``mindspore.graph.api`` (2.8+) / ``mindspore.common.api`` (2.7): the
    cell ``Model.train`` compiled (its ``TrainOneStepCell``) is found there and searched for ``net``.
    """
    cells = list(net.cells_and_names())
    compiled = [name or "<root>" for name, cell in cells if _is_compiled(cell)]
    if compiled:
        return compiled
    inside = {id(cell) for _, cell in cells}
    try:
        from mindspore.graph import api
    except ImportError:  # MindSpore 2.7
        from mindspore.common import api
    registry = getattr(api, "cells_compile_cache", None) or {}
    roots = {key for key, cache in list(registry.items()) if cache and key not in inside}
    if not roots:
        return []
    holders = []
    for obj in gc.get_objects():
        try:
            if id(obj) not in roots or not isinstance(obj, nn.Cell):
                continue
        except ReferenceError:  # a dead weakref proxy
            continue
        if any(id(cell) in inside for _, cell in obj.cells_and_names()):
            holders.append(f"{type(obj).__name__} (holding the network)")
    return holders


def _refuse_if_optimizer_holds(targets: List[Tuple[str, nn.Cell]]) -> None:
    owned = {}
    for name, cell in targets:
        for param in cell.get_parameters():
            owned[id(param)] = (name, param.name)
    if not owned:
        return
    for obj in gc.get_objects():
        try:
            is_optimizer = isinstance(obj, nn.Optimizer)
        except ReferenceError:  # a dead weakref proxy
            continue
        if is_optimizer:
            held = [owned[id(p)] for p in getattr(obj, "_parameters", ()) if id(p) in owned]
            if held:
                cells = sorted({c for c, _ in held})
                raise CellSurgeryError(
                    f"cannot replace {cells}: they own parameters {[p for _, p in held][:5]} that the optimizer "
                    f"{type(obj).__name__} already updates; after the swap it would keep updating the old, "
                    f"detached Parameters. Replace cells before building the optimizer "
                    f"(before nn.SGD(net.trainable_params(), ...))."
                )


def dropout_classes() -> tuple:
    """Every dropout cell class of this MindSpore (``nn.Dropout``/``Dropout1d/2d/3d``, the ``*Ext`` ones,
    ``mint.nn``'s)."""
    classes = [getattr(nn, n) for n in ("Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "DropoutExt", "Dropout2dExt")
               if isinstance(getattr(nn, n, None), type)]
    try:
        from mindspore.mint import nn as mint_nn

        classes += [getattr(mint_nn, n) for n in ("Dropout", "Dropout2d")
                    if isinstance(getattr(mint_nn, n, None), type)]
    except ImportError:
        pass
    return tuple(c for c in classes if issubclass(c, nn.Cell))
