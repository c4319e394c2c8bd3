/* A session's reads of whole frames, handled in C (kinspect.session.session is the reference).
 *
 * Why C: with small requests sent one at a time, nearly every read is one whole frame, and the
 * session's Python for one (framing, the plan, the header, the event, pairing) cost about 6 us per
 * request and response, warm: as much as forwarding them. Here the same steps are loads at slot
 * offsets and a few allocations.
 *
 * configure(classes, software_of): the classes read and made, once (session.py's _one_frame_module).
 * Reads(session, table, Session.client_data, Session.broker_data) -> reads, made by Session.__init__:
 *   reads.client_data(data, now) and reads.broker_data(data, now) are Session.client_data and
 *   broker_data: they take the common read here and give every other one to the Python methods,
 *   which stay the reference (tests/session/test_one_frame.py feeds both the same traffic).
 * Table(): the per-(api key, version) facts of one Plan, shared by its sessions, filled on first
 *   use from Session._one_frame_entry.
 *
 * Taken here: the whole frames a bytes read starts with (one, in a read of one request sent at a
 * time), while the direction's stream holds nothing and the direction is framed and inspected, with:
 *   requests: a known api at header v1 or v2 whose header repeats the previous one's bytes
 *     (RequestHeaders' memo), not SaslHandshake, not a Produce with acks=0, within
 *     inspect.max_inflight;
 *   responses: one paired with a request in flight whose facts were kept, not held for a
 *     transform, after no SASL handshake, with header v0 or an empty header tag section.
 * And a frame kept in pieces (framing.stream's KEEP_PIECES: a large Produce request, a large Fetch
 * response) from the bytes read it begins in to the one it ends in: its first piece kept as a view of the
 * read it begins in, the reads inside it kept as they are, and the read that ends it hands it over as the
 * FramePieces it came in, taken as a whole frame is (its header, and a Produce's acks, in its first
 * piece); a response is paired when its first bytes come, as the reference's plan pairs it. One whole in
 * a read is a FramePieces of one view of it. A bulk producer's requests and a consumer's responses of a
 * megabyte span two reads or more: the session's Python for each such read (framing state, plan, header,
 * event, pairing) cost 150 us per MB with the caches cold, in-process, 60 to 80 here; a response copied
 * out of its read, 130 us per MB warm and 220 cold, a view of it 2 and 50.
 * Every check of a frame is made before anything changes: from the first frame not taken here, the rest
 * of the read goes to the Python methods, which read it from scratch. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include "../slot_offsets.h"

#define API_KEYS 128
#define VERSIONS 32
enum { KEEP_HEAD = 0, KEEP_WHOLE = 1, HOLD = 2, KEEP_PIECES = 4 }; /* framing.stream's modes */
enum { API_VERSIONS = 18, UNSUPPORTED_VERSION = 35 };

/* Entry flags: what the Python side said of an (api key, version). */
enum { E_PRODUCE = 1, E_PRODUCE_FLEXIBLE = 2, E_SOFTWARE = 4, E_REQUEST_PYTHON = 8, E_REQUEST_KNOWN = 16,
       E_RESPONSE_KNOWN = 32 };

typedef struct {
    signed char state; /* 0: not asked yet; 1: known here; -1: Python reads every frame of it */
    unsigned char request_mode, response_mode, request_header, response_header, flags;
    PyObject *name; /* the api's name, or None */
} Entry;

typedef struct {
    PyObject_HEAD
    Entry entries[API_KEYS][VERSIONS];
} TableObject;

/* The classes read and made here, and their slots' offsets. */
enum { C_REQUEST, C_RESPONSE, C_EXCHANGE, C_PENDING, C_HEADER, C_OUTPUT, C_STREAM, C_HEADERS, C_CONNECTION,
       C_PIECES, C_SESSION, C_COUNT };

enum { Q_CONNECTION, Q_TIME, Q_OFFSET, Q_HEADER, Q_API_NAME, Q_KNOWN, Q_TAG_BYTES, Q_TAGS, Q_SIZE, Q_FRAME,
       Q_COMPLETE, Q_CODEC, Q_EXPECTS, Q_DECODED, Q_SCANNED, Q_COUNT };
static const char *const Q_NAMES[Q_COUNT] = {"connection", "time", "offset", "header", "api_name", "known",
                                             "header_tag_bytes", "header_tags", "size", "frame", "complete", "codec",
                                             "expects_response", "_decoded", "_scanned"};

enum { P_CONNECTION, P_TIME, P_OFFSET, P_API_KEY, P_API_NAME, P_KNOWN, P_API_VERSION, P_REQUEST_VERSION,
       P_CORRELATION, P_HEADER_VERSION, P_HEADER_SIZE, P_TAG_BYTES, P_TAGS, P_SIZE, P_FRAME, P_COMPLETE, P_CODEC,
       P_DECODED, P_SCANNED, P_COUNT };
static const char *const P_NAMES[P_COUNT] = {"connection", "time", "offset", "api_key", "api_name", "known",
                                             "api_version", "request_version", "correlation_id", "header_version",
                                             "header_size", "header_tag_bytes", "header_tags", "size", "frame",
                                             "complete", "codec", "_decoded", "_scanned"};

enum { X_REQUEST, X_RESPONSE, X_LATENCY, X_COUNT };
static const char *const X_NAMES[X_COUNT] = {"request", "response", "latency"};

enum { T_API_KEY, T_API_VERSION, T_CORRELATION, T_REQUEST, T_TIME, T_MODE, T_MECHANISM, T_FORGOTTEN, T_COUNT };
static const char *const T_NAMES[T_COUNT] = {"api_key", "api_version", "correlation_id", "request", "time", "mode",
                                             "mechanism", "forgotten"};

enum { H_API_KEY, H_API_VERSION, H_CORRELATION, H_CLIENT_ID, H_VERSION, H_SIZE, H_FIELDS, H_BASE, H_COUNT };
static const char *const H_NAMES[H_COUNT] = {"api_key", "api_version", "correlation_id", "client_id", "version",
                                             "size", "_fields", "_base"};

enum { S_FAILED, S_BUFFER, S_OFFSET, S_SIZE, S_SKIP, S_PARTS, S_MAX_FRAME, S_KEEP_LIMIT, S_HEAD_BYTES, S_FORWARDING,
       S_PARTS_BYTES, S_MODE, S_TICKET, S_FORWARDED, S_PIECES_MIN, S_COUNT };
static const char *const S_NAMES[S_COUNT] = {"failed", "_buffer", "_buffer_offset", "_size", "_skip", "_parts",
                                             "max_frame_bytes", "keep_limit", "head_bytes", "forwarding",
                                             "_parts_bytes", "_mode", "_ticket", "_forwarded", "pieces_min_bytes"};

enum { R_V1, R_V2, R_COUNT };
static const char *const R_NAMES[R_COUNT] = {"_v1", "_v2"};

enum { N_CLIENT_ID, N_SOFTWARE, N_SOFTWARE_VERSION, N_COUNT };
static const char *const N_NAMES[N_COUNT] = {"client_id", "client_software_name", "client_software_version"};

/* The session's flags each read checks (direction_open), slots of Session: read at their offsets. */
enum { F_CLIENT_SEEN, F_CLIENT_FRAMED, F_CLIENT_INSPECTED, F_RAW_CLIENT, F_BROKER_FRAMED, F_BROKER_INSPECTED,
       F_RAW_BROKER, F_COUNT };
static const char *const F_NAMES[F_COUNT] = {"_client_seen", "client_framed", "client_inspected", "_raw_client",
                                             "broker_framed", "broker_inspected", "_raw_broker"};
static Py_ssize_t f[F_COUNT];
static PyObject *f_str[F_COUNT]; /* F_NAMES interned: a stand-in session's flags are looked up by name */

static PyTypeObject *classes[C_COUNT];
static Py_ssize_t q[Q_COUNT], p[P_COUNT], x[X_COUNT], t[T_COUNT], h[H_COUNT], s[S_COUNT], r[R_COUNT], n[N_COUNT];
static PyObject *software_of; /* client_software.software_of */
/* software_of's last body (bytes after the request header) and its outcome. software_of remembers
 * the same in Python, but the call alone cost an ApiVersions exchange about 1,300 instructions and a
 * fifth of its L1 code misses (bench_instructions.py --cold): every connection of one client sends
 * the same body. Reset by configure(). */
static PyObject *software_body, *software_outcome;
#define SOFTWARE_MEMO_BYTES 512 /* client_software._MEMO_BYTES */
static PyObject *str_entry, *str_append, *str_popleft, *str_requests, *str_responses,
    *str_headers, *str_connection, *str_codec, *str_inflight, *str_remembered, *str_config, *str_max_inflight;

/* A new instance of a slotted class, every slot empty (set them all before it is seen). */
static inline PyObject *blank(PyTypeObject *tp)
{
    return tp->tp_alloc(tp, 0);
}

static inline unsigned be16(const unsigned char *b) { return (unsigned)b[0] << 8 | b[1]; }
static inline uint32_t be32(const unsigned char *b)
{
    return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3];
}

/* ------------------------------------------------------------------ Table */

static void table_dealloc(TableObject *self)
{
    for (int k = 0; k < API_KEYS; k++)
        for (int v = 0; v < VERSIONS; v++)
            Py_CLEAR(self->entries[k][v].name);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject TableType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kinspect.session._one_frame.Table",
    .tp_basicsize = sizeof(TableObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The per-(api key, version) facts one-frame reads need, shared by the sessions of one Plan.",
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)table_dealloc,
};

/* ------------------------------------------------------------------ Reads */

typedef struct {
    PyObject_HEAD
    PyObject *session, *table, *requests, *responses, *headers, *connection, *codec, *inflight, *remembered;
    PyObject *python_client, *python_broker; /* Session.client_data and broker_data: the reference */
    Py_ssize_t max_inflight;
    /* Each stream's (client, broker) limits, fixed when it was made: max_frame_bytes, keep_limit, head_bytes. */
    Py_ssize_t max_frame[2], keep_limit[2], head_bytes[2];
    Py_ssize_t pieces_min[2]; /* each stream's pieces_min_bytes */
    Py_ssize_t taken; /* frames taken here (the tests check that the common reads' are) */
} ReadsObject;

/* The entry of (api key, version), asked of the session the first time; NULL where Python takes it. */
static Entry *entry_of(ReadsObject *self, long api_key, long version)
{
    if (api_key < 0 || api_key >= API_KEYS || version < 0 || version >= VERSIONS)
        return NULL;
    Entry *e = &((TableObject *)self->table)->entries[api_key][version];
    if (e->state == 0) {
        PyObject *key = PyLong_FromLong(api_key), *ver = PyLong_FromLong(version);
        PyObject *got = NULL;
        if (key != NULL && ver != NULL) {
            PyObject *args[3] = {self->session, key, ver};
            got = PyObject_VectorcallMethod(str_entry, args, 3, NULL);
        }
        Py_XDECREF(key);
        Py_XDECREF(ver);
        if (got == NULL) { /* Python reads it, and says what failed */
            PyErr_Clear();
            return NULL;
        }
        int request_mode, response_mode, request_header, response_header, flags;
        PyObject *name;
        if (PyTuple_Check(got) && PyArg_ParseTuple(got, "iiiiiO", &request_mode, &response_mode,
                                                          &request_header, &response_header, &flags, &name)) {
            e->request_mode = (unsigned char)request_mode;
            e->response_mode = (unsigned char)response_mode;
            e->request_header = (unsigned char)request_header;
            e->response_header = (unsigned char)response_header;
            e->flags = (unsigned char)flags;
            e->name = Py_NewRef(name);
            e->state = 1;
        } else { /* not the tuple Session._one_frame_entry answers: Python reads every frame of it */
            PyErr_Clear();
            e->state = -1;
        }
        Py_DECREF(got);
    }
    return e->state == 1 ? e : NULL;
}

/* A flag of the session (borrowed; NULL, no error set, when unset or not found): at its slot for a Session,
 * else by name (a stand-in). */
static inline PyObject *flag(PyObject *session, int which)
{
    if (PyObject_TypeCheck(session, classes[C_SESSION]))
        return SLOT(session, f[which]);
    PyObject *v = PyObject_GetAttr(session, f_str[which]);
    if (v == NULL) {
        PyErr_Clear();
        return NULL;
    }
    Py_DECREF(v); /* the session holds it */
    return v;
}

static inline int is_true(PyObject *session, int which) { return flag(session, which) == Py_True; }

static inline int is_zero(PyObject *session, int which)
{
    PyObject *v = flag(session, which);
    return v != NULL && PyLong_CheckExact(v) && PyLong_AsLong(v) == 0;
}

/* Whether the session lets a direction's frames be read here: framed and inspected, no raw SASL token
 * expected (and for the client, its first bytes seen). */
static int session_open(PyObject *session, int client)
{
    if (client)
        return is_true(session, F_CLIENT_SEEN) && is_true(session, F_CLIENT_FRAMED)
               && is_true(session, F_CLIENT_INSPECTED) && is_zero(session, F_RAW_CLIENT);
    return is_true(session, F_BROKER_FRAMED) && is_true(session, F_BROKER_INSPECTED) && is_zero(session, F_RAW_BROKER);
}

/* Whether a stream holds nothing: no frame under way, no bytes buffered, not failed. */
static int stream_idle(PyObject *stream)
{
    PyObject *buffer = SLOT(stream, s[S_BUFFER]), *size = SLOT(stream, s[S_SIZE]), *skip = SLOT(stream, s[S_SKIP]);
    return SLOT(stream, s[S_FAILED]) == Py_False && SLOT(stream, s[S_PARTS]) == Py_None && buffer != NULL
           && PyByteArray_CheckExact(buffer) && PyByteArray_GET_SIZE(buffer) == 0 && size != NULL
           && PyLong_CheckExact(size) && PyLong_AsLong(size) == -1 && skip != NULL && PyLong_CheckExact(skip)
           && PyLong_AsLong(skip) == 0;
}

/* An int attribute of a stream, at its slot; -1 with an error set if it is not an int. */
static Py_ssize_t stream_int(PyObject *stream, int which)
{
    PyObject *v = SLOT(stream, s[which]);
    if (v == NULL || !PyLong_CheckExact(v)) {
        PyErr_Format(PyExc_TypeError, "_one_frame: a stream's %s is not an int", S_NAMES[which]);
        return -1;
    }
    return PyLong_AsSsize_t(v);
}

/* Whether this read's frames may be taken here at all: the direction is framed and inspected, no raw
 * SASL token is expected, and its stream holds nothing (no frame under way). Checked once a read:
 * the frames taken here change none of it. */
static int direction_open(ReadsObject *self, int client)
{
    if (client)
        return stream_idle(self->requests) && session_open(self->session, 1);
    return stream_idle(self->responses) && SLOT(self->responses, s[S_FORWARDING]) == Py_False
           && session_open(self->session, 0);
}

/* The size of the frame whose size prefix is at data[pos] (buf: where that prefix is), if the frame is
 * whole in data, of 8 bytes or more and within the stream's max_frame_bytes; else -1. */
static Py_ssize_t whole_frame(ReadsObject *self, int client, PyObject *data, Py_ssize_t pos,
                              const unsigned char **buf)
{
    Py_ssize_t avail = PyBytes_GET_SIZE(data) - pos;
    *buf = (const unsigned char *)PyBytes_AS_STRING(data) + pos;
    if (avail < 12)
        return -1;
    Py_ssize_t size = (int32_t)be32(*buf);
    if (size < 8 || 4 + size > avail || size > self->max_frame[!client])
        return -1;
    return size;
}

/* How much of a frame of this size its mode keeps (framing.stream's _one_frame), and whether that is all of it. */
static Py_ssize_t kept(ReadsObject *self, int client, int mode, Py_ssize_t size, int *complete)
{
    Py_ssize_t keep_limit = self->keep_limit[!client], head_bytes = self->head_bytes[!client];
    *complete = 0;
    if ((mode == KEEP_WHOLE || mode == KEEP_PIECES) && size > keep_limit)
        return size < head_bytes ? size : head_bytes;
    if (mode == KEEP_HEAD && size > head_bytes)
        return head_bytes;
    *complete = 1;
    return size;
}

/* The Output(None, events) the session returns. */
static PyObject *output(PyObject *events)
{
    PyObject *out = classes[C_OUTPUT]->tp_alloc(classes[C_OUTPUT], 2);
    if (out == NULL) {
        Py_DECREF(events);
        return NULL;
    }
    PyTuple_SET_ITEM(out, 0, Py_NewRef(Py_None));
    PyTuple_SET_ITEM(out, 1, events);
    return out;
}

/* The stream's offset moved past this read; the offset the frame started at (new reference). */
static PyObject *advance(PyObject *stream, Py_ssize_t n)
{
    PyObject *offset = SLOT(stream, s[S_OFFSET]);
    Py_ssize_t at = PyLong_AsSsize_t(offset);
    PyObject *next = PyLong_FromSsize_t(at + n);
    if (next == NULL)
        return NULL;
    Py_INCREF(offset);
    set_slot(stream, s[S_OFFSET], next);
    return offset;
}

/* Not an int16: produce_acks could not read the acks here, and Python reads them (acks=-1, "all", is a value). */
#define ACKS_UNREAD (-100000L)

/* A Produce request's acks (peek.produce_acks) read from the len bytes at frame; `beyond` when they lie
 * past them (1 for a whole frame's kept bytes: as None != 0 in the reference; ACKS_UNREAD for a frame's first
 * piece: the reference reads further), ACKS_UNREAD for a TransactionalId whose length is a longer varint. */
static long produce_acks(const unsigned char *frame, Py_ssize_t len, Py_ssize_t pos, long version, int flexible,
                         long beyond)
{
    if (version >= 3) {
        long length;
        if (flexible) {
            if (pos >= len)
                return beyond;
            if (frame[pos] >= 0x80)
                return ACKS_UNREAD;
            length = (long)frame[pos] - 1;
            pos += 1;
        } else {
            if (pos + 2 > len)
                return beyond;
            length = (int16_t)be16(frame + pos);
            pos += 2;
        }
        if (length > 0)
            pos += length;
    }
    if (pos + 2 > len)
        return beyond;
    return (int16_t)be16(frame + pos);
}

/* Read the request whose frame (after its size prefix) is at `frame`, `size` bytes, its entry `e` (entry_of
 * of its api key and version, found by the caller), if it is one taken here:
 * 1 (its event appended to events, the stream's offset moved past it), 0 where the reference must read it
 * (nothing changed), -1 on failure. pieces NULL: the frame lies whole at `frame`, kept as its mode says (a
 * copy); else the FramePieces it came in, of which the first `avail` bytes lie at `frame` (its header and a
 * Produce's acks must be among them). */
static int request_event(ReadsObject *self, Entry *e, const unsigned char *frame, Py_ssize_t size, PyObject *pieces,
                         Py_ssize_t avail, PyObject *now, PyObject *events)
{
    PyObject *stream = self->requests;
    Py_ssize_t len = 4 + size;
    long api_key = (int16_t)be16(frame), version = (int16_t)be16(frame + 2);
    long correlation_id = (int32_t)be32(frame + 4);
    if (e == NULL || (e->flags & E_REQUEST_PYTHON) || e->request_header == 0)
        return 0;
    if (pieces != NULL && (e->request_mode != KEEP_PIECES || (e->flags & E_SOFTWARE)))
        return 0;
    int complete = 1;
    Py_ssize_t keep = pieces != NULL ? size : kept(self, 1, e->request_mode, size, &complete);
    Py_ssize_t readable = pieces != NULL ? avail : keep; /* the bytes at `frame` read here */
    /* The header: the previous one's bytes again (RequestHeaders' memo), else Python reads it. */
    PyObject *memo = SLOT(self->headers, r[e->request_header == 2 ? R_V2 : R_V1]);
    if (memo == NULL || !PyTuple_CheckExact(memo) || PyTuple_GET_SIZE(memo) != 6)
        return 0;
    PyObject *after = PyTuple_GET_ITEM(memo, 0), *header_size = PyTuple_GET_ITEM(memo, 1);
    Py_ssize_t hsize = PyLong_AsSsize_t(header_size);
    if (!PyBytes_CheckExact(after) || hsize < 8 || PyBytes_GET_SIZE(after) != hsize - 8 || readable < hsize
        || memcmp(frame + 8, PyBytes_AS_STRING(after), hsize - 8) != 0) {
        PyErr_Clear();
        return 0;
    }
    if (PyObject_Length(self->remembered) >= self->max_inflight) { /* the reference forgets the oldest */
        PyErr_Clear();
        return 0;
    }
    if (e->flags & E_PRODUCE) {
        long acks = produce_acks(frame, readable, hsize, version, e->flags & E_PRODUCE_FLEXIBLE,
                                 pieces ? ACKS_UNREAD : 1);
        if (acks == 0 || acks == ACKS_UNREAD)
            return 0; /* acks=0 (no response to pair), a long TransactionalId, acks past the first piece */
    }
    PyObject *client_id = PyTuple_GET_ITEM(memo, 2), *fields = PyTuple_GET_ITEM(memo, 3);
    if (!PyDict_CheckExact(fields))
        return 0;

    /* Everything the read makes, before anything changes. */
    PyObject *frame_bytes = NULL, *key = NULL, *ver = NULL, *corr = NULL, *header = NULL;
    PyObject *request = NULL, *pending = NULL, *software = NULL, *size_obj = NULL, *mode = NULL;
    PyObject *offset = NULL, *hv = NULL;
    frame_bytes = pieces != NULL ? Py_NewRef(pieces) : PyBytes_FromStringAndSize((const char *)frame, keep);
    key = PyLong_FromLong(api_key);
    ver = PyLong_FromLong(version);
    corr = PyLong_FromLong(correlation_id);
    size_obj = PyLong_FromSsize_t(size);
    mode = PyLong_FromLong(e->response_mode);
    hv = PyLong_FromLong(e->request_header);
    if (frame_bytes == NULL || key == NULL || ver == NULL || corr == NULL || size_obj == NULL || mode == NULL
        || hv == NULL)
        goto fail;
    if ((e->flags & E_SOFTWARE) && complete) {
        const char *body = (const char *)frame + hsize;
        Py_ssize_t body_len = keep - hsize;
        if (software_body != NULL && PyBytes_GET_SIZE(software_body) == body_len
            && memcmp(PyBytes_AS_STRING(software_body), body, body_len) == 0) {
            software = Py_NewRef(software_outcome);
        } else {
            PyObject *args[2] = {frame_bytes, header_size};
            software = PyObject_Vectorcall(software_of, args, 2, NULL);
            if (software == NULL || !PyTuple_CheckExact(software) || PyTuple_GET_SIZE(software) != 2) {
                PyErr_Clear(); /* the reference reads it again, and says what failed */
                goto given_back;
            }
            if (body_len <= SOFTWARE_MEMO_BYTES) { /* a body too long is not worth keeping: software_of's rule */
                PyObject *kept_body = PyBytes_FromStringAndSize(body, body_len);
                if (kept_body == NULL)
                    goto fail;
                Py_XSETREF(software_body, kept_body);
                Py_XSETREF(software_outcome, Py_NewRef(software));
            }
        }
    }
    header = blank(classes[C_HEADER]);
    request = blank(classes[C_REQUEST]);
    pending = blank(classes[C_PENDING]);
    if (header == NULL || request == NULL || pending == NULL)
        goto fail;
    SLOT(header, h[H_API_KEY]) = Py_NewRef(key);
    SLOT(header, h[H_API_VERSION]) = Py_NewRef(ver);
    SLOT(header, h[H_CORRELATION]) = Py_NewRef(corr);
    SLOT(header, h[H_CLIENT_ID]) = Py_NewRef(client_id);
    SLOT(header, h[H_VERSION]) = hv;
    hv = NULL;
    SLOT(header, h[H_SIZE]) = Py_NewRef(header_size);
    /* The previous header's fields are this one's base (its ClientId and tagged fields are this one's: the bytes
     * are the same): RequestHeader.fields builds its own dict from them when first read, as RequestHeaders does. */
    SLOT(header, h[H_FIELDS]) = Py_NewRef(Py_None);
    SLOT(header, h[H_BASE]) = Py_NewRef(fields);

    /* From here on the session changes. */
    offset = advance(stream, len);
    if (offset == NULL)
        goto fail;
    SLOT(request, q[Q_CONNECTION]) = Py_NewRef(self->connection);
    SLOT(request, q[Q_TIME]) = Py_NewRef(now);
    SLOT(request, q[Q_OFFSET]) = offset;
    SLOT(request, q[Q_HEADER]) = header;
    header = NULL;
    SLOT(request, q[Q_API_NAME]) = Py_NewRef(e->name);
    SLOT(request, q[Q_KNOWN]) = Py_NewRef((e->flags & E_REQUEST_KNOWN) ? Py_True : Py_False);
    SLOT(request, q[Q_TAG_BYTES]) = Py_NewRef(PyTuple_GET_ITEM(memo, 4));
    SLOT(request, q[Q_TAGS]) = Py_NewRef(PyTuple_GET_ITEM(memo, 5));
    SLOT(request, q[Q_SIZE]) = size_obj;
    size_obj = NULL;
    SLOT(request, q[Q_FRAME]) = frame_bytes;
    frame_bytes = NULL;
    SLOT(request, q[Q_COMPLETE]) = Py_NewRef(complete ? Py_True : Py_False);
    SLOT(request, q[Q_CODEC]) = Py_NewRef(self->codec);
    SLOT(request, q[Q_EXPECTS]) = Py_NewRef(Py_True);
    SLOT(request, q[Q_DECODED]) = Py_NewRef(Py_None);
    SLOT(request, q[Q_SCANNED]) = Py_NewRef(Py_None);
    PyObject *connection = self->connection;
    if (client_id != Py_None)
        set_slot(connection, n[N_CLIENT_ID], Py_NewRef(client_id));
    if (software != NULL) {
        PyObject *name = PyTuple_GET_ITEM(software, 0), *sversion = PyTuple_GET_ITEM(software, 1);
        if (name != Py_None || sversion != Py_None) {
            set_slot(connection, n[N_SOFTWARE], Py_NewRef(name));
            set_slot(connection, n[N_SOFTWARE_VERSION], Py_NewRef(sversion));
        }
        Py_CLEAR(software);
    }
    SLOT(pending, t[T_API_KEY]) = key;
    SLOT(pending, t[T_API_VERSION]) = ver;
    SLOT(pending, t[T_CORRELATION]) = Py_NewRef(corr);
    SLOT(pending, t[T_REQUEST]) = Py_NewRef(request);
    SLOT(pending, t[T_TIME]) = Py_NewRef(now);
    SLOT(pending, t[T_MODE]) = mode;
    SLOT(pending, t[T_MECHANISM]) = Py_NewRef(Py_None);
    SLOT(pending, t[T_FORGOTTEN]) = Py_NewRef(Py_False);
    key = ver = mode = NULL;
    if (PyObject_SetItem(self->inflight, corr, pending) < 0)
        goto fail;
    PyObject *appended = PyObject_CallMethodOneArg(self->remembered, str_append, pending);
    if (appended == NULL)
        goto fail;
    Py_DECREF(appended);
    Py_DECREF(pending);
    Py_DECREF(corr);
    int appended_event = PyList_Append(events, request);
    Py_DECREF(request);
    return appended_event < 0 ? -1 : 1;

given_back:
    Py_XDECREF(software);
    Py_XDECREF(frame_bytes);
    Py_XDECREF(key);
    Py_XDECREF(ver);
    Py_XDECREF(corr);
    Py_XDECREF(size_obj);
    Py_XDECREF(mode);
    Py_XDECREF(hv);
    return 0;
fail:
    Py_XDECREF(frame_bytes);
    Py_XDECREF(key);
    Py_XDECREF(ver);
    Py_XDECREF(corr);
    Py_XDECREF(size_obj);
    Py_XDECREF(mode);
    Py_XDECREF(hv);
    Py_XDECREF(header);
    Py_XDECREF(request);
    Py_XDECREF(pending);
    Py_XDECREF(software);
    if (!PyErr_Occurred())
        PyErr_SetString(PyExc_RuntimeError, "_one_frame: a request could not be read");
    return -1;
}

/* A view of data[from:to] (a bytes read), which keeps the read alive: how a frame's pieces are held, not copied. */
static PyObject *view_of(PyObject *data, Py_ssize_t from, Py_ssize_t to)
{
    PyObject *whole = PyMemoryView_FromObject(data);
    PyObject *view = whole ? PySequence_GetSlice(whole, from, to) : NULL;
    Py_XDECREF(whole);
    return view;
}

/* A FramePieces of one piece, a view of data[from:to]: a frame whole in one read, handed over as
 * framing.stream hands it (new reference; NULL with an error set). */
static PyObject *one_piece(PyObject *data, Py_ssize_t from, Py_ssize_t to)
{
    PyObject *view = view_of(data, from, to);
    PyObject *items = view ? PyTuple_Pack(1, view) : NULL;
    Py_XDECREF(view);
    PyObject *pieces = items ? PyObject_CallOneArg((PyObject *)classes[C_PIECES], items) : NULL;
    Py_XDECREF(items);
    return pieces;
}

/* Read the request whose size prefix is at data[pos], if it is whole in data and taken here (request_event):
 * one kept in pieces (KEEP_PIECES, pieces_min_bytes or more, within keep_limit) as a FramePieces of one view
 * of the read, as framing.stream hands it over, not a copy. */
static int client_frame(ReadsObject *self, PyObject *data, Py_ssize_t pos, PyObject *now, PyObject *events)
{
    const unsigned char *buf;
    Py_ssize_t size = whole_frame(self, 1, data, pos, &buf);
    if (size < 0)
        return 0;
    Entry *e = entry_of(self, (int16_t)be16(buf + 4), (int16_t)be16(buf + 6));
    if (e == NULL || e->request_mode != KEEP_PIECES || size < self->pieces_min[0] || size > self->keep_limit[0])
        return request_event(self, e, buf + 4, size, NULL, size, now, events);
    PyObject *pieces = one_piece(data, pos + 4, pos + 4 + size);
    if (pieces == NULL)
        return -1;
    int taken = request_event(self, e, buf + 4, size, pieces, size, now, events);
    Py_DECREF(pieces);
    return taken;
}

/* Whether a stream is gathering a frame kept in pieces (framing.stream's _gather: a large Produce request, a
 * large Fetch response) that began in a bytes read: its first piece a view of that read, nothing in the buffer,
 * nothing to skip; and the direction framed and inspected, no raw SASL token expected. */
static int gathering(ReadsObject *self, int client)
{
    PyObject *stream = client ? self->requests : self->responses, *session = self->session;
    PyObject *buffer = SLOT(stream, s[S_BUFFER]), *parts = SLOT(stream, s[S_PARTS]), *mode = SLOT(stream, s[S_MODE]);
    PyObject *size = SLOT(stream, s[S_SIZE]), *skip = SLOT(stream, s[S_SKIP]), *have = SLOT(stream, s[S_PARTS_BYTES]);
    return SLOT(stream, s[S_FAILED]) == Py_False && parts != NULL && PyList_CheckExact(parts)
           && PyList_GET_SIZE(parts) > 0 && PyMemoryView_Check(PyList_GET_ITEM(parts, 0)) && buffer != NULL
           && PyByteArray_CheckExact(buffer) && PyByteArray_GET_SIZE(buffer) == 0 && mode != NULL
           && PyLong_CheckExact(mode) && PyLong_AsLong(mode) == KEEP_PIECES && size != NULL && PyLong_CheckExact(size)
           && PyLong_AsSsize_t(size) >= 0 && skip != NULL && PyLong_CheckExact(skip) && PyLong_AsLong(skip) == 0
           && have != NULL && PyLong_CheckExact(have)
           && (client || SLOT(stream, s[S_FORWARDING]) == Py_False) && session_open(session, client);
}

/* A response's request paired (Session._plan_response): out of the in-flight table and, if it is the oldest of
 * the requests whose facts are kept, out of those (answers come in order). -1 with an error set on failure. */
static int pair(ReadsObject *self, PyObject *pending)
{
    if (PyObject_DelItem(self->inflight, SLOT(pending, t[T_CORRELATION])) < 0)
        return -1;
    if (PyObject_Length(self->remembered) <= 0)
        return 0;
    PyObject *oldest = PySequence_GetItem(self->remembered, 0);
    if (oldest == NULL)
        return -1;
    Py_DECREF(oldest);
    if (oldest == pending) {
        PyObject *gone = PyObject_CallMethodNoArgs(self->remembered, str_popleft);
        if (gone == NULL)
            return -1;
        Py_DECREF(gone);
    }
    return 0;
}

/* Read the response whose frame (after its size prefix) is at `frame`, `size` bytes, answering `pending` (a
 * borrowed _Pending), if it is one taken here: 1 (its events appended, the stream's offset moved past it), 0
 * where the reference must read it (nothing changed), -1 on failure. popped: the pending was taken out of the
 * in-flight table when the frame's first bytes came (a response in pieces, start_gather); else it is taken
 * out here. pieces NULL: the frame lies whole at `frame`, kept as its mode says (a copy); else the FramePieces
 * it came in, of which the first `avail` bytes lie at `frame` (its header must be among them). */
static int response_event(ReadsObject *self, PyObject *pending, int popped, const unsigned char *frame,
                          Py_ssize_t size, PyObject *pieces, Py_ssize_t avail, PyObject *now, PyObject *events)
{
    if (!Py_IS_TYPE(pending, classes[C_PENDING]) || SLOT(pending, t[T_FORGOTTEN]) != Py_False
        || SLOT(pending, t[T_MECHANISM]) != Py_None)
        return 0;
    PyObject *api_key_obj = SLOT(pending, t[T_API_KEY]), *version_obj = SLOT(pending, t[T_API_VERSION]);
    long api_key = PyLong_AsLong(api_key_obj), version = PyLong_AsLong(version_obj);
    long mode = PyLong_AsLong(SLOT(pending, t[T_MODE]));
    double sent = PyFloat_AsDouble(SLOT(pending, t[T_TIME])), at = PyFloat_AsDouble(now);
    Entry *e = PyErr_Occurred() || mode == HOLD ? NULL : entry_of(self, api_key, version);
    if (e == NULL || (pieces != NULL && mode != KEEP_PIECES)) {
        PyErr_Clear();
        return 0;
    }
    int complete = 1;
    Py_ssize_t keep = pieces != NULL ? size : kept(self, 0, (int)mode, size, &complete);
    Py_ssize_t readable = pieces != NULL ? avail : keep; /* the bytes at `frame` read here */
    long header_size = 4, tag_bytes = 0;
    if (e->response_header >= 1) {
        if (readable <= 4 || frame[4] != 0) /* a header tag section with fields: Python reads it */
            return 0;
        header_size = 5;
        tag_bytes = 1;
    }
    long body_version = version;
    if (api_key == API_VERSIONS && version > 0 && readable >= header_size + 2
        && (int16_t)be16(frame + header_size) == UNSUPPORTED_VERSION)
        body_version = 0; /* KIP-511: the broker answered with a v0 body */

    PyObject *request = SLOT(pending, t[T_REQUEST]);
    PyObject *frame_obj = pieces != NULL ? Py_NewRef(pieces) : PyBytes_FromStringAndSize((const char *)frame, keep);
    PyObject *response = blank(classes[C_RESPONSE]);
    PyObject *exchange = request != Py_None ? blank(classes[C_EXCHANGE]) : NULL;
    PyObject *latency = request != Py_None ? PyFloat_FromDouble(at - sent) : NULL;
    PyObject *body_version_obj = body_version == version ? Py_NewRef(version_obj) : PyLong_FromLong(body_version);
    PyObject *hv = PyLong_FromLong(e->response_header), *hs = PyLong_FromLong(header_size);
    PyObject *tb = PyLong_FromLong(tag_bytes), *size_obj = PyLong_FromSsize_t(size);
    if (frame_obj == NULL || response == NULL || body_version_obj == NULL || hv == NULL
        || hs == NULL || tb == NULL || size_obj == NULL || (request != Py_None && (exchange == NULL || latency == NULL)))
        goto fail;
    /* From here on the session changes. */
    Py_INCREF(pending);
    if (!popped) {
        if (pair(self, pending) < 0) {
            Py_DECREF(pending);
            goto fail;
        }
    }
    PyObject *offset = advance(self->responses, 4 + size);
    if (offset == NULL) {
        Py_DECREF(pending);
        goto fail;
    }
    SLOT(response, p[P_CONNECTION]) = Py_NewRef(self->connection);
    SLOT(response, p[P_TIME]) = Py_NewRef(now);
    SLOT(response, p[P_OFFSET]) = offset;
    SLOT(response, p[P_API_KEY]) = Py_NewRef(api_key_obj);
    SLOT(response, p[P_API_NAME]) = Py_NewRef(e->name);
    SLOT(response, p[P_KNOWN]) = Py_NewRef((e->flags & E_RESPONSE_KNOWN) ? Py_True : Py_False);
    SLOT(response, p[P_API_VERSION]) = body_version_obj;
    SLOT(response, p[P_REQUEST_VERSION]) = Py_NewRef(version_obj);
    SLOT(response, p[P_CORRELATION]) = Py_NewRef(SLOT(pending, t[T_CORRELATION]));
    SLOT(response, p[P_HEADER_VERSION]) = hv;
    SLOT(response, p[P_HEADER_SIZE]) = hs;
    SLOT(response, p[P_TAG_BYTES]) = tb;
    SLOT(response, p[P_TAGS]) = PyTuple_New(0);
    SLOT(response, p[P_SIZE]) = size_obj;
    SLOT(response, p[P_FRAME]) = frame_obj;
    SLOT(response, p[P_COMPLETE]) = Py_NewRef(complete ? Py_True : Py_False);
    SLOT(response, p[P_CODEC]) = Py_NewRef(self->codec);
    SLOT(response, p[P_DECODED]) = Py_NewRef(Py_None);
    SLOT(response, p[P_SCANNED]) = Py_NewRef(Py_None);
    if (exchange != NULL) {
        SLOT(exchange, x[X_REQUEST]) = Py_NewRef(request); /* request: borrowed from pending, still held */
        SLOT(exchange, x[X_RESPONSE]) = Py_NewRef(response);
        SLOT(exchange, x[X_LATENCY]) = latency;
    }
    Py_DECREF(pending);
    int failed = PyList_Append(events, response);
    Py_DECREF(response);
    if (exchange != NULL) {
        failed |= PyList_Append(events, exchange);
        Py_DECREF(exchange);
    }
    return failed ? -1 : 1;

fail:
    Py_XDECREF(frame_obj);
    Py_XDECREF(response);
    Py_XDECREF(exchange);
    Py_XDECREF(latency);
    Py_XDECREF(body_version_obj);
    Py_XDECREF(hv);
    Py_XDECREF(hs);
    Py_XDECREF(tb);
    Py_XDECREF(size_obj);
    if (!PyErr_Occurred())
        PyErr_SetString(PyExc_RuntimeError, "_one_frame: a response could not be read");
    return -1;
}

/* The request in flight that the response whose first bytes are at `frame` answers (borrowed), or NULL
 * (without an error set) for none. */
static PyObject *answered(ReadsObject *self, const unsigned char *frame)
{
    PyObject *corr = PyLong_FromLong((int32_t)be32(frame));
    if (corr == NULL) {
        PyErr_Clear();
        return NULL;
    }
    PyObject *pending = PyDict_GetItemWithError(self->inflight, corr); /* borrowed */
    Py_DECREF(corr);
    PyErr_Clear();
    return pending;
}

/* Read the response whose size prefix is at data[pos], if it is whole in data and taken here (response_event):
 * one kept in pieces (a large Fetch: KEEP_PIECES, pieces_min_bytes or more, within keep_limit) as a FramePieces
 * of one view of the read, as framing.stream hands it over, not a copy. */
static int broker_frame(ReadsObject *self, PyObject *data, Py_ssize_t pos, PyObject *now, PyObject *events)
{
    const unsigned char *buf;
    Py_ssize_t size = whole_frame(self, 0, data, pos, &buf);
    if (size < 0)
        return 0;
    PyObject *pending = answered(self, buf + 4);
    if (pending == NULL || !Py_IS_TYPE(pending, classes[C_PENDING]))
        return 0;
    PyObject *mode = SLOT(pending, t[T_MODE]);
    if (!(PyLong_CheckExact(mode) && PyLong_AsLong(mode) == KEEP_PIECES && size >= self->pieces_min[1]
          && size <= self->keep_limit[1]))
        return response_event(self, pending, 0, buf + 4, size, NULL, size, now, events);
    PyObject *pieces = one_piece(data, pos + 4, pos + 4 + size);
    if (pieces == NULL)
        return -1;
    int taken = response_event(self, pending, 0, buf + 4, size, pieces, size, now, events);
    Py_DECREF(pieces);
    return taken;
}

/* A bytes read while gathering() holds (framing.stream's _gather): a read inside the frame is kept as its
 * next piece (1, *pos = the read's length); a read that ends it hands the frame over in the pieces it came
 * in, when it is one taken here (1, *pos = its bytes in this read); 0 where the reference must read the whole
 * read (nothing changed: too many small pieces, to be joined; a frame not taken here); -1 on failure. */
static int gather_read(ReadsObject *self, int client, PyObject *data, PyObject *now, PyObject *events,
                       Py_ssize_t *pos)
{
    PyObject *stream = client ? self->requests : self->responses, *parts = SLOT(stream, s[S_PARTS]);
    Py_ssize_t size = PyLong_AsSsize_t(SLOT(stream, s[S_SIZE])), have = PyLong_AsSsize_t(SLOT(stream, s[S_PARTS_BYTES]));
    Py_ssize_t n = PyBytes_GET_SIZE(data), need = 4 + size - have; /* bytes of the frame still to come */
    if (need <= 0)
        return 0;
    if (n < need) {
        PyObject *more = PyLong_FromSsize_t(have + n);
        if (more == NULL || PyList_Append(parts, data) < 0) {
            Py_XDECREF(more);
            return -1;
        }
        set_slot(stream, s[S_PARTS_BYTES], more);
        *pos = n;
        return 1;
    }
    Py_ssize_t count = PyList_GET_SIZE(parts); /* the first piece, then count - 1 reads, then this one */
    if (size < self->pieces_min[!client] * (count + 1))
        return 0; /* small pieces: the reference joins them */
    PyObject *first = PyList_GET_ITEM(parts, 0);
    Py_buffer *view = PyMemoryView_GET_BUFFER(first);
    if (view->len < 12 || view->ndim != 1 || view->itemsize != 1 || !PyBuffer_IsContiguous(view, 'C'))
        return 0;
    const unsigned char *frame = (const unsigned char *)view->buf + 4;
    Entry *e = NULL;
    PyObject *ticket = SLOT(stream, s[S_TICKET]); /* a response's: the request it answers */
    if (client) {
        e = entry_of(self, (int16_t)be16(frame), (int16_t)be16(frame + 2));
        if (e == NULL || e->request_mode != KEEP_PIECES)
            return 0;
    } else if (ticket == NULL || !Py_IS_TYPE(ticket, classes[C_PENDING])) {
        return 0;
    }
    PyObject *items = PyTuple_New(count + 1);
    PyObject *head = PySequence_GetSlice(first, 4, view->len), *last = view_of(data, 0, need);
    if (items == NULL || head == NULL || last == NULL) {
        Py_XDECREF(items);
        Py_XDECREF(head);
        Py_XDECREF(last);
        return -1;
    }
    PyTuple_SET_ITEM(items, 0, head);
    for (Py_ssize_t i = 1; i < count; i++)
        PyTuple_SET_ITEM(items, i, Py_NewRef(PyList_GET_ITEM(parts, i)));
    PyTuple_SET_ITEM(items, count, last);
    PyObject *pieces = PyObject_CallOneArg((PyObject *)classes[C_PIECES], items);
    Py_DECREF(items);
    if (pieces == NULL)
        return -1;
    int taken = client ? request_event(self, e, frame, size, pieces, view->len - 4, now, events)
                       : response_event(self, ticket, 1, frame, size, pieces, view->len - 4, now, events);
    Py_DECREF(pieces);
    if (taken != 1)
        return taken;
    /* No frame under way any more (the event's reader moved the stream's offset past this one). */
    set_slot(stream, s[S_PARTS], Py_NewRef(Py_None));
    set_slot(stream, s[S_PARTS_BYTES], PyLong_FromLong(0));
    set_slot(stream, s[S_SIZE], PyLong_FromLong(-1));
    set_slot(stream, s[S_FORWARDED], PyLong_FromLong(0));
    *pos = need;
    return 1;
}

/* The frame whose size prefix is at data[pos] and which runs past this bytes read, when it is kept in pieces
 * (a Produce request, a Fetch response, within inspect.max_bytes): the idle stream starts gathering it, its
 * first piece a view of this read, as framing.stream's feed does (1); a response is paired now, as the
 * reference's plan pairs it when its first bytes come. 0 where the reference must read the rest of the read;
 * -1 on failure. */
static int start_gather(ReadsObject *self, int client, PyObject *data, Py_ssize_t pos)
{
    PyObject *stream = client ? self->requests : self->responses;
    Py_ssize_t len = PyBytes_GET_SIZE(data), avail = len - pos;
    const unsigned char *buf = (const unsigned char *)PyBytes_AS_STRING(data) + pos;
    if (avail < 12)
        return 0;
    Py_ssize_t size = (int32_t)be32(buf);
    if (size < 8 || 4 + size <= avail || size > self->max_frame[!client] || size > self->keep_limit[!client])
        return 0;
    PyObject *ticket = NULL;
    if (client) {
        long api_key = (int16_t)be16(buf + 4), version = (int16_t)be16(buf + 6);
        long correlation_id = (int32_t)be32(buf + 8);
        Entry *e = entry_of(self, api_key, version);
        if (e == NULL || e->request_mode != KEEP_PIECES)
            return 0;
        ticket = Py_BuildValue("(lll)", api_key, version, correlation_id);
    } else {
        PyObject *pending = answered(self, buf + 4);
        if (pending == NULL || !Py_IS_TYPE(pending, classes[C_PENDING]) || SLOT(pending, t[T_FORGOTTEN]) != Py_False
            || SLOT(pending, t[T_MECHANISM]) != Py_None)
            return 0;
        PyObject *mode = SLOT(pending, t[T_MODE]);
        if (!PyLong_CheckExact(mode) || PyLong_AsLong(mode) != KEEP_PIECES)
            return 0;
        ticket = Py_NewRef(pending);
    }
    PyObject *first = ticket ? view_of(data, pos, len) : NULL;
    PyObject *parts = first ? PyList_New(1) : NULL;
    PyObject *size_obj = PyLong_FromSsize_t(size), *have = PyLong_FromSsize_t(avail);
    if (parts == NULL || size_obj == NULL || have == NULL) {
        Py_XDECREF(first);
        Py_XDECREF(parts);
        Py_XDECREF(ticket);
        Py_XDECREF(size_obj);
        Py_XDECREF(have);
        return -1;
    }
    PyList_SET_ITEM(parts, 0, first);
    if (!client) { /* paired now (Session._plan_response): out of the in-flight table, and of the remembered */
        if (pair(self, ticket) < 0)
            goto fail;
    }
    set_slot(stream, s[S_SIZE], size_obj);
    set_slot(stream, s[S_MODE], PyLong_FromLong(KEEP_PIECES));
    set_slot(stream, s[S_TICKET], ticket);
    set_slot(stream, s[S_PARTS], parts);
    set_slot(stream, s[S_PARTS_BYTES], have);
    set_slot(stream, s[S_FORWARDED], PyLong_FromLong(0));
    return 1;
fail:
    Py_DECREF(parts);
    Py_DECREF(ticket);
    Py_DECREF(size_obj);
    Py_DECREF(have);
    return -1;
}

static PyObject *reads_call(ReadsObject *self, PyObject *const *args, Py_ssize_t nargs, int client)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "expected (data, now)");
        return NULL;
    }
    PyObject *data = args[0], *now = args[1], *python = client ? self->python_client : self->python_broker;
    PyObject *events = NULL;
    Py_ssize_t pos = 0, len = 0;
    int any = 0; /* whether this read's first bytes were taken here (then pos is how many) */
    if (PyBytes_CheckExact(data)) {
        len = PyBytes_GET_SIZE(data);
        if (gathering(self, client)) { /* the end of a frame in pieces, or a read inside it */
            events = PyList_New(0);
            if (events == NULL)
                return NULL;
            int got = gather_read(self, client, data, now, events, &pos);
            if (got < 0) {
                Py_DECREF(events);
                return NULL;
            }
            any = got;
            self->taken += got;
        }
        if ((any || pos == 0) && pos < len && direction_open(self, client)) {
            if (events == NULL && (events = PyList_New(0)) == NULL)
                return NULL;
            /* Whole frames, as long as each is one taken here. */
            while (pos < len) {
                int taken = client ? client_frame(self, data, pos, now, events)
                                   : broker_frame(self, data, pos, now, events);
                if (taken < 0) {
                    Py_DECREF(events);
                    return NULL;
                }
                if (taken == 0)
                    break;
                any = 1;
                self->taken++;
                pos += 4 + (Py_ssize_t)(int32_t)be32((const unsigned char *)PyBytes_AS_STRING(data) + pos);
            }
            if (pos < len) { /* a frame in pieces that begins here */
                int started = start_gather(self, client, data, pos);
                if (started < 0) {
                    Py_DECREF(events);
                    return NULL;
                }
                if (started) {
                    any = 1;
                    pos = len;
                }
            }
        }
    }
    if (!any) { /* nothing taken: the reference reads it all */
        Py_XDECREF(events);
        PyObject *call[3] = {self->session, data, now};
        return PyObject_Vectorcall(python, call, 3, NULL);
    }
    if (pos < len) { /* the rest from the first frame not taken here (a frame cut short, a special case) */
        PyObject *rest = PyBytes_FromStringAndSize(PyBytes_AS_STRING(data) + pos, len - pos);
        PyObject *call[3] = {self->session, rest, now};
        PyObject *out = rest != NULL ? PyObject_Vectorcall(python, call, 3, NULL) : NULL;
        Py_XDECREF(rest);
        if (out == NULL || !PyTuple_Check(out) || PyTuple_GET_SIZE(out) != 2 || PyTuple_GET_ITEM(out, 0) != Py_None
            || !PyList_Check(PyTuple_GET_ITEM(out, 1))
            || PyList_SetSlice(events, PY_SSIZE_T_MAX, PY_SSIZE_T_MAX, PyTuple_GET_ITEM(out, 1)) < 0) {
            if (out != NULL && !PyErr_Occurred())
                PyErr_SetString(PyExc_RuntimeError, "_one_frame: the session forwarded a changed read");
            Py_XDECREF(out);
            Py_DECREF(events);
            return NULL;
        }
        Py_DECREF(out);
    }
    return output(events);
}

static PyObject *reads_client_data(ReadsObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    return reads_call(self, args, nargs, 1);
}

static PyObject *reads_broker_data(ReadsObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    return reads_call(self, args, nargs, 0);
}

static PyObject *attr(PyObject *obj, PyObject *name, PyTypeObject *tp)
{
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v != NULL && tp != NULL && !Py_IS_TYPE(v, tp)) {
        PyErr_Format(PyExc_TypeError, "_one_frame: %R is not a %s", v, tp->tp_name);
        Py_CLEAR(v);
    }
    return v;
}

static PyObject *reads_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *session, *table, *python_client, *python_broker;
    if (kwargs != NULL && PyDict_GET_SIZE(kwargs)) {
        PyErr_SetString(PyExc_TypeError, "Reads takes positional arguments only");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "OO!OO:Reads", &session, &TableType, &table, &python_client, &python_broker))
        return NULL;
    if (classes[0] == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_one_frame.configure() was not called");
        return NULL;
    }
    ReadsObject *self = PyObject_GC_New(ReadsObject, type);
    if (self == NULL)
        return NULL;
    self->session = Py_NewRef(session);
    self->table = Py_NewRef(table);
    self->python_client = Py_NewRef(python_client);
    self->python_broker = Py_NewRef(python_broker);
    self->requests = attr(session, str_requests, classes[C_STREAM]);
    self->responses = self->requests ? attr(session, str_responses, classes[C_STREAM]) : NULL;
    self->headers = self->responses ? attr(session, str_headers, classes[C_HEADERS]) : NULL;
    self->connection = self->headers ? attr(session, str_connection, classes[C_CONNECTION]) : NULL;
    self->codec = self->connection ? attr(session, str_codec, NULL) : NULL;
    self->inflight = self->codec ? attr(session, str_inflight, NULL) : NULL;
    self->remembered = self->inflight ? attr(session, str_remembered, NULL) : NULL;
    self->max_inflight = -1;
    self->pieces_min[0] = self->pieces_min[1] = 0;
    self->taken = 0;
    PyObject_GC_Track(self);
    if (self->remembered == NULL || !PyDict_Check(self->inflight)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "_one_frame: the session's in-flight table is not a dict");
        Py_DECREF(self);
        return NULL;
    }
    PyObject *config = PyObject_GetAttr(session, str_config);
    PyObject *limit = config ? PyObject_GetAttr(config, str_max_inflight) : NULL;
    Py_XDECREF(config);
    if (limit == NULL || (self->max_inflight = PyLong_AsSsize_t(limit)) < 0) {
        Py_XDECREF(limit);
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "_one_frame: inspect.max_inflight below zero");
        Py_DECREF(self);
        return NULL;
    }
    Py_DECREF(limit);
    PyObject *streams[2] = {self->requests, self->responses};
    for (int i = 0; i < 2; i++) {
        if ((self->pieces_min[i] = stream_int(streams[i], S_PIECES_MIN)) < 0
            || (self->max_frame[i] = stream_int(streams[i], S_MAX_FRAME)) < 0
            || (self->keep_limit[i] = stream_int(streams[i], S_KEEP_LIMIT)) < 0
            || (self->head_bytes[i] = stream_int(streams[i], S_HEAD_BYTES)) < 0) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "_one_frame: a stream's limit below zero");
            Py_DECREF(self);
            return NULL;
        }
    }
    return (PyObject *)self;
}

static int reads_traverse(ReadsObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->session);
    Py_VISIT(self->table);
    Py_VISIT(self->requests);
    Py_VISIT(self->responses);
    Py_VISIT(self->headers);
    Py_VISIT(self->connection);
    Py_VISIT(self->codec);
    Py_VISIT(self->inflight);
    Py_VISIT(self->remembered);
    Py_VISIT(self->python_client);
    Py_VISIT(self->python_broker);
    return 0;
}

static int reads_clear(ReadsObject *self)
{
    Py_CLEAR(self->session);
    Py_CLEAR(self->table);
    Py_CLEAR(self->requests);
    Py_CLEAR(self->responses);
    Py_CLEAR(self->headers);
    Py_CLEAR(self->connection);
    Py_CLEAR(self->codec);
    Py_CLEAR(self->inflight);
    Py_CLEAR(self->remembered);
    Py_CLEAR(self->python_client);
    Py_CLEAR(self->python_broker);
    return 0;
}

static void reads_dealloc(ReadsObject *self)
{
    PyObject_GC_UnTrack(self);
    reads_clear(self);
    PyObject_GC_Del(self);
}

static PyMethodDef reads_methods[] = {
    {"client_data", (PyCFunction)(void (*)(void))reads_client_data, METH_FASTCALL,
     "Session.client_data: a one-frame read here, any other by the Python method."},
    {"broker_data", (PyCFunction)(void (*)(void))reads_broker_data, METH_FASTCALL,
     "Session.broker_data: a one-frame read here, any other by the Python method."},
    {NULL}};

static PyMemberDef reads_members[] = {
    {"taken", T_PYSSIZET, offsetof(ReadsObject, taken), READONLY,
     "frames (and reads inside a request in pieces) taken here, not by the Python methods"},
    {NULL}};

static PyTypeObject ReadsType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kinspect.session._one_frame.Reads",
    .tp_basicsize = sizeof(ReadsObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "One session's reads that are exactly one frame, read in C.",
    .tp_new = reads_new,
    .tp_dealloc = (destructor)reads_dealloc,
    .tp_traverse = (traverseproc)reads_traverse,
    .tp_clear = (inquiry)reads_clear,
    .tp_methods = reads_methods,
    .tp_members = reads_members,
};

/* ------------------------------------------------------------------ module */

static PyObject *configure(PyObject *module, PyObject *args)
{
    PyObject *tuple, *software;
    if (!PyArg_ParseTuple(args, "O!O:configure", &PyTuple_Type, &tuple, &software))
        return NULL;
    if (PyTuple_GET_SIZE(tuple) != C_COUNT) {
        PyErr_Format(PyExc_TypeError, "configure: %d classes expected", C_COUNT);
        return NULL;
    }
    PyTypeObject *got[C_COUNT];
    for (int i = 0; i < C_COUNT; i++) {
        PyObject *c = PyTuple_GET_ITEM(tuple, i);
        if (!PyType_Check(c)) {
            PyErr_SetString(PyExc_TypeError, "configure: classes must be classes");
            return NULL;
        }
        got[i] = (PyTypeObject *)c;
    }
    if (!PyType_IsSubtype(got[C_OUTPUT], &PyTuple_Type) || !PyType_IsSubtype(got[C_PIECES], &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "configure: Output and FramePieces must be tuple classes");
        return NULL;
    }
    if (find_offsets(got[C_REQUEST], Q_NAMES, Q_COUNT, q) < 0 || find_offsets(got[C_RESPONSE], P_NAMES, P_COUNT, p) < 0
        || find_offsets(got[C_EXCHANGE], X_NAMES, X_COUNT, x) < 0 || find_offsets(got[C_PENDING], T_NAMES, T_COUNT, t) < 0
        || find_offsets(got[C_HEADER], H_NAMES, H_COUNT, h) < 0 || find_offsets(got[C_STREAM], S_NAMES, S_COUNT, s) < 0
        || find_offsets(got[C_HEADERS], R_NAMES, R_COUNT, r) < 0
        || find_offsets(got[C_CONNECTION], N_NAMES, N_COUNT, n) < 0
        || find_offsets(got[C_SESSION], F_NAMES, F_COUNT, f) < 0)
        return NULL;
    for (int i = 0; i < C_COUNT; i++) {
        Py_INCREF(got[i]);
        Py_XSETREF(classes[i], got[i]);
    }
    Py_INCREF(software);
    Py_XSETREF(software_of, software);
    Py_CLEAR(software_body);
    Py_CLEAR(software_outcome);
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"configure", configure, METH_VARARGS,
     "configure((Request, Response, Exchange, _Pending, RequestHeader, Output, FrameStream, RequestHeaders, "
     "ConnectionInfo, FramePieces, Session), software_of): the classes read and made, once."},
    {NULL}};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "kinspect.session._one_frame",
                                        "A session's one-frame reads in C (kinspect.session.session is the reference).",
                                        -1, module_methods};

static int intern(PyObject **out, const char *text)
{
    *out = PyUnicode_InternFromString(text);
    return *out == NULL ? -1 : 0;
}

PyMODINIT_FUNC PyInit__one_frame(void)
{
    if (PyType_Ready(&TableType) < 0 || PyType_Ready(&ReadsType) < 0)
        return NULL;
    for (int i = 0; i < F_COUNT; i++)
        if (intern(&f_str[i], F_NAMES[i]))
            return NULL;
    if (intern(&str_entry, "_one_frame_entry")
        || intern(&str_append, "append") || intern(&str_popleft, "popleft")
        || intern(&str_requests, "_requests") || intern(&str_responses, "_responses")
        || intern(&str_headers, "_headers") || intern(&str_connection, "connection") || intern(&str_codec, "codec")
        || intern(&str_inflight, "_inflight") || intern(&str_remembered, "_remembered")
        || intern(&str_config, "config") || intern(&str_max_inflight, "max_inflight"))
        return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Table", (PyObject *)&TableType) < 0
        || PyModule_AddObjectRef(m, "Reads", (PyObject *)&ReadsType) < 0
        || PyModule_AddIntConstant(m, "API_KEYS", API_KEYS) < 0 || PyModule_AddIntConstant(m, "VERSIONS", VERSIONS) < 0
        || PyModule_AddIntConstant(m, "E_PRODUCE", E_PRODUCE) < 0
        || PyModule_AddIntConstant(m, "E_PRODUCE_FLEXIBLE", E_PRODUCE_FLEXIBLE) < 0
        || PyModule_AddIntConstant(m, "E_SOFTWARE", E_SOFTWARE) < 0
        || PyModule_AddIntConstant(m, "E_REQUEST_PYTHON", E_REQUEST_PYTHON) < 0
        || PyModule_AddIntConstant(m, "E_REQUEST_KNOWN", E_REQUEST_KNOWN) < 0
        || PyModule_AddIntConstant(m, "E_RESPONSE_KNOWN", E_RESPONSE_KNOWN) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
