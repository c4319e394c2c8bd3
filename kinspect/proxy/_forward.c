/* A relay's read in C: Relay.client_read / broker_read and InspectionQueue.add (the reference).
 *
 * Why C: every read of every connection runs this, and a small request one at a time is two reads.
 * In-process, warm, the Python of those two methods cost about 0.9 us a read against 0.17 for the
 * write alone (docs/performance.md); live, between the kernel's sends and the inspection batches,
 * the caches are cold and it costs more.
 *
 * configure(Relay, _Side, InspectionQueue, Session, pass_min_bytes): the classes (their slots' offsets), once.
 * Reader(relay, from_client): the callable a _Side hands its reads to (its data_received). A read is
 *   done here when it is the common case: bytes, a Relay (the class itself) whose
 *   broker connection is up, reads queued for a batch in an InspectionQueue, and for broker reads no
 *   transform. Then, in the Python's order: the direction's byte count, the write to the other side
 *   (unless its transport is missing or closing), and, while the direction is framed, the read queued
 *   with the relay's clock, the batch flushed when full or its timer started (queue._start_timer).
 *   A read of pass_min_bytes or more is first offered to the session to pass over when no read waits
 *   in the queue (session.pass_client / pass_broker), as the Python does: a bulk producer's and a
 *   consumer's reads are mostly such, and each cost three Python calls more on the Python path (in a
 *   model of a bulk producer, 15% of the proxy's user-space instructions a megabyte; live, under the
 *   noise of 40 paired rounds).
 *   Anything else (the early bytes before the broker connection, rewrite mode, a stand-in relay or
 *   queue) is the Python method's, called whole. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <time.h>

#include "../slot_offsets.h"

enum { R_SESSION, R_QUEUE, R_CLIENT, R_BROKER, R_TRANSFORMS, R_CLIENT_BYTES, R_BROKER_BYTES, R_CLOCK, R_EARLY,
       R_COUNT };
static const char *const R_NAMES[R_COUNT] = {"session", "queue", "client", "broker", "transforms",
                                             "client_bytes", "broker_bytes", "_clock", "_early"};
enum { S_TRANSPORT, S_COUNT };
static const char *const S_NAMES[S_COUNT] = {"transport"};
enum { Q_READS, Q_BYTES, Q_HANDLE, Q_MAX_READS, Q_MAX_BYTES, Q_COUNT };
static const char *const Q_NAMES[Q_COUNT] = {"_reads", "_bytes", "_handle", "max_reads", "max_bytes"};
enum { F_CLIENT_FRAMED, F_BROKER_FRAMED, F_COUNT };
static const char *const F_NAMES[F_COUNT] = {"client_framed", "broker_framed"};
static Py_ssize_t r[R_COUNT], s[S_COUNT], q[Q_COUNT], f[F_COUNT];

static PyTypeObject *relay_type, *side_type, *queue_type, *session_type;
static Py_ssize_t pass_min_bytes;
static PyObject *str_client_read, *str_broker_read, *str_client_framed, *str_broker_framed, *str_is_closing,
    *str_write, *str_flush, *str_start_timer, *str_pass_client, *str_pass_broker;

/* obj.name(*args) (new reference; NULL with an error set). */
static inline PyObject *call(PyObject *obj, PyObject *name, PyObject *arg)
{
    PyObject *args[2] = {obj, arg};
    return PyObject_VectorcallMethod(name, args, (arg == NULL ? 1 : 2) | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}

/* time.monotonic(), read here: the relay's clock unless a test gave it another (the same value as Python's: the
 * clock's nanoseconds as a float of seconds). */
static PyObject *monotonic;

static PyObject *monotonic_now(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0)
        return PyObject_CallNoArgs(monotonic); /* Python says what failed */
    long long ns = (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
    return PyFloat_FromDouble((double)ns / 1e9);
}

/* An int slot plus n, set back (the Python's `+=`); -1 with an error set. */
static int add_to_slot(PyObject *obj, Py_ssize_t off, Py_ssize_t n)
{
    PyObject *held = SLOT(obj, off);
    if (held == NULL) {
        PyErr_SetString(PyExc_AttributeError, "_forward: a counter slot is unset");
        return -1;
    }
    PyObject *sum = NULL;
    if (PyLong_CheckExact(held)) { /* the common case, added as C integers: one int made, not two */
        int overflow;
        long long was = PyLong_AsLongLongAndOverflow(held, &overflow);
        if (!overflow && was >= 0 && was <= LLONG_MAX - n)
            sum = PyLong_FromLongLong(was + n);
    }
    if (sum == NULL && !PyErr_Occurred()) {
        PyObject *amount = PyLong_FromSsize_t(n);
        sum = amount == NULL ? NULL : PyNumber_Add(held, amount);
        Py_XDECREF(amount);
    }
    if (sum == NULL)
        return -1;
    set_slot(obj, off, sum);
    return 0;
}

/* The read done here: 1; 0 when it is not the common case (nothing done: the Python method does it
 * all); -1 with an error set (what the Python raises at the same step). */
static int forward_read(PyObject *relay, int client, PyObject *data)
{
    if (Py_TYPE(relay) != relay_type || !PyBytes_CheckExact(data))
        return 0;
    Py_ssize_t n = PyBytes_GET_SIZE(data);
    PyObject *early = SLOT(relay, r[R_EARLY]), *queue = SLOT(relay, r[R_QUEUE]);
    PyObject *peer = SLOT(relay, r[client ? R_BROKER : R_CLIENT]), *session = SLOT(relay, r[R_SESSION]);
    PyObject *clock = SLOT(relay, r[R_CLOCK]), *transforms = SLOT(relay, r[R_TRANSFORMS]);
    if (early != Py_None || queue == NULL || Py_TYPE(queue) != queue_type || peer == NULL
        || Py_TYPE(peer) != side_type || SLOT(peer, s[S_TRANSPORT]) == NULL || session == NULL || clock == NULL
        || (!client && transforms != Py_False))
        return 0;
    PyObject *reads = SLOT(queue, q[Q_READS]);
    PyObject *held = SLOT(queue, q[Q_BYTES]), *max_reads = SLOT(queue, q[Q_MAX_READS]);
    PyObject *max_bytes = SLOT(queue, q[Q_MAX_BYTES]);
    if (reads == NULL || !PyList_CheckExact(reads) || held == NULL || !PyLong_CheckExact(held) || max_reads == NULL
        || !PyLong_CheckExact(max_reads) || max_bytes == NULL || !PyLong_CheckExact(max_bytes))
        return 0; /* bounds that are not plain ints: the Python compares them */

    /* The common case: from here on, the Python's steps in its order. What a call below may change
     * (a transport's callbacks, the clock) cannot free what this read holds. */
    int rc = -1;
    Py_INCREF(queue);
    Py_INCREF(session);
    Py_INCREF(clock);
    Py_INCREF(peer);
    PyObject *transport = Py_NewRef(SLOT(peer, s[S_TRANSPORT])), *now = NULL, *item = NULL;
    if (add_to_slot(relay, r[client ? R_CLIENT_BYTES : R_BROKER_BYTES], n) < 0)
        goto done;
    if (transport != Py_None) {
        PyObject *closing = call(transport, str_is_closing, NULL);
        int is = closing == NULL ? -1 : PyObject_IsTrue(closing);
        Py_XDECREF(closing);
        if (is < 0)
            goto done;
        if (!is) {
            PyObject *res = call(transport, str_write, data);
            if (res == NULL)
                goto done;
            Py_DECREF(res);
        }
    }
    int framed = slot_or_attr_true(session, session_type, f[client ? F_CLIENT_FRAMED : F_BROKER_FRAMED],
                                   client ? str_client_framed : str_broker_framed);
    if (framed <= 0) {
        rc = framed < 0 ? -1 : 1;
        goto done;
    }
    if (n >= pass_min_bytes) { /* `not queue and session.pass_client(len(data))`: passed over, nothing queued */
        PyObject *waiting = SLOT(queue, q[Q_READS]);
        if (waiting == NULL || !PyList_CheckExact(waiting)) {
            PyErr_SetString(PyExc_TypeError, "_forward: the queue's reads are not a list");
            goto done;
        }
        if (PyList_GET_SIZE(waiting) == 0) {
            PyObject *size = PyLong_FromSsize_t(n);
            PyObject *passed = size == NULL ? NULL : call(session, client ? str_pass_client : str_pass_broker, size);
            Py_XDECREF(size);
            int yes = passed == NULL ? -1 : PyObject_IsTrue(passed);
            Py_XDECREF(passed);
            if (yes != 0) {
                rc = yes < 0 ? -1 : 1;
                goto done;
            }
        }
    }
    /* queue.add(relay, from_client, data, relay._clock()) */
    if ((now = clock == monotonic ? monotonic_now() : PyObject_CallNoArgs(clock)) == NULL)
        goto done;
    if ((item = PyTuple_Pack(4, relay, client ? Py_True : Py_False, data, now)) == NULL)
        goto done;
    reads = SLOT(queue, q[Q_READS]); /* again: the clock is any callable */
    if (reads == NULL || !PyList_CheckExact(reads)) {
        PyErr_SetString(PyExc_TypeError, "_forward: the queue's reads are not a list");
        goto done;
    }
    Py_INCREF(reads);
    int appended = PyList_Append(reads, item);
    Py_ssize_t queued = PyList_GET_SIZE(reads);
    Py_DECREF(reads);
    if (appended < 0 || add_to_slot(queue, q[Q_BYTES], n) < 0)
        goto done;
    /* The bounds, read again (the clock is any callable): plain ints, compared as C integers. */
    held = SLOT(queue, q[Q_BYTES]), max_reads = SLOT(queue, q[Q_MAX_READS]), max_bytes = SLOT(queue, q[Q_MAX_BYTES]);
    if (held == NULL || max_reads == NULL || max_bytes == NULL || !PyLong_CheckExact(max_reads)
        || !PyLong_CheckExact(max_bytes)) {
        PyErr_SetString(PyExc_TypeError, "_forward: the queue's bounds are not ints");
        goto done;
    }
    Py_ssize_t most_reads = PyLong_AsSsize_t(max_reads), most_bytes = PyLong_AsSsize_t(max_bytes);
    Py_ssize_t queued_bytes = PyLong_AsSsize_t(held);
    if (PyErr_Occurred())
        goto done;
    int full = queued >= most_reads || queued_bytes >= most_bytes;
    PyObject *res = NULL;
    if (full)
        res = call(queue, str_flush, NULL);
    else if (SLOT(queue, q[Q_HANDLE]) == Py_None)
        res = call(queue, str_start_timer, NULL);
    else
        res = Py_NewRef(Py_None);
    if (res == NULL)
        goto done;
    Py_DECREF(res);
    rc = 1;
done:
    Py_XDECREF(item);
    Py_XDECREF(now);
    Py_DECREF(transport);
    Py_DECREF(peer);
    Py_DECREF(clock);
    Py_DECREF(session);
    Py_DECREF(queue);
    return rc;
}

/* ------------------------------------------------------------------ Reader */

typedef struct {
    PyObject_HEAD
    PyObject *relay;
    int client;
    vectorcallfunc vectorcall;
} ReaderObject;

static PyObject *reader_vectorcall(ReaderObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    if (PyVectorcall_NARGS(nargsf) != 1 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames))) {
        PyErr_SetString(PyExc_TypeError, "Reader: one read (bytes) expected");
        return NULL;
    }
    PyObject *relay = Py_NewRef(self->relay), *out = NULL;
    int done = relay_type == NULL ? 0 : forward_read(relay, self->client, args[0]);
    if (done > 0)
        out = Py_NewRef(Py_None);
    else if (done == 0)
        out = call(relay, self->client ? str_client_read : str_broker_read, args[0]);
    Py_DECREF(relay);
    return out;
}

static PyObject *reader_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *relay;
    int client;
    static char *names[] = {"relay", "from_client", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "Op:Reader", names, &relay, &client))
        return NULL;
    ReaderObject *self = PyObject_GC_New(ReaderObject, type);
    if (self == NULL)
        return NULL;
    self->relay = Py_NewRef(relay);
    self->client = client;
    self->vectorcall = (vectorcallfunc)reader_vectorcall;
    PyObject_GC_Track(self);
    return (PyObject *)self;
}

/* A relay holds its sides, which hold their readers, which hold the relay: the collector breaks it. */
static int reader_traverse(ReaderObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->relay);
    return 0;
}

static int reader_clear(ReaderObject *self)
{
    Py_CLEAR(self->relay);
    return 0;
}

static void reader_dealloc(ReaderObject *self)
{
    PyObject_GC_UnTrack(self);
    reader_clear(self);
    PyObject_GC_Del(self);
}

static PyObject *reader_get_relay(ReaderObject *self, void *closure)
{
    return Py_NewRef(self->relay != NULL ? self->relay : Py_None);
}

static PyObject *reader_get_from_client(ReaderObject *self, void *closure)
{
    return PyBool_FromLong(self->client);
}

static PyGetSetDef reader_getset[] = {
    {"relay", (getter)reader_get_relay, NULL, "the relay whose reads these are", NULL},
    {"from_client", (getter)reader_get_from_client, NULL, "True for the client's reads, False for the broker's",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kinspect.proxy._forward.Reader",
    .tp_basicsize = sizeof(ReaderObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "Reader(relay, from_client): called with each read, does what Relay.client_read (or broker_read) "
              "does",
    .tp_new = reader_new,
    .tp_dealloc = (destructor)reader_dealloc,
    .tp_traverse = (traverseproc)reader_traverse,
    .tp_clear = (inquiry)reader_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(ReaderObject, vectorcall),
    .tp_getset = reader_getset,
};

/* ------------------------------------------------------------------ module */

static PyObject *configure(PyObject *module, PyObject *args)
{
    PyTypeObject *types[4];
    Py_ssize_t pass_min;
    if (!PyArg_ParseTuple(args, "O!O!O!O!n:configure", &PyType_Type, &types[0], &PyType_Type, &types[1],
                          &PyType_Type, &types[2], &PyType_Type, &types[3], &pass_min))
        return NULL;
    if (find_offsets(types[0], R_NAMES, R_COUNT, r) < 0 || find_offsets(types[1], S_NAMES, S_COUNT, s) < 0
        || find_offsets(types[2], Q_NAMES, Q_COUNT, q) < 0 || find_offsets(types[3], F_NAMES, F_COUNT, f) < 0)
        return NULL;
    PyTypeObject **slots[4] = {&relay_type, &side_type, &queue_type, &session_type};
    for (int i = 0; i < 4; i++) {
        Py_INCREF(types[i]);
        Py_XSETREF(*slots[i], types[i]);
    }
    pass_min_bytes = pass_min;
    PyObject *time_module = PyImport_ImportModule("time");
    PyObject *clock = time_module == NULL ? NULL : PyObject_GetAttrString(time_module, "monotonic");
    Py_XDECREF(time_module);
    if (clock == NULL)
        return NULL;
    Py_XSETREF(monotonic, clock);
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"configure", configure, METH_VARARGS,
     "configure(Relay, _Side, InspectionQueue, Session, pass_min_bytes): the classes, once."},
    {NULL}};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "kinspect.proxy._forward",
    "A relay's read in C (kinspect.proxy.relay's client_read and broker_read are the reference).", -1,
    module_methods};

static int intern(PyObject **out, const char *text)
{
    *out = PyUnicode_InternFromString(text);
    return *out == NULL ? -1 : 0;
}

PyMODINIT_FUNC PyInit__forward(void)
{
    if (intern(&str_client_read, "client_read") || intern(&str_broker_read, "broker_read")
        || intern(&str_client_framed, "client_framed") || intern(&str_broker_framed, "broker_framed")
        || intern(&str_is_closing, "is_closing") || intern(&str_write, "write") || intern(&str_flush, "flush")
        || intern(&str_start_timer, "_start_timer") || intern(&str_pass_client, "pass_client")
        || intern(&str_pass_broker, "pass_broker"))
        return NULL;
    if (PyType_Ready(&ReaderType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL)
        return NULL;
    if (PyModule_AddObjectRef(module, "Reader", (PyObject *)&ReaderType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
