"""``--append``: the images of SRC not yet in a dataset, converted into new shards of the next generation.

The dataset's ``inputs.json`` (``format/inputs.py``) says what it has read. SRC is scanned as for a
conversion, with the dataset's class names first so no label changes (new classes follow, sorted); an input
whose path is not listed (or was listed as rejected or dropped and has changed since) is new. A listed input
that changed (size, mtime, ctime, label or split) or is gone from SRC is only reported: its record stays, since
shards are never rewritten. The new inputs are planned with the dataset's own options, remembered from its
manifest (``ingest/append_options.py``: an option given another value is an error naming it), into shards named
for generation g (``train-g0001-...``), and written, committed and resumed by the engine
(``ingest/engine.py commit_shards``) in the state folder, as a conversion is. Class counts are added and pixel
statistics merged from the exact sums ``inputs.json`` keeps.

Crash safety, under the output lock: ``append.json`` in the state folder records the base and target
fingerprints before any shard is written; once every shard is committed, the new inputs file is staged in the
state folder, then ``dataset.json`` is replaced (atomically), then ``inputs.json``, then the state folder goes.
So ``dataset.json`` only ever lists committed shards. A rerun of the same command resumes; one that finds the
manifest already replaced only puts the staged inputs file in place; an unfinished append of other inputs
(SRC changed in between) has its unlisted shards removed (on the proof of their commit records,
``ingest/proof.py``) and starts again. Everything that can refuse an append is checked before it writes anything,
so a refused append leaves OUT as it found it (the checks of the request, the dataset, its options and the
scan are ``ingest/append_checks.py``). With ``--tfds`` the metadata follows the manifest: what TFDS could
refuse is checked before any shard is written, and the old metadata goes before ``dataset.json`` is replaced.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
from collections.abc import Callable

import tensorflow as tf

from ..format import appends as appends_lib
from ..format import inputs as inputs_lib
from ..format import manifest as manifest_lib
from ..format import stops
from ..format.dataset import load_manifest, read_small_file
from ..format.errors import InputError, OutputExistsError
from ..format.names import INPUTS_NAME, MAX_GENERATION, STATE_DIR, TFDS_FILES, shard_generation
from ..format.storage import join
from .append_checks import RECONVERT, base_dataset, check_job, check_options
from .append_options import remembered
from .engine import commit_shards
from .images import PixelSums
from .job_plan import JobPlan, plan_job
from .kinds.images import ImageJob
from .lock import output_lock
from .options import ConvertOptions
from .parallel import default_workers
from .proof import by_state, inputs_fingerprint, refusal, remove_proven
from .resume import RunStatus, refuse_unrecorded
from .state import APPEND, REMOVING, check_state_folder, exists, read_state, remove_state_folder, state_file
from .tfds import check_tfds_up_front, write_tfds_after_conversion, written_for
from .write import write_text_atomic

log = logging.getLogger(__name__)

_HEX = re.compile(r"^[0-9a-f]{64}\Z")


@dataclasses.dataclass(frozen=True)
class AppendFound:
    """What an append found in SRC against the dataset, before writing anything (``RunStatus.append``).

    Attributes:
      generation: the generation its shards are named for.
      new_inputs: inputs not yet in the dataset, to convert.
      new_classes: classes they bring, after the dataset's own.
      changed: paths in the dataset whose file (size, mtime, ctime), label or split is not what was converted.
      deleted: paths in the dataset gone from SRC.
      unlabelled: those of ``changed`` the append's labels file has no row for (a file of the new images only).
    """

    generation: int
    new_inputs: int
    new_classes: list[str]
    changed: list[str]
    deleted: list[str]
    unlabelled: list[str] = dataclasses.field(default_factory=list)


def _settle_state(out: str) -> dict | None:
    """An append killed after its manifest gets its staged inputs file; returns an unfinished append's record."""
    check_state_folder(out)
    state = join(out, STATE_DIR)
    if not tf.io.gfile.exists(state):
        return None
    record = state_file(out, APPEND)
    if not tf.io.gfile.exists(record) or tf.io.gfile.exists(join(state, REMOVING)):
        raise OutputExistsError(f"{out}: holds an unfinished conversion ({STATE_DIR}/); rerun the command that "
                                "started it to finish it, then append")
    raw = read_state(record)
    if not (isinstance(raw, dict) and set(raw) == {"base", "target"}
            and all(isinstance(v, str) and _HEX.match(v) for v in raw.values())):
        raise OutputExistsError(f"{record}: not an append record tfshard wrote; remove {state} and run again")
    manifest = load_manifest(out)
    if manifest.fingerprint == raw["target"]:  # killed after its manifest: only the inputs file is left to do
        if inputs_lib.load_inputs(state, manifest) is not None:  # checked before it is put in place
            _check_replaced_inputs(out, raw)
            write_text_atomic(join(out, INPUTS_NAME),
                              read_small_file(join(state, INPUTS_NAME), "inputs file").decode())
        elif inputs_lib.load_inputs(out, manifest) is None:  # killed while removing the state folder, or tampered
            raise OutputExistsError(f"{state}: an append whose {manifest_lib.MANIFEST_NAME} was written but whose "
                                    f"{INPUTS_NAME} is in neither {out} nor {state}; {RECONVERT}")
        remove_state_folder(out)
        return None
    if manifest.fingerprint != raw["base"]:
        raise OutputExistsError(f"{record}: an append to another dataset than {out}'s; remove {state} and run again")
    return raw


def _check_replaced_inputs(out: str, raw: dict) -> None:
    """The inputs file a finished append's staged one replaces is the dataset's, before or after the append (its
    fingerprint says so), or nothing.

    Raises:
      OutputExistsError: anything else is there; it is not replaced.
    """
    path = join(out, INPUTS_NAME)
    if exists(path) and inputs_fingerprint(out) not in (raw["base"], raw["target"]):
        raise refusal(path, "not the inputs file of this dataset before or after its append (no fingerprint of "
                            "either)")


def _listed(base: manifest_lib.Manifest) -> set[str]:
    return {n for s in base.splits.values() for sh in s.shards for n in (sh.file, sh.index_file) if n}


def _discard(out: str, base: manifest_lib.Manifest) -> None:
    """An unfinished append of other inputs: its shards, which no manifest lists, are removed on the proof of their
    commit records (a file of the dataset never: a record naming one proves nothing here). Killed midway, the
    records are still there for the next run to finish.

    Raises:
      OutputExistsError: a file that does not match its record; nothing is removed.
    """
    listed = _listed(base)
    gone = [r for r in by_state(out).values() if r.name not in listed and r.name != INPUTS_NAME]
    log.warning("%s: an unfinished append of other inputs: removing its file(s), in no manifest", out)
    remove_proven(out, gone, journal=False)
    remove_state_folder(out)


def _diff(src: str, job: ImageJob, inputs: inputs_lib.Inputs) -> tuple[dict, set, list[str], list[str]]:
    """The new items per split, the paths retried (read before, rejected or dropped, changed since), and the
    changed and deleted paths of inputs already in the dataset."""
    known = {r.path: r for r in inputs.inputs}
    new: dict[str, list] = {}
    retried, changed, seen = set(), [], set()
    for split, files in job.items.items():
        for item in files:
            seen.add(item.relpath)
            old = known.get(item.relpath)
            now = inputs_lib.InputRecord(item.relpath, split, job.label_of(item), item.size, item.mtime_ns,
                                         item.ctime_ns, None, "")
            if old is not None and old.same_file(now):
                continue
            if old is not None and old.state == "written":
                changed.append(item.relpath)
                continue
            if old is not None:
                retried.add(item.relpath)
            new.setdefault(split, []).append(item)
    deleted = []
    for path, old in known.items():
        if old.state == "written" and path not in seen:
            (changed if os.path.lexists(os.path.join(src, *path.split("/"))) else deleted).append(path)
    return new, retried, sorted(changed), sorted(deleted)


def _merged_splits(base, inputs, job, done) -> tuple[dict, dict]:
    """The splits of the merged manifest and their exact pixel sums: old shards, then the new generation's."""
    parts: dict[str, list] = {}
    for spec in done.specs:
        parts.setdefault(spec.split, []).append(done.results[spec.file_name])
    splits, sums = {}, {}
    for split in list(base.splits) + [s for s in parts if s not in base.splits]:
        old, new = base.splits.get(split), parts.get(split, [])
        raw = inputs.pixel_sums.get(split, {"count": 0, "sums": [0, 0, 0], "squares": [0, 0, 0]})
        total = sum((p.stats.pixels for p in new), PixelSums(raw["count"], tuple(raw["sums"]), tuple(raw["squares"])))
        sums[split] = {"count": total.count, "sums": list(total.sums), "squares": list(total.squares)}
        counts = {name: (old.class_counts.get(name, 0) if old else 0) + sum(p.stats.class_counts[i] for p in new)
                  for i, name in enumerate(job.class_names)}
        shards = (old.shards if old else []) + [p.info for p in new]
        mean, std = total.mean_std()
        splits[split] = manifest_lib.ImageSplitInfo(shards=shards, records=sum(s.records for s in shards),
                                                    bytes=sum(s.bytes for s in shards), class_counts=counts,
                                                    pixel_mean=mean, pixel_std=std)
    return splits, sums


def append_images(src: str, out: str, options: ConvertOptions, *, workers: int | None, progress: bool,
                  runner: Callable | None, on_status: Callable[[RunStatus], None] | None,
                  tfds: bool = False) -> manifest_lib.Manifest:
    """Converts the images of ``src`` not yet in the dataset at ``out`` into shards of its next generation.

    Everything runs under ``OUT/.tfshard-lock``; see the module docstring for what is new and how a killed append
    resumes. ``on_status`` gets a ``RunStatus`` whose ``append`` is the ``AppendFound``; ``complete`` when
    nothing is new (nothing is written then).

    Raises:
      InputError: no dataset in ``out``, a stratified one, one made before ``inputs.json`` existed, options,
        labels or held-out splits other than the dataset's.
    """
    on_status = on_status or (lambda status: None)
    workers = default_workers() if workers is None else workers
    base_dataset(out)  # the errors before the lock and the scan
    with output_lock(out):
        unfinished = _settle_state(out)
        base = base_dataset(out)
        options = remembered(out, base, options)  # what the caller left out, the dataset's own
        check_options(out, base, options)
        tfds_files = [n for n in TFDS_FILES if tf.io.gfile.exists(join(out, n))]
        if tfds_files and not tfds:
            raise InputError(f"{out}: --append: holds TFDS metadata ({tfds_files[0]}), which would go on describing "
                             "only the old shards (got no --tfds); pass --tfds to rewrite it with the append, or "
                             "remove the TFDS files")
        inputs = inputs_lib.load_inputs(out, base)
        if inputs is None:
            raise InputError(f"{out}: --append: the dataset has no {INPUTS_NAME} (made before tfshard kept one), so "
                             f"which inputs are new cannot be told; {RECONVERT} once, then append")
        job = ImageJob(src, options, known_classes=base.class_names)
        check_job(out, base, job)
        new, retried, changed, deleted = _diff(src, job, inputs)
        generation = 1 + max([shard_generation(sh.file) for s in base.splits.values() for sh in s.shards]
                             + [a["generation"] for a in base.appends])
        if generation > MAX_GENERATION:
            raise InputError(f"{out}: --append: the dataset already has generation {generation - 1}, the last one "
                             f"shard names allow ({MAX_GENERATION}); {RECONVERT} into one generation")
        new_classes = job.class_names[len(base.class_names):]
        unlabelled = [path for path in changed if path in job.unlabelled]
        found = AppendFound(generation, sum(map(len, new.values())), new_classes, changed, deleted, unlabelled)
        if unlabelled:  # --overwrite with this labels file would leave them out: the fix is the whole file
            log.warning("%s: %d input(s) in the dataset have no row in %s, e.g. %s; their records stay as converted; "
                        "pass the whole labels file (old rows and new) to append", out, len(unlabelled),
                        options.image.labels_file, unlabelled[0])
        changed_files = [path for path in changed if path not in job.unlabelled]
        for what, paths in (("changed since they were converted", changed_files), ("deleted from SRC", deleted)):
            if paths:
                log.warning("%s: %d input(s) in the dataset %s, e.g. %s; their records stay as converted (shards "
                            "are never rewritten); %s to take SRC as it is now", out, len(paths), what, paths[0],
                            RECONVERT)
        job.items = new  # only the new inputs are converted; the scan saw them all
        plan = plan_job(job, options, generation, base=base.fingerprint)
        target, specs, planned = plan.fingerprint, plan.specs, plan.planned
        # Everything that could refuse the append, before it changes anything: a file at a new shard's name that no
        # record of an unfinished append proves, and TFDS metadata TFDS could not open.
        refuse_unrecorded(out, [n for n in planned if n != INPUTS_NAME], by_state(out) if unfinished else {})
        if tfds and new:
            check_tfds_up_front(out, dataclasses.replace(base, fingerprint=target, class_names=job.class_names),
                                specs)
        if unfinished is not None and unfinished["target"] != target:
            _discard(out, base)
        if not new:
            shards = sum(len(s.shards) for s in base.splits.values())
            on_status(RunStatus(True, shards, shards, base.total_records, base.total_bytes, append=found))
            if tfds:
                write_tfds_after_conversion(out)
            return base
        manifest, text = _append_locked(out, base, inputs, job, options, plan, found, retried, workers=workers,
                                        progress=progress, runner=runner, on_status=on_status)
        stops.check()  # nothing more is written after a stop, even one swallowed on its way
        write_text_atomic(state_file(out, INPUTS_NAME), text)  # staged: a kill after the manifest finds it here
        if tfds:  # the old metadata describes the old shards only: it goes before dataset.json lists the new ones
            for name in written_for(out, base):
                tf.io.gfile.remove(join(out, name))
        write_text_atomic(join(out, manifest_lib.MANIFEST_NAME), manifest_lib.to_json(manifest))
        write_text_atomic(join(out, INPUTS_NAME), text)
        remove_state_folder(out)
        if tfds:  # after dataset.json, under the same lock, as a conversion's --tfds
            write_tfds_after_conversion(out, "the append is complete", "the TFDS metadata of the dataset before it, "
                                        "which TFDS would read as the whole dataset, was removed")
        return manifest


def _append_locked(out, base, inputs, job, options, plan: JobPlan, found, retried, *, workers, progress, runner,
                   on_status) -> tuple[manifest_lib.Manifest, str]:
    """Commits the new shards in the state folder; returns the merged manifest and the new inputs file's text."""
    target = plan.fingerprint
    tf.io.gfile.makedirs(join(out, STATE_DIR))
    write_text_atomic(state_file(out, APPEND), json.dumps({"base": base.fingerprint, "target": target}))
    read = [r for r in inputs.inputs if r.state != "rejected"]
    existing = {r.sha256: (r.path, r.split) for r in read if r.state == "written"}
    earlier: dict[str, list] = {}
    for r in read:
        earlier.setdefault(r.split, []).append((r.path, r.sha256))
    done = commit_shards(job, out, options, plan, workers=workers, progress=progress,
                         runner=runner, on_status=lambda s: on_status(dataclasses.replace(s, append=found)),
                         existing=existing, earlier=earlier, earlier_dropped=sum(r.state == "dropped" for r in read),
                         appending=True)
    splits, sums = _merged_splits(base, inputs, job, done)
    converted = {r.path for r in done.read}
    # Kept: inputs a worker refused or --dedupe dropped (inputs.json lists them). The scan's rejects and the labels
    # file's bad rows the job finds again, from the labels file of this append: no stale rows pile up.
    read_before = {r.path for r in inputs.inputs}
    rejected = {r["path"]: r for r in base.rejected if r["path"] in read_before - converted - retried}
    rejected.update({r.relpath: {"path": r.relpath, "reason": r.reason} for r in job.rejected})
    rejected.update({r["path"]: r for r in done.rejected})
    record = appends_lib.append_record(found.generation, sum(s.info.records for s in done.results.values()),
                                       found.new_classes, found.changed, found.deleted)
    converted_images = base.options.get("converted_images", 0) + sum(r.stats.converted for r in done.results.values())
    manifest = dataclasses.replace(
        base, fingerprint=target, class_names=job.class_names, splits=splits,
        options={**options.identity("images"), **job.summary([]), **_label_rule(base),
                 "converted_images": converted_images},
        rejected=sorted(rejected.values(), key=lambda r: r["path"]), rejected_unlisted=job.rejected_unlisted,
        ignored=job.ignored,
        ignored_files=job.ignored_files, duplicates=done.duplicates, appends=[*base.appends, record])
    records = {r.path: r for r in inputs.inputs}
    records.update({r.path: r for r in done.read})
    text = inputs_lib.to_json(inputs_lib.Inputs(target, sums, list(records.values())))
    return dataclasses.replace(manifest, inputs_sha256=inputs_lib.text_sha256(text)), text


def _label_rule(base: manifest_lib.Manifest) -> dict:
    """How the dataset's labels' kind was decided, kept: an append takes that kind (``--label-kind``) as it was."""
    return {"label_rule": base.options["label_rule"]} if "label_rule" in base.options else {}
