"""One pass over the captures: every exchange becomes a few "fact" rows, aggregated once into a small cube.

Every table of the report is derived from that one aggregate (`build_facts`), so the
capture files are read once, each needed column once, whatever the number of tables.
A fact is a struct of one shape for every kind (unused keys and measures are null):

    kind  api  s1 s2 s3 s4 (strings)  i1 i2 (ints)  v (long)  |  n m1..m6 h0..h19 (sums)  lo (min)  hi (max)

The key columns say what the fact is about (a table's group-by keys); `v` is a value
kept exact for the percentile tables (a size, a latency), so the cube holds one row
per distinct value and the percentiles are exact. Built only from Spark SQL
expressions that Spark compiles (generators and projections): no Python runs on the row path.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

# fact kinds
SUMMARY, SIZE, CLIENT, TOPIC, TAG, KIP482, VARINT, LATENCY, ERROR, UPGRADE = range(10)

KEY_STRINGS = ("api", "s1", "s2", "s3", "s4")
KEY_INTS = ("i1", "i2")
KEYS = ("kind", *KEY_STRINGS, *KEY_INTS, "v")
HIST = tuple(f"h{i}" for i in range(20))  # uvarint_hist[0..9], then zigzag_hist[0..9]
SUMS = ("n", "m1", "m2", "m3", "m4", "m5", "m6", *HIST)
MEASURES = (*SUMS, "lo", "hi")
_TYPES = {**{k: "string" for k in KEY_STRINGS}, **{k: "int" for k in KEY_INTS}, "kind": "int", "v": "bigint",
          **{m: "bigint" for m in MEASURES}}
FIELDS = (*KEYS, *MEASURES)

# capture columns of schema v2 (issue 13) that v1 files lack: read as null / empty there
OPTIONAL_COLUMNS = {"client_software_name": "string", "client_software_version": "string",
                    "record_magics": "array<tinyint>"}


def _columns(kind: int, values: dict) -> list[Column]:
    unknown = set(values) - set(FIELDS)
    if unknown:
        raise ValueError(f"unknown fact fields {sorted(unknown)}")
    cols = [F.lit(kind).alias("kind")]
    for name in FIELDS[1:]:
        value = values.get(name)
        col = value if isinstance(value, Column) else F.lit(value)
        cols.append(col.cast(_TYPES[name]).alias(name))
    return cols


def fact(kind: int, **values) -> Column:
    """A fact struct: the given keys and measures, every other field a typed null."""
    return F.struct(*_columns(kind, values))


def flat(kind: int, **values) -> list[Column]:
    """The same fact as flat columns (for a select after an explode)."""
    return _columns(kind, values)


def fact_rows(p: DataFrame) -> DataFrame:
    """Every fact of every exchange of `p` (a `projected` frame), as flat rows.

    The scalar facts come from one explode of an array of structs; each list column is
    exploded in a branch of its own (a union), reading only its own columns. Plain
    generators and projections only: Spark compiles them (higher-order functions such
    as transform() would be interpreted, element by element, measured 3x slower).
    """
    api = F.col("api")
    rsize = F.col("response_size")
    has_response = rsize.isNotNull()
    resp_version = F.coalesce(F.col("response_version"), F.col("request_version"))
    resp_bytes = F.coalesce(rsize, F.lit(0))
    kip = ~F.col("flexible") & F.col("first_flexible_version").isNotNull()

    scalar = [
        fact(SUMMARY, i1=F.col("schema_version"), n=1, m1=F.col("request_size"), m2=resp_bytes,
             m3=has_response.cast("int"), m4=F.col("request_decode_error").isNotNull().cast("int"),
             m5=F.col("response_decode_error").isNotNull().cast("int"),
             m6=(~F.col("request_inspected")).cast("int"), lo=F.col("t_us"), hi=F.col("t_us")),
        fact(SIZE, api=api, s1=F.lit("request"), i1=F.col("request_version"), v=F.col("request_size"), n=1),
        F.when(has_response, fact(SIZE, api=api, s1=F.lit("response"), i1=resp_version, v=rsize, n=1)),
        fact(CLIENT, s1=F.col("client_id"), n=1, m1=F.col("request_size"), m2=resp_bytes),
        F.when(kip & F.col("request_compact_size").isNotNull(),
               fact(KIP482, api=api, s1=F.lit("request"), i1=F.col("request_version"),
                    i2=F.col("first_flexible_version"), n=1, m1=F.col("request_size"),
                    m2=F.col("request_compact_size"))),
        F.when(kip & F.col("response_compact_size").isNotNull() & has_response,
               fact(KIP482, api=api, s1=F.lit("response"), i1=resp_version, i2=F.col("first_flexible_version"),
                    n=1, m1=rsize, m2=F.col("response_compact_size"))),
        F.when(F.col("latency_us").isNotNull(), fact(LATENCY, api=api, v=F.col("latency_us"), n=1)),
        fact(UPGRADE, api=api, s1=F.coalesce(F.col("client_software_name"), F.lit("unknown")),
             s2=F.col("client_software_version"), s3=F.col("client_id"), s4=F.col("client_address"),
             i1=F.col("request_version"), i2=F.col("api_key"), v=F.col("magic_mask"), n=1,
             lo=F.col("t_us"), hi=F.col("t_us")),
    ]
    branches = [p.select(F.inline(F.array(*scalar))).where(F.col("kind").isNotNull())]
    # A topic named twice in one exchange (request and response, say) counts once.
    branches.append(p.select(F.explode(F.array_distinct(F.col("topic_partitions.topic"))).alias("topic"),
                             F.col("request_size"), resp_bytes.alias("rb"))
                    .select(*flat(TOPIC, s1=F.col("topic"), n=1, m1=F.col("request_size"), m2=F.col("rb"))))
    branches.append(p.select(api, F.inline("tagged_fields")).select(*flat(
        TAG, api=api, s1=F.col("location"), s2=F.col("path"), s3=F.col("name"), i1=F.col("tag"),
        i2=F.col("known").cast("int"), n=1, m1=F.col("size"))))
    branches.append(p.select(api, F.inline("integer_fields")).select(*flat(
        VARINT, api=api, s1=F.col("location"), s2=F.col("path"), s3=F.col("type"), n=1, m1=F.col("count"),
        m2=F.col("fixed_bytes"), m3=F.col("zigzag_bytes"), m4=F.col("uvarint_bytes"),
        **{f"h{i}": F.col("uvarint_hist")[i] for i in range(10)},
        **{f"h{10 + i}": F.col("zigzag_hist")[i] for i in range(10)})))
    branches.append(p.select(api, F.inline("error_codes")).select(*flat(
        ERROR, api=api, s1=F.col("name"), i1=F.col("code"), n=1, m1=F.col("count"))))
    out = branches[0]
    for branch in branches[1:]:
        out = out.unionByName(branch)
    return out


def projected(df: DataFrame) -> DataFrame:
    """The capture columns the facts need, with the per-exchange values computed once."""
    for name, kind in OPTIONAL_COLUMNS.items():
        if name not in df.columns:
            df = df.withColumn(name, F.lit(None).cast(kind))
    magics = F.coalesce(F.col("record_magics"), F.array().cast("array<tinyint>"))
    # the record-batch magic values seen (0, 1, 2), as a bit mask (bit m: magic m)
    mask = sum((F.when(F.array_contains(magics, m), 1 << m).otherwise(0) for m in range(3)), F.lit(0))
    return df.select(
        "*",
        F.coalesce(F.col("api_name"), F.concat(F.lit("api_"), F.col("api_key").cast("string"))).alias("api"),
        F.unix_micros(F.col("request_time")).alias("t_us"),
        mask.cast("bigint").alias("magic_mask"),
    )


def build_facts(captures: DataFrame) -> DataFrame:
    """The aggregate every table is derived from: one row per distinct fact key, measures summed."""
    aggs = [F.sum(m).alias(m) for m in SUMS] + [F.min("lo").alias("lo"), F.max("hi").alias("hi")]
    return fact_rows(projected(captures)).groupBy(*KEYS).agg(*aggs)
