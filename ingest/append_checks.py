"""What refuses an ``--append`` (``ingest/append.py``) before it writes anything: the request itself, a dataset that
cannot be appended to, options other than the dataset's, and a scan whose labels or held-out splits differ from it.

Every refusal is an ``InputError`` naming the option (and its flag) and the fix.
"""

from __future__ import annotations

from ..format import inputs as inputs_lib
from ..format import manifest as manifest_lib
from ..format.dataset import load_manifest
from ..format.errors import InputError
from .append_options import remembered
from .kinds.images import ImageJob
from .options import ConvertOptions

RECONVERT = "reconvert the union with `tfshard images SRC OUT --overwrite`"
# The flags of the options an append must share with the dataset (ConvertOptions.identity's keys).
_FLAGS = {"shard_bytes": "--shard-size", "num_shards": "--num-shards", "min_shards": "--min-shards",
          "compression": "--compression", "seed": "--seed/--no-shuffle", "index": "--index", "dedupe": "--dedupe",
          "image.quality": "--quality", "image.rgb": "--rgb", "image.max_side": "--max-side",
          "image.max_pixels": "--max-pixels", "image.validate": "--validate/--no-validate"}
_HOLDOUT_FLAGS = {"method": "--stratify", "seed": "--split-seed", "from": "--val-fraction/--test-fraction",
                  "fractions": "--val-fraction/--test-fraction"}


def check_append_request(kind: str, overwrite: bool) -> None:
    """``--append`` is for image datasets, and adds to them: refused with episodes or ``--overwrite``.

    Raises:
      InputError: naming the option and the fix.
    """
    if kind != "images":
        raise InputError(f"--append: only image datasets can be appended to for now (got a {kind} conversion); "
                         "convert the episodes in full, into a new folder or with --overwrite")
    if overwrite:
        raise InputError("--append with --overwrite: --overwrite replaces the dataset and --append adds to it (got "
                         "both); drop one")


def base_dataset(out: str) -> manifest_lib.Manifest:
    try:
        base = load_manifest(out)
    except FileNotFoundError as e:
        raise InputError(f"{out}: --append: no dataset to append to ({e}); convert SRC first (drop --append), "
                         "or choose the dataset's folder") from e
    if base.kind != "images":
        raise InputError(f"{out}: --append: an {base.kind} dataset (got kind {base.kind!r}); only image datasets "
                         "can be appended to")
    if base.split_rule is not None and base.split_rule["method"] == "stratified":
        raise InputError(f"{out}: --append: the dataset's held-out splits are stratified (exact per-class counts), "
                         "which no append can keep exact (got split_rule method 'stratified'); "
                         f"{RECONVERT}, or hold out by hash (without --stratify) to append later")
    return base


def _flat(options: dict, prefix: str = "") -> dict:
    found = {}
    for key, value in options.items():
        if isinstance(value, dict):
            found.update(_flat(value, f"{prefix}{key}."))
        else:
            found[prefix + key] = value
    return found


def check_options(out: str, base: manifest_lib.Manifest, options: ConvertOptions) -> None:
    """The output-affecting options must be the dataset's: another shard size, quality or compression would
    make the new shards unlike the old ones."""
    asked = _flat(options.identity("images"))
    had = _flat({k: v for k, v in base.options.items() if k not in ("converted_images", "label_rule")})  # results
    for key in sorted(set(asked) | set(had)):
        if key not in had or key not in asked:  # the dataset's options are not this tfshard's: no flag sets them
            what = f"records no option {key} ({_FLAGS.get(key, key)})" if key not in had else \
                f"records an option {key}, which this tfshard does not know"
            got = "no such key" if key not in had else f"{had[key]!r:.80}"
            raise InputError(f"{out}: --append: the dataset {what} (got {got} in its "
                             f"{manifest_lib.MANIFEST_NAME}: made by another tfshard version, or edited); append with "
                             f"the tfshard that made it, or {RECONVERT}")
        if asked.get(key) != had.get(key):
            raise InputError(f"{out}: --append: option {key} ({_FLAGS.get(key, key)}) is {asked.get(key)!r}, but "
                             f"the dataset was converted with {had.get(key)!r}; pass the dataset's options "
                             f"(`tfshard info {out}` lists them), or convert into another folder")


def _kind_name(labels: str | None) -> str:
    return "class folders (labels null)" if labels is None else f"{labels!r} labels"


def check_job(out: str, base: manifest_lib.Manifest, job: ImageJob) -> None:
    if job.labels != base.labels:
        raise InputError(f"{out}: --append: SRC gives {_kind_name(job.labels)} but the dataset has "
                         f"{_kind_name(base.labels)}; label the new images as the dataset is labelled "
                         "(--labels, --label-kind), or convert into another folder")
    if job.label_columns != base.label_columns:
        raise InputError(f"{out}: --append: the value labels' columns are {job.label_columns!r} but the dataset's "
                         f"are {base.label_columns!r}; give the labels file the dataset's columns")
    spelled = {name.casefold(): name for name in base.splits}
    for name in job.items:
        had = spelled.get(name.casefold(), name)
        if had != name:  # two splits that print alike to a reader asking for one, as within one labels file
            raise InputError(f"{out}: --append: SRC gives the split {name!r} but the dataset has {had!r}; write each "
                             "split one way, as the dataset does (split names are case-sensitive)")
    if job.split_rule != base.split_rule:
        rule, had = job.split_rule or {}, base.split_rule or {}
        key = next(k for k in ("method", "fractions", "seed", "from") if rule.get(k) != had.get(k))
        raise InputError(f"{out}: --append: held-out split option {key} ({_HOLDOUT_FLAGS[key]}) is "
                         f"{rule.get(key)!r}, but the dataset's split_rule has {had.get(key)!r}; pass the dataset's "
                         "--val-fraction, --test-fraction and --split-seed")


def new_inputs(out: str, old: manifest_lib.Manifest, job, options: ConvertOptions) -> int:
    """How many inputs of a conversion's scanned ``job`` the dataset ``old`` in ``out`` has not read, when an
    ``--append`` would take them (an image dataset with its ``inputs.json``, hash held-out splits, the same labels
    source, options the append could remember); else 0. What a plain rerun on grown inputs says it could do.
    """
    if job.kind != "images" or old.kind != "images" or (job.labels is None) != (old.labels is None):
        return 0
    if old.split_rule is not None and old.split_rule["method"] == "stratified":
        return 0
    try:
        remembered(out, old, options)
        inputs = inputs_lib.load_inputs(out, old)
    except ValueError:  # options an append refuses, or an inputs file it cannot read: no append to suggest
        return 0
    if inputs is None:
        return 0
    known = {record.path for record in inputs.inputs}
    return sum(item.relpath not in known for files in job.items.values() for item in files)
