/* The capture's EXCHANGE tuple of an Exchange event, built in C (kinspect.capture.facts is the reference),
 * and the capture queue's front that queues it (QueueFront, below; kinspect.capture.queue_front is its reference).
 *
 * Why C: the capture observer takes one exchange's facts on the event loop for every exchange, and
 * in Python that is some 40 attribute reads, two calls and a 29-field tuple (about 1.1 us beside
 * the scans' own SCAN tuples). Here each attribute is one load at its slot's offset: the events,
 * their header and connection are slotted dataclasses, whose member descriptors give the offsets.
 *
 * Taker(classes, capture_side, batch_fields, base_bytes, topic_bytes, fallback) -> taker
 *   classes: (Exchange, Request, Response, RequestHeader, ConnectionInfo, ScanResult);
 *   capture_side: _wire.capture_side (the SCAN tuple of a ScanResult); batch_fields: its 4 indices;
 *   base_bytes, topic_bytes: capture.facts.BASE_BYTES and TOPIC_BYTES;
 *   fallback: FactsTaker.take_python, called for whatever this does not take itself.
 * taker(exchange) -> (EXCHANGE, bytes it holds), as FactsTaker.take_python returns it.
 *
 * Taken here: events of exactly those classes whose complete frames scanned (the scan cached on
 * the event, or made now by the event's scan()). Everything else (a frame larger than the
 * inspection limit, a decode error, an unknown api, a subclass) goes to the fallback, which says
 * why a side has no facts. Like the reference, the SCAN of the latest scan per (api key,
 * direction) is kept: the metrics hand the same scan to every event whose body repeats.
 *
 * share_alike_sides and held_total: what the writer thread does to each row of a batch it takes
 * (capture.facts.share_alike_sides_python and held_bytes are their references). In Python they were
 * most of the thread's time on a producer's requests: a loop and a 29-field tuple rebuilt per row. Since the
 * taker shares a side alike its api's previous SCAN, what the thread still shares is sides alike across apis. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include "../slot_offsets.h"

enum { C_EXCHANGE, C_REQUEST, C_RESPONSE, C_HEADER, C_CONNECTION, C_SCAN, C_COUNT };

enum { X_REQUEST, X_RESPONSE, X_LATENCY, X_COUNT };
static const char *const X_NAMES[X_COUNT] = {"request", "response", "latency"};

enum { Q_CONNECTION, Q_TIME, Q_HEADER, Q_API_NAME, Q_TAG_BYTES, Q_TAGS, Q_SIZE, Q_COMPLETE, Q_SCANNED, Q_COUNT };
static const char *const Q_NAMES[Q_COUNT] = {"connection", "time", "header", "api_name", "header_tag_bytes",
                                             "header_tags", "size", "complete", "_scanned"};

enum { P_TIME, P_VERSION, P_HEADER_VERSION, P_SIZE, P_HEADER_SIZE, P_COMPLETE, P_TAG_BYTES, P_TAGS, P_SCANNED,
       P_COUNT };
static const char *const P_NAMES[P_COUNT] = {"time", "api_version", "header_version", "size", "header_size",
                                             "complete", "header_tag_bytes", "header_tags", "_scanned"};

enum { H_API_KEY, H_API_VERSION, H_CORRELATION, H_CLIENT_ID, H_VERSION, H_SIZE, H_COUNT };
static const char *const H_NAMES[H_COUNT] = {"api_key", "api_version", "correlation_id", "client_id", "version",
                                             "size"};

enum { N_ID, N_CLIENT, N_BROKER, N_NODE, N_SOFTWARE, N_SOFTWARE_VERSION, N_COUNT };
static const char *const N_NAMES[N_COUNT] = {"id", "client_address", "broker", "node_id", "client_software_name",
                                             "client_software_version"};

#define MEMO_KEYS 256 /* api keys below this keep their latest SCAN per direction */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall; /* taker_vectorcall: a call costs no argument tuple */
    PyTypeObject *classes[C_COUNT];
    Py_ssize_t x[X_COUNT], q[Q_COUNT], p[P_COUNT], h[H_COUNT], n[N_COUNT];
    PyObject *capture_side, *batch_fields, *fallback, *scan_name;
    PyObject *choose_counting; /* FactsTaker.choose_counting(api key, version, is request, now) */
    Py_ssize_t base_bytes, topic_bytes;
    /* The version last asked to count now, +1 (0: none, or told to count later since), per api key and direction:
     * choose_counting is called when that changes, not for every side (a call into Python costs ~0.3 us). */
    long counting_now[MEMO_KEYS][2];
    PyObject *memo_scan[MEMO_KEYS][2]; /* the latest scan of each (api key, direction) ... */
    PyObject *memo_side[MEMO_KEYS][2]; /* ... its SCAN ... */
    Py_ssize_t memo_held[MEMO_KEYS][2]; /* ... and the bytes that SCAN holds beside base_bytes */
} TakerObject;

static PyObject *taker_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames);

static void taker_clear_memo(TakerObject *self)
{
    for (int k = 0; k < MEMO_KEYS; k++) {
        for (int d = 0; d < 2; d++) {
            Py_CLEAR(self->memo_scan[k][d]);
            Py_CLEAR(self->memo_side[k][d]);
        }
    }
}

/* The collector's view: the fallback is FactsTaker.take_python, a method of the FactsTaker whose `take` is this
 * taker, so the two make a cycle, freed only by the collector. */
static int taker_traverse(TakerObject *self, visitproc visit, void *arg)
{
    for (int i = 0; i < C_COUNT; i++)
        Py_VISIT(self->classes[i]);
    Py_VISIT(self->capture_side);
    Py_VISIT(self->batch_fields);
    Py_VISIT(self->fallback);
    Py_VISIT(self->choose_counting);
    for (int k = 0; k < MEMO_KEYS; k++) {
        for (int d = 0; d < 2; d++) {
            Py_VISIT(self->memo_scan[k][d]);
            Py_VISIT(self->memo_side[k][d]);
        }
    }
    return 0;
}

/* Breaks a cycle: the fallback and the kept scans go (a call after it raises); the rest stays for take's reads. */
static int taker_clear(TakerObject *self)
{
    taker_clear_memo(self);
    Py_CLEAR(self->fallback);
    Py_CLEAR(self->choose_counting);
    return 0;
}

static void taker_dealloc(TakerObject *self)
{
    PyObject_GC_UnTrack(self);
    taker_clear_memo(self);
    for (int i = 0; i < C_COUNT; i++)
        Py_XDECREF(self->classes[i]);
    Py_XDECREF(self->capture_side);
    Py_XDECREF(self->batch_fields);
    Py_XDECREF(self->fallback);
    Py_XDECREF(self->choose_counting);
    Py_XDECREF(self->scan_name);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *taker_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *classes, *capture_side, *batch_fields, *fallback, *choose_counting;
    Py_ssize_t base_bytes, topic_bytes;
    if (kwargs != NULL && PyDict_GET_SIZE(kwargs)) {
        PyErr_SetString(PyExc_TypeError, "Taker takes positional arguments only");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "O!OO!nnOO:Taker", &PyTuple_Type, &classes, &capture_side, &PyTuple_Type,
                          &batch_fields, &base_bytes, &topic_bytes, &fallback, &choose_counting))
        return NULL;
    if (PyTuple_GET_SIZE(classes) != C_COUNT || PyTuple_GET_SIZE(batch_fields) != 4 || !PyCallable_Check(capture_side)
        || !PyCallable_Check(fallback) || !PyCallable_Check(choose_counting)) {
        PyErr_SetString(PyExc_TypeError, "Taker(classes: 6 classes, capture_side, batch_fields: 4 indices, base_bytes, "
                                         "topic_bytes, fallback, choose_counting)");
        return NULL;
    }
    for (int i = 0; i < C_COUNT; i++) {
        if (!PyType_Check(PyTuple_GET_ITEM(classes, i))) {
            PyErr_SetString(PyExc_TypeError, "Taker: classes must be classes");
            return NULL;
        }
    }
    TakerObject *self = (TakerObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    for (int i = 0; i < C_COUNT; i++) {
        self->classes[i] = (PyTypeObject *)PyTuple_GET_ITEM(classes, i);
        Py_INCREF(self->classes[i]);
    }
    self->capture_side = Py_NewRef(capture_side);
    self->batch_fields = Py_NewRef(batch_fields);
    self->fallback = Py_NewRef(fallback);
    self->choose_counting = Py_NewRef(choose_counting);
    self->base_bytes = base_bytes;
    self->topic_bytes = topic_bytes;
    self->vectorcall = taker_vectorcall;
    self->scan_name = PyUnicode_InternFromString("scan");
    if (self->scan_name == NULL || find_offsets(self->classes[C_EXCHANGE], X_NAMES, X_COUNT, self->x) < 0
        || find_offsets(self->classes[C_REQUEST], Q_NAMES, Q_COUNT, self->q) < 0
        || find_offsets(self->classes[C_RESPONSE], P_NAMES, P_COUNT, self->p) < 0
        || find_offsets(self->classes[C_HEADER], H_NAMES, H_COUNT, self->h) < 0
        || find_offsets(self->classes[C_CONNECTION], N_NAMES, N_COUNT, self->n) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

/* The event's scan: its cached ScanResult, or the one its scan() makes now. NULL without an error
 * set when it has none (not complete, a cached DecodeError, or scan() raised: the fallback says why). */
static PyObject *scan_of(TakerObject *self, PyObject *event, Py_ssize_t complete_off, Py_ssize_t scanned_off)
{
    if (SLOT(event, complete_off) != Py_True)
        return NULL;
    PyObject *scan = SLOT(event, scanned_off);
    if (scan != NULL && Py_IS_TYPE(scan, self->classes[C_SCAN]))
        return Py_NewRef(scan);
    if (scan != NULL && scan != Py_None)
        return NULL; /* a DecodeError, cached */
    scan = PyObject_CallMethodNoArgs(event, self->scan_name);
    if (scan == NULL || !Py_IS_TYPE(scan, self->classes[C_SCAN])) {
        PyErr_Clear();
        Py_XDECREF(scan);
        return NULL;
    }
    return scan;
}

/* The bytes a SCAN tuple (8 items) holds beside base_bytes, as capture.facts.held_bytes counts them: its integer
 * counters' bytes and topic_bytes a topic; -1 with an error set on failure. */
static Py_ssize_t scan_held(PyObject *side, Py_ssize_t topic_bytes)
{
    PyObject *stats = PyTuple_GET_ITEM(side, 4), *topics = PyTuple_GET_ITEM(side, 5);
    /* (frame, pos): counters left for the writer to count (codegen.COUNT_LATER); the queue holds the frame */
    Py_ssize_t size = stats == Py_None            ? 0
                      : PyBytes_CheckExact(stats) ? PyBytes_GET_SIZE(stats)
                      : PyTuple_CheckExact(stats) && PyTuple_GET_SIZE(stats) == 2
                          ? PyObject_Length(PyTuple_GET_ITEM(stats, 0))
                          : PyObject_Length(stats);
    Py_ssize_t count = PyTuple_CheckExact(topics) ? PyTuple_GET_SIZE(topics) : PyObject_Length(topics);
    return size < 0 || count < 0 ? -1 : size + topic_bytes * count;
}

/* FactsTaker.choose_counting's reference: after a new SCAN of an api whose previous one is `previous`, ask for
 * counting now where it came out alike but for its frame to count (capture_side gave it previous's items), and
 * for counting later again where a counted one was not alike a counted previous one; 0, or -1 with an error set. */
static int choose_counting(TakerObject *self, PyObject *side, PyObject *previous, PyObject *api, long api_key,
                           int direction, PyObject *version)
{
    PyObject *stats = PyTuple_GET_ITEM(side, 4);
    long v = version != NULL && PyLong_CheckExact(version) ? PyLong_AsLong(version) : -2;
    if (v == -1 && PyErr_Occurred())
        return -1;
    long *asked = &self->counting_now[api_key][direction];
    int now;
    if (PyTuple_CheckExact(stats)) {
        if (*asked == v + 1)
            return 0; /* asked already (its scans, made before, are still left for later) */
        for (int i = 0; i < 8; i++) {
            if (i != 4 && PyTuple_GET_ITEM(side, i) != PyTuple_GET_ITEM(previous, i))
                return 0; /* new facts: counting now would not have made it alike */
        }
        now = 1;
    } else if (PyBytes_CheckExact(stats) && PyBytes_CheckExact(PyTuple_GET_ITEM(previous, 4)) && *asked == v + 1) {
        now = 0; /* counted, as was the previous one, and not alike it: counting now did not pay */
    } else {
        return 0;
    }
    *asked = now ? v + 1 : 0;
    if (self->choose_counting == NULL || v == -2)
        return 0;
    PyObject *args[4] = {api, version, direction == 0 ? Py_True : Py_False, now ? Py_True : Py_False};
    PyObject *done = PyObject_Vectorcall(self->choose_counting, args, 4, NULL);
    Py_XDECREF(done);
    return done == NULL ? -1 : 0;
}

/* A side's SCAN (new reference) and the bytes it holds beside base_bytes; NULL with an error set on failure.
 * api and version: the api key and the version the body was read at, for choose_counting. */
static PyObject *side_of(TakerObject *self, PyObject *scan, PyObject *api, long api_key, int direction,
                         PyObject *version, Py_ssize_t *held)
{
    int memo = api_key >= 0 && api_key < MEMO_KEYS;
    if (memo && self->memo_scan[api_key][direction] == scan) {
        *held = self->memo_held[api_key][direction];
        return Py_NewRef(self->memo_side[api_key][direction]);
    }
    /* The api's previous SCAN comes back itself when this scan's facts equal it: a producer's requests
     * and a consumer's responses are scanned anew every time, their facts mostly alike. */
    PyObject *previous = memo ? self->memo_side[api_key][direction] : NULL;
    PyObject *args[3] = {scan, self->batch_fields, previous};
    PyObject *side = PyObject_Vectorcall(self->capture_side, args, previous != NULL ? 3 : 2, NULL);
    if (side == NULL)
        return NULL;
    if (side == previous) { /* alike: its bytes are the kept side's; later events of this scan find it at once */
        *held = self->memo_held[api_key][direction];
        Py_XSETREF(self->memo_scan[api_key][direction], Py_NewRef(scan));
        return side;
    }
    if (!PyTuple_Check(side) || PyTuple_GET_SIZE(side) != 8 || !PyTuple_Check(PyTuple_GET_ITEM(side, 5))) {
        Py_DECREF(side);
        PyErr_SetString(PyExc_TypeError, "Taker: capture_side returned no SCAN tuple");
        return NULL;
    }
    if ((*held = scan_held(side, self->topic_bytes)) < 0) {
        Py_DECREF(side);
        return NULL;
    }
    if (previous != NULL && PyTuple_CheckExact(previous) && PyTuple_GET_SIZE(previous) == 8
        && choose_counting(self, side, previous, api, api_key, direction, version) < 0) {
        Py_DECREF(side);
        return NULL;
    }
    if (memo) {
        Py_XSETREF(self->memo_scan[api_key][direction], Py_NewRef(scan));
        Py_XSETREF(self->memo_side[api_key][direction], Py_NewRef(side));
        self->memo_held[api_key][direction] = *held;
    }
    return side;
}

static int all_set(PyObject *obj, const Py_ssize_t *offsets, int count)
{
    for (int i = 0; i < count; i++) {
        if (SLOT(obj, offsets[i]) == NULL)
            return 0;
    }
    return 1;
}

/* Untrack a tuple whose items are atomic or such tuples, as CPython's collector does when it next
 * looks at the tuple's generation (_PyTuple_MaybeUntrack: any other object of a class the collector
 * knows keeps it tracked); 1 if it is untracked now. Why at once: the facts wait in the queue for up to a
 * batch. Left to the collector, a SCAN kept for the next exchange of its api was often still tracked
 * when the next facts were looked at: they stayed tracked, were promoted, and every full collection
 * walked the queue (about 2 us an exchange on the recorded traffic, more than taking the facts). */
static int untrack_tuple(PyObject *tuple)
{
    if (!PyObject_GC_IsTracked(tuple))
        return 1;
    for (Py_ssize_t i = 0, n = PyTuple_GET_SIZE(tuple); i < n; i++) {
        PyObject *item = PyTuple_GET_ITEM(tuple, i);
        if (PyTuple_CheckExact(item) ? !untrack_tuple(item) : PyType_IS_GC(Py_TYPE(item)))
            return 0;
    }
    PyObject_GC_UnTrack(tuple);
    return 1;
}

/* An exchange's EXCHANGE tuple, the bytes it holds in *held; NULL without an error set for what the
 * fallback takes, NULL with one for a failure. */
static PyObject *take(TakerObject *self, PyObject *exchange, Py_ssize_t *held)
{
    PyObject *request, *response, *header, *connection;
    if (!Py_IS_TYPE(exchange, self->classes[C_EXCHANGE]) || !all_set(exchange, self->x, X_COUNT))
        return NULL;
    request = SLOT(exchange, self->x[X_REQUEST]);
    response = SLOT(exchange, self->x[X_RESPONSE]);
    if (!Py_IS_TYPE(request, self->classes[C_REQUEST]) || !all_set(request, self->q, Q_COUNT))
        return NULL;
    if (response != Py_None && (!Py_IS_TYPE(response, self->classes[C_RESPONSE]) || !all_set(response, self->p, P_COUNT)))
        return NULL;
    header = SLOT(request, self->q[Q_HEADER]);
    connection = SLOT(request, self->q[Q_CONNECTION]);
    if (!Py_IS_TYPE(header, self->classes[C_HEADER]) || !all_set(header, self->h, H_COUNT)
        || !Py_IS_TYPE(connection, self->classes[C_CONNECTION]) || !all_set(connection, self->n, N_COUNT))
        return NULL;
    PyObject *key_obj = SLOT(header, self->h[H_API_KEY]);
    long api_key = PyLong_Check(key_obj) ? PyLong_AsLong(key_obj) : -1;
    if (api_key == -1 && PyErr_Occurred())
        PyErr_Clear();

    PyObject *req_scan = scan_of(self, request, self->q[Q_COMPLETE], self->q[Q_SCANNED]);
    if (req_scan == NULL)
        return NULL;
    PyObject *resp_scan = NULL;
    if (response != Py_None) {
        resp_scan = scan_of(self, response, self->p[P_COMPLETE], self->p[P_SCANNED]);
        if (resp_scan == NULL) {
            Py_DECREF(req_scan);
            return NULL;
        }
    }
    Py_ssize_t req_held = 0, resp_held = 0;
    PyObject *req_side = side_of(self, req_scan, key_obj, api_key, 0, SLOT(header, self->h[H_API_VERSION]), &req_held);
    PyObject *resp_side = NULL;
    if (req_side != NULL && resp_scan != NULL)
        resp_side = side_of(self, resp_scan, key_obj, api_key, 1, SLOT(response, self->p[P_VERSION]), &resp_held);
    Py_DECREF(req_scan);
    Py_XDECREF(resp_scan);
    if (req_side == NULL || (response != Py_None && resp_side == NULL)) {
        Py_XDECREF(req_side);
        return NULL; /* an error is set: the caller raises it */
    }
    PyObject *facts = PyTuple_New(29);
    if (facts == NULL) {
        Py_DECREF(req_side);
        Py_XDECREF(resp_side);
        return NULL;
    }
    PyObject *values[29] = {
        SLOT(request, self->q[Q_TIME]), SLOT(exchange, self->x[X_LATENCY]),
        SLOT(connection, self->n[N_ID]), SLOT(connection, self->n[N_CLIENT]),
        SLOT(connection, self->n[N_BROKER]), SLOT(connection, self->n[N_NODE]),
        SLOT(header, self->h[H_CLIENT_ID]), key_obj,
        SLOT(request, self->q[Q_API_NAME]), SLOT(header, self->h[H_API_VERSION]),
        SLOT(header, self->h[H_VERSION]), SLOT(header, self->h[H_CORRELATION]),
        SLOT(request, self->q[Q_SIZE]), SLOT(header, self->h[H_SIZE]),
        SLOT(request, self->q[Q_COMPLETE]), SLOT(request, self->q[Q_TAG_BYTES]),
        SLOT(request, self->q[Q_TAGS]), SLOT(connection, self->n[N_SOFTWARE]),
        SLOT(connection, self->n[N_SOFTWARE_VERSION]), NULL,
    };
    if (response != Py_None) {
        values[20] = SLOT(response, self->p[P_TIME]);
        values[21] = SLOT(response, self->p[P_VERSION]);
        values[22] = SLOT(response, self->p[P_HEADER_VERSION]);
        values[23] = SLOT(response, self->p[P_SIZE]);
        values[24] = SLOT(response, self->p[P_HEADER_SIZE]);
        values[25] = SLOT(response, self->p[P_COMPLETE]);
        values[26] = SLOT(response, self->p[P_TAG_BYTES]);
        values[27] = SLOT(response, self->p[P_TAGS]);
    }
    /* Filled and, in the same pass, seen to hold only atomic values and untracked tuples: then untracked
     * (untrack_tuple's rule, without a second walk over the 29 items). */
    int atomic = 1;
    for (int i = 0; i < 29; i++) {
        PyObject *item = i == 19 ? req_side /* the references made above */
                         : i == 28 ? (resp_side != NULL ? resp_side : Py_NewRef(Py_None))
                                   : Py_NewRef(values[i] != NULL ? values[i] : Py_None);
        PyTuple_SET_ITEM(facts, i, item);
        if (atomic && (PyTuple_CheckExact(item) ? !untrack_tuple(item) : PyType_IS_GC(Py_TYPE(item))))
            atomic = 0;
    }
    if (atomic)
        PyObject_GC_UnTrack(facts);
    *held = self->base_bytes + req_held + resp_held;
    return facts;
}

/* (EXCHANGE, bytes it holds) of take(), or NULL. */
static PyObject *take_pair(TakerObject *self, PyObject *exchange)
{
    Py_ssize_t held;
    PyObject *facts = take(self, exchange, &held);
    if (facts == NULL)
        return NULL;
    PyObject *out = PyTuple_New(2), *bytes = PyLong_FromSsize_t(held);
    if (out == NULL || bytes == NULL) {
        Py_DECREF(facts);
        Py_XDECREF(out);
        Py_XDECREF(bytes);
        return NULL;
    }
    PyTuple_SET_ITEM(out, 0, facts);
    PyTuple_SET_ITEM(out, 1, bytes);
    return out;
}

static PyObject *taker_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    TakerObject *self = (TakerObject *)callable;
    if (PyVectorcall_NARGS(nargsf) != 1 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames))) {
        PyErr_SetString(PyExc_TypeError, "taker(exchange)");
        return NULL;
    }
    PyObject *out = take_pair(self, args[0]);
    if (out != NULL || PyErr_Occurred())
        return out;
    if (self->fallback == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "taker: cleared by the garbage collector");
        return NULL;
    }
    return PyObject_Vectorcall(self->fallback, args, 1, NULL);
}

static PyObject *taker_forget(TakerObject *self, PyObject *unused)
{
    taker_clear_memo(self);
    Py_RETURN_NONE;
}

static PyMethodDef taker_methods[] = {
    {"forget", (PyCFunction)taker_forget, METH_NOARGS, "forget() -> None: drop the kept SCAN of each (api key, direction)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject TakerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kinspect.capture._take.Taker",
    .tp_basicsize = sizeof(TakerObject),
    .tp_dealloc = (destructor)taker_dealloc,
    .tp_traverse = (traverseproc)taker_traverse,
    .tp_clear = (inquiry)taker_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(TakerObject, vectorcall),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Taker(classes, capture_side, batch_fields, base_bytes, topic_bytes, fallback, choose_counting): "
              "taker(exchange) -> (EXCHANGE, bytes held), as kinspect.capture.facts.FactsTaker.take_python.",
    .tp_new = taker_new,
    .tp_methods = taker_methods,
};

/* ------------------------------------------------------------------ the queue's front
 *
 * QueueFront(queue, queue_rows, queue_bytes, wake_at, wake, take, on_error): the event loop's end of the
 * capture queue (kinspect.capture.queue_front.QueueFront is the reference; see it for what each part does).
 * front(exchange) takes the exchange's facts with take(exchange) -> (facts, bytes they hold) and offers
 * them; front.offer(facts, nbytes) -> bool queues facts within the bounds. Why C: the capture observer
 * does this for every exchange on the event loop, where Python's two frames and a dozen attribute
 * updates cost some 0.5 us, half the capture's whole budget there. */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall; /* front_vectorcall: the dispatcher calls it with no argument tuple */
    PyObject *queue, *append, *wake, *take, *on_error;
    Py_ssize_t wake_first, wake_batch; /* queue lengths at which an offer calls wake() */
    long long queue_rows, queue_bytes;
    long long offered_bytes, taken_bytes, accepted, dropped, fact_errors;
    char closed;
} FrontObject;

static PyObject *front_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames);

static int front_traverse(FrontObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->queue);
    Py_VISIT(self->append);
    Py_VISIT(self->wake);
    Py_VISIT(self->take);
    Py_VISIT(self->on_error);
    return 0;
}

/* Breaks a cycle through what the front calls (a front cleared drops every offer's wake-up and fails to take). */
static int front_clear(FrontObject *self)
{
    Py_CLEAR(self->wake);
    Py_CLEAR(self->take);
    Py_CLEAR(self->on_error);
    return 0;
}

static void front_dealloc(FrontObject *self)
{
    PyObject_GC_UnTrack(self);
    Py_XDECREF(self->queue);
    Py_XDECREF(self->append);
    Py_XDECREF(self->wake);
    Py_XDECREF(self->take);
    Py_XDECREF(self->on_error);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *front_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *queue, *wake, *take, *on_error;
    long long queue_rows, queue_bytes;
    Py_ssize_t wake_first, wake_batch;
    if (kwargs != NULL && PyDict_GET_SIZE(kwargs)) {
        PyErr_SetString(PyExc_TypeError, "QueueFront takes positional arguments only");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "OLL(nn)OOO:QueueFront", &queue, &queue_rows, &queue_bytes, &wake_first, &wake_batch,
                          &wake, &take, &on_error))
        return NULL;
    if (!PyCallable_Check(wake)) {
        PyErr_SetString(PyExc_TypeError, "QueueFront: wake must be callable");
        return NULL;
    }
    FrontObject *self = (FrontObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->vectorcall = front_vectorcall;
    self->queue = Py_NewRef(queue);
    self->wake = Py_NewRef(wake);
    self->take = Py_NewRef(take);
    self->on_error = Py_NewRef(on_error);
    self->queue_rows = queue_rows;
    self->queue_bytes = queue_bytes;
    self->wake_first = wake_first;
    self->wake_batch = wake_batch;
    self->append = PyObject_GetAttrString(queue, "append");
    if (self->append == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

/* Queue facts holding nbytes: 1 if queued, 0 if dropped (counted), -1 with an error set. */
static int front_offer_facts(FrontObject *self, PyObject *facts, long long nbytes)
{
    Py_ssize_t length = PyObject_Size(self->queue);
    if (length < 0)
        return -1;
    if (length >= self->queue_rows || self->closed
        || self->offered_bytes - self->taken_bytes + nbytes > self->queue_bytes) {
        self->dropped++;
        return 0;
    }
    PyObject *done = PyObject_CallOneArg(self->append, facts);
    if (done == NULL)
        return -1;
    Py_DECREF(done);
    self->offered_bytes += nbytes;
    self->accepted++;
    long long held = self->offered_bytes - self->taken_bytes, half = self->queue_bytes / 2;
    length++;
    if (self->wake != NULL
        && (length == self->wake_first || length == self->wake_batch || (held - nbytes < half && half <= held))) {
        PyObject *woken = PyObject_CallNoArgs(self->wake);
        if (woken == NULL)
            return -1;
        Py_DECREF(woken);
    }
    return 1;
}

static PyObject *front_offer(FrontObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "offer(facts, nbytes=0)");
        return NULL;
    }
    long long nbytes = 0;
    if (nargs == 2 && (nbytes = PyLong_AsLongLong(args[1])) == -1 && PyErr_Occurred())
        return NULL;
    int queued = front_offer_facts(self, args[0], nbytes);
    if (queued < 0)
        return NULL;
    return PyBool_FromLong(queued);
}

/* take(exchange) failed (the error set): counted, and the first one handed to on_error, never raised. */
static PyObject *front_fact_error(FrontObject *self)
{
    if (!PyErr_ExceptionMatches(PyExc_Exception))
        return NULL; /* KeyboardInterrupt, SystemExit: not the capture's to swallow */
    PyObject *type, *exc, *traceback;
    PyErr_Fetch(&type, &exc, &traceback);
    PyErr_NormalizeException(&type, &exc, &traceback);
    if (traceback != NULL && exc != NULL)
        PyException_SetTraceback(exc, traceback); /* what the log prints */
    Py_XDECREF(type);
    Py_XDECREF(traceback);
    if (exc == NULL)
        exc = Py_NewRef(Py_None);
    self->fact_errors++;
    if (self->fact_errors == 1 && self->on_error != NULL && self->on_error != Py_None) {
        PyObject *logged = PyObject_CallOneArg(self->on_error, exc);
        Py_XDECREF(logged);
        if (logged == NULL)
            PyErr_Clear(); /* the log failed: the error is still counted */
    }
    Py_DECREF(exc);
    Py_RETURN_NONE;
}

static PyObject *front_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    FrontObject *self = (FrontObject *)callable;
    if (PyVectorcall_NARGS(nargsf) != 1 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames))) {
        PyErr_SetString(PyExc_TypeError, "front(exchange)");
        return NULL;
    }
    long long nbytes;
    if (self->take == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "front: cleared by the garbage collector");
        return front_fact_error(self);
    }
    if (Py_IS_TYPE(self->take, &TakerType)) { /* the C taker: no (facts, bytes) pair made and unpacked */
        Py_ssize_t held;
        PyObject *facts = take((TakerObject *)self->take, args[0], &held);
        if (facts != NULL) {
            int queued = front_offer_facts(self, facts, held);
            Py_DECREF(facts);
            if (queued < 0)
                return NULL;
            Py_RETURN_NONE;
        }
        if (PyErr_Occurred())
            return front_fact_error(self);
    }
    PyObject *take = Py_IS_TYPE(self->take, &TakerType) ? ((TakerObject *)self->take)->fallback : self->take;
    if (take == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "taker: cleared by the garbage collector");
        return front_fact_error(self);
    }
    PyObject *taken = PyObject_Vectorcall(take, args, 1, NULL);
    if (taken == NULL)
        return front_fact_error(self);
    if (!PyTuple_CheckExact(taken) || PyTuple_GET_SIZE(taken) != 2
        || ((nbytes = PyLong_AsLongLong(PyTuple_GET_ITEM(taken, 1))) == -1 && PyErr_Occurred())) {
        Py_DECREF(taken);
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "take(exchange) must return (facts, bytes they hold)");
        return front_fact_error(self);
    }
    int queued = front_offer_facts(self, PyTuple_GET_ITEM(taken, 0), nbytes);
    Py_DECREF(taken);
    if (queued < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyMemberDef front_members[] = {
    {"queue", T_OBJECT, offsetof(FrontObject, queue), READONLY, "the deque the writer thread takes facts from"},
    {"queue_rows", T_LONGLONG, offsetof(FrontObject, queue_rows), READONLY, "the queue's bound in exchanges"},
    {"queue_bytes", T_LONGLONG, offsetof(FrontObject, queue_bytes), READONLY, "its bound in bytes of facts"},
    {"take", T_OBJECT, offsetof(FrontObject, take), 0, "take(exchange) -> (facts, bytes they hold)"},
    {"on_error", T_OBJECT, offsetof(FrontObject, on_error), 0, "on_error(exception): the first fact error"},
    {"offered_bytes", T_LONGLONG, offsetof(FrontObject, offered_bytes), 0, "bytes queued, ever (the loop's)"},
    {"taken_bytes", T_LONGLONG, offsetof(FrontObject, taken_bytes), 0, "bytes taken, ever (the thread's)"},
    {"accepted", T_LONGLONG, offsetof(FrontObject, accepted), 0, "exchanges queued"},
    {"dropped", T_LONGLONG, offsetof(FrontObject, dropped), 0, "exchanges dropped: the queue full or closed"},
    {"fact_errors", T_LONGLONG, offsetof(FrontObject, fact_errors), 0, "exchanges whose facts could not be taken"},
    {"closed", T_BOOL, offsetof(FrontObject, closed), 0, "once True, every offer is dropped"},
    {NULL},
};

static PyMethodDef front_methods[] = {
    {"offer", (PyCFunction)(void (*)(void))front_offer, METH_FASTCALL,
     "offer(facts, nbytes=0) -> bool: queue facts holding nbytes, or drop them (counted) past a bound."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject FrontType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kinspect.capture._take.QueueFront",
    .tp_basicsize = sizeof(FrontObject),
    .tp_dealloc = (destructor)front_dealloc,
    .tp_traverse = (traverseproc)front_traverse,
    .tp_clear = (inquiry)front_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(FrontObject, vectorcall),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "QueueFront(queue, queue_rows, queue_bytes, wake_at, wake, take, on_error): the capture queue's event-loop "
              "end, as kinspect.capture.queue_front.QueueFront.",
    .tp_new = front_new,
    .tp_methods = front_methods,
    .tp_members = front_members,
};

/* ------------------------------------------------------------------ a batch the writer thread takes */

/* 1 when side and kept are both tuples equal in content (their records compared first), 0 when not, -1 on an
 * error: the reference's `type(side) is tuple and type(kept) is tuple and side[r] == kept[r] and side == kept`. */
static int alike(PyObject *side, PyObject *kept, Py_ssize_t records)
{
    if (!PyTuple_CheckExact(side) || kept == NULL || !PyTuple_CheckExact(kept))
        return 0;
    if (PyTuple_GET_SIZE(side) <= records || PyTuple_GET_SIZE(kept) <= records) {
        PyErr_SetString(PyExc_IndexError, "tuple index out of range");
        return -1;
    }
    int same = PyObject_RichCompareBool(PyTuple_GET_ITEM(side, records), PyTuple_GET_ITEM(kept, records), Py_EQ);
    return same <= 0 ? same : PyObject_RichCompareBool(side, kept, Py_EQ);
}

/* One side of a row: a side that is not the previous row's object (*seen) and not alike the object kept for it
 * (*kept) is kept from now on. 0, or -1 on an error. */
static int keep(PyObject *side, PyObject **seen, PyObject **kept, Py_ssize_t records)
{
    if (side == *seen)
        return 0;
    *seen = side;
    int same = alike(side, *kept, records);
    if (same == 0)
        *kept = side;
    return same < 0 ? -1 : 0;
}

/* share_alike_sides(facts, request_side, response_side, records) -> list: capture.facts.share_alike_sides_python,
 * the indices given (response_side the last field). Rows must be tuples. */
static PyObject *share_alike_sides(PyObject *module, PyObject *args)
{
    PyObject *facts;
    Py_ssize_t req_at, resp_at, records;
    if (!PyArg_ParseTuple(args, "O!nnn:share_alike_sides", &PyList_Type, &facts, &req_at, &resp_at, &records))
        return NULL;
    if (req_at < 0 || resp_at <= req_at || records < 0) {
        PyErr_SetString(PyExc_ValueError, "share_alike_sides: bad field indices");
        return NULL;
    }
    /* The rows held by a copy of the list: the comparisons below cannot free a row the pointers use. */
    PyObject *rows = PyList_GetSlice(facts, 0, PyList_GET_SIZE(facts));
    if (rows == NULL)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(rows);
    PyObject *out = PyList_New(n);
    if (out == NULL)
        goto fail;
    PyObject *seen_req = NULL, *seen_resp = NULL, *kept_req = NULL, *kept_resp = NULL; /* borrowed from rows */
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *row = PyList_GET_ITEM(rows, i);
        if (!PyTuple_Check(row)) {
            PyErr_Format(PyExc_TypeError, "share_alike_sides: row %zd is not a tuple", i);
            goto fail;
        }
        if (PyTuple_GET_SIZE(row) <= resp_at) {
            PyErr_SetString(PyExc_IndexError, "tuple index out of range");
            goto fail;
        }
        PyObject *req = PyTuple_GET_ITEM(row, req_at), *resp = PyTuple_GET_ITEM(row, resp_at);
        if (keep(req, &seen_req, &kept_req, records) < 0 || keep(resp, &seen_resp, &kept_resp, records) < 0)
            goto fail;
        if (req == kept_req && resp == kept_resp) {
            PyList_SET_ITEM(out, i, Py_NewRef(row));
            continue;
        }
        /* row[:req_at] + (kept_req,) + row[req_at + 1:resp_at] + (kept_resp,) */
        PyObject *shared = PyTuple_New(resp_at + 1);
        if (shared == NULL)
            goto fail;
        for (Py_ssize_t j = 0; j < resp_at; j++)
            PyTuple_SET_ITEM(shared, j, Py_NewRef(j == req_at ? kept_req : PyTuple_GET_ITEM(row, j)));
        PyTuple_SET_ITEM(shared, resp_at, Py_NewRef(kept_resp));
        PyList_SET_ITEM(out, i, shared);
    }
    Py_DECREF(rows);
    return out;
fail:
    Py_XDECREF(out); /* items not yet set are NULL, which list_dealloc skips */
    Py_DECREF(rows);
    return NULL;
}

/* held_total(facts, base_bytes, topic_bytes, request_side, response_side) -> int: the sum of
 * capture.facts.held_bytes over the rows. */
static PyObject *held_total(PyObject *module, PyObject *args)
{
    PyObject *facts;
    Py_ssize_t base, topic, sides[2];
    if (!PyArg_ParseTuple(args, "O!nnnn:held_total", &PyList_Type, &facts, &base, &topic, &sides[0], &sides[1]))
        return NULL;
    if (sides[0] < 0 || sides[1] < 0) {
        PyErr_SetString(PyExc_ValueError, "held_total: bad field indices");
        return NULL;
    }
    long long total = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(facts); i++) {
        PyObject *row = PyList_GET_ITEM(facts, i);
        if (!PyTuple_Check(row)) {
            PyErr_Format(PyExc_TypeError, "held_total: row %zd is not a tuple", i);
            return NULL;
        }
        total += base;
        for (int k = 0; k < 2; k++) {
            if (PyTuple_GET_SIZE(row) <= sides[k]) {
                PyErr_SetString(PyExc_IndexError, "tuple index out of range");
                return NULL;
            }
            PyObject *side = PyTuple_GET_ITEM(row, sides[k]);
            if (!PyTuple_CheckExact(side))
                continue;
            if (PyTuple_GET_SIZE(side) <= 5) {
                PyErr_SetString(PyExc_IndexError, "tuple index out of range");
                return NULL;
            }
            Py_ssize_t held = scan_held(side, topic);
            if (held < 0)
                return NULL;
            total += held;
        }
    }
    return PyLong_FromLongLong(total);
}

static PyMethodDef take_functions[] = {
    {"share_alike_sides", share_alike_sides, METH_VARARGS,
     "share_alike_sides(facts, request_side, response_side, records) -> list (capture.facts.share_alike_sides_python)."},
    {"held_total", held_total, METH_VARARGS,
     "held_total(facts, base_bytes, topic_bytes, request_side, response_side) -> int (capture.facts.held_bytes summed)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef take_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "kinspect.capture._take",
    .m_doc = "The capture's EXCHANGE tuple of an Exchange event, built in C (kinspect.capture.facts is the reference), "
             "the capture queue's front (kinspect.capture.queue_front is its reference), and the writer thread's "
             "work on a batch it takes (capture.facts: share_alike_sides_python, held_bytes).",
    .m_size = -1,
    .m_methods = take_functions,
};

PyMODINIT_FUNC PyInit__take(void)
{
    if (PyType_Ready(&TakerType) < 0 || PyType_Ready(&FrontType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&take_module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Taker", (PyObject *)&TakerType) < 0
        || PyModule_AddObjectRef(m, "QueueFront", (PyObject *)&FrontType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
