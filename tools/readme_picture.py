"""Copy a chart of a `kinspect analyze` report into docs/images/ for the README.

    python tools/readme_picture.py REPORT_DIR [--chart "integer field bytes"]

The README's picture is the report's integer-field chart for the captures of one
`make run` (the demo's real traffic): kinspect analyze .kinspect-demo/captures --out REPORT.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path)
    parser.add_argument("--chart", default="integer field bytes", help="the start of the chart's title")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images" / "report-integer-fields.svg")
    args = parser.parse_args(argv)
    html = (args.report / "report.html").read_text("utf-8")
    for svg in re.findall(r"<svg.*?</svg>", html, re.S):
        if f'aria-label="{args.chart}' in svg:
            # A standalone file needs the namespace and a white background (the report page has one).
            svg = svg.replace("<svg ", '<svg xmlns="http://www.w3.org/2000/svg" style="background:#fff" ', 1)
            args.out.write_text(svg + "\n", "utf-8")
            print(f"wrote {args.out}")
            return 0
    print(f"no chart titled {args.chart!r}... in {args.report / 'report.html'}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
