/* The metrics observer's counting of requests, responses and exchanges, in C (MetricsObserver._request,
 * _response and _exchange in kinspect/observers/metrics.py are the reference).
 *
 * Why C: every request and response of every connection is counted on the event loop, about 1.3 us
 * each in Python (a plan lookup, three histogram cells, the memo of repeated bodies), as much as the
 * session's framing. Here the same steps read the events' slots and update the same cells (the
 * plain lists of metric_families), in the same order, with Python's own arithmetic.
 *
 * Counter(observer, classes, bounds, memo, fallbacks, helpers, decode_error) -> counter
 *   classes: (Request, Response, Exchange, RequestHeader, _Plan, ScanResult);
 *   bounds: (size bounds, header bounds, latency bounds, header v0 bucket), the histograms' bounds;
 *   memo: (MEMO_BODY_BYTES, MEMO_ENTRIES, MEMO_TRIAL);
 *   fallbacks: (observer._request, _response, _exchange), called for what is not counted here;
 *   helpers: (observer._decode_failure, _body_tagged_fields, _produced_records, _topic_bytes, _error_codes),
 *     called for the rarer facts, as the reference calls them (_produced_records only when count_produced
 *     leaves a Produce request's records to it: a compression without cells yet, summaries not made;
 *     _body_tagged_fields only with a body tagged field its plan does not know yet, count_tagged counting
 *     the known ones: an ApiVersions response carries four).
 * counter.request(e), counter.response(e), counter.exchange(e): the handlers the dispatcher calls.
 * A body is scanned as the event's scan() would: directly by the codec's C scan when that scan's first
 * branch applies (fast_scan), else by scan() itself.
 *
 * Counted here: events of a (api key, version) whose plan exists (the first event of each goes to
 * the reference, which makes the plan) and whose header tag section holds no field. Those checks
 * come before any cell changes. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include "../slot_offsets.h"

enum { C_REQUEST, C_RESPONSE, C_EXCHANGE, C_HEADER, C_PLAN, C_SCAN, C_COUNT };

enum { Q_HEADER, Q_API_NAME, Q_TAG_BYTES, Q_SIZE, Q_FRAME, Q_COMPLETE, Q_SCANNED, Q_CODEC, Q_COUNT };
static const char *const Q_NAMES[Q_COUNT] = {"header", "api_name", "header_tag_bytes", "size", "frame", "complete",
                                             "_scanned", "codec"};

enum { P_API_KEY, P_API_VERSION, P_HEADER_VERSION, P_HEADER_SIZE, P_TAG_BYTES, P_SIZE, P_FRAME, P_COMPLETE,
       P_SCANNED, P_CODEC, P_COUNT };
static const char *const P_NAMES[P_COUNT] = {"api_key", "api_version", "header_version", "header_size",
                                             "header_tag_bytes", "size", "frame", "complete", "_scanned", "codec"};

enum { X_REQUEST, X_RESPONSE, X_LATENCY, X_COUNT };
static const char *const X_NAMES[X_COUNT] = {"request", "response", "latency"};

enum { H_API_KEY, H_API_VERSION, H_VERSION, H_SIZE, H_COUNT };
static const char *const H_NAMES[H_COUNT] = {"api_key", "api_version", "version", "size"};

enum { L_API, L_COUNT_CELL, L_SIZE, L_HEADER, L_TAG_BYTES, L_KNOWN, L_SCAN, L_MEMO, L_LOOKUPS, L_HITS, L_TAGGED,
       L_TAGGED_LAST, L_MEMO_LAST, L_COUNT };
static const char *const L_NAMES[L_COUNT] = {"api", "count", "size", "header", "tag_bytes", "known", "scan", "memo",
                                             "lookups", "hits", "tagged", "tagged_last", "memo_last"};

enum { S_TAG_BYTES, S_TAGGED, S_ERRORS, S_TOPICS, S_SPANS, S_SUMMARIES, S_COUNT };
static const char *const S_NAMES[S_COUNT] = {"tag_section_bytes", "tagged_fields", "error_codes", "topics",
                                             "record_spans", "_summaries"};

/* A BatchSummary's fields by position (kinspect/protocol/records.py): what the produced counts read. */
enum { BATCH_RECORD_COUNT = 4, BATCH_COMPRESSION = 5 };

enum { F_REQUEST, F_RESPONSE, F_EXCHANGE, F_COUNT };
enum { K_DECODE_FAILURE, K_TAGGED, K_PRODUCED, K_TOPICS, K_ERRORS, K_COUNT };
enum { B_SIZE, B_HEADER, B_LATENCY, B_COUNT };

#define PRODUCE 0
#define PLAN_KEYS 128 /* api keys whose latest plan is remembered (Kafka's are below 100) */

typedef struct {
    double *at;
    Py_ssize_t n; /* bounds, +Inf last; the cell's sum is at index n */
} Bounds;

typedef struct {
    PyObject_HEAD
    PyObject *observer, *req_plans, *resp_plans, *latency_cells, *produced, *decode_error;
    PyTypeObject *classes[C_COUNT];
    Py_ssize_t q[Q_COUNT], p[P_COUNT], x[X_COUNT], h[H_COUNT], l[L_COUNT], s[S_COUNT];
    PyObject *fallback[F_COUNT], *helper[K_COUNT];
    Bounds bounds[B_COUNT];
    Py_ssize_t header_v0_bucket, memo_body_bytes, memo_entries, memo_trial;
    /* Per direction and api key below PLAN_KEYS, the plan last found for it and its version (see plan_of). */
    PyObject *plan_memo[2][PLAN_KEYS];
    long plan_memo_version[2][PLAN_KEYS];
    Py_ssize_t plan_memo_size[2]; /* the plans dict's size when the memo was last valid */
} CounterObject;

static PyObject *str_request, *str_response, *str_decode_error, *str_topic_bytes, *str_records, *str_scan,
    *str_unknown, *str_fast_scans, *str_integer_facts;
static PyObject *zero, *one, *four, *five; /* the ints 0, 1 (a count), 4 and 5 (where a v0 / v1 header ends) */

/* ------------------------------------------------------------------ Cell
 *
 * Cell(size): a metric family's cell where this module is built (kinspect.observers.metric_families makes
 * them; a list is the reference): `size` doubles, 0 at first, read and written by index as the list they
 * stand in for ([value, created], or bucket counts, sum, created). Why: in a list each count is an int
 * object, and each update Python's addition, a new int and the old one freed: about 130 instructions an
 * update and some 20 updates an exchange, a tenth of a small exchange's instructions. Here add_at adds in
 * place. Prometheus keeps samples as float64 and the collector renders float(value), so the /metrics text
 * is the same (counts and sums are exact below 2**53). Not tracked by the garbage collector: it holds no
 * object. */

typedef struct {
    PyObject_VAR_HEAD
    double at[1];
} CellObject;

static PyTypeObject CellType;

static PyObject *cell_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    Py_ssize_t size;
    if (kwargs != NULL && PyDict_GET_SIZE(kwargs)) {
        PyErr_SetString(PyExc_TypeError, "Cell(size) takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "n:Cell", &size))
        return NULL;
    if (size < 0) {
        PyErr_SetString(PyExc_ValueError, "Cell(size): size cannot be negative");
        return NULL;
    }
    return type->tp_alloc(type, size); /* zeroed: every double 0.0 */
}

static Py_ssize_t cell_length(PyObject *self) { return Py_SIZE(self); }

static PyObject *cell_item(PyObject *self, Py_ssize_t i)
{
    if (i < 0 || i >= Py_SIZE(self)) {
        PyErr_SetString(PyExc_IndexError, "Cell index out of range");
        return NULL;
    }
    return PyFloat_FromDouble(((CellObject *)self)->at[i]);
}

static int cell_ass_item(PyObject *self, Py_ssize_t i, PyObject *value)
{
    if (value == NULL) {
        PyErr_SetString(PyExc_TypeError, "a Cell's items cannot be deleted");
        return -1;
    }
    if (i < 0 || i >= Py_SIZE(self)) {
        PyErr_SetString(PyExc_IndexError, "Cell assignment index out of range");
        return -1;
    }
    double v = PyFloat_AsDouble(value);
    if (v == -1.0 && PyErr_Occurred())
        return -1;
    ((CellObject *)self)->at[i] = v;
    return 0;
}

static PyObject *cell_repr(PyObject *self)
{
    PyObject *items = PySequence_List(self);
    if (items == NULL)
        return NULL;
    PyObject *out = PyUnicode_FromFormat("Cell(%R)", items);
    Py_DECREF(items);
    return out;
}

static PySequenceMethods cell_as_sequence = {
    .sq_length = cell_length,
    .sq_item = cell_item,
    .sq_ass_item = cell_ass_item,
};

static PyTypeObject CellType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kinspect.observers._counting.Cell",
    .tp_basicsize = offsetof(CellObject, at),
    .tp_itemsize = sizeof(double),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Cell(size): a metric family's cell, `size` doubles read and written by index (a list is the reference).",
    .tp_new = cell_new,
    .tp_repr = cell_repr,
    .tp_as_sequence = &cell_as_sequence,
};

/* cell[i] += value: in place in a Cell; in a list (the reference's cells) with Python's arithmetic (ints stay
 * ints, a float sum a float). */
static int add_at(PyObject *cell, Py_ssize_t i, PyObject *value)
{
    if (Py_IS_TYPE(cell, &CellType)) {
        if (i < 0 || i >= Py_SIZE(cell)) {
            PyErr_SetString(PyExc_TypeError, "Counter: a cell is shorter than its family's");
            return -1;
        }
        double v = PyFloat_CheckExact(value) ? PyFloat_AS_DOUBLE(value)
                   : PyLong_CheckExact(value) ? PyLong_AsDouble(value) : PyFloat_AsDouble(value);
        if (v == -1.0 && PyErr_Occurred())
            return -1;
        ((CellObject *)cell)->at[i] += v;
        return 0;
    }
    if (!PyList_CheckExact(cell) || i >= PyList_GET_SIZE(cell)) {
        PyErr_SetString(PyExc_TypeError, "Counter: a cell is not a list of its family's length");
        return -1;
    }
    PyObject *sum = PyNumber_Add(PyList_GET_ITEM(cell, i), value);
    if (sum == NULL)
        return -1;
    PyObject *old = PyList_GET_ITEM(cell, i);
    PyList_SET_ITEM(cell, i, sum);
    Py_DECREF(old);
    return 0;
}

/* bisect_left(bounds, value): the first bound at or above it. */
static Py_ssize_t bucket(const Bounds *b, double value)
{
    Py_ssize_t lo = 0, hi = b->n;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (b->at[mid] < value)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* One observation in a histogram cell: its bucket and its sum. */
static int observe(const Bounds *b, PyObject *cell, PyObject *value)
{
    double v = PyFloat_AsDouble(value);
    if (v == -1.0 && PyErr_Occurred())
        return -1;
    if (add_at(cell, bucket(b, v), one) < 0)
        return -1;
    return add_at(cell, b->n, value);
}

static inline int nonempty(PyObject *v) { return v != NULL && v != Py_None && PyObject_IsTrue(v) == 1; }

/* plan.<slot> += 1 (the memo's lookups and hits). */
static int bump_slot(CounterObject *self, PyObject *c, int which)
{
    PyObject *old = SLOT(c, self->l[which]);
    PyObject *next = PyNumber_Add(old, one);
    if (next == NULL)
        return -1;
    SLOT(c, self->l[which]) = next;
    Py_DECREF(old);
    return 0;
}

static inline long long_of(PyObject *v) { return v != NULL && PyLong_Check(v) ? PyLong_AsLong(v) : -1; }

/* The first branch of Request.scan / Response.scan (kinspect/session/events.py): a small whole frame the
 * codec already scanned in C once goes straight to that C scan (Codec.fast_scans), the scan kept on the
 * event. New reference; NULL without an error set when that branch does not apply or its scan failed (the
 * event's scan() then scans, and says why a body is malformed); NULL with an error set for what an
 * `except Exception` would not catch. */
static PyObject *fast_scan(CounterObject *self, PyObject *e)
{
    int request = Py_IS_TYPE(e, self->classes[C_REQUEST]);
    if (!request && !Py_IS_TYPE(e, self->classes[C_RESPONSE]))
        return NULL;
    Py_ssize_t scanned_off = request ? self->q[Q_SCANNED] : self->p[P_SCANNED];
    PyObject *frame = SLOT(e, request ? self->q[Q_FRAME] : self->p[P_FRAME]);
    PyObject *codec = SLOT(e, request ? self->q[Q_CODEC] : self->p[P_CODEC]);
    if (SLOT(e, scanned_off) != Py_None || SLOT(e, request ? self->q[Q_COMPLETE] : self->p[P_COMPLETE]) != Py_True
        || frame == NULL || !PyBytes_CheckExact(frame) || codec == NULL)
        return NULL;
    PyObject *api_key, *version, *pos;
    if (request) {
        PyObject *header = SLOT(e, self->q[Q_HEADER]);
        if (header == NULL || !Py_IS_TYPE(header, self->classes[C_HEADER]))
            return NULL;
        api_key = SLOT(header, self->h[H_API_KEY]), version = SLOT(header, self->h[H_API_VERSION]);
        pos = SLOT(header, self->h[H_SIZE]);
    } else { /* Response._header_end: v0 ends after the correlation id, v1 whose tag section is empty after it */
        api_key = SLOT(e, self->p[P_API_KEY]), version = SLOT(e, self->p[P_API_VERSION]);
        long hv = long_of(SLOT(e, self->p[P_HEADER_VERSION])), size = long_of(SLOT(e, self->p[P_SIZE]));
        if (hv == 0 && size >= 4)
            pos = four;
        else if (long_of(SLOT(e, self->p[P_HEADER_SIZE])) == 5 && size > 4 && PyBytes_GET_SIZE(frame) > 4
                 && PyBytes_AS_STRING(frame)[4] == 0)
            pos = five;
        else
            return NULL;
    }
    if (api_key == NULL || version == NULL || pos == NULL)
        return NULL;
    PyObject *key = PyTuple_Pack(3, api_key, version, request ? Py_True : Py_False);
    PyObject *scans = key == NULL ? NULL : PyObject_GetAttr(codec, str_fast_scans);
    PyObject *entry = scans == NULL || !PyDict_CheckExact(scans) ? NULL : PyDict_GetItemWithError(scans, key);
    Py_XINCREF(entry);
    Py_XDECREF(scans);
    Py_XDECREF(key);
    PyObject *out = NULL;
    if (entry != NULL && PyTuple_CheckExact(entry) && PyTuple_GET_SIZE(entry) == 3) {
        PyObject *integers = PyObject_GetAttr(codec, str_integer_facts);
        int counting = integers == NULL ? -1 : PyObject_IsTrue(integers);
        Py_XDECREF(integers);
        if (counting >= 0) {
            /* the entry's stats argument: the counters' template, COUNT_LATER or None (Codec.fast_scans) */
            PyObject *args[5] = {frame, pos, counting ? PyTuple_GET_ITEM(entry, 1) : Py_None, PyTuple_GET_ITEM(entry, 2),
                                 request ? Py_True : Py_False};
            Py_INCREF(frame);
            out = PyObject_Vectorcall(PyTuple_GET_ITEM(entry, 0), args, 5, NULL);
            Py_DECREF(frame);
            if (out != NULL)
                set_slot(e, scanned_off, Py_NewRef(out));
        }
    }
    Py_XDECREF(entry);
    if (out == NULL && PyErr_Occurred() && PyErr_ExceptionMatches(PyExc_Exception))
        PyErr_Clear(); /* a failure: the event's own scan() says what it is */
    return out;
}

/* The event's scan(): new reference, Py_None for a malformed body (DecodeError), NULL on another error. */
static PyObject *scan_of(CounterObject *self, PyObject *e)
{
    PyObject *scan = fast_scan(self, e);
    if (scan != NULL || PyErr_Occurred())
        return scan;
    scan = PyObject_CallMethodNoArgs(e, str_scan);
    if (scan == NULL && PyErr_ExceptionMatches(self->decode_error)) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    return scan;
}

/* MetricsObserver._scan: the event's scan, a small body seen before not scanned again. New reference, or
 * Py_None for a malformed body; NULL with an error set on failure. The frame is bytes when the plan memoizes
 * (the handlers give other frames to the reference). */
static PyObject *memo_scan(CounterObject *self, PyObject *c, PyObject *e, PyObject *frame, Py_ssize_t body_start,
                           Py_ssize_t scanned_off)
{
    PyObject *memo = SLOT(c, self->l[L_MEMO]);
    if (memo == Py_None || !PyBytes_CheckExact(frame) || PyBytes_GET_SIZE(frame) - body_start > self->memo_body_bytes)
        return scan_of(self, e); /* not bytes: a body too large for the memo (memo_needs_bytes) */
    Py_ssize_t size = PyBytes_GET_SIZE(frame), from = body_start < size ? body_start : size;
    const char *start = PyBytes_AS_STRING(frame) + from;
    PyObject *body = NULL, *outcome = NULL;
    /* The memo's last entry, compared before a key is made: what the lookup would find (memo_last is always in
     * memo). */
    PyObject *last = SLOT(c, self->l[L_MEMO_LAST]);
    if (last != NULL && PyTuple_CheckExact(last) && PyTuple_GET_SIZE(last) == 2) {
        PyObject *known = PyTuple_GET_ITEM(last, 0);
        if (PyBytes_CheckExact(known) && PyBytes_GET_SIZE(known) == size - from
            && memcmp(PyBytes_AS_STRING(known), start, size - from) == 0)
            outcome = Py_NewRef(PyTuple_GET_ITEM(last, 1));
    }
    if (outcome == NULL) {
        body = PyBytes_FromStringAndSize(start, size - from);
        if (body == NULL)
            return NULL;
        outcome = PyDict_GetItemWithError(memo, body); /* borrowed */
        if (outcome == NULL && PyErr_Occurred())
            goto fail;
        Py_XINCREF(outcome);
    }
    if (bump_slot(self, c, L_LOOKUPS) < 0)
        goto fail;
    if (outcome != NULL && outcome != Py_False) {
        /* The same bytes scan the same: the event takes the remembered scan (Request/Response.adopt_scan),
         * so that the other observers that ask for it do not scan the body again either. */
        set_slot(e, scanned_off, Py_NewRef(outcome));
        if (bump_slot(self, c, L_HITS) < 0)
            goto fail;
    } else if (outcome == NULL) {
        outcome = scan_of(self, e);
        if (outcome == NULL)
            goto fail;
        if (outcome == Py_None) {
            Py_DECREF(outcome);
            outcome = Py_NewRef(Py_False);
        }
        if (PyDict_GET_SIZE(memo) >= self->memo_entries) {
            PyDict_Clear(memo);
            set_slot(c, self->l[L_MEMO_LAST], Py_NewRef(Py_None));
        }
        if (PyDict_SetItem(memo, body, outcome) < 0)
            goto fail;
    } else if (bump_slot(self, c, L_HITS) < 0) {
        goto fail;
    }
    if (body != NULL) { /* looked up or added: the memo's last entry now */
        PyObject *entry = PyTuple_Pack(2, body, outcome);
        if (entry == NULL)
            goto fail;
        set_slot(c, self->l[L_MEMO_LAST], entry);
    }
    Py_CLEAR(body);
    Py_ssize_t lookups = PyLong_AsSsize_t(SLOT(c, self->l[L_LOOKUPS]));
    if (lookups >= self->memo_trial) {
        if (2 * PyLong_AsSsize_t(SLOT(c, self->l[L_HITS])) < lookups)
            set_slot(c, self->l[L_MEMO], Py_NewRef(Py_None)); /* these bodies do not repeat: hashing them is wasted */
        PyObject *zero = PyLong_FromLong(0);
        if (zero == NULL)
            goto fail;
        set_slot(c, self->l[L_LOOKUPS], Py_NewRef(zero));
        set_slot(c, self->l[L_HITS], zero);
    }
    if (outcome == Py_False) {
        Py_DECREF(outcome);
        Py_RETURN_NONE;
    }
    return outcome;
fail:
    Py_XDECREF(body);
    Py_XDECREF(outcome);
    return NULL;
}

static PyObject *call_helper(CounterObject *self, int which, PyObject *a, PyObject *b, PyObject *c)
{
    PyObject *args[3] = {a, b, c};
    int n = c != NULL ? 3 : b != NULL ? 2 : 1;
    return PyObject_Vectorcall(self->helper[which], args, n, NULL);
}

#define HELPER(which, a, b, c)                                                                                         \
    do {                                                                                                               \
        PyObject *r_ = call_helper(self, which, a, b, c);                                                              \
        if (r_ == NULL)                                                                                                \
            goto fail;                                                                                                 \
        Py_DECREF(r_);                                                                                                 \
    } while (0)

/* One tagged field counted in its (count, bytes) cells: the reference's `cells[0][0] += 1` and
 * `if size: cells[1][0] += size`. */
static int add_tagged(PyObject *cells, PyObject *size)
{
    int some = PyObject_IsTrue(size);
    if (some < 0 || add_at(PyTuple_GET_ITEM(cells, 0), 0, one) < 0
        || (some && add_at(PyTuple_GET_ITEM(cells, 1), 0, size) < 0))
        return -1;
    return 0;
}

/* MetricsObserver._body_tagged_fields(c, direction, fields): each (path, tag, name, size) field's count and
 * bytes cells, when the plan knows them (c.tagged); a field it does not know yet goes to the reference alone
 * (as a list of that one field), which makes its cells and may remember them. -1 on failure. */
static int count_tagged(CounterObject *self, PyObject *c, PyObject *direction, PyObject *fields)
{
    PyObject *known = SLOT(c, self->l[L_TAGGED]);
    if (known == NULL || !PyDict_CheckExact(known) || !PyList_CheckExact(fields)) {
        PyObject *r = call_helper(self, K_TAGGED, c, direction, fields);
        Py_XDECREF(r);
        return r == NULL ? -1 : 0;
    }
    Py_ssize_t n = PyList_GET_SIZE(fields);
    /* The same list as the last scan's (a memoized body met again): its fields' cells, as found then. */
    PyObject *last = SLOT(c, self->l[L_TAGGED_LAST]);
    if (last != NULL && PyTuple_CheckExact(last) && PyTuple_GET_SIZE(last) == 2 && PyTuple_GET_ITEM(last, 0) == fields
        && PyTuple_GET_SIZE(PyTuple_GET_ITEM(last, 1)) == n) {
        int rc = 0;
        Py_INCREF(last);
        PyObject *found = PyTuple_GET_ITEM(last, 1);
        for (Py_ssize_t i = 0; rc == 0 && i < n; i++)
            rc = add_tagged(PyTuple_GET_ITEM(found, i), PyTuple_GET_ITEM(PyList_GET_ITEM(fields, i), 3));
        Py_DECREF(last);
        return rc;
    }
    int rc = 0;
    PyObject *found = PyTuple_New(n); /* each field's cells; NULL'd if one was not known yet */
    if (found == NULL)
        return -1;
    Py_INCREF(fields);
    Py_INCREF(known);
    for (Py_ssize_t i = 0; rc == 0 && i < n; i++) {
        PyObject *field = PyList_GET_ITEM(fields, i), *cells = NULL;
        if (PyTuple_CheckExact(field) && PyTuple_GET_SIZE(field) == 4) {
            PyObject *key = PyTuple_GetSlice(field, 0, 3); /* (path, tag, name) */
            if (key == NULL) {
                rc = -1;
                break;
            }
            cells = PyDict_GetItemWithError(known, key); /* borrowed */
            Py_DECREF(key);
            if (cells == NULL && PyErr_Occurred()) {
                rc = -1;
                break;
            }
        }
        if (cells != NULL && PyTuple_Check(cells) && PyTuple_GET_SIZE(cells) >= 2) {
            Py_INCREF(cells);
            rc = add_tagged(cells, PyTuple_GET_ITEM(field, 3));
            if (found != NULL)
                PyTuple_SET_ITEM(found, i, cells); /* steals */
            else
                Py_DECREF(cells);
        } else { /* not known yet (or not a field as the scan makes them): the reference's */
            Py_CLEAR(found);
            PyObject *one_field = PyList_New(1);
            if (one_field == NULL) {
                rc = -1;
                break;
            }
            PyList_SET_ITEM(one_field, 0, Py_NewRef(field));
            PyObject *r = call_helper(self, K_TAGGED, c, direction, one_field);
            Py_DECREF(one_field);
            if (r == NULL)
                rc = -1;
            Py_XDECREF(r);
        }
    }
    if (rc == 0 && found != NULL && n > 0) { /* every field known: remembered for this list */
        PyObject *memo = PyTuple_Pack(2, fields, found);
        if (memo == NULL)
            rc = -1;
        else
            set_slot(c, self->l[L_TAGGED_LAST], memo);
    }
    Py_XDECREF(found);
    Py_DECREF(known);
    Py_DECREF(fields);
    return rc;
}

/* What both directions count after their header: the body's scan and the facts it holds. scan: set to the
 * scan (new reference) or left NULL for none. Returns -1 on failure. */
static int count_body(CounterObject *self, PyObject *c, PyObject *e, PyObject *direction, PyObject *frame,
                      Py_ssize_t body_start, Py_ssize_t complete_off, Py_ssize_t scanned_off, PyObject **tag_bytes,
                      PyObject **scan_out)
{
    PyObject *scan = NULL;
    *scan_out = NULL;
    if (PyObject_IsTrue(SLOT(c, self->l[L_SCAN])) == 1 && SLOT(e, complete_off) == Py_True) {
        scan = memo_scan(self, c, e, frame, body_start, scanned_off);
        if (scan == NULL)
            return -1;
        if (scan == Py_None) {
            Py_CLEAR(scan);
            HELPER(K_DECODE_FAILURE, SLOT(c, self->l[L_API]), direction, str_decode_error);
        } else {
            if (!Py_IS_TYPE(scan, self->classes[C_SCAN]) || SLOT(scan, self->s[S_TAG_BYTES]) == NULL) {
                PyErr_SetString(PyExc_TypeError, "Counter: a scan is not a ScanResult");
                goto fail;
            }
            PyObject *sum = PyNumber_Add(*tag_bytes, SLOT(scan, self->s[S_TAG_BYTES]));
            if (sum == NULL)
                goto fail;
            Py_SETREF(*tag_bytes, sum);
            PyObject *fields = SLOT(scan, self->s[S_TAGGED]);
            if (nonempty(fields) && count_tagged(self, c, direction, fields) < 0)
                goto fail;
        }
    }
    int any = PyObject_IsTrue(*tag_bytes);
    if (any < 0 || (any && add_at(SLOT(c, self->l[L_TAG_BYTES]), 0, *tag_bytes) < 0))
        goto fail;
    *scan_out = scan;
    return 0;
fail:
    Py_XDECREF(scan);
    return -1;
}

static PyObject *fallback(CounterObject *self, int which, PyObject *e)
{
    return PyObject_CallOneArg(self->fallback[which], e);
}

/* Whether the plan would look its body up in its memo, which keys bytes: other frames go to the reference. A
 * frame in pieces (a large Produce or Fetch) has a body too large for the memo, and is scanned where it lies. */
static inline int memo_needs_bytes(CounterObject *self, PyObject *c, PyObject *frame, PyObject *complete,
                                   PyObject *size, Py_ssize_t body_start)
{
    return PyObject_IsTrue(SLOT(c, self->l[L_SCAN])) == 1 && complete == Py_True && SLOT(c, self->l[L_MEMO]) != Py_None
           && !PyBytes_CheckExact(frame)
           && !(PyLong_CheckExact(size) && PyLong_AsSsize_t(size) - body_start > self->memo_body_bytes);
}

static PyObject *topic_bytes_on(CounterObject *self)
{
    PyObject *on = PyObject_GetAttr(self->observer, str_topic_bytes);
    if (on == NULL)
        return NULL;
    int yes = PyObject_IsTrue(on);
    Py_DECREF(on);
    if (yes < 0)
        return NULL;
    return yes ? Py_True : Py_False;
}

/* Empties one direction's memo of plans (see plan_of). */
static void forget_plans(CounterObject *self, int direction)
{
    for (int i = 0; i < PLAN_KEYS; i++)
        Py_CLEAR(self->plan_memo[direction][i]);
}

/* The plan of (api key, version) in one direction's plans (borrowed); NULL without an error set when it
 * has none yet (the reference makes it) or is not a _Plan, NULL with one on failure. The plan last found
 * for an api key is remembered with its version: the lookup built a tuple, hashed it and compared it with
 * the dict's key, some 500 instructions an event. The reference only ever adds plans
 * (MetricsObserver._plan), so the memo holds while the dict's size does; a new plan empties it. */
static PyObject *plan_of(CounterObject *self, int direction, PyObject *plans, PyObject *api_key, PyObject *version)
{
    long key = PyLong_CheckExact(api_key) ? PyLong_AsLong(api_key) : -1;
    long v = PyLong_CheckExact(version) ? PyLong_AsLong(version) : -1;
    if ((key == -1 || v == -1) && PyErr_Occurred())
        PyErr_Clear(); /* too large to remember: looked up */
    int memo = key >= 0 && key < PLAN_KEYS && v >= 0 && PyDict_CheckExact(plans);
    if (memo) {
        if (PyDict_GET_SIZE(plans) != self->plan_memo_size[direction]) {
            forget_plans(self, direction);
            self->plan_memo_size[direction] = PyDict_GET_SIZE(plans);
        } else if (self->plan_memo[direction][key] != NULL && self->plan_memo_version[direction][key] == v) {
            return self->plan_memo[direction][key];
        }
    }
    PyObject *pair = PyTuple_Pack(2, api_key, version);
    if (pair == NULL)
        return NULL;
    PyObject *c = PyDict_GetItemWithError(plans, pair); /* borrowed */
    Py_DECREF(pair);
    if (c == NULL || !Py_IS_TYPE(c, self->classes[C_PLAN]))
        return NULL;
    if (memo) {
        Py_XSETREF(self->plan_memo[direction][key], Py_NewRef(c));
        self->plan_memo_version[direction][key] = v;
    }
    return c;
}

/* The frame's bytes shared among the topics its scan names, when metrics.topic_bytes is on. */
static int count_topics(CounterObject *self, PyObject *scan, PyObject *size, PyObject *direction)
{
    PyObject *topics = SLOT(scan, self->s[S_TOPICS]);
    if (!nonempty(topics))
        return 0;
    PyObject *on = topic_bytes_on(self);
    if (on == NULL)
        return -1;
    if (on == Py_False)
        return 0;
    PyObject *r = call_helper(self, K_TOPICS, topics, size, direction);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* MetricsObserver._produced_records(scan.records), when the scan's records are all summarized and every
 * batch's compression has its cells: 1 when counted, 0 to leave it to the reference (nothing changed), -1 on
 * failure. Why here: it is most of what a small Produce costs the metrics beyond any other request (measured
 * in-process, cold, about a microsecond and a half as a Python call and its property reads). */
static int count_produced(CounterObject *self, PyObject *scan)
{
    PyObject *summaries = SLOT(scan, self->s[S_SUMMARIES]), *spans = SLOT(scan, self->s[S_SPANS]);
    if (summaries == NULL || spans == NULL || !PyList_CheckExact(summaries) || !PyList_CheckExact(spans)
        || PyList_GET_SIZE(summaries) != PyList_GET_SIZE(spans))
        return 0; /* not summarized yet: `records` summarizes them */
    Py_ssize_t n = PyList_GET_SIZE(summaries);
    for (int pass = 0; pass < 2; pass++) { /* the first only checks, so that nothing is counted twice */
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *summary = PyList_GET_ITEM(summaries, i);
            if (summary == Py_None)
                continue;
            if (!PyTuple_Check(summary) || PyTuple_GET_SIZE(summary) < 1 || !PyTuple_Check(PyTuple_GET_ITEM(summary, 0)))
                return 0;
            PyObject *batches = PyTuple_GET_ITEM(summary, 0);
            for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(batches); j++) {
                PyObject *batch = PyTuple_GET_ITEM(batches, j);
                if (!PyTuple_Check(batch) || PyTuple_GET_SIZE(batch) <= BATCH_COMPRESSION)
                    return 0;
                PyObject *cells = PyDict_GetItemWithError(self->produced, PyTuple_GET_ITEM(batch, BATCH_COMPRESSION));
                if (cells == NULL)
                    return PyErr_Occurred() ? -1 : 0;
                if (!PyTuple_CheckExact(cells) || PyTuple_GET_SIZE(cells) != 2)
                    return 0;
                if (pass == 0)
                    continue;
                PyObject *count = PyTuple_GET_ITEM(batch, BATCH_RECORD_COUNT);
                int positive = PyObject_RichCompareBool(count, zero, Py_GT);
                if (positive < 0 || (positive && add_at(PyTuple_GET_ITEM(cells, 0), 0, count) < 0)
                    || add_at(PyTuple_GET_ITEM(cells, 1), 0, one) < 0)
                    return -1;
            }
        }
    }
    return 1;
}

/* MetricsObserver._request */
static PyObject *counter_request(CounterObject *self, PyObject *e)
{
    if (!Py_IS_TYPE(e, self->classes[C_REQUEST]))
        return fallback(self, F_REQUEST, e);
    PyObject *header = SLOT(e, self->q[Q_HEADER]);
    if (header == NULL || !Py_IS_TYPE(header, self->classes[C_HEADER]))
        return fallback(self, F_REQUEST, e);
    PyObject *api_key = SLOT(header, self->h[H_API_KEY]);
    PyObject *c = plan_of(self, 0, self->req_plans, api_key, SLOT(header, self->h[H_API_VERSION]));
    if (c == NULL)
        return PyErr_Occurred() ? NULL : fallback(self, F_REQUEST, e); /* the reference makes the plan */
    int known = PyObject_IsTrue(SLOT(c, self->l[L_KNOWN])) == 1;
    long hv = long_of(SLOT(header, self->h[H_VERSION]));
    PyObject *frame = SLOT(e, self->q[Q_FRAME]);
    PyObject *size = SLOT(e, self->q[Q_SIZE]), *header_size = SLOT(header, self->h[H_SIZE]);
    Py_ssize_t body_start = PyLong_AsSsize_t(header_size);
    if (body_start == -1 && PyErr_Occurred())
        return NULL;
    if ((known && hv >= 2 && long_of(SLOT(e, self->q[Q_TAG_BYTES])) > 1)
        || (known && memo_needs_bytes(self, c, frame, SLOT(e, self->q[Q_COMPLETE]), size, body_start)))
        return fallback(self, F_REQUEST, e); /* header tagged fields; a small body that is not bytes */
    PyObject *tag_bytes = NULL, *scan = NULL;
    if (add_at(SLOT(c, self->l[L_COUNT_CELL]), 0, one) < 0
        || observe(&self->bounds[B_SIZE], SLOT(c, self->l[L_SIZE]), size) < 0
        || observe(&self->bounds[B_HEADER], SLOT(c, self->l[L_HEADER]), header_size) < 0)
        return NULL;
    if (!known)
        Py_RETURN_NONE; /* an unknown_api Problem comes with it */
    tag_bytes = hv >= 2 ? Py_NewRef(SLOT(e, self->q[Q_TAG_BYTES])) : PyLong_FromLong(0);
    if (tag_bytes == NULL
        || count_body(self, c, e, str_request, frame, body_start, self->q[Q_COMPLETE], self->q[Q_SCANNED], &tag_bytes,
                      &scan) < 0)
        goto fail;
    Py_CLEAR(tag_bytes);
    if (scan == NULL)
        Py_RETURN_NONE;
    if (long_of(api_key) == PRODUCE && nonempty(SLOT(scan, self->s[S_SPANS]))) {
        int counted = count_produced(self, scan);
        if (counted < 0)
            goto fail;
        if (!counted) { /* the reference counts them (and makes the cells of a compression new to it) */
            PyObject *records = PyObject_GetAttr(scan, str_records);
            if (records == NULL)
                goto fail;
            PyObject *r = call_helper(self, K_PRODUCED, records, NULL, NULL);
            Py_DECREF(records);
            if (r == NULL)
                goto fail;
            Py_DECREF(r);
        }
    }
    if (count_topics(self, scan, size, str_request) < 0)
        goto fail;
    Py_DECREF(scan);
    Py_RETURN_NONE;
fail:
    Py_XDECREF(tag_bytes);
    Py_XDECREF(scan);
    return NULL;
}

/* MetricsObserver._response */
static PyObject *counter_response(CounterObject *self, PyObject *e)
{
    if (!Py_IS_TYPE(e, self->classes[C_RESPONSE]))
        return fallback(self, F_RESPONSE, e);
    PyObject *c = plan_of(self, 1, self->resp_plans, SLOT(e, self->p[P_API_KEY]), SLOT(e, self->p[P_API_VERSION]));
    if (c == NULL)
        return PyErr_Occurred() ? NULL : fallback(self, F_RESPONSE, e);
    long hv = long_of(SLOT(e, self->p[P_HEADER_VERSION]));
    PyObject *frame = SLOT(e, self->p[P_FRAME]);
    if ((hv >= 1 && long_of(SLOT(e, self->p[P_TAG_BYTES])) > 1)
        || memo_needs_bytes(self, c, frame, SLOT(e, self->p[P_COMPLETE]), SLOT(e, self->p[P_SIZE]), 4))
        return fallback(self, F_RESPONSE, e);
    PyObject *size = SLOT(e, self->p[P_SIZE]), *tag_bytes = NULL, *scan = NULL;
    PyObject *cell = SLOT(c, self->l[L_HEADER]);
    if (add_at(SLOT(c, self->l[L_COUNT_CELL]), 0, one) < 0
        || observe(&self->bounds[B_SIZE], SLOT(c, self->l[L_SIZE]), size) < 0)
        return NULL;
    if (hv >= 1) {
        if (observe(&self->bounds[B_HEADER], cell, SLOT(e, self->p[P_HEADER_SIZE])) < 0)
            return NULL;
        tag_bytes = Py_NewRef(SLOT(e, self->p[P_TAG_BYTES]));
    } else {
        if (add_at(cell, self->header_v0_bucket, one) < 0 || add_at(cell, self->bounds[B_HEADER].n, four) < 0)
            return NULL;
        tag_bytes = PyLong_FromLong(0);
        if (tag_bytes == NULL)
            return NULL;
    }
    /* The memo's key is all after the correlation id, the header's tag section included. */
    if (count_body(self, c, e, str_response, frame, 4, self->p[P_COMPLETE], self->p[P_SCANNED], &tag_bytes, &scan) < 0)
        goto fail;
    Py_CLEAR(tag_bytes);
    if (scan == NULL)
        Py_RETURN_NONE;
    PyObject *codes = SLOT(scan, self->s[S_ERRORS]);
    if (nonempty(codes))
        HELPER(K_ERRORS, c, codes, NULL);
    if (count_topics(self, scan, size, str_response) < 0)
        goto fail;
    Py_DECREF(scan);
    Py_RETURN_NONE;
fail:
    Py_XDECREF(tag_bytes);
    Py_XDECREF(scan);
    return NULL;
}

/* MetricsObserver._exchange */
static PyObject *counter_exchange(CounterObject *self, PyObject *e)
{
    if (!Py_IS_TYPE(e, self->classes[C_EXCHANGE]))
        return fallback(self, F_EXCHANGE, e);
    PyObject *latency = SLOT(e, self->x[X_LATENCY]), *request = SLOT(e, self->x[X_REQUEST]);
    if (SLOT(e, self->x[X_RESPONSE]) == Py_None || latency == Py_None)
        Py_RETURN_NONE;
    if (latency == NULL || request == NULL || !Py_IS_TYPE(request, self->classes[C_REQUEST]))
        return fallback(self, F_EXCHANGE, e);
    PyObject *api = SLOT(request, self->q[Q_API_NAME]);
    int named = api != NULL && PyObject_IsTrue(api) == 1;
    PyObject *cell = PyDict_GetItemWithError(self->latency_cells, named ? api : str_unknown); /* borrowed */
    if (cell == NULL) {
        if (PyErr_Occurred())
            return NULL;
        return fallback(self, F_EXCHANGE, e); /* the reference makes the cell */
    }
    if (observe(&self->bounds[B_LATENCY], cell, latency) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static int read_bounds(PyObject *tuple, Bounds *out)
{
    if (!PyTuple_Check(tuple) || PyTuple_GET_SIZE(tuple) == 0) {
        PyErr_SetString(PyExc_TypeError, "Counter: bounds must be a tuple of floats");
        return -1;
    }
    out->n = PyTuple_GET_SIZE(tuple);
    out->at = PyMem_Malloc(sizeof(double) * out->n);
    if (out->at == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < out->n; i++) {
        out->at[i] = PyFloat_AsDouble(PyTuple_GET_ITEM(tuple, i));
        if (out->at[i] == -1.0 && PyErr_Occurred())
            return -1;
        if (i > 0 && out->at[i] < out->at[i - 1]) {
            PyErr_SetString(PyExc_ValueError, "Counter: bounds not in order");
            return -1;
        }
    }
    if (!Py_IS_INFINITY(out->at[out->n - 1])) {
        PyErr_SetString(PyExc_ValueError, "Counter: the last bound must be +Inf");
        return -1;
    }
    return 0;
}

static int counter_traverse(CounterObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->observer);
    Py_VISIT(self->req_plans);
    Py_VISIT(self->resp_plans);
    Py_VISIT(self->latency_cells);
    Py_VISIT(self->produced);
    Py_VISIT(self->decode_error);
    for (int i = 0; i < F_COUNT; i++)
        Py_VISIT(self->fallback[i]);
    for (int i = 0; i < K_COUNT; i++)
        Py_VISIT(self->helper[i]);
    for (int i = 0; i < C_COUNT; i++)
        Py_VISIT(self->classes[i]);
    for (int d = 0; d < 2; d++)
        for (int i = 0; i < PLAN_KEYS; i++)
            Py_VISIT(self->plan_memo[d][i]);
    return 0;
}

static int counter_clear(CounterObject *self)
{
    forget_plans(self, 0);
    forget_plans(self, 1);
    Py_CLEAR(self->observer);
    Py_CLEAR(self->req_plans);
    Py_CLEAR(self->resp_plans);
    Py_CLEAR(self->latency_cells);
    Py_CLEAR(self->produced);
    Py_CLEAR(self->decode_error);
    for (int i = 0; i < F_COUNT; i++)
        Py_CLEAR(self->fallback[i]);
    for (int i = 0; i < K_COUNT; i++)
        Py_CLEAR(self->helper[i]);
    for (int i = 0; i < C_COUNT; i++)
        Py_CLEAR(self->classes[i]);
    return 0;
}

static void counter_dealloc(CounterObject *self)
{
    PyObject_GC_UnTrack(self);
    counter_clear(self);
    for (int i = 0; i < B_COUNT; i++)
        PyMem_Free(self->bounds[i].at);
    PyObject_GC_Del(self);
}

static PyObject *attr_dict(PyObject *obj, const char *name)
{
    PyObject *v = PyObject_GetAttrString(obj, name);
    if (v != NULL && !PyDict_Check(v)) {
        PyErr_Format(PyExc_TypeError, "Counter: the observer's %s is not a dict", name);
        Py_CLEAR(v);
    }
    return v;
}

static PyTypeObject CounterType;

static PyObject *counter_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *observer, *classes, *bounds, *memo, *fallbacks, *helpers, *decode_error;
    if (kwargs != NULL && PyDict_GET_SIZE(kwargs)) {
        PyErr_SetString(PyExc_TypeError, "Counter takes positional arguments only");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "OO!O!O!O!O!O:Counter", &observer, &PyTuple_Type, &classes, &PyTuple_Type, &bounds,
                          &PyTuple_Type, &memo, &PyTuple_Type, &fallbacks, &PyTuple_Type, &helpers, &decode_error))
        return NULL;
    if (PyTuple_GET_SIZE(classes) != C_COUNT || PyTuple_GET_SIZE(bounds) != 4 || PyTuple_GET_SIZE(memo) != 3
        || PyTuple_GET_SIZE(fallbacks) != F_COUNT || PyTuple_GET_SIZE(helpers) != K_COUNT
        || !PyExceptionClass_Check(decode_error)) {
        PyErr_SetString(PyExc_TypeError, "Counter(observer, 6 classes, 4 bounds, 3 memo sizes, 3 fallbacks, 5 helpers, "
                                         "DecodeError)");
        return NULL;
    }
    for (int i = 0; i < C_COUNT; i++) {
        if (!PyType_Check(PyTuple_GET_ITEM(classes, i))) {
            PyErr_SetString(PyExc_TypeError, "Counter: classes must be classes");
            return NULL;
        }
    }
    CounterObject *self = PyObject_GC_New(CounterObject, type);
    if (self == NULL)
        return NULL;
    self->observer = Py_NewRef(observer);
    self->req_plans = self->resp_plans = self->latency_cells = self->produced = NULL;
    self->decode_error = Py_NewRef(decode_error);
    for (int i = 0; i < C_COUNT; i++)
        self->classes[i] = (PyTypeObject *)Py_NewRef(PyTuple_GET_ITEM(classes, i));
    for (int i = 0; i < F_COUNT; i++)
        self->fallback[i] = Py_NewRef(PyTuple_GET_ITEM(fallbacks, i));
    for (int i = 0; i < K_COUNT; i++)
        self->helper[i] = Py_NewRef(PyTuple_GET_ITEM(helpers, i));
    for (int i = 0; i < B_COUNT; i++)
        self->bounds[i].at = NULL;
    memset(self->plan_memo, 0, sizeof(self->plan_memo)); /* PyObject_GC_New leaves the memory as it was */
    self->plan_memo_size[0] = self->plan_memo_size[1] = 0;
    PyObject_GC_Track(self);
    self->req_plans = attr_dict(observer, "_req");
    self->resp_plans = self->req_plans ? attr_dict(observer, "_resp") : NULL;
    self->latency_cells = self->resp_plans ? attr_dict(observer, "_latency") : NULL;
    self->produced = self->latency_cells ? attr_dict(observer, "_produced") : NULL;
    if (self->produced == NULL)
        goto fail;
    for (int i = 0; i < B_COUNT; i++) {
        if (read_bounds(PyTuple_GET_ITEM(bounds, i), &self->bounds[i]) < 0)
            goto fail;
    }
    self->header_v0_bucket = PyLong_AsSsize_t(PyTuple_GET_ITEM(bounds, 3));
    self->memo_body_bytes = PyLong_AsSsize_t(PyTuple_GET_ITEM(memo, 0));
    self->memo_entries = PyLong_AsSsize_t(PyTuple_GET_ITEM(memo, 1));
    self->memo_trial = PyLong_AsSsize_t(PyTuple_GET_ITEM(memo, 2));
    if (PyErr_Occurred())
        goto fail;
    if (self->header_v0_bucket < 0 || self->header_v0_bucket >= self->bounds[B_HEADER].n) {
        PyErr_SetString(PyExc_ValueError, "Counter: the header v0 bucket is not a bucket");
        goto fail;
    }
    if (find_offsets(self->classes[C_REQUEST], Q_NAMES, Q_COUNT, self->q) < 0
        || find_offsets(self->classes[C_RESPONSE], P_NAMES, P_COUNT, self->p) < 0
        || find_offsets(self->classes[C_EXCHANGE], X_NAMES, X_COUNT, self->x) < 0
        || find_offsets(self->classes[C_HEADER], H_NAMES, H_COUNT, self->h) < 0
        || find_offsets(self->classes[C_PLAN], L_NAMES, L_COUNT, self->l) < 0
        || find_offsets(self->classes[C_SCAN], S_NAMES, S_COUNT, self->s) < 0)
        goto fail;
    return (PyObject *)self;
fail:
    Py_DECREF(self);
    return NULL;
}

static PyMethodDef counter_methods[] = {
    {"request", (PyCFunction)counter_request, METH_O, "MetricsObserver._request, in C where it can."},
    {"response", (PyCFunction)counter_response, METH_O, "MetricsObserver._response, in C where it can."},
    {"exchange", (PyCFunction)counter_exchange, METH_O, "MetricsObserver._exchange, in C where it can."},
    {NULL}};

static PyTypeObject CounterType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kinspect.observers._counting.Counter",
    .tp_basicsize = sizeof(CounterObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The metrics observer's counting of requests, responses and exchanges.",
    .tp_new = counter_new,
    .tp_dealloc = (destructor)counter_dealloc,
    .tp_traverse = (traverseproc)counter_traverse,
    .tp_clear = (inquiry)counter_clear,
    .tp_methods = counter_methods,
};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "kinspect.observers._counting",
                                        "The metrics observer's counting in C (observers.metrics is the reference).",
                                        -1, NULL};

static int intern(PyObject **out, const char *text)
{
    *out = PyUnicode_InternFromString(text);
    return *out == NULL ? -1 : 0;
}

PyMODINIT_FUNC PyInit__counting(void)
{
    if (PyType_Ready(&CounterType) < 0 || PyType_Ready(&CellType) < 0)
        return NULL;
    if (intern(&str_request, "request") || intern(&str_response, "response")
        || intern(&str_decode_error, "decode_error") || intern(&str_topic_bytes, "topic_bytes")
        || intern(&str_records, "records") || intern(&str_scan, "scan") || intern(&str_unknown, "unknown")
        || intern(&str_fast_scans, "fast_scans") || intern(&str_integer_facts, "integer_facts"))
        return NULL;
    zero = PyLong_FromLong(0);
    one = PyLong_FromLong(1);
    four = PyLong_FromLong(4);
    five = PyLong_FromLong(5);
    if (zero == NULL || one == NULL || four == NULL || five == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Counter", (PyObject *)&CounterType) < 0
        || PyModule_AddObjectRef(m, "Cell", (PyObject *)&CellType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
