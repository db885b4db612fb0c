"""Attacks on the window options of issue 22 (Targets, sampling_rate, time_range, padding/pad_value, labels):
the edges where the modes (resident, streamed, model_windows) or the manifest-only counts could disagree, and the
arguments that must be refused up front with a message naming them. Tiny episodes only: the file runs in seconds.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from helpers import convert_episode_tree, edit_manifest, save_episodes
from tfshard import readers
from tfshard.ingest import EpisodeOptions

LENGTHS = [5, 7, 9]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """Three episodes in source order (``seed=None``): ``x`` float64 [T, 2], ``u`` uint8 [T], ``b`` bool [T],
    cut into chunk records of a few steps."""
    root = tmp_path_factory.mktemp("options")
    rng = np.random.default_rng(0)
    episodes = {f"e{i}.npz": {"x": rng.standard_normal((t, 2)), "u": rng.integers(0, 200, t).astype(np.uint8),
                              "b": rng.integers(0, 2, t).astype(bool)} for i, t in enumerate(LENGTHS)}
    save_episodes(root / "src", episodes)
    convert_episode_tree(root / "src", root / "out", seed=None, episode=EpisodeOptions(max_record_bytes=64))
    return str(root / "out"), [episodes[f"e{i}.npz"] for i in range(len(LENGTHS))]


@pytest.fixture(scope="module")
def value_labelled(tmp_path_factory):
    """Four float32 episodes labelled with float values through a labels CSV, in source order."""
    root = tmp_path_factory.mktemp("labelled")
    rng = np.random.default_rng(1)
    save_episodes(root / "src", {f"ep{i}.npy": rng.standard_normal((t, 2)).astype(np.float32)
                                 for i, t in enumerate([6, 9, 4, 7])})
    labels = [0.5, -1.25, 3.0, 2.5]
    csv = root / "labels.csv"
    csv.write_text("path,label\n" + "".join(f"ep{i}.npy,{v}\n" for i, v in enumerate(labels)))
    convert_episode_tree(root / "src", root / "out", seed=None, episode=EpisodeOptions(labels_file=str(csv)))
    return str(root / "out"), labels


def _first_inputs(ds):
    return next(iter(ds))["inputs"].numpy()


# --- bugs -----------------------------------------------------------------------------------------------------------


def test_streamed_pads_a_float64_feature_with_the_pad_value_resident_mode_pads(converted):
    """Attacks streamed padding: ``episode_windows`` builds the padding with ``tf.cast(pad_value, dtype)``, which
    first makes a float32 tensor of a Python float, so a float64 feature's pad_value=0.1 becomes
    0.10000000149011612 (and 1e300 becomes inf) while resident mode pads exactly 0.1 (1e300). pad_fill accepted
    both values as exactly held by float64; the two modes must then pad alike."""
    out, _ = converted
    for pad_value in (0.1, 1e300):
        options = dict(length=3, shift=1, batch_size=64, features="x", padding="start", pad_value=pad_value,
                       shuffle=False, drop_remainder=False)
        resident = _first_inputs(readers.windows(out, **options))
        streamed = _first_inputs(readers.windows(out, resident=False, **options))
        assert resident[0, 0, 0] == pad_value
        np.testing.assert_array_equal(streamed, resident, err_msg=f"pad_value={pad_value!r}")


def test_targets_naming_no_feature_are_refused():
    """Attacks ``Targets(features=[])``: an empty list of target features is accepted and every element's targets
    are an empty dict ``{}`` (a model then has nothing to fit); it must be a ValueError naming ``features``."""
    episodes = {"x": [np.arange(20.0).reshape(10, 2)]}
    with pytest.raises(ValueError, match="features"):
        readers.resident_windows(episodes, length=3, batch_size=2, features="x",
                                 targets=readers.Targets([], width=1))


def test_targets_of_a_non_name_is_a_message_not_a_python_error():
    """Attacks ``Targets(123)``: ``tuple(123)`` in ``__post_init__`` raises a bare "'int' object is not iterable";
    the frozen spec must name its field and the allowed values, as width and offset do."""
    with pytest.raises((TypeError, ValueError), match=r"Targets: features"):
        readers.Targets(123, width=1)


def test_a_numpy_bool_pad_value_is_a_number_for_a_bool_feature():
    """Attacks the pad_value type check: ``np.bool_(True)`` (what indexing a numpy bool array gives) is refused as
    "not a number" while ``True`` is accepted for the same bool feature; numpy scalars of the feature's own dtype
    must be accepted (np.integer and np.floating are)."""
    episodes = {"b": [np.array([True, False, True, True])]}
    options = dict(length=2, batch_size=8, features="b", padding="start", shuffle=False, drop_remainder=False)
    want = _first_inputs(readers.resident_windows(episodes, pad_value=True, **options))
    got = _first_inputs(readers.resident_windows(episodes, pad_value=np.bool_(True), **options))
    np.testing.assert_array_equal(got, want)


def test_an_int_time_range_past_any_episode_is_refused_in_both_modes(converted):
    """Attacks streamed ``time_range`` ints: ``(0, 2**63)`` is accepted (ints are cut to T) and resident mode gives
    every window, but the streamed graph makes ``tf.constant(2**63, tf.int64)`` of it and the read dies with a
    ResourceExhaustedError in a ``range`` op. Either refuse it up front naming time_range, or yield the same."""
    out, _ = converted
    options = dict(length=3, batch_size=4, features="x", shuffle=False, drop_remainder=False)
    for resident in (True, False):  # refused up front in both modes, naming it and the fix
        with pytest.raises(ValueError, match=r"time_range: steps must be at most 2147483647.*\(a, 1.0\)"):
            readers.windows(out, time_range=(0, 2**63), resident=resident, **options)


def test_a_sampling_rate_no_window_can_span_is_refused_up_front():
    """Attacks the unbounded ``sampling_rate`` (and offset): length and shift are capped at MAX_WINDOW_STEPS, but a
    span of ``(points - 1)·sampling_rate + 1`` steps is not, so with ``padding="start"`` (history padding of
    ``(length - 1)·sampling_rate`` steps per episode) sampling_rate=2**44 tries to allocate hundreds of TiB and
    dies with MemoryError. Arguments must be validated up front with a ValueError naming sampling_rate."""
    episodes = {"x": [np.zeros((10, 4), np.float64)]}
    with pytest.raises(ValueError, match="sampling_rate"):
        readers.resident_windows(episodes, length=2, batch_size=2, features="x", sampling_rate=2**44,
                                 padding="start")


def test_num_windows_refuses_a_horizon_beside_targets(converted):
    """Attacks ``DatasetInfo.num_windows(split, length, shift, horizon, targets=...)``: given both, the horizon is
    silently dropped (``num_windows("train", 3, 1, 2, targets="same")`` counts windows of 3 steps, not 3 + 2).
    Two ways of saying the span must not disagree silently: refuse the pair, naming both."""
    out, _ = converted
    with pytest.raises(ValueError, match="horizon"):
        readers.info(out).num_windows("train", 3, 1, 2, targets="same")


def test_num_windows_of_label_targets_on_an_unlabelled_dataset_is_refused_as_the_reader_does(converted):
    """Attacks the "same arguments as readers.windows" promise of ``num_windows``: ``targets="label"`` on a dataset
    without labels is refused by the reader but counted (8 windows) from the manifest."""
    out, _ = converted
    with pytest.raises(ValueError, match="label"):
        readers.windows(out, length=3, batch_size=2, targets="label")
    with pytest.raises(ValueError, match="label"):
        readers.info(out).num_windows("train", 3, targets="label")


def test_the_padding_hint_is_given_only_when_padding_serves_the_short_episodes(converted, caplog):
    """Attacks the "padding='start' serves them" hint of ``tfshard info --length`` (``report.window_lines``) and of
    the reader's warning: it is printed whenever an episode is too short, but padding only adds windows whose span
    ends inside the episode: with a horizon of 9 after 3 steps, episodes of 5, 7 and 9 steps get none, padded or not
    (``too_short(..., padding="start")`` says so), and with shift > length - 1 padding adds no window at all."""
    from tfshard.tools.report import window_lines

    out, _ = converted
    info = readers.info(out)
    assert info.too_short("train", 3, 1, targets=9) == 3
    assert info.too_short("train", 3, 1, targets=9, padding="start") == 3  # padding serves none
    lines = window_lines(info.manifest, length=3, shift=1, horizon=9)
    assert not any("padding='start' serves" in line for line in lines), lines
    assert info.too_short("train", 6, 9) == 1 and info.too_short("train", 6, 9, padding="start") == 1
    with caplog.at_level("WARNING"):
        readers.windows(out, length=6, shift=9, batch_size=1, features="x")
    assert "padding='start' serves them too" not in caplog.text


def test_info_horizon_or_shift_without_length_is_an_error(converted, cli):
    """Attacks ``tfshard info OUT --horizon 3`` (and ``--shift 4``) without ``--length``: the options are
    documented "With --length" and are silently ignored (exit 0, no window lines); they must be a one-line error
    naming --length."""
    out, _ = converted
    for flag in (["--horizon", "3"], ["--shift", "4"]):
        result = cli("info", out, *flag)
        assert result.exit_code != 0, (flag, result.output)
        assert "--length" in result.output


# --- what held (regression guards) ----------------------------------------------------------------------------------


def _windows_by_mode(path, **options):
    """``[(keys, element)]`` numpy batches of resident, streamed and model_windows for the same options."""
    out = {}
    for mode in ("resident", "streamed"):
        ds = readers.windows(path, with_keys=True, resident=mode == "resident", shuffle=False, drop_remainder=False,
                             **options)
        out[mode] = [tf.nest.map_structure(lambda t: t.numpy(), b) for b in ds]
    mw = readers.model_windows(path, shuffle=False, drop_remainder=False, **options)
    out["model_windows"] = [tf.nest.map_structure(lambda t: t.numpy(), (mw.keys(s), mw.element(s)))
                            for s in mw.starts]
    return out


def _assert_same(batches):
    modes = list(batches)
    for mode in modes[1:]:
        assert len(batches[mode]) == len(batches[modes[0]]), mode
        for a, b in zip(batches[modes[0]], batches[mode]):
            tf.nest.assert_same_structure(a, b)
            for x, y in zip(tf.nest.flatten(a), tf.nest.flatten(b)):
                np.testing.assert_array_equal(x, y, err_msg=mode)


@pytest.mark.parametrize("options", [
    dict(features=["x", "u"], targets=readers.Targets(["u", "b"], width=2, offset=3), sampling_rate=2,
         time_range=(0.2, 1.0), padding="start", pad_value=0),
    dict(features="x", targets=readers.Targets(width=3, offset=0), time_range=(1, 100), padding="start",
         pad_value=float("nan")),
    dict(features="u", targets=2, padding="start", pad_value=255, shift=2),
])
def test_every_mode_gives_the_same_windows_in_the_same_order(converted, options):
    """Resident, streamed (source order: seed=None) and model_windows agree batch for batch, keys included, with
    dict targets of a feature both input and target beside target-only ones, a NaN pad, uint8 padded with 255,
    and the count is num_windows'."""
    out, _ = converted
    options = {"length": 3, "shift": 1, "batch_size": 3, **options}
    batches = _windows_by_mode(out, **options)
    _assert_same(batches)
    count_args = {k: options[k] for k in ("targets", "sampling_rate", "time_range", "padding") if k in options}
    total = readers.info(out).num_windows("train", 3, options["shift"], **count_args)
    assert sum(len(k["episode"]) for k, _ in batches["resident"]) == total
    assert len(readers.windows(out, shuffle=False, drop_remainder=False, **options)) == -(-total // 3)


def test_a_nan_pad_keeps_the_mask_and_the_real_points(converted):
    """pad_value=NaN on a float feature: the mask is where points are real, the real points are the episode's and
    only the padded ones are NaN."""
    out, episodes = converted
    ds = readers.windows(out, length=3, batch_size=64, features="x", padding="start", pad_value=float("nan"),
                         shuffle=False, drop_remainder=False, with_keys=True)
    for keys, x in ds:
        for e, s, window, mask in zip(keys["episode"].numpy(), keys["step"].numpy(), x["inputs"].numpy(),
                                      x["mask"].numpy()):
            points = s + np.arange(3)
            np.testing.assert_array_equal(mask, points >= 0)
            assert np.isnan(window[~mask]).all()
            np.testing.assert_array_equal(window[mask], episodes[e]["x"][points[mask]])


def test_pad_values_a_dtype_cannot_hold_are_refused_naming_the_feature(converted):
    """uint8 padded with 256 or -1, bool with 2, NaN for an int: refused before reading, naming feature and dtype."""
    out, _ = converted
    for feature, pad_value in (("u", 256), ("u", -1), ("b", 2), ("u", float("nan"))):
        with pytest.raises(ValueError, match=rf"pad_value=.* cannot be held by feature '{feature}'"):
            readers.windows(out, length=3, batch_size=2, features=feature, padding="start", pad_value=pad_value)


@pytest.mark.parametrize("time_range, match", [
    ((0.5,), "must be a pair"), ((True, 1), "not a mix"), ((0, 0.8), "not a mix"), ((0.8, 0.2), "0 <= a < b <= 1"),
    ((0.0, float("nan")), "0 <= a < b <= 1"), ((3, 3), "0 <= a < b"),
])
def test_bad_time_ranges_are_refused_naming_the_argument(converted, time_range, match):
    """Malformed time ranges are ValueErrors naming time_range, before anything is read."""
    out, _ = converted
    with pytest.raises(ValueError, match=rf"time_range: .*{match}"):
        readers.windows(out, length=3, batch_size=2, features="x", time_range=time_range)


def test_numpy_arguments_and_the_whole_range_are_the_plain_ones(converted):
    """sampling_rate=np.int64(2) is accepted and equals 2; time_range=(0.0, 1.0) is exactly no time_range."""
    out, _ = converted
    options = dict(length=3, batch_size=64, features="x", shuffle=False, drop_remainder=False)
    plain = next(iter(readers.windows(out, sampling_rate=2, **options))).numpy()
    np.testing.assert_array_equal(next(iter(readers.windows(out, sampling_rate=np.int64(2), **options))), plain)
    whole = next(iter(readers.windows(out, time_range=(0.0, 1.0), **options))).numpy()
    np.testing.assert_array_equal(whole, next(iter(readers.windows(out, **options))).numpy())


def test_value_labels_reach_each_replica_of_model_windows(value_labelled, strategies):
    """Float labels with padding gathered by model_windows inside a MirroredStrategy step: each replica's labels
    are its windows' episodes' labels (float32)."""
    out, labels = value_labelled
    strategy = strategies[2]
    mw = readers.model_windows(out, length=3, shift=1, batch_size=4, targets="label", padding="start",
                               pad_value=-1.0, shuffle=False, strategy=strategy)

    @tf.function
    def step(starts):
        return strategy.run(lambda s: (mw.keys(s)["episode"], mw.element(s)[1]), (starts,))

    checked = 0
    for starts in strategy.experimental_distribute_dataset(mw.starts):
        episodes, got = step(starts)
        for e, y in zip(strategy.experimental_local_results(episodes), strategy.experimental_local_results(got)):
            assert y.dtype == tf.float32
            np.testing.assert_array_equal(y.numpy(), np.asarray(labels, np.float32)[e.numpy()])
            checked += len(y)
    assert checked == readers.info(out).num_windows("train", 3, targets="label", padding="start") // 4 * 4


def test_a_manifest_label_that_disagrees_with_the_records_is_refused_in_every_mode(value_labelled, tmp_path):
    """Two episodes' labels swapped in the manifest: resident, model_windows, streamed and readers.episodes refuse
    (never yield the manifest's or the record's label silently)."""
    import shutil

    src, _ = value_labelled
    out = str(tmp_path / "tampered")
    shutil.copytree(src, out)

    def swap(raw):
        eps = raw["splits"]["train"]["episodes"]
        eps[0]["label"], eps[1]["label"] = eps[1]["label"], eps[0]["label"]

    edit_manifest(out, swap)
    options = dict(length=3, batch_size=2, targets="label", shuffle=False)
    with pytest.raises(ValueError, match="its records say label 0.5, the manifest says -1.25"):
        readers.windows(out, **options)
    with pytest.raises(ValueError, match="its records say label"):
        readers.model_windows(out, **options)
    with pytest.raises(tf.errors.InvalidArgumentError, match="has label"):
        list(readers.windows(out, resident=False, **options))
    with pytest.raises(tf.errors.InvalidArgumentError, match="has label"):
        list(readers.episodes(out))
