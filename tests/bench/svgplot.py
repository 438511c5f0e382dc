"""A line chart as a standalone SVG file, for the figures docs/ shows
(Debian's python3 has no plotting library without extra packages).

line_chart(path, title, xlabel, ylabel, xs, series) draws each series
(name, ys, colour) over xs with axes, ticks and a legend.
"""
import html


def _ticks(lo, hi, n=5):
    if hi <= lo:
        hi = lo + 1
    step = (hi - lo) / n
    return [lo + i * step for i in range(n + 1)]


def line_chart(path, title, xlabel, ylabel, xs, series, width=640, height=400):
    """Writes the chart to path. series: [(name, ys, colour)], ys as long as
    xs (None for a missing point)."""
    ml, mr, mt, mb = 70, 20, 40, 60
    pw, ph = width - ml - mr, height - mt - mb
    vals = [y for _, ys, _ in series for y in ys if y is not None]
    ylo, yhi = min(vals), max(vals)
    pad = (yhi - ylo) * 0.08 or 0.01
    ylo, yhi = ylo - pad, yhi + pad
    xlo, xhi = min(xs), max(xs)
    if xhi == xlo:
        xhi = xlo + 1

    def px(x):
        return ml + (x - xlo) / (xhi - xlo) * pw

    def py(y):
        return mt + (1 - (y - ylo) / (yhi - ylo)) * ph

    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" '
           'font-family="sans-serif" font-size="12">' % (width, height),
           '<rect width="100%" height="100%" fill="white"/>',
           '<text x="%d" y="22" font-size="14" text-anchor="middle">%s</text>'
           % (width // 2, html.escape(title))]
    for t in _ticks(ylo, yhi):
        out.append('<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#ddd"/>'
                   % (ml, ml + pw, py(t), py(t)))
        out.append('<text x="%d" y="%.1f" text-anchor="end">%.3f</text>'
                   % (ml - 6, py(t) + 4, t))
    for x in xs:
        out.append('<text x="%.1f" y="%d" text-anchor="middle">%s</text>'
                   % (px(x), mt + ph + 18, x))
    out.append('<rect x="%d" y="%d" width="%d" height="%d" fill="none" '
               'stroke="black"/>' % (ml, mt, pw, ph))
    out.append('<text x="%d" y="%d" text-anchor="middle">%s</text>'
               % (ml + pw // 2, height - 18, html.escape(xlabel)))
    out.append('<text x="16" y="%d" text-anchor="middle" '
               'transform="rotate(-90 16 %d)">%s</text>'
               % (mt + ph // 2, mt + ph // 2, html.escape(ylabel)))
    for k, (name, ys, colour) in enumerate(series):
        pts = ["%.1f,%.1f" % (px(x), py(y)) for x, y in zip(xs, ys)
               if y is not None]
        out.append('<polyline fill="none" stroke="%s" stroke-width="2" '
                   'points="%s"/>' % (colour, " ".join(pts)))
        for p in pts:
            x, y = p.split(",")
            out.append('<circle cx="%s" cy="%s" r="3" fill="%s"/>'
                       % (x, y, colour))
        ly = mt + ph - 12 - 16 * (len(series) - 1 - k)  # bottom left
        out.append('<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="%s" '
                   'stroke-width="2"/>' % (ml + 10, ml + 30, ly, ly, colour))
        out.append('<text x="%d" y="%d">%s</text>'
                   % (ml + 36, ly + 4, html.escape(name)))
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")
