/* kinspect.protocol.codec._wire: a table-driven decoder and scanner for Kafka message bodies.
 *
 * It runs the "programs" of kinspect/protocol/codec/wire_program.py (nested tuples describing
 * one struct at one version), converted once into the C structs below by
 * compile_program(). The semantics are those of the Python source that
 * kinspect/protocol/codec/codegen.py generates (the reference): same dict keys in the same
 * order, same types, same positions, and failure exactly where the reference fails.
 * Every malformed input raises kinspect.protocol.primitives.Malformed; every read is
 * bounds-checked against the end of the current region (the buffer, or a tagged
 * field's bytes), and every length is checked against the bytes left before anything
 * is allocated.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

/* ------------------------------------------------------------------ program model */

enum {
    K_BOOL, K_INT8, K_INT16, K_UINT16, K_INT32, K_UINT32, K_INT64, K_FLOAT64, K_UUID,
    K_STRING, K_BYTES, K_RECORDS, K_STRUCT, K_ARRAY, K_ENCODED, K_COUNT
};
#define IS_FIXED(k) ((k) <= K_UUID)

static const char *const KIND_NAMES[K_COUNT] = {
    "bool", "int8", "int16", "uint16", "int32", "uint32", "int64", "float64", "uuid",
    "string", "bytes", "records", "struct", "array", "encoded",
};
static const Py_ssize_t FIXED_SIZE[K_UUID + 1] = {1, 1, 2, 2, 4, 4, 8, 8, 16};

enum { F_FIXED, F_PACKED, F_UPACKED };

typedef struct SProg SProg;

typedef struct {
    PyObject *key;          /* interned str */
    Py_hash_t hash;         /* of key */
    int kind;
    char nullable, compact, is_error, is_topic;
    /* K_ENCODED */
    char form, has_range;
    int bits;
    long long lo, hi;
    /* K_ARRAY */
    int elem;
    Py_ssize_t least;
    /* K_STRUCT, or K_ARRAY of structs */
    SProg *sub;
    /* capture facts (scan only): the integer slot's first counter in int_stats (-1: none), the
     * unsigned-varint bytes of a negative value, bytes today (> 0 fixed, 0 zig-zag varint, -1
     * unsigned varint whose negatives take today_neg bytes); compact-target prefixes; role
     * (1 the struct's topic field, 2 one of its partition arrays) */
    Py_ssize_t slot;
    char ineg, today, today_neg;
    char prefix, eprefix, role;
} Field;

struct SProg {
    int flexible;
    Py_ssize_t nfields;
    Field *fields;
    Py_ssize_t ntags;
    uint64_t *tags;         /* ascending */
    Field *tag_fields;
    PyObject *path;         /* str */
    int grows;              /* a compact target is set: one tag-section byte per struct */
};

/* ------------------------------------------------------------------ module state */

static PyObject *Malformed;          /* kinspect.protocol.primitives.Malformed */
static PyObject *UUIDType;           /* uuid.UUID */
static PyObject *SafeUnknown;        /* uuid.SafeUUID.unknown */
static Py_ssize_t uuid_int_off = -1; /* slot offsets of UUID.int and UUID.is_safe */
static Py_ssize_t uuid_safe_off = -1;
static PyObject *UnknownKey;         /* "_unknown_tagged_fields" */
static PyObject *S_error_codes, *S_topics, *S_record_spans, *S_tagged_fields, *S_empty_counter,
    *S_tag_sections, *S_tag_section_bytes, *S_int, *S_int_stats, *S_topic_partitions, *S_compact_delta;
static PyObject *ProgramCache;       /* id(program tuple) -> Program */
#define PROGRAM_CACHE_MAX 4096
#define MAX_DEPTH 64
/* The longest buffer whose integer counters (int32) are gathered: codegen.COUNTED_BYTES_MAX, which says why. */
#define COUNTED_BYTES_MAX ((int32_t)(INT32_MAX / 10))

/* ------------------------------------------------------------------ helpers */

static inline uint32_t be16(const unsigned char *q) { return ((uint32_t)q[0] << 8) | q[1]; }
static inline uint32_t be32(const unsigned char *q)
{
    return ((uint32_t)q[0] << 24) | ((uint32_t)q[1] << 16) | ((uint32_t)q[2] << 8) | q[3];
}
static inline uint64_t be64(const unsigned char *q) { return ((uint64_t)be32(q) << 32) | be32(q + 4); }

static int fail(const char *format, ...)
{
    va_list va;
    va_start(va, format);
    PyObject *msg = PyUnicode_FromFormatV(format, va);
    va_end(va);
    if (msg) {
        PyErr_SetObject(Malformed, msg);
        Py_DECREF(msg);
    }
    return -1;
}

static int truncated(const char *what)
{
    return fail("truncated: the bytes end inside %s", what);
}

/* A frame scanned where it lies, in the reads that brought it (FrameStream gathers a large
 * frame as its reads instead of joining them): `start` is each piece's offset in the frame. */
typedef struct {
    const unsigned char *p;
    Py_ssize_t start, n;
} Piece;

#define SCRATCH_INLINE 64

typedef struct {
    Piece *v;
    Py_buffer *views;
    Py_ssize_t count, last;     /* last: the piece the previous read was in (reads mostly go forward) */
    unsigned char *scratch;     /* a read that straddles pieces is copied here */
    Py_ssize_t scratch_n;
    unsigned char inline_scratch[SCRATCH_INLINE];
} Pieces;

/* k contiguous bytes at frame offset pos (pos + k <= the frame's length): a pointer into the
 * piece that holds them, else a copy in the scratch buffer, valid until the next such copy.
 * NULL (MemoryError) only when a straddling read is longer than any before. */
static const unsigned char *piece_at(Pieces *pc, Py_ssize_t pos, Py_ssize_t k)
{
    Py_ssize_t i = pc->last;
    Piece *v = pc->v;
    while (pos < v[i].start)
        i--;
    while (pos >= v[i].start + v[i].n && i + 1 < pc->count)
        i++;
    pc->last = i;
    Py_ssize_t off = pos - v[i].start;
    if (off + k <= v[i].n)
        return v[i].p + off;
    if (k > pc->scratch_n) {
        unsigned char *bigger = PyMem_Malloc((size_t)k);
        if (bigger == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
        if (pc->scratch != pc->inline_scratch)
            PyMem_Free(pc->scratch);
        pc->scratch = bigger;
        pc->scratch_n = k;
    }
    Py_ssize_t done = 0;
    while (done < k) {
        Py_ssize_t take = v[i].n - off;
        if (take > k - done)
            take = k - done;
        memcpy(pc->scratch + done, v[i].p + off, (size_t)take);
        done += take;
        i++, off = 0;
    }
    return pc->scratch;
}

/* The piece table of a tuple of bytes-like pieces; -1 (an exception set) for anything else. */
static int pieces_open(PyObject *tuple, Pieces *pc, Py_ssize_t *total)
{
    Py_ssize_t count = PyTuple_GET_SIZE(tuple);
    memset(pc, 0, sizeof *pc);
    pc->scratch = pc->inline_scratch;
    pc->scratch_n = SCRATCH_INLINE;
    if (count == 0) {
        PyErr_SetString(PyExc_ValueError, "a frame in pieces needs at least one piece");
        return -1;
    }
    pc->v = PyMem_Calloc((size_t)count, sizeof(Piece));
    pc->views = PyMem_Calloc((size_t)count, sizeof(Py_buffer));
    if (pc->v == NULL || pc->views == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t start = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(tuple, i), &pc->views[i], PyBUF_SIMPLE) < 0)
            return -1;
        pc->count = i + 1; /* views[0..count) are held: pieces_close releases them */
        pc->v[i].p = (const unsigned char *)pc->views[i].buf;
        pc->v[i].start = start;
        pc->v[i].n = pc->views[i].len;
        start += pc->views[i].len;
    }
    *total = start;
    return 0;
}

static void pieces_close(Pieces *pc)
{
    for (Py_ssize_t i = 0; i < pc->count; i++)
        PyBuffer_Release(&pc->views[i]);
    PyMem_Free(pc->views);
    PyMem_Free(pc->v);
    if (pc->scratch != pc->inline_scratch)
        PyMem_Free(pc->scratch);
    pc->views = NULL, pc->v = NULL, pc->count = 0;
}

typedef struct {
    const unsigned char *p;     /* the frame, when it is one piece (pc NULL) */
    Pieces *pc;
    Py_ssize_t n;               /* len(buf) */
    PyObject *buf;
    /* scan only */
    PyObject *result, *errors, *topics, *spans, *tagged;
    Py_ssize_t empty, sections, section_bytes;
    /* capture facts: int_stats' counters, topic -> partitions, the compact delta; inner > 0
     * inside a known tagged field (only capture facts are gathered there) */
    uint32_t *istats; /* int32 counters (array('i')), added to as unsigned: a wrap is defined, never UB */
    PyObject *tparts;
    long long compact;
    int inner;
} Ctx;

/* k bytes at pos: where the scanner reads, whether the frame is one buffer or pieces. */
#define AT(c, pos, k) ((c)->pc == NULL ? (c)->p + (pos) : piece_at((c)->pc, (pos), (k)))

/* An unsigned varint of at most `bits` bits (as primitives.read_uvarint). */
static int read_uvarint(const Ctx *c, Py_ssize_t *ppos, Py_ssize_t L, int bits, uint64_t *out)
{
    Py_ssize_t pos = *ppos;
    int limit = bits == 16 ? 3 : (bits == 32 ? 5 : 10);
    uint64_t v = 0;
    for (int i = 0; i < limit; i++) {
        if (pos + i >= L)
            return truncated("a varint");
        unsigned b = *AT(c, pos + i, 1);
        if (i == 9) { /* 64 bits only: this byte holds bit 63 */
            if (b & 0x80)
                break;
            if ((b & 0x7F) > 1)
                return fail("varint value does not fit in 64 bits");
            *out = v | ((uint64_t)(b & 0x7F) << 63);
            *ppos = pos + 10;
            return 0;
        }
        v |= (uint64_t)(b & 0x7F) << (7 * i);
        if (!(b & 0x80)) {
            if (bits < 64 && v > ((UINT64_C(1) << bits) - 1))
                return fail("varint value %llu does not fit in %d bits", (unsigned long long)v, bits);
            *out = v;
            *ppos = pos + i + 1;
            return 0;
        }
    }
    return fail("varint longer than %d bytes", limit);
}

/* A length: compact (uvarint32 - 1) or int16/int32 (wide). Null is -1. */
static inline int read_length(const Ctx *c, Py_ssize_t *ppos, Py_ssize_t L, int compact, int wide, long long *n)
{
    Py_ssize_t pos = *ppos;
    if (compact) {
        if (pos >= L)
            return truncated("a length");
        unsigned b = *AT(c, pos, 1);
        if (b < 128) {
            *n = (long long)b - 1;
            *ppos = pos + 1;
            return 0;
        }
        uint64_t v;
        if (read_uvarint(c, ppos, L, 32, &v) < 0)
            return -1;
        *n = (long long)v - 1;
        return 0;
    }
    if (wide) {
        if (L - pos < 4)
            return truncated("a length");
        *n = (int32_t)be32(AT(c, pos, 4));
        *ppos = pos + 4;
    }
    else {
        if (L - pos < 2)
            return truncated("a length");
        *n = (int16_t)be16(AT(c, pos, 2));
        *ppos = pos + 2;
    }
    return 0;
}

/* After read_length: 1 for null, 0 for a length, -1 (Malformed) for a bad one. */
static inline int check_null(long long n, int nullable, const char *what)
{
    if (n >= 0)
        return 0;
    if (nullable) {
        if (n == -1)
            return 1;
        return fail("negative %s length %lld", what, n);
    }
    if (n == -1)
        return fail("null %s in a field that is not nullable", what);
    return fail("negative %s length %lld", what, n);
}

static inline int check_blob(long long n, Py_ssize_t pos, Py_ssize_t L, const char *what)
{
    if (n > (long long)(L - pos))
        return fail("%s of %lld bytes overruns the %zd bytes left", what, n, L - pos);
    return 0;
}

static inline int check_count(long long n, Py_ssize_t least, Py_ssize_t pos, Py_ssize_t L)
{
    Py_ssize_t left = L - pos;
    if (left < 0 || n > (long long)(left / least))
        return fail("array of %lld elements overruns the %zd bytes left", n, left);
    return 0;
}

static PyObject *make_uuid(const unsigned char *q)
{
#if PY_VERSION_HEX >= 0x030D0000
    PyObject *value = PyLong_FromUnsignedNativeBytes(
        q, 16, Py_ASNATIVEBYTES_BIG_ENDIAN | Py_ASNATIVEBYTES_UNSIGNED_BUFFER);
#else
    PyObject *value = _PyLong_FromByteArray(q, 16, 0, 0);
#endif
    if (value == NULL)
        return NULL;
    if (uuid_int_off >= 0) {
        /* UUID.__new__(UUID) plus the two slots UUID.__init__ sets. */
        PyTypeObject *tp = (PyTypeObject *)UUIDType;
        PyObject *u = tp->tp_alloc(tp, 0);
        if (u == NULL) {
            Py_DECREF(value);
            return NULL;
        }
        *(PyObject **)((char *)u + uuid_int_off) = value;
        Py_INCREF(SafeUnknown);
        *(PyObject **)((char *)u + uuid_safe_off) = SafeUnknown;
        return u;
    }
    PyObject *kwargs = PyDict_New();
    if (kwargs == NULL || PyDict_SetItem(kwargs, S_int, value) < 0) {
        Py_XDECREF(kwargs);
        Py_DECREF(value);
        return NULL;
    }
    Py_DECREF(value);
    PyObject *empty = PyTuple_New(0);
    PyObject *u = empty ? PyObject_Call(UUIDType, empty, kwargs) : NULL;
    Py_XDECREF(empty);
    Py_DECREF(kwargs);
    return u;
}

static PyObject *fixed_value(int kind, const unsigned char *q)
{
    switch (kind) {
    case K_BOOL:
        return PyBool_FromLong(q[0] != 0);
    case K_INT8:
        return PyLong_FromLong((signed char)q[0]);
    case K_INT16:
        return PyLong_FromLong((int16_t)be16(q));
    case K_UINT16:
        return PyLong_FromLong((long)be16(q));
    case K_INT32:
        return PyLong_FromLong((int32_t)be32(q));
    case K_UINT32:
        return PyLong_FromUnsignedLong(be32(q));
    case K_INT64:
        return PyLong_FromLongLong((int64_t)be64(q));
    case K_FLOAT64: {
        uint64_t bits = be64(q);
        double d;
        memcpy(&d, &bits, 8);
        return PyFloat_FromDouble(d);
    }
    default:
        return make_uuid(q);
    }
}

/* A KAFKA-9927 encoded integer (primitives.ENCODING_READERS). */
static int read_encoded(const Ctx *c, const Field *f, Py_ssize_t *ppos, Py_ssize_t L, long long *out)
{
    Py_ssize_t pos = *ppos;
    if (f->form == F_FIXED) {
        Py_ssize_t size = f->bits / 8;
        if (L - pos < size)
            return truncated("a fixed-width integer");
        const unsigned char *q = AT(c, pos, size); /* at most 8 bytes: never NULL */
        *out = f->bits == 16 ? (long long)(int16_t)be16(q)
             : f->bits == 32 ? (long long)(int32_t)be32(q) : (long long)(int64_t)be64(q);
        *ppos = pos + size;
        return 0;
    }
    uint64_t raw;
    if (read_uvarint(c, ppos, L, f->bits, &raw) < 0)
        return -1;
    if (f->form == F_PACKED)
        *out = (long long)(int64_t)(raw >> 1) ^ -(long long)(raw & 1);
    else if (f->bits == 64)
        *out = (long long)(int64_t)raw;
    else
        *out = (raw >> (f->bits - 1)) ? (long long)raw - (1LL << f->bits) : (long long)raw;
    return 0;
}

static const Field *find_tag(const SProg *sp, uint64_t tag)
{
    for (Py_ssize_t i = 0; i < sp->ntags; i++) {
        if (sp->tags[i] == tag)
            return &sp->tag_fields[i];
        if (sp->tags[i] > tag)
            break;
    }
    return NULL;
}

/* A str from UTF-8 bytes, strict; invalid UTF-8 becomes Malformed. */
static PyObject *utf8(const unsigned char *q, Py_ssize_t n)
{
    PyObject *s = PyUnicode_DecodeUTF8((const char *)q, n, NULL);
    if (s == NULL && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
        PyErr_Clear();
        fail("invalid UTF-8 in a string");
    }
    return s;
}

/* ------------------------------------------------------------------ decoding */

static PyObject *decode_struct(Ctx *c, const SProg *sp, Py_ssize_t *ppos, Py_ssize_t L);

/* One string/bytes/records value whose length says it is not null. */
static inline PyObject *blob_value(const Ctx *c, int kind, Py_ssize_t pos, long long n)
{
    if (kind == K_STRING)
        return utf8(c->p + pos, (Py_ssize_t)n);
    return PyBytes_FromStringAndSize((const char *)c->p + pos, (Py_ssize_t)n);
}

static const char *blob_name(int kind)
{
    return kind == K_STRING ? "string" : (kind == K_BYTES ? "bytes" : "records");
}

static PyObject *decode_array(Ctx *c, const Field *f, Py_ssize_t *ppos, Py_ssize_t L)
{
    long long n = 0;
    if (read_length(c, ppos, L, f->compact, 1, &n) < 0)
        return NULL;
    int null = check_null(n, f->nullable, "array");
    if (null < 0)
        return NULL;
    if (null)
        Py_RETURN_NONE;
    Py_ssize_t pos = *ppos;
    if (check_count(n, f->least, pos, L) < 0)
        return NULL;
    int elem = f->elem;
    if (IS_FIXED(elem) && (long long)(L - pos) / FIXED_SIZE[elem] < n)
        return truncated("an array"), NULL; /* only for hand-written programs with a wrong least */
    PyObject *list = PyList_New((Py_ssize_t)n);
    if (list == NULL)
        return NULL;
    if (IS_FIXED(elem)) {
        Py_ssize_t size = FIXED_SIZE[elem];
        const unsigned char *q = c->p + pos;
        for (Py_ssize_t i = 0; i < (Py_ssize_t)n; i++, q += size) {
            PyObject *v;
            if (elem == K_INT32)
                v = PyLong_FromLong((int32_t)be32(q));
            else
                v = fixed_value(elem, q);
            if (v == NULL)
                goto fail;
            PyList_SET_ITEM(list, i, v);
        }
        *ppos = pos + (Py_ssize_t)n * size;
        return list;
    }
    if (elem == K_STRUCT) {
        for (Py_ssize_t i = 0; i < (Py_ssize_t)n; i++) {
            PyObject *v = decode_struct(c, f->sub, ppos, L);
            if (v == NULL)
                goto fail;
            PyList_SET_ITEM(list, i, v);
        }
        return list;
    }
    /* strings or bytes, never null */
    const char *what = blob_name(elem);
    for (Py_ssize_t i = 0; i < (Py_ssize_t)n; i++) {
        long long m = 0;
        if (read_length(c, ppos, L, f->compact, elem != K_STRING, &m) < 0 || check_null(m, 0, what) < 0
            || check_blob(m, *ppos, L, what) < 0)
            goto fail;
        PyObject *v = blob_value(c, elem, *ppos, m);
        if (v == NULL)
            goto fail;
        PyList_SET_ITEM(list, i, v);
        *ppos += (Py_ssize_t)m;
    }
    return list;
fail:
    Py_DECREF(list);
    return NULL;
}

static PyObject *decode_value(Ctx *c, const Field *f, Py_ssize_t *ppos, Py_ssize_t L)
{
    int kind = f->kind;
    Py_ssize_t pos = *ppos;
    if (IS_FIXED(kind)) {
        Py_ssize_t size = FIXED_SIZE[kind];
        if (L - pos < size)
            return truncated("a fixed-width field"), NULL;
        *ppos = pos + size;
        return fixed_value(kind, c->p + pos);
    }
    switch (kind) {
    case K_STRING:
    case K_BYTES:
    case K_RECORDS: {
        long long n = 0;
        const char *what = blob_name(kind);
        if (read_length(c, ppos, L, f->compact, kind != K_STRING, &n) < 0)
            return NULL;
        int null = check_null(n, f->nullable, what);
        if (null < 0)
            return NULL;
        if (null)
            Py_RETURN_NONE;
        if (check_blob(n, *ppos, L, what) < 0)
            return NULL;
        PyObject *v = blob_value(c, kind, *ppos, n);
        if (v != NULL)
            *ppos += (Py_ssize_t)n;
        return v;
    }
    case K_STRUCT:
        if (f->nullable) {
            if (pos >= L)
                return truncated("a struct marker"), NULL;
            *ppos = pos + 1;
            if (c->p[pos] >= 128)
                Py_RETURN_NONE;
        }
        return decode_struct(c, f->sub, ppos, L);
    case K_ARRAY:
        return decode_array(c, f, ppos, L);
    default: { /* K_ENCODED */
        long long v;
        if (read_encoded(c, f, ppos, L, &v) < 0)
            return NULL;
        if (f->has_range && (v < f->lo || v > f->hi))
            return fail("value %lld does not fit the field", v), NULL;
        return PyLong_FromLongLong(v);
    }
    }
}

/* A non-empty tag section (codec_runtime.read_tags) into target. */
static int read_tags(Ctx *c, const SProg *sp, PyObject *target, Py_ssize_t *ppos, Py_ssize_t L)
{
    uint64_t count;
    if (read_uvarint(c, ppos, L, 32, &count) < 0)
        return -1;
    Py_ssize_t pos = *ppos;
    if ((long long)count > (long long)(L - pos))
        return fail("tag section of %llu fields overruns the %zd bytes left", (unsigned long long)count, L - pos);
    long long previous = -1;
    PyObject *unknown = NULL;
    for (uint64_t k = 0; k < count; k++) {
        uint64_t tag, size;
        if (read_uvarint(c, &pos, L, 32, &tag) < 0 || read_uvarint(c, &pos, L, 32, &size) < 0)
            goto fail;
        if ((long long)tag <= previous) {
            fail("tag %llu after tag %lld: tags must be unique and ascending", (unsigned long long)tag, previous);
            goto fail;
        }
        previous = (long long)tag;
        if ((long long)size > (long long)(L - pos)) {
            fail("tagged field %llu of %llu bytes overruns the %zd bytes left", (unsigned long long)tag,
                 (unsigned long long)size, L - pos);
            goto fail;
        }
        Py_ssize_t end = pos + (Py_ssize_t)size;
        const Field *tf = find_tag(sp, tag);
        if (tf == NULL) {
            if (unknown == NULL && (unknown = PyList_New(0)) == NULL)
                goto fail;
            PyObject *item = Py_BuildValue("(Ky#)", (unsigned long long)tag, (const char *)c->p + pos, (Py_ssize_t)size);
            if (item == NULL)
                goto fail;
            int rc = PyList_Append(unknown, item);
            Py_DECREF(item);
            if (rc < 0)
                goto fail;
        }
        else {
            Py_ssize_t used = pos;
            PyObject *v = decode_value(c, tf, &used, end);
            if (v == NULL)
                goto fail;
            if (used != end) {
                Py_DECREF(v);
                fail("tagged field %U declares %llu bytes but its value takes %zd", tf->key,
                     (unsigned long long)size, used - pos);
                goto fail;
            }
            int rc = PyDict_SetItem(target, tf->key, v);
            Py_DECREF(v);
            if (rc < 0)
                goto fail;
        }
        pos = end;
    }
    if (unknown != NULL) {
        int rc = PyDict_SetItem(target, UnknownKey, unknown);
        Py_DECREF(unknown);
        if (rc < 0)
            return -1;
    }
    *ppos = pos;
    return 0;
fail:
    Py_XDECREF(unknown);
    return -1;
}

/* Insert a field's value; the key's hash is computed once, when compiling. */
#if PY_VERSION_HEX < 0x030D0000
#define DICT_SET_FIELD(d, f, v) _PyDict_SetItem_KnownHash((d), (f)->key, (v), (f)->hash)
#else
#define DICT_SET_FIELD(d, f, v) PyDict_SetItem((d), (f)->key, (v))
#endif

static PyObject *new_dict(Py_ssize_t n)
{
#if PY_VERSION_HEX < 0x030D0000
    return _PyDict_NewPresized(n);
#else
    (void)n;
    return PyDict_New();
#endif
}

static PyObject *decode_struct(Ctx *c, const SProg *sp, Py_ssize_t *ppos, Py_ssize_t L)
{
    PyObject *d = new_dict(sp->nfields);
    if (d == NULL)
        return NULL;
    const Field *f = sp->fields, *stop = sp->fields + sp->nfields;
    for (; f < stop; f++) {
        PyObject *v;
        if (IS_FIXED(f->kind)) { /* inline: most fields of most structs */
            Py_ssize_t pos = *ppos, size = FIXED_SIZE[f->kind];
            if (L - pos < size) {
                truncated("a fixed-width field");
                goto fail;
            }
            *ppos = pos + size;
            v = f->kind == K_INT32 ? PyLong_FromLong((int32_t)be32(c->p + pos)) : fixed_value(f->kind, c->p + pos);
        }
        else
            v = decode_value(c, f, ppos, L);
        if (v == NULL)
            goto fail;
        int rc = DICT_SET_FIELD(d, f, v);
        Py_DECREF(v);
        if (rc < 0)
            goto fail;
    }
    if (sp->flexible) {
        Py_ssize_t pos = *ppos;
        if (pos >= L) {
            truncated("a tag section");
            goto fail;
        }
        if (c->p[pos] == 0)
            *ppos = pos + 1;
        else if (read_tags(c, sp, d, ppos, L) < 0)
            goto fail;
    }
    return d;
fail:
    Py_DECREF(d);
    return NULL;
}

/* ------------------------------------------------------------------ record-set summaries
 *
 * The C twin of kinspect.protocol.records.summarize_records_python (the reference): the
 * same walk over batch headers, the same batches and fields, the same truncated-tail
 * rules and the same RecordsError messages and byte offsets. The results are that
 * module's BatchSummary and RecordsSummary: tuple subclasses without instance slots,
 * so each is one allocation filled in place (tp_alloc + items), as tuple.__new__ would.
 * The scanner only notes where each records field lies (ScanResult.record_spans);
 * ScanResult.records calls summarize_spans on them when first read.
 */

#define REC_OVERHEAD 12      /* offset int64 + length int32 */
#define REC_MAGIC_POS 16
#define REC_ANY_MIN 14       /* smallest length of any entry (a v0 message) */
#define REC_V2_MIN 49        /* v2 header (61 bytes) minus the 12-byte prefix */
#define REC_V2_HEADER 61
#define REC_V2_COUNT_POS 57
#define REC_V0_MIN 14
#define REC_V1_MIN 22
#define REC_LEGACY_ATTRIBUTES_END 18
#define REC_V1_HEADER 26
#define N_BATCH_FIELDS 17
#define N_SUMMARY_FIELDS 3

static PyObject *RecordsErrorType;   /* kinspect.protocol.records.RecordsError */
static PyObject *BatchType;          /* ... .BatchSummary */
static PyObject *SummaryType;        /* ... .RecordsSummary */
static PyObject *CodecNames[8];      /* ... ._CODECS */
static PyObject *S_unreadable;       /* ... ._UNREADABLE ("unknown") */
static PyObject *S_ts_none, *S_ts_create, *S_ts_log_append;
static int tuple_alloc_ok;           /* both classes can be filled in place */

/* A class built as tuple.__new__ builds it: a tuple subclass adding no slots, no dict. */
static int plain_tuple_subclass(PyObject *type, Py_ssize_t nfields)
{
    if (!PyType_Check(type))
        return 0;
    PyTypeObject *tp = (PyTypeObject *)type;
    if (!PyType_IsSubtype(tp, &PyTuple_Type) || tp->tp_basicsize != PyTuple_Type.tp_basicsize
        || tp->tp_itemsize != PyTuple_Type.tp_itemsize || tp->tp_dictoffset != 0
        || tp->tp_weaklistoffset != 0 || tp->tp_alloc != PyType_GenericAlloc || tp->tp_free != PyObject_GC_Del
        || !(tp->tp_flags & Py_TPFLAGS_HEAPTYPE))
        return 0;
#ifdef Py_TPFLAGS_MANAGED_DICT
    if (tp->tp_flags & Py_TPFLAGS_MANAGED_DICT)
        return 0;
#endif
#ifdef Py_TPFLAGS_MANAGED_WEAKREF
    if (tp->tp_flags & Py_TPFLAGS_MANAGED_WEAKREF)
        return 0;
#endif
    PyObject *fields = PyObject_GetAttrString(type, "_fields");
    if (fields == NULL) {
        PyErr_Clear();
        return 0;
    }
    int ok = PyTuple_Check(fields) && PyTuple_GET_SIZE(fields) == nfields;
    Py_DECREF(fields);
    return ok;
}

/* Import the result classes from kinspect.protocol.records, once. */
static int records_init(void)
{
    if (SummaryType != NULL)
        return 0;
    PyObject *mod = PyImport_ImportModule("kinspect.protocol.records");
    if (mod == NULL)
        return -1;
    PyObject *err = PyObject_GetAttrString(mod, "RecordsError");
    PyObject *batch = err ? PyObject_GetAttrString(mod, "BatchSummary") : NULL;
    PyObject *summary = batch ? PyObject_GetAttrString(mod, "RecordsSummary") : NULL;
    PyObject *codecs = summary ? PyObject_GetAttrString(mod, "_CODECS") : NULL;
    PyObject *unreadable = codecs ? PyObject_GetAttrString(mod, "_UNREADABLE") : NULL;
    Py_DECREF(mod);
    if (unreadable == NULL)
        goto fail;
    if (!PyTuple_Check(codecs) || PyTuple_GET_SIZE(codecs) != 8 || !PyUnicode_Check(unreadable)) {
        PyErr_SetString(PyExc_TypeError, "kinspect.protocol.records: _CODECS must be 8 names");
        goto fail;
    }
    if (S_ts_none == NULL) {
        if ((S_ts_none = PyUnicode_InternFromString("none")) == NULL
            || (S_ts_create = PyUnicode_InternFromString("create")) == NULL
            || (S_ts_log_append = PyUnicode_InternFromString("log_append")) == NULL)
            goto fail;
    }
    for (int i = 0; i < 8; i++) {
        CodecNames[i] = PyTuple_GET_ITEM(codecs, i);
        Py_INCREF(CodecNames[i]);
    }
    Py_DECREF(codecs);
    tuple_alloc_ok = plain_tuple_subclass(batch, N_BATCH_FIELDS) && plain_tuple_subclass(summary, N_SUMMARY_FIELDS);
    RecordsErrorType = err;
    BatchType = batch;
    S_unreadable = unreadable;
    SummaryType = summary; /* last: marks the state as ready */
    return 0;
fail:
    Py_XDECREF(err);
    Py_XDECREF(batch);
    Py_XDECREF(summary);
    Py_XDECREF(codecs);
    Py_XDECREF(unreadable);
    return -1;
}

/* An instance of `type` (BatchSummary or RecordsSummary) holding the n values, whose
 * references it steals (all of them, also on failure); NULL if any value is NULL.
 *
 * Allocated as tuple_alloc does for tuples (not zeroed) and left untracked by the cycle
 * collector: its items are ints, strs, bools and (for a RecordsSummary) an exact tuple of
 * BatchSummary, all immutable and new, so it can be part of no reference cycle (CPython
 * untracks such plain tuples itself). Saves the collector from walking every batch. */
static PyObject *fields_new(PyObject *type, PyObject **values, Py_ssize_t n)
{
    Py_ssize_t i;
    for (i = 0; i < n; i++)
        if (values[i] == NULL)
            goto fail;
    PyObject *t;
    if (tuple_alloc_ok) {
        t = (PyObject *)PyObject_GC_NewVar(PyTupleObject, (PyTypeObject *)type, n); /* increfs a heap type */
        if (t == NULL)
            goto fail;
#if PY_VERSION_HEX >= 0x030E0000
        ((PyTupleObject *)t)->ob_hash = -1; /* 3.14+ caches tuple hashes */
#endif
        memcpy(((PyTupleObject *)t)->ob_item, values, (size_t)n * sizeof(PyObject *));
        return t;
    }
    t = PyObject_Vectorcall(type, values, (size_t)n, NULL); /* the class's own __new__ */
    for (i = 0; i < n; i++)
        Py_DECREF(values[i]);
    return t;
fail:
    for (i = 0; i < n; i++)
        Py_XDECREF(values[i]);
    return NULL;
}

static inline PyObject *new_ref(PyObject *o)
{
    Py_INCREF(o);
    return o;
}

static inline PyObject *new_bool(int v) { return new_ref(v ? Py_True : Py_False); }

/* Why bytes are not a record set: the reason and its byte offset (RecordsError's args). */
typedef struct {
    char reason[128];
    Py_ssize_t offset;
} RecErr;

static int rec_error(RecErr *e, Py_ssize_t offset, const char *format, ...)
{
    va_list va;
    va_start(va, format);
    PyOS_vsnprintf(e->reason, sizeof e->reason, format, va);
    va_end(va);
    e->offset = offset;
    return -2;
}

/* v2 attributes -> compression, timestamp type, transactional, control (values[5,6,10,11]). */
static inline void v2_attributes(PyObject **v, int attributes)
{
    v[5] = new_ref(CodecNames[attributes & 0x07]);
    v[6] = new_ref(attributes & 0x08 ? S_ts_log_append : S_ts_create);
    v[10] = new_bool(attributes & 0x10);
    v[11] = new_bool(attributes & 0x20);
}

/* One v2 batch at p (pos within the records bytes), `available` bytes from p on (>= 17);
 * truncated when the batch runs past them. 0, -1 (Python error) or -2 (RecordsError). */
static int v2_batch(const unsigned char *p, Py_ssize_t pos, Py_ssize_t available, int truncated_,
                    int64_t base_offset, int32_t length, PyObject **out, RecErr *err)
{
    PyObject *v[N_BATCH_FIELDS];
    int32_t count = 0;
    if (available >= REC_V2_HEADER) {
        count = (int32_t)be32(p + REC_V2_COUNT_POS);
        if (count < 0)
            return rec_error(err, pos + REC_V2_COUNT_POS, "negative record count %ld", (long)count);
    }
    v[0] = PyLong_FromSsize_t(pos);
    v[1] = PyLong_FromLong(2);
    v[2] = PyLong_FromLongLong(base_offset);
    v[3] = PyLong_FromLong(length);
    v[4] = PyLong_FromLong(count);
    if (available >= 23)
        v2_attributes(v, (int16_t)be16(p + 21));
    else { /* cut before the attributes */
        v[5] = new_ref(S_unreadable);
        v[6] = new_ref(S_ts_none);
        v[10] = new_bool(0);
        v[11] = new_bool(0);
    }
    v[7] = available >= 51 ? PyLong_FromLongLong((int64_t)be64(p + 43)) : PyLong_FromLong(-1);
    v[8] = available >= 53 ? PyLong_FromLong((int16_t)be16(p + 51)) : PyLong_FromLong(-1);
    v[9] = available >= 57 ? PyLong_FromLong((int32_t)be32(p + 53)) : PyLong_FromLong(-1);
    int64_t first = available >= 35 ? (int64_t)be64(p + 27) : -1;
    int64_t max = available >= 43 ? (int64_t)be64(p + 35) : -1;
    v[12] = PyLong_FromLongLong(first);
    v[13] = first == max ? (v[12] ? new_ref(v[12]) : NULL) : PyLong_FromLongLong(max);
    v[14] = PyLong_FromLong((int32_t)be32(p + 12));
    v[15] = new_bool(0);
    v[16] = new_bool(truncated_);
    *out = fields_new(BatchType, v, N_BATCH_FIELDS);
    return *out == NULL ? -1 : 0;
}

/* One v0/v1 message at p, `available` bytes from p on (>= 17). 0 or -1. */
static int legacy_batch(const unsigned char *p, Py_ssize_t pos, Py_ssize_t available, int truncated_,
                        int magic, int64_t base_offset, int32_t length, PyObject **out)
{
    PyObject *v[N_BATCH_FIELDS];
    PyObject *compression = S_unreadable, *ts_type = S_ts_none;
    int wrapper = 0;
    int64_t timestamp = -1;
    if (available >= REC_LEGACY_ATTRIBUTES_END) {
        int attributes = (signed char)p[17];
        int codec = attributes & 0x07;
        compression = CodecNames[codec];
        wrapper = codec != 0;
        if (magic == 1) {
            ts_type = attributes & 0x08 ? S_ts_log_append : S_ts_create;
            if (available >= REC_V1_HEADER)
                timestamp = (int64_t)be64(p + 18);
        }
    }
    v[0] = PyLong_FromSsize_t(pos);
    v[1] = PyLong_FromLong(magic);
    v[2] = PyLong_FromLongLong(base_offset);
    v[3] = PyLong_FromLong(length);
    v[4] = PyLong_FromLong(1);
    v[5] = new_ref(compression);
    v[6] = new_ref(ts_type);
    v[7] = PyLong_FromLong(-1);
    v[8] = PyLong_FromLong(-1);
    v[9] = PyLong_FromLong(-1);
    v[10] = new_bool(0);
    v[11] = new_bool(0);
    v[12] = PyLong_FromLongLong(timestamp);
    v[13] = v[12] ? new_ref(v[12]) : NULL;
    v[14] = PyLong_FromLong(-1);
    v[15] = new_bool(wrapper);
    v[16] = new_bool(truncated_);
    *out = fields_new(BatchType, v, N_BATCH_FIELDS);
    return *out == NULL ? -1 : 0;
}

/* The RecordsSummary of the n bytes at p, or (pc not NULL) at frame offset `base` of a frame
 * in pieces, whose batch headers are read where they lie. NULL with err->offset >= 0 when
 * they are not a record set (no exception set: the caller raises RecordsError or records
 * None), NULL with err->offset == -1 and an exception set for a Python error (memory).
 * records_init first. */
static PyObject *summarize_bytes(const unsigned char *p, Pieces *pc, Py_ssize_t base, Py_ssize_t n, RecErr *err)
{
    PyObject *inline_items[16];
    PyObject **items = inline_items;
    Py_ssize_t count = 0, capacity = 16, pos = 0, truncated_bytes = 0;
    PyObject *result = NULL;
    int rc = 0;
    err->offset = -1;

    while (pos < n) {
        Py_ssize_t remaining = n - pos;
        /* Nothing past a batch's first REC_V2_HEADER bytes is read (v2_batch, legacy_batch). */
        const unsigned char *q = pc == NULL ? p + pos
                                 : piece_at(pc, base + pos, remaining < REC_V2_HEADER ? remaining : REC_V2_HEADER);
        if (remaining < REC_OVERHEAD) {
            truncated_bytes = remaining;
            break;
        }
        int64_t base_offset = (int64_t)be64(q);
        int32_t length = (int32_t)be32(q + 8);
        if (length < REC_ANY_MIN) {
            if (length < 0) {
                rc = rec_error(err, pos + 8, "negative batch length %ld", (long)length);
                break;
            }
            if (remaining <= REC_MAGIC_POS) {
                rc = rec_error(err, pos + 8,
                               "batch length %ld is smaller than any record batch or message (%d)",
                               (long)length, REC_ANY_MIN);
                break;
            }
        }
        if (remaining <= REC_MAGIC_POS) { /* cut before the magic byte */
            truncated_bytes = remaining;
            break;
        }
        int magic = q[REC_MAGIC_POS];
        Py_ssize_t end = pos + REC_OVERHEAD + (Py_ssize_t)length;
        int cut = end > n;
        if (magic == 2) {
            if (length < REC_V2_MIN) {
                rc = rec_error(err, pos + 8, "batch length %ld is smaller than the v2 record batch header minimum %d",
                               (long)length, REC_V2_MIN);
                break;
            }
        }
        else if (magic == 1 || magic == 0) {
            int minimum = magic ? REC_V1_MIN : REC_V0_MIN;
            if (length < minimum) {
                rc = rec_error(err, pos + 8, "message size %ld is smaller than the magic %d message minimum %d",
                               (long)length, magic, minimum);
                break;
            }
        }
        else {
            rc = rec_error(err, pos + REC_MAGIC_POS, "unknown magic %d", magic);
            break;
        }
        if (count == capacity) {
            Py_ssize_t grown = capacity * 2;
            PyObject **bigger = PyMem_Malloc((size_t)grown * sizeof(PyObject *));
            if (bigger == NULL) {
                PyErr_NoMemory();
                rc = -1;
                break;
            }
            memcpy(bigger, items, (size_t)count * sizeof(PyObject *));
            if (items != inline_items)
                PyMem_Free(items);
            items = bigger;
            capacity = grown;
        }
        Py_ssize_t available = cut ? remaining : end - pos;
        PyObject *batch = NULL;
        if (magic == 2)
            rc = v2_batch(q, pos, available, cut, base_offset, length, &batch, err);
        else
            rc = legacy_batch(q, pos, available, cut, magic, base_offset, length, &batch);
        if (rc < 0)
            break;
        items[count++] = batch;
        if (cut) {
            truncated_bytes = remaining;
            break;
        }
        pos = end;
    }

    if (rc == 0) {
        PyObject *v[N_SUMMARY_FIELDS];
        v[0] = PyTuple_New(count);
        if (v[0] != NULL) {
            for (Py_ssize_t i = 0; i < count; i++)
                PyTuple_SET_ITEM(v[0], i, items[i]);
            count = 0; /* now owned by the tuple */
            if (tuple_alloc_ok && PyObject_GC_IsTracked(v[0]))
                PyObject_GC_UnTrack(v[0]); /* its items are untracked: as fields_new */
        }
        v[1] = PyLong_FromSsize_t(n);
        v[2] = PyLong_FromSsize_t(truncated_bytes);
        result = fields_new(SummaryType, v, N_SUMMARY_FIELDS);
    }
    for (Py_ssize_t i = 0; i < count; i++)
        Py_DECREF(items[i]);
    if (items != inline_items)
        PyMem_Free(items);
    if (rc == -2 && PyErr_Occurred()) /* cannot happen; a Python error wins */
        err->offset = -1;
    return result;
}

/* Raise RecordsError(reason, offset) from err. */
static void raise_records_error(const RecErr *err)
{
    PyObject *exc = PyObject_CallFunction(RecordsErrorType, "sn", err->reason, err->offset);
    if (exc != NULL) {
        PyErr_SetObject(RecordsErrorType, exc);
        Py_DECREF(exc);
    }
}

/* summarize_records(data, start=0, end=None) */
static PyObject *wire_summarize_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 3) {
        PyErr_SetString(PyExc_TypeError, "summarize_records(data, start=0, end=None)");
        return NULL;
    }
    PyObject *data = args[0];
    if (data == Py_None)
        Py_RETURN_NONE;
    if (records_init() < 0)
        return NULL;
    Py_buffer view;
    view.obj = NULL;
    PyObject *keep = NULL; /* a memoryview, or the bytes copied from a strided one */
    const unsigned char *p;
    Py_ssize_t n;
    if (PyBytes_Check(data)) {
        p = (const unsigned char *)PyBytes_AS_STRING(data);
        n = PyBytes_GET_SIZE(data);
    }
    else if (PyByteArray_Check(data)) {
        /* The export keeps the bytearray from being resized while it is read. */
        if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0)
            return NULL;
        p = view.buf;
        n = view.len;
    }
    else {
        /* As records._flat(memoryview(data)): a C-contiguous view's bytes as they lie in
         * memory (what cast("B") reads), any other view's bytes in logical order. */
        keep = PyMemoryView_FromObject(data); /* TypeError for what is not a buffer */
        if (keep == NULL)
            return NULL;
        Py_buffer *b = PyMemoryView_GET_BUFFER(keep);
        if (!PyBuffer_IsContiguous(b, 'C')) {
            PyObject *flat = PyObject_CallMethod(keep, "tobytes", NULL);
            Py_DECREF(keep);
            if (flat == NULL)
                return NULL;
            keep = flat;
            p = (const unsigned char *)PyBytes_AS_STRING(flat);
            n = PyBytes_GET_SIZE(flat);
        }
        else {
            p = b->buf;
            n = b->len;
        }
    }
    PyObject *result = NULL;
    Py_ssize_t start = 0, stop = n;
    if (nargs > 1 && (start = PyLong_AsSsize_t(args[1])) == -1 && PyErr_Occurred())
        goto done;
    if (nargs > 2 && args[2] != Py_None && (stop = PyLong_AsSsize_t(args[2])) == -1 && PyErr_Occurred())
        goto done;
    if (start < 0 || stop < start || stop > n) {
        PyErr_Format(PyExc_ValueError, "start %zd and end %zd do not fit the %zd bytes", start, stop, n);
        goto done;
    }
    RecErr err;
    result = summarize_bytes(p + start, NULL, 0, stop - start, &err);
    if (result == NULL && err.offset >= 0)
        raise_records_error(&err);
done:
    if (view.obj != NULL)
        PyBuffer_Release(&view);
    Py_XDECREF(keep);
    return result;
}

/* The start and length of a records span, start << 32 | length (ScanResult.record_spans). */
static int span_parts(PyObject *span, Py_ssize_t *start, Py_ssize_t *n)
{
    if (!PyLong_Check(span)) {
        PyErr_Format(PyExc_TypeError, "a records span must be an int, not %.100s", Py_TYPE(span)->tp_name);
        return -1;
    }
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(span, &overflow);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (overflow == 0 && v >= 0) {
        *start = (Py_ssize_t)(v >> 32);
        *n = (Py_ssize_t)(v & 0xFFFFFFFF);
        return 0;
    }
    if (overflow < 0 || v < 0) {
        PyErr_SetString(PyExc_ValueError, "a records span cannot be negative");
        return -1;
    }
    /* start >= 2**31: a buffer of 2 GiB or more */
    PyObject *shift = PyLong_FromLong(32);
    PyObject *high = shift ? PyNumber_Rshift(span, shift) : NULL;
    PyObject *mask = high ? PyLong_FromUnsignedLong(0xFFFFFFFFul) : NULL;
    PyObject *low = mask ? PyNumber_And(span, mask) : NULL;
    int rc = -1;
    if (low != NULL && (*start = PyLong_AsSsize_t(high)) != -1 && (*n = PyLong_AsSsize_t(low)) != -1)
        rc = 0;
    Py_XDECREF(shift);
    Py_XDECREF(high);
    Py_XDECREF(mask);
    Py_XDECREF(low);
    return rc;
}

/* summarize_spans(source, spans, into, first=0): for each span of spans[first:] (ScanResult.
 * record_spans), append to into the summary of those bytes of source, None where they are not
 * a record set. What ScanResult.records calls, as the scanner used to for every field. */
static PyObject *wire_summarize_spans(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 3 || nargs > 4) {
        PyErr_SetString(PyExc_TypeError, "summarize_spans(source, spans, into, first=0)");
        return NULL;
    }
    PyObject *source = args[0], *spans = args[1], *into = args[2];
    if (!(PyBytes_Check(source) || PyTuple_Check(source)) || !PyList_Check(spans) || !PyList_Check(into)) {
        PyErr_SetString(PyExc_TypeError, "summarize_spans(source, spans, into): bytes or a tuple of pieces, list, list");
        return NULL;
    }
    Py_ssize_t first = 0;
    if (nargs > 3 && (first = PyLong_AsSsize_t(args[3])) == -1 && PyErr_Occurred())
        return NULL;
    if (first < 0) {
        PyErr_SetString(PyExc_ValueError, "first cannot be negative");
        return NULL;
    }
    if (records_init() < 0)
        return NULL;
    const unsigned char *p = NULL;
    Py_ssize_t size;
    Pieces pieces, *pc = NULL;
    if (PyTuple_Check(source)) { /* the frame in pieces that the scan read (see run_scan) */
        if (pieces_open(source, &pieces, &size) < 0) {
            pieces_close(&pieces);
            return NULL;
        }
        pc = &pieces;
    }
    else {
        p = (const unsigned char *)PyBytes_AS_STRING(source);
        size = PyBytes_GET_SIZE(source);
    }
    PyObject *ok = NULL;
    for (Py_ssize_t i = first; i < PyList_GET_SIZE(spans); i++) {
        PyObject *span = new_ref(PyList_GET_ITEM(spans, i));
        Py_ssize_t start, n;
        int rc = span_parts(span, &start, &n);
        Py_DECREF(span);
        if (rc < 0)
            goto done;
        if (start > size || n > size - start) {
            PyErr_Format(PyExc_ValueError, "records span of %zd bytes at %zd does not fit the %zd bytes", n, start,
                         size);
            goto done;
        }
        RecErr err;
        PyObject *s = pc == NULL ? summarize_bytes(p + start, NULL, 0, n, &err) : summarize_bytes(NULL, pc, start, n, &err);
        if (s == NULL) {
            if (err.offset < 0)
                goto done; /* a Python error (memory): not a RecordsError */
            s = new_ref(Py_None);
        }
        rc = PyList_Append(into, s);
        Py_DECREF(s);
        if (rc < 0)
            goto done;
    }
    ok = new_ref(Py_None);
done:
    if (pc != NULL)
        pieces_close(pc);
    return ok;
}

/* ------------------------------------------------------------------ scanning */

static int scan_struct(Ctx *c, const SProg *sp, Py_ssize_t *ppos);

static int count_error(Ctx *c, long long code)
{
    PyObject *key = PyLong_FromLongLong(code);
    if (key == NULL)
        return -1;
    PyObject *old = PyDict_GetItemWithError(c->errors, key); /* borrowed */
    PyObject *value;
    if (old != NULL) {
        PyObject *one = PyLong_FromLong(1);
        value = one ? PyNumber_Add(old, one) : NULL;
        Py_XDECREF(one);
    }
    else if (PyErr_Occurred())
        value = NULL;
    else
        value = PyLong_FromLong(1);
    int rc = value ? PyDict_SetItem(c->errors, key, value) : -1;
    Py_XDECREF(value);
    Py_DECREF(key);
    return rc;
}

/* The UTF-8 string of n bytes at pos (pieces: copied when it straddles two). */
static PyObject *utf8_at(const Ctx *c, Py_ssize_t pos, Py_ssize_t n)
{
    const unsigned char *q = AT(c, pos, n);
    return q == NULL ? NULL : utf8(q, n);
}

static int add_topic(Ctx *c, Py_ssize_t pos, long long n)
{
    PyObject *s = utf8_at(c, pos, (Py_ssize_t)n);
    if (s == NULL)
        return -1;
    int rc = PySet_Add(c->topics, s);
    Py_DECREF(s);
    return rc;
}

/* Where a records field lies: start << 32 | length appended to result.record_spans, as the
 * reference scanner does (ScanResult.records summarizes them when first read). n < 2**32
 * always (an int32 or a 32-bit varint); start too unless the buffer holds 4 GiB or more. */
static int record_span(Ctx *c, Py_ssize_t pos, long long n)
{
    PyObject *s;
    if ((unsigned long long)pos <= 0xFFFFFFFFull)
        s = PyLong_FromUnsignedLongLong(((unsigned long long)pos << 32) | (unsigned long long)n);
    else {
        PyObject *start = PyLong_FromSsize_t(pos);
        PyObject *shift = start ? PyLong_FromLong(32) : NULL;
        PyObject *high = shift ? PyNumber_Lshift(start, shift) : NULL;
        PyObject *low = high ? PyLong_FromLongLong(n) : NULL;
        s = low ? PyNumber_Or(high, low) : NULL;
        Py_XDECREF(start);
        Py_XDECREF(shift);
        Py_XDECREF(high);
        Py_XDECREF(low);
    }
    if (s == NULL)
        return -1;
    int rc;
    if (PyList_CheckExact(c->spans))
        rc = PyList_Append(c->spans, s);
    else {
        PyObject *r = PyObject_CallMethod(c->spans, "append", "O", s);
        rc = r == NULL ? -1 : 0;
        Py_XDECREF(r);
    }
    Py_DECREF(s);
    return rc;
}

/* Bytes of a varint holding x (7 bits a byte; 0 takes one byte). */
static inline int varint_len(uint64_t x)
{
    if (x == 0)
        return 1;
    int bits = 64 - __builtin_clzll(x);
    return (bits + 6) / 7;
}

/* One integer value into its slot (codec_runtime.count_int, without the occurrence count). */
static inline void count_value(uint32_t *s, const Field *f, long long v)
{
    int u = v >= 0 ? varint_len((uint64_t)v) : f->ineg;
    int z = varint_len(((uint64_t)v << 1) ^ (uint64_t)(v >> 63));
    s[1] += 1;
    s[2] += f->today > 0 ? f->today : (f->today == 0 ? z : (v >= 0 ? u : f->today_neg));
    s[3] += u;
    s[4] += z;
    s[4 + u] += 1;
    s[14 + z] += 1;
}

static inline long long fixed_int(int kind, const unsigned char *q)
{
    return kind == K_INT16 ? (long long)(int16_t)be16(q)
         : kind == K_INT32 ? (long long)(int32_t)be32(q) : (long long)(int64_t)be64(q);
}

/* A topic listed in an array of names: topic_partitions[name] = topic_partitions.get(name, 0). */
static int list_topic(Ctx *c, PyObject *name)
{
    int has = PyDict_Contains(c->tparts, name);
    if (has != 0)
        return has < 0 ? -1 : 0;
    PyObject *zero = PyLong_FromLong(0);
    int rc = zero ? PyDict_SetItem(c->tparts, name, zero) : -1;
    Py_XDECREF(zero);
    return rc;
}

/* A struct's topic and the partitions it names: topic_partitions[name] += parts. */
static int add_topic_partitions(Ctx *c, Py_ssize_t pos, Py_ssize_t n, long long parts)
{
    PyObject *name = utf8_at(c, pos, n);
    if (name == NULL)
        return -1;
    PyObject *old = PyDict_GetItemWithError(c->tparts, name); /* borrowed */
    PyObject *value = NULL;
    if (old != NULL)
        value = PyLong_FromLongLong(PyLong_AsLongLong(old) + parts);
    else if (!PyErr_Occurred())
        value = PyLong_FromLongLong(parts);
    int rc = value ? PyDict_SetItem(c->tparts, name, value) : -1;
    Py_XDECREF(value);
    Py_DECREF(name);
    return rc;
}

/* What scan_struct learns from its role fields: the topic's bytes and the partitions named. */
typedef struct {
    Py_ssize_t tpos, tlen;
    long long parts;
} Roles;

static int scan_value(Ctx *c, const Field *f, Py_ssize_t *ppos, Roles *roles);

/* A non-empty tag section (codec_runtime.scan_tags); known fields are walked for capture facts. */
static int scan_tags(Ctx *c, const SProg *sp, Py_ssize_t *ppos)
{
    Py_ssize_t L = c->n, start = *ppos, pos = *ppos;
    uint64_t count;
    if (read_uvarint(c, &pos, L, 32, &count) < 0)
        return -1;
    if ((long long)count > (long long)(L - pos))
        return fail("tag section of %llu fields overruns the %zd bytes left", (unsigned long long)count, L - pos);
    long long previous = -1;
    for (uint64_t k = 0; k < count; k++) {
        uint64_t tag, size;
        if (read_uvarint(c, &pos, L, 32, &tag) < 0 || read_uvarint(c, &pos, L, 32, &size) < 0)
            return -1;
        if ((long long)tag <= previous)
            return fail("tag %llu after tag %lld: tags must be unique and ascending", (unsigned long long)tag, previous);
        previous = (long long)tag;
        if ((long long)size > (long long)(L - pos))
            return fail("tagged field %llu of %llu bytes overruns the %zd bytes left", (unsigned long long)tag,
                        (unsigned long long)size, L - pos);
        const Field *tf = find_tag(sp, tag);
        if (!c->inner) {
            PyObject *item = Py_BuildValue("(OKOK)", sp->path, (unsigned long long)tag, tf ? tf->key : Py_None,
                                           (unsigned long long)size);
            if (item == NULL)
                return -1;
            int rc = PyList_Append(c->tagged, item);
            Py_DECREF(item);
            if (rc < 0)
                return -1;
        }
        Py_ssize_t end = pos + (Py_ssize_t)size;
        if (tf != NULL) { /* walked within its declared bytes, which it must fill (as read_tags) */
            Py_ssize_t outer = c->n, p = pos;
            c->n = end;
            c->inner++;
            int rc = scan_value(c, tf, &p, NULL);
            c->inner--;
            c->n = outer;
            if (rc < 0)
                return -1;
            if (p != end)
                return fail("tagged field %U declares %llu bytes but its value takes %zd", tf->key,
                            (unsigned long long)size, p - pos);
        }
        pos = end;
    }
    if (!c->inner) {
        c->sections += 1;
        c->section_bytes += pos - start;
    }
    *ppos = pos;
    return 0;
}

static int scan_value(Ctx *c, const Field *f, Py_ssize_t *ppos, Roles *roles)
{
    Py_ssize_t L = c->n, pos = *ppos;
    int kind = f->kind;
    if (IS_FIXED(kind)) {
        Py_ssize_t size = FIXED_SIZE[kind];
        if (L - pos < size)
            return truncated("a fixed-width field");
        if (f->is_error && !c->inner) { /* int16 only (checked when compiling) */
            int16_t code = (int16_t)be16(AT(c, pos, 2));
            if (code && count_error(c, code) < 0)
                return -1;
        }
        if (f->slot >= 0 && c->istats != NULL) {
            uint32_t *s = c->istats + f->slot;
            s[0] += 1;
            count_value(s, f, fixed_int(kind, AT(c, pos, size)));
        }
        *ppos = pos + size;
        return 0;
    }
    switch (kind) {
    case K_STRING:
    case K_BYTES:
    case K_RECORDS: {
        long long n = 0;
        const char *what = blob_name(kind);
        if (read_length(c, ppos, L, f->compact, kind != K_STRING, &n) < 0)
            return -1;
        if (f->prefix)
            c->compact += varint_len((uint64_t)(n + 1)) - f->prefix;
        int null = check_null(n, f->nullable, what);
        if (null)
            return null < 0 ? -1 : 0;
        pos = *ppos;
        if (check_blob(n, pos, L, what) < 0)
            return -1;
        if (kind == K_STRING && f->is_topic) {
            if (!c->inner && add_topic(c, pos, n) < 0)
                return -1;
            if (c->inner) { /* the reference decodes it all the same: invalid UTF-8 fails here too */
                PyObject *t = utf8_at(c, pos, (Py_ssize_t)n);
                if (t == NULL)
                    return -1;
                Py_DECREF(t);
            }
            if (f->role == 1 && roles != NULL) {
                roles->tpos = pos;
                roles->tlen = (Py_ssize_t)n;
            }
        }
        else if (kind == K_RECORDS && !c->inner) {
            if (record_span(c, pos, n) < 0)
                return -1;
        }
        *ppos = pos + (Py_ssize_t)n;
        return 0;
    }
    case K_STRUCT:
        if (f->nullable) {
            if (pos >= L)
                return truncated("a struct marker");
            *ppos = pos + 1;
            if (*AT(c, pos, 1) >= 128)
                return 0;
        }
        return scan_struct(c, f->sub, ppos);
    case K_ARRAY: {
        long long n = 0;
        if (read_length(c, ppos, L, f->compact, 1, &n) < 0)
            return -1;
        if (f->prefix)
            c->compact += varint_len((uint64_t)(n + 1)) - f->prefix;
        int null = check_null(n, f->nullable, "array");
        if (null)
            return null < 0 ? -1 : 0;
        pos = *ppos;
        if (f->role == 2 && roles != NULL)
            roles->parts += n;
        if (check_count(n, f->least, pos, L) < 0)
            return -1;
        int elem = f->elem;
        if (IS_FIXED(elem)) {
            if ((long long)(L - pos) / FIXED_SIZE[elem] < n)
                return truncated("an array");
            if (f->slot >= 0 && c->istats != NULL) {
                uint32_t *s = c->istats + f->slot;
                Py_ssize_t w = FIXED_SIZE[elem];
                s[0] += 1; /* the field was there, even empty */
                for (long long i = 0; i < n; i++)
                    count_value(s, f, fixed_int(elem, AT(c, pos + (Py_ssize_t)i * w, w)));
            }
            *ppos = pos + (Py_ssize_t)n * FIXED_SIZE[elem];
            return 0;
        }
        if (elem == K_STRUCT) {
            for (long long i = 0; i < n; i++)
                if (scan_struct(c, f->sub, ppos) < 0)
                    return -1;
            return 0;
        }
        const char *what = blob_name(elem);
        int topic = elem == K_STRING && f->is_topic;
        for (long long i = 0; i < n; i++) {
            long long m = 0;
            if (read_length(c, ppos, L, f->compact, elem != K_STRING, &m) < 0)
                return -1;
            if (f->eprefix)
                c->compact += varint_len((uint64_t)(m + 1)) - f->eprefix;
            if (check_null(m, 0, what) < 0 || check_blob(m, *ppos, L, what) < 0)
                return -1;
            if (topic) {
                PyObject *name = utf8_at(c, *ppos, (Py_ssize_t)m);
                if (name == NULL)
                    return -1;
                int rc = (!c->inner && PySet_Add(c->topics, name) < 0) || list_topic(c, name) < 0 ? -1 : 0;
                Py_DECREF(name);
                if (rc < 0)
                    return -1;
            }
            *ppos += (Py_ssize_t)m;
        }
        return 0;
    }
    default: { /* K_ENCODED: the scanner reads it but does not range-check it */
        long long v;
        if (read_encoded(c, f, ppos, L, &v) < 0)
            return -1;
        if (f->is_error && !c->inner && v && count_error(c, v) < 0)
            return -1;
        if (f->slot >= 0 && c->istats != NULL) {
            uint32_t *s = c->istats + f->slot;
            s[0] += 1;
            count_value(s, f, v);
        }
        return 0;
    }
    }
}

static int scan_struct(Ctx *c, const SProg *sp, Py_ssize_t *ppos)
{
    const Field *f = sp->fields, *stop = sp->fields + sp->nfields;
    Roles roles = {-1, 0, 0};
    c->compact += sp->grows;
    for (; f < stop; f++)
        if (scan_value(c, f, ppos, &roles) < 0)
            return -1;
    if (sp->flexible) {
        Py_ssize_t pos = *ppos;
        if (pos >= c->n)
            return truncated("a tag section");
        if (*AT(c, pos, 1) == 0) {
            *ppos = pos + 1;
            if (!c->inner)
                c->empty++;
        }
        else if (scan_tags(c, sp, ppos) < 0)
            return -1;
    }
    if (roles.tpos >= 0)
        return add_topic_partitions(c, roles.tpos, roles.tlen, roles.parts);
    return 0;
}

/* ------------------------------------------------------------------ compiling programs */

static void free_struct(SProg *sp);

static void clear_field(Field *f)
{
    Py_CLEAR(f->key);
    if (f->sub != NULL) {
        free_struct(f->sub);
        f->sub = NULL;
    }
}

static void free_struct(SProg *sp)
{
    if (sp == NULL)
        return;
    if (sp->fields != NULL)
        for (Py_ssize_t i = 0; i < sp->nfields; i++)
            clear_field(&sp->fields[i]);
    if (sp->tag_fields != NULL)
        for (Py_ssize_t i = 0; i < sp->ntags; i++)
            clear_field(&sp->tag_fields[i]);
    PyMem_Free(sp->fields);
    PyMem_Free(sp->tag_fields);
    PyMem_Free(sp->tags);
    Py_CLEAR(sp->path);
    PyMem_Free(sp);
}

static int bad_program(const char *what)
{
    PyErr_Format(PyExc_ValueError, "bad wire program: %s", what);
    return -1;
}

static int kind_of(PyObject *name)
{
    if (!PyUnicode_Check(name))
        return -1;
    for (int k = 0; k < K_COUNT; k++)
        if (PyUnicode_CompareWithASCIIString(name, KIND_NAMES[k]) == 0)
            return k;
    return -1;
}

static int truth(PyObject *o, char *out)
{
    int t = PyObject_IsTrue(o);
    if (t < 0)
        return -1;
    *out = (char)t;
    return 0;
}

static SProg *compile_struct(PyObject *t, int depth);

static int compile_field(PyObject *t, Field *f, int depth)
{
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 11)
        return bad_program("a field is not an 11-tuple");
    PyObject *key = PyTuple_GET_ITEM(t, 0);
    if (!PyUnicode_CheckExact(key))
        return bad_program("a field key is not a str");
    Py_INCREF(key);
    PyUnicode_InternInPlace(&key);
    f->key = key;
    f->hash = PyObject_Hash(key);
    if (f->hash == -1)
        return -1;
    f->kind = kind_of(PyTuple_GET_ITEM(t, 1));
    if (f->kind < 0)
        return bad_program("unknown field kind");
    if (truth(PyTuple_GET_ITEM(t, 2), &f->nullable) < 0 || truth(PyTuple_GET_ITEM(t, 3), &f->compact) < 0
        || truth(PyTuple_GET_ITEM(t, 4), &f->is_error) < 0 || truth(PyTuple_GET_ITEM(t, 5), &f->is_topic) < 0)
        return -1;
    PyObject *arg = PyTuple_GET_ITEM(t, 6);
    if (f->is_error && f->kind != K_INT16 && f->kind != K_ENCODED)
        return bad_program("an error code field must be an int16");
    /* capture facts: slot, prefixes, role */
    PyObject *slot = PyTuple_GET_ITEM(t, 7);
    f->slot = -1;
    if (slot != Py_None) {
        long vals[4];
        if (!PyTuple_Check(slot) || PyTuple_GET_SIZE(slot) != 4)
            return bad_program("a slot is not (offset, negative, today, today_negative)");
        for (int i = 0; i < 4; i++) {
            vals[i] = PyLong_AsLong(PyTuple_GET_ITEM(slot, i));
            if (vals[i] == -1 && PyErr_Occurred())
                return -1;
        }
        int k = f->kind == K_ARRAY ? -1 : f->kind; /* array: checked below, once elem is known */
        if (vals[0] < 0 || vals[0] > PY_SSIZE_T_MAX / 2 || vals[1] < 1 || vals[1] > 10 || vals[2] < -1
            || vals[2] > 8 || vals[3] < 0 || vals[3] > 10
            || !(k == -1 || k == K_INT16 || k == K_INT32 || k == K_INT64 || k == K_ENCODED))
            return bad_program("bad integer slot");
        f->slot = vals[0];
        f->ineg = (char)vals[1];
        f->today = (char)vals[2];
        f->today_neg = (char)vals[3];
    }
    long pv[3];
    for (int i = 0; i < 3; i++) {
        pv[i] = PyLong_AsLong(PyTuple_GET_ITEM(t, 8 + i));
        if (pv[i] == -1 && PyErr_Occurred())
            return -1;
    }
    if (pv[0] < 0 || pv[0] > 4 || pv[1] < 0 || pv[1] > 4 || pv[2] < 0 || pv[2] > 2)
        return bad_program("bad prefix or role");
    f->prefix = (char)pv[0];
    f->eprefix = (char)pv[1];
    f->role = (char)pv[2];
    switch (f->kind) {
    case K_STRUCT:
        f->sub = compile_struct(arg, depth + 1);
        return f->sub == NULL ? -1 : 0;
    case K_ARRAY: {
        if (!PyTuple_Check(arg) || PyTuple_GET_SIZE(arg) != 3)
            return bad_program("an array argument is not a 3-tuple");
        f->elem = kind_of(PyTuple_GET_ITEM(arg, 0));
        if (f->elem < 0 || !(IS_FIXED(f->elem) || f->elem == K_STRING || f->elem == K_BYTES || f->elem == K_STRUCT))
            return bad_program("bad array element kind");
        f->least = PyLong_AsSsize_t(PyTuple_GET_ITEM(arg, 2));
        if (f->least == -1 && PyErr_Occurred())
            return -1;
        if (f->least < 1)
            return bad_program("an array's least element size must be at least 1");
        if (f->slot >= 0 && f->elem != K_INT16 && f->elem != K_INT32 && f->elem != K_INT64)
            return bad_program("bad integer slot");
        if (f->elem == K_STRUCT) {
            f->sub = compile_struct(PyTuple_GET_ITEM(arg, 1), depth + 1);
            return f->sub == NULL ? -1 : 0;
        }
        if (PyTuple_GET_ITEM(arg, 1) != Py_None)
            return bad_program("a primitive array has an element struct");
        return 0;
    }
    case K_ENCODED: {
        PyObject *form, *lo, *hi;
        if (!PyTuple_Check(arg) || PyTuple_GET_SIZE(arg) != 4)
            return bad_program("an encoding argument is not a 4-tuple");
        form = PyTuple_GET_ITEM(arg, 0);
        if (!PyUnicode_Check(form))
            return bad_program("bad encoding form");
        if (PyUnicode_CompareWithASCIIString(form, "fixed") == 0)
            f->form = F_FIXED;
        else if (PyUnicode_CompareWithASCIIString(form, "packed") == 0)
            f->form = F_PACKED;
        else if (PyUnicode_CompareWithASCIIString(form, "upacked") == 0)
            f->form = F_UPACKED;
        else
            return bad_program("bad encoding form");
        long bits = PyLong_AsLong(PyTuple_GET_ITEM(arg, 1));
        if (bits == -1 && PyErr_Occurred())
            return -1;
        if (bits != 16 && bits != 32 && bits != 64)
            return bad_program("encoding bits must be 16, 32 or 64");
        f->bits = (int)bits;
        lo = PyTuple_GET_ITEM(arg, 2);
        hi = PyTuple_GET_ITEM(arg, 3);
        if (lo == Py_None && hi == Py_None)
            f->has_range = 0;
        else {
            f->has_range = 1;
            f->lo = PyLong_AsLongLong(lo);
            if (f->lo == -1 && PyErr_Occurred())
                return -1;
            f->hi = PyLong_AsLongLong(hi);
            if (f->hi == -1 && PyErr_Occurred())
                return -1;
        }
        return 0;
    }
    default:
        if (arg != Py_None)
            return bad_program("a primitive field has an argument");
        return 0;
    }
}

static SProg *compile_struct(PyObject *t, int depth)
{
    if (depth > MAX_DEPTH) {
        bad_program("structs nested too deep");
        return NULL;
    }
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 5) {
        bad_program("a struct is not a 5-tuple");
        return NULL;
    }
    PyObject *fields = PyTuple_GET_ITEM(t, 1), *tags = PyTuple_GET_ITEM(t, 2), *path = PyTuple_GET_ITEM(t, 3);
    if (!PyTuple_Check(fields) || !PyTuple_Check(tags) || !PyUnicode_Check(path)) {
        bad_program("a struct is not (flexible, fields, tags, path, grows)");
        return NULL;
    }
    SProg *sp = PyMem_Calloc(1, sizeof(SProg));
    if (sp == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    int flexible = PyObject_IsTrue(PyTuple_GET_ITEM(t, 0));
    if (flexible < 0)
        goto fail;
    sp->flexible = flexible;
    int grows = PyObject_IsTrue(PyTuple_GET_ITEM(t, 4));
    if (grows < 0)
        goto fail;
    sp->grows = grows;
    Py_INCREF(path);
    sp->path = path;
    sp->fields = PyMem_Calloc(PyTuple_GET_SIZE(fields) + 1, sizeof(Field));
    sp->tag_fields = PyMem_Calloc(PyTuple_GET_SIZE(tags) + 1, sizeof(Field));
    sp->tags = PyMem_Calloc(PyTuple_GET_SIZE(tags) + 1, sizeof(uint64_t));
    if (sp->fields == NULL || sp->tag_fields == NULL || sp->tags == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(fields); i++) {
        sp->nfields = i + 1;
        if (compile_field(PyTuple_GET_ITEM(fields, i), &sp->fields[i], depth) < 0)
            goto fail;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(tags); i++) {
        PyObject *pair = PyTuple_GET_ITEM(tags, i);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
            bad_program("a tag entry is not (tag, field)");
            goto fail;
        }
        unsigned long long tag = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(pair, 0));
        if (tag == (unsigned long long)-1 && PyErr_Occurred())
            goto fail;
        if (tag > 0xFFFFFFFFULL || (i > 0 && tag <= sp->tags[i - 1])) {
            bad_program("tags must be ascending uint32 values");
            goto fail;
        }
        sp->tags[i] = tag;
        sp->ntags = i + 1;
        if (compile_field(PyTuple_GET_ITEM(pair, 1), &sp->tag_fields[i], depth) < 0)
            goto fail;
    }
    return sp;
fail:
    free_struct(sp);
    return NULL;
}

/* ------------------------------------------------------------------ the Program type */

typedef struct {
    PyObject_HEAD
    PyObject *source;
    SProg *root;
    Py_ssize_t nstats;      /* counters the integer slots need in result.int_stats */
} ProgramObject;

/* The int_stats counters a struct's slots reach (the highest slot offset + SLOT_STRIDE). */
#define SLOT_STRIDE 25
static Py_ssize_t stats_needed(const SProg *sp)
{
    Py_ssize_t most = 0;
    for (int pass = 0; pass < 2; pass++) {
        const Field *fs = pass ? sp->tag_fields : sp->fields;
        Py_ssize_t n = pass ? sp->ntags : sp->nfields;
        for (Py_ssize_t i = 0; i < n; i++) {
            if (fs[i].slot >= 0 && fs[i].slot + SLOT_STRIDE > most)
                most = fs[i].slot + SLOT_STRIDE;
            if (fs[i].sub != NULL) {
                Py_ssize_t sub = stats_needed(fs[i].sub);
                if (sub > most)
                    most = sub;
            }
        }
    }
    return most;
}

static PyTypeObject ProgramType;

static PyObject *program_from_tuple(PyObject *source)
{
    SProg *root = compile_struct(source, 0);
    if (root == NULL)
        return NULL;
    ProgramObject *self = PyObject_New(ProgramObject, &ProgramType);
    if (self == NULL) {
        free_struct(root);
        return NULL;
    }
    Py_INCREF(source);
    self->source = source;
    self->root = root;
    self->nstats = stats_needed(root);
    return (PyObject *)self;
}

static void program_dealloc(ProgramObject *self)
{
    free_struct(self->root);
    Py_XDECREF(self->source);
    PyObject_Free(self);
}

static int get_pos(PyObject *posobj, Py_ssize_t *pos)
{
    if (posobj == NULL) {
        *pos = 0;
        return 0;
    }
    *pos = PyLong_AsSsize_t(posobj);
    if (*pos == -1 && PyErr_Occurred())
        return -1;
    if (*pos < 0) {
        PyErr_SetString(PyExc_ValueError, "pos must not be negative");
        return -1;
    }
    return 0;
}

static int get_buffer(PyObject *buf, PyObject *posobj, Py_ssize_t *pos)
{
    if (!PyBytes_Check(buf)) {
        PyErr_Format(PyExc_TypeError, "buf must be bytes, not %.100s", Py_TYPE(buf)->tp_name);
        return -1;
    }
    return get_pos(posobj, pos);
}

static PyObject *run_decode(ProgramObject *prog, PyObject *buf, PyObject *posobj)
{
    Py_ssize_t pos;
    if (get_buffer(buf, posobj, &pos) < 0)
        return NULL;
    Ctx c;
    memset(&c, 0, sizeof c);
    c.p = (const unsigned char *)PyBytes_AS_STRING(buf);
    c.n = PyBytes_GET_SIZE(buf);
    c.buf = buf;
    /* No collection while the tree is built: it holds only new objects, none with a
     * finalizer, and no Python code runs here (unless UUIDs need UUID.__init__), so the
     * pause is invisible; it saves the collector from walking (and promoting) the
     * half-built tree over and over, which costs more than the decoding itself. */
    int gc_was_enabled = uuid_int_off >= 0 ? PyGC_Disable() : 0;
    PyObject *d = decode_struct(&c, prog->root, &pos, c.n);
    if (gc_was_enabled)
        PyGC_Enable();
    if (d == NULL)
        return NULL;
    PyObject *end = PyLong_FromSsize_t(pos);
    if (end == NULL) {
        Py_DECREF(d);
        return NULL;
    }
    PyObject *out = PyTuple_New(2);
    if (out == NULL) {
        Py_DECREF(d);
        Py_DECREF(end);
        return NULL;
    }
    PyTuple_SET_ITEM(out, 0, d);
    PyTuple_SET_ITEM(out, 1, end);
    return out;
}

static int add_to_attr(PyObject *obj, PyObject *name, Py_ssize_t amount)
{
    PyObject *old = PyObject_GetAttr(obj, name);
    if (old == NULL)
        return -1;
    PyObject *delta = PyLong_FromSsize_t(amount);
    PyObject *value = delta ? PyNumber_Add(old, delta) : NULL;
    Py_DECREF(old);
    Py_XDECREF(delta);
    if (value == NULL)
        return -1;
    int rc = PyObject_SetAttr(obj, name, value);
    Py_DECREF(value);
    return rc;
}

/* Fold the counters kept in C into the result (also after a failure, as Python would have). */
static int flush_counters(Ctx *c)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    int rc = 0;
    if (c->empty) {
        PyObject *counter = PyObject_GetAttr(c->result, S_empty_counter);
        PyObject *old = counter ? PySequence_GetItem(counter, 0) : NULL;
        PyObject *delta = old ? PyLong_FromSsize_t(c->empty) : NULL;
        PyObject *sum = delta ? PyNumber_Add(old, delta) : NULL;
        if (sum == NULL || PySequence_SetItem(counter, 0, sum) < 0)
            rc = -1;
        Py_XDECREF(counter);
        Py_XDECREF(old);
        Py_XDECREF(delta);
        Py_XDECREF(sum);
    }
    if (rc == 0 && c->sections) {
        if (add_to_attr(c->result, S_tag_sections, c->sections) < 0
            || add_to_attr(c->result, S_tag_section_bytes, c->section_bytes) < 0)
            rc = -1;
    }
    if (type != NULL) {
        if (rc < 0)
            PyErr_Clear();
        PyErr_Restore(type, value, tb);
        return -1;
    }
    return rc;
}

/* The scan proper: the struct at buf[pos:] into c's sinks (c->errors ... set by the caller), the
 * integer counters into stats (an array('i'), none over COUNTED_BYTES_MAX), or with stats None into
 * c->istats where the caller set it (run_scan_fresh's new bytes, which it drops over that bound itself), else
 * nowhere. 0 with *end set, or -1. */
static int scan_core(ProgramObject *prog, Ctx *c, PyObject *buf, PyObject *posobj, PyObject *stats, Py_ssize_t *end)
{
    Py_ssize_t pos;
    Pieces pieces;
    Py_buffer view;
    int have_view = 0, rc = -1;
    if (PyTuple_Check(buf)) { /* a frame in the pieces it arrived in: read where it lies */
        if (get_pos(posobj, &pos) < 0)
            return -1;
        if (pieces_open(buf, &pieces, &c->n) < 0) {
            pieces_close(&pieces);
            return -1;
        }
        c->pc = &pieces;
    }
    else {
        if (get_buffer(buf, posobj, &pos) < 0)
            return -1;
        c->p = (const unsigned char *)PyBytes_AS_STRING(buf);
        c->n = PyBytes_GET_SIZE(buf);
    }
    c->buf = buf;
    /* The counters are written in place (a writable buffer of int32); a result without them
     * (int_stats None: not prepared by CompiledStruct.scan) gathers no integer facts, nor does a buffer
     * longer than COUNTED_BYTES_MAX, whose counters could overflow (codegen.COUNTED_BYTES_MAX says why). */
    if (prog->nstats > 0 && stats != Py_None) {
        if (PyObject_GetBuffer(stats, &view, PyBUF_WRITABLE | PyBUF_FORMAT) < 0)
            goto done;
        have_view = 1;
        if (view.itemsize != 4 || view.format == NULL || strcmp(view.format, "i") != 0
            || view.len < prog->nstats * 4) {
            PyErr_Format(PyExc_TypeError, "result.int_stats must be an array('i') of at least %zd counters",
                         prog->nstats);
            goto done;
        }
        if (c->n <= COUNTED_BYTES_MAX)
            c->istats = (uint32_t *)view.buf;
    }
    rc = scan_struct(c, prog->root, &pos);
    if (rc == 0 && pos > c->n) { /* cannot happen: every step is checked; kept as in the reference */
        fail("the message ends %zd bytes early", pos - c->n);
        rc = -1;
    }
    *end = pos;
done:
    if (c->pc != NULL)
        pieces_close(c->pc);
    c->pc = NULL;
    if (have_view)
        PyBuffer_Release(&view);
    return rc;
}

static PyObject *run_scan(ProgramObject *prog, PyObject *buf, PyObject *posobj, PyObject *result)
{
    Py_ssize_t pos = 0;
    Ctx c;
    memset(&c, 0, sizeof c);
    c.result = result;
    PyObject *out = NULL, *stats = NULL;
    c.errors = PyObject_GetAttr(result, S_error_codes);
    c.topics = c.errors ? PyObject_GetAttr(result, S_topics) : NULL;
    c.spans = c.topics ? PyObject_GetAttr(result, S_record_spans) : NULL;
    c.tagged = c.spans ? PyObject_GetAttr(result, S_tagged_fields) : NULL;
    c.tparts = c.tagged ? PyObject_GetAttr(result, S_topic_partitions) : NULL;
    stats = c.tparts ? PyObject_GetAttr(result, S_int_stats) : NULL;
    if (stats == NULL)
        goto done;
    if (!PyDict_Check(c.errors) || !PyAnySet_Check(c.topics) || !PyList_Check(c.tagged) || !PyDict_Check(c.tparts)) {
        PyErr_SetString(PyExc_TypeError, "result must have a dict error_codes, a set topics, a list tagged_fields "
                                         "and a dict topic_partitions");
        goto done;
    }
    int rc = scan_core(prog, &c, buf, posobj, stats, &pos);
    if (flush_counters(&c) < 0 || rc < 0)
        goto done;
    if (prog->root->grows) { /* result.compact_delta = (result.compact_delta or 0) + delta */
        PyObject *old = PyObject_GetAttr(result, S_compact_delta);
        if (old == NULL)
            goto done;
        long long before = old == Py_None ? 0 : PyLong_AsLongLong(old);
        Py_DECREF(old);
        if (before == -1 && PyErr_Occurred())
            goto done;
        PyObject *sum = PyLong_FromLongLong(before + c.compact);
        if (sum == NULL || PyObject_SetAttr(result, S_compact_delta, sum) < 0) {
            Py_XDECREF(sum);
            goto done;
        }
        Py_DECREF(sum);
    }
    out = PyLong_FromSsize_t(pos);
done:
    Py_XDECREF(stats);
    Py_XDECREF(c.errors);
    Py_XDECREF(c.topics);
    Py_XDECREF(c.spans);
    Py_XDECREF(c.tagged);
    Py_XDECREF(c.tparts);
    return out;
}

/* ------------------------------------------------------------------ fresh results
 *
 * Codec.scan_request/scan_response want a new, finished ScanResult per frame. Built here, its
 * slots are written directly (the offsets of ScanResult's member descriptors, found once as
 * UUID's are): no __init__ call and no attribute lookups, which cost as much as the scan of a
 * small body. Its slots must be exactly RESULT_SLOTS; otherwise the fast path stays off and
 * CompiledStruct.scan_fresh builds the result in Python. */

enum { R_TRAILING, R_SECTIONS, R_SECTION_BYTES, R_EMPTY, R_TAGGED, R_ERRORS, R_TOPICS, R_SPANS, R_SOURCE,
       R_SUMMARIES, R_INT_SLOTS, R_INT_STATS, R_TPARTS, R_COMPACT, R_COUNT };
static const char *const RESULT_SLOTS[R_COUNT] = {
    "trailing_bytes", "tag_sections", "tag_section_bytes", "empty_counter", "tagged_fields", "error_codes",
    "topics", "record_spans", "source", "_summaries", "int_slots", "int_stats", "topic_partitions",
    "compact_delta",
};
static PyTypeObject *ResultType;     /* kinspect.protocol.codec.scan_result.ScanResult, NULL: no fast path */
static Py_ssize_t result_off[R_COUNT];
#define RSLOT(obj, i) (*(PyObject **)((char *)(obj) + result_off[i]))

static void find_result_slots(void)
{
    PyObject *mod = PyImport_ImportModule("kinspect.protocol.codec.scan_result");
    PyObject *cls = mod ? PyObject_GetAttrString(mod, "ScanResult") : NULL;
    Py_XDECREF(mod);
    if (cls == NULL) {
        PyErr_Clear();
        return;
    }
    PyTypeObject *tp = (PyTypeObject *)cls;
    PyObject *slots = PyType_Check(cls) ? PyDict_GetItemString(tp->tp_dict, "__slots__") : NULL; /* borrowed */
    if (slots == NULL || !PyTuple_Check(slots) || PyTuple_GET_SIZE(slots) != R_COUNT
        || tp->tp_alloc != PyType_GenericAlloc || tp->tp_base != &PyBaseObject_Type) {
        Py_DECREF(cls);
        return;
    }
    for (int i = 0; i < R_COUNT; i++) {
        PyObject *descr = PyDict_GetItemString(tp->tp_dict, RESULT_SLOTS[i]); /* borrowed */
        if (descr == NULL || !Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
            Py_DECREF(cls);
            return;
        }
        PyMemberDef *m = ((PyMemberDescrObject *)descr)->d_member;
        if (m->type != T_OBJECT_EX || (m->flags & READONLY) || m->offset <= 0
            || m->offset + (Py_ssize_t)sizeof(PyObject *) > tp->tp_basicsize) {
            Py_DECREF(cls);
            return;
        }
        result_off[i] = m->offset;
    }
    ResultType = tp; /* keeps the reference */
}

/* A new ScanResult as ScanResult() makes it, with source = buf and, when stats_template is an
 * array, int_slots and as int_stats a zeroed bytes object of the template's length in int32 counters, which
 * the scan writes in place before anyone else sees it (run_scan_fresh). stats_template Ellipsis
 * (codegen.COUNT_LATER) with int_slots: a bytes buf is not counted, its int_stats is (buf, pos), where whoever
 * needs the counters counts them (the capture's writer process, off the event loop); pieces are counted now,
 * into the `counters` int32 counters the program needs. */
static PyObject *new_result(PyObject *buf, PyObject *posobj, PyObject *stats_template, PyObject *int_slots,
                            Py_ssize_t counters)
{
    PyObject *r = ResultType->tp_alloc(ResultType, 0);
    if (r == NULL)
        return NULL;
    PyObject *zero = PyLong_FromLong(0);
    PyObject *counter = PyList_New(1);
    if (counter != NULL) {
        Py_INCREF(zero);
        PyList_SET_ITEM(counter, 0, zero);
    }
    RSLOT(r, R_TRAILING) = zero;
    Py_INCREF(zero);
    RSLOT(r, R_SECTIONS) = zero;
    Py_INCREF(zero);
    RSLOT(r, R_SECTION_BYTES) = zero;
    RSLOT(r, R_EMPTY) = counter;
    RSLOT(r, R_TAGGED) = PyList_New(0);
    RSLOT(r, R_ERRORS) = PyDict_New();
    RSLOT(r, R_TOPICS) = PySet_New(NULL);
    RSLOT(r, R_SPANS) = PyList_New(0);
    Py_INCREF(buf);
    RSLOT(r, R_SOURCE) = buf;
    RSLOT(r, R_SUMMARIES) = PyList_New(0);
    int later = stats_template == Py_Ellipsis;
    if (stats_template == Py_None || (later && (!PyTuple_CheckExact(int_slots) || PyTuple_GET_SIZE(int_slots) == 0))) {
        RSLOT(r, R_INT_SLOTS) = PyTuple_New(0);
        Py_INCREF(Py_None);
        RSLOT(r, R_INT_STATS) = Py_None;
    }
    else if (later && PyBytes_CheckExact(buf)) {
        Py_INCREF(int_slots);
        RSLOT(r, R_INT_SLOTS) = int_slots;
        RSLOT(r, R_INT_STATS) = PyTuple_Pack(2, buf, posobj);
    }
    else {
        Py_INCREF(int_slots);
        RSLOT(r, R_INT_SLOTS) = int_slots;
        /* bytes, not a copy of the array: one allocation, no buffer to acquire, and the capture keeps the object
         * itself (capture_side); an array's copy, its buffer and its two frees cost more than the counting */
        if (!later)
            counters = PyObject_Size(stats_template);
        PyObject *stats = counters < 0 ? NULL : PyBytes_FromStringAndSize(NULL, counters * 4);
        if (stats != NULL)
            memset(PyBytes_AS_STRING(stats), 0, counters * 4);
        RSLOT(r, R_INT_STATS) = stats;
    }
    RSLOT(r, R_TPARTS) = PyDict_New();
    Py_INCREF(Py_None);
    RSLOT(r, R_COMPACT) = Py_None;
    for (int i = 0; i < R_COUNT; i++) {
        if (RSLOT(r, i) == NULL) { /* an allocation failed: the slots set so far go with r */
            Py_DECREF(r);
            return NULL;
        }
    }
    return r;
}

/* Replace slot i of r by a new int (the old value is the shared 0). */
static int set_count(PyObject *r, int i, long long value)
{
    PyObject *v = PyLong_FromLongLong(value);
    if (v == NULL)
        return -1;
    Py_SETREF(RSLOT(r, i), v);
    return 0;
}

static PyObject *wire_summarize_spans(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* scan_fresh(buf, pos, stats_template, int_slots, summarize): see program_methods. */
static PyObject *run_scan_fresh(ProgramObject *prog, PyObject *buf, PyObject *posobj, PyObject *stats_template,
                                PyObject *int_slots, int summarize)
{
    if (ResultType == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "scan_fresh: ScanResult's slots were not found (SCAN_RESULT_FAST_PATH is 0)");
        return NULL;
    }
    if (!PyBytes_Check(buf) && !PyTuple_Check(buf)) {
        PyErr_SetString(PyExc_TypeError, "scan_fresh: buf must be bytes or a tuple of pieces");
        return NULL;
    }
    PyObject *r = new_result(buf, posobj, stats_template, int_slots, prog->nstats);
    if (r == NULL)
        return NULL;
    Ctx c;
    memset(&c, 0, sizeof c);
    c.result = r;
    c.errors = RSLOT(r, R_ERRORS); /* borrowed: r holds them */
    c.topics = RSLOT(r, R_TOPICS);
    c.spans = RSLOT(r, R_SPANS);
    c.tagged = RSLOT(r, R_TAGGED);
    c.tparts = RSLOT(r, R_TPARTS);
    PyObject *stats = RSLOT(r, R_INT_STATS);
    if (PyBytes_CheckExact(stats)) { /* new_result's bytes, seen by no one yet: the counters are written in place */
        if (PyBytes_GET_SIZE(stats) < prog->nstats * 4) {
            PyErr_Format(PyExc_TypeError, "scan_fresh: stats_template must hold at least %zd counters", prog->nstats);
            Py_DECREF(r);
            return NULL;
        }
        c.istats = (uint32_t *)PyBytes_AS_STRING(stats);
    }
    Py_ssize_t end = 0;
    if (scan_core(prog, &c, buf, posobj, Py_None, &end) < 0) {
        Py_DECREF(r);
        return NULL;
    }
    if (c.n > COUNTED_BYTES_MAX && RSLOT(r, R_INT_STATS) != Py_None) { /* not counted: no counters, as Codec.scan */
        Py_SETREF(RSLOT(r, R_INT_STATS), Py_NewRef(Py_None));
        PyObject *none = PyTuple_New(0);
        if (none == NULL) {
            Py_DECREF(r);
            return NULL;
        }
        Py_SETREF(RSLOT(r, R_INT_SLOTS), none);
    }
    /* finish(): each empty tag section (one byte) counts as a section and a byte */
    if ((c.sections + c.empty && (set_count(r, R_SECTIONS, c.sections + c.empty) < 0
                                  || set_count(r, R_SECTION_BYTES, c.section_bytes + c.empty) < 0))
        || (c.n > end && set_count(r, R_TRAILING, c.n - end) < 0)
        || (prog->root->grows && set_count(r, R_COMPACT, c.compact) < 0)) {
        Py_DECREF(r);
        return NULL;
    }
    if (summarize && PyList_GET_SIZE(RSLOT(r, R_SPANS)) > 0) { /* what ScanResult.records would do on first use */
        PyObject *args[3] = {buf, RSLOT(r, R_SPANS), RSLOT(r, R_SUMMARIES)};
        PyObject *done = wire_summarize_spans(NULL, args, 3);
        if (done == NULL) {
            Py_DECREF(r);
            return NULL;
        }
        Py_DECREF(done);
    }
    return r;
}

static PyObject *program_decode(ProgramObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "decode(buf, pos=0)");
        return NULL;
    }
    return run_decode(self, args[0], nargs > 1 ? args[1] : NULL);
}

static PyObject *program_scan(ProgramObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "scan(buf, pos, result)");
        return NULL;
    }
    return run_scan(self, args[0], args[1], args[2]);
}

/* ------------------------------------------------------------------ capture facts of a scan
 *
 * capture_side(result, fields, previous=None): the SCAN tuple of kinspect.capture.facts, built from
 * the result's slots (see FactsTaker._side, the reference, and the docstring of capture.facts):
 * (tag_section_bytes, tuple(tagged_fields), compact_delta, int_slots, int_stats as bytes, (buf, pos) or
 * None, tuple(topic_partitions.items()), tuple(error_codes.items()), RECORDS), where RECORDS
 * has per records span None or a tuple of its batches' fields at the four indices `fields`
 * (magic, record count, compression, batch length). Empty collections give ().
 *
 * `previous` itself when the SCAN would equal it (ScanResult.frozen_python(previous) is the
 * reference), counters left for later (a (buf, pos) pair) counting as equal where the bytes from pos are; where
 * only those bytes differ, a new SCAN of previous's items and this scan's pair. Why: a producer's requests,
 * and a consumer's responses, are each scanned anew (their records differ), but their facts mostly repeat:
 * compared where they lie, nothing is built (on the recorded traffic 61% of the sides a capture takes equal its
 * api's previous one). */

static PyObject *tuple_or_empty(PyObject *list) /* a list, a tuple of it; () when empty */
{
    return PyList_GET_SIZE(list) ? PyList_AsTuple(list) : PyTuple_New(0);
}

static PyObject *items_or_empty(PyObject *dict) /* a dict, a tuple of its (key, value) items; () when empty */
{
    Py_ssize_t n = PyDict_GET_SIZE(dict), pos = 0, i = 0;
    PyObject *out = PyTuple_New(n), *key, *value;
    if (out == NULL)
        return NULL;
    while (i < n && PyDict_Next(dict, &pos, &key, &value)) {
        PyObject *item = PyTuple_Pack(2, key, value);
        if (item == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyTuple_SET_ITEM(out, i++, item);
    }
    return out;
}

static PyObject *capture_records(PyObject *summaries, const Py_ssize_t fields[4])
{
    Py_ssize_t n = PyList_GET_SIZE(summaries);
    PyObject *out = PyTuple_New(n);
    for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
        PyObject *summary = PyList_GET_ITEM(summaries, i), *batches, *entry;
        if (summary == Py_None) {
            PyTuple_SET_ITEM(out, i, new_ref(Py_None));
            continue;
        }
        if (!PyTuple_Check(summary) || PyTuple_GET_SIZE(summary) < 1 || !PyTuple_Check(batches = PyTuple_GET_ITEM(summary, 0))) {
            PyErr_SetString(PyExc_TypeError, "capture_side: a records summary must be a tuple whose first item is a tuple of batches");
            Py_CLEAR(out);
            break;
        }
        Py_ssize_t m = PyTuple_GET_SIZE(batches);
        entry = PyTuple_New(m);
        if (entry == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyTuple_SET_ITEM(out, i, entry);
        for (Py_ssize_t j = 0; j < m; j++) {
            PyObject *batch = PyTuple_GET_ITEM(batches, j);
            if (!PyTuple_Check(batch) || PyTuple_GET_SIZE(batch) <= fields[0] || PyTuple_GET_SIZE(batch) <= fields[1]
                || PyTuple_GET_SIZE(batch) <= fields[2] || PyTuple_GET_SIZE(batch) <= fields[3]) {
                PyErr_SetString(PyExc_TypeError, "capture_side: a batch summary is too short for its fields");
                Py_CLEAR(out);
                break;
            }
            PyObject *facts = PyTuple_Pack(4, PyTuple_GET_ITEM(batch, fields[0]), PyTuple_GET_ITEM(batch, fields[1]),
                                           PyTuple_GET_ITEM(batch, fields[2]), PyTuple_GET_ITEM(batch, fields[3]));
            if (facts == NULL) {
                Py_CLEAR(out);
                break;
            }
            PyTuple_SET_ITEM(entry, j, facts);
        }
    }
    return out;
}

/* 1 if seq (a list or a tuple) holds items equal to the exact tuple `kept`'s, one by one; 0 if not; 2 when
 * `kept` is not an exact tuple (the caller compares a built SCAN instead); -1 on an error. */
static int items_equal(PyObject *seq, PyObject *kept)
{
    if (!PyTuple_CheckExact(kept))
        return 2;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (PyTuple_GET_SIZE(kept) != n)
        return 0;
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        int same = PyObject_RichCompareBool(items[i], PyTuple_GET_ITEM(kept, i), Py_EQ);
        if (same <= 0)
            return same;
    }
    return 1;
}

/* dict's (key, value) items against an exact tuple of exact 2-tuples, in the dict's order: as items_equal. */
static int dict_items_equal(PyObject *dict, PyObject *kept)
{
    if (!PyTuple_CheckExact(kept))
        return 2;
    if (PyTuple_GET_SIZE(kept) != PyDict_GET_SIZE(dict))
        return 0;
    Py_ssize_t pos = 0, i = 0;
    PyObject *key, *value;
    while (PyDict_Next(dict, &pos, &key, &value)) {
        PyObject *pair = PyTuple_GET_ITEM(kept, i++);
        if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2)
            return 2;
        int same = PyObject_RichCompareBool(key, PyTuple_GET_ITEM(pair, 0), Py_EQ);
        if (same > 0)
            same = PyObject_RichCompareBool(value, PyTuple_GET_ITEM(pair, 1), Py_EQ);
        if (same <= 0)
            return same;
    }
    return 1;
}

/* The records' summaries against a SCAN's RECORDS (records first: where two scans of a producer's requests
 * differ when they do): as items_equal. */
static int records_equal(PyObject *summaries, Py_ssize_t count, PyObject *kept, const Py_ssize_t fields[4])
{
    if (!PyTuple_CheckExact(kept))
        return 2;
    if (PyTuple_GET_SIZE(kept) != count)
        return 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *summary = PyList_GET_ITEM(summaries, i), *entry = PyTuple_GET_ITEM(kept, i), *batches;
        if (summary == Py_None || entry == Py_None) {
            if (summary != entry)
                return entry == Py_None || PyTuple_CheckExact(entry) ? 0 : 2;
            continue;
        }
        if (!PyTuple_Check(summary) || PyTuple_GET_SIZE(summary) < 1
            || !PyTuple_Check(batches = PyTuple_GET_ITEM(summary, 0)) || !PyTuple_CheckExact(entry))
            return 2; /* building says what is wrong, or the full comparison decides */
        Py_ssize_t m = PyTuple_GET_SIZE(batches);
        if (PyTuple_GET_SIZE(entry) != m)
            return 0;
        for (Py_ssize_t j = 0; j < m; j++) {
            PyObject *batch = PyTuple_GET_ITEM(batches, j), *facts = PyTuple_GET_ITEM(entry, j);
            if (!PyTuple_Check(batch) || !PyTuple_CheckExact(facts) || PyTuple_GET_SIZE(facts) != 4)
                return 2;
            for (int k = 0; k < 4; k++) {
                if (PyTuple_GET_SIZE(batch) <= fields[k])
                    return 2;
                int same = PyObject_RichCompareBool(PyTuple_GET_ITEM(batch, fields[k]), PyTuple_GET_ITEM(facts, k),
                                                    Py_EQ);
                if (same <= 0)
                    return same;
            }
        }
    }
    return 1;
}

/* 1 if two (buf, pos) pairs of counters left for later (codegen.COUNT_LATER) hold the same bytes from pos to
 * the end: their counters would be equal, so a SCAN holding either stands for both; 0 if not; 2 when either is
 * not such a pair (only building can tell). The bodies are compared, not the frames: a frame's header (its
 * correlation id) differs from request to request. */
static int later_equals(PyObject *later, PyObject *kept)
{
    if (!PyTuple_CheckExact(kept) || PyTuple_GET_SIZE(kept) != 2 || PyTuple_GET_SIZE(later) != 2)
        return kept == Py_None || PyBytes_CheckExact(kept) ? 0 : 2;
    PyObject *a = PyTuple_GET_ITEM(later, 0), *b = PyTuple_GET_ITEM(kept, 0);
    if (!PyBytes_CheckExact(a) || !PyBytes_CheckExact(b) || !PyLong_CheckExact(PyTuple_GET_ITEM(later, 1))
        || !PyLong_CheckExact(PyTuple_GET_ITEM(kept, 1)))
        return 2;
    Py_ssize_t at = PyLong_AsSsize_t(PyTuple_GET_ITEM(later, 1)), kept_at = PyLong_AsSsize_t(PyTuple_GET_ITEM(kept, 1));
    if (at < 0 || kept_at < 0 || at > PyBytes_GET_SIZE(a) || kept_at > PyBytes_GET_SIZE(b)) {
        PyErr_Clear();
        return 2;
    }
    Py_ssize_t n = PyBytes_GET_SIZE(a) - at;
    return n == PyBytes_GET_SIZE(b) - kept_at
           && memcmp(PyBytes_AS_STRING(a) + at, PyBytes_AS_STRING(b) + kept_at, n) == 0;
}

/* 1 if the SCAN of r (its records summarized) would equal `previous`, an exact 8-tuple; 0 if not; 2 when
 * only building it can tell (an unexpected type anywhere); 3 when it would but for its frame to count later
 * (another body); -1 on an error. Each part is compared as the
 * tuple comparison of a built SCAN would compare it, so the answer is that comparison's. */
static int side_equals(PyObject *r, PyObject *previous, const Py_ssize_t fields[4])
{
    PyObject *tagged = RSLOT(r, R_TAGGED), *tparts = RSLOT(r, R_TPARTS), *errors = RSLOT(r, R_ERRORS);
    PyObject *spans = RSLOT(r, R_SPANS), *stats = RSLOT(r, R_INT_STATS), *summaries = RSLOT(r, R_SUMMARIES);
    PyObject *kept_stats = PyTuple_GET_ITEM(previous, 4);
    PyObject *kept_records = PyTuple_GET_ITEM(previous, 7);
    /* as building: () without spans, else an entry per summary */
    int same = PyList_GET_SIZE(spans) ? records_equal(summaries, PyList_GET_SIZE(summaries), kept_records, fields)
               : PyTuple_CheckExact(kept_records) ? PyTuple_GET_SIZE(kept_records) == 0
                                                  : 2;
    if (same != 1)
        return same;
    int frame_differs = 0; /* counters left for later, the bodies unlike: 3 if all else is alike */
    if (stats == Py_None) {
        if (kept_stats != Py_None)
            return PyBytes_CheckExact(kept_stats) || PyTuple_CheckExact(kept_stats) ? 0 : 2;
    } else if (PyTuple_CheckExact(stats)) { /* counters left for later: alike when the bodies are (later_equals) */
        if ((same = later_equals(stats, kept_stats)) == 0 && PyTuple_CheckExact(kept_stats))
            frame_differs = 1;
        else if (same != 1)
            return same;
    } else if (PyBytes_CheckExact(stats)) { /* a fresh scan's counters */
        if (!PyBytes_CheckExact(kept_stats))
            return kept_stats == Py_None || PyTuple_CheckExact(kept_stats) ? 0 : 2;
        if (PyBytes_GET_SIZE(stats) != PyBytes_GET_SIZE(kept_stats)
            || memcmp(PyBytes_AS_STRING(stats), PyBytes_AS_STRING(kept_stats), PyBytes_GET_SIZE(stats)) != 0)
            return 0;
    } else {
        if (!PyBytes_CheckExact(kept_stats))
            return kept_stats == Py_None || PyTuple_CheckExact(kept_stats) ? 0 : 2;
        Py_buffer view;
        if (PyObject_GetBuffer(stats, &view, PyBUF_SIMPLE) < 0)
            return -1;
        same = view.len == PyBytes_GET_SIZE(kept_stats)
               && memcmp(view.buf, PyBytes_AS_STRING(kept_stats), view.len) == 0;
        PyBuffer_Release(&view);
        if (!same)
            return 0;
    }
    PyObject *plain[3][2] = {{RSLOT(r, R_SECTION_BYTES), PyTuple_GET_ITEM(previous, 0)},
                             {RSLOT(r, R_COMPACT), PyTuple_GET_ITEM(previous, 2)},
                             {RSLOT(r, R_INT_SLOTS), PyTuple_GET_ITEM(previous, 3)}};
    for (int i = 0; i < 3; i++) {
        if ((same = PyObject_RichCompareBool(plain[i][0], plain[i][1], Py_EQ)) <= 0)
            return same;
    }
    if ((same = items_equal(tagged, PyTuple_GET_ITEM(previous, 1))) != 1)
        return same;
    if ((same = dict_items_equal(tparts, PyTuple_GET_ITEM(previous, 5))) != 1)
        return same;
    same = dict_items_equal(errors, PyTuple_GET_ITEM(previous, 6));
    return same == 1 && frame_differs ? 3 : same;
}

static PyObject *wire_capture_side(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 2 || nargs > 3 || ResultType == NULL || !PyObject_TypeCheck(args[0], ResultType)
        || !PyTuple_Check(args[1]) || PyTuple_GET_SIZE(args[1]) != 4) {
        PyErr_SetString(PyExc_TypeError, "capture_side(result, fields, previous=None): a ScanResult "
                                         "(SCAN_RESULT_FAST_PATH), 4 field indices and a SCAN or None");
        return NULL;
    }
    PyObject *r = args[0];
    /* The taker passes one fields tuple every time: its indices are read once, and kept with it. */
    static PyObject *fields_seen;
    static Py_ssize_t fields_read[4];
    Py_ssize_t fields[4];
    if (args[1] == fields_seen) {
        memcpy(fields, fields_read, sizeof(fields));
    } else {
        for (int i = 0; i < 4; i++) {
            fields[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(args[1], i));
            if (fields[i] < 0) {
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_ValueError, "capture_side: field indices cannot be negative");
                return NULL;
            }
        }
        if (PyTuple_CheckExact(args[1])) { /* a tuple cannot change: held, so that its address is not another's */
            Py_XSETREF(fields_seen, Py_NewRef(args[1]));
            memcpy(fields_read, fields, sizeof(fields));
        }
    }
    for (int i = 0; i < R_COUNT; i++) {
        if (RSLOT(r, i) == NULL) {
            PyErr_Format(PyExc_AttributeError, "capture_side: the result has no %s", RESULT_SLOTS[i]);
            return NULL;
        }
    }
    PyObject *tagged = RSLOT(r, R_TAGGED), *tparts = RSLOT(r, R_TPARTS), *errors = RSLOT(r, R_ERRORS);
    PyObject *spans = RSLOT(r, R_SPANS), *stats = RSLOT(r, R_INT_STATS);
    if (!PyList_Check(tagged) || !PyDict_Check(tparts) || !PyDict_Check(errors) || !PyList_Check(spans)) {
        PyErr_SetString(PyExc_TypeError, "capture_side: the result's collections are not those a scan fills");
        return NULL;
    }
    if (PyList_GET_SIZE(spans) > 0) { /* what ScanResult.records does: summarize the spans not yet summarized */
        PyObject *summaries = RSLOT(r, R_SUMMARIES);
        if (!PyList_Check(summaries) || PyList_GET_SIZE(summaries) < PyList_GET_SIZE(spans)) {
            PyObject *done = PyObject_CallMethod(r, "settle", NULL);
            if (done == NULL)
                return NULL;
            Py_DECREF(done);
        }
    }
    PyObject *summaries = RSLOT(r, R_SUMMARIES);
    if (!PyList_Check(summaries)) {
        PyErr_SetString(PyExc_TypeError, "capture_side: the result's summaries are not a list");
        return NULL;
    }
    PyObject *previous = nargs > 2 ? args[2] : Py_None;
    int general = 0; /* compare a built SCAN with previous: only building can tell */
    if (previous != Py_None) {
        int same = PyTuple_CheckExact(previous) && PyTuple_GET_SIZE(previous) == 8 ? side_equals(r, previous, fields)
                                                                                   : 2;
        if (same < 0)
            return NULL;
        if (same == 1)
            return new_ref(previous);
        if (same == 3) { /* alike but for the frame to count: previous's facts, this scan's frame (the taker
                          * sees its items are previous's, capture.facts) */
            PyObject *out = PyTuple_New(8);
            if (out == NULL)
                return NULL;
            for (int i = 0; i < 8; i++)
                PyTuple_SET_ITEM(out, i, new_ref(i == 4 ? stats : PyTuple_GET_ITEM(previous, i)));
            return out;
        }
        general = same == 2;
    }
    PyObject *items[8] = {NULL};
    items[0] = new_ref(RSLOT(r, R_SECTION_BYTES));
    items[1] = tuple_or_empty(tagged);
    items[2] = new_ref(RSLOT(r, R_COMPACT));
    items[3] = new_ref(RSLOT(r, R_INT_SLOTS));
    /* a fresh scan's counters, or its (buf, pos) to count later, kept as they are */
    if (stats == Py_None || PyBytes_CheckExact(stats) || PyTuple_CheckExact(stats))
        items[4] = new_ref(stats);
    else { /* bytes: untracked by the garbage collector, unlike the array */
        Py_buffer view;
        if (PyObject_GetBuffer(stats, &view, PyBUF_SIMPLE) == 0) {
            items[4] = PyBytes_FromStringAndSize(view.buf, view.len);
            PyBuffer_Release(&view);
        }
    }
    items[5] = items_or_empty(tparts);
    items[6] = items_or_empty(errors);
    items[7] = PyList_GET_SIZE(spans) ? capture_records(summaries, fields) : PyTuple_New(0);
    PyObject *out = NULL;
    for (int i = 0; i < 8; i++) {
        if (items[i] == NULL)
            goto done;
    }
    out = PyTuple_New(8);
    if (out != NULL) {
        for (int i = 0; i < 8; i++) {
            PyTuple_SET_ITEM(out, i, items[i]);
            items[i] = NULL;
        }
    }
done:
    for (int i = 0; i < 8; i++)
        Py_XDECREF(items[i]);
    if (out != NULL && general) {
        int same = PyObject_RichCompareBool(out, previous, Py_EQ);
        if (same != 0) {
            Py_DECREF(out);
            return same < 0 ? NULL : new_ref(previous);
        }
    }
    return out;
}

static PyObject *program_scan_fresh(ProgramObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 4 || nargs > 5) {
        PyErr_SetString(PyExc_TypeError, "scan_fresh(buf, pos, stats_template, int_slots, summarize=False)");
        return NULL;
    }
    int summarize = nargs > 4 ? PyObject_IsTrue(args[4]) : 0;
    if (summarize < 0)
        return NULL;
    return run_scan_fresh(self, args[0], args[1], args[2], args[3], summarize);
}

static PyMethodDef program_methods[] = {
    {"decode", (PyCFunction)(void (*)(void))program_decode, METH_FASTCALL,
     "decode(buf, pos=0) -> (dict, new_pos): the struct at buf[pos:] (buf must be bytes)."},
    {"scan", (PyCFunction)(void (*)(void))program_scan, METH_FASTCALL,
     "scan(buf, pos, result) -> new_pos: walk the struct, filling a ScanResult."},
    {"scan_fresh", (PyCFunction)(void (*)(void))program_scan_fresh, METH_FASTCALL,
     "scan_fresh(buf, pos, stats_template, int_slots, summarize=False) -> ScanResult: walk the struct into a\n"
     "new, finished result (trailing_bytes: the bytes after it; source: buf). stats_template: None (no integer\n"
     "facts) or the zeroed array('i') whose length sizes int_stats, the counters as bytes (None where buf is\n"
     "longer than COUNTED_BYTES_MAX), with int_slots; Ellipsis (codegen.COUNT_LATER): a bytes buf is not counted,\n"
     "int_stats = (buf, pos) (pieces are counted). summarize: its records spans are summarized at once (as\n"
     "ScanResult.records does on first use). buf: bytes or a tuple of pieces."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef program_members[] = {
    {"source", T_OBJECT, offsetof(ProgramObject, source), READONLY, "the program tuple this was compiled from"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject ProgramType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kinspect.protocol.codec._wire.Program",
    .tp_basicsize = sizeof(ProgramObject),
    .tp_dealloc = (destructor)program_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A wire program compiled for the C decoder and scanner (see compile_program).",
    .tp_methods = program_methods,
    .tp_members = program_members,
};

/* ------------------------------------------------------------------ module functions */

/* The Program for a Program or a program tuple (compiled once per tuple object, cached by id). */
static ProgramObject *program_of(PyObject *program)
{
    if (Py_IS_TYPE(program, &ProgramType)) {
        Py_INCREF(program);
        return (ProgramObject *)program;
    }
    if (!PyTuple_Check(program)) {
        PyErr_SetString(PyExc_TypeError, "program must be a Program or a program tuple");
        return NULL;
    }
    PyObject *key = PyLong_FromVoidPtr(program);
    if (key == NULL)
        return NULL;
    PyObject *cached = PyDict_GetItemWithError(ProgramCache, key);
    if (cached != NULL && ((ProgramObject *)cached)->source == program) {
        Py_DECREF(key);
        Py_INCREF(cached);
        return (ProgramObject *)cached;
    }
    if (PyErr_Occurred()) {
        Py_DECREF(key);
        return NULL;
    }
    PyObject *compiled = program_from_tuple(program);
    if (compiled == NULL) {
        Py_DECREF(key);
        return NULL;
    }
    if (PyDict_GET_SIZE(ProgramCache) >= PROGRAM_CACHE_MAX)
        PyDict_Clear(ProgramCache);
    int rc = PyDict_SetItem(ProgramCache, key, compiled); /* keeps the tuple alive: its id stays unique */
    Py_DECREF(key);
    if (rc < 0) {
        Py_DECREF(compiled);
        return NULL;
    }
    return (ProgramObject *)compiled;
}

static PyObject *wire_compile_program(PyObject *module, PyObject *program)
{
    if (Py_IS_TYPE(program, &ProgramType)) {
        Py_INCREF(program);
        return program;
    }
    return program_from_tuple(program);
}

static PyObject *wire_decode(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 2 || nargs > 3) {
        PyErr_SetString(PyExc_TypeError, "decode(program, buf, pos=0)");
        return NULL;
    }
    ProgramObject *prog = program_of(args[0]);
    if (prog == NULL)
        return NULL;
    PyObject *out = run_decode(prog, args[1], nargs > 2 ? args[2] : NULL);
    Py_DECREF(prog);
    return out;
}

static PyObject *wire_scan(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "scan(program, buf, pos, result)");
        return NULL;
    }
    ProgramObject *prog = program_of(args[0]);
    if (prog == NULL)
        return NULL;
    PyObject *out = run_scan(prog, args[1], args[2], args[3]);
    Py_DECREF(prog);
    return out;
}

static PyMethodDef wire_methods[] = {
    {"compile_program", (PyCFunction)wire_compile_program, METH_O,
     "compile_program(program) -> Program: convert a wire_program tuple once."},
    {"decode", (PyCFunction)(void (*)(void))wire_decode, METH_FASTCALL,
     "decode(program, buf, pos=0) -> (dict, new_pos); program is a Program or a program tuple."},
    {"scan", (PyCFunction)(void (*)(void))wire_scan, METH_FASTCALL,
     "scan(program, buf, pos, result) -> new_pos; program is a Program or a program tuple."},
    {"summarize_records", (PyCFunction)(void (*)(void))wire_summarize_records, METH_FASTCALL,
     "summarize_records(data, start=0, end=None) -> RecordsSummary | None\n\n"
     "The C twin of kinspect.protocol.records.summarize_records_python, on data[start:end]\n"
     "(offsets relative to start): None for None, RecordsError for bytes that are not a\n"
     "record set, TypeError for what is not a bytes-like object."},
    {"capture_side", (PyCFunction)(void (*)(void))wire_capture_side, METH_FASTCALL,
     "capture_side(result, fields, previous=None) -> tuple\n\n"
     "The capture's SCAN tuple of a ScanResult (kinspect.capture.facts; ScanResult.frozen_python is the\n"
     "reference), its records summarized first where they are not; fields: the indices of magic,\n"
     "record count, compression and batch length in a batch summary. previous itself when the SCAN\n"
     "would equal it (compared where the facts lie, nothing built)."},
    {"summarize_spans", (PyCFunction)(void (*)(void))wire_summarize_spans, METH_FASTCALL,
     "summarize_spans(source, spans, into, first=0) -> None\n\n"
     "For each `start << 32 | length` of spans[first:] (ScanResult.record_spans), append to the\n"
     "list into summarize_records(source, start, start + length), or None where RecordsError."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef wire_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "kinspect.protocol.codec._wire",
    .m_doc = "Table-driven decoder and scanner for kinspect wire programs (see wire_program.py).",
    .m_size = -1,
    .m_methods = wire_methods,
};

/* Find where UUID keeps `int` and `is_safe`, to build UUIDs without calling __init__. */
static void find_uuid_slots(void)
{
    PyTypeObject *tp = (PyTypeObject *)UUIDType;
    if (!PyType_Check(UUIDType) || tp->tp_alloc != PyType_GenericAlloc || tp->tp_new != PyBaseObject_Type.tp_new)
        return;
    const char *names[2] = {"int", "is_safe"};
    Py_ssize_t offsets[2] = {-1, -1};
    for (int i = 0; i < 2; i++) {
        PyObject *descr = PyDict_GetItemString(tp->tp_dict, names[i]); /* borrowed */
        if (descr == NULL || !Py_IS_TYPE(descr, &PyMemberDescr_Type))
            return;
        PyMemberDef *m = ((PyMemberDescrObject *)descr)->d_member;
        if (m->type != T_OBJECT_EX || (m->flags & READONLY) || m->offset <= 0
            || m->offset + (Py_ssize_t)sizeof(PyObject *) > tp->tp_basicsize)
            return;
        offsets[i] = m->offset;
    }
    uuid_int_off = offsets[0];
    uuid_safe_off = offsets[1];
}

PyMODINIT_FUNC PyInit__wire(void)
{
    if (PyType_Ready(&ProgramType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&wire_module);
    if (m == NULL)
        return NULL;
    PyObject *prim = PyImport_ImportModule("kinspect.protocol.wire.primitives");
    if (prim == NULL)
        goto fail;
    Malformed = PyObject_GetAttrString(prim, "Malformed");
    Py_DECREF(prim);
    if (Malformed == NULL)
        goto fail;
    PyObject *uuid = PyImport_ImportModule("uuid");
    if (uuid == NULL)
        goto fail;
    UUIDType = PyObject_GetAttrString(uuid, "UUID");
    PyObject *safe = PyObject_GetAttrString(uuid, "SafeUUID");
    Py_DECREF(uuid);
    if (UUIDType == NULL || safe == NULL) {
        Py_XDECREF(safe);
        goto fail;
    }
    SafeUnknown = PyObject_GetAttrString(safe, "unknown");
    Py_DECREF(safe);
    if (SafeUnknown == NULL)
        goto fail;
    find_uuid_slots();
    find_result_slots();
#define INTERN(var, text) if ((var = PyUnicode_InternFromString(text)) == NULL) goto fail
    INTERN(UnknownKey, "_unknown_tagged_fields");
    INTERN(S_error_codes, "error_codes");
    INTERN(S_topics, "topics");
    INTERN(S_record_spans, "record_spans");
    INTERN(S_tagged_fields, "tagged_fields");
    INTERN(S_empty_counter, "empty_counter");
    INTERN(S_tag_sections, "tag_sections");
    INTERN(S_tag_section_bytes, "tag_section_bytes");
    INTERN(S_int, "int");
    INTERN(S_int_stats, "int_stats");
    INTERN(S_topic_partitions, "topic_partitions");
    INTERN(S_compact_delta, "compact_delta");
#undef INTERN
    if ((ProgramCache = PyDict_New()) == NULL)
        goto fail;
    Py_INCREF(&ProgramType);
    if (PyModule_AddObject(m, "Program", (PyObject *)&ProgramType) < 0) {
        Py_DECREF(&ProgramType);
        goto fail;
    }
    if (PyModule_AddIntConstant(m, "UUID_FAST_PATH", uuid_int_off >= 0) < 0
        || PyModule_AddIntConstant(m, "SCAN_RESULT_FAST_PATH", ResultType != NULL) < 0
        || PyModule_AddIntConstant(m, "COUNTED_BYTES_MAX", COUNTED_BYTES_MAX) < 0)
        goto fail;
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
