"""The Python API does what the CLI does: the flags as keyword arguments of the same names, a result whose summary
is what the CLI prints, errors naming the argument from Python and the flag from the CLI; and every snippet of
docs/guide/from-python.md, run as written."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import io
import os
import pathlib
import re
import shutil

import pytest
from helpers import flat_jpegs, make_tree, write_jpeg, write_text
from tfshard import cli as cli_module
from tfshard.ingest import (
    ConversionResult,
    ConvertOptions,
    ImageOptions,
    OptionError,
    convert_episodes,
    convert_images,
    load_manifest,
)
from tfshard.ingest.holdout import Holdout

PAGE = pathlib.Path(__file__).resolve().parent.parent / "docs" / "guide" / "from-python.md"
RATE = re.compile(r" in [\d.]+ s \([^)]*\)")  # how long a run took: the one part of a summary that varies


def _params(command: str) -> set[str]:
    found = next(c for c in cli_module.app.registered_commands if (c.name or c.callback.__name__) == command)
    return set(inspect.signature(found.callback).parameters)


@pytest.mark.parametrize("command, convert", [("images", convert_images), ("episodes", convert_episodes)])
def test_every_flag_of_a_conversion_command_is_a_keyword_of_its_function(command, convert):
    """Besides SRC and OUT, what only a terminal needs (--quiet: progress=False) and the runner's flags (a Python
    caller passes a BeamRunner), each flag is a keyword argument of the same name, and an option's field."""
    cli_only = {"src", "out", "quiet", "runner", "beam_options", "storage_option"}
    keywords = set(inspect.signature(convert).parameters)
    assert _params(command) - cli_only <= keywords
    fields = {field.name for field in dataclasses.fields(ConvertOptions)}
    not_options = {"workers", "overwrite", "tfds", "append"}
    assert _params(command) - cli_only - not_options <= fields


def test_old_option_names_still_build_the_same_options():
    old = ConvertOptions(shard_bytes="1KiB", seed=None, holdout=Holdout(0.2, 0.1, seed=3, stratify=True),
                         image=ImageOptions(quality=80, rgb=True, labels_file="l.csv", label_kind="class"))
    new = ConvertOptions(shard_size=1024, shuffle=False, val_fraction=0.2, test_fraction=0.1, split_seed=3,
                         stratify=True, quality=80, rgb=True, labels="l.csv", label_kind="class")
    assert old == new and old.identity("images") == new.identity("images")
    assert (new.shard_bytes, new.holdout, new.image.labels_file) == (1024, Holdout(0.2, 0.1, 3, True), "l.csv")
    assert new.identity("images") == {  # the manifest's shape, so datasets converted before keep their fingerprint
        "shard_bytes": 1024, "num_shards": None, "min_shards": 1, "compression": None, "seed": None, "index": False,
        "image": {"quality": 80, "rgb": True, "max_side": None, "max_pixels": 89_478_485, "validate": True}}
    with pytest.raises(OptionError, match=r"^quality: given twice, as 90 and in an older argument as 80; give it"):
        ConvertOptions(quality=90, image=ImageOptions(quality=80))


def test_keywords_win_over_the_options_given(tmp_path):
    make_tree(tmp_path / "src", per_class=5)
    result = convert_images(str(tmp_path / "src"), str(tmp_path / "out"), ConvertOptions(num_shards=2, quality=80),
                            val_fraction=0.2, num_shards=1, workers=0, progress=False)
    assert isinstance(result, ConversionResult) and result.manifest == load_manifest(str(tmp_path / "out"))
    assert result.manifest.options["num_shards"] == 1 and result.manifest.options["image"]["quality"] == 80
    assert result.manifest.split_rule["fractions"] == {"val": 0.2}
    # Code written when the conversions returned the manifest still reads it
    assert result.splits == result.manifest.splits and result == result.manifest


@pytest.mark.parametrize("arguments, flags, argument, flag", [
    (dict(val_fraction=1.5), ["--val-fraction", "1.5"], "val_fraction: must be a fraction in [0, 1) (got 1.5)",
     "--val-fraction: must be a fraction in [0, 1) (got 1.5)"),
    (dict(shard_size="64 parsecs"), ["--shard-size", "64 parsecs"], "shard_size: not a size (got '64 parsecs')",
     "--shard-size: not a size (got '64 parsecs')"),
    (dict(label_kind="value"), ["--label-kind", "value"],
     "label_kind: only with a labels file (got 'value' and no labels); pass labels FILE, or drop label_kind",
     "--label-kind: only with a labels file (got 'value' and no --labels); pass --labels FILE, or drop --label-kind"),
    (dict(index=True, compression="gzip"), ["--index", "--compression", "gzip"],
     "index: DALI index files need uncompressed shards (got compression='gzip'); drop index or compression",
     "--index: DALI index files need uncompressed shards (got --compression='gzip'); drop --index or --compression"),
    (dict(num_shards=30), ["--num-shards", "30"], "(got num_shards=30, min_shards=1) but only 4 img inputs",
     "(got --num-shards=30, --min-shards=1) but only 4 img inputs"),
], ids=["val-fraction", "shard-size", "label-kind", "index", "num-shards"])
def test_an_error_names_the_argument_from_python_and_the_flag_from_the_cli(tmp_path, cli, arguments, flags,
                                                                          argument, flag):
    make_tree(tmp_path / "src", per_class=2)
    src, out = str(tmp_path / "src"), str(tmp_path / "out")
    with pytest.raises(OptionError) as raised:
        convert_images(src, out, workers=0, progress=False, **arguments)
    assert argument in str(raised.value)
    result = cli("images", src, out, "--workers", "0", *flags)
    assert result.exit_code == 1 and flag in result.stderr, result.stderr


def test_an_episode_option_is_named_both_ways_too(tmp_path, cli):
    with pytest.raises(OptionError, match=r"^label_kind: must be 'class', 'value' or None for episodes"):
        convert_episodes(str(tmp_path), str(tmp_path / "out"), labels="l.csv", label_kind="multi")
    result = cli("episodes", tmp_path, tmp_path / "out", "--on-nan", "drop")
    assert result.exit_code == 2  # a choice typer checks itself
    with pytest.raises(OptionError, match=r"^max_record_bytes: not a size \(got '2 parsecs'\)"):
        convert_episodes(str(tmp_path), str(tmp_path / "out"), max_record_bytes="2 parsecs")
    result = cli("episodes", tmp_path, tmp_path / "out", "--max-record-bytes", "2 parsecs")
    assert result.exit_code == 1 and "error: --max-record-bytes: not a size (got '2 parsecs')" in result.stderr


def test_the_summary_is_what_the_cli_prints(tmp_path, cli):
    """Rejects with their reasons, unlabelled and ignored files, duplicates, held-out splits: the same lines."""
    src = tmp_path / "shop"
    flat_jpegs(src, ["a1", "a2", "b1", "b2", "c1", "c2"])
    shutil.copy(src / "a1.jpg", src / "c3.jpg")  # a duplicate
    (src / "b3.jpg").write_bytes(b"not a jpeg")
    (src / "notes.txt").write_text("hello")
    write_jpeg(src / "stray.jpg", 9)  # no row: unlabelled
    write_text(src / "train.csv", "id,label\na1,ant\na2,ant\nb1,bee\nb2,bee\nb3,bee\nc1,cat\nc2,cat\nc3,cat\n")
    keywords = dict(labels=str(src / "train.csv"), val_fraction=0.25)
    result = convert_images(str(src), str(tmp_path / "py"), workers=0, progress=False, **keywords)
    printed = cli("images", src, tmp_path / "cli", "--workers", "0", "--labels", src / "train.csv",
                  "--val-fraction", "0.25")
    assert printed.exit_code == 0, printed.output
    text = RATE.sub("", result.summary())
    assert RATE.sub("", printed.stdout).replace(str(tmp_path / "cli"), str(tmp_path / "py")) == text + "\n"
    assert str(result) == result.summary()
    for expected in ("b3.jpg: ", "1 unlabelled", "duplicates: 1 images found more than once", "held out: val 0.25"):
        assert expected in text, expected



def test_the_summary_shows_each_file_name_on_its_own_line_escaped(tmp_path):
    """A rejected or ignored file's name with a newline, a terminal escape, a right-to-left override or a byte that is
    no UTF-8: one summary line each, escaped (no forged line, nothing a terminal runs), and the text is UTF-8."""
    src = tmp_path / "src"
    make_tree(src, per_class=1)
    names = {b"cat/evil\n  train  999 records.jpg": "cat/evil\\n  train  999 records.jpg",
             b"cat/red\x1b[31m.jpg": "cat/red\\x1b[31m.jpg", b"dog/\xe2\x80\xaeevil.jpg": "dog/\\u202eevil.jpg",
             b"dog/caf\xe9.jpg": "dog/caf\\xe9.jpg", "dog/é中文.jpg".encode(): "dog/é中文.jpg"}
    for name in names:
        with open(os.path.join(os.fsencode(src), name), "wb") as f:
            f.write(b"not an image")
    with open(os.path.join(os.fsencode(src), b"dog/notes\r.txt"), "wb") as f:
        f.write(b"hello")
    result = convert_images(str(src), str(tmp_path / "out"), workers=0, progress=False)
    lines = result.lines()
    assert all("\n" not in line and "\r" not in line and "\x1b" not in line for line in lines)
    assert result.summary().encode("utf-8").decode("utf-8") == result.summary()  # strict: no lone surrogate
    for shown in names.values():
        assert sum(line.startswith(f"    {shown}: ") for line in lines) == 1, (shown, lines)
    assert "    dog/notes\\r.txt" in lines

# --- docs/guide/from-python.md, run as written ------------------------------------------------------------------------


def sections() -> dict[str, list[tuple[str, str | None]]]:
    """``{section title: [(python code, the text block printed after it or None)]}``, in page order."""
    found: dict[str, list] = {}
    title = None
    for part in re.split(r"^(## .*)$", PAGE.read_text(), flags=re.M):
        if part.startswith("## "):
            title = part[3:].strip()
            continue
        for code, printed in re.findall(r"```python\n(.*?)```\n(?:\n```text\n(.*?)```)?", part, flags=re.S):
            found.setdefault(title, []).append((code, printed or None))
    return found


@pytest.fixture(scope="module")
def guide_data(tmp_path_factory):
    """``photos/<class>/`` (cat and dog, one broken file, a stray text file), a Kaggle-style ``shop/`` with
    ``train.csv`` (a row without its image, an image without its row), and in ``arrivals/`` three new items with
    the labels file grown by their rows."""
    root = tmp_path_factory.mktemp("guide")
    make_tree(root / "photos", per_class=6)
    (root / "photos" / "dog" / "broken.jpg").write_bytes(b"\xff\xd8 not really a JPEG")
    (root / "photos" / "README.txt").write_text("photos from the garden")
    flat_jpegs(root / "shop", [f"item{i:02d}" for i in range(30)])
    rows = [f"item{i:02d},{['mug', 'pen', 'cap'][i % 3]}" for i in range(29)] + ["item99,pen"]
    write_text(root / "shop" / "train.csv", "id,label\n" + "\n".join(rows) + "\n")
    for i in range(30, 33):
        write_jpeg(root / "arrivals" / f"item{i:02d}.jpg", 100 + i)
    rows += [f"item{i:02d},{['mug', 'pen', 'cap'][i % 3]}" for i in range(30, 33)]
    write_text(root / "arrivals" / "train.csv", "id,label\n" + "\n".join(rows) + "\n")
    return root


EXPECTED = {  # what each section's names hold afterwards
    "Image folders": lambda ns: ns["result"].manifest.splits["train"].records == 12
    and len(ns["result"].manifest.rejected) == 1,
    "A labels file and held-out splits": lambda ns: ns["result"].manifest.labels == "class"
    and set(ns["result"].manifest.splits) == {"train", "val", "test"},
    "Adding new images": lambda ns: ns["more"].status.append.new_inputs == 3
    and ns["more"].manifest.total_records == ns["result"].manifest.total_records + 3,
    "Errors name the argument": lambda ns: isinstance(ns["error"], OptionError),
}


def test_every_section_with_code_is_checked():
    assert list(sections()) == list(EXPECTED)


def test_the_guide_runs_as_written(guide_data, monkeypatch):
    monkeypatch.chdir(guide_data)
    namespace: dict = {}
    for title, blocks in sections().items():
        for code, printed in blocks:
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                exec(compile(code, f"{PAGE.name}: {title}", "exec"), namespace)  # noqa: S102 (our own docs page)
            if printed is not None:
                assert RATE.sub("", out.getvalue()) == RATE.sub("", printed), title
        assert EXPECTED[title](namespace), title
    assert os.getcwd() == str(guide_data)
