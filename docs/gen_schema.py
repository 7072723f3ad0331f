"""Reference tables generated from the code when the site is built (``docs/_ext/mindguard_docs.py`` calls these):

* ``record_schema()`` -- the failure record's fields, JSON types and allowed values, from the ``FailureRecord``
  dataclass and the value lists in ``mindguard/protocol/record.py``, and the JSON Schema they make;
* ``summary_schema()`` -- the keys of the hunt's ``summary.json``: the fields of ``HuntSummary`` in
  ``mindguard/protocol/summary.py`` and the pass folders of ``mindguard/protocol/folder.py``, each with its
  description below. A key the code writes that has no description here, or a description of a key the code no
  longer writes, is a build error;
* ``exit_codes()`` -- the ``Outcome`` enum of ``mindguard/protocol/summary.py``: label and exit code.

``mindguard.protocol`` never imports MindSpore, so the build needs none.
"""
from __future__ import annotations

import ast
import dataclasses
import json
import sys
import typing
from pathlib import Path
from typing import Dict, List, Tuple

REPO = Path(__file__).resolve().parents[1]
SUMMARY = REPO / "mindguard" / "protocol" / "summary.py"

# summary.json: what each key the hunt writes means (the code says which keys exist; this says what they mean)
SUMMARY_KEYS: Dict[str, str] = {
    "schema": "summary format version (integer)",
    "command": "the training command, as a list of arguments",
    "run_dir": "the run folder (every artefact of the hunt is in it)",
    "outcome": "how the hunt ended: one of the labels in [Exit codes](exit-codes.md)",
    "exit_code": "the hunt's exit code ([Exit codes](exit-codes.md))",
    "finished": "local time the hunt ended (ISO 8601, seconds)",
    "command_returncode": "exit code of the training command in pass 1 (negative signal numbers as `128 + n`)",
    "pass1": "pass 1 (record): `returncode` and `records`, the failure record(s) it wrote (one per rank)",
    "failure": "the failure record of the failing step (see [Failure record](record.md)): `kind`, `global_step`, "
               "`call`, `epoch`, `step_in_epoch`, `dump_iteration`, `dump_graphs`, `examine`, ...",
    "resume": "the training state pass 1 kept: `kept_step`, `estimate_s` (the two time estimates), `route` "
              "(resumed, or from step 1 and why), `predicted_iteration_missed`",
    "locate": "the locating pass (from a kept state, every step checked: the exact failing step, its state kept; "
              "with `examine` `dump` it also dumped each step and its dump of the failing one was analysed): "
              "`returncode`, `records`, `examine`",
    "ended_early_at": "the last step the record of a command that ended early names (it says `running`)",
    "error": "why the hunt could not go on (an error of its own, or a pass that could not work)",
    "mindguard_error": "mindguard's own error in the training process (recording, capture or replay), with where",
    "signal": "the signal that interrupted the hunt (`SIGINT`, `SIGTERM`, ...)",
    "from_record": "`hunt --from`: `record` (the failing run's record), `route` (`resume` | `from_step_1` | "
                   "`done`), `why`, `window` (the steps the failing one lies in), `kept_step`, `fallback` (why "
                   "the kept state could not be used, when the hunt ran from step 1 instead), `edits` (what "
                   "differs from the failing run: edited project files, another folder), `locate_dump` (`dumped`: "
                   "the locate pass dumped each step, so no second pass ran; else why it did not) and `disagrees` "
                   "(`record_step`, `found_step`: the answer is about another step than the record's; `found_step` "
                   "null -- no failure came back -- with the outcome `not_reproducible`, exit 3) and `approximate` "
                   "(the random sources -- dropout kernels -- the kept state cannot hold: the resumed passes drew "
                   "other masks than the failing run, and the answer says so)",
    "origin": "the culprit: `op_type`, `direction` (`forward` | `backward` | `input`), `name`, `source` "
              "{`file`, `line`, `code`}, `inputs`, `outputs`, `hint`; for a batch the dataset pipeline raised on "
              "(`op_type` `dataset`), `error`: the error line the training process named; `traced_to` (when the "
              "culprit's operands were traced to where they came from): a list, the origin first, each with `kind` "
              "(`batch` | `hyper_parameter` | `parameter` | `constant` | `file`), `name`, `text` and its numbers "
              "-- a batch column's `argument`, `rule` (`mask_not_0_1` | `index_out_of_range` | `nonfinite` | "
              "`zero_size_box`), `rows`, `row_count`, `rows_total`, `values`, `expected`, `why`, `path`; a "
              "learning rate's `value`, `step`, `rule` (`learning_rate_jump`: `since_step`, `before`, `ratio`), "
              "`weights`; a Parameter already non-finite when the step began: `count`, `nan`, `pos_inf`, `neg_inf`, "
              "`size`, `step`, `since` (`exact` | `window` | `outside`), `since_step`, `window`; a constant of the "
              "graph: `rule` (`zero_divisor` | `nonfinite_constant` | `shifted_operand` | `large_constant`), "
              "`value`, `dtype`, `op`, `source`, `literal`; a data file's `holds`, `expected` "
              "([summary.json](summary.md#origin-traced_to)). With no operator the culprit (`direction` `input`), "
              "the origin of the Inf/NaN already in the step's inputs",
    "stopped_at": "the operator a step that raised stopped in (`run task error`; an out-of-range index), with its "
                  "`traced_to` as `origin` has it (the batch column whose ids are past the table)",
    "nonfinite_inputs": "inputs or Parameters non-finite from the start of the step (a NaN in the batch)",
    "warnings": "what the analysis did not read, and why (the report's `warning:` lines)",
    "dump_bytes": "bytes of the dump that was analysed",
    "dump_scopes": "narrower dumps that explained nothing before the one analysed",
    "origin_rank": "with several ranks: the rank that produced the Inf/NaN",
    "rank_roles": "with several ranks: each rank's role, `batch` | `local` | `received` | `unexplained` | `stopped` | "
                  "`clean` (its files were read) | `not_read`; across nodes also its `node`",
    "replay": "the replay report(s) of an eagerly examined step (one per rank)",
    "verify_command": "the `mindguard verify` command that checks a fix of the failure found without re-training "
                      "(once the script is edited): `--from` the failing run's record, `--from-start` when its kept "
                      "state did not repeat the failure",
    "fix_check": "the first hint's mechanical edit (its `now:`/`fix:` pair), applied to a scratch copy of the "
                 "project and run as `mindguard verify` runs a fix (not with `--no-check-fix`; it never changes the "
                 "exit code): `verdict` (`trains_finite` | `guard_only`: finite, but the origin the answer traced -- "
                 "a data column, a learning rate -- is unchanged | `still_fails` | `unchecked`), `printed` (the line "
                 "under the hint), `through_step` (the last global step it trained finite), `failed_step` (still "
                 "failing: the step that did), `why`, `hint` "
                 "(`origin` | `stopped_at`), `edit` (`file`, `line`, `now`, `fix`, `import_added`), `route` "
                 "(`resume` | `from_start`), `folder` (its run: `fix_check/`), `seconds`, `limit_s` "
                 "([how the hunt works](../explanation/how-the-hunt-works.md#the-fix-checked))",
    "divergence": "where the loss began to grow before the failure, from the failing run's record (its `divergence`, "
                  "else computed from its `loss_history`): `kind` (`growth` | `spike` | `sudden` | `unknown`), "
                  "`onset`, `onset_loss`, `end`, `end_loss`, `factor`, `base`, `failed`, `failed_loss`, `words`, and "
                  "`rate` (what the learning rate did: `name`, `kind`, `at_start`, `at_onset`, `at_end`, `peak`, "
                  "`peak_step`, `origin`, `words`); written when the answer has a failure "
                  "([where the divergence began](../how-to/verify-a-fix.md#a-training-that-diverged))",
    "known": "when no operator was isolated: what is known -- `pass` (`forward` | `backward` | `outside` | null: "
             "weights non-finite after a finite loss is the backward; `outside` when the step's dump holds no "
             "Inf/NaN), `facts` (the first non-finite Parameters and "
             "operators, in execution order), `tried` (the examinations run) and `next` (the command to run)",
}
# keys written under a name the code computes: the examine passes' folder names
SUMMARY_PATTERNS: Dict[str, str] = {
    "<pass folder>": "one examine pass (`pass2`, `examine` (`--from`), `resumed`, `pass2-all_outputs`, `pass2-full`, "
                     "`pass2-all_outputs-from-step-1`, ...): `returncode`, `records`, `examine` (how the step "
                     "was examined), `diverged` (why a resumed pass did not compute what pass 1 did) or "
                     "`not_examined` (why it could not run the step)",
}


class SchemaError(Exception):
    """The docs disagree with the code (a build error)."""


# ----------------------------------------------------------------------------------------------- record
def _json_type(hint) -> Tuple[List[str], str]:
    """JSON Schema types of a field's annotation, and the annotation as text."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    nullable = origin is typing.Union and type(None) in args
    if nullable:
        rest = [a for a in args if a is not type(None)]
        hint = rest[0] if len(rest) == 1 else hint
        origin, args = typing.get_origin(hint), typing.get_args(hint)
    base = {int: "integer", float: "number", str: "string", bool: "boolean"}.get(hint)
    if base is None:
        base = {list: "array", dict: "object"}.get(origin, "object")
    text = str(hint).replace("typing.", "") if typing.get_origin(hint) else getattr(hint, "__name__", str(hint))
    return ([base, "null"] if nullable else [base]), text


def record_fields() -> List[Dict[str, object]]:
    sys.path.insert(0, str(REPO))
    from mindguard.protocol import record  # no MindSpore import (record.py's own contract)

    enums = {"status": record.STATUSES, "kind": record.KINDS, "origin_kind": record.KINDS,
             "phase": record.PHASES, "examine": record.EXAMINERS, "mode": ("graph", "pynative")}
    hints = typing.get_type_hints(record.FailureRecord)
    rows = []
    for f in dataclasses.fields(record.FailureRecord):
        types, text = _json_type(hints[f.name])
        if f.name == "loss":     # a non-finite loss is written as a string (record.py: _loss_to_json)
            types = ["number", "string", "null"]
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        rows.append({"name": f.name, "types": types, "python": text, "default": default,
                     "enum": list(enums[f.name]) if f.name in enums else None})
    return rows


def record_schema() -> str:
    from mindguard.protocol import record

    rows = record_fields()
    props = {}
    for r in rows:
        prop: Dict[str, object] = {"type": r["types"] if len(r["types"]) > 1 else r["types"][0]}
        if r["enum"]:
            prop["enum"] = r["enum"] + ([None] if "null" in r["types"] else [])
        if r["name"] == "loss":
            prop["description"] = 'a number, or "nan" | "inf" | "-inf" for a non-finite loss'
        if r["name"] == "call":
            prop["properties"] = {"index": {"type": "integer", "minimum": 1}, "network": {"type": "string"},
                                  "kind": {"enum": list(record.CALL_KINDS)}}
        props[r["name"]] = prop
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "mindguard failure record",
              "type": "object", "required": ["schema", "status"], "properties": props}
    props["schema"]["enum"] = list(record.READABLE_SCHEMAS)
    out = [f"Generated from `FailureRecord` in `mindguard/protocol/record.py` (schema **{record.SCHEMA}**; readers "
           f"accept "
           f"{', '.join(map(str, record.READABLE_SCHEMAS))}) when the site is built.", "",
           "| field | JSON type | Python | default | allowed values |", "|---|---|---|---|---|"]
    for r in rows:
        enum = ", ".join(f"`{v}`" for v in r["enum"]) if r["enum"] else ""
        types = " \\| ".join(r["types"])
        out.append(f"| `{r['name']}` | {types} | `{r['python']}` | `{json.dumps(r['default'])}` | {enum} |")
    out += ["", "As a JSON Schema (draft 2020-12):", "", "```json", json.dumps(schema, indent=2), "```", ""]
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------- summary
def summary_keys(summary_class=None) -> Dict[str, int]:
    """The keys ``summary.json`` can hold (key -> its position): the fields of ``HuntSummary`` (or of
    ``summary_class``) other than ``passes``, and the folders of the passes every hunt names (``pass1``, ``locate``);
    the examine passes' folders are :data:`SUMMARY_PATTERNS`."""
    sys.path.insert(0, str(REPO))
    from mindguard.protocol import folder
    from mindguard.protocol.summary import HuntSummary   # no MindSpore import (the protocol package's contract)

    keys = (summary_class or HuntSummary).keys()
    keys[3:3] = [folder.PASS1.folder, folder.LOCATE.folder]
    return {key: i for i, key in enumerate(keys)}


def summary_schema(summary_class=None) -> str:
    found = summary_keys(summary_class)
    undescribed = sorted(set(found) - set(SUMMARY_KEYS))
    stale = sorted(set(SUMMARY_KEYS) - set(found))
    problems = [f"summary.json key {k!r} is a field of HuntSummary (mindguard/protocol/summary.py) but not described "
                f"in docs/gen_schema.py (SUMMARY_KEYS): add what it means" for k in undescribed]
    problems += [f"docs/gen_schema.py describes summary.json key {k!r}, which HuntSummary no longer has: "
                 f"remove it (or say where it went)" for k in stale]
    if problems:
        raise SchemaError("; ".join(problems))
    out = ["The keys of `summary.json`: the fields of `HuntSummary` in `mindguard/protocol/summary.py` (read when the "
           "site is built; a key without a description here fails the build). Keys appear only when they apply.", "",
           "| key | what it holds |", "|---|---|"]
    cell = lambda text: text.replace(" | ", " \\| ")   # noqa: E731 - a pipe inside a table cell
    out += [f"| `{k}` | {cell(SUMMARY_KEYS[k])} |" for k in sorted(found, key=lambda k: found[k])]
    out += [f"| `{k}` | {cell(v)} |" for k, v in SUMMARY_PATTERNS.items()]
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------------------- exit codes
def outcomes(path: Path = SUMMARY) -> List[Tuple[str, str, object, str]]:
    """(member, label, exit code or None, comment) of ``class Outcome`` in protocol/summary.py, in order."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Outcome":
            rows = []
            for item in node.body:
                if isinstance(item, ast.Assign) and isinstance(item.value, ast.Tuple):
                    label, code = (ast.literal_eval(e) for e in item.value.elts)
                    rows.append((item.targets[0].id, label, code, ""))
            return rows
    raise SchemaError("mindguard/protocol/summary.py has no class Outcome")


OUTCOME_MEANING = {
    "healthy": "no failure: every loss and Parameter stayed finite",
    "failure_found": "a failure was found and explained (the culprit is printed and in `summary.json`)",
    "command_failed": "the command failed without a training failure (its own error, `sys.exit(n)`, a kill from "
                      "outside): its own exit code is `command_returncode` in `summary.json`",
    "mindguard_failed": "mindguard's own error while recording, capturing or replaying: said as such, never a verdict "
                        "on the training",
    "ended_early": "the command ended without its record saying so (`os._exit`, a crash of the interpreter): no "
                   "evidence to judge by",
    "record_failed": "pass 1 could not record the step (killed, the run folder's disk full or removed, the script's "
                     "own `MINDSPORE_DUMP_CONFIG`)",
    "error": "the hunt itself could not go on (the message and `summary.json`'s `error` say why)",
    "no_guard": "the command never started a training with `mindguard.Guard` or `mindguard.watch`",
    "failed_before_training": "the command exited with an error before its first training step",
    "examine_failed": "the examine pass could not run (e.g. a dataset that raises under `dataset_sink_mode=True`)",
    "timed_out": "a pass ran longer than `--timeout`",
    "not_reproducible": "the failure did not repeat in pass 2 (not the same step, or not the same kind)",
    "analysis_failed": "the dump could not be analysed",
    "unexplained": "the dump or replay shows nothing that explains the failure",
    "interrupted": "SIGINT, SIGTERM, SIGHUP or SIGQUIT to the hunt, in any phase: every process the command started "
                   "was stopped, `summary.json` written first",
}


def exit_codes() -> str:
    rows = outcomes()
    missing = [label for _, label, _, _ in rows if label not in OUTCOME_MEANING]
    if missing:
        raise SchemaError(f"Outcome label(s) {missing} of mindguard/protocol/summary.py are not described in "
                          f"docs/gen_schema.py (OUTCOME_MEANING)")
    out = ["Generated from `Outcome` in `mindguard/protocol/summary.py` when the site is built. `summary.json` carries "
           "the "
           "label as `outcome` and the code as `exit_code`.", "",
           "| exit code | outcome | meaning |", "|---|---|---|"]
    for _, label, code, _ in sorted(rows, key=lambda r: (999 if r[2] is None else r[2])):
        shown = "the command's own" if code is None else str(code)
        out.append(f"| {shown} | `{label}` | {OUTCOME_MEANING[label]} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(record_schema())
    print(summary_schema())
    print(exit_codes())
