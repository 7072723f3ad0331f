"""The hunt's side in the training process: what a pass asks of it at set-up (``pass_setup``), how it ends itself
(``hunt_stop``) and says so (``pass_end``), the locate pass that dumps as it goes (``window_dump``) and ``mindguard
verify``'s pass (``verify_run``). Nothing here acts outside ``mindguard hunt``."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..._util.lazy import lazy_names

_NAMES = {
    "HuntStop": "hunt_stop", "HuntCannotContinue": "hunt_stop", "CANNOT_CONTINUE": "hunt_stop",
    "check_dump_config": "pass_setup", "dataset_debug_mode": "pass_setup", "DumpPruner": "window_dump",
    "VerifyPass": "verify_run",
}
__all__ = sorted(_NAMES)
__getattr__ = lazy_names(__name__, _NAMES)

if TYPE_CHECKING:  # pragma: no cover
    from .hunt_stop import CANNOT_CONTINUE, HuntCannotContinue, HuntStop
    from .pass_setup import check_dump_config, dataset_debug_mode
    from .verify_run import VerifyPass
    from .window_dump import DumpPruner
