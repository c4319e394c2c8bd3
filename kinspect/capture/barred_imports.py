"""pandas kept out of the processes that write capture files: pyarrow would import it there for nothing."""

from __future__ import annotations

import sys

# pyarrow's array() asks its pandas shim whether the input is a pandas object, and the shim imports pandas wherever
# it is installed (the pipeline extra installs it): about 0.5 s of CPU and 35-37 MB, in a warmed writer process,
# in a proxy that builds its rows in its writer thread, and in `kinspect capture --pcap` (/tmp scripts, pandas 2.3,
# pyarrow 26; docs/performance.md, twenty-fourth section).
BARRED_MODULES = frozenset({"pandas"})


class BarredImports:
    """A finder that makes importing BARRED_MODULES fail as a missing module would, so that pyarrow goes on without
    them (a None in sys.modules would not do: pyarrow's compiled import takes the None as the module)."""

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BARRED_MODULES:
            raise ModuleNotFoundError(f"{name} is not imported by a process that writes capture files", name=name)
        return None


def bar_pandas() -> None:
    """From now on, importing pandas in this process fails as for a missing module (a module already imported
    stays). Only for a process of kinspect's own that never runs the pipeline: pyarrow decides once whether it
    has pandas."""
    if not any(isinstance(finder, BarredImports) for finder in sys.meta_path):
        sys.meta_path.insert(0, BarredImports())
