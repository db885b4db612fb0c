"""Conversion on Apache Beam's DirectRunner: the same records, shard files and manifest as the local converter."""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf
from helpers import make_tree, random_episodes, save_episodes, write_jpeg
from tfshard.format.stops import Terminated
from tfshard.ingest import ConvertOptions, EpisodeOptions, InputError, convert_episodes, convert_images
from tfshard.ingest.beam_runner import BeamRunner


def _files(folder) -> dict[str, bytes]:
    return {name: open(os.path.join(folder, name), "rb").read() for name in sorted(os.listdir(folder))}


def _records_by_split(out, manifest) -> dict[str, set[bytes]]:
    return {
        split: {r.numpy() for r in tf.data.TFRecordDataset([os.path.join(out, s.file) for s in info.shards])}
        for split, info in manifest.splits.items()
    }


@pytest.fixture
def images_src(tmp_path):
    src = tmp_path / "images"
    make_tree(src, classes=("cat", "dog", "eel"), per_class=5, splits=("train", "val"))
    (src / "train" / "cat" / "broken.jpg").write_bytes(write_jpeg(src / "train" / "cat" / "ok.jpg", 9)[:200])
    return src


def test_images_on_beam_write_the_local_runs_records_files_and_manifest(tmp_path, images_src):
    options = ConvertOptions(num_shards=3, index=True)
    local = convert_images(str(images_src), str(tmp_path / "local"), options, workers=0, progress=False)
    beam = convert_images(str(images_src), str(tmp_path / "beam"), options, progress=False,
                          runner=BeamRunner("--runner=DirectRunner"))

    assert _records_by_split(tmp_path / "beam", beam) == _records_by_split(tmp_path / "local", local)
    assert beam == local and [r["path"] for r in beam.rejected] == ["train/cat/broken.jpg"]
    assert _files(tmp_path / "beam") == _files(tmp_path / "local")  # the plan fixes the order: identical bytes


@pytest.mark.parametrize("labels", ["cat;dog", "0.25"])
def test_images_labelled_by_a_file_and_held_out_on_beam_match_the_local_run(tmp_path, images_src, labels):
    from tfshard.ingest import ImageOptions
    from tfshard.ingest.holdout import Holdout

    rows = [f"train/{c}/{i:03d}.jpg" for c in ("cat", "dog", "eel") for i in range(5)]
    csv = tmp_path / "labels.csv"
    csv.write_text("path,label\n" + "".join(f"{p},{labels if i % 2 else 'eel'}\n" for i, p in enumerate(rows)))
    kind = None if labels == "cat;dog" else "value"
    options = ConvertOptions(num_shards=1, image=ImageOptions(labels_file=str(csv), label_kind=kind),
                             holdout=Holdout(test_fraction=0.3))
    local = convert_images(str(images_src), str(tmp_path / "local"), options, workers=0, progress=False)
    beam = convert_images(str(images_src), str(tmp_path / "beam"), options, progress=False,
                          runner=BeamRunner("--runner=DirectRunner"))
    assert local.labels == ("multi" if kind is None else "value") and set(local.splits) == {"train", "test"}
    assert beam == local and _files(tmp_path / "beam") == _files(tmp_path / "local")


def test_episodes_on_beam_with_chunked_episodes_match_the_local_run(tmp_path):
    src = tmp_path / "episodes"
    save_episodes(src, {f"run-{i}.npz": {"obs": e, "step": np.arange(len(e))} for i, e in
                        enumerate(random_episodes([40, 3, 90, 17, 55], seed=4))})
    options = ConvertOptions(num_shards=2, on_error="fail", episode=EpisodeOptions(max_record_bytes=256))
    local = convert_episodes(str(src), str(tmp_path / "local"), options, workers=0, progress=False)
    beam = convert_episodes(str(src), str(tmp_path / "beam"), options, progress=False,
                            runner=BeamRunner(["--runner=DirectRunner"]))

    assert local.splits["train"].records > 5  # chunked
    assert beam == local and _files(tmp_path / "beam") == _files(tmp_path / "local")


@pytest.mark.parametrize("labelling", ["class folders", "labels file"])
def test_labelled_episodes_on_beam_match_the_local_run(tmp_path, labelling):
    src = tmp_path / "episodes"
    rels = [f"{split}/{name}/ep{i}.npy" for split in ("train", "val") for name in ("run", "sit") for i in range(3)]
    save_episodes(src, dict(zip(rels, random_episodes(range(4, 4 + len(rels)), seed=5))))
    labels_file = None
    if labelling == "labels file":  # value labels: float32 in the records, their float in the manifest
        labels_file = tmp_path / "labels.csv"
        labels_file.write_text("path,label\n" + "".join(f"{rel},{i / 7}\n" for i, rel in enumerate(rels)))
    options = ConvertOptions(num_shards=2, on_error="fail",
                             episode=EpisodeOptions(max_record_bytes=64, labels_file=labels_file and str(labels_file)))
    local = convert_episodes(str(src), str(tmp_path / "local"), options, workers=0, progress=False)
    beam = convert_episodes(str(src), str(tmp_path / "beam"), options, progress=False,
                            runner=BeamRunner(["--runner=DirectRunner"]))

    assert local.labels == ("class" if labels_file is None else "value")
    assert all(e.label is not None for split in local.splits.values() for e in split.episodes)
    assert beam == local and _files(tmp_path / "beam") == _files(tmp_path / "local")


@pytest.mark.slow
def test_multi_process_direct_runner_gives_the_same_files(tmp_path, images_src):
    options = ConvertOptions(num_shards=2)
    local = convert_images(str(images_src), str(tmp_path / "local"), options, workers=0, progress=False)
    runner = BeamRunner("--runner=DirectRunner --direct_num_workers=2 --direct_running_mode=multi_processing")
    beam = convert_images(str(images_src), str(tmp_path / "beam"), options, progress=False, runner=runner)
    assert beam == local and _files(tmp_path / "beam") == _files(tmp_path / "local")


def test_a_bad_file_under_on_error_fail_stops_beam_with_the_one_line_error(tmp_path, images_src):
    with pytest.raises(InputError, match=r"broken\.jpg: (truncated|corrupt).*--on-error skip[^\[]*$"):
        convert_images(str(images_src), str(tmp_path / "out"), ConvertOptions(on_error="fail"), progress=False,
                       runner=BeamRunner())
    assert not [n for n in os.listdir(tmp_path / "out") if n.endswith(".tfrecord")]  # no partial shard, no manifest
    assert "dataset.json" not in os.listdir(tmp_path / "out")


def test_beam_finishes_a_local_run_whose_shard_went_missing(tmp_path, images_src):
    options = ConvertOptions(num_shards=3)
    out = tmp_path / "out"
    manifest = convert_images(str(images_src), str(out), options, workers=0, progress=False)
    clean = _files(out)
    os.remove(out / manifest.splits["train"].shards[1].file)

    again = convert_images(str(images_src), str(out), options, progress=False, runner=BeamRunner())

    assert again == manifest and _files(out) == clean


def test_cli_runner_beam_and_beam_options_without_it(cli, tmp_path, images_src):
    result = cli("images", images_src, tmp_path / "out", "--runner", "beam", "--quiet",
                 "--beam-options", "--runner=DirectRunner")
    assert result.exit_code == 0, result.output
    assert os.path.exists(tmp_path / "out" / "dataset.json")

    result = cli("images", images_src, tmp_path / "out2", "--beam-options", "--runner=DirectRunner")
    assert result.exit_code == 1 and "--beam-options: only used with --runner beam" in result.output


@pytest.mark.parametrize("stop, code, said", [(KeyboardInterrupt, 130, "interrupted"),
                                               (Terminated, 143, "terminated (SIGTERM)")], ids=["ctrl-c", "sigterm"])
def test_a_stop_inside_a_beam_step_stops_the_conversion_and_the_same_command_resumes(cli, tmp_path, images_src,
                                                                                     monkeypatch, stop, code, said):
    """Ctrl-C or SIGTERM lands in the DirectRunner's WriteShard step (it runs in this process), as the second shard is
    committed: Beam wraps it ("RuntimeError: KeyboardInterrupt [while running 'WriteShard']"), which exited 1 with
    a traceback of 125 lines. It is the stop again: its code and line, and the rerun keeps the committed shard."""
    from tfshard.ingest import beam_runner

    commit, commits = beam_runner.record_commit, []

    def stop_at_the_second_commit(*args):
        if commits:
            raise stop
        commits.append(commit(*args))

    out = tmp_path / "out"
    args = ("images", images_src, out, "--runner", "beam", "--num-shards", "3")
    monkeypatch.setattr(beam_runner, "record_commit", stop_at_the_second_commit)
    result = cli(*args, "--quiet")
    assert (result.exit_code, result.stderr) == (
        code, f"{out}: {said}; run the same command again to resume (committed shards are kept)\n"), result.output
    monkeypatch.undo()
    again = cli(*args)
    assert again.exit_code == 0 and "resumed: kept 1 of 6 shards already committed" in again.stdout, again.output
    convert_images(str(images_src), str(tmp_path / "local"), ConvertOptions(num_shards=3), workers=0, progress=False)
    assert _files(out) == _files(tmp_path / "local")
