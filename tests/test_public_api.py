"""The public API: every advertised name resolves, and importing mindguard costs no MindSpore import."""
from __future__ import annotations

import mindguard


def test_every_public_name_resolves_to_the_object_of_its_module():
    import importlib

    for name, module in mindguard._PUBLIC.items():  # pylint: disable=protected-access
        expected = getattr(importlib.import_module(f"mindguard.{module}"), name)
        assert getattr(mindguard, name) is expected, name
    assert set(mindguard.__all__) == {"__version__", *mindguard._PUBLIC}  # pylint: disable=protected-access


def test_import_and_arithmetic_commands_do_not_import_mindspore(run_py):
    run_py("""
        import sys
        import mindguard, mindguard.cli, mindguard.hunt, mindguard.protocol.record, mindguard.training.run
        import mindguard.dump.config
        assert "mindspore" not in sys.modules, sorted(m for m in sys.modules if m.startswith("mindspore"))[:5]
        assert mindguard.cli.main(["iteration", "--epoch", "2", "--step", "3", "--steps-per-epoch", "8"]) == 0
        assert "mindspore" not in sys.modules
    """)
