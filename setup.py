"""Thin shim: all metadata lives in setup.cfg; this adds the attach hook's ``.pth`` file (issue 53).

``mindguard_attach.pth`` goes to the root of site-packages, where Python runs its one line at every start-up: with
``MINDGUARD=1`` (or ``MINDGUARD_ATTACH``, set by ``mindguard run``) in the environment it starts
:mod:`mindguard.training.attach.hook`; without, it costs two environment look-ups. pytest-cov ships its
subprocess hook the same way. An editable install gets no ``.pth`` of its own: there ``mindguard run`` and
``mindguard hunt`` start the hook through ``PYTHONPATH`` instead (``mindguard/training/attach/startup``).
"""
import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "mindguard_attach.pth"
PTH_SOURCE = os.path.join("mindguard", "training", "attach", PTH)


class build_py_with_pth(build_py):   # noqa: N801 - a distutils command's name
    """``build_py``, then the ``.pth`` file copied to the root of the build (the root of site-packages)."""

    def run(self):
        super().run()
        if not getattr(self, "editable_mode", False):
            self.copy_file(PTH_SOURCE, os.path.join(self.build_lib, PTH), preserve_mode=0)

    def get_outputs(self, include_bytecode=1):
        outputs = super().get_outputs(include_bytecode)
        if getattr(self, "editable_mode", False):
            return outputs
        return [*outputs, os.path.join(self.build_lib, PTH)]


setup(cmdclass={"build_py": build_py_with_pth})
