"""Where the tests find the repository, its recorded traffic and the Apache inputs beside it."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
TRAFFIC = DATA / "traffic"
CUSTOM_SPECS = DATA / "custom_specs"
SHARED_SPECS = ROOT.parent / "shared" / "kafka-specs"
