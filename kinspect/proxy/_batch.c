/* A batch of forwarded reads inspected in C: InspectionQueue.flush's loop, Relay.inspect and
 * Dispatcher.dispatch in one call (kinspect.proxy.inspection_queue, relay and observers are the reference).
 *
 * Why C: measured in-process, the Python of those three layers cost about 1 us per request and its
 * response, warm, on top of the session's reads and the observers' handlers; here it is a loop with
 * one call per handler.
 *
 * configure(Relay, Dispatcher, Request, FramePieces, Session): the classes, once (relay.native_inspect_reads).
 * inspect_reads(reads): reads is the queue's list of (relay, from_client, data, time read). For a
 *   Relay (the class itself) the read is inspected here, step for step as Relay.inspect and
 *   Dispatcher.dispatch do it: the direction's framed flag, the session's client_data/broker_data
 *   (its C reads where built), the failures counted by relay._count_failures, each event handed to
 *   the dispatcher's routes, an observer's failure to Dispatcher._failed, a Request held in pieces to
 *   Dispatcher._release. A session that raises goes to relay._session_failed. Both are called with the
 *   exception as the one being handled, as the `except` blocks of the Python call them (their
 *   log.exception prints it). Anything else (a stand-in relay, a Dispatcher subclass, observers
 *   changed since the routes were made) goes to its own Python method. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "../slot_offsets.h"

enum { R_SESSION, R_DISPATCHER, R_FAILURES, R_COUNT };
static const char *const R_NAMES[R_COUNT] = {"session", "dispatcher", "_failures"};
static Py_ssize_t r[R_COUNT];
enum { F_CLIENT_FRAMED, F_BROKER_FRAMED, F_FAILURES, F_COUNT };
static const char *const F_NAMES[F_COUNT] = {"client_framed", "broker_framed", "failures"};
static Py_ssize_t f[F_COUNT]; /* a Session's slots */
enum { D_ROUTES, D_ROUTED, D_OBSERVERS, D_COUNT };
static const char *const D_NAMES[D_COUNT] = {"_routes", "_routed", "observers"};
static Py_ssize_t d[D_COUNT]; /* a Dispatcher's */
static Py_ssize_t q_frame;     /* a Request's frame */

static PyTypeObject *relay_type, *dispatcher_type, *request_type, *pieces_type, *session_type;
static PyObject *str_client_framed, *str_broker_framed, *str_client_data, *str_broker_data, *str_events,
    *str_failures, *str_inspect, *str_dispatch, *str_release,
    *str_session_failed, *str_count_failures, *str_failed, *str_client, *str_broker;

/* obj.name(a[, b]) with the current exception as the one being handled (what an `except` block gives
 * the code it runs); the exception is dropped. 0, or -1 with the callee's own error set. */
static int call_handling(PyObject *obj, PyObject *name, PyObject *a, PyObject *b)
{
    PyObject *type, *value, *tb, *old_type, *old_value, *old_tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL && value != NULL)
        PyException_SetTraceback(value, tb);
    PyErr_GetExcInfo(&old_type, &old_value, &old_tb);
    PyErr_SetExcInfo(type, value, tb); /* steals */
    PyObject *res = PyObject_CallMethodObjArgs(obj, name, a, b, NULL);
    PyErr_SetExcInfo(old_type, old_value, old_tb); /* steals: what was handled before, back */
    if (res == NULL)
        return -1;
    Py_DECREF(res);
    return 0;
}

/* An error that `except Exception` catches (anything else, a KeyboardInterrupt, propagates). */
static inline int caught(void) { return PyErr_ExceptionMatches(PyExc_Exception); }

static int call_method(PyObject *obj, PyObject *name, PyObject *a)
{
    PyObject *res = PyObject_CallMethodOneArg(obj, name, a);
    if (res == NULL)
        return -1;
    Py_DECREF(res);
    return 0;
}

/* Dispatcher.dispatch(events): every event to the handlers its type is routed to. */
static int dispatch(PyObject *dispatcher, PyObject *events)
{
    if (Py_TYPE(dispatcher) != dispatcher_type)
        return call_method(dispatcher, str_dispatch, events);
    PyObject *routed = SLOT(dispatcher, d[D_ROUTED]), *observers = SLOT(dispatcher, d[D_OBSERVERS]);
    PyObject *routes = SLOT(dispatcher, d[D_ROUTES]);
    if (routed == NULL || observers == NULL || routes == NULL) /* not made yet: the Python says what is wrong */
        return call_method(dispatcher, str_dispatch, events);
    int changed = routed == observers ? 0 : PyObject_RichCompareBool(routed, observers, Py_NE);
    if (changed != 0) { /* observers came or went since the routes were made: Python makes them again */
        if (changed < 0)
            return -1;
        return call_method(dispatcher, str_dispatch, events);
    }
    if (!PyDict_CheckExact(routes) || !PyList_CheckExact(events))
        return call_method(dispatcher, str_dispatch, events);
    Py_INCREF(routes);
    int rc = 0;
    Py_INCREF(events);
    for (Py_ssize_t i = 0; rc == 0 && i < PyList_GET_SIZE(events); i++) {
        PyObject *event = Py_NewRef(PyList_GET_ITEM(events, i));
        PyObject *kind = (PyObject *)Py_TYPE(event);
        PyObject *handlers = PyDict_GetItemWithError(routes, kind); /* borrowed */
        if (handlers == NULL && PyErr_Occurred())
            rc = -1;
        else if (handlers != NULL && !PyList_CheckExact(handlers)) {
            PyErr_SetString(PyExc_TypeError, "_batch: a dispatcher's route is not a list");
            rc = -1;
        } else if (handlers != NULL) {
            Py_INCREF(handlers);
            for (Py_ssize_t j = 0; rc == 0 && j < PyList_GET_SIZE(handlers); j++) {
                PyObject *on_event = Py_NewRef(PyList_GET_ITEM(handlers, j));
                PyObject *res = PyObject_CallOneArg(on_event, event);
                if (res != NULL)
                    Py_DECREF(res);
                else if (caught()) /* an observer's bug must never reach the relay */
                    rc = call_handling(dispatcher, str_failed, on_event, kind);
                else
                    rc = -1;
                Py_DECREF(on_event);
            }
            Py_DECREF(handlers);
        }
        if (rc == 0 && kind == (PyObject *)request_type) { /* every observer saw it: its pieces may go */
            PyObject *frame = SLOT(event, q_frame);
            if (frame != NULL && Py_TYPE(frame) == pieces_type)
                rc = call_method(dispatcher, str_release, event);
        }
        Py_DECREF(event);
    }
    Py_DECREF(events);
    Py_DECREF(routes);
    return rc;
}

/* The session's client_data or broker_data (new reference). A Session keeps its C reads' methods in its
 * instance dict (Session.__init__), where they shadow the class's functions: read there directly for
 * exactly a Session (by name, each cost a type lookup and the descriptor checks, some 400 instructions a
 * read); by name for anything else, or when the dict does not hold it. */
static PyObject *session_reader(PyObject *session, int client)
{
    PyObject *name = client ? str_client_data : str_broker_data;
    if (Py_IS_TYPE(session, session_type)) {
        PyObject **dict = _PyObject_GetDictPtr(session);
        if (dict != NULL && *dict != NULL && PyDict_CheckExact(*dict)) {
            PyObject *found = PyDict_GetItemWithError(*dict, name); /* borrowed */
            if (found != NULL)
                return Py_NewRef(found);
            if (PyErr_Occurred())
                return NULL;
        }
    }
    return PyObject_GetAttr(session, name);
}

/* The events of one read, from the session (new reference); NULL with an error set. */
static PyObject *session_events(PyObject *session, int client, PyObject *data, PyObject *now)
{
    PyObject *method = session_reader(session, client);
    if (method == NULL)
        return NULL;
    PyObject *args[2] = {data, now};
    PyObject *out = PyObject_Vectorcall(method, args, 2, NULL);
    Py_DECREF(method);
    if (out == NULL)
        return NULL;
    PyObject *events;
    if (PyTuple_Check(out) && PyTuple_GET_SIZE(out) == 2) /* Output(forward, events) */
        events = Py_NewRef(PyTuple_GET_ITEM(out, 1));
    else
        events = PyObject_GetAttr(out, str_events);
    Py_DECREF(out);
    return events;
}

/* Relay.inspect(from_client, data, now) for a Relay. */
static int inspect_one(PyObject *relay, int client, PyObject *data, PyObject *now)
{
    PyObject *session = SLOT(relay, r[R_SESSION]), *dispatcher = SLOT(relay, r[R_DISPATCHER]);
    if (session == NULL || dispatcher == NULL) {
        PyErr_SetString(PyExc_AttributeError, "_batch: a relay without its session or dispatcher");
        return -1;
    }
    Py_INCREF(session);
    Py_INCREF(dispatcher);
    int rc = 0;
    PyObject *events = NULL;
    int slotted = PyObject_TypeCheck(session, session_type);
    int framed = slot_or_attr_true(session, session_type, f[client ? F_CLIENT_FRAMED : F_BROKER_FRAMED],
                                   client ? str_client_framed : str_broker_framed);
    if (framed > 0)
        events = session_events(session, client, data, now);
    if (framed < 0 || (framed > 0 && events == NULL)) { /* the session failed (Relay.inspect's except) */
        rc = caught() ? call_handling(relay, str_session_failed, client ? str_client : str_broker, Py_None) : -1;
        goto done;
    }
    if (framed == 0) /* framing was lost since the read was queued */
        goto done;
    PyObject *failures = slotted ? Py_XNewRef(SLOT(session, f[F_FAILURES])) : NULL;
    if (failures == NULL)
        failures = PyObject_GetAttr(session, str_failures);
    PyObject *counted = SLOT(relay, r[R_FAILURES]);
    int more = failures == NULL || counted == NULL ? -1
               : failures == counted                 ? 0 /* the same int: no new failure */
                                                     : PyObject_RichCompareBool(failures, counted, Py_NE);
    Py_XDECREF(failures);
    if (more < 0) {
        if (counted == NULL && !PyErr_Occurred())
            PyErr_SetString(PyExc_AttributeError, "_batch: a relay without _failures");
        rc = -1;
        goto done;
    }
    if (more) {
        PyObject *res = PyObject_CallMethodNoArgs(relay, str_count_failures);
        if (res == NULL) {
            rc = -1;
            goto done;
        }
        Py_DECREF(res);
    }
    int some = PyObject_IsTrue(events);
    rc = some < 0 ? -1 : some ? dispatch(dispatcher, events) : 0;
done:
    Py_XDECREF(events);
    Py_DECREF(session);
    Py_DECREF(dispatcher);
    return rc;
}

static PyObject *inspect_reads(PyObject *module, PyObject *reads)
{
    if (relay_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_batch: configure() first");
        return NULL;
    }
    if (!PyList_CheckExact(reads)) {
        PyErr_SetString(PyExc_TypeError, "inspect_reads: a list of reads expected");
        return NULL;
    }
    Py_INCREF(reads);
    int rc = 0;
    for (Py_ssize_t i = 0; rc == 0 && i < PyList_GET_SIZE(reads); i++) {
        PyObject *item = Py_NewRef(PyList_GET_ITEM(reads, i));
        if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) != 4) {
            PyErr_SetString(PyExc_TypeError, "inspect_reads: a read is (relay, from_client, data, time)");
            rc = -1;
        } else {
            PyObject *relay = PyTuple_GET_ITEM(item, 0), *from_client = PyTuple_GET_ITEM(item, 1);
            PyObject *data = PyTuple_GET_ITEM(item, 2), *now = PyTuple_GET_ITEM(item, 3);
            if (Py_TYPE(relay) == relay_type) {
                int client = PyObject_IsTrue(from_client);
                rc = client < 0 ? -1 : inspect_one(relay, client, data, now);
            } else { /* a stand-in or a subclass: its own inspect */
                PyObject *res = PyObject_CallMethodObjArgs(relay, str_inspect, from_client, data, now, NULL);
                rc = res == NULL ? -1 : 0;
                Py_XDECREF(res);
            }
        }
        Py_DECREF(item);
    }
    Py_DECREF(reads);
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *configure(PyObject *module, PyObject *args)
{
    PyTypeObject *types[5];
    if (!PyArg_ParseTuple(args, "O!O!O!O!O!:configure", &PyType_Type, &types[0], &PyType_Type, &types[1],
                          &PyType_Type, &types[2], &PyType_Type, &types[3], &PyType_Type, &types[4]))
        return NULL;
    if (find_offsets(types[0], R_NAMES, R_COUNT, r) < 0 || find_offsets(types[1], D_NAMES, D_COUNT, d) < 0
        || find_offsets(types[4], F_NAMES, F_COUNT, f) < 0 || (q_frame = slot_offset(types[2], "frame")) < 0)
        return NULL;
    PyTypeObject **slots[5] = {&relay_type, &dispatcher_type, &request_type, &pieces_type, &session_type};
    for (int i = 0; i < 5; i++) {
        Py_INCREF(types[i]);
        Py_XSETREF(*slots[i], types[i]);
    }
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"configure", configure, METH_VARARGS,
     "configure(Relay, Dispatcher, Request, FramePieces, Session): the classes, once."},
    {"inspect_reads", inspect_reads, METH_O,
     "inspect_reads(reads): each (relay, from_client, data, time) inspected as Relay.inspect does it."},
    {NULL}};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "kinspect.proxy._batch",
    "A batch of forwarded reads inspected in C (kinspect.proxy.inspection_queue is the reference).", -1,
    module_methods};

static int intern(PyObject **out, const char *text)
{
    *out = PyUnicode_InternFromString(text);
    return *out == NULL ? -1 : 0;
}

PyMODINIT_FUNC PyInit__batch(void)
{
    if (intern(&str_client_framed, "client_framed") || intern(&str_broker_framed, "broker_framed")
        || intern(&str_client_data, "client_data") || intern(&str_broker_data, "broker_data")
        || intern(&str_events, "events") || intern(&str_failures, "failures")
        || intern(&str_inspect, "inspect") || intern(&str_dispatch, "dispatch") || intern(&str_release, "_release")
        || intern(&str_session_failed, "_session_failed") || intern(&str_count_failures, "_count_failures")
        || intern(&str_failed, "_failed") || intern(&str_client, "client") || intern(&str_broker, "broker"))
        return NULL;
    return PyModule_Create(&module_def);
}
