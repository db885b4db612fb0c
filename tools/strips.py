"""One feature's panel of an episode picture: a strip per channel, drawn by the channel's kind (``series.kind_of``).

- Floats: a line per episode (complex: its real part); integers of many values: steps. Either becomes its min/max
  envelope per pixel column once longer than twice the strip's ``COLUMNS``.
- Booleans: a heat strip, a row per episode, each cell the share of True under one pixel column.
- Integers of at most ``series.MAX_CATEGORIES`` distinct values over the steps drawn (an action, a class id per
  step): a strip of categories, a row per episode, each cell coloured by its value in matplotlib's ten colours
  (the smallest value C0), a legend beside the strip naming the values. Under a pixel column of several steps, the
  cell is the most frequent value there (a tie: the one met first), so a value never the most frequent of a column
  does not show: zoom in with ``time_range=`` to see every step.

Rows are named by episode beside them (every second row when the strip is too low for all, ``fit_row_names``);
lines and steps have a legend of the episodes.
"""

from __future__ import annotations

import numpy as np

from . import series

COLUMNS = 900  # pixel columns of a strip (10 inches at 100 dpi, less the margins): past them, an envelope
LEGEND_ROWS = 5  # a legend of categories takes a second column past this many values, to fit a channel's strip


def stats_text(mean, std) -> str:
    """The manifest's per-feature mean and std as a title shows them: ``mean [0.5, 1], std [n/a]``."""
    def show(values):
        if values is None:
            return "n/a"
        shown = ", ".join("n/a" if v is None else f"{v:.3g}" for v in values[:3])
        return f"[{shown}{', …' if len(values) > 3 else ''}]"

    return f"mean {show(mean)}, std {show(std)}"


def _draw_series(ax, values: np.ndarray, lo: int, kind: str, color: str, name: str, alpha: float) -> None:
    """One episode's channel on a strip: a line or steps, or its envelope once longer than the strip's pixels."""
    if not len(values):
        return
    x = lo + np.arange(len(values))
    if len(values) > 2 * COLUMNS:
        low, high, first = series.envelope(values, COLUMNS)
        edges = lo + np.append(first, len(values))
        ax.fill_between(edges, np.append(low, low[-1]), np.append(high, high[-1]), step="post", color=color,
                        alpha=alpha, linewidth=0.4, label=name)
    elif kind == "steps":
        ax.step(np.append(x, x[-1] + 1), np.append(values, values[-1]), where="post", linewidth=0.9, color=color,
                label=name)
    else:
        ax.plot(x, values, linewidth=0.8, color=color, label=name)


ROWS = "episode rows"  # the gid of a strip with a row per episode, named beside it


def _name_rows(ax, names_of: list) -> None:
    ax.set_ylim(len(names_of), 0)
    ax.set_yticks(np.arange(len(names_of)) + 0.5, [n.split(" (")[0] for n in names_of])
    ax.set_gid(ROWS)


def fit_row_names(ax, points: float = 6.5, smallest: float = 5) -> None:
    """Once the figure is laid out: the episode names beside a strip's rows at ``points``, or smaller when the rows
    are lower than that; rows lower than ``smallest`` points (10 episodes in a channel's strip) name every second
    (or third...) row, in the order the one-channel strips and the legends name them all."""
    if ax.get_gid() != ROWS:
        return
    rows = len(ax.get_yticks())
    row = 0.85 * ax.get_position().height * ax.figure.get_figheight() * 72 / max(1, rows)
    step = max(1, int(np.ceil(smallest / row)))
    if step > 1:
        names = [label.get_text() for label in ax.get_yticklabels()]
        ax.set_yticks(np.arange(0, rows, step) + 0.5, names[::step])
    ax.tick_params(axis="y", labelsize=max(smallest, min(points, row)))


def _draw_heat(ax, channel: list, lo_of: list, names_of: list) -> None:
    """A heat strip: a row per episode, each cell the share of True over the steps under one pixel column. The
    shade is the share's square root: a rare event (one step in ten under a column) still shows as mid grey."""
    from matplotlib.colors import PowerNorm

    norm = PowerNorm(0.5, vmin=0, vmax=1)
    for row, (values, lo) in enumerate(zip(channel, lo_of)):
        if len(values):
            means, first = series.column_means(values, COLUMNS)
            ax.pcolormesh(lo + np.append(first, len(values)), [row, row + 1], means[None, :], cmap="Greys",
                          norm=norm, shading="flat")
    _name_rows(ax, names_of)


def _draw_categories(ax, channel: list, lo_of: list, names_of: list) -> None:
    """A strip of categories: a row per episode, each cell the most frequent value under one pixel column, in the
    colour of its rank among the channel's values; a legend right of the strip names them."""
    from matplotlib.colors import ListedColormap, to_rgb
    from matplotlib.patches import Patch

    values = series.categories(channel)
    colours = [to_rgb(f"C{rank}") for rank in range(len(values))]
    palette = ListedColormap(colours)
    for row, (steps, lo) in enumerate(zip(channel, lo_of)):
        if len(steps):
            modes, first = series.column_modes(np.searchsorted(values, steps), COLUMNS)
            ax.pcolormesh(lo + np.append(first, len(steps)), [row, row + 1], modes[None, :], cmap=palette,
                          vmin=-0.5, vmax=len(values) - 0.5, shading="flat")
    _name_rows(ax, names_of)
    ax.legend(handles=[Patch(color=c, label=str(v)) for c, v in zip(colours, values.tolist())], fontsize=7,
              loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False, handlelength=1, handleheight=0.8,
              labelspacing=0.2, columnspacing=0.8, ncols=-(-len(values) // LEGEND_ROWS))


def _channel(steps: np.ndarray, channel: int) -> np.ndarray:
    """One channel of an episode's ``[T, ...]`` steps, 1-D (empty for a feature with no elements per step)."""
    flat = steps.reshape(len(steps), -1)
    return flat[:, channel] if flat.shape[1] else flat[:, :0].reshape(0)


_HOW = {"heat": "share of True: darker is more", "categories": "a colour per value", "steps": "steps"}


def feature_panel(axes, name: str, dtype, shape, channels: list[int], hidden: int, shown: list, lo_of: list,
                  names_of: list, info) -> list[str]:
    """Draws feature ``name`` of the ``shown`` episodes (each a dict of its steps drawn, the first at step
    ``lo_of[i]``), a channel on each of ``axes``, titled with its dtype, how it is drawn and the manifest's stats
    (``info``, the split's). Returns each strip's kind."""
    many = len(shown) > 1
    kinds = []
    for ax, channel in zip(axes, channels or [0]):
        values = [_channel(episode[name], channel) for episode in shown]
        kind = series.kind_of(dtype, values)
        kinds.append(kind)
        if kind == "heat":
            _draw_heat(ax, values, lo_of, names_of)
        elif kind == "categories":
            _draw_categories(ax, values, lo_of, names_of)
        else:
            for index, steps in enumerate(values):
                _draw_series(ax, steps.real.astype(np.float64), lo_of[index], kind, f"C{index % 10}",
                             names_of[index], 0.55 if many else 0.9)
        if len(channels) > 1:
            ax.set_ylabel(series.channel_name(shape, channel), fontsize=7, rotation=0, ha="right", va="center")
        ax.tick_params(labelsize=7)
    what = f"{np.dtype(dtype).name} {list(shape)}" if shape else np.dtype(dtype).name
    if hidden:
        what += f", {len(channels)} of {len(channels) + hidden} channels (--channel for others)"
    how = [_HOW[kind] for kind in dict.fromkeys(kinds) if kind in _HOW]
    if "categories" in kinds and max(map(len, values), default=0) > COLUMNS:
        how[how.index(_HOW["categories"])] += ", the most frequent of each pixel column"
    draw = "".join(f", {text}" for text in how)
    axes[0].set_title(f"{name} ({what}{draw}): {stats_text(info.feature_mean.get(name), info.feature_std.get(name))}",
                      fontsize=9, loc="left")
    lines = [ax for ax, kind in zip(axes, kinds) if kind in ("steps", "line")]
    if lines:
        lines[0].legend(fontsize=7, loc="upper right")
    return kinds
