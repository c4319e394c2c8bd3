/* The client inventory's per-request update in C (InventoryObserver._request and _response in
 * kinspect/observers/inventory.py, with ConnectionRecord.note, are the reference).
 *
 * Why C: the inventory sees every request, and in the live proxy its Python handler was the largest
 * part of a small request's inspection after the session's reads (1.6-4.2 us of 8-19, measured
 * against a tree without it; a Produce's record magics the most). Here the same steps read the
 * events' and the records' slots and update the same dicts, lists and counters, in the same order.
 *
 * Noter(observer, classes, limits, fallbacks, magics)
 *   classes: (Request, RequestHeader, ConnectionInfo, ConnectionRecord, _Software, ScanResult, Response);
 *   limits: (PRODUCE, API_VERSIONS, MAX_CLIENT_IDS, MAX_PAIRS);
 *   fallbacks: (observer._request, observer._response), called whole for what is not done here;
 *   magics: the module's _magics(e), for a Produce whose scan is not one settled records field of one batch.
 * noter.request(e), noter.response(e): the handlers the dispatcher calls.
 *
 * Done here: a request of a connection already recorded, whose software already has its counts,
 * whose (api, version, record magics) verdicts are known and reject nothing, once the observer has
 * named its apis; a response that is not an ApiVersions one, or an ApiVersions one whose scan (the
 * metrics made it) holds no error 35: nothing to do. Those checks come before anything changes;
 * the rest (a new connection, a new software, a target that rejects it, an error 35) goes to the
 * Python, which makes what the next request finds.
 *
 * What a connection's requests look up again and again (its record's key, its record, its software's
 * counts) is kept here, in a small table indexed by the ConnectionInfo's address. An entry is taken
 * only for the very ConnectionInfo it was made for (it holds it), while the connection's id, address and
 * software are the objects the entry was made with, and only until the Python next runs (a new
 * connection, a record forgotten, a new software: anything the Python does may change what the
 * entries point to). Why: the three tuples and four dict lookups it spares were the largest part of the
 * inventory's instructions a request (about 1,900 of 5,200: bench_instructions.py). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "../slot_offsets.h"

enum { K_REQUEST, K_HEADER, K_CONNECTION, K_RECORD, K_SOFTWARE, K_SCAN, K_RESPONSE, K_COUNT };

enum { Q_CONNECTION, Q_HEADER, Q_TIME, Q_COMPLETE, Q_SCANNED, Q_COUNT };
static const char *const Q_NAMES[Q_COUNT] = {"connection", "header", "time", "complete", "_scanned"};
enum { H_API_KEY, H_API_VERSION, H_CLIENT_ID, H_COUNT };
static const char *const H_NAMES[H_COUNT] = {"api_key", "api_version", "client_id"};
enum { C_ID, C_ADDRESS, C_SOFTWARE_NAME, C_SOFTWARE_VERSION, C_COUNT };
static const char *const C_NAMES[C_COUNT] = {"id", "client_address", "client_software_name", "client_software_version"};
enum { R_SOFTWARE_NAME, R_SOFTWARE_VERSION, R_CLIENT_IDS, R_REQUESTS, R_MAGICS, R_FIRST_SEEN, R_LAST_SEEN,
       R_DROPPED_PAIRS, R_COUNT };
static const char *const R_NAMES[R_COUNT] = {"software_name", "software_version", "client_ids", "requests", "magics",
                                             "first_seen", "last_seen", "dropped_pairs"};
enum { W_REQUESTS, W_COUNT };
static const char *const W_NAMES[W_COUNT] = {"requests"};
enum { S_SPANS, S_SUMMARIES, S_ERRORS, S_COUNT };
static const char *const S_NAMES[S_COUNT] = {"record_spans", "_summaries", "error_codes"};
enum { P_API_KEY, P_COMPLETE, P_SCANNED, P_COUNT };
static const char *const P_NAMES[P_COUNT] = {"api_key", "complete", "_scanned"};

/* A BatchSummary's magic, a RecordsSummary's batches: by position (kinspect/protocol/records.py). */
enum { BATCH_MAGIC = 1, SUMMARY_BATCHES = 0 };

/* A connection's lookups, remembered (see above). */
typedef struct {
    PyObject *connection; /* held: no other connection can take its address while the entry holds it */
    PyObject *key;          /* (id, client_address): the record's key, holding the connection's id and address */
    PyObject *record, *counts, *name, *version;
    unsigned long generation;
} Known;

#define KNOWN_SLOTS 256

typedef struct {
    PyObject_HEAD
    PyObject *observer;
    PyObject *records;   /* observer._records: an OrderedDict, only read here (moves go through its method) */
    PyObject *move_to_end; /* records.move_to_end, bound once */
    PyObject *software;  /* observer._software */
    PyObject *rejecting; /* observer._rejecting */
    PyObject *wall_offset;
    PyObject *fallbacks[2];
    PyObject *magics_of;
    PyTypeObject *types[K_COUNT];
    Py_ssize_t q[Q_COUNT], h[H_COUNT], c[C_COUNT], r[R_COUNT], w[W_COUNT], s[S_COUNT], p[P_COUNT];
    long produce, api_versions;
    Py_ssize_t max_client_ids, max_pairs;
    int named; /* the observer named its apis (its first request, in Python) */
    int judged; /* the observer has upgrade targets: each request's verdicts are looked up */
    unsigned long generation; /* a Known entry of another generation is stale: the Python ran since */
    Known known[KNOWN_SLOTS];
} NoterObject;

static inline Known *known_slot(NoterObject *self, PyObject *connection)
{
    return &self->known[((uintptr_t)connection >> 4) % KNOWN_SLOTS];
}

static void known_clear(Known *k)
{
    Py_CLEAR(k->connection);
    Py_CLEAR(k->key);
    Py_CLEAR(k->record);
    Py_CLEAR(k->counts);
    Py_CLEAR(k->name);
    Py_CLEAR(k->version);
}

static PyObject *str_unnamed, *str_targets, *str_records, *str_software, *str_rejecting, *str_wall_offset,
    *str_move_to_end, *str_setdefault, *str_update, *str_api_key, *str_complete, *str_scanned, *empty_tuple, *one,
    *unsupported;

/* The record magics of a complete Produce request (new reference): one settled records field of
 * one batch read here, anything else by the reference's _magics(e). */
static PyObject *magics_of(NoterObject *self, PyObject *e)
{
    PyObject *scan = SLOT(e, self->q[Q_SCANNED]);
    if (scan != NULL && Py_TYPE(scan) == self->types[K_SCAN]) {
        PyObject *spans = SLOT(scan, self->s[S_SPANS]), *summaries = SLOT(scan, self->s[S_SUMMARIES]);
        if (spans != NULL && PyList_CheckExact(spans) && PyList_GET_SIZE(spans) == 0)
            return Py_NewRef(empty_tuple);
        if (spans != NULL && summaries != NULL && PyList_CheckExact(spans) && PyList_CheckExact(summaries)
            && PyList_GET_SIZE(spans) == 1 && PyList_GET_SIZE(summaries) == 1) {
            PyObject *summary = PyList_GET_ITEM(summaries, 0);
            if (PyTuple_Check(summary) && PyTuple_GET_SIZE(summary) > SUMMARY_BATCHES) {
                PyObject *batches = PyTuple_GET_ITEM(summary, SUMMARY_BATCHES);
                if (PyTuple_Check(batches) && PyTuple_GET_SIZE(batches) == 1) {
                    PyObject *batch = PyTuple_GET_ITEM(batches, 0);
                    if (PyTuple_Check(batch) && PyTuple_GET_SIZE(batch) > BATCH_MAGIC)
                        return PyTuple_Pack(1, PyTuple_GET_ITEM(batch, BATCH_MAGIC));
                }
            }
        }
    }
    return PyObject_CallOneArg(self->magics_of, e);
}

/* obj.slot += 1 for an int slot; -1 with an error set. */
static int increment(PyObject *obj, Py_ssize_t off)
{
    PyObject *held = SLOT(obj, off);
    if (held == NULL) {
        PyErr_SetString(PyExc_AttributeError, "_inventory: a counter slot is unset");
        return -1;
    }
    PyObject *sum = PyNumber_Add(held, one);
    if (sum == NULL)
        return -1;
    set_slot(obj, off, sum);
    return 0;
}

/* self.magics.setdefault(pair, set()).update(magics), without the calls when the pair's set (a plain
 * set in a plain dict, the common case) already holds every magic: a connection's Produce requests
 * carry the same magic, request after request. 0, or -1 with an error set. */
static int add_magics(PyObject *by_pair, PyObject *pair, PyObject *magics)
{
    if (PyDict_CheckExact(by_pair) && PyTuple_CheckExact(magics)) {
        PyObject *seen = PyDict_GetItemWithError(by_pair, pair); /* borrowed */
        if (seen == NULL && PyErr_Occurred())
            return -1;
        if (seen != NULL && PySet_CheckExact(seen)) {
            Py_ssize_t i, n = PyTuple_GET_SIZE(magics);
            for (i = 0; i < n; i++) {
                int has = PySet_Contains(seen, PyTuple_GET_ITEM(magics, i));
                if (has < 0)
                    return -1;
                if (!has)
                    break;
            }
            if (i == n)
                return 0;
        }
    }
    PyObject *fresh = PySet_New(NULL);
    PyObject *seen = fresh == NULL ? NULL : PyObject_CallMethodObjArgs(by_pair, str_setdefault, pair, fresh, NULL);
    Py_XDECREF(fresh);
    if (seen == NULL)
        return -1;
    PyObject *res = PyObject_CallMethodOneArg(seen, str_update, magics);
    Py_DECREF(seen);
    if (res == NULL)
        return -1;
    Py_DECREF(res);
    return 0;
}

/* ConnectionRecord.note(api_key, version, magics, when, client_id, software), step for step. */
static int note(NoterObject *self, PyObject *record, PyObject *api_key, PyObject *version, PyObject *magics,
                PyObject *when, PyObject *client_id, PyObject *name, PyObject *software_version)
{
    Py_ssize_t *r = self->r;
    PyObject *first = SLOT(record, r[R_FIRST_SEEN]), *last = SLOT(record, r[R_LAST_SEEN]);
    PyObject *client_ids = SLOT(record, r[R_CLIENT_IDS]), *requests = SLOT(record, r[R_REQUESTS]);
    if (first == NULL || last == NULL || client_ids == NULL || requests == NULL || SLOT(record, r[R_MAGICS]) == NULL
        || SLOT(record, r[R_DROPPED_PAIRS]) == NULL) {
        PyErr_SetString(PyExc_AttributeError, "_inventory: a connection record without its fields");
        return -1;
    }
    int set_first = PyObject_Not(first);
    if (set_first == 0)
        set_first = PyObject_RichCompareBool(when, first, Py_LT);
    if (set_first < 0)
        return -1;
    if (set_first)
        set_slot(record, r[R_FIRST_SEEN], Py_NewRef(when));
    int later = PyObject_RichCompareBool(when, SLOT(record, r[R_LAST_SEEN]), Py_GT);
    if (later < 0)
        return -1;
    if (later)
        set_slot(record, r[R_LAST_SEEN], Py_NewRef(when));
    if (name != Py_None || software_version != Py_None) {
        set_slot(record, r[R_SOFTWARE_NAME], Py_NewRef(name));
        set_slot(record, r[R_SOFTWARE_VERSION], Py_NewRef(software_version));
    }
    client_ids = SLOT(record, r[R_CLIENT_IDS]);
    if (client_id != Py_None) {
        if (!PyList_Check(client_ids)) {
            PyErr_SetString(PyExc_TypeError, "_inventory: client_ids is not a list");
            return -1;
        }
        int known = PySequence_Contains(client_ids, client_id);
        if (known < 0)
            return -1;
        if (!known && PyList_GET_SIZE(client_ids) < self->max_client_ids && PyList_Append(client_ids, client_id) < 0)
            return -1;
    }
    requests = SLOT(record, r[R_REQUESTS]);
    if (!PyDict_Check(requests)) {
        PyErr_SetString(PyExc_TypeError, "_inventory: requests is not a dict");
        return -1;
    }
    PyObject *pair = PyTuple_Pack(2, api_key, version);
    if (pair == NULL)
        return -1;
    int rc = -1;
    PyObject *count = PyDict_GetItemWithError(requests, pair); /* borrowed */
    if (count == NULL && PyErr_Occurred())
        goto done;
    if (count == NULL && PyDict_GET_SIZE(requests) >= self->max_pairs) {
        rc = increment(record, r[R_DROPPED_PAIRS]);
        goto done;
    }
    PyObject *more = count == NULL ? PyLong_FromLong(1) : PyNumber_Add(count, one);
    if (more == NULL)
        goto done;
    int stored = PyDict_SetItem(requests, pair, more);
    Py_DECREF(more);
    if (stored < 0)
        goto done;
    int some = PyObject_IsTrue(magics);
    if (some < 0)
        goto done;
    if (some && (rc = add_magics(SLOT(record, r[R_MAGICS]), pair, magics)) < 0)
        goto done;
    rc = 0;
done:
    Py_DECREF(pair);
    return rc;
}

/* The request's record and software counts, as _request finds them (new references in *key, *record and
 * *counts): from the connection's Known entry, or looked up and remembered there. 1; 0 when the reference
 * must make them (a new connection or software, or a software counted as "other"); -1 with an error set. */
static int lookups(NoterObject *self, PyObject *conn, PyObject *id, PyObject *address, PyObject *name,
                   PyObject *software_version, PyObject **key, PyObject **record, PyObject **counts)
{
    Known *k = known_slot(self, conn);
    if (k->connection == conn && k->generation == self->generation
        && PyTuple_GET_ITEM(k->key, 0) == id && PyTuple_GET_ITEM(k->key, 1) == address && k->name == name
        && k->version == software_version) {
        *key = Py_NewRef(k->key);
        *record = Py_NewRef(k->record);
        *counts = Py_NewRef(k->counts);
        return 1;
    }
    PyObject *made = PyTuple_Pack(2, id, address), *software = PyTuple_Pack(2, name, software_version);
    if (made == NULL || software == NULL) {
        Py_XDECREF(made);
        Py_XDECREF(software);
        return -1;
    }
    PyObject *found = PyDict_GetItemWithError(self->records, made); /* borrowed */
    PyObject *their = found == NULL ? NULL : PyDict_GetItemWithError(self->software, software);
    Py_DECREF(software);
    if (their == NULL || Py_TYPE(found) != self->types[K_RECORD] || Py_TYPE(their) != self->types[K_SOFTWARE]) {
        Py_DECREF(made);
        return PyErr_Occurred() ? -1 : 0;
    }
    known_clear(k);
    k->connection = Py_NewRef(conn);
    k->key = Py_NewRef(made);
    k->record = Py_NewRef(found);
    k->counts = Py_NewRef(their);
    k->name = Py_NewRef(name);
    k->version = Py_NewRef(software_version);
    k->generation = self->generation;
    *key = made;
    *record = Py_NewRef(found);
    *counts = Py_NewRef(their);
    return 1;
}

/* The request done here: 1; 0 when the reference must do it (nothing changed); -1 with an error set. */
static int request_here(NoterObject *self, PyObject *e)
{
    if (!self->named || Py_TYPE(e) != self->types[K_REQUEST])
        return 0;
    PyObject *conn = SLOT(e, self->q[Q_CONNECTION]), *header = SLOT(e, self->q[Q_HEADER]);
    PyObject *time = SLOT(e, self->q[Q_TIME]), *complete = SLOT(e, self->q[Q_COMPLETE]);
    if (conn == NULL || header == NULL || time == NULL || complete == NULL
        || Py_TYPE(conn) != self->types[K_CONNECTION] || Py_TYPE(header) != self->types[K_HEADER])
        return 0;
    PyObject *api_key = SLOT(header, self->h[H_API_KEY]), *version = SLOT(header, self->h[H_API_VERSION]);
    PyObject *client_id = SLOT(header, self->h[H_CLIENT_ID]);
    PyObject *id = SLOT(conn, self->c[C_ID]), *address = SLOT(conn, self->c[C_ADDRESS]);
    PyObject *name = SLOT(conn, self->c[C_SOFTWARE_NAME]), *software_version = SLOT(conn, self->c[C_SOFTWARE_VERSION]);
    if (api_key == NULL || version == NULL || client_id == NULL || id == NULL || address == NULL || name == NULL
        || software_version == NULL || !PyLong_CheckExact(api_key))
        return 0;

    int rc = -1;
    PyObject *key = NULL, *record = NULL, *counts = NULL, *magics = NULL, *when = NULL;
    Py_INCREF(e);
    long api = PyLong_AsLong(api_key);
    if (api == -1 && PyErr_Occurred())
        goto done;
    if (api == self->produce && complete == Py_True)
        magics = magics_of(self, e);
    else
        magics = Py_NewRef(empty_tuple);
    if (magics == NULL)
        goto done;
    int found = lookups(self, conn, id, address, name, software_version, &key, &record, &counts);
    if (found <= 0) {
        rc = found; /* 0: a new connection or software: the reference's */
        goto done;
    }
    if (self->judged) { /* without targets nothing is rejected, and _request looks no verdict up */
        PyObject *verdict_key = PyTuple_Pack(3, api_key, version, magics);
        if (verdict_key == NULL)
            goto done;
        PyObject *rejecting = PyDict_GetItemWithError(self->rejecting, verdict_key);
        Py_DECREF(verdict_key);
        if (rejecting == NULL && PyErr_Occurred())
            goto done;
        if (rejecting == NULL || !PyTuple_CheckExact(rejecting) || PyTuple_GET_SIZE(rejecting) != 0) {
            rc = 0; /* a verdict to make or to count: the reference's */
            goto done;
        }
    }
    PyObject *moved = PyObject_CallOneArg(self->move_to_end, key);
    if (moved == NULL)
        goto done;
    Py_DECREF(moved);
    when = PyNumber_Add(time, self->wall_offset);
    if (when != NULL && note(self, record, api_key, version, magics, when, client_id, name, software_version) == 0
        && increment(counts, self->w[W_REQUESTS]) == 0)
        rc = 1;
done:
    Py_XDECREF(when);
    Py_XDECREF(key);
    Py_XDECREF(record);
    Py_XDECREF(counts);
    Py_XDECREF(magics);
    Py_DECREF(e);
    return rc;
}

/* Whether the Noter was initialized (a handler of one that was not raises). */
static int ready(NoterObject *self)
{
    if (self->observer != NULL)
        return 1;
    PyErr_SetString(PyExc_RuntimeError, "Noter: not initialized");
    return 0;
}

static PyObject *noter_request(NoterObject *self, PyObject *e)
{
    if (!ready(self))
        return NULL;
    int done = request_here(self, e);
    if (done > 0)
        Py_RETURN_NONE;
    if (done < 0)
        return NULL;
    PyObject *out = PyObject_CallOneArg(self->fallbacks[0], e);
    self->generation++; /* what the Python did may have moved what the Known entries point to */
    if (out != NULL && !self->named) { /* the reference names the apis on its first request */
        PyObject *unnamed = PyObject_GetAttr(self->observer, str_unnamed);
        int still = unnamed == NULL ? -1 : PyObject_IsTrue(unnamed);
        Py_XDECREF(unnamed);
        if (still < 0)
            Py_CLEAR(out);
        else
            self->named = !still;
    }
    return out;
}

/* Whether a complete ApiVersions response's scan, already made, holds no error 35: 1; 0 when the
 * reference must look (no scan yet, or the error is there); -1 with an error set. */
static int without_unsupported(NoterObject *self, PyObject *e)
{
    PyObject *scan = Py_TYPE(e) == self->types[K_RESPONSE] ? Py_XNewRef(SLOT(e, self->p[P_SCANNED])) : NULL;
    if (scan == NULL)
        scan = PyObject_GetAttr(e, str_scanned);
    if (scan == NULL)
        return -1;
    int rc = 0;
    if (Py_TYPE(scan) == self->types[K_SCAN]) {
        PyObject *codes = SLOT(scan, self->s[S_ERRORS]);
        if (codes != NULL && PyDict_CheckExact(codes)) {
            PyObject *count = PyDict_GetItemWithError(codes, unsupported); /* borrowed */
            rc = count == NULL ? (PyErr_Occurred() ? -1 : 1) : PyObject_Not(count);
        }
    }
    Py_DECREF(scan);
    return rc;
}

/* Only an ApiVersions response can change the inventory (KIP-511's error 35): the rest returns here,
 * and so does an ApiVersions response that is incomplete or whose scan holds no error 35. */
static PyObject *noter_response(NoterObject *self, PyObject *e)
{
    if (!ready(self))
        return NULL;
    /* A Response's fields at their slots' offsets (by name, each cost some 290 instructions an event); by name
     * for anything else, or a slot unset (which raises as the attribute lookup does). */
    int slotted = Py_TYPE(e) == self->types[K_RESPONSE];
    PyObject *api_key = slotted ? Py_XNewRef(SLOT(e, self->p[P_API_KEY])) : NULL;
    if (api_key == NULL)
        api_key = PyObject_GetAttr(e, str_api_key);
    if (api_key == NULL)
        return NULL;
    long api = PyLong_CheckExact(api_key) ? PyLong_AsLong(api_key) : self->api_versions;
    Py_DECREF(api_key);
    if (api == -1 && PyErr_Occurred())
        return NULL;
    if (api != self->api_versions)
        Py_RETURN_NONE;
    PyObject *complete = slotted ? Py_XNewRef(SLOT(e, self->p[P_COMPLETE])) : NULL;
    if (complete == NULL)
        complete = PyObject_GetAttr(e, str_complete);
    if (complete == NULL)
        return NULL;
    int whole = PyObject_IsTrue(complete);
    Py_DECREF(complete);
    if (whole < 0)
        return NULL;
    int nothing = whole ? without_unsupported(self, e) : 1;
    if (nothing < 0)
        return NULL;
    if (nothing)
        Py_RETURN_NONE;
    PyObject *out = PyObject_CallOneArg(self->fallbacks[1], e);
    self->generation++; /* it may have made or forgotten records */
    return out;
}

/* ------------------------------------------------------------------ the type */

static int noter_init(NoterObject *self, PyObject *args, PyObject *kwargs)
{
    PyObject *observer, *classes, *limits, *fallbacks, *magics;
    static char *names[] = {"observer", "classes", "limits", "fallbacks", "magics", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO!O!O!O:Noter", names, &observer, &PyTuple_Type, &classes,
                                     &PyTuple_Type, &limits, &PyTuple_Type, &fallbacks, &magics))
        return -1;
    if (PyTuple_GET_SIZE(classes) != K_COUNT || PyTuple_GET_SIZE(limits) != 4 || PyTuple_GET_SIZE(fallbacks) != 2) {
        PyErr_SetString(PyExc_TypeError, "Noter: 7 classes, 4 limits and 2 fallbacks expected");
        return -1;
    }
    for (int i = 0; i < K_COUNT; i++) {
        if (!PyType_Check(PyTuple_GET_ITEM(classes, i))) {
            PyErr_SetString(PyExc_TypeError, "Noter: classes must be classes");
            return -1;
        }
    }
    PyTypeObject **t = (PyTypeObject **)&PyTuple_GET_ITEM(classes, 0);
    if (find_offsets(t[K_REQUEST], Q_NAMES, Q_COUNT, self->q) < 0 || find_offsets(t[K_HEADER], H_NAMES, H_COUNT, self->h) < 0
        || find_offsets(t[K_CONNECTION], C_NAMES, C_COUNT, self->c) < 0
        || find_offsets(t[K_RECORD], R_NAMES, R_COUNT, self->r) < 0
        || find_offsets(t[K_SOFTWARE], W_NAMES, W_COUNT, self->w) < 0
        || find_offsets(t[K_SCAN], S_NAMES, S_COUNT, self->s) < 0
        || find_offsets(t[K_RESPONSE], P_NAMES, P_COUNT, self->p) < 0)
        return -1;
    self->produce = PyLong_AsLong(PyTuple_GET_ITEM(limits, 0));
    self->api_versions = PyLong_AsLong(PyTuple_GET_ITEM(limits, 1));
    self->max_client_ids = PyLong_AsSsize_t(PyTuple_GET_ITEM(limits, 2));
    self->max_pairs = PyLong_AsSsize_t(PyTuple_GET_ITEM(limits, 3));
    if (PyErr_Occurred())
        return -1;
    PyObject *records = PyObject_GetAttr(observer, str_records), *software = PyObject_GetAttr(observer, str_software);
    PyObject *rejecting = PyObject_GetAttr(observer, str_rejecting);
    PyObject *wall_offset = PyObject_GetAttr(observer, str_wall_offset);
    if (records == NULL || software == NULL || rejecting == NULL || wall_offset == NULL || !PyDict_Check(records)
        || !PyDict_CheckExact(software) || !PyDict_CheckExact(rejecting)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "Noter: the observer's records, software and verdicts must be dicts");
        Py_XDECREF(records);
        Py_XDECREF(software);
        Py_XDECREF(rejecting);
        Py_XDECREF(wall_offset);
        return -1;
    }
    PyObject *move_to_end = PyObject_GetAttr(records, str_move_to_end);
    if (move_to_end == NULL) {
        Py_DECREF(records);
        Py_DECREF(software);
        Py_DECREF(rejecting);
        Py_DECREF(wall_offset);
        return -1;
    }
    Py_XSETREF(self->move_to_end, move_to_end);
    Py_XSETREF(self->records, records);
    Py_XSETREF(self->software, software);
    Py_XSETREF(self->rejecting, rejecting);
    Py_XSETREF(self->wall_offset, wall_offset);
    Py_XSETREF(self->observer, Py_NewRef(observer));
    for (int i = 0; i < 2; i++)
        Py_XSETREF(self->fallbacks[i], Py_NewRef(PyTuple_GET_ITEM(fallbacks, i)));
    Py_XSETREF(self->magics_of, Py_NewRef(magics));
    for (int i = 0; i < K_COUNT; i++)
        Py_XSETREF(self->types[i], (PyTypeObject *)Py_NewRef(t[i]));
    PyObject *unnamed = PyObject_GetAttr(observer, str_unnamed);
    int still = unnamed == NULL ? -1 : PyObject_IsTrue(unnamed);
    Py_XDECREF(unnamed);
    if (still < 0)
        return -1;
    self->named = !still;
    PyObject *targets = PyObject_GetAttr(observer, str_targets);
    int judged = targets == NULL ? -1 : PyObject_IsTrue(targets);
    Py_XDECREF(targets);
    if (judged < 0)
        return -1;
    self->judged = judged;
    for (int i = 0; i < KNOWN_SLOTS; i++)
        known_clear(&self->known[i]);
    return 0;
}

static int noter_traverse(NoterObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->observer);
    Py_VISIT(self->records);
    Py_VISIT(self->move_to_end);
    Py_VISIT(self->software);
    Py_VISIT(self->rejecting);
    Py_VISIT(self->wall_offset);
    Py_VISIT(self->fallbacks[0]);
    Py_VISIT(self->fallbacks[1]);
    Py_VISIT(self->magics_of);
    for (int i = 0; i < K_COUNT; i++)
        Py_VISIT(self->types[i]);
    for (int i = 0; i < KNOWN_SLOTS; i++) {
        Py_VISIT(self->known[i].connection);
        Py_VISIT(self->known[i].key);
        Py_VISIT(self->known[i].record);
        Py_VISIT(self->known[i].counts);
    }
    return 0;
}

static int noter_clear(NoterObject *self)
{
    Py_CLEAR(self->observer);
    Py_CLEAR(self->records);
    Py_CLEAR(self->move_to_end);
    Py_CLEAR(self->software);
    Py_CLEAR(self->rejecting);
    Py_CLEAR(self->wall_offset);
    Py_CLEAR(self->fallbacks[0]);
    Py_CLEAR(self->fallbacks[1]);
    Py_CLEAR(self->magics_of);
    for (int i = 0; i < K_COUNT; i++)
        Py_CLEAR(self->types[i]);
    for (int i = 0; i < KNOWN_SLOTS; i++)
        known_clear(&self->known[i]);
    return 0;
}

static void noter_dealloc(NoterObject *self)
{
    PyObject_GC_UnTrack(self);
    noter_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef noter_methods[] = {
    {"request", (PyCFunction)noter_request, METH_O, "request(e): InventoryObserver._request(e), done in C"},
    {"response", (PyCFunction)noter_response, METH_O, "response(e): InventoryObserver._response(e)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject NoterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kinspect.observers._inventory.Noter",
    .tp_basicsize = sizeof(NoterObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Noter(observer, classes, limits, fallbacks, magics): the inventory observer's request and response "
              "handlers in C",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)noter_init,
    .tp_dealloc = (destructor)noter_dealloc,
    .tp_traverse = (traverseproc)noter_traverse,
    .tp_clear = (inquiry)noter_clear,
    .tp_methods = noter_methods,
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "kinspect.observers._inventory",
    "The client inventory's per-request update in C (kinspect.observers.inventory is the reference).", -1, NULL};

static int intern(PyObject **out, const char *text)
{
    *out = PyUnicode_InternFromString(text);
    return *out == NULL ? -1 : 0;
}

PyMODINIT_FUNC PyInit__inventory(void)
{
    if (intern(&str_unnamed, "_unnamed") || intern(&str_targets, "targets") || intern(&str_records, "_records")
        || intern(&str_software, "_software") || intern(&str_rejecting, "_rejecting")
        || intern(&str_wall_offset, "_wall_offset")
        || intern(&str_move_to_end, "move_to_end") || intern(&str_setdefault, "setdefault")
        || intern(&str_update, "update") || intern(&str_api_key, "api_key") || intern(&str_complete, "complete")
        || intern(&str_scanned, "_scanned"))
        return NULL;
    if ((empty_tuple = PyTuple_New(0)) == NULL || (one = PyLong_FromLong(1)) == NULL
        || (unsupported = PyLong_FromLong(35)) == NULL) /* UNSUPPORTED_VERSION */
        return NULL;
    if (PyType_Ready(&NoterType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL)
        return NULL;
    if (PyModule_AddObjectRef(module, "Noter", (PyObject *)&NoterType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
