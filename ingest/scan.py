"""Finding the inputs: splits, classes and image files under a source folder.

Plain ``os`` only. Listings are sorted, so the same tree always gives the same
order, labels and plan. Symlinked folders are followed once each (a loop is
cut and recorded); a file that cannot be stat'ed is recorded as rejected with
its reason, never silently dropped. Files left out for their extension are
counted and the first ``MAX_LISTED_IGNORED`` of them (sorted) named.

Both kinds of input split the same way (``split_folders``): ``SRC/<split>/...``
when every top-level folder is a split name, no splits when none is, and an
error naming the folders when some are.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import stat
from collections.abc import Sequence

from ..format.errors import InputError
from ..format.storage import file_kind

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff")
SPLIT_NAMES = ("train", "val", "valid", "validation", "test")
MAX_LISTED_IGNORED = 100  # ignored files named in the manifest; the counts cover every one


@dataclasses.dataclass(frozen=True)
class SourceFile:
    """One input file. ``relpath`` is relative to the source root, with ``/`` separators."""

    path: str
    relpath: str
    split: str
    label: int | tuple  # a class index; a labels file's multi-label (indices) or value (floats) is a tuple
    size: int
    mtime_ns: int
    ctime_ns: int = 0  # changes with every write to the file, and cannot be set back: part of the inputs' identity

    @classmethod
    def of(cls, path: str, relpath: str, split: str, label: int | tuple, st: os.stat_result) -> SourceFile:
        return cls(path, relpath, split, label, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@dataclasses.dataclass(frozen=True)
class Rejection:
    """An input left out of the dataset, and why."""

    relpath: str
    reason: str
    chosen: bool = False  # left out by a policy the user chose (--on-nan skip, empty episodes), never an error


@dataclasses.dataclass
class SourceTree:
    """What a scan found: per-split files in sorted order, class names (none for episodes), and what was left out.

    ``ignored_files`` names the first ``MAX_LISTED_IGNORED`` (in sorted order) of the
    ``ignored_other`` files, those left out for their extension; hidden files are only counted.
    """

    root: str
    class_names: list[str]
    files: dict[str, list[SourceFile]]
    rejected: list[Rejection]
    ignored_hidden: int = 0
    ignored_other: int = 0
    ignored_files: list[str] = dataclasses.field(default_factory=list)
    use_splits: bool = False  # the top-level folders are splits (``split_folders``)

    def ignore(self, relpath: str) -> None:
        """Counts and (within the cap) names a file left out for its extension."""
        self.ignored_other += 1
        self.ignored_files.append(relpath)
        if len(self.ignored_files) > 10 * MAX_LISTED_IGNORED:  # bounded memory on trees of millions of side files
            self.ignored_files = sorted(self.ignored_files)[:MAX_LISTED_IGNORED]

    def finish_ignored(self) -> None:
        self.ignored_files = sorted(self.ignored_files)[:MAX_LISTED_IGNORED]


def stat_problem(error: OSError) -> str:
    if error.errno == errno.ELOOP:
        return "symlink loop (the link resolves to itself); remove or repoint the link"
    if error.errno == errno.ENOENT:
        return "broken symlink (its target does not exist); remove or repoint the link"
    if error.errno == errno.EACCES:
        return "permission denied; make the file readable (chmod a+r)"
    return f"cannot stat: {error.strerror}"


def not_regular_problem(mode: int) -> str | None:
    """Why a file of this mode cannot be an input, or None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    return f"not a regular file ({file_kind(mode)}); only regular files are read: replace it with the real file"


def _list_dir(path: str) -> list[os.DirEntry]:
    with os.scandir(path) as entries:
        return sorted(entries, key=lambda e: e.name)


def _walk_class(root: str, class_dir: str, split: str, label: int, tree: SourceTree,
                seen_dirs: set) -> list[SourceFile]:
    found = []
    stack = [class_dir]
    while stack:
        directory = stack.pop()
        try:
            entries = _list_dir(directory)
        except OSError as e:
            tree.rejected.append(Rejection(os.path.relpath(directory, root), f"cannot list folder: {e.strerror}"))
            continue
        subdirs = []
        for entry in entries:
            relpath = os.path.relpath(entry.path, root).replace(os.sep, "/")
            if entry.name.startswith("."):
                tree.ignored_hidden += 1
                continue
            try:
                is_dir = entry.is_dir(follow_symlinks=True)
                st = None if is_dir else os.stat(entry.path)
            except OSError as e:
                if entry.name.lower().endswith(IMAGE_EXTENSIONS) or entry.is_symlink():
                    tree.rejected.append(Rejection(relpath, stat_problem(e)))
                else:
                    tree.ignore(relpath)
                continue
            if is_dir:
                real = os.path.realpath(entry.path)
                if real in seen_dirs:
                    tree.rejected.append(Rejection(relpath, "symlink loop (folder already visited); remove the link"))
                else:
                    seen_dirs.add(real)
                    subdirs.append(entry.path)
            elif entry.name.lower().endswith(IMAGE_EXTENSIONS):
                problem = not_regular_problem(st.st_mode)
                if problem is not None:
                    tree.rejected.append(Rejection(relpath, problem))
                else:
                    found.append(SourceFile.of(entry.path, relpath, split, label, st))
            else:
                tree.ignore(relpath)
        stack.extend(reversed(subdirs))
    return sorted(found, key=lambda f: f.relpath)


def _names(values: list[str], limit: int = 10) -> list[str]:
    return values if len(values) <= limit else values[:limit] + [f"... {len(values) - limit} more"]


def split_folders(root: str, folders: Sequence[str], inputs_beside: Sequence[str] = ()) -> list[str]:
    """Which of ``root``'s top-level ``folders`` are splits: the one split rule, for images and episodes alike.

    Every folder named one of ``SPLIT_NAMES`` (train, val, valid, validation,
    test) makes them all splits; none named so means no splits (the whole tree is
    ``train``). A mix is refused, never guessed.

    Args:
      root: the source folder, named in errors.
      folders: its top-level folder names, hidden ones left out.
      inputs_beside: top-level input files; beside split folders they would belong to no split.

    Returns:
      The split names, sorted; ``[]`` for no splits.

    Raises:
      InputError: some folders are split names and some are not, or input files sit beside split folders.

    Example:
      split_folders("src", ["train", "valid"]), split_folders("src", ["cat", "dog"])  # (['train', 'valid'], [])
    """
    splits = sorted(name for name in folders if name in SPLIT_NAMES)
    if not splits:
        return []
    others = sorted(name for name in folders if name not in SPLIT_NAMES)
    if others:
        raise InputError(
            f"{root}: mixes split folders ({', '.join(splits)}) with folders that are not split names "
            f"(got {_names(others)!r}); split folders must be named {', '.join(SPLIT_NAMES)}: rename those folders, "
            "move them into a split folder, or use no split folders"
        )
    if inputs_beside:
        raise InputError(
            f"{root}: holds input files beside its split folders ({', '.join(splits)}) "
            f"(got {_names(sorted(inputs_beside))!r}); they would belong to no split: move them into a split folder "
            "(e.g. train/), or use no split folders"
        )
    return splits


def check_source_folder(root: str, layout: str) -> None:
    """SRC must be an existing folder; ``layout`` says what belongs in it, for the fix.

    Raises:
      FileNotFoundError: nothing at ``root`` (or an empty path).
      NotADirectoryError: a file there.
    """
    if not root:
        raise FileNotFoundError(f"source folder: an empty path (got {root!r}); pass a folder of {layout}")
    if os.path.exists(root) and not os.path.isdir(root):
        raise NotADirectoryError(f"{root}: a file, not a folder; pass the folder that holds it ({layout})")
    if not os.path.isdir(root):
        raise FileNotFoundError(f"{root}: source folder not found; pass a folder of {layout}")


def scan_image_folders(root: str) -> SourceTree:
    """Scans ``root/<class>/<files>`` or ``root/<split>/<class>/<files>``.

    Splits follow ``split_folders``: every top-level folder named one of
    ``SPLIT_NAMES``, or none. Labels are the sorted class names across all
    splits, 0-based. Files in a class folder's subfolders belong to that class.

    Raises:
      FileNotFoundError: ``root`` does not exist.
      InputError: the tree mixes split and other folders, or holds no class folder.
    """
    check_source_folder(root, "class folders (SRC/<class>/<image>)")
    tree = SourceTree(root=root, class_names=[], files={}, rejected=[])
    listing = _list_dir(root)
    top = [e for e in listing if not e.name.startswith(".")]
    top_dirs = [e for e in top if e.is_dir()]
    tree.ignored_hidden = len(listing) - len(top)
    for entry in top:
        if not entry.is_dir():
            tree.ignore(entry.name)  # no class folder: no label
    split_names = split_folders(root, [e.name for e in top_dirs])
    if split_names:
        splits = {e.name: e.path for e in top_dirs}
    else:
        splits = {"train": root}

    class_dirs: dict[str, dict[str, str]] = {}
    for split, split_path in splits.items():
        entries = _list_dir(split_path)
        for entry in entries:
            if entry.name.startswith("."):
                tree.ignored_hidden += split_path != root
            elif entry.is_dir():
                class_dirs.setdefault(split, {})[entry.name] = entry.path
            elif split_path != root:
                tree.ignore(f"{split}/{entry.name}")
    tree.class_names = sorted({name for per_split in class_dirs.values() for name in per_split})
    if not tree.class_names:
        raise InputError(
            f"{root}: no class folders found; lay images out as SRC/<class>/<image> or SRC/<split>/<class>/<image>"
        )
    labels = {name: i for i, name in enumerate(tree.class_names)}
    seen_dirs = {os.path.realpath(root)}
    for split, per_split in class_dirs.items():
        files = []
        for name, path in per_split.items():
            seen_dirs.add(os.path.realpath(path))
            files.extend(_walk_class(root, path, split, labels[name], tree, seen_dirs))
        tree.files[split] = sorted(files, key=lambda f: f.relpath)
    tree.finish_ignored()
    return tree


def scan_image_files(root: str) -> SourceTree:
    """Every image under ``root``, at any depth, for a labels file to label (``--labels FILE``): no class folders.

    Splits follow ``split_folders`` (``SRC/<split>/...``, else all ``train``) until a labels file's ``split``
    column says otherwise. ``class_names`` stays empty: the labels file names the classes.

    Raises:
      FileNotFoundError: ``root`` does not exist.
      InputError: the tree mixes split and other folders, or holds images beside split folders.
    """
    check_source_folder(root, "images, at any depth, that the labels file names")
    tree = SourceTree(root=root, class_names=[], files={}, rejected=[])
    top = [e for e in _list_dir(root) if not e.name.startswith(".")]
    beside = [e.name for e in top if not e.is_dir() and e.name.lower().endswith(IMAGE_EXTENSIONS)]
    split_names = split_folders(root, [e.name for e in top if e.is_dir()], beside)
    tree.use_splits = bool(split_names)
    found = _walk_class(root, root, "train", 0, tree, {os.path.realpath(root)})
    for source in found:
        split = source.relpath.split("/", 1)[0] if split_names else "train"
        tree.files.setdefault(split, []).append(dataclasses.replace(source, split=split))
    tree.finish_ignored()
    return tree
