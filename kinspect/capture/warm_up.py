"""One throwaway exchange through the row builder and a Parquet writer as the capture starts.

pyarrow's first use in a process (its compute kernels, nested list and struct arrays, the
Parquet writer) costs about 0.2 s of CPU, whatever the batch: paid by the first batch of
real traffic, it held the GIL in the writer thread while the event loop forwarded, and
made the first exchanges the most expensive ones (bench_proxy's first small-request phase
with capture on: about 60 µs a request more than the next). Paid here, at start, on the
calling thread: nothing is counted and nothing reaches the capture's files or its builder.
"""

from __future__ import annotations

import struct

from kinspect.capture.batch import BatchBuilder
from kinspect.capture.facts import FactsTaker
from kinspect.capture.schema import arrow_schema, parquet_options
from kinspect.protocol.codec import Codec
from kinspect.protocol.specs.api_keys import API_VERSIONS
from kinspect.session import ConnectionInfo, Exchange, Session


def _exchange(codec: Codec) -> Exchange:
    """An ApiVersions v3 exchange as a session reports it: header tags, client software, integer fields."""
    session = Session(codec, ConnectionInfo(0, "warm-up:0", "warm-up:0"))
    request = codec.encode_request(
        {"RequestApiKey": API_VERSIONS, "RequestApiVersion": 3, "CorrelationId": 1, "ClientId": "kinspect"},
        {"ClientSoftwareName": "kinspect", "ClientSoftwareVersion": "0"})
    response = codec.encode_response(API_VERSIONS, 3, {"CorrelationId": 1}, {
        "ErrorCode": 0, "ApiKeys": [{"ApiKey": API_VERSIONS, "MinVersion": 0, "MaxVersion": 4}], "ThrottleTimeMs": 0})
    session.client_data(struct.pack(">i", len(request)) + request, 0.0)
    events = session.broker_data(struct.pack(">i", len(response)) + response, 0.001).events
    return next(e for e in events if type(e) is Exchange)


def warm_facts(codec: Codec) -> tuple:
    """The facts of the throwaway exchange (what a writer process is sent to warm itself with)."""
    facts, _ = FactsTaker(codec).take(_exchange(codec))
    return facts


def write_one(facts: tuple, builder: BatchBuilder, compression: str | None):
    """One row built by this builder and written to memory: the Parquet file's bytes (a pyarrow Buffer)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    with pq.ParquetWriter(sink, arrow_schema(), **parquet_options(compression)) as writer:
        writer.write_table(pa.Table.from_batches([builder.build([facts])]))
    return sink.getvalue()


def warm_up(codec: Codec, compression: str | None):
    """Build and write (to memory) one row, with a builder of its own; the Parquet file's bytes.

    The costs are the process's, not a builder's: the writer's builder, made later, is as fast.
    """
    return write_one(warm_facts(codec), BatchBuilder(0.0, codec.registry), compression)
