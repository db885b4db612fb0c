"""Episodes over time, and where the windows cut them (``tfshard preview`` of an episodes dataset).

A panel per feature (``feature=``; default the first ``series.DEFAULT_FEATURES`` by name), a strip per channel
(``channel=``; default every one, up to ``series.MAX_CHANNELS``), each strip on its own scale, the episodes in
matplotlib's ten colours. Floats are lines, integers steps, booleans a heat strip (a row per episode, the share of
True), integers of a few values (an action, a class id per step) a strip of a colour per value (``strips.py``); a
series longer than the strip's pixels is drawn as its min/max envelope per pixel column, so 8,760 hourly steps
read as clearly as 100. ``time_range=`` draws only those steps, and windows as ``readers.windows(time_range=)``
cuts them. The last panel shows the first episode's windows, zoomed to the first and the last of them, each
labelled beside its bar. Needs matplotlib (``pip install 'tfshard[preview]'``).

    episode_plot("weather-tfr", 1, feature="obs", channel=[0, 3], time_range=(0, 720))
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from ..readers import files as files_lib
from ..readers.arguments import check_count
from ..readers.episodes import episodes as read_episodes
from ..readers.episodes import feature_schema
from ..readers.windowing.starts import WindowSpec, check_time_range
from ..readers.windows.dataset import resident_layout
from ..readers.windows.layout import check_window_args
from . import series
from .strips import feature_panel, fit_row_names

MAX_EPISODES = 10  # one colour each in matplotlib's ten distinct colours; also bounds what is read into memory
WIDTH, DPI = 10, 100
ONE_STRIP, CHANNEL_STRIP, WINDOWS_PANEL = 2.2, 0.8, 2.2  # inches: a one-channel feature, a channel of several
_INSTALL = "pip install 'tfshard[preview]' (from a clone: pip install -e '.[preview]')"


def picture_size(strips: list[int]) -> tuple[int, int]:
    """Pixels of an episode picture whose features have ``strips`` channels drawn each, and the windows panel."""
    inches = sum(ONE_STRIP if count <= 1 else CHANNEL_STRIP * count for count in strips) + WINDOWS_PANEL
    return WIDTH * DPI, round(inches * DPI)


def _label_text(manifest, label) -> str:
    """An episode's label as people read it: its class name, or its value."""
    if manifest.labels == "class" and 0 <= int(label) < len(manifest.class_names):
        return manifest.class_names[int(label)]
    return f"{float(label):.4g}"


def check_episode_args(path: str, split: str, episodes: int, length: int | None, shift: int | None,
                       max_windows: int, time_range=None) -> tuple[int, int]:
    """The window ``(length, shift)`` to draw, each defaulted from the first episode when None, after the checks
    ``readers.windows(length=, shift=, time_range=)`` makes, with its messages (a split with no episode that long
    too)."""
    check_count(episodes, "n", path, high=MAX_EPISODES, fix="pass an -n (episodes drawn, a line each) in that range")
    check_count(max_windows, "max_windows", path, low=4, high=64, fix="pass a count of spans in that range")
    dataset = files_lib.info(path)
    if dataset.manifest.kind != "episodes":
        raise ValueError(f"{path}: not an episodes dataset (kind {dataset.manifest.kind!r}); use the image sheet "
                         "for it")
    lengths = files_lib.split_info(dataset, split).episode_lengths
    if not lengths:
        raise ValueError(f"{path}: split {split!r} holds no episodes to draw; pass another --split")
    if time_range is not None:
        try:
            time_range = check_time_range(time_range)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None
    # The given values are checked before a default is derived from them (shift from length).
    check_window_args(1 if length is None else length, 1 if shift is None else shift, 1, path)
    lo, hi = WindowSpec(1, time_range=time_range).bounds(lengths[0])
    length = max(1, min(64, (hi - lo) // 4)) if length is None else int(length)
    shift = max(1, length // 2) if shift is None else int(shift)
    # the reader's refusals (no window at all), its words
    resident_layout(path, split, length=length, shift=shift, time_range=time_range)
    return length, shift


def _windows_group(ax, starts: np.ndarray, numbers: list[int], length: int, lo: int, hi: int) -> None:
    """Windows as bars, one level each, over the grey steps they come from, zoomed to their span: a bar is never a
    sliver, whatever the episode's length. Each label sits beside its bar, inside the axes."""
    left, right = int(starts[0]), int(starts[-1]) + length
    room = max(1.0, 0.12 * (right - left))  # the labels' room, right of the last bar
    ax.broken_barh([(max(lo, left - 1), min(hi, right + room) - max(lo, left - 1))], (-1.2, 0.8), color="0.7")
    for level, (start, k) in enumerate(zip(starts, numbers)):  # window k starts at k * shift (windowing/starts.py)
        ax.broken_barh([(int(start), length)], (level, 0.8), color=f"C{k % 10}")
        ax.text(int(start) + length + room * 0.05, level + 0.4, f"#{k}", fontsize=7, va="center")
    ax.set_xlim(left - max(1.0, 0.02 * (right - left)), right + room)
    ax.set_ylim(-1.5, len(starts) + 0.2)
    ax.set_yticks([])
    ax.tick_params(labelsize=7)


def _windows_panel(figure, cell, steps: int, spec: WindowSpec, max_windows: int, title: str) -> None:
    lo, hi = spec.bounds(steps)
    starts = lo + spec.starts(steps)
    count = len(starts)
    if not count:  # not an error: the reader takes its windows from the longer episodes
        ax = figure.add_subplot(cell)
        ax.text(0.5, 0.5, title, transform=ax.transAxes, ha="center", va="center", fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
        return
    if count <= max_windows:
        groups = [list(range(count))]
    else:  # the first ones and the last few (four; three of max_windows 4), each zoomed: both ends of the episode show
        last = min(4, max_windows - 1)
        groups = [list(range(max_windows - last)), list(range(count - last, count))]
    inner = cell.subgridspec(1, len(groups), width_ratios=[len(g) for g in groups] if len(groups) > 1 else None)
    for column, numbers in enumerate(groups):
        ax = figure.add_subplot(inner[0, column])
        _windows_group(ax, starts[numbers], numbers, spec.length, lo, hi)
        ax.set_xlabel("time step", fontsize=8)
        if column == 0:
            ax.set_title(title, fontsize=9, loc="left")


def episode_plot(path: str, split: str = "train", episodes: int = 3, **options) -> Image.Image:
    """``episode_figure`` drawn: the picture ``tfshard preview`` saves, as a ``PIL.Image`` (1,000 pixels wide).

    Example:
      episode_plot("runs-tfr", length=64, shift=16).size  # (1000, 660) for two one-channel features
    """
    figure = episode_figure(path, split, episodes, **options)  # first: it says how to install matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(figure)
    canvas.draw()  # one render, the figure laid out already: savefig would lay it out again and encode a PNG
    return Image.fromarray(np.asarray(canvas.buffer_rgba())).convert("RGB")


def episode_figure(path: str, split: str = "train", episodes: int = 3, *, length: int | None = None,
                   shift: int | None = None, max_windows: int = 12, feature=None, channel=None, time_range=None):
    """A matplotlib ``Figure``: a panel per feature, a strip per channel, the first ``episodes`` episodes over time,
    each strip drawn by its kind (``strips.py``) and titled with the manifest's mean and std; then where
    ``readers.windows(length=, shift=, time_range=)`` cuts the first episode (never across its end; the first
    windows and the last four (three of ``max_windows=4``) when there are more than ``max_windows``).
    ``episode_plot`` draws it.

    Args:
      episodes: 1 to ``MAX_EPISODES`` (10); only those are read.
      length, shift: the window; default a quarter of the first episode's steps drawn (at most 64) and half the
        length. Refused exactly as ``readers.windows`` refuses them; a first episode shorter than the window
        (while others are long enough) is drawn with a line saying so.
      feature: a name or names (default: the first ``series.DEFAULT_FEATURES`` by name, 6).
      channel: an index or indices of a step's flattened elements, drawn for every feature (default: all, up to
        ``series.MAX_CHANNELS`` of each, 16).
      time_range: ``(a, b)`` as ``readers.windows`` takes it: ints, the steps ``[a, b)``; floats, fractions of each
        episode. The strips show those steps, and the windows are the reader's of that range.

    Raises:
      ValueError: arguments as above; a feature or channel the dataset does not have.

    Example:
      episode_figure("runs-tfr", feature="action").axes[0].get_title()  # 'action (int32, a colour per value): ...'
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise ImportError(f"episode previews need matplotlib ({e}); {_INSTALL}") from None
    length, shift = check_episode_args(path, split, episodes, length, shift, max_windows, time_range)
    dataset = files_lib.info(path)
    info = files_lib.split_info(dataset, split)
    schema = feature_schema(dataset)
    shapes = {name: shape for name, (_, shape) in schema.items()}
    names, more = series.choose_features(path, shapes, feature)
    channels = series.choose_channels(path, shapes, names, channel)
    spec = WindowSpec(length, shift, time_range=time_range)
    shown, names_of, lo_of = [], [], []  # each episode's steps drawn, its name (real id and label), its first step
    for keys, episode in read_episodes(path, split, features=names, with_keys=True).take(episodes):
        values = {k: v.numpy() for k, v in episode.items()}
        label = values.pop("label", None)
        steps = len(values[names[0]])
        lo, hi = spec.bounds(steps)
        shown.append({k: v[lo:hi] for k, v in values.items()})
        lo_of.append(lo)
        names_of.append(f"episode {int(keys['episode'])}" + ("" if label is None else
                                                            f" ({_label_text(dataset.manifest, label)})"))
        if not shown[1:]:
            first_steps = steps  # the first episode read: the one whose windows are drawn
    strips = [len(channels[name][0]) or 1 for name in names]
    inches = [ONE_STRIP if count <= 1 else CHANNEL_STRIP * count for count in strips]
    figure = Figure(figsize=(WIDTH, sum(inches) + WINDOWS_PANEL), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    grid = figure.add_gridspec(len(names) + 1, 1, height_ratios=[*inches, WINDOWS_PANEL])
    right = max((lo + len(e[names[0]]) for lo, e in zip(lo_of, shown)), default=1)
    left = min(lo_of, default=0)
    every = []
    for row, name in enumerate(names):
        inner = grid[row, 0].subgridspec(strips[row], 1, hspace=0)
        axes = [figure.add_subplot(inner[k, 0]) for k in range(strips[row])]
        every += axes
        for ax in axes:
            ax.set_xlim(left, max(right, left + 1))
            if ax is not axes[-1]:
                ax.tick_params(labelbottom=False)
        drawn, hidden = channels[name]
        feature_panel(axes, name, *schema[name], drawn, hidden, shown, lo_of, names_of, info)
    count = spec.episode_windows(first_steps)[1]
    lo, hi = spec.bounds(first_steps)
    span = f"steps {lo}–{hi} of {first_steps}" if (lo, hi) != (0, first_steps) else f"{first_steps} steps"
    hidden = f"; {more} more feature{'s' if more > 1 else ''} not shown (--feature)" if more else ""
    shown_count = f", {max_windows} shown" if count > max_windows else ""
    title = (f"windows of {names_of[0]} ({span}): length {length}, shift {shift}, {count} windows{shown_count}{hidden}"
             if count else f"{names_of[0]} has {hi - lo} steps, fewer than the window's {length}: it yields no "
             f"window{hidden}")
    _windows_panel(figure, grid[len(names), 0], first_steps, spec, max_windows, title)
    _align(figure, every)
    return figure


def _align(figure, strips: list) -> None:
    """Lays the figure out, then gives every strip the same left and right edge, so one step is at the same x in
    every panel: constrained layout fits each panel's subgrid to its own margins (episode names, a legend of
    values), not the others'. The layout engine alone places the panels: no draw of the figure (~0.6 s)."""
    figure.get_layout_engine().execute(figure)
    left = max(ax.get_position().x0 for ax in strips)
    right = min(ax.get_position().x1 for ax in strips)
    figure.set_layout_engine("none")  # keep the positions the layout found, and these
    for ax in strips:
        box = ax.get_position()
        ax.set_position([left, box.y0, right - left, box.height])
        fit_row_names(ax)
