"""``mindguard dump-config``: write a validated dump.json for ``MINDSPORE_DUMP_CONFIG``."""
from __future__ import annotations

import os
import shlex
import stat
import sys
from pathlib import Path
from typing import Optional, Union

from .._util.io import atomic_write_json
from ..dump.arm import _holds_json
from ..dump.config import ENV_VAR, NAME_MAX, DumpConfig
from ..errors import DumpConfigError


def cli_dump_config(args) -> int:
    """``mindguard dump-config``: write a validated dump.json and print the ``export`` line.

    ``args``: path, iteration, net_name, kernels, saved_data, input_output, op_debug_mode, device_target,
    overwrite, output. Returns the exit code (2 for an invalid setting, with the reason on stderr).
    """
    iteration: Union[str, int] = args.iteration   # a string: DumpConfig reads it as MindSpore does (ASCII only)
    try:
        config = DumpConfig(args.path, args.net_name, iteration, kernels=list(args.kernels or ()),
                            saved_data=args.saved_data, input_output=args.input_output,
                            op_debug_mode=args.op_debug_mode, device_target=args.device_target,
                            overwrite=bool(getattr(args, "overwrite", False)))
    except DumpConfigError as exc:
        print(f"mindguard dump-config: error: {exc}", file=sys.stderr)
        return 2
    output = Path(os.path.abspath(os.path.expanduser(args.output)))
    problem = output_problem(output)
    if problem:
        print(f"mindguard dump-config: error: -o {str(output)!r} {problem}", file=sys.stderr)
        return 2
    if output.exists() and not config.overwrite:
        same = _holds_json(output, config.to_dict())   # a regular file here: reading it cannot block
        if not same:
            print(f"mindguard dump-config: {output} already exists; pass --overwrite or choose another -o",
                  file=sys.stderr)
            return 2
    if output == config.path or config.path in output.parents:
        print(f"mindguard dump-config: -o {output} lies inside the dump directory {config.path}; write it next to it",
              file=sys.stderr)
        return 2
    try:
        atomic_write_json(output, config.to_dict())
    except OSError as exc:
        print(f"mindguard dump-config: error: cannot write -o {str(output)!r}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(f"wrote {output}")
    print(f"export {ENV_VAR}={shlex.quote(str(output))}")
    return 0


def output_problem(output: Path) -> Optional[str]:
    """Why the file ``output`` (absolute) cannot be written as a regular file, or ``None``: a name longer than
    255 bytes, a parent that is a file, or an existing directory, FIFO or device at ``output`` (writing over it
    would fail, or reading it to compare would block)."""
    for part in output.parts:
        if len(os.fsencode(part)) > NAME_MAX:
            return f"has a name of {len(os.fsencode(part))} bytes ({part[:20]}...); at most {NAME_MAX} are allowed"
    try:
        info = os.stat(output)
    except (FileNotFoundError, NotADirectoryError):
        info = None
    except OSError as exc:
        return f"cannot be inspected: {exc.strerror or exc}"
    if info is not None:
        if stat.S_ISDIR(info.st_mode):
            return "is a directory; give a file name such as dump.json"
        if not stat.S_ISREG(info.st_mode):
            return "exists and is not a regular file (a FIFO or a device); give a new file name such as dump.json"
        return None
    for parent in output.parents:
        if parent.exists():
            return None if parent.is_dir() else f"cannot be created: {str(parent)!r} is a file, not a directory"
    return None
