"""Builds the optional C extensions (the decoder/scanner _wire, the session's one-frame reads _one_frame, the
metrics' counting _counting, the inspection queue's batch _batch, the relay's receiving end _receive,
the capture's fact taker and queue front _take, column cutter _columns, derived columns _derive, counters left for
later _count_later, encoder of facts for the writer process _facts_wire and the writer process's pacer _pace, the
analyze job's grouping kernels _grouping); everything else is in pyproject.toml."""

from setuptools import Extension, setup

# Each extension's module, and whether it reads the event classes' slots (kinspect/slot_offsets.h).
EXTENSIONS = (
    ("kinspect.protocol.codec._wire", False),
    ("kinspect.session._one_frame", True),
    ("kinspect.observers._counting", True),
    ("kinspect.observers._inventory", True),
    ("kinspect.proxy._batch", True),
    ("kinspect.proxy._receive", False),
    ("kinspect.proxy._forward", True),
    ("kinspect.capture._take", True),
    ("kinspect.capture._columns", False),
    ("kinspect.capture._derive", False),
    ("kinspect.capture._count_later", False),
    ("kinspect.capture._facts_wire", False),
    ("kinspect.capture._pace", False),
    ("kinspect.analyze._grouping", False),
)

setup(
    ext_modules=[
        Extension(
            module,
            [module.replace(".", "/") + ".c"],
            depends=["kinspect/slot_offsets.h"] if reads_slots else [],
            extra_compile_args=["-O2"],
            # A machine without a C compiler still installs the pure-Python package.
            optional=True,
        )
        for module, reads_slots in EXTENSIONS
    ],
)
