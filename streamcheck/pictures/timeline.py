"""A PNG timeline of a recorded run, readable at a glance.

One lane per host thread and per stream; a box per operation labelled with its
kernel name; the racing pair in red with the buffer it races on; record -> wait
edges as arrows; and a dashed red arrow from the producer's end to the consumer's
start: the wait the program is missing. Drawn from the same model as the Perfetto
export (timeline_model.build_model), so both show the same times.

matplotlib is imported here, lazily, and drawn with the Agg canvas directly: no
pyplot, so the caller's interactive backend is left alone.
"""
from __future__ import annotations

import os
import textwrap
from typing import Optional

from ..atomic_files import write_file
from .timeline_model import ISSUE_ORDER, MICROSECONDS, STEPS, Model, Slice, build_model

# Colours: quiet for ordinary work so the race stands out.
_FACE = {"kernel": "#a6cee3", "copy": "#b2df8a", "record": "#d9d9d9", "wait": "#d9d9d9",
         "free": "#cab2d6", "sync": "#fdbf6f", "host": "#e0e0e0", "captured": "#f2f2f2", "graph": "#deebf7"}
_HATCH = {"sync": "//", "captured": ".."}  # captured: recorded into a graph, ran at its launches
_RACE = "#d7191c"
_EDGE = "#4d4d4d"
_SMALL = ("record", "wait")  # drawn as short boxes: they order work, they do no work
_LABEL_IN = 2.3  # inches left of the plot for lane names
_BOX_IN = 1.1  # inches per box (sim step), so an 8-point kernel name fits inside
_MAX_IN = 22.0
_MAX_BOXES = (_MAX_IN - _LABEL_IN - 0.3) / _BOX_IN  # wider runs zoom to the first race


def render_timeline(source, path, title: Optional[str] = None, *, window=None, dpi: int = 120) -> dict:
    """Draw `source` (a Device, a Trace, or a mapping as timeline_model.build_model takes) to a PNG
    at `path`. `window`: (start, end) on the run's clock; by default the whole run, or
    the first race's neighbourhood when the run is long. Returns what was drawn:
    lanes, boxes, highlighted (racing) operations, arrows and missing-edge arrows."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.patches import FancyArrowPatch, Rectangle
    except ImportError:  # pragma: no cover - depends on the environment
        raise ImportError("render_timeline needs matplotlib: pip install 'streamcheck[plot]'") from None

    model = source if isinstance(source, Model) else build_model(source)
    x0, x1 = _window(model, window)
    shown = {i: s for i, s in model.slices.items() if s.end > x0 and s.start < x1}
    lanes = [lane for lane in model.lanes if any(s.lane == lane.key for s in shown.values())] or list(model.lanes)
    row = {lane.key: len(lanes) - 1 - n for n, lane in enumerate(lanes)}  # first lane on top

    # Room for the longest lane name (about 0.085 in per character at the label font size).
    label_in = max(_LABEL_IN, 0.3 + 0.085 * max((len(lane.label) for lane in lanes), default=0))
    width = min(max(8.0, label_in + 0.3 + _BOX_IN * (x1 - x0) * _units_per_box(model)), _MAX_IN + label_in - _LABEL_IN)
    footer_lines = _footer(model, int(width * 72 * 0.97 / (0.6 * 8)))
    height = 1.5 + 0.8 * len(lanes) + 0.22 * len(footer_lines)
    fig = Figure(figsize=(width, height), dpi=dpi)
    FigureCanvasAgg(fig)
    bottom = (0.55 + 0.22 * len(footer_lines)) / height
    fig.subplots_adjust(left=label_in / width, right=1 - 0.3 / width, top=1 - 0.85 / height, bottom=bottom)
    ax = fig.add_subplot(1, 1, 1)
    ax.set_xlim(x0, x1)
    ax.set_ylim(-0.6, len(lanes) - 0.4)
    ax.set_yticks([row[lane.key] for lane in lanes])
    ax.set_yticklabels([lane.label for lane in lanes], fontsize=9)
    ax.set_xlabel(_axis_label(model), fontsize=9)
    ax.tick_params(axis="x", labelsize=8)
    for y in range(len(lanes)):
        ax.axhline(y, color="#eeeeee", zorder=0, linewidth=8)
    for spine in ("top", "right", "left"):
        ax.spines[spine].set_visible(False)
    px_per_unit = (width * (1 - (label_in + 0.3) / width)) * dpi / max(x1 - x0, 1e-9)

    if model.clock == MICROSECONDS:
        ax.ticklabel_format(axis="x", style="plain", useOffset=False)

    labels = _Labels(ax)
    for d in model.delays:
        if d.end > x0 and d.start < x1 and d.lane in row:
            y = row[d.lane]
            ax.add_patch(Rectangle((d.start, y - 0.2), d.duration, 0.4, facecolor="#f0f0f0", edgecolor="#999999",
                                   hatch="..", linewidth=0.6, zorder=1))
            if len(d.name) * 0.6 * 7 * dpi / 72 <= _visible(d, x0, x1) * px_per_unit:
                labels.want(_DELAY, [(d.name, _middle(d, x0, x1), y, "center", "center")], fontsize=7,
                            color="#555555")

    roles = model.race_roles()
    summary = {"path": str(path), "lanes": [lane.label for lane in lanes], "boxes": [], "highlighted": [],
               "arrows": [], "missing": [], "window": (x0, x1),
               "delays": [{"index": d.index, "lane": _label(model, d.lane), "start": d.start, "end": d.end}
                          for d in model.delays if d.end > x0 and d.start < x1 and d.lane in row]}

    for index in sorted(shown):
        s = shown[index]
        y = row[s.lane]
        small = s.category in _SMALL
        h = _height(s)
        racing = roles.get(index, [])
        face = _RACE if racing else _FACE.get(s.category, "#e0e0e0")
        untimed = model.clock == MICROSECONDS and not s.measured
        ax.add_patch(Rectangle((s.start, y - h / 2), s.duration, h, facecolor=face, edgecolor=_EDGE,
                               linewidth=1.4 if racing else 0.6, hatch=_HATCH.get(s.category),
                               linestyle="--" if untimed else "-",
                               zorder=1 if s.category == "graph" else 2))  # a launch frames its nodes
        label = _box_label(s, racing)
        lines = label.split("\n")
        size = 7 if small or len(lines) > 2 else 8
        fits = len(max(lines, key=len)) * 0.6 * size * dpi / 72 <= _visible(s, x0, x1) * px_per_unit
        middle, left, right = _middle(s, x0, x1), max(s.start, x0), min(s.end, x1)
        if racing:
            if fits:
                labels.want(_RACING_INSIDE, [(label, middle, y, "center", "center")], fontsize=size,
                            color="white", fontweight="bold")
            else:
                # Above the box, else under it; centred, else aligned with an end to stay in the plot.
                flat = label.replace("\n", " ")
                labels.want(_RACING_OUTSIDE, [(flat, x, y + side * (h / 2 + 0.04), align,
                                               "bottom" if side > 0 else "top")
                                              for side in (1, -1)
                                              for x, align in ((middle, "center"), (left, "left"), (right, "right"))],
                            fontsize=8, color=_RACE, fontweight="bold")
            for located, role in racing:
                summary["highlighted"].append({"index": index, "lane": _label(model, s.lane), "name": s.name,
                                               "role": role, "kind": located.race.kind,
                                               "buffer": located.race.buffer, "label": label})
        elif small or not fits:
            # Under the box (else above it), when it is not much wider than the box: the whole
            # name, else its last part ("record …fork_a").
            room = 1.6 * _visible(s, x0, x1) * px_per_unit
            texts = [t for t in dict.fromkeys((label, _short(label))) if len(t) * 0.6 * 7 * dpi / 72 <= room]
            labels.want(_UNDER, [(t, middle, y + side * (h / 2 + 0.04), "center", "bottom" if side > 0 else "top")
                                 for t in texts for side in (-1, 1)], fontsize=7, color="#333333")
        else:
            # A sync's label sits on a patch of its colour, above the hatching.
            box = {"boxstyle": "square,pad=0.1", "facecolor": face, "edgecolor": "none"} if s.category == "sync" \
                else None
            labels.want(_INSIDE, [(label, middle, y, "center", "center")], fontsize=8, bbox=box)
        summary["boxes"].append({"index": index, "lane": _label(model, s.lane), "name": s.name,
                                 "start": s.start, "end": s.end, "race": bool(racing)})

    missing_labels: dict = {}  # (producer, consumer lane) -> (words, buffers, the arrow's ends)
    for edge in model.edges:
        src, dst = shown.get(edge.src), shown.get(edge.dst)
        if src is None or dst is None:  # an end outside the window
            continue
        if edge.kind == "missing":
            # From the producer's end to the consumer's start, leaving and entering the
            # boxes on the facing edges so the arrow never hides on a red box.
            ys, yd = row[src.lane], row[dst.lane]
            toward = -1 if ys > yd else 1
            start = (src.end, ys + toward * _height(src) / 2)
            end = (dst.start, yd - toward * _height(dst) / 2)
            ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=18, color=_RACE,
                                         linestyle=(0, (4, 3)), linewidth=2.0, zorder=5, shrinkA=0, shrinkB=4))
            # Where the wait belongs: right before the consumer starts.
            ax.plot([dst.start, dst.start], [yd - 0.42, yd + 0.42], color=_RACE, linewidth=3, zorder=5,
                    solid_capstyle="butt")
            # Missing edges from one producer into one lane share a label: "missing wait (Y, x)".
            group = missing_labels.setdefault((edge.src, dst.lane), (edge.label.split(":")[0], [], start, end))
            group[1].append(edge.race.buffer if edge.race else "")
            summary["missing"].append({"from": (_label(model, src.lane), src.end),
                                       "to": (_label(model, dst.lane), dst.start), "label": edge.label})
        elif edge.kind == "event":
            # Sync edges (work -> host synchronize) stay in the Perfetto export: here they
            # would cross every lane and bury the race.
            start, end = (src.end, row[src.lane]), (dst.start, row[dst.lane])
            ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=13, color=_EDGE,
                                         linewidth=1.3, zorder=3, shrinkA=0, shrinkB=2))
            summary["arrows"].append({"kind": edge.kind, "label": edge.label,
                                      "from": (_label(model, src.lane), start[0]),
                                      "to": (_label(model, dst.lane), end[0])})

    for words, buffers, start, end in missing_labels.values():
        names = ", ".join(b for b in dict.fromkeys(buffers) if b)
        text = f"{words} ({names})" if names else words
        # Along the arrow, at the first spot clear of the labels already placed.
        spots = [(start[0] + at * (end[0] - start[0]), start[1] + at * (end[1] - start[1]) + lift)
                 for lift in (0.0, 0.3, -0.3) for at in (0.5, 0.3, 0.7, 0.15, 0.85)]
        labels.want(_MISSING, [(text, x, y, "center", "center") for x, y in spots], fontsize=9, color=_RACE,
                    fontweight="bold", zorder=6,
                    bbox={"boxstyle": "round,pad=0.25", "facecolor": "white", "edgecolor": _RACE, "linewidth": 1})
    labels.place()

    summary["title"] = title if title is not None else _title(model)
    texts = [fig.suptitle(summary["title"], fontsize=11, fontweight="bold", x=0.5, y=1 - 0.12 / height, va="top")]
    for n, (line, color) in enumerate(footer_lines):
        texts.append(fig.text(0.01, (0.1 + 0.22 * (len(footer_lines) - 1 - n)) / height, line, fontsize=8,
                              color=color, family="monospace"))
    if isinstance(path, (str, os.PathLike)):
        if not os.path.splitext(path)[1]:
            path = f"{os.fspath(path)}.png"  # as savefig names a file without a suffix
        # The whole PNG or none, even if the process is killed while matplotlib writes it.
        write_file(path, lambda temporary: fig.savefig(temporary, dpi=dpi))
    else:  # a file object the caller opened
        fig.savefig(path, dpi=dpi)
    summary["size"] = tuple(fig.canvas.get_width_height())  # pixels, as written
    # Every text in the picture, measured by matplotlib as drawn: (text, (x0, y0, x1, y1)) in pixels.
    ticks = [tick.label1 for tick in ax.xaxis.get_major_ticks() if x0 <= tick.get_loc() <= x1]  # those drawn
    texts += [ax.xaxis.label] + ticks + ax.get_yticklabels() + labels.placed
    summary["labels"] = [(t.get_text(), tuple(labels.extent(t).extents)) for t in texts
                         if t.get_visible() and t.get_text()]
    return summary


# Labels are placed in this order, each clear of those before it: what a race needs first.
_RACING_INSIDE, _MISSING, _RACING_OUTSIDE, _INSIDE, _UNDER, _DELAY = range(6)


class _Labels:
    """The labels inside the plot, placed so that none overlaps another or leaves the plot: in
    order of importance, each takes the first of its candidate (text, x, y, ha, va) whose extent,
    as matplotlib measures it, is clear of those placed; one with none is left out (the
    Perfetto export keeps every name)."""

    def __init__(self, ax):
        self.ax = ax
        self.renderer = ax.figure.canvas.get_renderer()
        self.wanted: list = []
        self.placed: list = []  # the Text artists drawn

    def want(self, rank: int, candidates: list, **style) -> None:
        if candidates:
            self.wanted.append((rank, len(self.wanted), candidates, style))

    def extent(self, artist):
        """Pixels the text covers, with its background patch."""
        from matplotlib.transforms import Bbox

        box = artist.get_window_extent(self.renderer)
        patch = artist.get_bbox_patch()
        if patch is None:
            return box
        artist.update_bbox_position_size(self.renderer)
        return Bbox.union([box, patch.get_window_extent(self.renderer)])

    def place(self) -> None:
        frame = self.ax.get_window_extent(self.renderer)
        taken = []
        for _rank, _order, candidates, style in sorted(self.wanted, key=lambda w: w[:2]):
            artist = self.ax.text(0, 0, "", zorder=style.pop("zorder", 4), clip_on=True, **style)
            for text, x, y, ha, va in candidates:
                artist.set_text(text)
                artist.set_position((x, y))
                artist.set_horizontalalignment(ha)
                artist.set_verticalalignment(va)
                box = self.extent(artist)
                inside = (frame.x0 <= box.x0 + 0.5 and box.x1 - 0.5 <= frame.x1
                          and frame.y0 <= box.y0 + 0.5 and box.y1 - 0.5 <= frame.y1)
                if inside and not any(_overlap(box, other) for other in taken):
                    taken.append(box)
                    self.placed.append(artist)
                    break
            else:
                artist.remove()


def _overlap(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def _short(label: str) -> str:
    """`record layers.0.input_layernorm.fork_a` -> `record …fork_a`: the verb and the name's last part."""
    verb, _, name = label.rpartition(" ")
    tail = name.rsplit(".", 1)[-1]
    return f"{verb} …{tail}".strip() if tail != name else label


def _visible(s: Slice, x0: float, x1: float) -> float:
    return max(min(s.end, x1) - max(s.start, x0), 0.0)


def _middle(s: Slice, x0: float, x1: float) -> float:
    """Where a label goes: the middle of the part of the box inside the window."""
    return (max(s.start, x0) + min(s.end, x1)) / 2


def _height(s: Slice) -> float:
    if s.category == "graph":
        return 0.8  # behind the nodes it ran on the same stream
    return 0.28 if s.category in _SMALL else 0.62


def _label(model: Model, key: tuple) -> str:
    return model.lane(key).label


def _units_per_box(model: Model) -> float:
    """Scale for the figure width: sim steps and issue-order units are one box each."""
    if model.clock in (STEPS, ISSUE_ORDER):
        return 1.0
    durations = sorted(s.duration for s in model.slices.values() if s.measured) or [1.0]
    return 1.0 / max(durations[len(durations) // 2], 1e-9)


def _window(model: Model, window) -> tuple:
    if window is not None:
        start, end = float(window[0]), float(window[1])
        if not end > start:
            raise ValueError(f"render_timeline: window must be (start, end) with end > start, got {window!r}")
        return start, end
    per_box = _units_per_box(model)
    starts = [s.start for s in model.slices.values()] or [0.0]
    ends = [s.end for s in model.slices.values()] or [1.0]
    lo, hi = min(starts), max(ends)
    fit = _MAX_BOXES / per_box  # the longest stretch whose labels still fit
    pair = _focus(model)
    a = min((s.start for s in pair), default=lo)
    b = max((s.end for s in pair), default=hi)
    if hi - lo <= fit or not pair or b - a >= 0.5 * (hi - lo):
        a, b = lo, hi
    else:
        # A long run: zoom to the first race, filling the rest with its neighbourhood.
        room = max(fit - (b - a), 0.0)
        a, b = a - room / 2, b + room / 2
        if a < lo:
            a, b = lo, min(hi, b + (lo - a))
        if b > hi:
            a, b = max(lo, a - (b - hi)), hi
    pad = max(0.02 * (b - a), 0.15 / per_box)
    return a - pad, b + pad


def _focus(model: Model) -> list:
    """The slices a zoomed picture must show: the first race's pair, and the edge the
    consumer did wait on (its record, and the work just before that record)."""
    if not model.races:
        return []
    located = model.races[0]
    focus = [model.slices[i] for i in (located.first, located.second) if i in model.slices]
    consumer = model.slices.get(located.second)
    if consumer is None:
        return focus
    waited = [e for e in model.edges if e.kind == "event" and e.dst < consumer.index and e.src in model.slices
              and e.dst in model.slices and model.slices[e.dst].lane == consumer.lane]
    if waited:
        record = model.slices[max(waited, key=lambda e: e.dst).src]
        before = [s for s in model.slices.values() if s.lane == record.lane and s.index < record.index]
        focus.append(record)
        if before:
            focus.append(max(before, key=lambda s: s.index))
    return focus


def _box_label(s: Slice, racing) -> str:
    if not racing:
        return s.name
    parts = []
    for located, role in racing:
        access = located.race.first if role == "first" else located.race.second
        parts.append(f"{'writes' if access.write else 'reads'} {located.race.buffer}")
    return "\n".join([s.name] + list(dict.fromkeys(parts)))


def _axis_label(model: Model) -> str:
    if model.clock == STEPS:
        return "sim scheduler step (1 step = 1 µs in the Perfetto export)"
    if model.clock == MICROSECONDS:
        return "time (µs, measured with CUDA events; dashed outline: not timed, placed by issue order)"
    return "operations in issue order (no times recorded)"


def _title(model: Model) -> str:
    if not model.races:
        streams = sum(1 for lane in model.lanes if lane.key[0] == "stream")
        return f"no races: {len(model.slices)} operations on {streams} stream{'s' if streams != 1 else ''}"
    located = model.races[0]
    race = located.race
    verb = "writes" if race.second.write else "reads"
    struck = model.struck(located)
    if struck:
        how = f"before `{race.first.name}` ({race.first.actor}) finished"
    elif located.first in model.slices and model.slices[located.first].category == "captured":
        how = (f"unordered after `{race.first.name}` ({race.first.actor}) inside a CUDA graph: "
               "any launch may strike")
    else:
        how = f"unordered after `{race.first.name}` ({race.first.actor}); it did not strike in this run"
    more = f"  (+{len(model.races) - 1} more)" if len(model.races) > 1 else ""
    return (f"{race.kind} race on `{race.buffer}`{more}\n"
            f"`{race.second.name}` ({race.second.actor}) {verb} {race.buffer} {how}")


def _footer(model: Model, chars: int) -> list:
    """(line, colour) pairs under the plot: the first race's missing edge and its fix."""
    if not model.races:
        return []
    race = model.races[0].race
    lines = [(line, _RACE) for line in textwrap.wrap(f"missing edge: {race.missing_edge}", chars)]
    lines += [(line, "#333333") for line in textwrap.wrap(f"fix: {race.hint}", chars)]
    return lines
