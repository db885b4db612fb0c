"""An append's options, remembered from the dataset (``ingest/append.py``): the user passes only what is new (SRC, a
labels file), and each option left at its default takes the value the dataset was converted with: the shard size
and counts, compression, the write-time seed, index files, ``dedupe``, the image options, the held-out rule
(``val_fraction``, ``test_fraction``, ``split_seed``) and the labels' kind. An option given another value than the
dataset's is refused in one line naming the value the dataset has. The manifest is untrusted: each option taken from
it is checked first (``check_recorded``), so an edited one (``"rgb": "false"``, a string seed) is refused naming its
field rather than converted with. Pure: the manifest is already loaded.

    remembered("photos-tfr", base, ConvertOptions(labels="new.csv")).val_fraction  # 0.1, as the dataset holds out
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..format import manifest as manifest_lib
from ..format.errors import OptionError
from ..format.json_checks import Checker
from ..format.names import COMPRESSIONS
from .holdout import HELD_OUT, SOURCE
from .options import ConvertOptions

_IMAGE = ("quality", "rgb", "max_side", "max_pixels", "validate")
# What a manifest tfshard wrote holds at each option an append takes from it: (types, what, least, most).
_COUNT = ((int,), "an integer", 1, None)
_FLAG = ((bool,), "true or false", None, None)
_RECORDED = {"shard_bytes": _COUNT, "num_shards": ((int, type(None)), "an integer or null", 1, None),
             "min_shards": _COUNT, "compression": ((str, type(None)), "'gzip' or null", None, None),
             "seed": ((int, type(None)), "an integer or null", None, None), "index": _FLAG, "dedupe": _FLAG,
             "image.quality": ((int,), "an integer", 1, 100), "image.rgb": _FLAG,
             "image.max_side": ((int, type(None)), "an integer or null", 1, None), "image.max_pixels": _COUNT,
             "image.validate": _FLAG}


def check_recorded(source: str, base: manifest_lib.Manifest) -> None:
    """The options an append takes from the manifest ``source`` (``OUT/dataset.json``) are values tfshard writes: of
    their type (a bool is no integer) and range. A key left out is not checked here: the append then refuses the
    option it would need (``append_checks.check_options``).

    Raises:
      ManifestError: the first that is not, naming the field (``options.image.rgb``), the value and the fix.
    """
    check = Checker(source)
    image = base.options.get("image")
    if "image" in base.options:
        check.mapping(image, "options.image")
    for key, (types, what, least, most) in _RECORDED.items():
        group, _, name = key.rpartition(".")
        held = image if group else base.options
        if held is None or name not in held:
            continue
        value = check.of(held[name], types, f"options.{key}", what)
        if name == "compression" and value not in COMPRESSIONS:
            check.fail(f"options.{key}", f"must be {what}", value)
        if isinstance(value, int) and ((least is not None and value < least) or (most is not None and value > most)):
            check.fail(f"options.{key}", f"must be at least {least}" if most is None else
                       f"must be in [{least}, {most}]", value)
    rule = base.split_rule  # its types checked as the manifest loaded; the splits an append can hold out again:
    if rule is not None and (rule["from"] != SOURCE or not set(rule["fractions"]) <= set(HELD_OUT)):
        check.fail("split_rule", f"must hold out {' or '.join(HELD_OUT)} (or both) from {SOURCE}, the splits tfshard "
                   "makes", {"from": rule["from"], "fractions": rule["fractions"]})


def dataset_options(base: manifest_lib.Manifest) -> dict[str, Any]:
    """The ``ConvertOptions`` fields an image dataset was converted with, read back from its manifest (its
    ``options`` identity, ``split_rule`` and ``labels``); fields the manifest does not hold are left out.

    Example:
      dataset_options(load_manifest("photos-tfr"))
      # {"shard_size": 134217728, "num_shards": None, ..., "val_fraction": 0.1, "split_seed": 0, ...}
    """
    options = base.options
    found: dict[str, Any] = {name: options[key] for name, key in (
        ("shard_size", "shard_bytes"), ("num_shards", "num_shards"), ("min_shards", "min_shards"),
        ("compression", "compression"), ("seed", "seed"), ("index", "index")) if key in options}
    if "seed" in found:
        found["shuffle"] = found["seed"] is not None
    found["dedupe"] = bool(options.get("dedupe", False))
    image = options.get("image")
    if isinstance(image, dict):
        found.update({name: image[name] for name in _IMAGE if name in image})
    rule = base.split_rule
    fractions = rule["fractions"] if rule is not None else {}
    found.update(val_fraction=fractions.get("val", 0.0), test_fraction=fractions.get("test", 0.0))
    if rule is not None:
        found["split_seed"] = rule["seed"]
    return found


def _differs(name: str, asked: Any, had: Any) -> bool:
    if name in ("val_fraction", "test_fraction"):
        return float(asked) != float(had)
    return asked != had


def remembered(out: str, base: manifest_lib.Manifest, options: ConvertOptions) -> ConvertOptions:
    """``options`` with each field left at its default replaced by the dataset's own (``dataset_options``), and the
    labels file's kind (``label_kind``) the dataset's when a labels file is given.

    Raises:
      OptionError: a field given another value than the dataset's; the message names the option as the caller
        spelled it and the value the dataset has.
      ManifestError: an option the manifest records that tfshard never writes (``check_recorded``).
    """
    check_recorded(f"{out}/{manifest_lib.MANIFEST_NAME}", base)
    had = dataset_options(base)
    if options.labels is not None and base.labels is not None:
        had["label_kind"] = base.labels
    defaults = {field.name: field.default for field in dataclasses.fields(ConvertOptions)}
    if not options.shuffle and had.get("shuffle", False):
        raise OptionError("{out}: {shuffle} is False, but the dataset was shuffled with seed {seed!r}; an append "
                          "({append:set}) takes the dataset's own options: drop {shuffle}, or convert into another "
                          "folder", out=out, seed=had["seed"])
    if not options.shuffle:  # the dataset's records are in sorted order too: nothing to take from it
        had = {name: value for name, value in had.items() if name not in ("seed", "shuffle")}
    for name, value in had.items():
        asked = getattr(options, name)
        if asked == defaults[name] or not _differs(name, asked, value):
            continue
        what = "not shuffled" if name == "seed" and value is None else "converted with {had!r}"
        raise OptionError("{out}: {" + name + "} is {asked!r}, but the dataset was " + what + "; an append "
                          "({append:set}) takes the dataset's own options: drop {" + name + "}, or convert into "
                          "another folder", out=out, asked=asked, had=value)
    return dataclasses.replace(options, **had)
