"""The checks: is a step's loss finite, did it refuse its update, are the Parameters it wrote finite
(``finite``, formerly ``mindguard.training.checks``); which Parameters those are (``params``); when an always-on Guard
checks them (``budget``, ``checked``); loss scaling judged by facts (``loss_scale``); the ranks' agreement on a
verdict (``consensus``); a FailureLocator's verdicts on its steps (``verdicts``)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..._util.lazy import lazy_names

_NAMES = {
    "AllFinite": "finite", "CompiledAllFinite": "finite", "OutputChecker": "finite", "ParamChecker": "finite",
    "StartedCheck": "finite", "StepVerdict": "finite", "compiled_check_unsafe": "finite", "dump_armed": "finite",
    "host_check_by_default": "finite", "nonfinite_batch": "finite", "on_device": "finite", "refused_flag": "finite",
    "under_hunt": "finite",
    "CHECK_FRACTION": "budget", "CheckBudget": "budget", "NONFINITE_KINDS": "checked", "ParamChecks": "checked",
    "StepVerdicts": "verdicts", "own_error": "verdicts", "trainings_error": "verdicts",
    "written_parameters": "params", "find_optimizer": "params", "as_network": "params",
}
__all__ = sorted(_NAMES)
__getattr__ = lazy_names(__name__, _NAMES)

if TYPE_CHECKING:  # pragma: no cover
    from .budget import CHECK_FRACTION, CheckBudget
    from .checked import NONFINITE_KINDS, ParamChecks
    from .finite import (AllFinite, CompiledAllFinite, OutputChecker, ParamChecker, StartedCheck, StepVerdict,
                         compiled_check_unsafe, dump_armed, host_check_by_default, nonfinite_batch, on_device,
                         refused_flag, under_hunt)
    from .params import as_network, find_optimizer, written_parameters
    from .verdicts import StepVerdicts, own_error, trainings_error
