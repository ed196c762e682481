"""The data behind a matplotlib figure, as E2B's code interpreter returns it beside the figure's PNG.

An IPython extension, loaded into every Python kernel of the code interpreter as it starts: it adds
a display formatter for the MIME type ``e2b/chart`` that, for a ``matplotlib.figure.Figure``, gives a
JSON object with the chart's ``type``, ``title`` and ``elements``. A figure shown by ``plt.show()``
(the inline backend's ``display``), by ``display(fig)`` or as a cell's last value carries it next to
its ``image/png``; the server hands it to the client as the result's ``chart``.

The chart of one axes, by what is drawn in it (text and reference lines such as ``axhline`` aside):

``line``             lines only: per line its ``label`` and ``points`` ``[[x, y], ...]``
``scatter``          point collections only: the same, per collection
``bar``              bars only: per bar its ``label`` (the category), ``value`` and ``group``
                     (the container's label); ``x_label`` names the categories' axis, also for ``barh``
``pie``              wedges only: per wedge its ``label``, ``angle`` (degrees) and ``radius``
``box_and_whisker``  boxes (patches or lines) with their medians: per box its ``label``, ``min``,
                     ``first_quartile``, ``median``, ``third_quartile``, ``max`` and ``outliers``
``unknown``          anything else (images, filled areas, mixed kinds): ``title`` only

Line, scatter, bar and box charts also have ``x_label``/``y_label`` and their units (``"time (s)"``
or ``"time [s]"`` gives ``s``); line and scatter charts have each axis's ``ticks``,
``tick_labels`` and ``scale`` (``linear``, ``log``, ... or ``datetime``, ``categorical``). A figure
with several axes is a ``superchart``: its ``title`` is the figure's suptitle and its elements are
the charts of its axes. A figure with no data has no chart. Dates become ISO 8601 strings, NaN and
infinities ``null``.

Nothing here may break a cell: a figure whose chart cannot be made has none, and its PNG still
comes back.
"""

from __future__ import annotations

import datetime
import itertools
import math
import re
import sys
import warnings
from typing import Any

CHART_MIME = "e2b/chart"
UNIT = re.compile(r"\s\((.*?)\)|\[(.*?)\]")
ROUND_DIGITS = 4  # a wedge's angle: matplotlib computes it in float32 (60.0000017 for a sixth)


# ---- the IPython side ---------------------------------------------------------------------------

def load_ipython_extension(shell: Any) -> None:
    """Register the ``e2b/chart`` formatter in ``shell``."""
    from IPython.core.formatters import BaseFormatter
    from traitlets import ObjectName, Unicode

    class ChartFormatter(BaseFormatter):  # type: ignore[misc]
        """Asks the object itself (``_repr_e2b_chart_``), or reads a matplotlib figure. Not by type
        (``for_type``): IPython forgets every formatter's Figure printer when pyplot starts the
        inline backend (``select_figure_formats``)."""

        format_type = Unicode(CHART_MIME)
        print_method = ObjectName("_repr_e2b_chart_")
        _return_type = (dict,)

        def __call__(self, obj: Any) -> Any:
            figure_module = sys.modules.get("matplotlib.figure")  # no figure before matplotlib is loaded
            if self.enabled and figure_module is not None and isinstance(obj, figure_module.Figure):
                return figure_chart(obj)
            return super().__call__(obj)

    shell.display_formatter.formatters[CHART_MIME] = ChartFormatter(parent=shell.display_formatter)


def figure_chart(figure: Any) -> dict[str, Any] | None:
    """The chart of ``figure``, or None when it has no data or cannot be read."""
    with warnings.catch_warnings():  # a warning would be the cell's stderr
        warnings.simplefilter("ignore")
        return _figure_chart(figure)


def _figure_chart(figure: Any) -> dict[str, Any] | None:
    try:
        axes = [ax for ax in figure.get_axes() if ax.get_visible()]
        if not any(ax.has_data() for ax in axes):
            return None
        if len(axes) == 1:
            return axes_chart(axes[0])
        suptitle = getattr(figure, "_suptitle", None)
        return {"type": "superchart", "title": _text(suptitle.get_text()) if suptitle is not None else None,
                "elements": [axes_chart(ax) for ax in axes]}
    except Exception:  # a chart is a bonus: the figure's other formats must not depend on it
        return None


# ---- one axes -------------------------------------------------------------------------------

def axes_chart(ax: Any) -> dict[str, Any]:
    """The chart of one axes (reference lines such as ``axhline`` are not in data coordinates)."""
    lines = [line for line in ax.lines if line.get_transform() is ax.transData]
    try:
        return READERS[_kind(ax, lines)](ax, lines)
    except Exception:  # what the readers did not foresee: the kind, not a wrong chart
        return _unknown(ax, lines)


def _kind(ax: Any, lines: list[Any]) -> str:
    from matplotlib.collections import PathCollection
    from matplotlib.container import BarContainer
    from matplotlib.patches import PathPatch, Rectangle, Wedge

    patches, collections = list(ax.patches), list(ax.collections)
    if ax.images or ax.tables:
        return "unknown"
    if lines and not patches and not collections:
        return "line" if _boxes(ax, lines) is None else "box_and_whisker"
    if collections and not lines and not patches and all(isinstance(c, PathCollection) for c in collections):
        return "scatter"
    if patches and not lines and not collections and all(isinstance(p, Wedge) for p in patches):
        return "pie"
    if (patches and not lines and not collections and all(isinstance(p, Rectangle) for p in patches)
            and any(isinstance(c, BarContainer) for c in ax.containers)):
        return "bar"
    if patches and lines and not collections and all(isinstance(p, PathPatch) for p in patches):
        return "box_and_whisker" if _boxes(ax, lines) is not None else "unknown"
    return "unknown"


def _unknown(ax: Any, _lines: list[Any]) -> dict[str, Any]:
    return {"type": "unknown", "title": _title(ax), "elements": []}


def _line(ax: Any, lines: list[Any]) -> dict[str, Any]:
    elements = [{"label": _label(line, "Line"), "points": _points(line.get_xdata(), line.get_ydata())}
                for line in lines]
    return {"type": "line", **_planar(ax), "elements": elements}


def _scatter(ax: Any, _lines: list[Any]) -> dict[str, Any]:
    numbers = _converter_kind(ax.xaxis) is None and _converter_kind(ax.yaxis) is None
    elements = []
    for collection in ax.collections:
        offsets = collection.get_offsets()
        points = (_points(offsets[:, 0], offsets[:, 1]) if numbers else
                  [[_axis_value(ax.xaxis, x), _axis_value(ax.yaxis, y)] for x, y in offsets])
        elements.append({"label": _label(collection, "Series"), "points": points})
    return {"type": "scatter", **_planar(ax), "elements": elements}


def _bar(ax: Any, _lines: list[Any]) -> dict[str, Any]:
    from matplotlib.container import BarContainer

    horizontal = False
    elements = []
    for container in ax.containers:
        if not isinstance(container, BarContainer):
            continue
        horizontal = getattr(container, "orientation", None) == "horizontal"
        category_axis = ax.yaxis if horizontal else ax.xaxis
        group = _label(container, "Group")
        for rect in container.patches:
            x, y, width, height = rect.get_x(), rect.get_y(), rect.get_width(), rect.get_height()
            center, value = (y + height / 2, width) if horizontal else (x + width / 2, height)
            elements.append({"label": _category(category_axis, center), "value": _value(value), "group": group})
    labels = _labels(ax)
    if horizontal:  # x_label names the categories' axis, as for upright bars
        labels = {"x_label": labels["y_label"], "y_label": labels["x_label"],
                  "x_unit": labels["y_unit"], "y_unit": labels["x_unit"]}
    return {"type": "bar", "title": _title(ax), **labels, "elements": elements}


def _pie(ax: Any, _lines: list[Any]) -> dict[str, Any]:
    elements = [{"label": wedge.get_label(), "angle": round(abs(float(wedge.theta2 - wedge.theta1)), ROUND_DIGITS),
                 "radius": _value(wedge.r)}
                for wedge in ax.patches]
    return {"type": "pie", "title": _title(ax), "elements": elements}


def _box_and_whisker(ax: Any, lines: list[Any]) -> dict[str, Any]:
    found = _boxes(ax, lines)
    if found is None:
        return _unknown(ax, lines)
    horizontal, elements = found
    labels = _labels(ax)
    if horizontal:  # x_label names the boxes' axis, as for upright boxes
        labels = {"x_label": labels["y_label"], "y_label": labels["x_label"],
                  "x_unit": labels["y_unit"], "y_unit": labels["x_unit"]}
    return {"type": "box_and_whisker", "title": _title(ax), **labels, "elements": elements}


READERS = {"unknown": _unknown, "line": _line, "scatter": _scatter, "bar": _bar, "pie": _pie,
           "box_and_whisker": _box_and_whisker}


# ---- box plots ------------------------------------------------------------------------------

def _boxes(ax: Any, lines: list[Any]) -> tuple[bool, list[dict[str, Any]]] | None:
    """(horizontal, the boxes' elements) when ``ax`` holds a box plot (matplotlib's ``boxplot``:
    per box a closed rectangle, as a patch or a line, a median line across it, whiskers from its
    ends along its middle, and outliers as markers), or None."""
    if not ax.patches and not any(len(line.get_xdata()) == 5 for line in lines):
        return None  # no box (a plain line chart, not worth reading point by point)
    try:
        shapes = [_vertices(patch.get_path().vertices) for patch in ax.patches]
        segments = [(line, _vertices(zip(line.get_xdata(), line.get_ydata(), strict=True))) for line in lines]
    except (TypeError, ValueError):  # not numbers on both axes (categories, dates): no box plot
        return None
    if not shapes:  # boxes drawn as lines (boxplot's default): closed rectangles
        shapes = [points for _, points in segments if len(points) == 5 and points[0] == points[-1]]
        segments = [(line, points) for line, points in segments if points not in shapes]
    if not shapes:
        return None
    for horizontal in (False, True):
        elements = [_box(ax, shape, segments, horizontal) for shape in shapes]
        if all(element is not None for element in elements):
            return horizontal, [element for element in elements if element is not None]
    return None


def _box(ax: Any, shape: list[tuple[float, float]], segments: list[tuple[Any, list[tuple[float, float]]]],
         horizontal: bool) -> dict[str, Any] | None:
    """One box in (position, value) coordinates, or None if the lines do not fit it that way round."""
    def turn(point: tuple[float, float]) -> tuple[float, float]:
        return (point[1], point[0]) if horizontal else point

    positions = [turn(p)[0] for p in shape]
    values = [turn(p)[1] for p in shape]
    left, right, low, high = min(positions), max(positions), min(values), max(values)
    middle = (left + right) / 2
    median, whisker_low, whisker_high, outliers = None, low, high, []
    for line, points in segments:
        turned = [turn(p) for p in points]
        if line.get_linestyle() in ("None", "none", " ", ""):  # outliers: markers only
            outliers += [v for p, v in turned if math.isclose(p, middle)]
        elif len(turned) == 2 and turned[0][1] == turned[1][1] and low <= turned[0][1] <= high \
                and math.isclose(min(turned)[0], left) and math.isclose(max(turned)[0], right):
            median = turned[0][1]
        elif len(turned) == 2 and all(math.isclose(p, middle) for p, _ in turned):
            ends = sorted(v for _, v in turned)
            if ends[1] == low:
                whisker_low = ends[0]
            elif ends[0] == high:
                whisker_high = ends[1]
    if median is None:
        return None
    axis = ax.yaxis if horizontal else ax.xaxis
    return {"label": _category(axis, middle), "min": _value(whisker_low), "first_quartile": _value(low),
            "median": _value(median), "third_quartile": _value(high), "max": _value(whisker_high),
            "outliers": [_value(v) for v in outliers]}


def _vertices(points: Any) -> list[tuple[float, float]]:
    return [(float(x), float(y)) for x, y in points]


# ---- labels, axes and values ----------------------------------------------------------------

def _planar(ax: Any) -> dict[str, Any]:
    """What line and scatter charts say of their axes: title, labels and units, ticks and scales."""
    out: dict[str, Any] = {"title": _title(ax), **_labels(ax)}
    for name, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
        out[f"{name}_ticks"] = [_axis_value(axis, tick) if _converter_kind(axis) == "datetime" else _value(tick)
                                for tick in axis.get_ticklocs()]
        out[f"{name}_tick_labels"] = [label.get_text() for label in axis.get_ticklabels()]
        out[f"{name}_scale"] = _converter_kind(axis) or axis.get_scale()
    return out


def _labels(ax: Any) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name, text in (("x", ax.get_xlabel()), ("y", ax.get_ylabel())):
        out[f"{name}_label"] = _text(text)
        match = UNIT.search(text)
        out[f"{name}_unit"] = (match.group(1) or match.group(2)) if match else None
    return out


def _title(ax: Any) -> str | None:
    """The axes' title: the centred one, else the left or the right one."""
    for loc in ("center", "left", "right"):
        if ax.get_title(loc=loc):
            return str(ax.get_title(loc=loc))
    return None


def _text(text: str) -> str | None:
    return str(text) if text else None


def _label(artist: Any, word: str) -> str:
    """The artist's label; matplotlib's own for an unlabelled one (``_child3``) becomes ``Line 3``."""
    label = str(artist.get_label())
    if label.startswith("_"):
        digits = re.search(r"(\d+)$", label)
        return f"{word} {digits.group(1) if digits else ''}".strip()
    return label


def _converter_kind(axis: Any) -> str | None:
    """``datetime`` or ``categorical`` when the axis's units say so, else None."""
    converter = axis.get_converter() if hasattr(axis, "get_converter") else getattr(axis, "converter", None)
    from matplotlib.dates import DateConverter

    if isinstance(converter, DateConverter):  # pandas' too
        return "datetime"
    module = type(converter).__module__ if converter is not None else ""
    return {"matplotlib.dates": "datetime", "matplotlib.category": "categorical"}.get(module)


def _axis_value(axis: Any, number: Any) -> Any:
    """A position on ``axis`` as the user gave it: a date, a category's name, else the number."""
    import numpy

    kind = _converter_kind(axis)
    if numpy.ma.is_masked(number) or not math.isfinite(number):  # what matplotlib does not draw
        return None
    if kind == "datetime":
        from matplotlib.dates import num2date
        return num2date(float(number)).isoformat()
    if kind == "categorical":
        return _category(axis, float(number))
    return _value(number)


def _category(axis: Any, position: float) -> str:
    """The name of what sits at ``position`` on the axis: the nearest category or tick that was
    given a label (``set_xticks(..., labels)``, ``boxplot(labels=...)``, a pandas bar plot), within
    half the space between two of them (grouped bars sit beside theirs), else the number."""
    from matplotlib.ticker import FixedFormatter, FuncFormatter

    mapping = getattr(getattr(axis, "units", None), "_mapping", None)
    if isinstance(mapping, dict) and mapping:
        named = [(float(index), str(name)) for name, index in mapping.items()]
    elif isinstance(axis.get_major_formatter(), (FixedFormatter, FuncFormatter)):
        named = [(float(tick), str(label.get_text()))
                 for tick, label in zip(axis.get_ticklocs(), axis.get_ticklabels(), strict=False) if label.get_text()]
    else:
        named = []
    if named:
        spots = sorted(spot for spot, _ in named)
        reach = min((b - a for a, b in itertools.pairwise(spots)), default=math.inf) / 2
        spot, name = min(named, key=lambda item: abs(item[0] - position))
        if abs(spot - position) <= reach:
            return name
    return f"{position:g}"


def _points(xs: Any, ys: Any) -> list[list[Any]]:
    """``[[x, y], ...]`` as JSON; numbers in bulk (a line of a million points is common)."""
    import numpy

    x, y = numpy.ma.asarray(xs), numpy.ma.asarray(ys)
    if x.ndim == y.ndim == 1 and len(x) == len(y) and x.dtype.kind in "iuf" and y.dtype.kind in "iuf":
        pairs = numpy.ma.column_stack([x, y]).astype(float).filled(numpy.nan)  # masked: NaN, then null
        if numpy.isfinite(pairs).all():
            return pairs.tolist()  # type: ignore[no-any-return]
        return [[_value(a), _value(b)] for a, b in pairs.tolist()]
    if x.ndim == 1 and x.dtype.kind in "iuf":
        xs = x.astype(float).filled(numpy.nan)
    if y.ndim == 1 and y.dtype.kind in "iuf":
        ys = y.astype(float).filled(numpy.nan)
    return [[_value(a), _value(b)] for a, b in zip(xs, ys, strict=False)]


def _value(value: Any) -> Any:
    """A plotted value as JSON: numbers as numbers (NaN and infinities as null), dates as ISO 8601."""
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if type(value).__module__ == "numpy":
        if getattr(value, "dtype", None) is not None and value.dtype.kind == "M":  # numpy.datetime64
            return str(value.astype("datetime64[s]"))
        if hasattr(value, "item"):
            value = value.item()
    if hasattr(value, "isoformat"):  # pandas.Timestamp
        return value.isoformat()
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return float(value) if math.isfinite(value) else None
    return str(value)
