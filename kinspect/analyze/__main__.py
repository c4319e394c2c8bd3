"""`python -m kinspect.analyze CAPTURES --out REPORT`: the same as `kinspect analyze`."""

import sys

from kinspect.cli.main import main

sys.exit(main(["analyze", *sys.argv[1:]]))
