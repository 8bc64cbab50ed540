"""A dependency-free PNG line plot (zlib + struct): axes, ticks, tick labels, two series."""

import math
import struct
import zlib

# 5x7 bitmap glyphs for the characters the plots use.
_FONT = {
    "0": ["01110", "10001", "10011", "10101", "11001", "10001", "01110"],
    "1": ["00100", "01100", "00100", "00100", "00100", "00100", "01110"],
    "2": ["01110", "10001", "00001", "00010", "00100", "01000", "11111"],
    "3": ["11110", "00001", "00001", "01110", "00001", "00001", "11110"],
    "4": ["00010", "00110", "01010", "10010", "11111", "00010", "00010"],
    "5": ["11111", "10000", "11110", "00001", "00001", "10001", "01110"],
    "6": ["00110", "01000", "10000", "11110", "10001", "10001", "01110"],
    "7": ["11111", "00001", "00010", "00100", "01000", "01000", "01000"],
    "8": ["01110", "10001", "10001", "01110", "10001", "10001", "01110"],
    "9": ["01110", "10001", "10001", "01111", "00001", "00010", "01100"],
    ".": ["00000", "00000", "00000", "00000", "00000", "01100", "01100"],
    "-": ["00000", "00000", "00000", "11111", "00000", "00000", "00000"],
    "/": ["00001", "00010", "00010", "00100", "01000", "01000", "10000"],
    "(": ["00010", "00100", "01000", "01000", "01000", "00100", "00010"],
    ")": ["01000", "00100", "00010", "00010", "00010", "00100", "01000"],
    ",": ["00000", "00000", "00000", "00000", "01100", "00100", "01000"],
    ":": ["00000", "01100", "01100", "00000", "01100", "01100", "00000"],
    "=": ["00000", "00000", "11111", "00000", "11111", "00000", "00000"],
    " ": ["00000"] * 7,
    "A": ["01110", "10001", "10001", "11111", "10001", "10001", "10001"],
    "B": ["11110", "10001", "10001", "11110", "10001", "10001", "11110"],
    "C": ["01110", "10001", "10000", "10000", "10000", "10001", "01110"],
    "D": ["11110", "10001", "10001", "10001", "10001", "10001", "11110"],
    "E": ["11111", "10000", "10000", "11110", "10000", "10000", "11111"],
    "F": ["11111", "10000", "10000", "11110", "10000", "10000", "10000"],
    "G": ["01110", "10001", "10000", "10111", "10001", "10001", "01111"],
    "H": ["10001", "10001", "10001", "11111", "10001", "10001", "10001"],
    "I": ["01110", "00100", "00100", "00100", "00100", "00100", "01110"],
    "K": ["10001", "10010", "10100", "11000", "10100", "10010", "10001"],
    "L": ["10000", "10000", "10000", "10000", "10000", "10000", "11111"],
    "M": ["10001", "11011", "10101", "10101", "10001", "10001", "10001"],
    "N": ["10001", "11001", "10101", "10011", "10001", "10001", "10001"],
    "O": ["01110", "10001", "10001", "10001", "10001", "10001", "01110"],
    "P": ["11110", "10001", "10001", "11110", "10000", "10000", "10000"],
    "R": ["11110", "10001", "10001", "11110", "10100", "10010", "10001"],
    "S": ["01111", "10000", "10000", "01110", "00001", "00001", "11110"],
    "T": ["11111", "00100", "00100", "00100", "00100", "00100", "00100"],
    "U": ["10001", "10001", "10001", "10001", "10001", "10001", "01110"],
    "V": ["10001", "10001", "10001", "10001", "10001", "01010", "00100"],
    "W": ["10001", "10001", "10001", "10101", "10101", "10101", "01010"],
    "X": ["10001", "10001", "01010", "00100", "01010", "10001", "10001"],
    "Y": ["10001", "10001", "01010", "00100", "00100", "00100", "00100"],
}


class Canvas:
    def __init__(self, w, h, bg=(255, 255, 255)):
        self.w, self.h = w, h
        self.px = [bytearray(bytes(bg) * w) for _ in range(h)]

    def set(self, x, y, c):
        if 0 <= x < self.w and 0 <= y < self.h:
            self.px[y][3 * x:3 * x + 3] = bytes(c)

    def line(self, x0, y0, x1, y1, c, width=1):
        x0, y0, x1, y1 = int(round(x0)), int(round(y0)), int(round(x1)), int(round(y1))
        dx, dy = abs(x1 - x0), -abs(y1 - y0)
        sx, sy = (1 if x0 < x1 else -1), (1 if y0 < y1 else -1)
        err = dx + dy
        r = width // 2
        while True:
            for ox in range(-r, width - r):
                for oy in range(-r, width - r):
                    self.set(x0 + ox, y0 + oy, c)
            if x0 == x1 and y0 == y1:
                break
            e2 = 2 * err
            if e2 >= dy:
                err += dy
                x0 += sx
            if e2 <= dx:
                err += dx
                y0 += sy

    def text(self, x, y, s, c=(0, 0, 0), scale=2):
        for ch in s.upper():
            g = _FONT.get(ch, _FONT[" "])
            for gy, row in enumerate(g):
                for gx, bit in enumerate(row):
                    if bit == "1":
                        for a in range(scale):
                            for b in range(scale):
                                self.set(x + gx * scale + a, y + gy * scale + b, c)
            x += 6 * scale

    def text_width(self, s, scale=2):
        return len(s) * 6 * scale

    def text_vertical(self, x, y, s, c=(0, 0, 0), scale=2):
        """Text rotated 90 degrees counter-clockwise, starting at the bottom (x, y)."""
        for ch in s.upper():
            g = _FONT.get(ch, _FONT[" "])
            for gy, row in enumerate(g):
                for gx, bit in enumerate(row):
                    if bit == "1":
                        for a in range(scale):
                            for b in range(scale):
                                self.set(x + gy * scale + b, y - gx * scale - a, c)
            y -= 6 * scale

    def save(self, path):
        raw = b"".join(b"\x00" + bytes(row) for row in self.px)

        def chunk(tag, data):
            return (struct.pack(">I", len(data)) + tag + data +
                    struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF))

        with open(path, "wb") as f:
            f.write(b"\x89PNG\r\n\x1a\n")
            f.write(chunk(b"IHDR", struct.pack(">IIBBBBB", self.w, self.h, 8, 2, 0, 0, 0)))
            f.write(chunk(b"IDAT", zlib.compress(raw, 9)))
            f.write(chunk(b"IEND", b""))


def nice_ticks(lo, hi, n=6):
    span = hi - lo
    if span <= 0:
        return [lo]
    raw = span / n
    mag = 10 ** math.floor(math.log10(raw))
    step = min((m * mag for m in (1, 2, 2.5, 5, 10)), key=lambda s: abs(s - raw))
    start = math.ceil(lo / step) * step
    ticks, t = [], start
    while t <= hi + 1e-9 * span:
        ticks.append(round(t, 10))
        t += step
    return ticks


def fmt_tick(v):
    if abs(v) >= 1e6:
        return ("%.2f" % (v / 1e6)).rstrip("0").rstrip(".") + "M"
    if abs(v) >= 1e3:
        return ("%.0fK" % (v / 1e3))
    if v == int(v):
        return "%d" % v
    return ("%.2f" % v).rstrip("0")


def line_plot(path, series, title, xlabel, ylabel, w=900, h=540, ylim=None):
    """series: list of (xs, ys, rgb, width). Writes an RGB PNG."""
    c = Canvas(w, h)
    left, right, top, bottom = 90, 30, 50, 70
    xs_all = [x for s in series for x in s[0]]
    ys_all = [y for s in series for y in s[1]]
    x0, x1 = min(xs_all), max(xs_all)
    y0, y1 = ylim if ylim else (min(ys_all), max(ys_all))
    if x1 == x0:
        x1 = x0 + 1
    if y1 == y0:
        y1 = y0 + 1
    pw, ph = w - left - right, h - top - bottom

    def X(v):
        return left + (v - x0) / (x1 - x0) * pw

    def Y(v):
        return top + (1 - (min(max(v, y0), y1) - y0) / (y1 - y0)) * ph

    grid, axis = (225, 225, 225), (0, 0, 0)
    for t in nice_ticks(x0, x1):
        c.line(X(t), top, X(t), top + ph, grid)
        c.line(X(t), top + ph, X(t), top + ph + 6, axis)
        s = fmt_tick(t)
        c.text(int(X(t) - c.text_width(s) / 2), top + ph + 12, s)
    for t in nice_ticks(y0, y1):
        c.line(left, Y(t), left + pw, Y(t), grid)
        c.line(left - 6, Y(t), left, Y(t), axis)
        s = fmt_tick(t)
        c.text(left - 10 - c.text_width(s), int(Y(t)) - 7, s)
    c.line(left, top, left, top + ph, axis)
    c.line(left, top + ph, left + pw, top + ph, axis)
    for xs, ys, rgb, width in series:
        for i in range(1, len(xs)):
            c.line(X(xs[i - 1]), Y(ys[i - 1]), X(xs[i]), Y(ys[i]), rgb, width)
    c.text(int(left + pw / 2 - c.text_width(title) / 2), 15, title)
    c.text(int(left + pw / 2 - c.text_width(xlabel) / 2), h - 28, xlabel)
    c.text_vertical(12, int(top + ph / 2 + c.text_width(ylabel) / 2), ylabel)
    c.save(path)
