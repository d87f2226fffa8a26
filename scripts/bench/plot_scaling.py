#!/usr/bin/env python3
"""Draws the admission scaling curves as a log-log SVG (Python stdlib only).

    plot_scaling.py scaling.csv out.svg

Input: the CSV that `ADMISSION_SCALING=1 cargo bench --bench admission` prints
(series,x,in_bytes,out_bytes,review_us,floor_us). One panel per series (secrets, containers,
pod bytes), both axes logarithmic; each panel draws the admission time, its floor (parse +
serialise of the request and of the reply) and a dotted slope-1 line through the admission's
last point, so linear growth reads as "parallel to the dotted line". The log-log slope of the
admission time (least squares) is printed in each panel's title and on stdout.
"""

import csv
import math
import sys

SERIES = [
    ("secrets", "secrets in the pod", "x"),
    ("containers", "containers in the pod", "x"),
    ("pod_bytes", "review size, bytes", "in_bytes"),
]
W, H = 330, 300  # one panel
ML, MR, MT, MB = 58, 12, 40, 44


def slope(xs, ys):
    lx = [math.log10(x) for x in xs]
    ly = [math.log10(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    den = sum((a - mx) ** 2 for a in lx)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / den if den else float("nan")


def ticks(lo, hi):
    return [10.0**e for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)]


def label(v):
    for unit, f in (("M", 1e6), ("k", 1e3)):
        if v >= f:
            return "%g%s" % (v / f, unit)
    return "%g" % v


def panel(out, ox, title, xlabel, pts):
    xs = [p[0] for p in pts]
    ys = [p[1] for p in pts] + [p[2] for p in pts]
    xt, yt = ticks(min(xs), max(xs)), ticks(min(ys), max(ys))
    x0, x1 = math.log10(xt[0]), math.log10(xt[-1])
    y0, y1 = math.log10(yt[0]), math.log10(yt[-1])
    pw, ph = W - ML - MR, H - MT - MB

    def px(x):
        return ox + ML + (math.log10(x) - x0) / (x1 - x0) * pw

    def py(y):
        return MT + ph - (math.log10(y) - y0) / (y1 - y0) * ph

    k = slope(xs, [p[1] for p in pts])
    out.append('<text x="%.1f" y="18" font-size="13" text-anchor="middle">%s (slope %.2f)</text>'
               % (ox + ML + pw / 2, title, k))
    out.append('<rect x="%.1f" y="%d" width="%d" height="%d" fill="none" stroke="#888"/>'
               % (ox + ML, MT, pw, ph))
    for t in xt:
        out.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#eee"/>' % (px(t), MT, px(t), MT + ph))
        out.append('<text x="%.1f" y="%d" font-size="10" text-anchor="middle">%s</text>'
                   % (px(t), MT + ph + 14, label(t)))
    for t in yt:
        out.append('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#eee"/>'
                   % (ox + ML, py(t), ox + ML + pw, py(t)))
        out.append('<text x="%.1f" y="%.1f" font-size="10" text-anchor="end">%s</text>'
                   % (ox + ML - 4, py(t) + 3, label(t)))
    out.append('<text x="%.1f" y="%d" font-size="11" text-anchor="middle">%s</text>'
               % (ox + ML + pw / 2, H - 8, xlabel))
    out.append('<text x="%.1f" y="%.1f" font-size="11" text-anchor="middle" '
               'transform="rotate(-90 %.1f %.1f)">µs per admission</text>'
               % (ox + 14, MT + ph / 2, ox + 14, MT + ph / 2))
    # Slope 1 through the admission's last point, clipped to the panel.
    xl, yl = pts[-1][0], pts[-1][1]
    xa = max(xt[0], xl * yt[0] / yl)
    out.append('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#999" stroke-dasharray="2,3"/>'
               % (px(xa), py(yl * xa / xl), px(xl), py(yl)))
    for idx, colour in ((1, "#c0392b"), (2, "#2471a3")):
        path = " ".join("%s%.1f,%.1f" % ("M" if i == 0 else "L", px(p[0]), py(p[idx])) for i, p in enumerate(pts))
        out.append('<path d="%s" fill="none" stroke="%s" stroke-width="1.8"/>' % (path, colour))
        for p in pts:
            out.append('<circle cx="%.1f" cy="%.1f" r="2.5" fill="%s"/>' % (px(p[0]), py(p[idx]), colour))
    return k


def main():
    src, dst = sys.argv[1:3]
    rows = list(csv.DictReader(open(src)))
    out = []
    total_w = W * len(SERIES)
    out.append('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif">'
               % (total_w, H + 24))
    out.append('<rect width="100%" height="100%" fill="white"/>')
    for i, (name, xlabel, xcol) in enumerate(SERIES):
        pts = sorted((float(r[xcol]), float(r["review_us"]), float(r["floor_us"])) for r in rows if r["series"] == name)
        if len(pts) < 2:
            sys.exit("%s: fewer than two points for %s" % (src, name))
        k = panel(out, i * W, name.replace("_", " "), xlabel, pts)
        print("%-10s log-log slope of the admission time: %.2f (%d points)" % (name, k, len(pts)))
    y = H + 14
    out.append('<line x1="20" y1="%d" x2="40" y2="%d" stroke="#c0392b" stroke-width="1.8"/>' % (y - 4, y - 4))
    out.append('<text x="44" y="%d" font-size="11">admission (App::review, median)</text>' % y)
    out.append('<line x1="250" y1="%d" x2="270" y2="%d" stroke="#2471a3" stroke-width="1.8"/>' % (y - 4, y - 4))
    out.append('<text x="274" y="%d" font-size="11">floor: serde_json parse + serialise of request and reply</text>' % y)
    out.append('<line x1="640" y1="%d" x2="660" y2="%d" stroke="#999" stroke-dasharray="2,3"/>' % (y - 4, y - 4))
    out.append('<text x="664" y="%d" font-size="11">slope 1 (linear)</text>' % y)
    out.append("</svg>")
    with open(dst, "w") as f:
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
