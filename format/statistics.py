"""The statistics a manifest may hold: the values a conversion can write for a split's pixels and episode features.

Pure Python. Every statistic is measured over values of a known range (8-bit pixels, scaled to [0, 1]; the values
a numpy dtype holds), so some are impossible whatever the data: a mean outside the range, a negative std, a std
wider than values in the range can spread around that mean (Bhatia–Davis: ``std² ≤ (high − mean)(mean − low)``,
so never more than half the range), or a zero std (a constant) at a mean no constant of the dtype has. Each check
allows for the manifest's rounding. ``check_pixel_statistics`` and ``check_feature_statistics`` refuse them when a
manifest is loaded (``format/untrusted.py`` calls them); ``tfshard verify`` names every one, beside what the records
give.

    pixel_problems([0.5, 0.9, 0.2], [0.1, 0.3, 0.0])
    # [('pixel_std[2]', 'must not be 0 with pixel_mean 0.2: ...', 0.0)]  (0.2 is no whole pixel value over 255)
"""

from __future__ import annotations

import math
from typing import Any

from .manifest import is_finite_number
from .records import data_features

PIXEL_DECIMALS = 6  # pixel_mean and pixel_std are rounded to 6 decimals (ingest/images.py PixelSums.mean_std)
FEATURE_DIGITS = 7  # feature_mean and feature_std keep 7 significant digits (ingest/episodes.py FeatureSums)
_PIXEL_SLACK = 0.5 * 10.0**-PIXEL_DECIMALS  # half a unit in the last decimal kept
_FEATURE_SLACK = 0.5 * 10.0 ** (1 - FEATURE_DIGITS)  # the same, relative to the value
STATISTICS_KINDS = "biuf"  # numpy dtype kinds the converter keeps statistics of (not complex)
# The range of each dtype kind's values: bool 0/1, integers their iinfo, floats ±their largest finite value.
_FLOAT_MAX = {2: 65504.0, 4: 3.4028234663852886e38, 8: 1.7976931348623157e308}

Problem = tuple[str, str, Any]  # (the field, relative to its split; what is wrong; the value)


def value_range(dtype: str) -> tuple[float, float]:
    """The smallest and largest value of a numpy dtype string the readers decode (``'<i4'``, ``'|b1'``, ...)."""
    kind, size = dtype[1], int(dtype[2:])
    if kind == "b":
        return 0.0, 1.0
    if kind == "u":
        return 0.0, float(2 ** (8 * size) - 1)
    if kind == "i":
        return float(-(2 ** (8 * size - 1))), float(2 ** (8 * size - 1) - 1)
    return -_FLOAT_MAX[size], _FLOAT_MAX[size]


def _widest_std(mean: float, low: float, high: float, slack: float) -> float:
    """The largest std values in ``[low, high]`` can have around a mean within ``slack`` of ``mean``: the
    Bhatia–Davis bound at the mean nearest the middle of the range (computed without overflowing float64)."""
    middle = low / 2 + high / 2
    m = min(max(min(max(middle, mean - slack), mean + slack), low), high)
    return math.sqrt(high - m) * math.sqrt(m - low) if math.isfinite(high - m) and math.isfinite(m - low) \
        else math.inf


def _constant_at(mean: float, slack: float) -> bool:
    """Whether ``mean`` is, within ``slack``, a whole number: the mean of a constant integer value."""
    return abs(mean - round(mean)) <= slack


def pixel_problems(mean: list[float], std: list[float]) -> list[Problem]:
    """What no conversion writes in a split's ``pixel_mean``/``pixel_std`` (their types already checked: three
    finite numbers each), as ``(field, problem, value)``; empty when each channel is possible."""
    problems = []
    for i, (m, s) in enumerate(zip(mean, std)):
        widest = _widest_std(m, 0.0, 1.0, _PIXEL_SLACK) + _PIXEL_SLACK
        if not 0 <= m <= 1:
            problems.append((f"pixel_mean[{i}]", "must be in [0, 1] (8-bit pixels over 255)", m))
        elif s < 0:
            problems.append((f"pixel_std[{i}]", "must be at least 0", s))
        elif s > widest + 1e-12:
            problems.append((f"pixel_std[{i}]", f"must be at most {widest:.6f}, the widest spread pixels in [0, 1] "
                             f"have around their mean {m!r}", s))
        elif s == 0 and not _constant_at(m * 255, 255 * _PIXEL_SLACK):
            problems.append((f"pixel_std[{i}]", f"must not be 0 with pixel_mean {m!r}: a constant channel's mean is "
                             "a whole pixel value over 255", s))
    return problems


def feature_problems(name: str, dtype: str, shape: list[int], mean: list | None, std: list | None) -> list[Problem]:
    """What no conversion writes in a split's ``feature_mean[name]``/``feature_std[name]`` for a feature of
    ``dtype`` and ``shape`` (their types already checked: null, or a list of finite numbers or nulls), as
    ``(field, problem, value)``.

    A complex feature has no statistics; any other has one per trailing element, each null (not finite when
    measured) or within the dtype's range, by the rules of ``pixel_problems``.
    """
    mean_at, std_at = f"feature_mean[{name!r}]", f"feature_std[{name!r}]"
    if dtype[1] not in STATISTICS_KINDS:
        listed = [(at, values) for at, values in ((mean_at, mean), (std_at, std)) if values is not None]
        return [(at, f"must be absent: tfshard keeps no statistics of dtype {dtype!r}", values)
                for at, values in listed[:1]]
    width = math.prod(shape)
    for at, values in ((mean_at, mean), (std_at, std)):
        if values is not None and len(values) != width:
            return [(at, f"must list {width} element(s), one per element of shape {shape}", len(values))]
    if mean is None or std is None:
        return []
    low, high = value_range(dtype)
    problems = []
    for i, (m, s) in enumerate(zip(mean, std)):
        if m is None:  # sums that were not finite: so were the squares
            if s is not None:
                problems.append((f"{std_at}[{i}]", f"must be null, as {mean_at}[{i}] is", s))
            continue
        slack = abs(m) * _FEATURE_SLACK
        if not low - abs(low) * _FEATURE_SLACK <= m <= high + abs(high) * _FEATURE_SLACK:
            problems.append((f"{mean_at}[{i}]", f"must be in [{low:g}, {high:g}], the values of dtype {dtype!r}", m))
        elif s is None:
            continue
        elif s < 0:
            problems.append((f"{std_at}[{i}]", "must be at least 0", s))
        elif s > _widest_std(m, low, high, slack) * (1 + 2 * _FEATURE_SLACK) + 1e-300:
            problems.append((f"{std_at}[{i}]", f"must be at most {_widest_std(m, low, high, slack):.7g}, the widest "
                             f"spread values of dtype {dtype!r} have around their mean {m!r}", s))
        elif s == 0 and dtype[1] in "biu" and not _constant_at(m, slack):
            problems.append((f"{std_at}[{i}]", f"must not be 0 with mean {m!r}: a constant of dtype {dtype!r} is a "
                             "whole number", s))
    return problems


def pixel_sums_problem(count: int, sums: list[int], squares: list[int]) -> str | None:
    """What makes exact per-channel sums and sums of squares impossible for ``count`` 8-bit pixels, or None:
    each value ``x``, a whole number in [0, 255], has ``x ≤ x² ≤ 255·x``, and ``sum² ≤ count·squares``
    (Cauchy–Schwarz)."""
    for channel, (t, q) in enumerate(zip(sums, squares)):
        if not (0 <= t <= 255 * count and t <= q <= 255 * t and t * t <= count * q):
            return (f"channel {channel}: a sum of {t} and squares of {q} are not those of {count} pixels in "
                    "[0, 255]")
    return None


def check_pixel_statistics(check, where: str, raw: dict, consistency: bool) -> None:
    """``pixel_mean`` and ``pixel_std``: null (not measured), or three finite numbers each; with ``consistency``,
    both or neither, and values a conversion can write (``pixel_problems``: what ``readers.normalization``
    divides by)."""
    for field in ("pixel_mean", "pixel_std"):
        values = raw.get(field)
        if values is not None and (len(check.sequence(values, f"{where}.{field}")) != 3
                                   or not all(map(is_finite_number, values))):
            check.fail(f"{where}.{field}", "must be null or 3 finite numbers (R, G, B)", values)
    mean, std = raw.get("pixel_mean"), raw.get("pixel_std")
    if not consistency or (mean is None and std is None):
        return
    if mean is None or std is None:
        check.fail(f"{where}.pixel_mean", "must be null exactly when pixel_std is (both measured, or neither)", mean)
    for field, problem, value in pixel_problems(mean, std):
        check.fail(f"{where}.{field}", problem, value)


def check_feature_statistics(check, where: str, raw: dict, features: dict, consistency: bool) -> None:
    """``feature_mean`` and ``feature_std``: null, or per feature null or a list of finite numbers or nulls; with
    ``consistency``, the same features in both, each a feature of the table, with values a conversion can write
    for its dtype and shape (``feature_problems``)."""
    for field in ("feature_mean", "feature_std"):
        if raw.get(field) is not None:
            for feature, values in check.mapping(raw[field], f"{where}.{field}").items():
                check.numbers(values, f"{where}.{field}[{feature!r}]")
    mean, std = raw.get("feature_mean") or {}, raw.get("feature_std") or {}
    if not consistency:
        return
    schema = data_features(features)
    for field, listed in (("feature_mean", mean), ("feature_std", std)):
        unknown = sorted(set(listed) - set(schema), key=str)
        if unknown:
            check.fail(f"{where}.{field}", f"must name only features of the table ({sorted(schema)!r:.80})", unknown)
    if set(mean) != set(std):
        check.fail(f"{where}.feature_std", f"must name the features feature_mean names ({sorted(mean)!r:.80})",
                   sorted(std))
    for name in sorted(mean):
        spec = schema[name]
        for field, problem, value in feature_problems(name, spec["dtype"], spec["shape"], mean[name], std[name]):
            check.fail(f"{where}.{field}", problem, value)
