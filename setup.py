"""Builds the optional C extensions (the decoder/scanner _wire, the session's one-frame reads _one_frame, the
metrics' counting _counting, the inspection queue's batch _batch, the capture's fact taker _take and column
cutter _columns, the analyze job's grouping kernels _grouping); everything else is in pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "kinspect.protocol.codec._wire",
            ["kinspect/protocol/codec/_wire.c"],
            extra_compile_args=["-O2"],
            # A machine without a C compiler still installs the pure-Python package.
            optional=True,
        ),
        Extension(
            "kinspect.session._one_frame",
            ["kinspect/session/_one_frame.c"],
            depends=["kinspect/slot_offsets.h"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
        Extension(
            "kinspect.observers._counting",
            ["kinspect/observers/_counting.c"],
            depends=["kinspect/slot_offsets.h"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
        Extension(
            "kinspect.proxy._batch",
            ["kinspect/proxy/_batch.c"],
            depends=["kinspect/slot_offsets.h"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
        Extension(
            "kinspect.capture._take",
            ["kinspect/capture/_take.c"],
            depends=["kinspect/slot_offsets.h"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
        Extension(
            "kinspect.capture._columns",
            ["kinspect/capture/_columns.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
        Extension(
            "kinspect.analyze._grouping",
            ["kinspect/analyze/_grouping.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
    ],
)
