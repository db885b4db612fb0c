"""Image class folders → sharded TFRecords + ``dataset.json``: plan, prepare in parallel, write, commit.

Resumable: every committed shard leaves a small record in ``OUT/.tfshard-state/``.
A rerun of the same command (same inputs, same output-affecting options) keeps
each committed shard whose bytes still hash to that record, rewrites the rest,
and ends with files byte-identical to an uninterrupted run. The manifest is
written last; the state folder is removed after it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import time
from typing import Iterator

import tqdm

from ingest import manifest as manifest_lib
from ingest.errors import InputError, OutputExistsError
from ingest.images import ImageOptions, PixelSums, prepare_image
from ingest.parallel import default_workers, ordered_map
from ingest.plan import DEFAULT_SHARD_BYTES, ShardSpec, index_file_name, plan_split, shuffled_order
from ingest.scan import IMAGE_EXTENSIONS, Rejection, SourceFile, SourceTree, scan_image_folders

log = logging.getLogger(__name__)

STATE_DIR = ".tfshard-state"
ON_ERROR = ("skip", "fail")
COMPRESSIONS = (None, "gzip")


@dataclasses.dataclass(frozen=True)
class ConvertOptions:
    """Everything that decides what a conversion writes.

    Attributes:
      shard_bytes: target shard size in bytes (planned from input file sizes).
      num_shards: exact shards per split; wins over ``shard_bytes``.
      min_shards: at least this many shards per split (one per reader worker).
      compression: None or ``"gzip"``.
      seed: seed of the write-time shuffle of record order; None keeps sorted order.
      on_error: ``"skip"`` records a bad file in the manifest and goes on;
        ``"fail"`` stops at the first. Not part of the output's identity.
      index: also write DALI ``tfrecord2idx`` index files.
      image: how images are validated and converted.
    """

    shard_bytes: int = DEFAULT_SHARD_BYTES
    num_shards: int | None = None
    min_shards: int = 1
    compression: str | None = None
    seed: int | None = 0
    on_error: str = "skip"
    index: bool = False
    image: ImageOptions = ImageOptions()

    def __post_init__(self):
        if self.shard_bytes <= 0:
            raise ValueError(f"shard_bytes: must be positive (got {self.shard_bytes!r}); e.g. 128MiB")
        if self.num_shards is not None and self.num_shards < 1:
            raise ValueError(f"num_shards: must be at least 1 (got {self.num_shards!r}); or leave it unset")
        if self.min_shards < 1:
            raise ValueError(f"min_shards: must be at least 1 (got {self.min_shards!r})")
        if self.compression not in COMPRESSIONS:
            raise ValueError(f"compression: must be one of {COMPRESSIONS} (got {self.compression!r})")
        if self.on_error not in ON_ERROR:
            raise ValueError(f"on_error: must be one of {ON_ERROR} (got {self.on_error!r})")
        if self.index and self.compression is not None:
            raise ValueError(
                f"index: DALI index files need uncompressed shards (got compression={self.compression!r}); "
                "drop --index or --compression"
            )

    def identity(self) -> dict:
        """The options that change the written bytes (``on_error`` does not)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "on_error"}


@dataclasses.dataclass
class _ShardResult:
    """What one committed shard contributed; stored in the state folder for resume."""

    info: manifest_lib.ShardInfo
    class_counts: list[int]
    pixels: PixelSums
    rejected: list[dict[str, str]]
    converted: int

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "_ShardResult":
        raw = json.loads(text)
        pixels = raw["pixels"]
        return cls(
            info=manifest_lib.ShardInfo(**raw["info"]),
            class_counts=raw["class_counts"],
            pixels=PixelSums(pixels["count"], tuple(pixels["sums"]), tuple(pixels["squares"])),
            rejected=raw["rejected"],
            converted=raw["converted"],
        )


def _plan(tree: SourceTree, options: ConvertOptions) -> tuple[dict[str, list[SourceFile]], list[ShardSpec]]:
    ordered, specs = {}, []
    for split, files in tree.files.items():
        if not files:
            log.warning("%s: split %r has class folders but no images; it is left out", tree.root, split)
            continue
        ordered[split] = [files[i] for i in shuffled_order(len(files), options.seed)]
        try:
            specs += plan_split(
                split,
                [f.size for f in ordered[split]],
                target_bytes=options.shard_bytes,
                num_shards=options.num_shards,
                min_shards=options.min_shards,
                compression=options.compression,
            )
        except ValueError as e:
            raise InputError(f"{tree.root}: split {split!r}: {e}") from e
    if not specs:
        raise InputError(f"{tree.root}: no images found (extensions {', '.join(IMAGE_EXTENSIONS)}); check SRC")
    return ordered, specs


def _fingerprint(tree: SourceTree, ordered: dict[str, list[SourceFile]], options: ConvertOptions) -> str:
    return manifest_lib.fingerprint(
        {
            "kind": "images",
            "options": options.identity(),
            "class_names": tree.class_names,
            "sources": {s: [(f.relpath, f.size, f.mtime_ns) for f in files] for s, files in ordered.items()},
        }
    )


def _prepare_output(out: str, fingerprint: str, overwrite: bool) -> manifest_lib.Manifest | None:
    """Checks OUT against this run; returns the existing manifest when the work is already done."""
    import tensorflow as tf

    from ingest.write import TEMP_PREFIX, join, remove_if_exists

    manifest_path = join(out, manifest_lib.MANIFEST_NAME)
    state_path = join(out, STATE_DIR)
    plan_path = join(state_path, "plan.json")
    if not tf.io.gfile.exists(out):
        tf.io.gfile.makedirs(state_path)
        return None
    old_files: list[str] = []
    if tf.io.gfile.exists(manifest_path):
        try:
            old = manifest_lib.from_json(tf.io.gfile.GFile(manifest_path).read(), manifest_path)
        except ValueError as e:
            raise OutputExistsError(
                f"{out}: output folder holds a {manifest_lib.MANIFEST_NAME} tfshard cannot read ({e}); "
                "remove it or choose another folder"
            ) from e
        if old.fingerprint == fingerprint and not overwrite:
            if tf.io.gfile.exists(state_path):
                tf.io.gfile.rmtree(state_path)
            return old
        what = "a dataset made from other inputs or options"
        old_files = [manifest_lib.MANIFEST_NAME] + [
            name
            for split in old.splits.values()
            for shard in split.shards
            for name in (shard.file, shard.index_file)
            if name is not None
        ]
    elif tf.io.gfile.exists(plan_path):
        old_plan = json.loads(tf.io.gfile.GFile(plan_path).read())
        if old_plan["fingerprint"] == fingerprint:
            return None
        what = "an unfinished conversion of other inputs or options"
        old_files = old_plan["files"]
    else:
        leftovers = [n for n in tf.io.gfile.listdir(out) if n.rstrip("/") != STATE_DIR]
        if not leftovers:
            tf.io.gfile.makedirs(state_path)
            return None
        what = f"{len(leftovers)} files that tfshard did not write (e.g. {sorted(leftovers)[0]!r})"
    if not overwrite:
        raise OutputExistsError(
            f"{out}: output folder holds {what}; pass --overwrite to replace it, or choose another folder"
        )
    log.info("%s: --overwrite: removing %d files of the previous dataset", out, len(old_files))
    for name in old_files:
        remove_if_exists(join(out, name))
        remove_if_exists(join(out, TEMP_PREFIX + name))
    if tf.io.gfile.exists(state_path):
        tf.io.gfile.rmtree(state_path)
    tf.io.gfile.makedirs(state_path)
    return None


def _committed_results(out: str, specs: list[ShardSpec], index: bool) -> dict[str, _ShardResult]:
    """The state records of shards that are committed and still hash to what was recorded."""
    import tensorflow as tf

    from ingest.write import file_sha256, join

    kept = {}
    for spec in specs:
        record = join(join(out, STATE_DIR), spec.file_name + ".json")
        path = join(out, spec.file_name)
        if not (tf.io.gfile.exists(record) and tf.io.gfile.exists(path)):
            continue
        result = _ShardResult.from_json(tf.io.gfile.GFile(record).read())
        if index and not (result.info.index_file and tf.io.gfile.exists(join(out, result.info.index_file))):
            continue
        index_ok = not index or file_sha256(join(out, result.info.index_file))[0] == result.info.index_sha256
        if index_ok and file_sha256(path) == (result.info.sha256, result.info.bytes):
            kept[spec.file_name] = result
        else:
            log.warning("%s: does not match its commit record; rewriting it", path)
    return kept




def _write_shards(
    src: str,
    out: str,
    todo: list[ShardSpec],
    ordered: dict[str, list[SourceFile]],
    class_names: list[str],
    options: ConvertOptions,
    workers: int,
    progress: bool,
) -> Iterator[tuple[ShardSpec, _ShardResult]]:
    from ingest.examples import image_example
    from ingest.write import ShardWriter

    tasks = (ordered[s.split][i] for s in todo for i in range(s.start, s.stop))
    results = ordered_map(
        functools.partial(prepare_image, options=options.image),
        tasks,
        workers=workers,
        size_of=lambda source: source.size,
        max_pending_bytes=max(workers, 1) * options.shard_bytes,
    )
    total_files = sum(s.num_records for s in todo)
    started = time.monotonic()
    done_bytes = 0
    with tqdm.tqdm(total=total_files, unit="img", disable=not progress, dynamic_ncols=True, desc="images") as bar:
        try:
            for spec in todo:
                counts = [0] * len(class_names)
                pixels = PixelSums()
                rejected = []
                converted = 0
                with ShardWriter(out, spec.file_name, options.compression, options.index) as writer:
                    for _ in range(spec.num_records):
                        result = next(results)
                        if isinstance(result, Rejection):
                            if options.on_error == "fail":
                                raise InputError(
                                    f"{os.path.join(src, result.relpath)}: {result.reason}; "
                                    "or pass --on-error skip to leave bad files out"
                                )
                            rejected.append({"path": result.relpath, "reason": result.reason})
                        else:
                            label = result.source.label
                            writer.write(image_example(result, class_names[label]))
                            counts[label] += 1
                            pixels += result.pixels
                            converted += result.converted is not None
                            done_bytes += result.source.size
                        bar.update(1)
                        elapsed = time.monotonic() - started
                        if elapsed > 0:
                            bar.set_postfix_str(f"{done_bytes / elapsed / 1e6:.1f} MB/s", refresh=False)
                yield spec, _ShardResult(writer.info, counts, pixels, rejected, converted)
        finally:
            results.close()


def _assemble(
    tree: SourceTree, specs: list[ShardSpec], results: dict[str, _ShardResult], options: ConvertOptions, fingerprint: str
) -> manifest_lib.Manifest:
    splits = {}
    rejected = [{"path": r.relpath, "reason": r.reason} for r in tree.rejected]
    for split in dict.fromkeys(s.split for s in specs):
        parts = [results[s.file_name] for s in specs if s.split == split]
        counts = [sum(p.class_counts[i] for p in parts) for i in range(len(tree.class_names))]
        pixels = sum((p.pixels for p in parts), PixelSums())
        mean, std = pixels.mean_std()
        splits[split] = manifest_lib.SplitInfo(
            shards=[p.info for p in parts],
            records=sum(p.info.records for p in parts),
            bytes=sum(p.info.bytes for p in parts),
            class_counts={name: n for name, n in zip(tree.class_names, counts)},
            pixel_mean=mean,
            pixel_std=std,
        )
        rejected += [r for p in parts for r in p.rejected]
    converted = sum(r.converted for r in results.values())
    opts = options.identity()
    opts["converted_images"] = converted
    return manifest_lib.Manifest(
        kind="images",
        fingerprint=fingerprint,
        compression=options.compression,
        features=manifest_lib.IMAGE_FEATURES,
        class_names=tree.class_names,
        splits=splits,
        options=opts,
        rejected=sorted(rejected, key=lambda r: r["path"]),
        ignored={"hidden": tree.ignored_hidden, "other": tree.ignored_other},
    )


def convert_images(
    src: str,
    out: str,
    options: ConvertOptions = ConvertOptions(),
    *,
    workers: int | None = None,
    overwrite: bool = False,
    progress: bool = True,
) -> manifest_lib.Manifest:
    """Converts ``src/<class>/<image>`` (or ``src/<split>/<class>/<image>``) into sharded TFRecords in ``out``.

    Args:
      src: source folder.
      out: output folder (local or any ``tf.io.gfile`` URL); created if missing.
      options: what to write; see ``ConvertOptions``.
      workers: worker processes for decoding (default: all usable CPUs; 0 runs in-process).
      overwrite: replace a dataset in ``out`` that was made from other inputs or options.
      progress: show a tqdm progress bar.

    Returns:
      The manifest, also written to ``out/dataset.json``.

    Raises:
      FileNotFoundError: ``src`` does not exist.
      InputError: bad layout, a bad file with ``on_error="fail"``, or too few images for the shards asked.
      OutputExistsError: ``out`` holds something else and ``overwrite`` is False.

    Example:
      m = convert_images("flowers/", "flowers-tfr/")
      m.splits["train"].records, [s.file for s in m.splits["train"].shards]  # 3670, ['train-00000-of-00002...
    """
    import tensorflow as tf

    from ingest.write import TEMP_PREFIX, join, remove_if_exists, write_text_atomic

    workers = default_workers() if workers is None else workers
    if "://" not in out and "://" not in src:
        src_real, out_real = os.path.realpath(src), os.path.realpath(out)
        if out_real == src_real or out_real.startswith(src_real + os.sep):
            raise InputError(f"{out}: output folder is inside the source folder {src}; choose a folder outside it")
    tree = scan_image_folders(src)
    if tree.rejected and options.on_error == "fail":
        first = tree.rejected[0]
        raise InputError(f"{os.path.join(src, first.relpath)}: {first.reason}; or pass --on-error skip")
    ordered, specs = _plan(tree, options)
    fingerprint = _fingerprint(tree, ordered, options)
    planned = [s.file_name for s in specs]
    if options.index:
        planned += [index_file_name(n) for n in planned]
    existing = _prepare_output(out, fingerprint, overwrite)
    if existing is not None:
        log.info("%s: already complete for these inputs and options; nothing to do", out)
        return existing
    state = join(out, STATE_DIR)
    write_text_atomic(join(state, "plan.json"), json.dumps({"fingerprint": fingerprint, "files": planned}))
    for name in planned + [manifest_lib.MANIFEST_NAME]:  # temporaries of a run that died mid-write
        remove_if_exists(join(out, TEMP_PREFIX + name))
    results = _committed_results(out, specs, options.index)
    if results:
        log.info("%s: resuming; %d of %d shards already committed", out, len(results), len(specs))
    todo = [s for s in specs if s.file_name not in results]
    for spec, result in _write_shards(src, out, todo, ordered, tree.class_names, options, workers, progress):
        write_text_atomic(join(state, spec.file_name + ".json"), result.to_json())
        results[spec.file_name] = result
    manifest = _assemble(tree, specs, results, options, fingerprint)
    write_text_atomic(join(out, manifest_lib.MANIFEST_NAME), manifest_lib.to_json(manifest))
    tf.io.gfile.rmtree(state)
    return manifest
