"""What the examine pass dumps of a compiled step (:data:`DUMP_SCOPES`) and the compiled second look at a replayed
step (:data:`COMPILED_LOOK`). Constants only; never imports MindSpore."""
from __future__ import annotations

from typing import Dict, List, Tuple

from ..protocol import folder as layout
from ..protocol import kernels
from ..protocol.folder import PassName

#: What the examine pass dumps of a compiled step, narrowest first: ``(what, kernels, input_output)``.
#: ``"outputs"``: the outputs of every kernel but the optimizer's (by scope ``optimizer`` and by kernel type) and
#: the convolutions' weight gradients (consumed only by the optimizer, and as large as the weights) and copy kernels
#: (``TensorMove``, ``Assign``: their value is what they copied, read there), and no
#: ``Parameter`` files but those of undotted names (the batch, the learning rate, counters) -- a ``name-regex(...)``
#: kernel entry is matched against kernel scope names (which hold ``/``) and, measured on 2.10 CPU, against
#: Parameter names too. An op's inputs are earlier ops' outputs, or Parameters as the step began (the state the
#: examine pass keeps at the step): the analysis reads them there through the .ir data flow, and does not name an
#: op whose inputs the dump left out. When the culprit was left out (the optimizer's in-place kernels with an
#: infinite learning rate, an overflowing weight gradient), the narrow dump explains nothing and the step is
#: dumped again from the state kept at it, with the outputs of every op (``"all_outputs"``: the optimizer's, the
#: weight gradients and copies too, still no dotted Parameter files), and only if that explains nothing either,
#: ``"full"``. A ResNet-18 step (32x32, batch 8): 767 MB full, 226 MB all outputs, 137 MB narrow (README).
_LEFT_OUT = kernels.alternation(kernels.OPTIMIZER_KERNELS + kernels.WEIGHT_GRADIENT_KERNELS
                                 + tuple(kernels.COPY_KERNELS))   # the catalogues the analysis reads through
#: the folder of the compiled second look at a replayed step (:class:`mindguard.hunt.explain.Explainer`)
COMPILED_LOOK = PassName(layout.PASS2.family, "compiled")
#: the compiled look dumps every iteration from its start (a kept state or step 1): only this close to the step
COMPILED_LOOK_STEPS = 50
DUMP_SCOPES: Dict[str, Tuple[str, List[str], int]] = {
    "outputs": ("the outputs of every op but the optimizer's, the weight gradients and copies",
                [f"name-regex(^(?!.*optimizer)"
                 f"(?!.*/({_LEFT_OUT})-op)(?![^/]*[.][^/]*$).*)"], 2),
    "all_outputs": ("the outputs of every op (no trained weights' files)", ["name-regex(^(?![^/]*[.][^/]*$).*)"], 2),
    "full": ("every op's inputs and outputs", [], 0),
}


def scope_words(scope: str) -> str:
    """What a dump of ``scope`` holds, in words."""
    return DUMP_SCOPES[scope][0]
