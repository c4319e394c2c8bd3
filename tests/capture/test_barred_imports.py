"""capture.barred_imports: a process that bars pandas builds arrays with pyarrow all the same, without importing it."""

from __future__ import annotations

from tests.support.snippet import run_snippet


def test_a_barred_pandas_is_a_missing_module_to_pyarrow_and_to_an_import():
    import pandas  # noqa: F401 (installed here: only the bar keeps it out)

    out = run_snippet(
        "import sys\n"
        "from kinspect.capture.barred_imports import BarredImports, bar_pandas\n"
        "bar_pandas()\n"
        "bar_pandas()\n"
        "print(sum(isinstance(f, BarredImports) for f in sys.meta_path))\n"
        "import numpy as np, pyarrow as pa\n"
        "print(pa.array(np.arange(3, dtype=np.int16)).to_pylist(), pa.array([1, None]).to_pylist())\n"
        "try:\n"
        "    import pandas.core\n"
        "except ModuleNotFoundError as exc:\n"
        "    print(exc.name)\n"
        "print('pandas' in sys.modules)\n")
    assert out.split("\n")[:4] == ["1", "[0, 1, 2] [1, None]", "pandas", "False"]
