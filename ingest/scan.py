"""Finding the inputs: splits, classes and image files under a source folder.

Plain ``os`` only. Listings are sorted, so the same tree always gives the same
order, labels and plan. Symlinked folders are followed once each (a loop is
cut and recorded); a file that cannot be stat'ed is recorded as rejected with
its reason, never silently dropped.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import stat

from .errors import InputError
from .localfs import file_kind

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp")
SPLIT_NAMES = ("train", "val", "validation", "test")


@dataclasses.dataclass(frozen=True)
class SourceFile:
    """One input file. ``relpath`` is relative to the source root, with ``/`` separators."""

    path: str
    relpath: str
    split: str
    label: int
    size: int
    mtime_ns: int
    ctime_ns: int = 0  # changes with every write to the file, and cannot be set back: part of the inputs' identity

    @classmethod
    def of(cls, path: str, relpath: str, split: str, label: int, st: os.stat_result) -> "SourceFile":
        return cls(path, relpath, split, label, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@dataclasses.dataclass(frozen=True)
class Rejection:
    """An input left out of the dataset, and why."""

    relpath: str
    reason: str
    chosen: bool = False  # left out by a policy the user chose (--on-nan skip, empty episodes), never an error


@dataclasses.dataclass
class SourceTree:
    """What a scan found: per-split files in sorted order, class names, and what was left out."""

    root: str
    class_names: list[str]
    files: dict[str, list[SourceFile]]
    rejected: list[Rejection]
    ignored_hidden: int = 0
    ignored_other: int = 0


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


def _walk_class(root: str, class_dir: str, split: str, label: int, tree: SourceTree, seen_dirs: set) -> list[SourceFile]:
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
                    tree.ignored_other += 1
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
                tree.ignored_other += 1
        stack.extend(reversed(subdirs))
    return sorted(found, key=lambda f: f.relpath)


def scan_image_folders(root: str) -> SourceTree:
    """Scans ``root/<class>/<files>`` or ``root/<split>/<class>/<files>``.

    Splits are detected when every top-level folder is named one of
    ``train``, ``val``, ``validation``, ``test``; otherwise the whole tree is the
    ``train`` split. Labels are the sorted class names across all splits, 0-based.
    Files in a class folder's subfolders belong to that class.

    Raises:
      FileNotFoundError: ``root`` does not exist.
      InputError: the tree mixes split and class folders, or holds no class folder.
    """
    if not os.path.isdir(root):
        raise FileNotFoundError(f"{root}: source folder not found; pass a folder of class folders (SRC/<class>/<image>)")
    tree = SourceTree(root=root, class_names=[], files={}, rejected=[])
    top = [e for e in _list_dir(root) if not e.name.startswith(".")]
    top_dirs = [e for e in top if e.is_dir()]
    tree.ignored_hidden = len(_list_dir(root)) - len(top)
    tree.ignored_other = len(top) - len(top_dirs)
    split_dirs = [e for e in top_dirs if e.name in SPLIT_NAMES]
    if split_dirs and len(split_dirs) != len(top_dirs):
        others = sorted(e.name for e in top_dirs if e.name not in SPLIT_NAMES)
        raise InputError(
            f"{root}: mixes split folders ({', '.join(e.name for e in split_dirs)}) with class folders "
            f"(got {others!r}); put every class folder under a split folder, or use no split folders"
        )
    if split_dirs:
        splits = {e.name: e.path for e in split_dirs}
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
                tree.ignored_other += 1
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
    return tree
