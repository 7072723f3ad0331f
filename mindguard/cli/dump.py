"""``mindguard dump-config``: write a validated dump.json for ``MINDSPORE_DUMP_CONFIG``."""
from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Union

from .._io import atomic_write_json
from ..dump.arm import _holds_json
from ..dump.config import ENV_VAR, DumpConfig
from ..errors import DumpConfigError


def cli_dump_config(args) -> int:
    """``mindguard dump-config``: write a validated dump.json and print the ``export`` line.

    ``args``: path, iteration, net_name, kernels, saved_data, input_output, op_debug_mode, device_target,
    overwrite, output. Returns the exit code (2 for an invalid setting, with the reason on stderr).
    """
    iteration: Union[str, int] = args.iteration
    if isinstance(iteration, str) and iteration.isascii() and iteration.isdigit():
        iteration = int(iteration)
    try:
        config = DumpConfig(args.path, args.net_name, iteration, kernels=list(args.kernels or ()),
                            saved_data=args.saved_data, input_output=args.input_output,
                            op_debug_mode=args.op_debug_mode, device_target=args.device_target,
                            overwrite=bool(getattr(args, "overwrite", False)))
    except DumpConfigError as exc:
        print(f"mindguard dump-config: {exc}", file=sys.stderr)
        return 2
    output = Path(os.path.abspath(args.output))
    if output.exists() and not config.overwrite:
        same = _holds_json(output, config.to_dict())
        if not same:
            print(f"mindguard dump-config: {output} already exists; pass --overwrite or choose another -o", file=sys.stderr)
            return 2
    if output == config.path or config.path in output.parents:
        print(f"mindguard dump-config: -o {output} lies inside the dump directory {config.path}; write it next to it",
              file=sys.stderr)
        return 2
    atomic_write_json(output, config.to_dict())
    print(f"wrote {output}")
    print(f"export {ENV_VAR}={shlex.quote(str(output))}")
    return 0
